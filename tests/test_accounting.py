"""Issue 40: every sample accounted for. Workers that yield the same samples (an IterableDataset
without sharding), and workers that deliver nothing or far too little, on real DataLoaders whose
cause is known by construction (tests/streams.py), with the correct versions as near misses. The
user's batches are compared item by item with plain iteration in every case."""

from __future__ import annotations

import pytest
import torch
from streams import Ranged, Shards, Stream, seed_only, shard_range
from torch.utils.data import DataLoader

import pipeprof
from pipeprof.report import Report


def profiled(dataset, workers: int, context: str = "fork", batch_size: int = 8):
    """The report of one pass of a loader over ``dataset``, after checking that the profiled pass
    yields what a plain pass yields, item by item."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                        multiprocessing_context=context if workers else None)  # fmt: skip
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    got = list(prof.wrap(loader))
    assert len(got) == len(plain)
    for a, b in zip(plain, got):
        if isinstance(a, dict):
            assert a["text"] == b["text"]
        elif len(a) == 2 and not dataset_noisy(dataset):
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        else:  # random noise differs between passes: the labels do not
            assert torch.equal(a[1], b[1])
    return prof.report().to_dict()


def dataset_noisy(dataset) -> bool:
    return bool(getattr(dataset, "noise", False))


def ids(report: dict) -> list[str]:
    return [f["id"] for f in report["findings"]]


@pytest.mark.parametrize("workers,context", [(2, "fork"), (4, "fork"), (2, "spawn")])
def test_workers_that_yield_the_same_stream_are_found(workers, context):
    report = profiled(Stream(64 * workers, shard=False), workers, context)
    acc = report["accounting"]
    assert acc["same_stream"] == [list(range(workers))]
    assert acc["compared"] >= 16
    found = next(f for f in report["findings"] if f["id"] == "same-samples-in-workers")
    assert found["severity"] == "critical"
    assert f"every sample {workers} times" in found["message"]
    assert "get_worker_info()" in found["fix"]
    assert "idle-workers" not in ids(report)


def test_a_worker_init_fn_that_does_not_shard_is_named():
    """A worker_init_fn is where torch's own IterableDataset example shards: one that only
    seeds leaves every worker the whole range, and the fix names it; one that shards gives no
    finding (the near miss)."""
    def report(init):
        loader = DataLoader(Ranged(128), batch_size=8, num_workers=2, worker_init_fn=init)
        plain = list(loader)
        prof = pipeprof.Profiler(sample_hz=0)
        got = list(prof.wrap(loader))
        assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, got, strict=True))
        return prof.report().to_dict()

    seeded = report(seed_only)
    found = next(f for f in seeded["findings"] if f["id"] == "same-samples-in-workers")
    assert "worker_init_fn (seed_only)" in found["fix"]
    sharded = report(shard_range)
    assert sharded["accounting"]["delivered"] == {"0": 64, "1": 64}
    assert "same-samples-in-workers" not in ids(sharded)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_the_sharded_stream_is_not_the_same(context):
    """The near miss: the same stream sharded by worker, as torch's documentation does it."""
    report = profiled(Stream(256, shard=True), 2, context)
    assert report["accounting"]["same_stream"] == []
    assert report["accounting"]["delivered"] == {"0": 128, "1": 128}
    assert not {"same-samples-in-workers", "idle-workers"} & set(ids(report))


def test_the_same_stream_is_found_by_its_labels_when_each_worker_crops_at_random():
    report = profiled(Stream(256, shard=False, noise=True), 2)
    assert report["accounting"]["same_stream"] == [[0, 1]]


def test_strings_are_known_alike_in_spawned_workers():
    """Spawned workers hash strings with seeds of their own: the fingerprint does not use
    ``hash()``."""
    report = profiled(Stream(128, shard=False, text=True), 2, "spawn")
    assert report["accounting"]["same_stream"] == [[0, 1]]


def test_content_that_cannot_tell_samples_apart_proves_nothing():
    """Every tensor the same, and a label of two values: two sharded workers' streams match at
    most positions by chance, so no finding (NOTE [ The same stream ])."""
    report = profiled(Stream(256, shard=True, value=True), 2)
    assert report["accounting"]["same_stream"] == []
    assert "same-samples-in-workers" not in ids(report)


