"""Before/after comparison: the deltas, the verdict change, every output, the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from golden_reports import GOLDEN, assert_golden, loop_case

import pipeprof
from pipeprof.analyze.compare import delta
from pipeprof.report import Comparison, compare

BIN = Path(sys.executable).with_name("pipeprof")


@pytest.fixture(scope="module")
def fix():
    return loop_case()[0], loop_case(after=True)[0]


def test_delta():
    assert delta(10.0, 5.0) == {
        "before": 10.0,
        "after": 5.0,
        "change": -5.0,
        "ratio": 0.5,
        "improved": True,
    }
    assert delta(100.0, 300.0, higher_is_better=True)["improved"] is True
    assert delta(100.0, 101.0)["improved"] is None  # within 2 %: unchanged
    assert delta(0.0, 2.0)["ratio"] is None and delta(0.0, 2.0)["improved"] is False
    assert delta(None, 2.0) == {
        "before": None,
        "after": 2.0,
        "change": None,
        "ratio": None,
        "improved": None,
    }


def test_loop_before_and_after(fix):
    c = compare(*fix)
    d = c.to_dict()
    assert d["schema"] == "pipeprof-compare/1"
    assert d["verdict"]["before"]["kind"] == "input-bound"
    assert d["verdict"]["after"]["kind"] == "compute-bound" and d["verdict"]["changed"]
    wait = d["loop"]["wait_fraction"]
    assert wait["before"] > 0.5 and wait["after"] < 0.1 and wait["improved"] is True
    assert d["loop"]["samples_per_s"]["ratio"] > 1.5
    assert d["loop"]["samples_per_s"]["improved"] is True
    crop = d["stages"]["transform/RandomResizedCrop"]["per_sample_ms"]
    assert (crop["before"], crop["after"], crop["improved"]) == (2.0, 0.6, True)
    assert d["overview"]["num_workers"] == {"before": 2, "after": 4}
    assert {f["id"] for f in d["findings"]["resolved"]} == {"workers-needed", "dominant-stage"}
    assert d["findings"]["new"] == [] and d["findings"]["remaining"] == []
    assert d["summary"][0] == "verdict: input-bound → compute-bound"
    json.dumps(d)


def test_golden_text_and_html(fix):
    c = compare(*fix)
    text = c.render("text")
    assert max(len(line) for line in text.splitlines()) <= 80 and "\x1b[" not in text
    assert_golden("compare.txt", text)
    html = c.render("html")
    assert html.startswith("<!DOCTYPE html>") and "https://" not in html
    assert 'class="chart step-breakdown"' in html and 'class="chart compare-stages"' in html
    assert_golden("compare.html", html)
    assert json.loads(c.render("json")) == c.to_dict()
    with pytest.raises(ValueError, match="text, json or html"):
        c.render("chrome")


def test_report_compare_and_files(tmp_path):
    a = pipeprof.load(GOLDEN / "loader-session.json")
    same = a.compare(a)
    assert isinstance(same, Comparison)
    d = same.to_dict()
    assert not d["verdict"]["changed"] and d["loop"] is None
    assert all(s["per_sample_ms"]["improved"] is None for s in d["stages"].values())
    assert d["labels"] == {"before": "before", "after": "after"}
    shutil.copy(GOLDEN / "loader-session.json", tmp_path / "b.json")
    by_path = compare(GOLDEN / "loader-session.json", tmp_path / "b.json")
    assert by_path.to_dict()["labels"] == {"before": "loader-session.json", "after": "b.json"}
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


def test_stages_new_in_one_report_sit_under_their_parent(fix):
    loader = pipeprof.load(GOLDEN / "loader-session.json")
    order = list(compare(fix[0], loader).to_dict()["stages"])
    assert order.index("load/read") < order.index("transform")  # not after collate
    assert order.index("transform/RandomResizedCrop") < order.index("collate")


def test_loader_against_loop_compares_stages_only(fix):
    loader = pipeprof.load(GOLDEN / "loader-session.json")
    d = compare(loader, fix[0]).to_dict()
    assert d["loop"] is None and d["modes"] == {"before": "loader", "after": "loop"}
    assert d["stages"]["load/read"]["per_sample_ms"]["after"] is None
    assert d["stages"]["transform/RandomResizedCrop"]["per_sample_ms"]["before"] is None
    compare(loader, fix[0]).render("text")
    compare(loader, fix[0]).render("html")


def test_cli_compare(fix, tmp_path):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    shutil.copy(GOLDEN / "loader-session.json", before)
    shutil.copy(GOLDEN / "loader-session.json", after)
    res = subprocess.run(
        [str(BIN), "compare", str(before), str(after)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "80", "PATH": ""},
    )
    assert res.returncode == 0, res.stderr
    assert "pipeprof compare: before.json → after.json" in res.stdout
    assert "verdict: still balanced" in res.stdout and "\x1b[" not in res.stdout
    out = tmp_path / "c.html"
    res = subprocess.run(
        [sys.executable, "-m", "pipeprof", "compare", str(before), str(after), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and out.read_text().startswith("<!DOCTYPE html>")
    res = subprocess.run(
        [str(BIN), "compare", str(before), str(after), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(res.stdout)["schema"] == "pipeprof-compare/1"
    res = subprocess.run(
        [str(BIN), "compare", str(before), str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "no such pipeprof file" in res.stderr
