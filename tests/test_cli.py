"""The pipeprof command, run as a real subprocess, both as `pipeprof` and `python -m pipeprof`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).with_name("pipeprof")


def run(*args, cwd=None):
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        env={**os.environ, "COLUMNS": "80"},
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    res = run(
        str(BIN),
        "demo",
        "--images",
        "128",
        "--batches",
        "3",
        "--html",
        str(out / "demo.html"),
        "-o",
        str(out / "demo.json"),
    )
    assert res.returncode == 0, res.stderr
    return out, res


def test_demo_prints_summary_and_writes_html(demo):
    out, res = demo
    assert "transform" in res.stdout and "RandomResizedCrop" in res.stdout
    assert "decode" in res.stdout and "worker1" in res.stdout
    assert (out / "demo.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("prefix", [[str(BIN)], [sys.executable, "-m", "pipeprof"]])
def test_report_formats(demo, prefix, tmp_path):
    out, _ = demo
    res = run(*prefix, "report", str(out / "demo.json"), "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["schema"] == "pipeprof/1" and data["batches"] == 3
    res = run(*prefix, "report", str(out / "demo.json"))
    assert res.returncode == 0 and "load" in res.stdout
    res = run(*prefix, "report", str(out / "demo.json"), "-o", str(tmp_path / "r.html"))
    assert res.returncode == 0 and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE")


def test_bad_file_gives_a_clear_error_and_exit_2(tmp_path):
    res = run(str(BIN), "report", str(tmp_path / "nope.json"))
    assert res.returncode == 2 and "no such pipeprof file" in res.stderr
    # the path comes back whole: no markup read from it, no line break put into it
    odd = tmp_path / ("[bold]run " + "x" * 90) / "[1].json"
    res = run(str(BIN), "report", str(odd))
    assert res.returncode == 2 and str(odd) in res.stderr
