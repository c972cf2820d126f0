"""Issue 40: an epoch's samples (NOTE [ An epoch's samples ] in collect/torch/epochs.py). A
shuffling DistributedSampler whose ``set_epoch`` is never called, ``drop_last`` leaving the same
samples out of every epoch, and an IterableDataset whose ``__len__`` disagrees with its stream,
each built for real, with the correct versions as near misses. The user's batches are compared
item by item with plain iteration in every case."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from streams import Shards, Stream
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pipeprof


def epochs(loader: DataLoader, n: int, set_epoch: bool = False) -> tuple[list, dict]:
    """``n`` plain epochs over ``loader``, then ``n`` profiled ones (each compared item by item
    with its plain twin), and the report."""
    sampler = loader.sampler

    def one(e: int, it):
        torch.manual_seed(e)  # a RandomSampler draws its order from the global generator
        if set_epoch:
            sampler.set_epoch(e)
        return list(it)

    plain = [one(e, loader) for e in range(n)]
    prof = pipeprof.Profiler(sample_hz=0)
    wrapped = prof.wrap(loader)
    got = [one(e, wrapped) for e in range(n)]
    for a, b in zip(plain, got, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert all(torch.equal(p, q) for p, q in zip(x, y, strict=True))
    return plain, prof.report().to_dict()


def ids(report: dict) -> list[str]:
    return [f["id"] for f in report["findings"]]


def data(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(float(n)).unsqueeze(1), torch.arange(n) % 10)


def seen(batches: list) -> list[int]:
    return sorted(int(v) for x, _ in batches for v in x[:, 0])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_distributed_sampler_without_set_epoch_repeats_its_order(workers):
    """And its ``drop_last`` then leaves the same samples out of every epoch."""
    sampler = DistributedSampler(data(100), num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(data(100), batch_size=8, sampler=sampler, num_workers=workers,
                        drop_last=True)  # fmt: skip
    plain, report = epochs(loader, 3)
    for other in plain[1:]:  # the construction: one order, three times
        assert all(torch.equal(a[0], b[0]) for a, b in zip(plain[0], other))
    acc = report["accounting"]
    assert acc["sampler"] == "DistributedSampler" and acc["shuffle"] is True
    assert acc["epochs"] == [96, 96, 96] and acc["repeated"] == 2
    found = next(f for f in report["findings"] if f["id"] == "same-order-every-epoch")
    assert found["severity"] == "warning" and "every epoch" in found["message"]
    assert "set_epoch(epoch)" in found["fix"]
    assert seen(plain[0]) == seen(plain[2]) and len(seen(plain[0])) == 96  # the same 4 left out
    dropped = next(f for f in report["findings"] if f["id"] == "samples-dropped")
    assert dropped["severity"] == "warning" and "repeats one order" in dropped["message"]


def test_set_epoch_called_each_epoch_is_no_finding():
    """The near miss, and the fix followed: each epoch a new order."""
    sampler = DistributedSampler(data(96), num_replicas=1, rank=0, shuffle=True, seed=3)
    loader = DataLoader(data(96), batch_size=8, sampler=sampler)
    plain, report = epochs(loader, 3, set_epoch=True)
    assert not torch.equal(plain[0][0][0], plain[1][0][0])  # the fix gives another order
    assert report["accounting"]["repeated"] == 0
    assert "same-order-every-epoch" not in ids(report)
    unshuffled = DistributedSampler(data(96), num_replicas=1, rank=0, shuffle=False)
    _, report = epochs(DataLoader(data(96), batch_size=8, sampler=unshuffled), 2)
    assert "same-order-every-epoch" not in ids(report)  # no shuffle was asked for


def test_a_loop_that_breaks_early_is_not_a_full_epoch():
    sampler = DistributedSampler(data(96), num_replicas=1, rank=0, shuffle=True)
    loader = DataLoader(data(96), batch_size=8, sampler=sampler)
    prof = pipeprof.Profiler(sample_hz=0)
    wrapped = prof.wrap(loader)
    for _ in range(3):
        for k, _batch in enumerate(wrapped):
            if k == 4:
                break
    acc = prof.report().to_dict()["accounting"]
    assert acc["epochs"] == [] and acc["repeated"] == 0


def test_drop_last_without_shuffling_leaves_the_same_samples_out():
    loader = DataLoader(data(100), batch_size=32, drop_last=True)
    plain, report = epochs(loader, 2)
    assert seen(plain[0]) == seen(plain[1]) == list(range(96))  # 96..99: never seen
    acc = report["accounting"]
    assert acc["dropped"] == 4 and acc["expected"] == 96 and acc["epochs"] == [96, 96]
    found = next(f for f in report["findings"] if f["id"] == "samples-dropped")
    assert found["severity"] == "warning"
    assert "last 4 of 100 samples (4%)" in found["message"] and "never sees" in found["message"]
    assert "divides 100" in found["fix"]
    # the fix followed: a batch size that divides 100 sees every sample
    plain, report = epochs(DataLoader(data(100), batch_size=25, drop_last=True), 1)
    assert seen(plain[0]) == list(range(100))
    assert "samples-dropped" not in ids(report) and report["accounting"]["epochs"] == [100]


def test_drop_last_with_shuffling_is_a_hint_only_when_it_drops_much():
    small = epochs(DataLoader(data(100), batch_size=32, drop_last=True, shuffle=True), 1)[1]
    assert small["accounting"]["dropped"] == 4 and "samples-dropped" not in ids(small)
    large = epochs(DataLoader(data(100), batch_size=40, drop_last=True, shuffle=True), 1)[1]
    found = next(f for f in large["findings"] if f["id"] == "samples-dropped")
    assert found["severity"] == "info" and "20 of 100" in found["message"]


class Stated(Stream):
    """A stream that states its length: ``n`` unless ``says`` is given."""

    def __init__(self, n: int, shard: bool, says: int | None = None) -> None:
        super().__init__(n, shard)
        self.says = n if says is None else says

    def __len__(self) -> int:
        return self.says


@pytest.mark.filterwarnings("ignore:Length of IterableDataset")
def test_an_iterable_dataset_whose_length_disagrees_with_its_stream():
    def report(dataset, workers):
        loader = DataLoader(dataset, batch_size=8, num_workers=workers)
        plain = list(loader)
        prof = pipeprof.Profiler(sample_hz=0)
        got = list(prof.wrap(loader))
        assert len(got) == len(plain)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, got))
        return prof.report().to_dict()

    twice = report(Stated(64, shard=False), 2)
    found = next(f for f in twice["findings"] if f["id"] == "epoch-length")
    assert "states 64 samples" in found["message"] and "yielded 128" in found["message"]
    assert "each of the 2 workers yielded the whole stream" in found["message"]
    short = report(Stated(48, shard=True, says=64), 2)
    found = next(f for f in short["findings"] if f["id"] == "epoch-length")
    assert "yielded 48" in found["message"] and "stopped early" in found["message"]
    right = report(Stated(64, shard=True), 2)  # the near miss: sharded, as stated
    assert right["accounting"]["epochs"] == [64] and "epoch-length" not in ids(right)


SCRIPT = """
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

