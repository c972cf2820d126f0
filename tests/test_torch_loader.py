"""pipeprof.profile on real DataLoaders: ground truth, identical batches, every option."""

from __future__ import annotations

import random
import statistics
import time

import pytest
import torch
from pipelines import (
    AddNoise,
    CostCollate,
    CostDataset,
    CostIterable,
    EvenFirst,
    ItemsDataset,
    KeywordDataset,
    Pairs,
    SaysItsProbeBase,
    Scale,
    own_transform,
    tag_worker,
    truth,
    tune_transform,
)
from stage_sampling import PROFILED, arms, counts
from torch.utils.data import DataLoader
from torchvision import transforms

import pipeprof
from pipeprof.collect.torch.loader import (
    AB_PAIRS_EVERY,
    AB_PAIRS_FIRST,
    SHORT_RUN_MOST,
    TIMED_FIRST,
    BatchPlan,
    ProfiledLoader,
)
from pipeprof.core.session import Session

CONTEXTS = ["fork", "spawn"]


def batches_of(loader, profiled: bool, seed: int = 0, session: Session | None = None):
    torch.manual_seed(seed)
    if not profiled:
        return list(loader)
    return list(ProfiledLoader(loader, session or Session()))


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.timing
@pytest.mark.parametrize("workers,ctx", [(0, None), (2, "fork"), (2, "spawn")])
def test_stage_means_match_ground_truth(tmp_path, workers, ctx):
    """Injected costs, each logging its own true duration: per-call means within 5 %."""
    logs = str(tmp_path)
    chain = transforms.Compose([Scale(4.0, logs), AddNoise(4.0, logs, sleep=True)])
    ds = CostDataset(48, load_ms=6.0, log_dir=logs, transform=chain)
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=workers,
        multiprocessing_context=ctx,
        collate_fn=CostCollate(5.0, logs),
    )
    report = pipeprof.profile(loader)
    stages = report.to_dict()["stages"]
    true = truth(logs)
    assert set(true) == {"load", "transform/Scale", "transform/AddNoise", "collate"}
    for path, durations in true.items():
        true_ms = statistics.fmean(durations) / 1e6
        assert stages[path]["count"] == len(durations), path
        assert stages[path]["mean_ms"] == pytest.approx(true_ms, rel=0.05), path
    # the transform parent is the sum of its children; load excludes the transform
    t = stages["transform"]
    assert t["total_s"] == pytest.approx(
        stages["transform/Scale"]["total_s"] + stages["transform/AddNoise"]["total_s"]
    )
    assert report["samples"] == 48 and report["batches"] == 6
    tracks = {w["track"] for w in report["workers"]}
    assert tracks == ({"main"} if workers == 0 else {"worker0", "worker1"})
    assert sum(w["batches"] for w in report["workers"]) == 6


@pytest.mark.timing
def test_getitems_and_iterable_ground_truth(tmp_path):
    logs = str(tmp_path)
    loader = DataLoader(ItemsDataset(24, load_ms=6.0, log_dir=logs), batch_size=6, num_workers=2)
    stages = pipeprof.profile(loader)["stages"]
    true = truth(logs)["load"]
    assert stages["load"]["count"] == 24
    assert stages["load"]["mean_ms"] == pytest.approx(statistics.fmean(true) / 1e6, rel=0.05)

    logs2 = tmp_path / "it"
    logs2.mkdir()
    loader = DataLoader(
        CostIterable(24, load_ms=6.0, log_dir=str(logs2)), batch_size=4, num_workers=2
    )
    report = pipeprof.profile(loader)
    true = truth(str(logs2))["load"]
    assert report["samples"] == 24 and report["stages"]["load"]["count"] == 24
    assert report["stages"]["load"]["mean_ms"] == pytest.approx(
        statistics.fmean(true) / 1e6, rel=0.05
    )


def _random_chain():
    return transforms.Compose([AddNoise(0.0), Scale(0.0, add=2.0)])


def _shuffled(n: int, batch_size: int, w: int, c: str | None) -> DataLoader:
    """``n`` samples through a random transform chain, shuffled."""
    data = CostDataset(n, transform=_random_chain())
    return DataLoader(data, batch_size, shuffle=True, num_workers=w, multiprocessing_context=c)


