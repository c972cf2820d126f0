"""A loop that waits for one batch far longer than for any before it (NOTE [ Hangs ] in
collect/torch/hangs.py): real workers stuck in a read (a sleep), under fork and spawn, with the
job left to go on; and the near misses, a loader slow at every batch and a loop busy elsewhere."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof

STUCK = """
import sys
import time
import torch
from torch.utils.data import DataLoader, Dataset


class Stuck(Dataset):
    '''Sample 37 waits ``stuck_s`` on a read that does not answer; the others are quick.'''

    def __init__(self, stuck_s):
        self.stuck_s = stuck_s

    def __len__(self):
        return 96

    def __getitem__(self, i):
        if i == 37:
            time.sleep(self.stuck_s)
        return torch.full((8,), float(i))


if __name__ == "__main__":
    workers, context, stuck_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    loader = DataLoader(Stuck(stuck_s), batch_size=4, num_workers=workers,
                        multiprocessing_context=context if workers else None)
    total = 0.0
    for batch in loader:
        total += float(batch.sum())
        time.sleep(0.01)
    print("sum", total)
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_worker_stuck_in_a_read_is_named_while_the_job_goes_on(tmp_path: Path, context):
    """The line on stderr and the snapshot come while the script still runs; they name worker 1
    (batch 9 of 4 samples holds sample 37; 2 workers take batches in turn), its stage and the
    user's line, from the stack the worker dumped. The script ends as plain does. The threshold
    is above the workers' start-up (the wait for the first batch is held to it too): 6 s forked,
    12 s spawned (each imports torch: about 4 s for two on this 2-core machine alone, over 6 s
    once beside two other tests), and the stuck read 8 s longer than it."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    hang_s, stuck_s = (6, 14) if context == "fork" else (12, 20)
    # what plain prints: each of the 96 samples of 8 values of ``i`` summed once (run plain, the
    # script printed it after its own wait)
    plain = f"sum {8.0 * sum(range(96))}"
    out = tmp_path / "run.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeprof", "run", "--hang-s", str(hang_s), "-o", str(out),
         str(script), "2", context, str(stuck_s)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = "-"
    while line and not line.startswith("pipeprof: the loop has waited"):
        line = proc.stderr.readline()  # as it comes (iterating a pipe reads ahead)
    assert proc.poll() is None, line  # the job goes on
    assert "for batch 9" in line and "worker 1" in line
    assert "in load at __getitem__ (stuck.py:" in line
    partial = pipeprof.load(out).to_dict()  # the snapshot written as the hang was recorded
    assert partial["interrupted"] and partial["meta"]["hang"]["worker"] == 1
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and stdout.splitlines()[0] == plain
    report = pipeprof.load(out).to_dict()
    hang = report["meta"]["hang"]
    stuck = hang["workers"][1]
    assert stuck["waited_for"] and stuck["stage"] == "load"
    assert stuck["at"].startswith("__getitem__ (stuck.py:") and stuck["wchan"]
    assert stuck["stack"][0].startswith("stuck.py:") and "_worker_loop" in stuck["stack"][-1]
    assert hang["workers"][0]["stage"] == "idle"  # worker 0 had no batch left to make then
    assert stuck_s - 4 < hang["resumed_s"] < stuck_s + 1
    found = next(f for f in report["findings"] if f["id"] == "loop-hang")
    assert found["severity"] == "warning"  # the batch came in the end
    assert found["message"].startswith("the loop waited about")
    assert "give it a timeout" in found["fix"] and "DataLoader(timeout=" in found["fix"]


class Slow(Dataset):
    def __init__(self, stuck: int | None = None, each: float = 0.0) -> None:
        self.stuck, self.each = stuck, each

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(4 if i == self.stuck else self.each)
        return torch.full((4,), float(i))


def profiled(dataset: Dataset, workers: int, pause: float = 0.0) -> dict:
    loader = DataLoader(dataset, batch_size=4, num_workers=workers)
    prof = pipeprof.Profiler(sample_hz=0, hang_s=1.5)
    for k, _batch in enumerate(prof.wrap(loader)):
        if pause and k == 3:
            time.sleep(pause)  # the loop's own work, not a wait for data
    return prof.report().to_dict()


class SlowToStart(Slow):
    """Unpickled in a spawned worker, it takes 3 s: the worker has not started when the loop
    has waited the threshold for its first batch."""

    def __setstate__(self, state: dict) -> None:
        time.sleep(3)
        self.__dict__.update(state)


def test_a_worker_still_starting_is_named_as_starting(capfd):
    """A threshold (1.5 s) shorter than a spawned worker's start-up (its imports and the
    dataset's 3 s unpickling, before pipeprof's worker init registers its stack file): the hang
    at batch 0 names the worker as starting, not an unknown stage, and the fix says what makes
    a start slow."""
    loader = DataLoader(SlowToStart(), batch_size=4, num_workers=1,
                        multiprocessing_context="spawn")  # fmt: skip
    prof = pipeprof.Profiler(sample_hz=0, hang_s=1.5)
    for _batch in prof.wrap(loader):
        pass
    report = prof.report().to_dict()
    hang = report["meta"]["hang"]
    assert hang["batch"] == 0 and hang["workers"][0]["waited_for"]
    assert hang["workers"][0]["stage"] == "starting" and hang["workers"][0]["stack"] == []
    assert "has it, still starting (importing, or unpickling the dataset)" in capfd.readouterr().err
    found = next(f for f in report["findings"] if f["id"] == "loop-hang")
    assert "had it, still starting" in found["message"]
    assert "persistent_workers=True" in found["fix"]


def test_a_loop_without_workers_gets_its_own_stack():
    report = profiled(Slow(stuck=13), 0)
    main = report["meta"]["hang"]["main"]
    assert main["stage"] == "load" and main["at"].startswith("__getitem__ (test_hangs.py:")
    assert report["meta"]["hang"]["batch"] == 3


@pytest.mark.parametrize("case", ["slow every batch", "busy elsewhere"])
def test_a_slow_loader_and_a_loop_busy_elsewhere_are_no_hang(case):
    """0.6 s a batch, steadily: no wait is far past the others. A loop that spends 4 s of its
    own between two batches: a long gap, but not spent waiting for data."""
    if case == "slow every batch":
        report = profiled(Slow(each=0.15), 2)
    else:
        report = profiled(Slow(), 2, pause=4.0)
    assert "hang" not in report["meta"]
    assert "loop-hang" not in [f["id"] for f in report["findings"]]


@pytest.mark.slow
def test_the_rank_that_never_reaches_the_all_reduce_is_named_first(tmp_path: Path):
    """torchrun, 2 ranks (gloo, DDP): at its 6th step rank 1 sleeps instead of joining the
    all-reduce; rank 0 waits there until gloo's 12 s timeout ends it and torchrun stops rank 1.
    Each rank's file records its stall (where its training thread was), and the job report
    from the files names rank 1, in its own code, with rank 0 waiting in a collective."""
    from test_distributed import DDP_TRAIN, torchrun

    ran = torchrun(tmp_path, "-m", "pipeprof", "run", "-q", "--hang-s", "2", "-o",
                   "run.json", DDP_TRAIN, "--stuck-rank", "1", "--timeout-s", "12",
                   "--collective", "--step-ms", "5")  # fmt: skip
    assert ran.returncode != 0
    files = [tmp_path / f"run.rank{r}.json" for r in (0, 1)]
    assert all(f.exists() for f in files), ran.stderr[-3000:]
    r0, r1 = (pipeprof.load(f).to_dict() for f in files)
    assert r1["meta"]["stall"]["in"] == "code" and "ddp_train.py:" in r1["meta"]["stall"]["at"]
    assert r0["meta"]["stall"]["in"] == "collective"
    job = pipeprof.merge(files)
    stop = job["stopped_first"]
    assert stop["rank"] == 1 and stop["in"] == "code" and stop["waiting"] == {"0": "collective"}
    assert "rank 1 stopped progressing first, in its own code at main (ddp_train.py:" in (
        job["headline"])
    assert job["headline"].endswith("rank 0 then waited in a collective")
