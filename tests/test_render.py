"""Every renderer on golden inputs: a real saved profile (re-analysed) and a hand-made loop report.

Fixed-width text is compared exactly with tests/golden/; so are HTML and the Chrome trace.
Accept intended changes with ``PIPEPROF_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py``.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from golden_reports import GOLDEN, assert_golden, loop_case
from rich.console import Console

import pipeprof
from pipeprof.renderers import FORMATS, format_for, get_renderer
from pipeprof.renderers.chrome import build_trace
from pipeprof.renderers.figures import num
from pipeprof.renderers.html import HTMLRenderer
from pipeprof.renderers.jsonrenderer import JSONRenderer
from pipeprof.renderers.text import TextRenderer, summary

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ANSI_COLOR = re.compile(r"\x1b\[(?:\d+;)*(?:3\d|9\d|38;)")  # a foreground colour escape


@pytest.fixture(scope="module")
def loader():
    return pipeprof.load(GOLDEN / "loader-session.json")


@pytest.fixture(scope="module")
def loop():
    return loop_case()


def test_reanalysis_is_deterministic(loader):
    again = pipeprof.load(GOLDEN / "loader-session.json")
    assert again.to_dict() == loader.to_dict()
    assert again.render("html") == loader.render("html")


def test_text_golden_loader(loader):
    assert_golden("loader.txt", TextRenderer(width=80).render(loader))


def test_text_golden_loop(loop):
    assert_golden("loop.txt", TextRenderer(width=80).render_dict(loop[0]))


def test_html_golden(loader, loop):
    assert_golden("loader.html", HTMLRenderer().render(loader))
    assert_golden("loop.html", HTMLRenderer().render_dict(loop[0]))


def trace_text(trace: dict) -> str:
    """One event per line: small diffs when a golden trace changes."""
    events = ",\n".join(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])
    rest = json.dumps({k: v for k, v in trace.items() if k != "traceEvents"}, sort_keys=True)
    return f'{{"traceEvents": [\n{events}\n],\n"rest": {rest}}}\n'


def test_chrome_golden(loader, loop):
    assert_golden("loader.trace.json", trace_text(build_trace(loader.to_dict(), loader.session)))
    assert_golden("loop.trace.json", trace_text(build_trace(*loop)))


def test_json_renderer_is_the_contract(loader, loop):
    assert json.loads(JSONRenderer().render(loader)) == loader.to_dict()
    assert json.loads(JSONRenderer().render_dict(loop[0])) == loop[0]
    with_session = json.loads(JSONRenderer(session=True).render(loader))
    assert with_session["session"] == loader.session.to_dict()


@pytest.mark.parametrize("width", [80, 100])
def test_text_fits_its_width_and_says_what_matters(loader, loop, width):
    for text in (
        TextRenderer(width=width).render(loader),
        TextRenderer(width=width).render_dict(loop[0]),
    ):
        assert max(len(line) for line in text.splitlines()) <= width
        assert "\x1b[" not in text
    text = TextRenderer().render_dict(loop[0])
    for phrase in (
        "input-bound: the GPU waited for data 62% of the time",
        "step time",
        "RandomResizedCrop",
        "Forward",
        "worker1",
        "GPU 0 NVIDIA H100",
        "GPU idle waiting for data: 52%",
        "CPU: 78% mean of 8 cores",
        "fix: DataLoader(num_workers=4)",
        "pipeprof overhead: 850 ns",
    ):
        assert phrase in text, phrase


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


def test_html_has_every_chart(loop, loader):
    html = HTMLRenderer().render_dict(loop[0])
    for chart in (
        "step-breakdown",
        "step-timeline",
        "regions",
        "utilisation",
        "stage-icicle",
        "workers",
    ):
        assert f'class="chart {chart}"' in html, chart
    assert html.count('class="waiting"') > 10  # waits shaded on the utilisation timeline
    assert 'data-series="gpu0"' in html and 'data-series="cpu"' in html
    assert 'data-stage="transform/RandomResizedCrop"' in html
    page = loader.render("html")  # loader mode: the wait per batch instead of steps
    assert 'class="chart step-timeline"' in page and "Wait for each batch" in page
    assert 'class="chart step-breakdown"' not in page


def test_html_is_self_contained(loader, loop):
    for html in (loader.render("html"), HTMLRenderer().render_dict(loop[0])):
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


def test_gpu_not_sampled_and_interrupted_and_empty_reports_render():
    data, _ = loop_case()
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
def test_cli_text_is_plain_and_80_columns_when_piped(columns):
    res = subprocess.run(
        [sys.executable, "-m", "pipeprof", "report", str(GOLDEN / "loader-session.json")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": columns},
    )
    assert res.returncode == 0, res.stderr
    assert "\x1b[" not in res.stdout and "load/read limits it" in res.stdout
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