LOADERS = {
    "plain": lambda w, c: _shuffled(20, 4, w, c),
    # 65 batches: in process, some are fetched with the recorder off (NOTE [ Unprofiled batches ])
    "long": lambda w, c: _shuffled(130, 2, w, c),
    "getitems": lambda w, c: DataLoader(
        ItemsDataset(20), batch_size=3, num_workers=w, multiprocessing_context=c
    ),
    "iterable": lambda w, c: DataLoader(
        CostIterable(20, transform=_random_chain()),
        batch_size=4,
        num_workers=w,
        multiprocessing_context=c,
    ),
    "batch_size_none": lambda w, c: DataLoader(
        CostDataset(10), batch_size=None, num_workers=w, multiprocessing_context=c
    ),
    "sampler": lambda w, c: DataLoader(
        CostDataset(20),
        batch_size=4,
        sampler=EvenFirst(20),
        num_workers=w,
        multiprocessing_context=c,
    ),
    "batch_sampler": lambda w, c: DataLoader(
        CostDataset(20), batch_sampler=Pairs(20), num_workers=w, multiprocessing_context=c
    ),
    "collate_fn": lambda w, c: DataLoader(
        CostDataset(20),
        batch_size=5,
        collate_fn=CostCollate(),
        num_workers=w,
        multiprocessing_context=c,
    ),
    "pin_memory": lambda w, c: DataLoader(
        CostDataset(20), batch_size=4, pin_memory=True, num_workers=w, multiprocessing_context=c
    ),
    "drop_last": lambda w, c: DataLoader(
        CostDataset(22), batch_size=4, drop_last=True, num_workers=w, multiprocessing_context=c
    ),
    "worker_init_fn": lambda w, c: DataLoader(
        CostDataset(20),
        batch_size=4,
        num_workers=w,
        worker_init_fn=tag_worker,
        multiprocessing_context=c,
    ),
}
WORKER_ONLY = {
    "persistent": lambda w, c: DataLoader(
        CostDataset(20),
        batch_size=4,
        num_workers=w,
        persistent_workers=True,
        prefetch_factor=3,
        multiprocessing_context=c,
    ),
}


# What a spawn worker gets differently from a fork one is how the loader's objects reach it
# (pickled into a fresh interpreter); these kinds change only what the training process does
# (its sampler, its pin thread, where it stops), so fork covers them: a spawn pass costs ~4 s
# here (the worker imports torch).
MAIN_ONLY = {"sampler", "batch_sampler", "drop_last", "pin_memory"}


@pytest.mark.parametrize(
    ("kind", "workers", "ctx"),
    [(k, w, c) for w, c in [(0, None), (2, "fork"), (2, "spawn")] for k in sorted(LOADERS)
     if not (c == "spawn" and k in MAIN_ONLY)],
)  # fmt: skip
def test_batches_identical_to_plain_loader(kind, workers, ctx):
    loader = LOADERS[kind](workers, ctx)
    plain = batches_of(loader, profiled=False)
    profiled = batches_of(loader, profiled=True)
    assert len(plain) == len(profiled) > 0
    assert all(same(a, b) for a, b in zip(plain, profiled))
    if kind == "worker_init_fn" and workers:
        assert all(b[0].min() >= 1000 for b in profiled)  # the user's init ran in each worker


@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_persistent_workers_over_epochs(ctx):
    loader = WORKER_ONLY["persistent"](2, ctx)
    plain = batches_of(loader, profiled=False)
    session = Session()
    profiled = ProfiledLoader(loader, session)
    torch.manual_seed(0)
    first = list(profiled)
    pids = {track: w.pid for track, w in session.workers.items()}
    second = list(profiled)  # same workers, second epoch
    assert all(same(a, b) for a, b in zip(plain, first)) and len(first) == len(plain)
    assert len(second) == len(plain)
    assert session.batches == 2 * len(plain)
    assert len(set(pids.values())) == 2
    # the second epoch's batches came from the very processes of the first: none respawned
    assert {track: w.pid for track, w in session.workers.items()} == pids


def test_profile_reports_samples_and_stages_for_each_option():
    for kind, make in LOADERS.items():
        loader = make(0, None)
        report = pipeprof.profile(loader)
        n = sum(1 for _ in loader.sampler) if kind not in ("iterable",) else 20
        if kind == "drop_last":
            n = 20
        assert report["samples"] == n, kind
        assert "load" in report["stages"] and "collate" in report["stages"], kind


