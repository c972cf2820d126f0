"""Profiling does not change what the pipeline does, does not break or outlive the user's run,
and shows untrusted names safely (the same batches; the user's errors; profiles kept apart)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from machine import PIPEPROF
from stage_sampling import counts
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import pipeprof
from pipeprof.core.recorder import recorder

# ---- the user's code sees its own dataset --------------------------------------------------


class Shardable(IterableDataset):
    """Eight items; ``shard`` splits them across workers only if it recognises the class."""

    def __init__(self) -> None:
        self.items = list(range(8))

    def __iter__(self):
        return iter(self.items)


def shard(worker_id: int) -> None:
    info = get_worker_info()
    if isinstance(info.dataset, Shardable):
        info.dataset.items = info.dataset.items[info.id :: info.num_workers]


def test_worker_init_fn_recognises_the_users_dataset_class():
    loader = DataLoader(Shardable(), batch_size=2, num_workers=2, worker_init_fn=shard)
    plain = sorted(int(x) for batch in loader for x in batch)
    assert plain == list(range(8))  # sharded, each item once
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        profiled = sorted(int(x) for batch in prof.wrap(loader) for x in batch)
    assert profiled == plain
    assert pipeprof.profile(loader)["samples"] == 8


class AddOne:
    def __call__(self, x: int) -> int:
        return x + 1


class Configured(Dataset):
    """Eight items; what a worker's ``configure`` writes into it shows in every sample."""

    def __init__(self) -> None:
        self.start = 0
        self.tag = None
        self.transform = AddOne()

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([self.transform(i) + self.start, -1 if self.tag is None else self.tag])


def configure(worker_id: int) -> None:
    """A worker_init_fn that dispatches on exact types and writes through ``__dict__``."""
    ds = get_worker_info().dataset
    checks = [
        type(ds) is Configured,
        type(ds).__name__ == "Configured",
        ds.__class__ is Configured and isinstance(ds, Configured),
        type(ds.transform) is AddOne and type(ds.transform).__name__ == "AddOne",
        sorted(vars(ds)) == ["start", "tag", "transform"],
    ]
    if all(checks):
        ds.__dict__.update(start=7)
        vars(ds)["tag"] = 100 + worker_id


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_a_worker_sees_the_users_own_dataset_and_transform(ctx):
    """Issue 37, items 1-2: ``get_worker_info().dataset`` is the user's type with its own
    ``__dict__``, and its transform the user's own, while the stages are still timed."""
    loader = DataLoader(Configured(), batch_size=2, num_workers=2, worker_init_fn=configure,
                        multiprocessing_context=ctx)  # fmt: skip
    plain = [b.tolist() for b in loader]
    assert {row[0] - i - 1 for b in plain for i, row in enumerate(b)} >= {7}  # configured
    assert {row[1] for b in plain for row in b} == {100, 101}
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        profiled = [b.tolist() for b in prof.wrap(loader)]
    assert profiled == plain
    stages = prof.report().to_dict()["stages"]
    assert stages["load"]["count"] == 8 and stages["transform"]["count"] == 8


class AddTwo(AddOne):
    """A subclass whose call goes through its parent's: one stage, timed once."""

    def __call__(self, x: int) -> int:
        return super().__call__(x) + 1


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class Checked(Dataset):
    """Sample i is (i + 2) * 2 + 1 when ``__getitem__`` sees its transforms as the user made them
    (``type()``, identity, ``vars()``), and -1 when it does not."""

    def __init__(self, v2: bool = False) -> None:
        from torchvision import transforms

        if v2:  # an nn.Module, its steps too
            from torchvision.transforms import v2 as transforms  # type: ignore[no-redef]
        self.transform = AddTwo()
        self.target_transform = transforms.Compose([double, transforms.Lambda(lambda x: x + 1)])
        self.made = (id(self.transform), id(self.target_transform))  # this process's objects
        self.compose = type(self.target_transform)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        seen = [
            type(self.transform) is AddTwo,
            type(self.transform).__name__ == "AddTwo",
            vars(self.transform) == {},
            type(self.target_transform) is self.compose,
            type(self.target_transform.transforms) is list,
            self.target_transform.transforms[0] is double,
            get_worker_info() is not None  # a worker's copy, else the very objects
            or (id(self.transform), id(self.target_transform)) == self.made,
        ]
        if not all(seen):
            return torch.tensor(-1)
        return self.target_transform(torch.tensor(self.transform(i)))


