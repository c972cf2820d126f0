"""``pipeprof.Profiler``: a training loop's time attributed to wait, transfer, compute and regions.

NOTE [ Step attribution ]
A step starts when the loop asks for a batch. ``wait`` is the time blocked in ``next()``;
``transfer`` is the host-to-device copy when pipeprof moves the batch (``device=``), plus the
user's regions named ``Transfer``/``H2D``/``IO``; ``compute`` is the rest of the step, from the
moment the batch is handed over to the next request, minus "overhead" regions (any region that
is not a compute key — logging, callbacks, ``Other``). ``Epoch`` and ``Batch`` regions are
containers and count nowhere. The first steps of every epoch, until each DataLoader worker has
delivered a batch (``num_workers`` steps, at least one), are start-up (worker start, prefetch
fill) and kept apart: ``steady`` figures leave them out, the totals keep them.

On a GPU the loop's CPU side can run ahead of asynchronous kernels, so a step's CPU view
under-states compute and over-states wait. With a CUDA device, CUDA events bracket each
compute phase; where the GPU's compute time exceeds the CPU's, the excess is moved from wait to
compute (the GPU was still busy while the CPU waited).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeprof.recorder import clock, measure_overhead, recorder
from pipeprof.report import Report
from pipeprof.session import Session
from pipeprof.stats import Stat
from pipeprof.timer import Backend, Timer

STEP_RING = 10_000  # recent steps kept for timelines
FOLD_EVERY = 4096  # steps between folds of per-step values into Stats
COMPUTE_KEYS = frozenset({"Forward", "Backward", "Comm", "Loss", "Optimizer", "Step", "Compute"})
TRANSFER_KEYS = frozenset({"Transfer", "H2D", "IO", "transfer", "h2d"})
CONTAINER_KEYS = frozenset({"Epoch", "Batch"})


def region_class(key: str) -> str:
    """How a region counts in the step: compute, transfer, container or overhead."""
    if key in COMPUTE_KEYS:
        return "compute"
    if key in TRANSFER_KEYS:
        return "transfer"
    if key in CONTAINER_KEYS:
        return "container"
    return "overhead"


class Wrapped:
    """What ``Profiler.wrap`` returns: each ``iter()`` is one timed pass (an epoch) of the data."""

    def __init__(self, profiler: Profiler, data: Any, source: Iterable[Any]) -> None:
        self._profiler = profiler
        self._data = data
        self._source = source
        self._moves = getattr(source, "h2d", None) is not None
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        return self._profiler._steps(self._source, self._moves)

    def __next__(self) -> Any:  # ``next(prof.wrap(it))`` on an iterator, as before
        if self._it is None:
            self._it = iter(self)
        return next(self._it)

    def __len__(self) -> int:
        return len(self._data)  # the data's own TypeError when it has no length


class Profiler:
    """Profiles a training loop: wrap its data, mark regions, get a Report.

    >>> prof = pipeprof.Profiler(device="cuda")
    >>> with prof:
    ...     for batch in prof.wrap(loader):        # the same batches as the plain loader
    ...         with prof.region("Forward"): ...
    >>> prof.report()

    ``device`` moves each batch there (timed as ``transfer/h2d``). ``sample_hz`` is the NVML and
    host sampling rate (0 turns sampling off); ``gpus`` the NVML indices to sample (default: the
    device's). ``stream`` names a file the session is saved to every ``flush_s`` seconds while the
    loop runs and at the end, so a crash loses at most that interval. ``replay`` keeps that many
    batches for ``Profiler.replay`` (compute-only baseline).
    """

    def __init__(
        self,
        device: Any = None,
        *,
        sample_hz: float = 10.0,
        gpus: list[int] | None = None,
        stream: str | None = None,
        flush_s: float = 10.0,
        replay: int = 0,
        timer: Backend = "auto",
        nvml: Any = None,
        event_factory: Callable[[], Any] | None = None,
    ) -> None:
        if isinstance(sample_hz, bool) or not isinstance(sample_hz, (int, float)) or sample_hz < 0:
            raise ValueError(
                f"sample_hz must be a number >= 0 (samples per second; 0 turns the GPU and host "
                f"samplers off), got {sample_hz!r}"
            )
        if isinstance(replay, bool) or not isinstance(replay, int) or replay < 0:
            raise ValueError(
                f"replay must be a whole number of batches >= 0 to keep for Profiler.replay(), "
                f"got {replay!r}"
            )
        self.device = device
        self.sample_hz = sample_hz
        self.gpus = gpus
        self.stream = stream
        self.flush_s = flush_s
        self.replay_batches = replay
        self._nvml_module = nvml
        self.session = Session(mode="loop")
        self.timer = Timer(
            backend=timer,
            sink=self._on_region,
            event_factory=event_factory,
        )
        self.session.loop = _empty_loop()
        self._class_ns = {"transfer": 0, "overhead": 0}
        # per-step values, folded into Stats in bulk (NumPy) every FOLD_EVERY steps
        self._pending: dict[str, dict[str, list[int]]] = {
            name: {k: [] for k in PARTS} for name in ("first", "steady")
        }
        self._pending_regions: dict[str, list[int]] = {}
        self._samplers: list[Any] = []
        self._nvml: Any = None
        self._running = False
        self._last_flush = 0.0
        self._cached: list[Any] = []
        self._twins: list[tuple[Any, Any]] = []
        self._closed: list[tuple[int, int]] = []  # this step's closed regions: (start, ns)
        self._gpu_events: list[tuple[Any, Any]] = []

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> Profiler:
        if self._running:
            raise RuntimeError("this Profiler is already running")
        if self.session.start_ns:
            raise RuntimeError(
                "this Profiler has already profiled a run and stopped: one Profiler covers one "
                "continuous run (put every epoch inside one `with prof:`), or create a new "
                "pipeprof.Profiler() for another run"
            )
        s = self.session
        s.overhead_ns = measure_overhead()
        s.start_ns = clock()
        self._last_flush = time.monotonic()
        self._running = True
        if self.sample_hz:
            from pipeprof.samplers import HostSampler

            self._samplers.append(HostSampler(hz=self.sample_hz).start())
        return self

    def stop(self, interrupted: bool = False) -> None:
        if not self._running:
            return
        self._running = False
        self.timer.flush()
        self._resolve_gpu(block=True)
        self._fold()
        s = self.session
        s.end_ns = clock()
        s.interrupted = s.interrupted or interrupted
        for sampler in self._samplers:
            sampler.stop()
        self._collect_samplers()
        self._twins.clear()  # lets persistent workers of the profiled twins shut down
        rec = recorder()
        if rec.raw:
            s.merge(rec.drain())
        if self.stream:
            s.save(self.stream)

    def __enter__(self) -> Profiler:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.stop(interrupted=exc_type is not None)  # the exception itself propagates

    def report(self) -> Report:
        """The Report so far (works during, after, and after an exception in the loop)."""
        self._fold()
        if self._running:
            self._collect_samplers()
            self.session.end_ns = clock()
        return Report(self.session)

    # ---- regions --------------------------------------------------------------------------

    def region(self, key: str) -> Any:
        """A timed region (``Forward``, ``Backward``, ``Comm``, ``IO``, ``Other``, any name)."""
        return self.timer.region(key)

    def _on_region(self, key: str, start_ns: int, duration_ns: int) -> None:
        values = self._pending_regions.get(key)
        if values is None:
            values = self._pending_regions[key] = []
        values.append(duration_ns)
        self.session.spans.append(("main", f"region/{key}", start_ns, duration_ns))
        # A region counts for its class only outside the regions nested in it, which closed
        # before it: "train_step" around Forward and Backward is compute, not overhead.
        inner, closed = 0, self._closed
        while closed and closed[-1][0] >= start_ns:
            inner += closed.pop()[1]
        closed.append((start_ns, duration_ns))
        kind = region_class(key)
        if kind in self._class_ns:
            self._class_ns[kind] += max(0, duration_ns - inner)

    # ---- the data ---------------------------------------------------------------------------

    def wrap(self, data: Iterable[Any], device: Any = None) -> Wrapped:
        """Iterate ``data`` (a DataLoader, a tf.data.Dataset or any iterable) and time each step.

        Like a DataLoader, the result can be iterated again (each pass is an epoch) and has the
        ``len()`` of ``data``.
        """
        device = device if device is not None else self.device
        started = not self._running
        if started:
            self.start()
        try:
            source = self._source(data, device)
        except BaseException:
            if started:  # bad input: no sampler left running for a loop that never starts
                self.stop()
            raise
        return Wrapped(self, data, source)

    def _source(self, data: Any, device: Any) -> Iterable[Any]:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(data, torch.utils.data.DataLoader):
            from pipeprof.collectors.torch import ProfiledLoader

            # One twin per loader, so persistent workers persist across epochs.
            for loader, twin in self._twins:
                if loader is data:
                    return twin  # type: ignore[no-any-return]
            twin = ProfiledLoader(data, self.session, device)
            self._twins.append((data, twin))
            return twin
        tf = sys.modules.get("tensorflow")
        if tf is not None and isinstance(data, tf.data.Dataset):
            from pipeprof.collectors.tfdata import ProfiledDataset

            self.session.framework = "tf"
            return ProfiledDataset(data, self.session, device)  # type: ignore[no-any-return]
        if not hasattr(data, "__iter__"):
            raise TypeError(
                f"Profiler.wrap() needs an iterable of batches, got {type(data).__name__}"
            )
        return GenericSource(data, self.session)

    def _steps(self, source: Iterable[Any], moves: bool) -> Iterator[Any]:
        s, loop = self.session, self.session.loop
        loop["epochs"] += 1
        rec = recorder()
        it = iter(source)
        warmup = getattr(source, "warmup_steps", 1)  # steps until every worker delivered once
        handed = 0  # when the last batch went to the user (0: none yet)
        gpu_start: Any = None
        try:
            while True:
                t_req = clock()
                if handed:
                    gpu_start = self._gpu_mark(gpu_start, end=True)
                    self._end_step(handed, t_req)
                h2d_before = _h2d_ns(rec, s)
                try:
                    batch = next(it)
                except StopIteration:
                    handed = 0
                    return
                t_got = clock()
                transfer = (_h2d_ns(rec, s) - h2d_before) if moves else 0
                wait = t_got - t_req - transfer
                self._begin_step(t_req, wait, transfer, warmup > 0)
                warmup -= 1
                if len(self._cached) < self.replay_batches:
                    self._cached.append(batch)
                handed = clock()
                gpu_start = self._gpu_mark(None, end=False)
                self._maybe_flush()
                yield batch
        finally:
            if handed:
                self._end_step(handed, clock())

    def _begin_step(self, t_req: int, wait: int, transfer: int, first: bool) -> None:
        loop = self.session.loop
        part = self._pending["first" if first else "steady"]
        wait = max(0, wait)
        part["wait"].append(wait)
        part["transfer"].append(transfer)
        if loop["startup_ns"] is None:
            loop["startup_ns"] = wait
        loop["steps"] += 1
        loop["step_ring"].append([t_req, wait, transfer, 0, int(first)])
        self._closed.clear()
        self._step_marks = (self._class_ns["transfer"], self._class_ns["overhead"], part)

    def _end_step(self, handed: int, t_end: int) -> None:
        """Close the step whose batch was handed over at ``handed`` (NOTE [ Step attribution ])."""
        transfer_before, overhead_before, part = self._step_marks
        cpu = t_end - handed
        user_transfer = min(cpu, self._class_ns["transfer"] - transfer_before)
        overhead = min(cpu - user_transfer, self._class_ns["overhead"] - overhead_before)
        compute = cpu - user_transfer - overhead
        part["compute"].append(compute)
        part["overhead"].append(overhead)
        part["user_transfer"].append(user_transfer)
        row = self.session.loop["step_ring"][-1]
        row[2] += user_transfer
        row[3] = compute
        part["step"].append(row[1] + row[2] + cpu)
        if len(part["step"]) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Fold the per-step values gathered since the last fold into the session's Stats."""
        loop = self.session.loop
        for name, part in self._pending.items():
            for key, values in part.items():
                if values:
                    loop[name][key].merge(Stat.of_many(values))
                    values.clear()
        for key, values in self._pending_regions.items():
            if values:
                loop["regions"].setdefault(key, Stat()).merge(Stat.of_many(values))
                values.clear()

    # ---- GPU compute time (CUDA events) ------------------------------------------------------

    def _gpu_mark(self, start: Any, end: bool) -> Any:
        if self.timer.backend != "cuda":
            return None
        event = self.timer._factory()
        event.record()
        if end and start is not None:
            self._gpu_events.append((start, event))
            if len(self._gpu_events) >= 64:
                self._resolve_gpu(block=False)
            return None
        return event

    def _resolve_gpu(self, block: bool) -> None:
        keep = []
        for start, end in self._gpu_events:
            if block or end.query():
                if block:
                    end.synchronize()
                self.session.loop["gpu_compute"].add(int(start.elapsed_time(end) * 1e6))
            else:
                keep.append((start, end))
        self._gpu_events = keep

    # ---- samplers and streaming --------------------------------------------------------------

    def _maybe_start_nvml(self) -> None:
        if self._nvml is not None or not self.sample_hz or not self._running:
            return
        from pipeprof.samplers import NvmlSampler

        self._nvml = NvmlSampler(
            hz=self.sample_hz, gpus=self._gpu_indices(), nvml=self._nvml_module
        )
        self._samplers.append(self._nvml.start())

    def _gpu_indices(self) -> list[int] | None:
        if self.gpus is not None:
            return list(self.gpus)
        dev = str(self.device or "")
        if dev.startswith("cuda:"):
            return [int(dev.split(":")[1])]
        return None

    def _collect_samplers(self) -> None:
        from pipeprof.samplers import HostSampler, NvmlSampler

        for sampler in self._samplers:
            if isinstance(sampler, NvmlSampler):
                self.session.gpu = sampler.to_dict()
            elif isinstance(sampler, HostSampler):
                self.session.host = sampler.to_dict()

    def _maybe_flush(self) -> None:
        # NVML starts once the first batch is in: DataLoader workers have forked by then.
        self._maybe_start_nvml()
        if not self.stream or time.monotonic() - self._last_flush < self.flush_s:
            return
        self._last_flush = time.monotonic()
        s = self.session
        s.end_ns = clock()
        self._fold()
        self._collect_samplers()
        # a snapshot of a loop still running: if the process dies now, the file says partial
        was, s.interrupted = s.interrupted, True
        try:
            s.save(self.stream)
        finally:
            s.interrupted = was

    # ---- replay baseline ----------------------------------------------------------------------

    def replay(self, step: Callable[[Any], Any], repeats: int = 3) -> dict[str, Any]:
        """Run ``step(batch)`` on the cached batches (``Profiler(replay=N)``): compute alone.

        ``step`` must not change your training: build it on a copy of the model and optimizer,
        or leave out ``optimizer.step()``. Returns and stores compute-only samples/s.
        """
        if not self._cached:
            raise RuntimeError(
                "no cached batches: create the Profiler with replay=N (e.g. 8) "
                "and iterate prof.wrap(loader) first"
            )
        samples = sum(batch_size(b) for b in self._cached)
        step(self._cached[0])  # warm-up
        _sync()
        times = []
        for _ in range(repeats):
            t0 = clock()
            for b in self._cached:
                step(b)
            _sync()
            times.append(clock() - t0)
        best = sorted(times)[len(times) // 2]
        result = {
            "batches": len(self._cached),
            "repeats": repeats,
            "compute_samples_per_s": round(samples / (best / 1e9), 3),
        }
        self.session.loop["replay"] = result
        return result


def _sync() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()


def _h2d_ns(rec: Any, session: Session) -> int:
    """Host-to-device time recorded so far (the collector times it on the main recorder)."""
    raw = rec.raw.get("transfer/h2d")
    pending = sum(raw[1::3]) if raw else 0
    done = session.stages.get("main", {}).get("transfer/h2d")
    return pending + (done.total_ns if done is not None else 0)


def batch_size(batch: Any) -> int:
    """Samples in a batch of unknown structure: the leading dimension of its first array."""
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(batch, dict) and batch:
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        return (
            batch_size(first)
            if hasattr(first, "shape") or isinstance(first, (list, tuple, dict))
            else len(batch)
        )
    return 1


class GenericSource:
    """Any iterable of batches: the pipeline is opaque, only the consumer's wait is known."""

    def __init__(self, data: Iterable[Any], session: Session) -> None:
        self.data = data
        self.session = session
        session.meta.setdefault("source", type(data).__name__)

    def __iter__(self) -> Iterator[Any]:
        t_iter: int | None = clock()
        it = iter(self.data)
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.session.add_batch(t0, clock(), batch_size(batch), t_iter)
            t_iter = None
            yield batch


PARTS = ("wait", "transfer", "user_transfer", "compute", "overhead", "step")


def _empty_loop() -> dict[str, Any]:
    """Loop-mode data: the first step of each epoch and the steady steps kept apart."""
    return {
        "steps": 0,
        "epochs": 0,
        "startup_ns": None,
        "first": {k: Stat() for k in PARTS},
        "steady": {k: Stat() for k in PARTS},
        "gpu_compute": Stat(),
        "regions": {},
        "replay": None,
        "step_ring": deque(maxlen=STEP_RING),
    }