def test_batches_limit_and_device_transfer():
    loader = DataLoader(CostDataset(40), batch_size=4, num_workers=2)
    report = pipeprof.profile(loader, batches=3, device="cpu")
    assert report["batches"] == 3
    h2d = report["stages"]["transfer/h2d"]
    assert h2d["count"] == 3 and h2d["total_s"] > 0
    assert report["stages"]["transfer"]["derived"] is True


def test_pin_memory_is_timed_in_the_pin_thread():
    loader = DataLoader(CostDataset(16), batch_size=4, num_workers=2, pin_memory=True)
    if not torch.cuda.is_available():
        # torch pins only with an accelerator: the profiled loader gets pin_memory=True too, so
        # torch warns and starts no pin thread; nothing is pinned, so no pin time is reported,
        # and the batches pass through unchanged
        with pytest.warns(UserWarning, match="no accelerator is found"):
            report = pipeprof.profile(loader)
        assert report["batches"] == 4 and report["samples"] == 16
        assert report["meta"]["pin_memory"] is True
        assert "transfer/pin" not in report["stages"] and "transfer" not in report["stages"]
        plain = batches_of(loader, profiled=False)
        profiled = batches_of(loader, profiled=True)
        assert len(profiled) == 4 and all(same(a, b) for a, b in zip(plain, profiled))
        return
    assert pipeprof.profile(loader)["stages"]["transfer/pin"]["count"] == 4  # pragma: no cover


@pytest.mark.timing
def test_user_stages_inside_workers(tmp_path):
    loader = DataLoader(StagedDataset(12), batch_size=4, num_workers=2)
    stages = pipeprof.profile(loader)["stages"]
    assert stages["load/read"]["count"] == 12
    assert stages["load/decode"]["count"] == 12
    # a 2 ms sleep never takes less, and overshoots on a busy host
    assert 2.0 <= stages["load/decode"]["mean_ms"] < 4.0
    assert stages["load/read"]["mean_ms"] < stages["load/decode"]["mean_ms"]
    assert (
        stages["load"]["total_s"]
        >= stages["load/read"]["total_s"] + stages["load/decode"]["total_s"]
    )


class StagedDataset(CostDataset):
    def __getitem__(self, i):
        with pipeprof.stage("read"):
            time.sleep(0.0005)
        with pipeprof.stage("decode"):
            time.sleep(0.002)
        return torch.zeros(2)


@pytest.mark.parametrize("workers", [0, 2])
def test_user_exceptions_pass_through(workers):
    loader = DataLoader(CostDataset(16, fail_at=5), batch_size=4, num_workers=workers)
    with pytest.raises(KeyError) as plain:
        list(loader)
    with pytest.raises(KeyError) as profiled:
        pipeprof.profile(loader)
    assert "sample 5 is broken" in str(profiled.value)
    if workers == 0:
        assert str(profiled.value) == str(plain.value)


def test_user_objects_not_mutated():
    chain = transforms.Compose([Scale(0.0)])
    ds = CostDataset(8, transform=chain)
    collate = CostCollate()
    loader = DataLoader(
        ds, batch_size=4, collate_fn=collate, num_workers=2, worker_init_fn=tag_worker
    )
    before = dict(vars(ds))
    pipeprof.profile(loader)
    assert vars(ds) == before and ds.transform is chain
    assert chain.transforms[0].__class__ is Scale and len(chain.transforms) == 1
    assert loader.collate_fn is collate and loader.worker_init_fn is tag_worker
    assert loader.dataset is ds


def test_bad_input_gets_clear_errors():
    with pytest.raises(TypeError, match="needs a torch.utils.data.DataLoader"):
        pipeprof.profile([1, 2, 3])
    with pytest.raises(ValueError, match="has no batches"):
        pipeprof.profile(DataLoader(CostDataset(0), batch_size=4))
    loader = DataLoader(CostDataset(8), batch_size=4)
    with pytest.raises(ValueError, match="at least 1"):
        pipeprof.profile(loader, batches=0)
    with pytest.raises(TypeError, match="positive int"):
        pipeprof.profile(loader, batches=2.5)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            pipeprof.profile(loader, device="cuda")
    with pytest.raises(ValueError, match="not a torch device"):
        pipeprof.profile(loader, device="warp-drive")
    with pytest.raises(ValueError, match="yielded no batches"):
        pipeprof.profile(DataLoader(CostIterable(0), batch_size=4))


