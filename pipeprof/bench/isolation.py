"""Each step of a pipeline timed on its own, on a fixed set of real samples.

NOTE [ Stand-alone stage timing ]
A step is timed in isolation: its inputs are the outputs of the step before, computed once on
the fixed sample set, so a step's figures do not depend on the cost of the rest of the chain and
two runs on the same samples compare. Each step gets ``warmup`` untimed calls (lazy imports,
caches, allocator), then ``repeat`` passes over the inputs; every call is timed with the wall
clock (``perf_counter_ns``) and the process's CPU clock (``process_time_ns``, all threads), so a
step that waits (sleep, storage) shows CPU well below wall and a multi-threaded one above it.
On a shared machine other programs preempt the benchmark: the time the thread spent runnable but
waiting for a CPU (Linux's ``/proc/thread-self/schedstat`` run delay) is taken off the wall time,
so the figures are what the step costs with a core to itself and runs on a busy machine compare.
Random steps are reseeded (``random``, NumPy, torch) before every pass: each pass draws the same
numbers, and so does the next run. A step that returns its input (works in place) gets a fresh
copy of its inputs for every pass. A call that raises is recorded against its sample, which then
drops out of the later steps; the other samples go on.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeprof.collect.torch.dataset import _children, _unique, name_of
from pipeprof.core.stats import Stat

Step = tuple[str, Callable[..., Any]]


@dataclass
class StageResult:
    """What one stage cost per sample, and what it produced.

    ``stat`` holds the wall time of every timed call (ns); ``pass_ms`` the mean of each pass, whose
    median (``wall_ms``) is what predictions use, as it shrugs off a pass disturbed by another
    program. ``out_bytes`` is the mean size of one output (None: unknown, not zero).
    """

    path: str
    stat: Stat = field(default_factory=Stat)
    cpu_ns: int = 0
    pass_ms: list[float] = field(default_factory=list)
    pass_cpu_ms: list[float] = field(default_factory=list)
    errors: dict[str, Any] = field(default_factory=dict)
    out_bytes: float | None = None
    out: str = ""
    skipped: str | None = None
    delay_ns: int = 0
    gil: float | None = None

    @property
    def wall_ms(self) -> float:
        return _median(self.pass_ms)

    @property
    def cpu_ms(self) -> float:
        """CPU ms per call: the median pass, like ``wall_ms`` (all calls where passes were not
        kept apart)."""
        if self.pass_cpu_ms:
            return _median(self.pass_cpu_ms)
        return self.cpu_ns / self.stat.count / 1e6 if self.stat.count else math.nan

    @property
    def kind(self) -> str:
        """``cpu`` (scales with cores), ``waiting`` (scales with workers), ``mixed`` or
        ``parallel`` (uses several cores per call); ``n/a`` without timings."""
        if not self.stat.count or not self.wall_ms > 0:
            return "n/a"
        ratio = self.cpu_ms / self.wall_ms
        if ratio > 1.3:
            return "parallel"
        return "cpu" if ratio >= 0.7 else ("waiting" if ratio <= 0.3 else "mixed")

    def fail(self, pos: int, exc: BaseException) -> None:
        e = self.errors
        e["count"] = e.get("count", 0) + 1
        e.setdefault("first", f"{type(exc).__name__}: {exc}")
        e.setdefault("samples", []).append(pos)


_delay_fds: dict[int, int | None] = {}


def run_delay_ns() -> int:
    """Nanoseconds the calling thread has waited for a CPU while runnable; 0 where unknown."""
    tid = threading.get_ident()
    fd = _delay_fds.get(tid, -1)
    if fd == -1:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = None
        _delay_fds[tid] = fd
    if fd is None:
        return 0
    try:
        return int(os.pread(fd, 96, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Time steps with one intra-op thread, as DataLoader workers run them."""
    torch = sys.modules.get("torch")
    was = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch is not None and was is not None:
            torch.set_num_threads(was)


