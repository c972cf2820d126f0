"""examples/reframe/pipeprof_check.py run by the real ``reframe`` on the local scheduler.

Each run starts ReFrame, which runs ``pipeprof run`` on examples/train.py (a short run, no
worker: input-bound, so there is a limiting stage) as a job: 5-10 s here (the failing one 1 s)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "reframe"
pytestmark = pytest.mark.slow


def reframe_bin() -> str:
    here = Path(sys.executable).parent / "reframe"
    found = str(here) if here.exists() else shutil.which("reframe")
    if found is None:
        pytest.skip("reframe is not installed: pip install 'pipeprof[reframe]'")
    return found


def reframe(tmp: Path, *settings: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run the check with ``-S`` ``settings``; ReFrame's own JSON report of the run."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env["TMPDIR"] = str(tmp)  # ReFrame's log file goes there, not to /tmp
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = [
        reframe_bin(), "-C", str(EXAMPLE / "config.py"), "-c", str(EXAMPLE / "pipeprof_check.py"),
        "--prefix", str(tmp / "out"), "--report-file", str(tmp / "report.json"), "-r",
        "-S", f"pipeprof={sys.executable} -m pipeprof", *(a for s in settings for a in ("-S", s)),
    ]  # fmt: skip
    ran = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=240)
    report = json.loads((tmp / "report.json").read_text())
    return ran, report


def test_the_check_passes_and_reports_what_pipeprof_measured(tmp_path):
    opts = "--images 64 --batch-size 16 --workers 0"
    ran, report = reframe(tmp_path, f"script_opts={opts}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run = report["runs"][0]
    assert (run["num_cases"], run["num_failures"]) == (1, 0)
    case = run["testcases"][0]
    assert case["result"] == "pass"

    pipeprof = json.loads((Path(case["outputdir"]) / "run.json").read_text())  # kept_files
    loop = pipeprof["loop"]
    perf = {key.rsplit(":", 1)[1]: value for key, value in case["perfvalues"].items()}
    assert perf["samples_per_s"][0] == loop["throughput"]["effective_samples_per_s"]
    assert perf["compute_samples_per_s"][0] == loop["throughput"]["compute_samples_per_s"]
    assert perf["wait_fraction"][0] == loop["wait_fraction"]
    assert perf["samples_per_s"][4] == "samples/s"
    assert 0 < perf["samples_per_s"][0] <= perf["compute_samples_per_s"][0]
    # no worker: the loop waits while the batch is made, so a stage limits it
    assert pipeprof["verdict"]["kind"] == "input-bound"
    stage = pipeprof["verdict"]["stage"]
    assert stage and stage in pipeprof["stages"]
    assert case["limiting_stage"] == stage
    perflog = next((tmp_path / "out" / "perflogs").rglob("PipelineThroughputCheck.log"))
    header, line = perflog.read_text().splitlines()[:2]
    assert dict(zip(header.split("|"), line.split("|")))["limiting_stage"] == stage


def test_the_check_fails_without_a_report(tmp_path):
    """A script with no DataLoader: pipeprof writes no report, and sanity says so."""
    ran, report = reframe(tmp_path, f"script={ROOT / 'tests' / 'scripts' / 'nodata.py'}")
    assert ran.returncode != 0
    case = report["runs"][0]["testcases"][0]
    assert case["result"] == "fail" and case["fail_phase"] == "sanity"
    assert "no pipeprof report in run.json" in case["fail_reason"]


def test_the_check_fails_when_pipeprofs_gate_does(tmp_path):
    """The check runs ``pipeprof check`` on the report with its ``gate`` budgets: a budget the
    run cannot meet (no worker: the loop waits for most of its time) fails sanity, naming it."""
    opts = "--images 64 --batch-size 16 --workers 0"
    ran, report = reframe(tmp_path, f"script_opts={opts}", "gate=--max wait_fraction=0.01")
    assert ran.returncode != 0
    case = report["runs"][0]["testcases"][0]
    assert case["result"] == "fail" and case["fail_phase"] == "sanity"
    assert "pipeprof's gate failed: ['wait_fraction > 0.01']" in case["fail_reason"]
