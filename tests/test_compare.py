"""Before/after comparison: the deltas, the verdict change, every output, the CLI.

The inputs are real recorded Sessions (tests/golden/make_sessions.py): a loop limited by a 120 ms
decode with 2 workers, the same loop with a 2 ms decode and 4 workers, and a loader alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from html import escape

import pytest
from golden_reports import DESIGN, FIXED, GOLDEN, LOADER, LOOP, assert_golden, golden_report
from machine import PIPEPROF
from pipelines import Sometimes
from torch.utils.data import DataLoader

import pipeprof
from pipeprof.analyze.compare import delta, other_load
from pipeprof.render.figures import num
from pipeprof.report import Comparison, compare


@pytest.fixture(scope="module")
def fix():
    return golden_report(LOOP), golden_report(FIXED)


def ids(report) -> set[str]:
    return {f["id"] for f in report.findings}


def test_delta():
    assert delta(10.0, 5.0) == {
        "before": 10.0,
        "after": 5.0,
        "change": -5.0,
        "ratio": 0.5,
        "improved": True,
        "noise": None,
        "uncertain": None,
    }
    assert delta(10.0, 5.0, noise=6.0)["improved"] is None  # within the runs' noise
    assert delta(10.0, 5.0, noise=6.0)["uncertain"] == "noise"
    assert delta(10.0, 5.0, noise=4.0)["improved"] is True
    assert delta(100.0, 300.0, higher_is_better=True)["improved"] is True
    assert delta(100.0, 101.0)["improved"] is None  # within 2 %: unchanged
    assert delta(0.0, 2.0)["ratio"] is None and delta(0.0, 2.0)["improved"] is False
    assert delta(None, 2.0) == {
        "before": None,
        "after": 2.0,
        "change": None,
        "ratio": None,
        "improved": None,
        "noise": None,
        "uncertain": None,
    }


def test_loop_before_and_after(fix):
    before, after = fix
    b, a = before.to_dict(), after.to_dict()
    c = compare(before, after)
    d = c.to_dict()
    assert d["schema"] == "pipeprof-compare/1"
    assert d["verdict"]["before"]["kind"] == DESIGN[LOOP]["kind"] == "input-bound"
    assert d["verdict"]["after"]["kind"] == DESIGN[FIXED]["kind"] == "compute-bound"
    assert d["verdict"]["changed"]
    assert d["verdict"]["before"]["stage"] == "load/decode"
    wait = d["loop"]["wait_fraction"]  # of the steady state, as the verdict reads it
    steady = (b["loop"]["steady"], a["loop"]["steady"])
    assert (wait["before"], wait["after"]) == tuple(v["wait_fraction"] for v in steady)
    assert wait["before"] > 3 * wait["after"] and wait["improved"] is True
    rate = d["loop"]["samples_per_s"]
    assert rate["before"] == b["loop"]["throughput"]["effective_samples_per_s"]
    assert rate["after"] == a["loop"]["throughput"]["effective_samples_per_s"]
    assert rate["ratio"] == pytest.approx(rate["after"] / rate["before"], rel=1e-5)
    assert rate["ratio"] > 1.5 and rate["improved"] is True
    decode = d["stages"]["load/decode"]["per_sample_ms"]
    want = tuple(r["stages"]["load/decode"]["per_sample_ms"] for r in (b, a))
    assert (decode["before"], decode["after"]) == want
    assert decode["after"] < decode["before"] / 10 and decode["improved"] is True  # 120 → 2 ms
    assert d["overview"]["num_workers"] == {"before": 2, "after": 4}
    assert {f["id"] for f in d["findings"]["resolved"]} == ids(before) - ids(after)
    assert {f["id"] for f in d["findings"]["new"]} == ids(after) - ids(before)
    assert {f["id"] for f in d["findings"]["remaining"]} == ids(before) & ids(after)
    assert {"workers-needed", "dominant-stage"} <= ids(before) - ids(after)
    assert d["summary"][0] == "verdict: input-bound → compute-bound"
    json.dumps(d)


def test_golden_text_and_html(fix):
    c = compare(*fix)
    text = c.render("text")
    assert max(len(line) for line in text.splitlines()) <= 80 and "\x1b[" not in text
    d = c.to_dict()
    panel = [line.strip("│ ") for line in text.splitlines()[1:5]]
    assert panel == d["summary"]  # the summary the comparison computed, line for line
    rows = [line.split() for line in text.splitlines()]
    rate = d["loop"]["samples_per_s"]
    assert ["samples/s", num(rate["before"]), num(rate["after"]), f"×{rate['ratio']:.2f}"] in rows
    for path, row in d["stages"].items():
        ms = row["per_sample_ms"]
        assert [path.rsplit("/", 1)[-1], num(ms["before"]), num(ms["after"])] in [
            r[:3] for r in rows
        ], path
    assert_golden("compare.txt", text)
    html = c.render("html")
    assert html.startswith("<!DOCTYPE html>") and "https://" not in html
    assert 'class="chart step-breakdown"' in html and 'class="chart compare-stages"' in html
    assert_golden("compare.html", html)
    assert json.loads(c.render("json")) == c.to_dict()
    with pytest.raises(ValueError, match="text, json or html"):
        c.render("chrome")


def test_report_compare_and_files(tmp_path):
    a = golden_report(LOADER)
    same = a.compare(a)
    assert isinstance(same, Comparison)
    d = same.to_dict()
    assert not d["verdict"]["changed"] and d["loop"] is None
    assert all(s["per_sample_ms"]["improved"] is None for s in d["stages"].values())
    assert d["labels"] == {"before": "before", "after": "after"}
    shutil.copy(GOLDEN / LOADER, tmp_path / "b.json")
    by_path = compare(GOLDEN / LOADER, tmp_path / "b.json")
    assert by_path.to_dict()["labels"] == {"before": LOADER, "after": "b.json"}
    assert "<svg" in same._repr_html_() and "pipeprof compare" in str(same)
    assert same._repr_mimebundle_().keys() >= {"text/html", "text/plain"}
    assert "biggest stage change" not in str(same)  # nothing moved
    # a report written as plain JSON (no raw session) compares too
    (tmp_path / "plain.json").write_text(a.render("json"))
    assert compare(tmp_path / "plain.json", tmp_path / "b.json").to_dict()["stages"].keys() == (
        d["stages"].keys()
    )
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="holds no pipeprof session"):
        compare(tmp_path / "other.json", tmp_path / "b.json")


@pytest.mark.parametrize("order", ["loop-loader", "loader-loop"])
def test_stages_new_in_one_report_sit_under_their_parent(fix, order):
    loop, loader = fix[0], golden_report(LOADER)
    before, after = (loop, loader) if order == "loop-loader" else (loader, loop)
    stages = list(compare(before, after).to_dict()["stages"])
    assert set(stages) == set(before["stages"]) | set(after["stages"])
    new = [p for p in after["stages"] if p not in before["stages"]]
    assert new  # the loop has Flip and Normalize, the loader Resize
    families = [p.split("/")[0] for p in stages]  # each family one block, in pipeline order
    blocks = list(dict.fromkeys(families))
    assert blocks == [f for f in ("load", "transform", "collate", "transfer") if f in families]
    assert families == sorted(families, key=blocks.index)
    for path in new:  # after its parent, not appended at the end
        if "/" in path:
            assert stages.index(path.rsplit("/", 1)[0]) < stages.index(path)


def test_loader_against_loop_compares_stages_only(fix):
    loader = golden_report(LOADER)
    d = compare(loader, fix[0]).to_dict()
    assert d["loop"] is None and d["modes"] == {"before": "loader", "after": "loop"}
    assert d["stages"]["transform/Resize"]["per_sample_ms"]["after"] is None  # loader only
    assert d["stages"]["transform/Flip"]["per_sample_ms"]["before"] is None  # loop only
    crop = d["stages"]["transform/Crop"]["per_sample_ms"]
    want = (loader["stages"]["transform/Crop"], fix[0]["stages"]["transform/Crop"])
    assert (crop["before"], crop["after"]) == tuple(r["per_sample_ms"] for r in want)
    text = compare(loader, fix[0]).render("text")
    rows = [line.split() for line in text.splitlines()]
    flip = d["stages"]["transform/Flip"]["per_sample_ms"]["after"]
    resize = d["stages"]["transform/Resize"]["per_sample_ms"]["before"]
    assert ["Flip", "n/a", num(flip), "n/a"] in rows  # a side that lacks a stage: n/a, not 0
    assert ["Resize", num(resize), "n/a", "n/a"] in rows
    assert 'class="chart compare-stages"' in compare(loader, fix[0]).render("html")


def test_cli_compare(fix, tmp_path):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    shutil.copy(GOLDEN / LOADER, before)
    shutil.copy(GOLDEN / LOADER, after)
    res = subprocess.run(
        [*PIPEPROF, "compare", str(before), str(after)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "80", "PATH": ""},
    )
    assert res.returncode == 0, res.stderr
    assert "pipeprof compare: before.json → after.json" in res.stdout
    kind = golden_report(LOADER).verdict["kind"]
    assert f"verdict: still {kind}" in res.stdout and "\x1b[" not in res.stdout
    out = tmp_path / "c.html"
    res = subprocess.run(
        [sys.executable, "-m", "pipeprof", "compare", str(before), str(after), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and out.read_text().startswith("<!DOCTYPE html>")
    res = subprocess.run(
        [*PIPEPROF, "compare", str(before), str(after), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(res.stdout)["schema"] == "pipeprof-compare/1"
    res = subprocess.run(
        [*PIPEPROF, "compare", str(before), str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "no such pipeprof file" in res.stderr


def test_a_stage_timed_in_two_strata_is_as_noisy_as_its_weights_say():
    # 16 first calls as they are and 5 later ones standing for 8 each (NOTE [ Unprofiled
    # batches ]), all of 1 ms with a spread of 0.5: the total's spread is that of 16 + 5 * 8^2
    # calls' worth, not of 21 calls' mean
    from pipeprof.analyze.compare import _stage_half

    row = {"std_ms": 0.5, "count": 21, "mean_ms": 1.0, "total_s": 0.056, "per_sample_ms": 1.0}
    assert _stage_half(row) == pytest.approx(1.96 * 2**0.5 * 0.5 / 21**0.5)  # as if equal
    weighed = _stage_half({**row, "scaled": 8.0})
    assert weighed == pytest.approx(1.96 * 2**0.5 * 0.5 * (16 + 64 * 5) ** 0.5 / 56)
    assert weighed > 1.45 * _stage_half(row)  # 1.5 times as wide


def noisy_run(load_ms: float = 20.0, steps: int = 60) -> pipeprof.Report:
    """A loop whose steps wait unevenly (3 samples in 10 cost ``load_ms``, a 10 ms step), with
    the host sampler on. Every batch's stages timed: timed in 1 batch in 8 after the first 16,
    a stage would be scaled from 5 of these 60 batches, and its noise as wide as that is
    (``test_a_stage_timed_in_two_strata_is_as_noisy_as_its_weights_say``)."""
    prof = pipeprof.Profiler(sample_hz=20, stage_every=1)
    with prof:
        for _ in prof.wrap(DataLoader(Sometimes(steps, p=0.3, ms=load_ms), batch_size=1)):
            with prof.region("Forward"):
                time.sleep(0.010)
    return prof.report()


def colours(d: dict) -> list:
    """``improved`` of every loop figure and stage (what the renderers colour)."""
    rows = [v for v in d["loop"].values() if "improved" in v]
    rows += [s["per_sample_ms"] for s in d["stages"].values()]
    return [v["improved"] for v in rows]


@pytest.mark.timing
def test_identical_runs_differ_within_noise_and_are_not_coloured():
    """Three runs of one uneven loop: their throughput, wait share, step and load differ by
    several per cent, but within what each run's spread says a rerun moves, so no pair is
    better or worse. (Not start-up, one value a run with no spread; and not the small stages,
    whose per-call spread misses the machine's drift: ``machine`` is for that.)"""
    runs = [noisy_run() for _ in range(3)]
    for before, after in ((0, 1), (1, 2), (0, 2)):
        d = compare(runs[before], runs[after]).to_dict()
        figures = [d["loop"][k] for k in ("samples_per_s", "wait_fraction", "step_mean_ms")]
        for fig in [*figures, d["stages"]["load"]["per_sample_ms"]]:
            assert fig["noise"] > 0.02 * max(fig["before"], fig["after"]), fig  # wider than SAME
            assert fig["improved"] is None, fig
    d = compare(runs[0], runs[1]).to_dict()
    if any(v["uncertain"] == "noise" for v in d["loop"].values() if "uncertain" in v):
        note = next(n for n in d["notes"] if n.startswith("~ marks"))
        text = compare(runs[0], runs[1]).render("text")
        assert "~" in text and " ".join(note.split()) in " ".join(text.split())
        assert escape(note) in compare(runs[0], runs[1]).render("html")


@pytest.fixture
def neighbours():
    """Start ``n`` processes that spin, outside this process's tree (so the host sampler counts
    them as other load, not ours); stop them, by pid, at the end."""
    pids: list[int] = []

    def start(n: int) -> None:
        spin = f"{sys.executable} -c 'while True: pass'"
        for _ in range(n):
            out = subprocess.run(
                ["sh", "-c", f"{spin} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
            )
            pids.append(int(out.stdout))

    yield start
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.timing
def test_a_busier_machine_is_named_and_no_change_is_coloured(neighbours):
    """The same loop, made cheaper (20 → 5 ms loads), run again while two other processes
    keep the cores busy: pipeprof says the machine was busier and calls nothing better or
    worse, in JSON, text and HTML."""
    before = noisy_run()
    idle = (lambda m: m and m["cpu_count"] - m["other_cores"])(other_load(before.to_dict()))
    if not idle or idle < 1.0:  # a shared machine already full: no room to be busier
        pytest.skip(f"other processes already use all but {idle} cores: nothing to add")
    neighbours(2)
    time.sleep(0.3)
    after = noisy_run(load_ms=5.0)
    c = compare(before, after)
    d = c.to_dict()
    m = d["machine"]
    assert m["differs"], m
    assert m["after"]["other_cores"] - m["before"]["other_cores"] >= 0.5
    assert colours(d) and set(colours(d)) == {None}
    assert d["loop"]["samples_per_s"]["uncertain"] == "machine-load"  # not "better", as it was
    assert "the machine was busier during after" in m["note"] and m["note"] in d["notes"]
    assert " ".join(m["note"].split()) in " ".join(c.render("text").split())
    assert escape(m["note"]) in c.render("html")
