"""WebDataset pipelines (NOTE [ WebDataset pipelines ] in collect/torch/dataset.py): real tar
shards served by a local HTTP server (tests/netdata.py), each step of the pipeline a stage."""

from __future__ import annotations

import time

import pytest
import torch
from netdata import SHARD_SAMPLES, server
from pipelines import plain_and_profiled, same_batches
from torch.utils.data import DataLoader, get_worker_info

import pipeprof
from pipeprof.render.figures import num

wds = pytest.importorskip("webdataset")

MAP_MS = 3.0


def slow_label(label):  # type: ignore[no-untyped-def]
    """The user's map: 3 ms a sample."""
    time.sleep(MAP_MS / 1e3)
    return label


def pipeline(url: str, shards: int = 4):  # type: ignore[no-untyped-def]
    urls = [f"{url}shard-{i}.tar" for i in range(shards)]
    return (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .decode()
        .to_tuple("npy", "cls")
        .map_tuple(torch.from_numpy, slow_label)
    )


def user_view(worker_id: int) -> None:
    """A worker_init_fn that looks at the pipeline's steps as user code can."""
    steps = get_worker_info().dataset.pipeline
    assert type(steps[-1]).__name__ == "FilterFunction", steps
    assert isinstance(steps[-1], wds.filters.FilterFunction)


def steps_profiled(make_loader):  # type: ignore[no-untyped-def]
    """The loader ``make_loader(url)`` makes over ``pipeline``, plain and profiled: the same
    batches, each step a stage, the fetch inside the tar's reading, the map at its 3 ms a
    sample; the report."""
    with server() as url:
        plain, got, prof = plain_and_profiled(make_loader(url))
    assert len(got) == 4 * SHARD_SAMPLES // 8 and same_batches(plain, got)
    report = prof.report().to_dict()
    stages = report["stages"]
    for step in ("open", "tar_file_expander", "group_by_keys", "decode", "to_tuple", "map_tuple"):
        assert f"load/{step}" in stages, sorted(stages)
    assert stages["load/tar_file_expander/fetch"]["total_s"] >= 4 * 0.020
    assert MAP_MS <= stages["load/map_tuple"]["per_sample_ms"] <= 3 * MAP_MS
    return report


@pytest.mark.timing
@pytest.mark.parametrize("context", [None, "spawn"])
def test_each_step_of_a_webdataset_is_a_stage(context):
    """4 shards of 16 samples over HTTP (20 ms before each answer), decoded, a 3 ms map a
    sample: ``load`` is the sum of its steps, ``fetch`` sits in the step that reads the tar,
    the map is ``load/map_tuple`` and limits the loader; the samples are the plain loader's."""
    kw = {"num_workers": 2, "multiprocessing_context": context, "worker_init_fn": user_view}
    report = steps_profiled(lambda url: DataLoader(pipeline(url), batch_size=8,
                                                   **(kw if context else {})))  # fmt: skip
    stages = report["stages"]
    assert stages["load"]["derived"]  # the steps' sum: no time of its own
    kids = [p for p in stages if p.count("/") == 1 and p.startswith("load/")]
    assert stages["load"]["total_s"] == pytest.approx(sum(stages[k]["total_s"] for k in kids))
    # each step its own time: the map's stage holds none of the steps it pulls from
    assert stages["load/decode"]["per_sample_ms"] < MAP_MS
    assert report["verdict"]["stage"] == "load/map_tuple", report["verdict"]


def test_a_local_webdataset_is_split_the_same_way_with_no_fetch(tmp_path):
    """The near miss: the shards from local files: the same steps, no fetch."""
    from netdata import shard

    for i in range(2):
        (tmp_path / f"shard-{i}.tar").write_bytes(shard(i))
    files = [str(tmp_path / f"shard-{i}.tar") for i in range(2)]
    data = wds.WebDataset(files, shardshuffle=False, empty_check=False)
    data = data.decode().to_tuple("npy", "cls")
    report = pipeprof.profile(DataLoader(data, batch_size=8)).to_dict()
    assert "load/decode" in report["stages"] and "load/tar_file_expander" in report["stages"]
    assert not any(p.endswith("/fetch") for p in report["stages"])


READ_MS = 2.0


def slow_read(sample):  # type: ignore[no-untyped-def]
    """A step before the shuffle: 2 ms a sample (a fetch, a read)."""
    time.sleep(READ_MS / 1e3)
    return sample


