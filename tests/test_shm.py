"""Shared memory before the failure (NOTE [ Shared memory ] in collect/torch/shm.py): real
DataLoader workers under ``pipeprof run`` in a private mount namespace whose /dev/shm is a 64 MB
tmpfs (as a container's default), as root. Too many 16 MB batches in flight fail in a worker:
the warning comes on stderr first, the user's exception passes through unchanged, and the saved
report names the failure and what fits. The configuration it recommends, followed, runs; a loader
that fits is no finding."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pipeprof

SCRIPT = """
import sys
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Big(Dataset):
    # batch 0 comes first, its worker not raced by the others for the shared memory: the other
    # workers' first batches wait 0.3 s, then each makes all of its own at once (under load,
    # batch 0's worker once lost that race, and a loader whose first batch never comes cannot
    # say what a batch needs)
    def __init__(self, batch, workers):
        self.batch, self.workers = batch, workers

    def __len__(self):
        return 48

    def __getitem__(self, i):
        if i % self.batch == 0 and 1 <= i // self.batch < self.workers:
            time.sleep(0.3)
        return torch.full((524_288,), float(i))  # 2 MB


batch, workers, prefetch = (int(a) for a in sys.argv[1:4])
loader = DataLoader(Big(batch, workers), batch_size=batch, num_workers=workers,
                    prefetch_factor=prefetch)
total = 0.0
for b in loader:
    total += float(b[:, 0].sum())
print("sum", total)
"""


def in_small_shm(tmp_path: Path, *args: str, profiled: bool = True):
    """The script (``big.py``: SCRIPT unless the test wrote another) in a mount namespace of
    its own, with a 64 MB /dev/shm."""
    script = tmp_path / "big.py"
    if not script.exists():
        script.write_text(SCRIPT)
    out = tmp_path / "run.json"
    run = [sys.executable, "-m", "pipeprof", "run", "-o", str(out)] if profiled else [
        sys.executable]
    inner = " ".join([*run, str(script), *args])
    command = ["unshare", "-m", "sh", "-c",
               f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {inner}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    return done, (pipeprof.load(out).to_dict() if profiled and out.exists() else None)


def needs_namespace() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("this test mounts a small /dev/shm: run the suite as root with unshare")


def shm_finding(report: dict) -> dict | None:
    return next((f for f in report["findings"] if f["id"] == "shm-too-small"), None)


def test_batches_that_do_not_fit_are_warned_of_and_the_failure_named(tmp_path):
    needs_namespace()
    plain, _ = in_small_shm(tmp_path, "8", "4", "2", profiled=False)
    assert plain.returncode != 0 and "unable to allocate shared memory" in plain.stderr
    done, report = in_small_shm(tmp_path, "8", "4", "2")
    assert done.returncode == plain.returncode  # the user's exception, unchanged
    assert "RuntimeError: Caught RuntimeError in DataLoader worker process" in done.stderr
    warned = done.stderr.index("pipeprof: a DataLoader (batch_size=8)'s workers need about 144")
    assert warned < done.stderr.index("Traceback")  # before the failure reached the loop
    shm = report["meta"]["shm"]
    assert shm["batch_mb"] == 16 and shm["in_flight"] == 9 and shm["size_mb"] == 64
    assert "unable to allocate shared memory" in shm["failed"]
    found = shm_finding(report)
    assert found["severity"] == "critical"
    assert "need about 144 MB of shared memory (9 batches of 16.0 MB" in found["message"]
    assert found["evidence"]["fits_with"] == {"num_workers": 2, "prefetch_factor": 1,
                                              "batch_size": 3, "shm_mb": 192}  # fmt: skip
    assert "num_workers=2, prefetch_factor=1 or batch_size=3 fits" in found["fix"]
    assert "--shm-size=192m" in found["fix"]


@pytest.mark.parametrize("args", [("8", "2", "1"), ("3", "4", "2")])
def test_the_configurations_it_recommends_run_and_are_no_finding(tmp_path, args):
    """Followed: each recommended configuration runs to its end in the same 64 MB, prints what
    plain prints, and gets no finding (the near miss)."""
    needs_namespace()
    plain, _ = in_small_shm(tmp_path, *args, profiled=False)
    done, report = in_small_shm(tmp_path, *args)
    assert plain.returncode == 0 and done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0] == plain.stdout.splitlines()[0]
    assert report["meta"]["shm"]["fits"] is True
    assert shm_finding(report) is None and "pipeprof: a DataLoader" not in done.stderr


REMOTE = """
import sys
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Remote(Dataset):
    '''Each sample waits 20 ms on a read (a remote store), then is 2 MB of floats.'''

    def __len__(self):
        return 192

    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.full((524_288,), float(i))


loader = DataLoader(Remote(), batch_size=4, num_workers=int(sys.argv[1]),
                    persistent_workers=True)
total = 0.0
for epoch in range(2):
    for b in loader:
        total += float(b[:, 0].sum())
        time.sleep(0.005)
print("sum", total)
"""


def test_workers_needed_stops_at_what_shared_memory_holds(tmp_path):
    """NOTE [ The workers' budget ] in analyze/budget.py: a loop fed by one waiting worker needs
    13 to keep up; /dev/shm's 64 MB hold the 8 MB batches in flight of 3. The recommendation is
    3 (shared memory named as the limit), and the what-if rows past 3 say they do not fit. The
    same report with the machine's available RAM cut to 40 MB is held to RAM's budget instead:
    (a recorded session's figures, as no test can take the machine's memory away)."""
    needs_namespace()
    script = tmp_path / "big.py"
    script.write_text(REMOTE)
    done, report = in_small_shm(tmp_path, "1")
    assert done.returncode == 0, done.stderr[-2000:]
    found = next(f for f in report["findings"] if f["id"] == "workers-needed")
    ev = found["evidence"]
    assert ev["budget"]["shm"] == 3 and ev["budget"]["batch_mb"] == 8
    assert ev["limited_by"] == "shared memory" and ev["workers_needed"] == 3
    assert "would not fit in shared memory" in found["message"]
    assert found["fix"].startswith("DataLoader(num_workers=3) (the most that fit in shared")
    rows = {w["workers"]: w.get("exceeds") for w in report["what_if"] if w["kind"] == "workers"}
    assert rows[2] is None and rows[4] == rows[8] == "shared memory"

    from pipeprof.analyze.analysis import assess

    worker_mb = ev["budget"]["worker_mb"]
    report["host"]["mem_available_mb"] = 2.5 * worker_mb  # room for 2 more workers' USS
    _, found_again, what_if = assess(report)
    ram = next(f for f in found_again if f["id"] == "workers-needed")
    assert ram["evidence"]["budget"]["ram"] == 3  # 1 + int(0.9 * 2.5)
    report["host"]["mem_available_mb"] = 1.5 * worker_mb  # room for 1 more
    _, found_again, what_if = assess(report)
    ram = next(f for f in found_again if f["id"] == "workers-needed")
    assert ram["evidence"]["limited_by"] == "RAM" and ram["evidence"]["workers_needed"] == 2
    assert "would not fit in RAM: each worker holds" in ram["message"]
    assert {w["workers"]: w["exceeds"] for w in what_if if w["kind"] == "workers"}[4] == "RAM"