data = TensorDataset(torch.arange(256.0).unsqueeze(1))
sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True)
loader = DataLoader(data, batch_size=4, sampler=sampler)
for epoch in range(3):
    {call}
    for (x,) in loader:
        pass
"""


@pytest.mark.parametrize("call", ["pass", "sampler.set_epoch(epoch)"])
def test_pipeprof_run_finds_the_missing_set_epoch(tmp_path: Path, call: str):
    """Under ``pipeprof run`` most batches are fetched past the pass (NOTE [ The fast path ] in
    attach/run.py): each epoch still counts as run to its end."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).format(call=call))
    out = tmp_path / "run.json"
    subprocess.run([sys.executable, "-m", "pipeprof", "run", "-o", str(out), str(script)],
                   check=True, capture_output=True, text=True)  # fmt: skip
    report = pipeprof.load(out).to_dict()
    assert report["accounting"]["epochs"] == [256, 256, 256]
    assert ("same-order-every-epoch" in ids(report)) == (call == "pass")


def test_one_worker_making_the_last_batches_alone_is_named():
    """Shards of 192 and 64 samples (1 ms each) on 2 workers: worker 1 is done after about 16
    batches, and worker 0 makes the last 16 alone (NOTE [ An epoch's samples ], case 4)."""
    loader = DataLoader(Shards([192, 64], cost=0.001), batch_size=8, num_workers=2)
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    got = list(prof.wrap(loader))
    assert [torch.equal(a[0], b[0]) for a, b in zip(plain, got, strict=True)] == [True] * 32
    report = prof.report().to_dict()
    tail = report["accounting"]["tail"]
    assert tail["last"] == 0 and tail["batches"] >= 12
    assert tail["waited_s"]["0"] == 0 and tail["waited_s"]["1"] > 0.05
    found = next(f for f in report["findings"] if f["id"] == "uneven-shards")
    assert found["message"].startswith("worker 0 delivered the epoch's last batch")
    assert "even size" in found["fix"]


