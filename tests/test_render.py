"""Every renderer on golden inputs: real recorded Sessions (tests/golden/session-*.json, made by
tests/golden/make_sessions.py), re-analysed into real Reports, plus one session recorded here.

Fixed-width text is compared exactly with tests/golden/; so are HTML and the Chrome trace. Every
figure the text shows is checked against the report dictionary it came from.
Accept intended changes with ``PIPEPROF_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py``.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from html import escape
from typing import Any

import pytest
from fake_nvml import FakeGpu, FakeNvml
from golden_reports import (
    DESIGN,
    FIXED,
    GOLDEN,
    LOADER,
    LOOP,
    REGIONS,
    assert_golden,
    golden_report,
    within,
)
from pipelines import CostDataset, Scale
from rich.console import Console
from torch.utils.data import DataLoader
from torchvision import transforms

import pipeprof
from pipeprof.render import FORMATS, format_for, get_renderer
from pipeprof.render.chrome import build_trace
from pipeprof.render.figures import num, pct, util, wait_periods
from pipeprof.render.html import HTMLRenderer
from pipeprof.render.jsonrenderer import JSONRenderer
from pipeprof.render.text import TextRenderer, summary

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ANSI_COLOR = re.compile(r"\x1b\[(?:\d+;)*(?:3\d|9\d|38;)")  # a foreground colour escape
BOX = re.compile(r"[│╭╮╰╯─]")


@pytest.fixture(scope="module")
def loader():
    return golden_report(LOADER)


@pytest.fixture(scope="module")
def loop():
    return golden_report(LOOP)


def flat(text: str) -> str:
    """Text without panel borders and line breaks: wrapped sentences read as one line again."""
    return " ".join(BOX.sub(" ", text).split())


def has_row(text: str, cells: list[str]) -> bool:
    """A line of ``text`` starts with these whitespace-separated cells."""
    return any(line.split()[: len(cells)] == cells for line in text.splitlines())


def test_reanalysis_is_deterministic(loader, loop):
    for name, report in ((LOADER, loader), (LOOP, loop)):
        again = pipeprof.load(GOLDEN / name)
        assert again is not report
        assert again.to_dict() == report.to_dict()
        assert again.render("html") == report.render("html")


@pytest.mark.parametrize("name", [LOOP, FIXED, LOADER])
def test_recorded_sessions_get_the_injected_verdict(name):
    """The recordings injected their bottleneck (DESIGN); the real analysis must find it."""
    report, want = golden_report(name), DESIGN[name]
    d = report.to_dict()
    assert (d["mode"], d["verdict"]["kind"]) == (want["mode"], want["kind"])
    assert d["verdict"]["stage"] == want["stage"]
    assert d["meta"]["num_workers"] == want["num_workers"]
    assert [w["track"] for w in d["workers"]] == [f"worker{i}" for i in range(want["num_workers"])]
    for path, ms in want["costs"].items():  # every stage measured at its injected cost
        assert within(d["stages"][path]["per_sample_ms"], ms), path
    if want["stage"] is not None:  # the limiting stage is the costliest leaf, by far
        leaves = {
            p: r
            for p, r in d["stages"].items()
            if not any(q.startswith(p + "/") for q in d["stages"])
        }
        ranked = sorted(leaves, key=lambda p: leaves[p]["total_s"], reverse=True)
        assert ranked[0] == want["stage"]
        assert leaves[ranked[0]]["total_s"] > 3 * leaves[ranked[1]]["total_s"]
        dominant = [f for f in d["findings"] if f["id"] == "dominant-stage"]
        assert [f["stage"] for f in dominant] == [want["stage"]]
    if want["mode"] == "loop":
        assert set(d["loop"]["regions"]) == set(REGIONS)
        for region, ms in REGIONS.items():
            assert within(d["loop"]["regions"][region]["mean_ms"], ms), region
        assert d["gpu"]["available"] and d["gpu"]["devices"][0]["name"].startswith("NVIDIA")
        assert any(None in row for row in d["timeline"]["gpu"]["util"])  # the failed reading
        assert d["loop"]["idle_while_waiting_fraction"] is not None


def test_text_golden_loader(loader):
    assert_golden("loader.txt", TextRenderer(width=80).render(loader))


def test_text_golden_loop(loop):
    assert_golden("loop.txt", TextRenderer(width=80).render(loop))


def test_html_golden(loader, loop):
    assert_golden("loader.html", HTMLRenderer().render(loader))
    assert_golden("loop.html", HTMLRenderer().render(loop))


def trace_text(trace: dict) -> str:
    """One event per line: small diffs when a golden trace changes."""
    events = ",\n".join(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])
    rest = json.dumps({k: v for k, v in trace.items() if k != "traceEvents"}, sort_keys=True)
    return f'{{"traceEvents": [\n{events}\n],\n"rest": {rest}}}\n'


def test_chrome_golden(loader, loop):
    assert_golden("loader.trace.json", trace_text(build_trace(loader.to_dict(), loader.session)))
    assert_golden("loop.trace.json", trace_text(build_trace(loop.to_dict(), loop.session)))


def test_json_renderer_is_the_contract(loader, loop):
    for report in (loader, loop):
        assert json.loads(JSONRenderer().render(report)) == report.to_dict()
        with_session = json.loads(JSONRenderer(session=True).render(report))
        assert with_session["session"] == report.session.to_dict()
    assert json.loads(JSONRenderer().render_dict(loop.to_dict())) == loop.to_dict()


def expected_text(d: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """What the text summary must say, from the report dictionary: phrases and table rows."""
    phrases = [d["verdict"]["headline"]]
    rows: list[list[str]] = []
    loop = d["loop"]
    if loop:
        phrases.append(f"{loop['steps']} ({d['samples']} samples) in {d['wall_s']:.2f} s")
        tp = loop["throughput"]
        phrases.append(f"throughput {num(tp['effective_samples_per_s'])} samples/s")
        view = loop["steady"]  # the steady state, when it has 3 steps or more
        phrases.append(f"step time (steady state, {view['steps']} steps)")
        if view["steps"] < 3:
            view = loop
            phrases[-1] = f"step time (all {loop['steps']} steps)"
        for key, name in (("wait", "wait"), ("compute", "compute"), ("overhead", "other")):
            ms = num(view[f"{key}_s"] * 1e3 / view["steps"])
            rows.append([name, ms, pct(view[f"{key}_fraction"]), pct(loop[f"{key}_fraction"])])
        for name, r in loop["regions"].items():
            cells = [r["total_s"], r["mean_ms"], r["p95_ms"], r["max_ms"]]
            rows.append([name, str(r["count"]), *map(num, cells)])
        if loop["idle_while_waiting_fraction"] is not None:  # None: no GPU sample in the loop
            idle = pct(loop["idle_while_waiting_fraction"])
            phrases.append(f"GPU idle waiting for data: {idle} of the loop's time")
    else:
        phrases.append(f"{d['batches']} ({d['samples']} samples) in {d['wall_s']:.2f} s")
        tp, steady = d["throughput"], d["steady"]
        phrases.append(
            f"{num(tp['samples_per_s'])} samples/s overall, {num(steady['samples_per_s'])} steady"
        )
        lat = d["latency"]
        phrases.append(f"wait/batch p50 {num(lat['p50_ms'])} ms, p95 {num(lat['p95_ms'])} ms")
    top = sum(r["total_s"] for p, r in d["stages"].items() if "/" not in p)
    for path, r in d["stages"].items():
        share = pct(r["total_s"] / top)
        cells = [r["per_sample_ms"], r["per_batch_ms"]]
        rows.append([path.rsplit("/", 1)[-1], *map(num, cells), share, num(r["p95_ms"])])
    total = sum(w["samples"] for w in d["workers"])
    for w in d["workers"]:
        share = [f"({w['samples'] / total:.0%})"] if len(d["workers"]) > 1 else []
        rows.append(
            [
                w["track"],
                str(w["pid"]),
                str(w["batches"]),
                f"{w['samples']:,}",
                *share,
                num(w["busy_s"]),
                num(w["samples_per_busy_s"]),
                pct(w["busy_fraction"]),
            ]
        )
    for dev in (d["gpu"] or {}).get("devices") or []:
        phrases.append(
            f"GPU {dev['index']} {dev['name']}: {util(dev['util_mean'])} mean, "
            f"p50 {util(dev['util_p50'])}"
        )
    if d["host"]:
        h = d["host"]
        phrases.append(f"CPU: {util(h['cpu_util_mean'])} mean of {h['cpu_count']} cores")
    for f in d["findings"]:
        phrases += [f["message"], f"fix: {f['fix']}"]
    o = d["overhead"]
    if o["in_situ_ns"] is not None:
        phrases.append(f"timed regions at {num(o['region_ns'])} ns in situ")
        phrases.append(f"packing records {num(o['pack_s'] * 1e3)} ms")
    else:
        phrases.append(f"timed regions at {num(o['per_event_ns'])} ns")
    phrases.append(f"{o['events']:,} timed regions")
    return phrases, rows


@pytest.mark.parametrize("name", [LOOP, FIXED, LOADER])
@pytest.mark.parametrize("width", [80, 100])
def test_text_fits_its_width_and_shows_the_reports_figures(name, width):
    report = golden_report(name)
    text = TextRenderer(width=width).render(report)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "\x1b[" not in text
    phrases, rows = expected_text(report.to_dict())
    assert len(rows) > 8 and len(phrases) > 6
    for phrase in phrases:
        assert flat(phrase) in flat(text), phrase
    for cells in rows:
        assert has_row(text, cells), cells


def test_terminal_summary_is_colour_in_a_terminal_and_plain_otherwise(loader, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = io.StringIO()
    Console(file=tty, force_terminal=True, width=200, color_system="standard").print(loader)
    assert ANSI_COLOR.search(tty.getvalue())
    assert max(len(ANSI.sub("", line)) for line in tty.getvalue().splitlines()) <= 80
    piped = io.StringIO()
    Console(file=piped, width=200).print(loader)  # not a terminal
    assert "\x1b[" not in piped.getvalue() and "load" in piped.getvalue()
    assert max(len(line) for line in piped.getvalue().splitlines()) <= 80  # even when wider
    assert ANSI_COLOR.search(TextRenderer(color=True).render(loader))


def test_no_color_is_honoured(loader, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    assert not ANSI_COLOR.search(TextRenderer(color=True).render(loader))
    tty = io.StringIO()
    Console(file=tty, force_terminal=True, width=80).print(loader)
    assert not ANSI_COLOR.search(tty.getvalue())


def test_html_has_every_chart_and_the_reports_figures(loop, loader):
    d = loop.to_dict()
    html = loop.render("html")
    for chart in (
        "step-breakdown",
        "step-timeline",
        "regions",
        "utilisation",
        "stage-icicle",
        "workers",
    ):
        assert f'class="chart {chart}"' in html, chart
    # the waits shaded on the utilisation timeline: the loop waited at every step
    assert html.count('class="waiting"') == len(wait_periods(d)) > 10
    assert 'data-series="gpu0"' in html and 'data-series="cpu"' in html
    v = d["verdict"]
    borderline = str(bool(v.get("borderline"))).lower()
    assert (
        f'data-kind="{v["kind"]}" data-borderline="{borderline}"><b>{escape(v["headline"])}</b>'
    ) in html
    for path in d["stages"]:
        assert f'data-stage="{path}"' in html, path
    for f in d["findings"]:
        assert f'data-finding="{f["id"]}"><b>{escape(f["message"])}' in html
    assert "of step time waiting" in html and pct(d["loop"]["steady"]["wait_fraction"]) in html
    page = loader.render("html")  # loader mode: the wait per batch instead of steps
    assert 'class="chart step-timeline"' in page and "Wait for each batch" in page
    assert 'class="chart step-breakdown"' not in page


def test_html_is_self_contained(loader, loop):
    for html in (loader.render("html"), loop.render("html")):
        assert html.startswith("<!DOCTYPE html>")
        assert "http://" not in html and "https://" not in html and "<script" not in html
        assert "<link" not in html and "url(" not in html
    fragment = loader._repr_html_()
    assert fragment.startswith("<style>") and "<html" not in fragment


def test_write_html_writes_the_page(loader, tmp_path):
    path = loader.write_html(tmp_path / "r.html")
    assert path.read_text(encoding="utf-8") == loader.render("html")


def test_mimebundle_text_has_no_escapes(loader):
    bundle = loader._repr_mimebundle_()
    assert "\x1b[" not in bundle["text/plain"] and "<svg" in bundle["text/html"]


def test_gpu_not_sampled_and_interrupted_and_empty_reports_render(loop):
    data = loop.to_dict()
    data = {
        **data,
        "gpu": {"available": False, "note": "no NVIDIA driver", "devices": []},
        "interrupted": True,
        "notes": ["a note"],
    }
    data["timeline"] = {**data["timeline"], "gpu": None}
    text = TextRenderer().render_dict(data)
    assert "GPU: n/a (no NVIDIA driver)" in text and "interrupted" in text and "a note" in text
    html = HTMLRenderer().render_dict(data)
    assert "GPU not sampled: no NVIDIA driver" in html and "interrupted" in html
    empty = pipeprof.Session(batches=0, samples=0)
    report = pipeprof.Report(empty)
    headline = report["verdict"]["headline"]
    assert headline == "nothing to attribute: no batch was measured"
    text = report.render("text")
    assert headline in text and "0 (0 samples)" in text
    assert json.loads(report.render("json")) == report.to_dict()
    assert headline in report.render("html")
    trace = json.loads(report.render("chrome"))
    assert trace["otherData"]["headline"] == headline
    assert not [e for e in trace["traceEvents"] if e["ph"] == "X"]  # no batch, no span
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:  # a loop that ends before its first batch: no claim about compute
        for _ in prof.wrap([]):
            pass
    assert "nothing to attribute: no step" in prof.report().render("text")


def test_formats_and_extensions():
    assert set(FORMATS) == {"text", "json", "html", "chrome"}
    assert format_for("run.trace.json") == "chrome" and format_for("RUN.JSON") == "json"
    assert format_for("a.html") == "html" and format_for("a.txt") == "text"
    assert format_for("a.trace") == "chrome" and format_for("a.csv") is None
    assert get_renderer("chrome").output_file_extension == ".trace.json"
    with pytest.raises(ValueError, match="choose one of text, json, html, chrome"):
        get_renderer("pdf")


def test_number_format():
    assert [num(v) for v in (None, 0, 0.5, 0.01234, 1.5, 12.34, 123.4, 12345.6, 0.00001)] == [
        "n/a",
        "0",
        "0.500",
        "0.0123",
        "1.50",
        "12.3",
        "123",
        "12,346",
        "1.0e-05",
    ]


def test_summary_is_constrained_for_wide_consoles(loader):
    out = io.StringIO()
    Console(file=out, width=160).print(*summary(loader.to_dict()))
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80


@pytest.mark.parametrize("columns", ["80", "200"])
def test_cli_text_is_plain_and_80_columns_when_piped(loader, columns):
    res = subprocess.run(
        [sys.executable, "-m", "pipeprof", "report", str(GOLDEN / LOADER)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": columns},
    )
    assert res.returncode == 0, res.stderr
    assert "\x1b[" not in res.stdout
    assert f"{loader.verdict['stage']} limits it" in flat(res.stdout)
    lines = [line.rstrip() for line in res.stdout.splitlines()]
    assert lines == TextRenderer(width=80).render(loader).splitlines()
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


class _OddStageDataset:
    """A map-style dataset whose user stage name looks like rich markup."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        with pipeprof.stage("[red]crop"):
            return i


