"""Tests for ``pipeprof.collect.timer``: exact durations with a fake clock, a fake CUDA event at the
hardware boundary (this CI has no GPU), and the no-torch-on-import promise."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tracemalloc
import types

import pytest
from fake_cuda import FakeGPU
from rich.console import Console
from rich.table import Table

from pipeprof.collect.timer import BATCH, DEFAULT_KEYS, FORWARD, Timer
from pipeprof.core.stats import Stat

MS = 1_000_000  # nanoseconds per millisecond


class FakeClock:
    """A nanosecond clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


def test_default_keys() -> None:
    assert DEFAULT_KEYS == ("Epoch", "Batch", "Forward", "Backward", "Comm", "IO", "Other")


def test_nested_and_overlapping_regions_are_exact() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)
    timer.start("Batch")
    clock.advance(2 * MS)
    timer.start("Forward")
    clock.advance(5 * MS)
    timer.end("Forward")
    timer.start("IO")  # IO and Comm overlap: start IO, start Comm, end IO, end Comm
    clock.advance(1 * MS)
    timer.start("Comm")
    clock.advance(3 * MS)
    timer.end("IO")
    clock.advance(4 * MS)
    timer.end("Comm")
    timer.end("Batch")
    st = timer.stats()
    assert list(st) == ["Batch", "Forward", "IO", "Comm"]
    assert st["Batch"]["total_ms"] == 15.0
    assert st["Forward"]["total_ms"] == 5.0
    assert st["IO"]["total_ms"] == 4.0
    assert st["Comm"]["total_ms"] == 7.0
    assert all(s["count"] == 1 for s in st.values())


def test_same_key_reentered_closes_lifo() -> None:
    clock = FakeClock()
    seen: list[tuple[str, int, int]] = []
    timer = Timer(clock=clock, sink=lambda *rec: seen.append(rec))
    timer.start("Other")
    clock.advance(10)
    timer.start("Other")
    clock.advance(5)
    timer.end("Other")  # the inner one: 10..15
    clock.advance(15)
    timer.end("Other")  # the outer one: 0..30
    assert seen == [("Other", 10, 5), ("Other", 0, 30)]
    st = timer.stats()["Other"]
    assert (st["count"], st["min_ms"], st["max_ms"]) == (2, 5 / MS, 30 / MS)


def test_per_key_statistics_exact_and_percentiles_close() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)
    durations = [(i * 7919 % 100 + 1) * MS + i * 1234 for i in range(500)]
    for d in durations:
        with timer.region(FORWARD):
            clock.advance(d)
    st = timer.stats()[FORWARD]
    assert st["count"] == 500
    assert st["total_ms"] == sum(durations) / MS
    assert st["min_ms"] == min(durations) / MS
    assert st["max_ms"] == max(durations) / MS
    assert st["mean_ms"] == pytest.approx(statistics.fmean(durations) / MS, rel=1e-12)
    assert st["std_ms"] == pytest.approx(statistics.stdev(durations) / MS, rel=1e-9)
    ordered = sorted(durations)
    assert st["median_ms"] == pytest.approx(ordered[249] / MS, rel=0.03)
    assert st["p95_ms"] == pytest.approx(ordered[math.ceil(0.95 * 500) - 1] / MS, rel=0.03)


def test_batched_aggregation_matches_stat_add() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)
    durations = [(i * 2654435761) % (1 << (i % 34)) for i in range(1000)]  # 0 ns to ~8 s
    for i, d in enumerate(durations):
        with timer.region("IO"):
            clock.advance(d)
        if i == 300:
            timer.stats()  # an early fold must not change the final figures
    ref = Stat.of(durations)
    st = timer.stats()["IO"]
    assert st["count"] == ref.count == 1000
    assert (st["total_ms"], st["min_ms"], st["max_ms"]) == (
        ref.total_ns / MS,
        ref.min_ns / MS,
        ref.max_ns / MS,
    )
    assert st["median_ms"] == ref.percentile_ns(50) / MS  # the very same histogram
    assert st["p95_ms"] == ref.percentile_ns(95) / MS
    assert st["std_ms"] == pytest.approx(ref.std_ns / MS, rel=1e-9)


def test_single_region_has_nan_std() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)
    with timer.region("Epoch"):
        clock.advance(3 * MS)
    st = timer.stats()["Epoch"]
    assert st["median_ms"] == st["p95_ms"] == st["mean_ms"] == 3.0
    assert math.isnan(st["std_ms"])