@pytest.mark.parametrize("dataset", ["even shards", "map-style"])
def test_workers_that_finish_together_are_not_named(dataset):
    """The near misses: even shards, and a map-style dataset whose batches the workers take in
    turn; each pass's last worker is still said, a batch or less after the other's last."""
    data_ = Shards([128, 128], cost=0.001) if dataset == "even shards" else data(256)
    loader = DataLoader(data_, batch_size=8, num_workers=2)
    prof = pipeprof.Profiler(sample_hz=0)
    for _ in range(2):
        for _batch in prof.wrap(loader):
            pass
    report = prof.report().to_dict()
    tail = report["accounting"]["tail"]
    assert tail["last"] in (0, 1) and tail["batches"] <= 1
    assert len(report["accounting"]["epochs"]) == 2
    assert "uneven-shards" not in ids(report)


STATEFUL = """
import sys
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader


class Cached(Dataset):
    '''A dataset with a state of its own (a cache of what it read), as stateful datasets keep.'''

    def __init__(self, n):
        self.n, self.blob = n, bytes(256 * 1024)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((4,), float(i))

    def state_dict(self):
        return {"blob": self.blob}

    def load_state_dict(self, state):
        self.blob = state["blob"]


if __name__ == "__main__":
    every = int(sys.argv[1])
    loader = StatefulDataLoader(Cached(960), batch_size=8, num_workers=2,
                                snapshot_every_n_steps=every)
    sums = []
    for step, batch in enumerate(loader):
        sums.append(float(batch.sum()))
        if step % 20 == 19:
            state = loader.state_dict()
    print(sum(sums), len(sums))
"""


@pytest.mark.parametrize("every", [1, 20])
def test_a_stateful_loaders_snapshots_are_timed_and_unread_ones_named(tmp_path: Path, every):
    """torchdata's StatefulDataLoader: each state_dict() the loop calls is timed, with the step
    it came at; workers that snapshot every step for a loop that reads one every 20 get the
    hint, snapshots taken as often as they are read do not (NOTE [ An epoch's samples ], case
    5). What the script prints is plain's."""
    pytest.importorskip("torchdata.stateful_dataloader")
    script = tmp_path / "s.py"
    script.write_text(STATEFUL)
    plain = subprocess.run([sys.executable, str(script), str(every)], capture_output=True,
                           text=True, check=True)  # fmt: skip
    out = tmp_path / "run.json"
    ran = subprocess.run([sys.executable, "-m", "pipeprof", "run", "-o", str(out), str(script),
                          str(every)], capture_output=True, text=True, check=True)  # fmt: skip
    assert ran.stdout == plain.stdout
    report = pipeprof.load(out).to_dict()
    snap = report["accounting"]["snapshots"]
    assert snap["every"] == every and snap["calls"] == 6 and snap["interval_steps"] == 20
    assert snap["ms"] > 0
    found = [f for f in report["findings"] if f["id"] == "snapshots-unread"]
    if every == 1:
        assert "snapshot their state every 1 step(s)" in found[0]["message"]
        assert "snapshot_every_n_steps=20" in found[0]["fix"]
    else:
        assert not found
