"""Fidelity: a script run under ``pipeprof run`` behaves as under plain python (issue 37): how
it is found, what it sees of its own command line, and where the outputs it asked for land."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
LOOP = """
import os, sys
import torch
from torch.utils.data import DataLoader
print("argv", sys.argv)
{before}
print(sum(int(x.sum()) for x in DataLoader(torch.arange(32.0), batch_size=8)))
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return e


def run(cwd: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd, env=env(),
                          timeout=240)  # fmt: skip


def test_the_console_script_runs_a_module_from_the_folder_it_is_run_in(tmp_path):
    """``pipeprof run -m pkg.train`` from the installed command (not ``python -m pipeprof``,
    whose sys.path already holds the folder)."""
    command = Path(sys.executable).parent / "pipeprof"
    assert command.exists(), "pipeprof is installed with its console script (dev/setup.sh)"
    ran = run(SCRIPTS, str(command), "run", "-q", "-o", str(tmp_path / "run.json"),
              "-m", "trainpkg.train", "--", "--config", "c.yaml")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads((tmp_path / "run.json").read_text())["stages"]["load"]["count"] == 64


def test_outputs_land_where_asked_when_the_script_changes_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "s.py").write_text(LOOP.format(before="os.chdir('sub')"))
    ran = run(tmp_path, sys.executable, "-m", "pipeprof", "run", "-o", "rel.json",
              "--html", "rel.html", "s.py")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "rel.json").exists() and (tmp_path / "rel.html").exists()
    assert not (tmp_path / "sub" / "rel.json").exists()
    assert "saved to rel.json" in ran.stderr  # as typed, where the user is


def test_the_script_sees_its_command_line_as_typed(tmp_path):
    (tmp_path / "s.py").write_text(LOOP.format(before=""))
    args = ("s.py", "-o", "x.json", "--html", "--", "-q")  # flags that look like pipeprof's
    plain = run(tmp_path, sys.executable, *args)
    ran = run(tmp_path, sys.executable, "-m", "pipeprof", "run", "-q", "-o", "run.json", "--",
              *args)  # fmt: skip
    assert plain.returncode == ran.returncode == 0, ran.stderr
    assert ran.stdout == plain.stdout and "argv ['s.py', '-o', 'x.json'" in plain.stdout


def test_a_forked_child_leaves_the_parents_report_alone(tmp_path):
    """The child outlives the parent: before, it wrote its copy of the run (8 of 16 steps) over
    the parent's report, and printed a second summary."""
    body = """
import time
it = iter(DataLoader(torch.arange(64.0), batch_size=4))
for _ in range(8):
    next(it)
if os.fork() == 0:
    time.sleep(1.0)
    print("child done", flush=True)
else:
    for _ in range(8):
        next(it)
    print("parent done", flush=True)
    sys.exit(0)
"""
    (tmp_path / "s.py").write_text(LOOP.format(before=body).split("print(sum(")[0])
    ran = run(tmp_path, sys.executable, "-m", "pipeprof", "run", "-o", "run.json", "s.py")
    assert ran.returncode == 0, ran.stderr
    assert "child done" in ran.stdout and "parent done" in ran.stdout
    assert ran.stderr.count("saved to run.json") == 1, ran.stderr
    assert json.loads((tmp_path / "run.json").read_text())["loop"]["steps"] == 16


def test_a_pool_the_script_terminates_ends_quietly(tmp_path):
    """``Pool.__exit__`` sends SIGTERM to its workers: they end as under plain python, with no
    traceback of pipeprof's SIGTERM handler (which they inherited)."""
    body = """
import multiprocessing, time
def nap(x):
    time.sleep(0.05)
    return x
if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(pool.map(nap, range(4)))
"""
    (tmp_path / "s.py").write_text(LOOP.format(before=body))
    plain = run(tmp_path, sys.executable, "s.py")
    ran = run(tmp_path, sys.executable, "-m", "pipeprof", "run", "-q", "-o", "run.json", "s.py")
    assert plain.returncode == ran.returncode == 0, ran.stderr
    assert ran.stdout == plain.stdout
    assert "Traceback" not in ran.stderr and "Terminated" not in ran.stderr, ran.stderr


def test_a_loader_that_times_out_before_its_first_batch_is_named(tmp_path):
    body = """
import time
class Stuck(torch.utils.data.Dataset):
    def __len__(self):
        return 4
    def __getitem__(self, i):
        time.sleep(5)
        return i
if __name__ == "__main__":
    for x in DataLoader(Stuck(), num_workers=1, timeout=0.5):
        pass
"""
    (tmp_path / "s.py").write_text(LOOP.format(before=body).split("print(sum(")[0])
    plain = run(tmp_path, sys.executable, "s.py")
    ran = run(tmp_path, sys.executable, "-m", "pipeprof", "run", "-o", "run.json", "s.py")
    assert plain.returncode == ran.returncode == 1
    assert "DataLoader timed out" in ran.stderr
    said = " ".join(ran.stderr.split())
    assert "the script started DataLoader@s.py:" in said and "no batch came" in said, said
    assert "iterated no" not in said and "covers what ran" not in said