def test_a_worker_with_no_shard_and_one_with_a_sliver_are_found():
    one = profiled(Shards([256]), 2)  # one shard, two workers: worker 1 gets nothing
    assert one["accounting"]["silent"] == [1]
    found = next(f for f in one["findings"] if f["id"] == "idle-workers")
    assert "worker 1 of 2 delivered no batch" in found["message"]
    assert "num_workers" in found["fix"] and "shards" in found["fix"]
    sliver = profiled(Shards([240, 16]), 2)  # worker 1: 6 % of the samples
    assert sliver["accounting"]["low"] == [1] and sliver["accounting"]["silent"] == []
    assert "idle-workers" in ids(sliver)
    uneven = profiled(Shards([160, 96]), 2)  # 38 % is uneven, not idle: the near miss
    assert uneven["accounting"]["low"] == [] and "idle-workers" not in ids(uneven)


@pytest.mark.parametrize("shards", [1, 2])
def test_a_hugging_face_stream_with_one_shard_feeds_one_worker(shards):
    """A real Hugging Face ``datasets`` stream (``to_iterable_dataset(num_shards=1)``, then
    ``shuffle()``): datasets stops the second worker, which delivers nothing; the finding says
    the stream's shard count and the fix for it. Two shards feed both (the near miss)."""
    datasets = pytest.importorskip("datasets")
    table = datasets.Dataset.from_dict({"x": list(range(256)), "y": [i % 7 for i in range(256)]})
    stream = table.to_iterable_dataset(num_shards=shards).shuffle(seed=0, buffer_size=32)
    loader = DataLoader(stream.with_format("torch"), batch_size=8, num_workers=2)
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    got = list(prof.wrap(loader))
    assert [b["x"].tolist() for b in got] == [b["x"].tolist() for b in plain]
    report = prof.report().to_dict()
    acc = report["accounting"]
    assert acc["shards"] == shards
    found = next((f for f in report["findings"] if f["id"] == "idle-workers"), None)
    if shards == 1:
        assert acc["silent"] == [1] and acc["delivered"] == {"0": 256}
        assert "the dataset has 1 shard(s) (num_shards) for 2 workers" in found["message"]
        assert "to_iterable_dataset(num_shards=2)" in found["fix"]
    else:
        assert acc["silent"] == [] and found is None


def test_map_style_loaders_and_no_workers_are_accounted_without_findings(monkeypatch):
    """And a distributed rank sketches the indices its first pass read (NOTE [ Index
    sketches ]); a process that is no rank does not."""
    data = torch.arange(64.0)
    assert profiled(data, 0)["accounting"]["sketch"] == []
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    report = profiled(data, 2)
    acc = report["accounting"]
    assert acc["delivered"] == {"0": 32, "1": 32} and acc["compared"] == 0
    assert not {"same-samples-in-workers", "idle-workers"} & set(ids(report))
    alone = profiled(data, 0)["accounting"]
    assert alone["workers"] == 0 and alone["delivered"] == {} and alone["same_stream"] == []
    assert len(alone["sketch"]) == 64  # every index, fewer than the sketch keeps


def test_a_saved_session_keeps_the_fingerprints(tmp_path):
    loader = DataLoader(Stream(128, shard=False), batch_size=8, num_workers=2)
    prof = pipeprof.Profiler(sample_hz=0)
    for _ in prof.wrap(loader):
        pass
    prof.report().save(tmp_path / "r.json")
    again = Report.load(tmp_path / "r.json").to_dict()
    assert again["accounting"]["same_stream"] == [[0, 1]]


def test_the_reports_show_each_workers_share():
    """The HTML chart of each worker's samples (a silent worker's bar empty, and in red), and the
    text's processes table with each worker's samples and share."""
    loader = DataLoader(Shards([256]), batch_size=8, num_workers=2)
    prof = pipeprof.Profiler(sample_hz=0)
    for _ in prof.wrap(loader):
        pass
    report = prof.report()
    html = report.render("html")
    chart = html[html.index('<svg class="chart shares"'):]
    chart = chart[: chart.index("</svg>")]
    assert "worker0: 256 samples, 100.0%" in chart and "worker1: 0 samples, 0.0%" in chart
    assert chart.count('fill="#e03131"') == 1  # the silent worker
    text = report.render("text")
    assert "256" in text.split("processes")[1].split("findings")[0]
    loader = DataLoader(Stream(128, shard=False), batch_size=8, num_workers=2)
    prof = pipeprof.Profiler(sample_hz=0)
    for _ in prof.wrap(loader):
        pass
    text = prof.report().render("text")
    assert "128 (50%)" in text.split("processes")[1].split("findings")[0]
    assert "the same samples as worker 1" in prof.report().render("html")