def double(t):
    return t * 2


def test_imagefolder_split_into_read_and_decode(tmp_path):
    from torchvision import datasets

    from pipeprof.demo import make_images

    make_images(tmp_path, count=12, size=(64, 48))
    chain = transforms.Compose([transforms.RandomResizedCrop(32), transforms.ToTensor()])
    ds = datasets.ImageFolder(str(tmp_path), transform=chain, target_transform=double)
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    # one plain pass and one profiled, from the same seed (each spawned worker imports torch and
    # torchvision: ~10 s of a pass on this machine)
    torch.manual_seed(0)
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    torch.manual_seed(0)
    with prof:
        profiled = list(prof.wrap(loader))
    stages = prof.report()["stages"]
    for path in (
        "load/read",
        "load/decode",
        "transform/RandomResizedCrop",
        "transform/ToTensor",
        "transform/target_transform",
    ):
        assert stages[path]["count"] == 12, path
    assert len(plain) == len(profiled) == 3 and all(same(a, b) for a, b in zip(plain, profiled))


def test_sequential_and_list_transforms():
    seq = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Identity(), torch.nn.Hardtanh())
    loader = DataLoader(CostDataset(8, transform=seq), batch_size=4, num_workers=2)
    stages = pipeprof.profile(loader)["stages"]
    assert stages["transform/Identity"]["count"] == 8 and stages["transform/ReLU"]["count"] == 8
    # the stage tree lists a chain's steps in the order they run, not alphabetically
    assert [p for p in stages if p.startswith("transform/")] == [
        "transform/ReLU", "transform/Identity", "transform/Hardtanh"
    ]  # fmt: skip
    dup = transforms.Compose([Scale(0.0), Scale(0.0)])
    stages = pipeprof.profile(DataLoader(CostDataset(8, transform=dup), batch_size=4))["stages"]
    assert stages["transform/Scale"]["count"] == 8 and stages["transform/Scale#2"]["count"] == 8


@pytest.mark.parametrize("workers,ctx", [(0, None), (2, "fork"), (2, "spawn")])
def test_a_transform_called_by_keyword_is_timed_and_gives_what_it_gives(workers, ctx):
    # a lone transform's stand-in is a partial of the hot path, which takes one positional
    # argument: a call by keyword (albumentations' ``t(image=x)``) goes the general way
    loader = DataLoader(
        KeywordDataset(32), batch_size=4, num_workers=workers, multiprocessing_context=ctx
    )
    plain, profiled = batches_of(loader, profiled=False), batches_of(loader, profiled=True)
    assert len(plain) == 8 and all(same(a, b) for a, b in zip(plain, profiled))
    assert pipeprof.profile(loader)["stages"]["transform/Albumented"]["count"] == 32


class EpochDataset(torch.utils.data.Dataset):
    """Per-epoch state set from outside (``set_epoch``) and a transform that is a bound method."""

    def __init__(self):
        self.epoch = 0
        self.scale = 1

    def set_epoch(self, epoch):
        self.epoch = epoch

    def transform(self, x):
        return x * self.scale

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.transform(torch.tensor(i + 100 * self.epoch))


def scale_by_ten(worker_id):
    torch.utils.data.get_worker_info().dataset.scale = 10


@pytest.mark.parametrize("workers", [0, 2])
def test_state_set_between_epochs_and_by_workers_reaches_the_batches(workers):
    """``set_epoch`` before each pass, a ``worker_init_fn`` setting state that a transform method
    reads: the profiled loop gets what the plain one gets, pass after pass of one ``wrap``."""

    def run(wrap):
        ds = EpochDataset()
        loader = DataLoader(
            ds, batch_size=2, num_workers=workers, worker_init_fn=scale_by_ten if workers else None
        )
        data, out = wrap(loader), []
        for epoch in range(3):
            ds.set_epoch(epoch)
            out += [b.tolist() for b in data]
        return out, len(data)

    plain = run(lambda loader: loader)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        profiled = run(prof.wrap)
    assert profiled == plain
    assert plain[0][-1] == ([202, 203] if not workers else [2020, 2030])  # the state took effect
    loop = prof.report()["loop"]
    assert loop["epochs"] == 3 and loop["steps"] == 6
    other = pipeprof.Profiler(sample_hz=0)
    with other, pytest.raises(TypeError):
        len(other.wrap(iter([1, 2])))  # no len() where the data has none, as unprofiled