def test_end_without_start_raises_and_names_the_key() -> None:
    timer = Timer(clock=FakeClock())
    with pytest.raises(ValueError, match=r"Timer.end\('Backward'\) has no matching start"):
        timer.end("Backward")
    timer.start("Backward")
    timer.end("Backward")
    with pytest.raises(ValueError, match="Backward"):
        timer.end("Backward")  # the key is known now, but nothing is open
    assert timer.stats()["Backward"]["count"] == 1


@pytest.mark.parametrize(
    ("key", "error"), [("", ValueError), (3, TypeError), (None, TypeError), (["x"], TypeError)]
)
def test_bad_keys_raise_clear_errors(key: object, error: type[Exception]) -> None:
    timer = Timer(clock=FakeClock())
    for call in (timer.start, timer.end, timer.region):
        with pytest.raises(error, match="region key must be"):
            call(key)  # type: ignore[arg-type]
    assert timer.keys() == ()


def test_region_propagates_exception_and_still_closes() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)
    boom = KeyError("boom")
    with pytest.raises(KeyError) as info, timer.region(BATCH):
        clock.advance(7)
        raise boom
    assert info.value is boom
    st = timer.stats()[BATCH]
    assert (st["count"], st["total_ms"]) == (1, 7 / MS)
    with pytest.raises(ValueError):
        timer.end(BATCH)  # the region was closed by the context manager


def test_sink_gets_every_region_with_start_and_duration() -> None:
    clock = FakeClock()
    seen: list[tuple[str, int, int]] = []
    timer = Timer(clock=clock, sink=lambda *rec: seen.append(rec))
    clock.advance(100)
    with timer.region("Batch"):
        clock.advance(1)
        with timer.region("my/custom"):
            clock.advance(2)
    assert seen == [("my/custom", 101, 2), ("Batch", 100, 3)]


def test_keys_and_reset() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)
    timer.start("IO")
    with timer.region("Forward"):
        clock.advance(1)
    assert timer.keys() == ("IO", "Forward")
    assert list(timer.stats()) == ["Forward"]  # IO is still open: not counted
    timer.reset()
    assert timer.keys() == () and timer.stats() == {}
    with pytest.raises(ValueError):
        timer.end("IO")  # reset dropped the open region


def test_summary_and_rich_table() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)
    assert timer.summary() == "(no regions recorded)"
    for d in (2, 4):
        with timer.region("Forward"):
            clock.advance(d * MS)
    text = timer.summary()
    header, row = text.splitlines()
    assert header.split()[:3] == ["region", "count", "total"]
    assert row.split()[:4] == ["Forward", "2", "6.000", "3.000"]
    table = timer.__rich__()
    assert isinstance(table, Table) and table.row_count == 1
    console = Console(record=True, width=200)
    console.print(timer)
    shown = console.export_text()
    assert "Forward" in shown and "6.000" in shown