@pytest.mark.parametrize(
    "workers,ctx,v2", [(0, None, False), (2, "fork", False), (2, "spawn", False), (2, "fork", True)]
)
def test_getitem_sees_the_users_own_transforms_while_they_are_timed(workers, ctx, v2):
    """Issue 37: inside ``__getitem__`` of a timed batch, ``type(self.transform)`` was pipeprof's
    stand-in. Transforms are timed in place (NOTE [ Transforms timed in place ]): the dataset
    sees its own objects in every batch, and each is still its own stage, a function inside a
    Compose (torchvision's v1 or v2) too, a subclass's call through its parent's counted once."""
    loader = DataLoader(Checked(v2), batch_size=2, num_workers=workers,
                        multiprocessing_context=ctx)  # fmt: skip
    if ctx == "spawn":  # a lambda does not travel to a spawned worker
        loader.dataset.target_transform.transforms[1] = double
    plain = [b.tolist() for b in loader]
    assert all(x != -1 for b in plain for x in b)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        profiled = [b.tolist() for b in prof.wrap(loader)]
    assert profiled == plain
    stages = prof.report().to_dict()["stages"]
    steps = ["transform/AddTwo", "transform/target_transform/double"]
    steps.append("transform/target_transform/double#2" if ctx == "spawn"
                 else "transform/target_transform/Lambda")  # fmt: skip
    assert all(stages[s]["count"] == 8 for s in steps), {k: v["count"] for k, v in stages.items()}


# ---- stream files -----------------------------------------------------------------------------


def test_an_unusable_stream_path_is_refused_before_the_loop():
    with pytest.raises(ValueError, match="/nonexistent/dir"):
        pipeprof.Profiler(stream="/nonexistent/dir/run.json")