def shuffled(files: list[str], initial: int, read_first: bool = True):  # type: ignore[no-untyped-def]
    data = wds.WebDataset(files, shardshuffle=False, empty_check=False)
    if read_first:
        data = data.map(slow_read)
    data = data.shuffle(1000, initial=initial, seed=0)
    if not read_first:
        data = data.map(slow_read)
    return data.decode().to_tuple("npy", "cls")


@pytest.fixture
def shard_files(tmp_path):  # type: ignore[no-untyped-def]
    from netdata import shard

    for i in range(16):
        (tmp_path / f"shard-{i}.tar").write_bytes(shard(i))
    return [str(tmp_path / f"shard-{i}.tar") for i in range(16)]


@pytest.mark.timing
@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffle_buffer_that_holds_the_start_is_found_and_its_fix_holds(shard_files, workers):
    """NOTE [ A shuffle buffer's start ] (analyze/streams.py): 256 samples from 16 local shards,
    2 ms a sample before ``shuffle(1000, initial=N)``, batches of 8 (2 fork workers: 8 shards
    each, so N is under their 128 samples). The first batch waits for N samples' read: the
    finding, with the buffer's stage and the fill. Followed: ``initial=8`` gives a first batch
    within the time it promised. Near misses: ``initial=8`` itself, and the same buffer with the
    slow step after it (its fill is cheap).

    A timing test: the fill is priced from the run's steps, a sample, on average, against the
    first batch's own wait; with another test's load on the cores during the first batch and
    not after, the fill fell short of half the wait (a CI run two at a time), as it would on a
    shared machine (docs/streaming.md, Limits)."""
    first = 200 if workers == 0 else 100
    kw = {"num_workers": workers, "multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(shuffled(shard_files, first), batch_size=8, **kw)
    report = pipeprof.profile(loader).to_dict()
    f = {x["id"]: x for x in report["findings"]}["shuffle-start"]
    ev = f["evidence"]
    # the shard list's own shuffle (of names, shardshuffle) is load/shuffle: this is the second
    assert f["stage"] == "load/shuffle#2" and (ev["initial"], ev["bufsize"]) == (first, 1000)
    assert ev["upstream_ms_per_sample"] >= READ_MS and ev["fill_s"] >= first * READ_MS / 1e3
    assert ev["fill_s"] >= 0.5 * ev["startup_s"] >= 0.5 * first * READ_MS / 1e3
    assert "shuffle(1000, initial=8)" in f["fix"]
    promised = ev["startup_s"] - ev["gain_s"]
    # followed: the first batch now waits for about 8 samples' read, not N
    fixed = pipeprof.profile(DataLoader(shuffled(shard_files, 8), batch_size=8, **kw)).to_dict()
    assert fixed["startup_s"] <= 1.5 * promised + 0.05, (fixed["startup_s"], promised)
    assert fixed["startup_s"] < 0.5 * ev["startup_s"]
    assert "shuffle-start" not in {x["id"] for x in fixed["findings"]}
    after = DataLoader(shuffled(shard_files, first, read_first=False), batch_size=8, **kw)
    near = pipeprof.profile(after).to_dict()
    assert "shuffle-start" not in {x["id"] for x in near["findings"]}, near["startup_s"]


@pytest.mark.parametrize(("shards", "workers"), [(4, 2), (3, 4)])
def test_each_worker_s_shards_are_counted_and_a_worker_with_none_is_named(
    tmp_path, shards, workers
):
    """Local shards split by worker (NOTE [ Shards a worker opened ]): 4 shards for 2 workers,
    2 each and no finding; 3 for 4, one each and the fourth opened none and delivered nothing:
    ``idle-workers`` names it, the shard list's length, and the fix's counts."""
    from netdata import shard

    files = []
    for i in range(shards):
        (tmp_path / f"shard-{i}.tar").write_bytes(shard(i))
        files.append(str(tmp_path / f"shard-{i}.tar"))
    data = wds.WebDataset(files, shardshuffle=False, empty_check=False).decode()
    data = data.to_tuple("npy", "cls")
    if shards >= workers:  # first in this process, whose count forked workers start from 0
        alone = pipeprof.profile(DataLoader(data, batch_size=4)).to_dict()
        assert [w["shards"] for w in alone["workers"]] == [shards]
    loader = DataLoader(data, batch_size=4, num_workers=workers)
    report = pipeprof.profile(loader).to_dict()
    assert report["batches"] == shards * SHARD_SAMPLES // 4
    opened = {w["id"]: w["shards"] for w in report["workers"]}
    assert report["accounting"]["shards"] == shards
    idle = [f for f in report["findings"] if f["id"] == "idle-workers"]
    if shards >= workers:
        assert opened == {0: 2, 1: 2} and not idle
        return
    assert opened == {0: 1, 1: 1, 2: 1}
    (found,) = idle
    assert found["evidence"]["workers"] == [3]
    assert "opened no shard" in found["message"]
    assert "3 shard(s) in its shard list for 4 workers" in found["message"]
    assert "at least 4 shards, or num_workers=3" in found["fix"]
    rows = {r["workers"]: r for r in report["what_if"] if r["kind"] == "workers"}
    assert rows[8]["limit"] == rows[4]["limit"] == "shards"  # the what-if: 3 workers' rate
    assert rows[8]["samples_per_s"] == rows[4]["samples_per_s"]
    top = next(r for r in report["what_if"] if r["kind"] == "ceiling")
    assert top["workers"] <= 3


LATE_S = 0.4


def late_start(worker_id: int) -> None:
    """A worker_init_fn: worker 1 starts LATE_S after worker 0 (a slow set-up of its own)."""
    if worker_id == 1:
        time.sleep(LATE_S)


@pytest.mark.parametrize("late", [True, False])
def test_each_worker_s_first_shard_and_first_batch_are_timed_from_iter(shard_files, late):
    """NOTE [ Shards a worker opened ]: 4 local shards, 2 fork workers, 2 ms a sample read
    before batches of 8. Worker 1's set-up sleeps 0.4 s: its first shard opens at least 0.35 s
    after worker 0's, and each worker's first batch is ready at least its 8 samples' read after
    its first shard; the summary and the page say so. Near miss: no sleep, the two first shards
    within 0.3 s of each other. In the training process (no workers) the same two figures."""
    data = (
        wds.WebDataset(shard_files[:4], shardshuffle=False, empty_check=False)
        .map(slow_read)
        .decode()
        .to_tuple("npy", "cls")
    )
    init = late_start if late else None
    loader = DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context="fork",
                        worker_init_fn=init)  # fmt: skip
    report = pipeprof.profile(loader)
    rows = {w["id"]: w for w in report.to_dict()["workers"]}
    shard = {i: rows[i]["first_shard_s"] for i in (0, 1)}
    batch = {i: rows[i]["first_batch_s"] for i in (0, 1)}
    for i in (0, 1):
        assert shard[i] > 0 and batch[i] >= shard[i] + 8 * READ_MS / 1e3, (shard, batch)
        assert batch[i] < report.to_dict()["wall_s"]
    if late:
        assert shard[1] - shard[0] >= LATE_S - 0.05, shard
    else:
        assert abs(shard[1] - shard[0]) < 0.3, shard
    said = " ".join(report.render("text", width=200).split())
    assert "first shard opened / first batch ready, s after iter():" in said
    assert f"worker1 {num(shard[1])} / {num(batch[1])}" in said
    assert f"first shard at {num(shard[1])} s" in report.render("html")
    alone = pipeprof.profile(DataLoader(data, batch_size=8)).to_dict()
    (main,) = alone["workers"]
    assert 0 < main["first_shard_s"] < main["first_batch_s"] <= alone["startup_s"] + 1e-3


def test_a_webdataset_in_torchdatas_stateful_loader_gets_the_same_stages():
    """The pipeline of the first test in a ``StatefulDataLoader`` (2 forked workers): the same
    batches as plain, each step a stage with the fetch inside the tar's reading, each worker's
    shards counted and its first shard timed (NOTE [ A stateful loader, dressed ], case 5)."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    report = steps_profiled(lambda url: stateful.StatefulDataLoader(
        pipeline(url), batch_size=8, num_workers=2, multiprocessing_context="fork"))
    assert "collate" in report["stages"]
    rows = {w["id"]: w for w in report["workers"]}
    assert {i: rows[i]["shards"] for i in (0, 1)} == {0: 2, 1: 2}
    assert all(0 < rows[i]["first_shard_s"] < rows[i]["first_batch_s"] for i in (0, 1))