def test_user_names_that_look_like_markup_are_shown_as_written():
    """Region, stage and transform names are the user's: rich must not read ``[bold]`` as style."""
    from torch.utils.data import DataLoader

    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(DataLoader(_OddStageDataset(), batch_size=2)):
            with prof.region("[bold]fetch"):
                pass
    report = prof.report()
    assert "load/[red]crop" in report["stages"]
    text = report.render("text")
    assert "[bold]fetch" in text and "[red]crop" in text
    compared = report.compare(report).render("text")
    assert "[bold]fetch" in compared and "  [red]crop" in compared

    named = lambda x: x
    named.__name__ = "[i]odd"
    bench = pipeprof.bench(list(range(8)), [named], repeat=1, workers=[]).render("text")
    assert bench.count("  [i]odd") == 2  # both tables


def test_a_session_recorded_here_renders_the_same_figures_everywhere():
    """Not golden: a real loop recorded now, rendered in every format, agrees with to_dict()."""
    ds = CostDataset(32, load_ms=2.0, transform=transforms.Compose([Scale(1.0, sleep=True)]))
    prof = pipeprof.Profiler(sample_hz=50, nvml=FakeNvml([FakeGpu(util=(40, 80), samples=None)]))
    with prof:
        for _ in prof.wrap(DataLoader(ds, batch_size=4, num_workers=2)):
            with prof.region("Forward"):
                time.sleep(0.004)
            with prof.region("Log"):
                time.sleep(0.001)
    report = prof.report()
    d = report.to_dict()
    headline = d["verdict"]["headline"]
    assert d["loop"]["steps"] == 8 and d["gpu"]["available"]
    assert flat(headline) in flat(report.render("text"))
    phrases, rows = expected_text(d)
    text = report.render("text", width=100)
    for phrase in phrases:
        assert flat(phrase) in flat(text), phrase
    for cells in rows:
        assert has_row(text, cells), cells
    html = report.render("html")
    borderline = str(d["verdict"]["borderline"]).lower()
    assert f'data-kind="{d["verdict"]["kind"]}" data-borderline="{borderline}"><b>' in html
    assert f"<b>{escape(headline)}</b>" in html
    lo, hi = d["verdict"]["wait_fraction_interval"]  # the card: where a rerun's wait lands
    assert f"of step time waiting (a rerun: {pct(lo)}–{pct(hi)})" in html
    assert json.loads(report.render("json")) == d
    trace = json.loads(report.render("chrome"))
    assert trace["otherData"]["headline"] == headline
    spans = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    timed = {p for p, r in d["stages"].items() if not r.get("derived")}
    assert timed == {"load", "transform/Scale", "collate"} and timed <= spans
    assert {"Forward", "Log"} <= spans
    assert sum(e.get("cat") == "step" for e in trace["traceEvents"]) == d["loop"]["steps"]
    # what the golden tests rely on: a saved and loaded Session gives the same report
    again = pipeprof.Session.from_dict(json.loads(json.dumps(report.session.to_dict())))
    assert pipeprof.Report(again).to_dict() == d