def flip_pair(img, target):
    return img.flip(-1), target + 1


class PairDataset(torch.utils.data.Dataset):
    """torchvision.transforms.v2.Compose called with two inputs, one step a plain function."""

    def __init__(self):
        from torchvision.transforms import v2

        self.transforms = v2.Compose([v2.ToDtype(torch.float32), flip_pair])

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.transforms(torch.arange(6).reshape(1, 2, 3) + i, i)


def test_v2_compose_with_several_inputs():
    loader = DataLoader(PairDataset(), batch_size=2)
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(loader))
    assert all(same(a, b) for a, b in zip(got, plain, strict=True))
    stages = prof.report()["stages"]
    assert stages["transform/ToDtype"]["count"] == 4 and stages["transform/flip_pair"]["count"] == 4


class ColumnsDataset(torch.utils.data.Dataset):
    """``__getitems__`` that returns the batch as a dict of columns."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": torch.tensor([i])}

    def __getitems__(self, indices):
        return {"x": torch.tensor(indices), "y": torch.tensor(indices) * 2}


def test_samples_counted_in_a_dict_batch_from_getitems():
    loader = DataLoader(ColumnsDataset(), batch_size=8, collate_fn=lambda batch: batch)
    report = pipeprof.profile(loader)
    assert report["samples"] == 16 and report["batches"] == 2


class PartlyMarked(torch.utils.data.Dataset):
    """``load`` is 0.5 ms marked as ``read`` and 6 ms left unmarked; the transform costs 1.5 ms."""

    def __init__(self):
        self.transform = Scale(1.5, sleep=True)

    def __len__(self):
        return 24

    def __getitem__(self, i):
        with pipeprof.stage("read"):
            time.sleep(0.0005)
        time.sleep(0.006)
        return self.transform(torch.zeros(3))


def test_a_partly_marked_stage_keeps_its_unmarked_time_in_the_verdict():
    report = pipeprof.profile(DataLoader(PartlyMarked(), batch_size=4))
    assert report["stages"]["load/read"]["count"] == 24
    assert report["verdict"]["stage"] == "load"  # not transform/Scale, nor load/read
    assert any(f["stage"] == "load" for f in report["findings"])


class DictLoader(DataLoader):
    """A subclass whose own ``__iter__`` decides what the loop receives."""

    def __iter__(self):
        for x, i in super().__iter__():
            yield {"x": x, "index": i, "n": len(x)}


class NamedLoader(DataLoader):
    """A subclass that only presets arguments: rebuilt, it yields the same."""

    def __init__(self, dataset):
        super().__init__(dataset, batch_size=4, num_workers=2)


def test_dataloader_subclasses_yield_what_they_yield_unprofiled():
    own = DictLoader(CostDataset(8), batch_size=4, num_workers=2)
    plain = list(own)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(own))
    assert all(same(a, b) for a, b in zip(got, plain, strict=True))
    report = prof.report()
    assert report["samples"] == 8 and report["loop"]["steps"] == 2
    assert any("DictLoader overrides __iter__" in n for n in report["notes"])

    preset = NamedLoader(CostDataset(8, transform=Scale(0.1)))
    assert all(same(a, b) for a, b in zip(batches_of(preset, True), list(preset), strict=True))
    assert "transform/Scale" in pipeprof.profile(preset)["stages"]


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_workers_take_the_training_process_probe_base(ctx, monkeypatch):
    # measuring it afresh cost each worker start about 1 ms (docs/validation/overhead.md): a spawned
    # worker, which inherits nothing, holds the very value the training process measured
    from pipeprof.core import recorder

    monkeypatch.setattr(recorder, "_PROBE_BASE", [987_654])
    loader = DataLoader(
        SaysItsProbeBase(), batch_size=2, num_workers=2, multiprocessing_context=ctx
    )
    got = torch.cat(list(ProfiledLoader(loader, Session())))
    assert got.flatten().tolist() == [987_654] * 4


def test_workers_fetching_batches_unprofiled_give_the_same_batches():
    # NOTE [ Unprofiled batches ], in workers: two passes of 32 batches (16 a worker); the
    # profile's first TIMED_FIRST batches profiled (each worker's first 8 of the first pass),
    # then one in STAGE_EVERY of each worker's, the others (a worker's first of the second
    # pass "cold": compared with none) through the user's own transforms; the same random draws
    chain = transforms.Compose([AddNoise(0.0), Scale(0.0)])
    loader = DataLoader(
        CostDataset(32 * 4, transform=chain), batch_size=4, num_workers=2,
        multiprocessing_context="fork",
    )  # fmt: skip
    torch.manual_seed(0)
    plain = list(loader) + list(loader)
    torch.manual_seed(0)
    session = Session()
    wrapped = ProfiledLoader(loader, session)
    profiled = list(wrapped) + list(wrapped)
    assert len(plain) == len(profiled) == 64
    assert all(same(a, b) for a, b in zip(plain, profiled, strict=True))
    expected = arms([32, 32], workers=2)
    c = counts([32, 32], workers=2)
    assert c["off"] and c["cold"] and c["on"]  # every arm
    assert session.costs["abw_off_batches"] == c["off"]
    assert session.costs["abw_cold_batches"] == c["cold"]
    assert session.costs["abw_on_batches"] == c["on"]
    worker0 = expected[0::2]  # workers take a pass's batches in turn (passes of even length)
    with session.settled():
        timed0 = sum(arm in PROFILED for arm in worker0)
        assert session.stages["worker0"]["transform/AddNoise"].count == timed0 * 4
    # the first TIMED_FIRST batches' stage time, kept apart for the scaled totals
    assert session.meta["first_batches"]["batches"] == TIMED_FIRST


def test_a_transform_a_worker_init_fn_sets_is_kept_through_unprofiled_batches():
    # the user's worker_init_fn puts a transform of its own on the worker's dataset copy: an
    # unprofiled batch must not set pipeprof's stand-in for the first one back after it
    loader = DataLoader(
        CostDataset(64 * 4, transform=Scale(0.0)), batch_size=4, num_workers=2,
        worker_init_fn=own_transform, multiprocessing_context="fork",
    )  # fmt: skip
    session = Session()
    plain, profiled = batches_of(loader, False), batches_of(loader, True, session=session)
    assert all(same(a, b) for a, b in zip(plain, profiled, strict=True))
    assert session.costs["abw_off_batches"] == counts([64], workers=2)["off"] > 0


def test_a_worker_init_fn_tuning_the_transform_in_place_tunes_the_users_own():
    # ``get_worker_info().dataset.transform`` is pipeprof's stand-in: what is set on it goes to
    # the user's object, as it would unprofiled
    scale = Scale(0.0)
    loader = DataLoader(
        CostDataset(8, transform=scale), batch_size=2, num_workers=2,
        worker_init_fn=tune_transform, multiprocessing_context="fork",
    )  # fmt: skip
    plain, profiled = batches_of(loader, False), batches_of(loader, True)
    assert all(same(a, b) for a, b in zip(plain, profiled, strict=True))
    assert scale.add == 1.0  # the workers' copies were tuned, not the main process's


def test_an_image_folder_fetched_partly_unprofiled_gives_the_same_batches(tmp_path):
    # NOTE [ Unprofiled batches ]: 66 batches in process, the first TIMED_FIRST and one in
    # STAGE_EVERY of the rest through the stand-ins, the others through the user's own loader
    # (PIL's, not pipeprof's read/decode split) and transforms; the same images and random
    # draws either way
    from torchvision import datasets

    from pipeprof.demo import make_images

    make_images(tmp_path, count=66, size=(40, 30))
    chain = transforms.Compose(
        [transforms.RandomResizedCrop(16), transforms.RandomHorizontalFlip(), transforms.ToTensor()]
    )
    data = datasets.ImageFolder(str(tmp_path), transform=chain)
    loader = DataLoader(data, batch_size=1, shuffle=True)
    plain = batches_of(loader, profiled=False)
    session = Session()
    profiled = batches_of(loader, profiled=True, session=session)
    assert len(plain) == len(profiled) == 66
    assert all(same(a, b) for a, b in zip(plain, profiled))
    c = counts([66])
    assert session.costs["ab_off_batches"] == c["off"] > 0
    assert session.costs.get("ab_cold_batches", 0) == c["cold"]
    with session.settled():
        assert session.stages["main"]["load/decode"].count == c["profiled"] < 66


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_pipeprofs_own_source_is_cached_before_workers_fork(ctx):
    """NOTE [ The stack a forked worker formats ]: torch formats the stack a forked worker was
    born in (seeding it); pipeprof's files on that stack are read in the training process once,
    not in every worker. A spawned worker starts afresh: nothing to cache."""
    import linecache

    import pipeprof.collect.torch.loader as loader_module
    import pipeprof.profiler as profiler_module

    ours = [loader_module.__file__, profiler_module.__file__]
    for name in ours:
        linecache.cache.pop(name, None)
    prof = pipeprof.Profiler(sample_hz=0)
    loader = DataLoader(list(range(16)), batch_size=4, num_workers=1, multiprocessing_context=ctx)
    with prof:
        assert sum(1 for _ in prof.wrap(loader)) == 4
    cached = [name in linecache.cache for name in ours]
    assert cached == ([True, True] if ctx == "fork" else [False, False])


@pytest.mark.timing  # a 1 ms spin, timed on a shared machine
@pytest.mark.parametrize("ctx", [None, "fork", "spawn"])
def test_decorated_stages_time_every_call_in_workers_and_keep_the_results(ctx):
    """``@pipeprof.stage(name)`` on a module-level function and on a method (called with a
    keyword): each call is the stage ``load/<name>``, in the training process and in forked and
    spawned workers (which find the decorated function by name), and returns what it would."""
    import pickle

    from pipelines import DecoratedStages, decode

    assert pickle.loads(pickle.dumps(decode)) is decode  # by name, as the function would be
    assert decode.__name__ == "decode" and decode(3).tolist() == [3.0, 3.0]  # no profile: as is
    workers = 0 if ctx is None else 2
    loader = DataLoader(
        DecoratedStages(), batch_size=4, num_workers=workers, multiprocessing_context=ctx
    )
    assert [b.tolist() for b in batches_of(loader, profiled=True)] == [
        b.tolist() for b in batches_of(loader, profiled=False)
    ]
    stages = pipeprof.profile(loader)["stages"]
    assert stages["load/decode"]["count"] == 12 and stages["load/augment"]["count"] == 12
    assert 0.9 <= stages["load/decode"]["mean_ms"] < 5  # a 1 ms spin
    with pytest.raises(TypeError, match="decorates a callable"):
        pipeprof.stage("x")(42)


class TokenLists(torch.utils.data.Dataset):
    """Samples as a tokenizer gives them: Python lists of ids and an int label."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"input_ids": list(range(i, i + 6)), "labels": i % 2}