def _median(values: list[float]) -> float:
    if not values:
        return math.nan
    ms = sorted(values)
    mid = len(ms) // 2
    return ms[mid] if len(ms) % 2 else (ms[mid - 1] + ms[mid]) / 2


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (those that are imported)."""
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def steps_of(fn: Any, prefix: str = "transform") -> tuple[list[Step], bool]:
    """The steps of a transform (a Compose, nn.Sequential, list or callable) named as the
    profiler names them, and whether they take several inputs as one tuple (v2 Compose)."""
    if isinstance(fn, (list, tuple)):
        items, multi = list(fn), False
    else:
        _check_callable(fn, "the transform")
        parts = _children(fn)
        if parts is None:
            return [(f"transform/{name_of(fn)}" if prefix == "transform" else prefix, fn)], False
        items, multi = parts
    out: list[Step] = []
    for i, t in enumerate(items):
        _check_callable(t, f"transform {i}")
        path = _unique(prefix, t, items[:i])
        out += steps_of(t, path)[0] if _children(t) is not None else [(path, t)]
    return out, multi


def _check_callable(fn: Any, what: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"{what} ({type(fn).__name__} {fn!r:.60}) is not callable: pass "
            "callables such as torchvision transforms, functions or a Compose"
        )


class GilWatch:
    """The share of a step's time spent holding the GIL: a thread sleeps 1 ms at a time and
    counts the wake-ups that had to wait for the GIL (late by over 0.5 ms), less the share that
    were late with this thread idle (other programs). Pure-Python steps hold the GIL, so threads
    cannot run them in parallel and a DataLoader worker's own threads (the result queue's
    feeder, tensor sharing) wait for them; steps that run in C and release it (PIL, torch,
    NumPy) do not."""

    def __init__(self) -> None:
        self.late = self.wakes = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pipeprof-gil-watch", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            time.sleep(0.001)
            self.late += time.perf_counter() - t0 > 0.0015
            self.wakes += 1

    def __enter__(self) -> GilWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def share(self) -> float | None:
        return self.late / self.wakes if self.wakes >= 5 else None


def gil_share(
    fn: Callable[[Any], Any], inputs: Sequence[Any], budget_s: float = 0.1
) -> float | None:
    """The share of ``fn``'s time spent holding the GIL (None: too short to tell), from an extra
    untimed run over ``inputs`` (at most two passes or ``budget_s``) with a ``GilWatch``, apart
    from the timed passes, whose clock reads release the GIL between calls."""
    if not inputs:
        return None
    base = gil_baseline()
    end = time.perf_counter() + budget_s
    with GilWatch() as watch:
        for x in [*inputs, *inputs]:
            try:
                fn(x)
            except Exception:
                pass
            if time.perf_counter() > end:
                break
    if watch.share is None or base >= 1.0:
        return None
    return max(0.0, (watch.share - base) / (1.0 - base))


def gil_baseline(seconds: float = 0.05) -> float:
    """The share of late wake-ups with this thread asleep: other programs' doing, not the GIL."""
    with GilWatch() as w:
        time.sleep(seconds)
    return w.share or 0.0


def time_calls(
    res: StageResult,
    fn: Callable[[Any], Any],
    inputs: Sequence[tuple[int, Any]],
    repeat: int,
    warmup: int,
    seed: int,
) -> list[tuple[int, Any]]:
    """Time ``fn`` on every input ``repeat`` times into ``res``; the first pass's outputs."""
    for _, x in inputs[: max(0, warmup)]:
        try:
            fn(x)
        except Exception:  # reported by the timed pass
            pass
    outputs: list[tuple[int, Any]] = []
    _passes(res, fn, inputs, repeat, seed, outputs)
    res.gil = gil_share(fn, [x for p, x in inputs if p not in res.errors.get("samples", [])])
    describe_outputs(res, [y for _, y in outputs])
    return outputs