def test_a_loader_without_a_batch_size_says_none_of_it():
    """``DataLoader(batch_sampler=...)`` has ``batch_size=None``: the loader line leaves the
    size out (it read "batch None"); a loader with one says it."""
    from torch.utils.data import BatchSampler, SequentialSampler

    for kwargs, said in (
        ({"batch_sampler": BatchSampler(SequentialSampler(range(8)), 4, False)}, ""),
        ({"batch_size": 4}, ", batch 4"),
    ):
        prof = pipeprof.Profiler(sample_hz=0)
        with prof:
            for _ in prof.wrap(DataLoader(CostDataset(8), **kwargs)):
                pass
        report = prof.report()
        assert report["meta"]["batch_size"] == kwargs.get("batch_size")
        text, html = flat(report.render("text", width=100)), report.render("html")
        phrase = f"no workers (loading in the main process){said}"
        assert f"{phrase}, pin_memory=False" in text and f"{phrase} ·" in html
        assert "batch None" not in text and "batch None" not in html


def test_html_evidence_reads_as_words_and_rounded_figures(loop):
    """A finding's evidence in the HTML: keys in words, figures to about three digits, not raw
    ``key=value`` pairs with six decimals; nested values flattened."""
    data = loop.to_dict()
    data["findings"] = [{"id": "handover", "severity": "warning", "stage": None,
                         "message": "m", "fix": "f",
                         "evidence": {"handover_ms_per_step": 12.345678,
                                      "waits_for_workers_gil": True,
                                      "interval": [0.1234567, 0.2], "cores": 2,
                                      "sharing_strategy": "file_descriptor",
                                      "anchor": None}}]  # fmt: skip
    html = HTMLRenderer().render_dict(data)
    block = html[html.index('data-finding="handover"'):]
    block = block[: block.index("</div>")]
    assert "<td>handover ms per step</td><td>12.3</td>" in block
    assert "<td>waits for workers gil</td><td>yes</td>" in block
    assert "<td>interval</td><td>0.123, 0.200</td>" in block
    assert "<td>sharing strategy</td><td>file_descriptor</td>" in block
    assert "<td>anchor</td><td>n/a</td>" in block
    assert "<td>cores</td><td>2</td>" in block  # a count stays a whole number
    assert "12.345678" not in block and "handover_ms_per_step=" not in block