def test_memory_stays_bounded() -> None:
    clock = FakeClock()
    timer = Timer(clock=clock)

    def run(n: int) -> None:
        for i in range(n):
            timer.start("Batch")
            clock.advance(1000 + i % 5000)
            timer.end("Batch")

    run(20_000)  # fills the histogram's buckets for this range of durations
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(100_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16_384
    assert timer.stats()["Batch"]["count"] == 120_000


def make_cuda_timer(
    gpu: FakeGPU, clock: FakeClock, seen: list[tuple[str, int, int]], resolve_every: int
) -> Timer:
    return Timer(
        "cuda",
        clock=clock,
        sink=lambda *rec: seen.append(rec),
        resolve_every=resolve_every,
        event_factory=gpu.event,
    )


def gpu_step(timer: Timer, gpu: FakeGPU, clock: FakeClock) -> None:
    """One step: Batch (3 ms on the GPU) containing Forward (2 ms)."""
    timer.start("Batch")
    clock.advance(10)
    gpu.now_ms += 1.0
    timer.start("Forward")
    gpu.now_ms += 2.0
    timer.end("Forward")
    timer.end("Batch")


def test_cuda_resolves_finished_pairs_in_batches_without_synchronising() -> None:
    gpu, clock, seen = FakeGPU(), FakeClock(), []
    timer = make_cuda_timer(gpu, clock, seen, resolve_every=4)
    resolved = []
    for _ in range(6):
        gpu_step(timer, gpu, clock)
        gpu.completed = gpu.recorded  # the GPU catches up between steps
        resolved.append(len(seen))
    # 2 pairs a step. The first pass runs at the 5th end (step 3's Forward, not done yet): it
    # records the 4 finished pairs and keeps 1, so the next pass waits for 1 + 4 more pending.
    assert resolved == [0, 0, 4, 4, 8, 8]
    assert gpu.syncs == 0
    st = timer.stats()
    assert gpu.syncs > 0  # only now, for the four pairs still pending
    assert len(seen) == 12
    assert st["Forward"]["count"] == st["Batch"]["count"] == 6
    assert st["Forward"]["mean_ms"] == 2.0 and st["Batch"]["mean_ms"] == 3.0
    assert ("Batch", 0, 3 * MS) in seen and ("Forward", 10, 2 * MS) in seen


def test_cuda_lagging_gpu_waits_for_flush() -> None:
    gpu, clock, seen = FakeGPU(), FakeClock(), []
    timer = make_cuda_timer(gpu, clock, seen, resolve_every=4)
    for _ in range(20):
        gpu_step(timer, gpu, clock)  # the GPU finishes nothing: no pass may block on it
    assert seen == [] and gpu.syncs == 0
    every_end = sum(range(5, 41))  # queries if every end past the 4th re-scanned all pending
    assert 0 < gpu.queries < every_end // 3
    timer.flush()
    assert gpu.syncs > 0 and len(seen) == 40
    assert sorted({d for _, _, d in seen}) == [2 * MS, 3 * MS]
    assert timer.stats()["Batch"]["total_ms"] == 60.0


def test_cuda_reuses_events() -> None:
    gpu, clock, seen = FakeGPU(), FakeClock(), []
    timer = make_cuda_timer(gpu, clock, seen, resolve_every=8)
    for _ in range(1000):
        gpu_step(timer, gpu, clock)
        gpu.completed = gpu.recorded
    assert len(seen) >= 1990
    assert gpu.created < 32  # about the events in flight (2 * resolve_every), not 4000


def test_cuda_end_without_start_raises() -> None:
    gpu = FakeGPU()
    timer = make_cuda_timer(gpu, FakeClock(), [], resolve_every=4)
    with pytest.raises(ValueError, match="Comm"):
        timer.end("Comm")
    assert gpu.recorded == 0


def test_cuda_without_torch_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(RuntimeError, match=r"pip install torch.*backend='cpu'"):
        Timer("cuda")


def fake_torch(available: bool, initialized: bool | None = None) -> types.ModuleType:
    """torch as the timer sees it: whether it sees a GPU, and whether CUDA is initialised
    (by default, as soon as it is available)."""
    torch = types.ModuleType("torch")
    init = available if initialized is None else initialized
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: available, is_initialized=lambda: init
    )
    return torch


def test_cuda_without_gpu_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(False))
    with pytest.raises(RuntimeError, match=r"pip install torch.*backend='cpu'"):
        Timer("cuda")


def test_auto_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert Timer("auto").backend == "cpu"
    monkeypatch.setitem(sys.modules, "torch", fake_torch(False))
    assert Timer("auto").backend == "cpu"
    monkeypatch.setitem(sys.modules, "torch", fake_torch(True))
    assert Timer("auto", event_factory=FakeGPU().event).backend == "cuda"


def test_auto_backend_waits_for_the_process_to_use_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Auto backend ]: a GPU that this process has not initialised gets no event (an
    event would create a CUDA context); the timer turns to events at the first region after the
    process initialises CUDA, and a region open then ends on the CPU clock."""
    gpu, turned = FakeGPU(), []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(True, initialized=False))
    timer = Timer("auto", event_factory=gpu.event, on_cuda=turned.append)
    timer.start("Epoch")
    with timer.region("Forward"):
        pass
    assert timer.backend == "cpu" and gpu.created == 0 and not timer.poll_cuda()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(True, initialized=True))
    with timer.region("Forward"):
        gpu.now_ms += 4.0
    assert timer.backend == "cuda" and turned == [timer] and gpu.created == 2
    timer.end("Epoch")
    gpu.completed = gpu.recorded
    stats = timer.stats()
    assert stats["Forward"]["count"] == 2 and stats["Forward"]["max_ms"] == pytest.approx(4.0)
    assert stats["Epoch"]["count"] == 1 and gpu.created == 2  # the CPU clock's, no event
    # a machine whose torch sees no GPU stops looking
    monkeypatch.setitem(sys.modules, "torch", fake_torch(False))
    cpu_only = Timer("auto")
    assert not cpu_only.poll_cuda() and not cpu_only._auto


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="backend must be"):
        Timer("tpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="resolve_every"):
        Timer(resolve_every=-1)


def test_real_clock_measures_something() -> None:
    timer = Timer()
    with timer.region("Other"):
        sum(range(10_000))
    st = timer.stats()["Other"]
    assert st["count"] == 1 and 0 < st["total_ms"] < 1000


def test_import_does_not_import_torch() -> None:
    code = "import pipeprof.collect.timer, sys; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