def _passes(
    res: StageResult,
    fn: Callable[[Any], Any],
    inputs: Sequence[tuple[int, Any]],
    repeat: int,
    seed: int,
    outputs: list[tuple[int, Any]],
) -> None:
    """The timed passes of ``time_calls``; the first pass's outputs go to ``outputs``."""
    perf, cpu, delay = time.perf_counter_ns, time.process_time_ns, run_delay_ns
    failed: set[int] = set()
    inplace = False
    for r in range(repeat):
        seed_all(seed)
        xs = inputs if not inplace else [(p, copy.deepcopy(x)) for p, x in inputs]
        wall_sum, cpu_sum, calls = 0, 0, 0
        for pos, x in xs:
            if pos in failed:
                continue
            d0 = delay()
            t0, c0 = perf(), cpu()
            try:
                y = fn(x)
            except Exception as exc:
                failed.add(pos)
                res.fail(pos, exc)
                continue
            c1, t1 = cpu(), perf()
            waited = delay() - d0
            wall = max(t1 - t0 - waited, 0)
            res.stat.add(wall)
            res.cpu_ns += c1 - c0
            res.delay_ns += waited
            wall_sum += wall
            cpu_sum += c1 - c0
            calls += 1
            if r == 0:
                outputs.append((pos, y))
                inplace = inplace or (y is x and repeat > 1)
        if calls:
            res.pass_ms.append(wall_sum / calls / 1e6)
            res.pass_cpu_ms.append(cpu_sum / calls / 1e6)


def describe_outputs(res: StageResult, outputs: Sequence[Any]) -> None:
    """Mean bytes and a short description of a stage's outputs."""
    if not outputs:
        return
    sizes = [size_of(y) for y in outputs]
    known = [s for s in sizes if s is not None]
    res.out_bytes = sum(known) / len(known) if len(known) == len(sizes) else None
    first = describe(outputs[0])
    same = all(describe(y) == first for y in outputs[1:8])
    res.out = first if same else f"{first} (varies)"


def size_of(obj: Any, depth: int = 0) -> int | None:
    """Bytes of an output's payload: tensors, arrays, images, bytes, str; containers add up.
    None when unknown (a number, an arbitrary object)."""
    nbytes = getattr(obj, "nbytes", None)  # torch.Tensor, numpy.ndarray
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(obj, "getbands") and hasattr(obj, "size"):  # PIL.Image
        w, h = obj.size
        return int(w * h * len(obj.getbands()) * (2 if ";16" in obj.mode else 1))
    if isinstance(obj, (bytes, bytearray, memoryview, str)):
        return len(obj)
    if depth < 4 and isinstance(obj, (list, tuple, dict)):
        items = obj.values() if isinstance(obj, dict) else obj
        parts = [size_of(v, depth + 1) for v in items]
        known = [p for p in parts if p is not None]
        return sum(known) if known else None
    return None


def describe(obj: Any, depth: int = 0) -> str:
    """``Tensor 3×224×224 float32``, ``Image 500×375 RGB``, ``(Tensor 3×224×224 float32, int)``."""
    shape = getattr(obj, "shape", None)
    if shape is not None and hasattr(obj, "dtype"):
        dims = "×".join(str(int(d)) for d in shape) or "scalar"
        dtype = str(obj.dtype).replace("torch.", "")
        return f"{type(obj).__name__} {dims} {dtype}"
    if hasattr(obj, "getbands") and hasattr(obj, "size"):
        return f"Image {obj.size[0]}×{obj.size[1]} {obj.mode}"
    if isinstance(obj, (bytes, bytearray)):
        return f"{type(obj).__name__} {len(obj)}"
    if depth < 2 and isinstance(obj, (list, tuple)):
        inner = ", ".join(describe(v, depth + 1) for v in obj[:3])
        more = ", …" if len(obj) > 3 else ""
        return f"({inner}{more})" if isinstance(obj, tuple) else f"[{inner}{more}]"
    if depth < 2 and isinstance(obj, dict):
        keys = ", ".join(f"{k}: {describe(v, depth + 1)}" for k, v in list(obj.items())[:3])
        return "{" + keys + (", …" if len(obj) > 3 else "") + "}"
    return type(obj).__name__


def run_chain(
    steps: Sequence[Step], inputs: list[tuple[int, Any]], repeat: int, warmup: int, seed: int
) -> tuple[list[StageResult], list[tuple[int, Any]]]:
    """Time each step on the outputs of the one before (see NOTE [ Stand-alone stage timing ]);
    the results and the last step's outputs (for the samples that passed every step)."""
    results = []
    for path, fn in steps:
        res = StageResult(path)
        if not inputs:
            res.skipped = "no input: every sample failed in an earlier step"
        else:
            inputs = time_calls(res, fn, inputs, repeat, warmup, seed)
        results.append(res)
    return results, inputs