def _job(hosts: int) -> dict:
    """A job report's dict as analyze/job.py makes it: 4 ranks, rank 1 the straggler."""
    ranks = [
        {"rank": r, "host": f"gpu-node-{r * hosts // 4:02d}", "steps": 1200,
         "samples_per_s": 512.0 if r == 1 else 812.4, "wait_fraction": 0.72 if r == 1 else 0.03,
         "transfer_fraction": 0.01, "compute_fraction": 0.2 if r == 1 else 0.27,
         "comm_fraction": 0.02 if r == 1 else 0.69, "overhead_fraction": 0.01,
         "stage": "load" if r == 1 else "transform/RandomResizedCrop"}
        for r in range(4)
    ]  # fmt: skip
    return {
        "headline": "rank 1 waits 72% for data: load; the other ranks wait on it in all-reduce",
        "stragglers": [{"rank": 1, "message": "rank 1 waits 72% for data: load"}],
        "ranks": ranks, "efficiency": {"load_balance": 0.7, "communication": 0.4, "parallel": 0.28},
        "what_if": {"samples_per_s": 3000.0, "speedup": 1.8, "how": "each rank waits as the least"},
        "samples_per_s": 2100.0, "runtime_s": 60.2, "notes": [],
    }  # fmt: skip


@pytest.mark.parametrize("hosts", [1, 2])
def test_the_job_report_fits_a_terminal_and_marks_the_straggler(hosts):
    """Issue 39: at 80 columns no header of the rank table is cut and every line fits; the host
    is said once where all ranks ran on one; the straggler's row is marked, in text and HTML."""
    from pipeprof.render import job

    text = job.render(_job(hosts), "text", width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    [header] = [line for line in lines if line.startswith("rank ") and "steps" in line]
    assert "…" not in header
    for name in ("steps", "samples/s", "wait", "transfer", "compute", "comm", "other", "stage"):
        assert name in header.split(), name
    assert ("host" in header.split()) == (hosts == 2)
    assert ("on gpu-node-00" in text) == (hosts == 1)
    marked = [line.split()[0] for line in lines if line.strip().startswith(("0", "1", "2", "3"))]
    assert "1*" in marked and not {"0*", "2*", "3*"} & set(marked)
    assert "straggler" in text
    assert "…" not in text  # a long stage or host folds, never cut
    html = job.render(_job(hosts), "html")
    assert html.count("class='straggler'") == 1 and "rank 1 · straggler" in html