def pad_ids(samples):
    return {"input_ids": torch.tensor([s["input_ids"] for s in samples]),
            "labels": torch.tensor([s["labels"] for s in samples])}  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
def test_the_report_says_what_samples_hold_and_whose_collate_ran(workers):
    """The collate finding's fix rests on these: a list-of-ids sample is not a tensor sample,
    and the user's collate_fn is named."""
    lists = pipeprof.profile(DataLoader(TokenLists(), batch_size=4, num_workers=workers))
    assert lists["meta"]["sample_kinds"] == ["list", "number"]
    assert lists["meta"]["collate_fn"] == "default_collate"
    mine = pipeprof.profile(
        DataLoader(TokenLists(), batch_size=4, num_workers=workers, collate_fn=pad_ids))
    assert mine["meta"]["collate_fn"] == "pad_ids"
    arrays = pipeprof.profile(DataLoader(CostDataset(16), batch_size=4, num_workers=workers))
    assert arrays["meta"]["sample_kinds"] == ["number", "tensor"]


@pytest.mark.parametrize("every", [2, 8, 32])
def test_the_batch_plan_times_compares_and_shortens_as_its_note_says(every):
    """NOTE [ Unprofiled batches ] and [ The short path ], in the training process: the profile's
    first TIMED_FIRST batches and each pass's first are timed; after them, in the first
    AB_PAIRS_FIRST cycles of ``every`` batches and one cycle in AB_PAIRS_EVERY, one batch is
    timed and the one before it compared with it, all else on the short path; and the run of
    short batches the fast path is told of ends exactly where the next one not short is."""
    plan = BatchPlan(every, sampled=True, lean=True)
    n = TIMED_FIRST + every * 40
    chosen = [plan.choose(seen, k=seen + 1, alone=True) for seen in range(n)]
    assert all(c == (False, False, False) for c in chosen[:TIMED_FIRST])
    assert plan.choose(TIMED_FIRST + 5, k=0, alone=True)[0] is False  # a pass's first: cold
    ons = [seen for seen in range(TIMED_FIRST, n + 1) if seen % every == every // 2]
    kept = set()  # the batches timed or compared after the first
    for j, on in enumerate(ons):  # the j-th cycle's batch to time
        if j < AB_PAIRS_FIRST or j % AB_PAIRS_EVERY == 0:
            if on < n:
                assert chosen[on] == (False, False, True)
                kept.add(on)
            if on - 1 >= TIMED_FIRST:
                assert chosen[on - 1] == (False, True, True)
                kept.add(on - 1)
    assert len(kept) >= 2 * (AB_PAIRS_FIRST + 1)
    assert all(chosen[seen] == (True, True, False) for seen in set(range(TIMED_FIRST, n)) - kept)
    for seen in range(TIMED_FIRST, n - SHORT_RUN_MOST):
        run = plan.short_run(seen, alone=True)
        assert all(chosen[seen + i][0] for i in range(run))
        assert run == SHORT_RUN_MOST or not chosen[seen + run][0]
    # the run is looked up once and kept: asked in any order, the same answers as a fresh plan's
    order = list(range(TIMED_FIRST, n - SHORT_RUN_MOST))
    random.Random(0).shuffle(order)
    fresh = {s: BatchPlan(every, sampled=True, lean=True).short_run(s, alone=True) for s in order}
    assert [plan.short_run(s, alone=True) for s in order] == [fresh[s] for s in order]
    # a second profile recording in this process, or a pass too short to sample: all timed
    assert not any(plan.choose(s, 5, alone=False)[0] for s in range(n))
    assert plan.short_run(TIMED_FIRST + 1, alone=False) == 0
    unsampled = BatchPlan(every, sampled=False, lean=True)
    assert all(unsampled.choose(s, 5, alone=True) == (False, False, False) for s in range(n))
    # NVTX ranges or a copy to time: no short path, the same batches unprofiled
    heavy = BatchPlan(every, sampled=True, lean=False)
    for seen in range(n):
        _short, off, measure = chosen[seen]
        assert heavy.choose(seen, seen + 1, alone=True) == (False, off, measure)


def test_a_batch_on_the_short_path_calls_its_compose_unwrapped():
    """NOTE [ The short path ]: in the training process, a batch on the short path calls a
    torchvision Compose through torchvision's own ``__call__`` (the class's wrapper set back for
    that batch, ``class_swaps``), a timed batch through pipeprof's wrapper: the unprofiled
    samples run no frame of pipeprof's. The batches are plain's and the chain's step is still a
    stage of the timed ones."""
    seen: list[bool] = []  # per sample: the Compose's class held pipeprof's wrapper

    class Logged(torch.utils.data.Dataset):
        def __init__(self, n: int) -> None:
            self.n, self.transform = n, transforms.Compose([Scale(0.0)])

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int):
            seen.append(hasattr(vars(transforms.Compose)["__call__"], "__wrapped__"))
            return self.transform(torch.full((2,), float(i))), i

    loader = DataLoader(Logged(400), batch_size=2)
    plain = list(loader)
    seen.clear()
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(loader))
    assert all(same(a, b) for a, b in zip(got, plain, strict=True))
    report = prof.report().to_dict()
    timed = report["stages"]["transform/Scale"]["count"]
    assert timed == 2 * report["meta"]["timed_batches"]
    lean = prof.session.costs["ab_lean_samples"]  # the samples on the short path
    assert seen.count(False) == lean >= 300  # the rest: timed, or compared with the timed
    assert hasattr(vars(transforms.Compose)["__call__"], "__wrapped__")  # wrapped again after
