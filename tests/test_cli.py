"""The pipeprof command, run as a real subprocess, both as `pipeprof` and `python -m pipeprof`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from machine import PIPEPROF, SCRIPT


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
        *PIPEPROF,
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


NO_SCRIPT = "pipeprof is not installed (it runs from PYTHONPATH): no console script"


@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param(
            [str(SCRIPT)], marks=pytest.mark.skipif(not SCRIPT.exists(), reason=NO_SCRIPT)
        ),
        [sys.executable, "-m", "pipeprof"],
    ],
)
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
    res = run(*PIPEPROF, "report", str(tmp_path / "nope.json"))
    assert res.returncode == 2 and "no such pipeprof file" in res.stderr
    # the path comes back whole: no markup read from it, no line break put into it
    odd = tmp_path / ("[bold]run " + "x" * 90) / "[1].json"
    res = run(*PIPEPROF, "report", str(odd))
    assert res.returncode == 2 and str(odd) in res.stderr


def test_user_mistakes_give_a_message_and_exit_2(tmp_path):
    import torch

    factory = tmp_path / "targets.py"
    factory.write_text("def needs_root(root):\n    return [1, 2]\n")
    target = f"{factory}:needs_root"
    cases = [
        (["demo", "--device", "foo"], "--device foo: no such torch device; use --device cpu"),
        (["demo", "--batches", "0"], "--batches: expected a whole number of 1 or more"),
        (["demo", "--batches", "-1"], "--batches: expected a whole number of 1 or more"),
        (["bench", target, "--workers", "a,b"], "--workers: expected worker counts"),
        (["bench", target, "--predict", "x"], "--predict: expected worker counts"),
        (["bench", target, "--compute-rate", "0"], "--compute-rate: expected samples/s above 0"),
        (["bench", target], "cannot be called without arguments"),
        (["report", str(tmp_path)], f"{tmp_path} is a folder: give the path of a file"),
    ]
    if not torch.cuda.is_available():
        cases.append((["demo", "--device", "cuda"], "CUDA is not available here"))
    for args, message in cases:
        res = run(*PIPEPROF, *args)
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr, (args, res.stderr)


def test_output_that_is_a_folder_gives_a_message(demo, tmp_path):
    out, _ = demo
    res = run(*PIPEPROF, "report", str(out / "demo.json"), "-o", str(tmp_path))
    assert res.returncode == 2 and "is a folder: give the path of a file" in res.stderr
    assert "Traceback" not in res.stderr
    from pipeprof.cli import _os_message

    denied = _os_message(PermissionError(13, "Permission denied", "/srv/r.html"))
    assert denied == "/srv/r.html: permission denied; choose a path you may read or write"


# Ctrl-C (a real SIGINT to the process) in the demo's second training step.
CTRL_C = """
import signal, sys
import pipeprof.demo as demo

# a terminal's Ctrl-C: whatever the test process left, SIGINT is neither blocked nor ignored
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)
from pipeprof.cli import main

make = demo.tiny_model

def tiny_model():
    model, steps = make(), []
    def ctrl_c(module, args):
        steps.append(1)
        if len(steps) == 2:  # raised in this thread: handled before the forward goes on
            signal.raise_signal(signal.SIGINT)
    model.register_forward_pre_hook(ctrl_c)
    return model

demo.tiny_model = tiny_model
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_in_demo_writes_what_was_measured_and_exits_130(tmp_path):
    html, saved = tmp_path / "demo.html", tmp_path / "demo.json"
    res = run(sys.executable, "-c", CTRL_C, "demo", "--images", "96", "--workers", "1",
              "--html", str(html), "-o", str(saved))  # fmt: skip
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr and "interrupted" in res.stdout
    assert "interrupted" in html.read_text()
    data = json.loads(saved.read_text())
    assert data["interrupted"] is True and data["batches"] >= 1


GOOD = Path(__file__).parent / "golden" / "session-loader.json"  # a saved session


def test_output_extension_that_names_no_format_is_refused(tmp_path):
    cases = [
        (["report", GOOD, "-o", tmp_path / "out.pdf"], "text, json, html, chrome: end the file"),
        (["compare", GOOD, GOOD, "-o", tmp_path / "out.pdf"], "compare` writes text, json, html"),
        (["compare", GOOD, GOOD, "-o", tmp_path / "c.trace.json"], "names the chrome format"),
    ]
    for args, message in cases:
        res = run(*PIPEPROF, *map(str, args))
        assert res.returncode == 2 and message in res.stderr, (args, res.stderr)
        assert "Traceback" not in res.stderr and str(args[-1]) in res.stderr
    assert not list(tmp_path.iterdir())  # nothing written as text under a name that says pdf
    res = run(*PIPEPROF, "report", str(GOOD), "-o", str(tmp_path / "out.pdf"), "--format", "text")
    assert res.returncode == 0 and "pipeline stages" in (tmp_path / "out.pdf").read_text()


@pytest.mark.skipif(not Path("/proc/version").exists(), reason="needs Linux /proc")
def test_output_io_errors_name_the_path():
    res = run(*PIPEPROF, "report", str(GOOD), "-o", "/proc/version")  # no format's extension
    assert res.returncode == 2 and "/proc/version" in res.stderr, res.stderr
    res = run(*PIPEPROF, "report", str(GOOD), "--format", "json", "-o", "/proc/version")
    assert res.returncode == 2 and "pipeprof: /proc/version: " in res.stderr, res.stderr
    assert "Traceback" not in res.stderr  # write() fails there, naming no file itself
    res = run(*PIPEPROF, "compare", str(GOOD), str(GOOD), "-o", "/proc/version.txt")
    assert res.returncode == 2 and "pipeprof: /proc/version.txt" in res.stderr, res.stderr


def test_outputs_are_checked_before_the_work_starts(tmp_path):
    import time

    scratch = tmp_path / "tmp"  # where the demo would write its images
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    for args in (["--html", "/nonexistent/x.html"], ["-o", "/nonexistent/x.json"],
                 ["--html", str(tmp_path)]):  # fmt: skip
        t0 = time.monotonic()
        res = subprocess.run([*PIPEPROF, "demo", *args], capture_output=True, text=True,
                             timeout=120, env=env)  # fmt: skip
        assert res.returncode == 2 and f"pipeprof: {args[1]}" in res.stderr, res.stderr
        assert time.monotonic() - t0 < 10 and not list(scratch.iterdir())  # no images, no run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # the checks leave no file
    factory = tmp_path / "targets.py"
    called = tmp_path / "called"
    factory.write_text(f"def data():\n    open({str(called)!r}, 'w').close()\n    return [1]\n")
    for out, message in (("/nonexistent/b.json", "/nonexistent/b.json: no such file"),
                         (str(tmp_path / "b.pdf"), "names no format")):  # fmt: skip
        res = run(*PIPEPROF, "bench", f"{factory}:data", "-o", out)
        assert res.returncode == 2 and message in res.stderr, res.stderr
        assert not called.exists()  # refused before the benchmark ran