def test_a_stream_write_that_fails_later_warns_and_the_loop_goes_on(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    prof = pipeprof.Profiler(sample_hz=0, stream=str(folder / "run.json"), flush_s=0)
    steps = 0
    with pytest.warns(RuntimeWarning, match="could not write"), prof:
        for i in prof.wrap(list(range(10))):
            if i == 3:
                shutil.rmtree(folder)
            steps += 1
    assert steps == 10
    report = prof.report()
    assert report["loop"]["steps"] == 10
    assert any("could not write" in note and "run.json" in note for note in report["notes"])


def test_a_snapshot_of_a_long_run_keeps_the_latest_spans_and_says_it_is_partial(tmp_path):
    """Issue 37, item 7: a stream flush wrote every span (up to 200,000, ~10 MB) on the
    training thread; a snapshot keeps the latest SNAPSHOT_SPANS, whatever the run's length,
    and the loop's end writes them all."""
    from pipeprof.core.session import SNAPSHOT_SPANS

    path = tmp_path / "run.json"
    prof = pipeprof.Profiler(sample_hz=0, stream=str(path), flush_s=3600)
    steps = SNAPSHOT_SPANS + 500  # a region span a step: more than a snapshot keeps
    with prof:
        for i in prof.wrap(range(steps)):
            with prof.region("Forward"):
                pass
            if i == steps - 1:
                prof.snapshot(str(path), note="still going")
                snap = json.loads(path.read_text())["session"]
    assert len(snap["spans"]) == SNAPSHOT_SPANS
    assert snap["spans"][-1][1] == "region/Forward" and snap["interrupted"] is True
    assert snap["notes"][-1] == "still going" and snap["loop"]["steps"] >= steps - 1
    final = json.loads(path.read_text())["session"]  # the end: every span, not partial
    assert len(final["spans"]) > SNAPSHOT_SPANS and final["interrupted"] is False
    assert "still going" not in final["notes"]
    assert pipeprof.load(path)["loop"]["steps"] == steps


def test_the_users_exception_comes_out_even_when_the_final_save_fails(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    with (
        pytest.warns(RuntimeWarning),
        pytest.raises(ValueError, match="the user's own"),
        pipeprof.Profiler(sample_hz=0, stream=str(folder / "run.json"), flush_s=3600) as prof,
    ):
        for i in prof.wrap(range(5)):
            if i == 2:
                shutil.rmtree(folder)
                raise ValueError("the user's own")


# ---- profiles kept apart ------------------------------------------------------------------------


class Numbers(Dataset):
    def __init__(self, n: int, transform=None) -> None:
        self.n, self.transform = n, transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        x = torch.tensor([float(i)])
        return self.transform(x) if self.transform is not None else x


def loader(n: int, transform=None) -> DataLoader:
    return DataLoader(Numbers(n, transform), batch_size=1, num_workers=0)


def assert_profiling_is_off() -> None:
    rec = recorder()
    assert not rec.enabled and not rec.raw
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(1_000_000):
        with pipeprof.stage("x"):
            pass
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert not rec.raw and grown < 10_000
    assert "x" not in pipeprof.profile(loader(2))["stages"]


def test_profiling_ends_when_the_profiles_end_whatever_their_order():
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        pairs = list(zip(prof.wrap(loader(3)), prof.wrap(loader(6))))
    assert len(pairs) == 3
    assert_profiling_is_off()


def test_two_profilers_end_in_any_order():
    a, b = pipeprof.Profiler(sample_hz=0), pipeprof.Profiler(sample_hz=0)
    with a, b:
        for _ in zip(a.wrap(loader(3)), b.wrap(loader(6))):
            with pipeprof.stage("between"):
                pass
    assert a.report()["stages"]["between"]["count"] == 3  # the first profile to begin has them
    assert "between" not in b.report()["stages"]
    assert_profiling_is_off()


class Slow:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return x


class TA(Slow):
    pass


class TB(Slow):
    pass


def test_concurrent_profiles_in_two_threads_keep_their_own_stages():
    reports: dict[str, object] = {}

    def run(name: str, transform: Slow, n: int) -> None:
        reports[name] = pipeprof.profile(loader(n, transform))

    threads = [
        threading.Thread(target=run, args=("a", TA(2.0), 30)),
        threading.Thread(target=run, args=("b", TB(3.0), 20)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = reports["a"].to_dict(), reports["b"].to_dict()
    assert "transform/TA" in a["stages"] and "transform/TB" not in a["stages"]
    assert "transform/TB" in b["stages"] and "transform/TA" not in b["stages"]
    # a pass times a sample of its batches only while no other profile records in the process
    # (NOTE [ Unprofiled batches ]): whichever batches ran unprofiled are counted as such
    for report, n, name in ((a, 30, "transform/TA"), (b, 20, "transform/TB")):
        off = (report["overhead"]["unprofiled_batches"] or {}).get("unprofiled_samples", 0)
        assert report["samples"] == n
        assert report["stages"]["load"]["count"] == report["stages"][name]["count"] == n - off


def test_a_nested_profile_takes_nothing_from_the_enclosing_loop():
    prof = pipeprof.Profiler(sample_hz=0)
    inner = None
    with prof:
        for step, _ in enumerate(prof.wrap(loader(6))):
            with pipeprof.stage("train_step"):
                pass
            if step == 3:  # the step's record is not yet taken by the outer profile
                inner = pipeprof.profile(loader(4, TA(0.0)))
    outer = prof.report()
    assert outer["stages"]["train_step"]["count"] == 6
    assert inner is not None and "train_step" not in inner["stages"]
    assert inner["stages"]["transform/TA"]["count"] == 4
    assert "transform/TA" not in outer["stages"]


# ---- loaders that iterate plain -----------------------------------------------------------------


class NoLength(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10.0))

    def __len__(self) -> int:
        raise NotImplementedError("streams have no length")


def test_a_len_that_raises_anything_is_taken_as_no_len():
    report = pipeprof.profile(DataLoader(NoLength(), batch_size=4))
    assert report["batches"] == 3 and report["samples"] == 10


# ---- untrusted names ---------------------------------------------------------------------------

EVIL = "Evil\x1b]52;c;aGVsbG8=\x1b\\\x1b[8mhidden\x07\x9b"


def evil_report(tmp_path: Path) -> Path:
    transform = type(EVIL, (), {"__call__": lambda self, x: x})()
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(loader(4, transform)):
            with prof.region("Log\x1b[2J"):
                pass
    return prof.report().save(tmp_path / "evil.json")


def test_control_characters_in_names_never_reach_the_terminal(tmp_path):
    path = evil_report(tmp_path)
    report = pipeprof.load(path)
    assert any("\x1b" in k for k in report["stages"])  # the data keeps the name as it was
    text = report.render("text")
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "Evil\\x1b]52;c;" in text  # shown, visibly
    colour = report.render("text", color=True)
    assert re.sub(r"\x1b\[[0-9;]*m", "", colour).count("\x1b") == 0  # only our own SGR codes
    page = report.render("html")
    assert "\x1b" not in page and "\x07" not in page
    compared = report.compare(report).render("text")
    assert "\x1b" not in compared
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for extra in ({}, {"NO_COLOR": "1"}, {"FORCE_COLOR": "1"}):
        out = subprocess.run(
            [*PIPEPROF, "report", str(path)], env={**env, **extra}, capture_output=True
        )
        assert out.returncode == 0, out.stderr
        assert re.sub(rb"\x1b\[[0-9;]*m", b"", out.stdout).count(b"\x1b") == 0
    assert json.loads(report.render("json"))["stages"]  # JSON escapes them itself


def test_line_feeds_direction_marks_and_huge_notes_are_drawn_safely(tmp_path):
    """A line feed in a name cannot forge a line of the table, a right-to-left override cannot
    reverse what follows, and a 20 MB note is drawn cut, at once."""
    transform = type("Flip\u202eesrever", (), {"__call__": lambda self, x: x})()
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(loader(4, transform)):
            with prof.region("Log\nforged row | 99 %"):
                pass
    from pipeprof.render.html import HTMLRenderer
    from pipeprof.render.text import TextRenderer

    data = prof.report().to_dict()
    data["notes"] = ["n" * 20_000_000]
    t0 = time.perf_counter()
    text, page = TextRenderer().render_dict(data), HTMLRenderer().render_dict(data)
    assert time.perf_counter() - t0 < 20  # 56 s before, for 100 MB
    for drawn in (text, page):
        assert "\u202e" not in drawn and "Flip\\u202eesrever" in drawn
        assert not any(line.lstrip().startswith("forged row") for line in drawn.splitlines())
        assert "Log\\x0aforged row" in drawn
        assert len(drawn) < 1_000_000 and "19,998,000 characters more" in drawn


class Branching(Dataset):
    """Doubles its items when its transform is a Compose: code that inspects its transform."""

    def __init__(self, transform) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        from torchvision import transforms

        x = self.transform(torch.tensor([float(i)]))
        return x * 2 if isinstance(self.transform, transforms.Compose) else x


def test_dataset_code_that_inspects_its_transform_sees_the_users_transform():
    from torchvision import transforms

    for workers in (0, 2):
        data = Branching(transforms.Compose([transforms.Lambda(lambda x: x + 1)]))
        plain = [b.tolist() for b in DataLoader(data, batch_size=4, num_workers=workers)]
        prof = pipeprof.Profiler(sample_hz=0)
        with prof:
            got = [
                b.tolist() for b in prof.wrap(DataLoader(data, batch_size=4, num_workers=workers))
            ]
        assert got == plain == [[[2.0], [4.0], [6.0], [8.0]], [[10.0], [12.0], [14.0], [16.0]]]
        assert "transform/Lambda" in prof.report()["stages"]


class Tiny(Dataset):
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((2,), float(i))


def test_records_are_folded_once_when_the_profile_stops_not_at_each_pass(monkeypatch):
    """NOTE [ Deferred aggregation ]: a pass's end leaves its records queued (a fold has a fixed
    cost, paid once); the profile's stop folds them all, its CPU counted as pipeprof's own."""
    from pipeprof.core.session import Session

    folds = []
    real_fold = Session._fold
    monkeypatch.setattr(Session, "_fold", lambda s, p: (folds.append(len(p)), real_fold(s, p)))
    prof = pipeprof.Profiler(sample_hz=0, stage_every=1)
    loader = DataLoader(Tiny(), batch_size=400)
    with prof:
        for _ in range(2):
            for _ in prof.wrap(loader):
                pass
        assert folds == [] and prof.session.pending_events == 2 * (4000 + 10)  # load, collate
    assert len(folds) == 1 and prof.session.pending_events == 0
    assert prof.session.costs["settle_ns"] > 0
    assert prof.report()["stages"]["load"]["count"] == 2 * 4000


def test_records_are_folded_in_the_background_and_stay_exact(monkeypatch):
    """NOTE [ Deferred aggregation ]: once enough records are pending, a background thread folds
    them in while the loop runs (the queue stays short), measures its own CPU time, and every
    record still lands exactly once."""
    from pipeprof.core import session as session_mod

    monkeypatch.setattr(session_mod, "SETTLE_EVENTS", 200)
    monkeypatch.setattr(session_mod, "SETTLE_CHUNK", 50)
    prof = pipeprof.Profiler(sample_hz=0)
    pending, folded_mid_run = [], 0
    with prof:
        for i, _ in enumerate(prof.wrap(DataLoader(Tiny(), batch_size=8, num_workers=2))):
            pending.append(prof.session.pending_events)
            if i == 400:
                time.sleep(0.2)  # the settling thread gets its turn
                folded_mid_run = prof.session.stages.get("worker0", {}).get("load", None)
                folded_mid_run = folded_mid_run.count if folded_mid_run else 0
    assert folded_mid_run > 0  # folded before the run ended
    assert max(pending) < 2000  # never the whole run: about SETTLE_EVENTS and a batch's records
    report = prof.report()
    # of each worker's 250 batches its share of the profile's first TIMED_FIRST is profiled,
    # then 1 in STAGE_EVERY; the others have no records (NOTE [ Unprofiled batches ])
    c = counts([500], workers=2)
    assert c["off"] > 7 * c["on"] > 0
    off = report["overhead"]["unprofiled_batches"]
    assert off["batches"] == [c["on"], c["off"]]
    assert off["unprofiled_samples"] == (c["off"] + c["cold"]) * 8
    assert report["stages"]["load"]["count"] == c["profiled"] * 8
    assert report["stages"]["collate"]["count"] == c["profiled"]
    assert prof.session.costs["settle_ns"] > 0


def test_a_batchs_bookkeeping_runs_in_bulk_and_is_complete_at_each_pass_end(monkeypatch):
    """NOTE [ Deferred aggregation ]: inside ``next()`` a batch's bookkeeping is only queued; the
    loop's thread runs the queue every DEFER_LIMIT calls (never while a fold holds the session),
    and each pass's end runs the rest: then every batch is counted once, as before."""
    from pipeprof.core import session as session_mod

    monkeypatch.setattr(session_mod, "DEFER_LIMIT", 18)
    prof = pipeprof.Profiler(sample_hz=0)
    s = prof.session
    lag, queued = [], []
    with prof:
        for i, _ in enumerate(prof.wrap(DataLoader(Tiny(), batch_size=8, num_workers=2))):
            lag.append(i + 1 - s.batches)  # batches yielded that the session has not counted
            queued.append(len(s._deferred))
        assert s.batches == 500 and s.wait.count == 499 and not s._deferred
        assert sum(w.batches for w in s.workers.values()) == 500
    assert max(queued) < 18 and set(lag) == set(range(9))  # run every 9 batches (2 calls each)
    assert s.costs["main_ns"] > 0 and s.costs["settle_ns"] > 0
    # the queue is left alone while another thread holds the session, and run once it is free
    held, free = threading.Event(), threading.Event()

    def hold() -> None:
        with s._lock:
            held.set()
            free.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    calls: list[int] = []
    for k in range(25):
        s.defer(calls.append, k)
    assert calls == [] and len(s._deferred) == 25
    free.set()
    t.join(10)
    s.defer(calls.append, 25)
    assert calls == list(range(26)) and not s._deferred


def test_short_path_batches_queued_in_rows_count_as_one_by_one():
    """``Session.defer_batch`` (NOTE [ The short path ]): a row of batches added in bulk, in
    order with what else was deferred, gives the session what ``add_batch`` one by one gives;
    a row another thread would seal stays queued until the loop's thread runs it."""
    from pipeprof.core.session import BATCH_ROWS, Session

    rng = random.Random(3)
    batches = []
    t = 1_000
    for k in range(BATCH_ROWS * 2 + 37):
        wait = rng.randrange(0, 400_000)
        batches.append((t, t + wait, rng.choice([8, 8, 5]), k % 50 == 7))  # some profiled
        t += wait + 1_000
    one, rows = Session(), Session()
    for t0, t1, n, profiled in batches:
        one.add_batch(t0, t1, n, None, "next", starved_ns=t1 - t0 - 5 if profiled else None)
        if profiled:  # a profiled batch: its wait split, queued one by one
            rows.defer(rows.add_batch, t0, t1, n, None, "next", "main", 0, t1 - t0 - 5)
        else:
            rows.defer_batch(t0, t1, n, "next")
    done = threading.Thread(target=rows.run_deferred)  # not the loop's thread: seals nothing
    done.start()
    done.join(10)
    assert rows._rows and rows.batches < len(batches)
    rows.run_deferred()
    assert not rows._rows and not rows._deferred
    for k in ("batches", "samples", "first_ready_ns", "last_ready_ns", "first_samples"):
        assert getattr(rows, k) == getattr(one, k), k
    assert list(rows.batch_ring) == list(one.batch_ring)
    assert list(rows.spans) == list(one.spans)
    for k in ("wait", "starved", "handover"):
        a, b = getattr(rows, k), getattr(one, k)
        assert (a.count, a.total_ns, a.min_ns, a.max_ns, a.hist) == (
            b.count, b.total_ns, b.min_ns, b.max_ns, b.hist
        ), k  # fmt: skip
        assert a.sum_sq == pytest.approx(b.sum_sq, rel=1e-9)