@pytest.mark.parametrize("own_handler", [False, True])
def test_sigterm_to_the_process_group_keeps_the_report(tmp_path, own_handler):
    """scancel and ``kill -TERM -PGID`` signal the workers too: they die first, and torch's
    SIGCHLD handler used to raise while the report was being written (3 of 3 runs)."""
    import signal
    import time

    body = f"""
import signal, time
if {own_handler}:
    def bye(signum, frame):
        raise SystemExit(143)
    signal.signal(signal.SIGTERM, bye)
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        time.sleep(0.01)
        return i
if __name__ == "__main__":
    for step, x in enumerate(DataLoader(Slow(), batch_size=2, num_workers=2)):
        time.sleep(0.02)
        if step == 5:
            print("running", flush=True)
"""
    (tmp_path / "s.py").write_text(LOOP.format(before=body).split("print(sum(")[0])
    cmd = [sys.executable, "-m", "pipeprof", "run", "-o", "run.json", "s.py"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # the script's argv, then its 6th step
        if "running" in line:
            break
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole group: main process and workers
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == (143 if own_handler else -signal.SIGTERM), err
    assert "could not be written" not in err, err
    assert json.loads((tmp_path / "run.json").read_text())["loop"]["steps"] >= 5


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pipeline_error_shows_the_frames_plain_python_shows(tmp_path, workers):
    body = f"""
class Broken(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        if i == 5:
            raise ValueError(f"sample {{i}} is broken")
        return i
if __name__ == "__main__":
    for x in DataLoader(Broken(), batch_size=2, num_workers={workers}):
        pass
"""
    (tmp_path / "s.py").write_text(LOOP.format(before=body).split("print(sum(")[0])
    plain = run(tmp_path, sys.executable, "s.py")
    ran = run(tmp_path, sys.executable, "-m", "pipeprof", "run", "-q", "-o", "run.json", "s.py")
    assert plain.returncode == ran.returncode == 1

    def frames(err: str) -> list[str]:  # the main process's files (a worker's are its text)
        main = err.split("Original Traceback")[0]
        files = [line.split(",")[0] for line in main.splitlines() if line.startswith('  File "')]
        # one file's frames in a row as one: torch's fetch reaches the samples through its
        # list comprehension plain, through pipeprof's __getitems__ profiled (the same file)
        return [f for i, f in enumerate(files) if not i or files[i - 1] != f]

    assert frames(ran.stderr) == frames(plain.stderr), ran.stderr
    assert "pipeprof" not in " ".join(frames(ran.stderr))
    assert "ValueError: sample 5 is broken" in ran.stderr


SLOW_LOOP = """
import signal, sys, time
class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        time.sleep(0.01)
        return i
if __name__ == "__main__":
    for step, x in enumerate(DataLoader(Slow(), batch_size=2, num_workers=2)):
        time.sleep(0.02)
        if step == 5:
            print("running", flush=True)
"""


def _signalled(tmp_path: Path, cmd: list[str], signum: int) -> tuple[int, str]:
    """Run ``cmd`` until the script's 6th step, send ``signum`` to its main process alone."""
    import time

    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "running" in line:
            break
    time.sleep(0.3)
    os.kill(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_each_ending_signal_keeps_the_report_and_the_exit_status(tmp_path, name):
    """Issue 37: the report is written for SIGTERM, SIGHUP and SIGINT to the main process, and
    the process ends as plain python's does (by the signal; SIGINT: KeyboardInterrupt)."""
    import signal

    signum = getattr(signal, name)
    (tmp_path / "s.py").write_text(LOOP.format(before=SLOW_LOOP).split("print(sum(")[0])
    plain, _ = _signalled(tmp_path, [sys.executable, "s.py"], signum)
    ran, err = _signalled(tmp_path, [sys.executable, "-m", "pipeprof", "run", "-o", "run.json",
                                     "s.py"], signum)  # fmt: skip
    assert ran == plain == -signum, err
    assert "could not be written" not in err, err
    assert json.loads((tmp_path / "run.json").read_text())["loop"]["steps"] >= 5


WORKER_EXITS = """
import sys
class Exits(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 40:
            {how}
        return i
if __name__ == "__main__":
    try:
        for x in DataLoader(Exits(), batch_size=4, num_workers=2):
            pass
    except {caught} as exc:
        print("caught", type(exc).__name__)
        sys.exit(4)
"""


@pytest.mark.parametrize("how,caught,status", [
    ("sys.exit(3)", "KeyError", 1),  # the worker exits: torch raises in the loop, uncaught
    ("raise ValueError('bad sample')", "ValueError", 4),  # the script's sys.exit on it
])  # fmt: skip
def test_a_worker_that_exits_or_raises_keeps_the_report(tmp_path, how, caught, status):
    """Issue 37: ``sys.exit`` in a worker, and the script's ``sys.exit`` on a worker's
    exception: the exit status as plain, the report written with the batches before."""
    body = WORKER_EXITS.format(how=how, caught=caught)
    (tmp_path / "s.py").write_text(LOOP.format(before=body).split("print(sum(")[0])
    plain = run(tmp_path, sys.executable, "s.py")
    ran = run(tmp_path, sys.executable, "-m", "pipeprof", "run", "-q", "-o", "run.json", "s.py")
    assert plain.returncode == ran.returncode == status, ran.stderr
    assert plain.stdout == ran.stdout
    assert "could not be written" not in ran.stderr, ran.stderr
    assert json.loads((tmp_path / "run.json").read_text())["loop"]["steps"] >= 4
