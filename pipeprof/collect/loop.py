"""A training loop's steps, cut into wait, transfer, compute and overhead (the loop collector).

NOTE [ Step attribution ]
A step starts when the loop asks for a batch. ``wait`` is the time blocked in ``next()``;
``wait`` splits into *starved* and *hand-over* where the source knows when each batch was
ready (a DataLoader: NOTE [ Wait, split ] in collect/torch/loader.py); pipeprof's own
bookkeeping inside ``next()`` is measured there and left out of the wait. ``transfer`` is the
host-to-device copy when pipeprof moves the batch (``device=``), plus the
user's regions named ``Transfer``/``H2D``/``IO``; ``compute`` is the rest of the step, from the
moment the batch is handed over to the next request, minus "overhead" regions (any region that
is not a compute key — logging, callbacks, ``Other``; see core/regions.py) and minus ``comm``:
``Comm`` regions and the exposed wait of DDP's gradient all-reduce (NOTE [ Comm ] in
collect/comm.py), the time the step was blocked on collective communication. ``Epoch`` and
``Batch`` regions are containers and count nowhere. The first steps of every epoch, until each
DataLoader worker has delivered a batch (``num_workers`` steps, at least one), are start-up
(worker start, prefetch fill) and kept apart: ``steady`` figures leave them out, the totals keep
them.

On a GPU the loop's CPU side can run ahead of asynchronous kernels, so a step's CPU view
under-states compute and over-states wait. With a CUDA device, CUDA events bracket each
compute phase (from the hand-over to the next request); where the GPU's time exceeds the CPU's
time of the same spans (compute, other regions, the user's transfer, comm), the excess is moved
from wait to compute (the GPU was still busy while the CPU waited), in the start-up and the
steady steps each by their own events. Where CUDA events saw DDP's all-reduce exposed longer
than the host did (NCCL: NOTE [ Comm on the GPU ] in collect/comm.py), that excess moves from
compute to comm. Regions count for their class by the CPU clock as they close, whatever their
timer: a CUDA-event timer's durations are known steps later and are the regions' figures only.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from pipeprof.core.batch import batch_size
from pipeprof.core.recorder import clock
from pipeprof.core.regions import region_class
from pipeprof.core.session import STEP_PARTS, LoopRecord, Session
from pipeprof.core.stats import Stat

FOLD_EVERY = 4096  # steps between folds of per-step values into Stats
HANG_S = 60.0  # the least wait for a batch that is a hang (NOTE [ Hangs ] in torch/hangs.py)
_SPAN_KEYS = {k: f"region/{k}" for k in ("Forward", "Backward", "Optimizer")}


class StepLog:
    """Writes a loop's steps and regions into ``session.loop``: the one bookkeeping of steps that
    ``Profiler`` and the Keras callback share.

    Per-step values are kept in lists and folded into Stats in bulk (NumPy) every
    ``FOLD_EVERY`` steps and on ``fold()``: the loop's own ``next()`` pays an append, not a
    histogram update.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self.record = session.loop = session.loop or LoopRecord()
        self._pending: dict[str, dict[str, list[int]]] = {
            name: {k: [] for k in STEP_PARTS} for name in ("first", "steady")
        }
        self._pending_regions: defaultdict[str, list[int]] = defaultdict(list)
        self._pending_host: defaultdict[str, list[int]] = defaultdict(list)
        self._class_ns = {"transfer": 0, "overhead": 0, "comm": 0}
        self._closed: list[tuple[int, int]] = []  # this step's closed regions: (start, ns)
        self._marks: tuple[int, int, int, dict[str, list[int]]] = (0, 0, 0, self._pending["first"])
        self.first = True  # the open step is a start-up step (not ``steady``)
        # NOTE [ Regions in a sample of the steps ] in attach/regions.py: whether the open step
        # times its regions (None: in neither arm), and each arm's steps' compute: count, sum,
        # squares
        self.region_arm: bool | None = None
        self.region_ab: tuple[list[int], list[int]] = ([0, 0, 0], [0, 0, 0])
        # NOTE [ The fast path ] in attach/run.py: steps whose batch came the short way, each
        # (asked, got, region arm), not yet written; ``handed``: when the step under way got its
        # batch (0: none under way); ``classified``: regions counted for a class so far
        self.fast: list[tuple[int, int, bool | None, int | None]] = []
        self.handed = 0
        self.classified = 0

    def region(self, key: str, start_ns: int, duration_ns: int) -> None:
        """A user region closed (``Profiler.region``): its figures, its span, its class."""
        self._pending_regions[key].append(duration_ns)
        self.session.spans.append(("main", f"region/{key}", start_ns, duration_ns))
        self.classify(key, start_ns, duration_ns)

    def compute_region(self, key: str, start_ns: int, duration_ns: int) -> None:
        """``region`` for a compute key (``Forward``, ``Backward``, ``Optimizer``: what ``pipeprof
        run`` times in every step), on its short path: a compute region counts in no class, so
        the regions nested in it are only taken off the stack (NOTE [ Regions on a short path ]
        in attach/regions.py)."""
        self._pending_regions[key].append(duration_ns)
        self.session.spans.append(("main", _SPAN_KEYS[key], start_ns, duration_ns))
        closed = self._closed
        while closed and closed[-1][0] >= start_ns:
            closed.pop()
        closed.append((start_ns, duration_ns))

    def region_timed(self, key: str, start_ns: int, duration_ns: int) -> None:
        """A region's duration as its timer measured it (CUDA events: the GPU's, known after
        the step), for the regions' figures."""
        self._pending_regions[key].append(duration_ns)

    def region_host(self, key: str, start_ns: int, duration_ns: int) -> None:
        """A CUDA-timed region's time on the loop's thread, as it closes: its CPU figures
        (``host_regions``, what the rules weigh against the step), its span on the loop's
        timeline (the trace's clock is the CPU's) and its class."""
        self._pending_host[key].append(duration_ns)
        self.session.spans.append(("main", f"region/{key}", start_ns, duration_ns))
        self.classify(key, start_ns, duration_ns)

    def classify(self, key: str, start_ns: int, duration_ns: int) -> None:
        """A region's time on the loop's thread, as it closes: counted for its class in the
        step under way (NOTE [ Step attribution ])."""
        # A region counts for its class only outside the regions nested in it, which closed
        # before it: "train_step" around Forward and Backward is compute, not overhead.
        inner, closed = 0, self._closed
        while closed and closed[-1][0] >= start_ns:
            inner += closed.pop()[1]
        closed.append((start_ns, duration_ns))
        kind = region_class(key)
        if kind in self._class_ns:
            self._class_ns[kind] += max(0, duration_ns - inner)
            self.classified += 1

    def comm(self, start_ns: int, duration_ns: int) -> None:
        """Time the step was blocked on communication measured off the loop's thread (DDP's
        all-reduce: NOTE [ Comm ] in collect/comm.py): a ``Comm`` region inside whatever region
        was open then (``Backward``), taken out of compute."""
        self._pending_regions["Comm"].append(duration_ns)
        self.session.spans.append(("main", "region/Comm", start_ns, duration_ns))
        self._class_ns["comm"] += duration_ns
        self.classified += 1

    def begin(
        self, t_req: int, wait: int, transfer: int, first: bool, starved: int | None = None
    ) -> None:
        """A step got its batch: it asked at ``t_req``, waited ``wait``, ``starved`` of it before
        the batch was ready (None: not known, all of it), and copied ``transfer``."""
        rec = self.record
        part = self._pending["first" if first else "steady"]
        self.first = first
        wait = max(0, wait)
        starved = wait if starved is None else min(max(0, starved), wait)
        part["wait"].append(wait)
        part["starved"].append(starved)
        part["handover"].append(wait - starved)
        part["transfer"].append(transfer)
        if rec.startup_ns is None:
            rec.startup_ns = wait
        rec.steps += 1
        rec.step_ring.append([t_req, wait, transfer, 0, int(first)])
        self._closed.clear()
        c = self._class_ns
        self._marks = (c["transfer"], c["overhead"], c["comm"], part)

    def end(self, handed: int, t_end: int) -> None:
        """Close the step whose batch was handed over at ``handed`` (NOTE [ Step attribution ])."""
        transfer_before, overhead_before, comm_before, _ = self._marks
        cpu = t_end - handed
        user = min(cpu, self._class_ns["transfer"] - transfer_before)
        overhead = min(cpu - user, self._class_ns["overhead"] - overhead_before)
        comm = min(cpu - user - overhead, self._class_ns["comm"] - comm_before)
        self.close(cpu - user - overhead - comm, overhead, user, comm)

    def add(self, t_req: int, wait: int, compute: int, overhead: int, first: bool) -> None:
        """A whole step measured from outside (Keras' batch hooks): no regions, no copy."""
        self.begin(t_req, wait, 0, first)
        self.close(compute, overhead, 0)

    def close(self, compute: int, overhead: int, user_transfer: int, comm: int = 0) -> None:
        """The open step's compute, overhead, the user's own transfer regions and comm, in ns."""
        part = self._marks[3]
        part["compute"].append(compute)
        if self.region_arm is not None:
            a = self.region_ab[0 if self.region_arm else 1]
            a[0] += 1
            a[1] += compute
            a[2] += compute * compute
        part["comm"].append(comm)
        part["overhead"].append(overhead)
        part["user_transfer"].append(user_transfer)
        row = self.record.step_ring[-1]
        row[2] += user_transfer
        row[3] = compute
        steps = part["step"]
        steps.append(row[1] + row[2] + compute + comm + overhead)
        if len(steps) >= FOLD_EVERY:
            self.fold()

    def settle(self) -> int:
        """Write the fast steps (``fast``: NOTE [ The fast path ] in attach/run.py): the step under
        way before them ends when the first one asked; each but the last ends when the next one
        asked; the last is left under way (``handed``), with the regions counted for a class
        since the step before them, which closed in its compute (the fast path stops at the
        first). Returns the compute written."""
        rows, self.fast = self.fast, []
        if not rows:
            return 0
        transfer0, overhead0, comm0, _ = self._marks
        first = rows[0][0] - self.handed
        self.close(max(0, first), 0, 0)
        t0s, t1s, arms, split = zip(*rows)
        waits = [b - a for a, b in zip(t0s, t1s)]
        # a worker's batch: starved until it was ready (None: all of it, not known)
        starved = [w if s is None else min(max(0, s), w) for w, s in zip(waits, split)]
        computes = [a - b for a, b in zip(t0s[1:], t1s)]
        part = self._pending["steady"]
        n = len(computes)
        if n:
            zeros = [0] * n
            handover = [w - s for w, s in zip(waits[:-1], starved)]
            for key, values in (("wait", waits[:-1]), ("starved", starved[:-1]),
                                ("handover", handover), ("transfer", zeros),
                                ("compute", computes), ("comm", zeros), ("overhead", zeros),
                                ("user_transfer", zeros)):  # fmt: skip
                part[key].extend(values)
            part["step"].extend(w + c for w, c in zip(waits, computes))
            self.record.steps += n
            self.record.step_ring.extend(
                [a, w, 0, c, 0] for a, w, c in zip(t0s, waits, computes)
            )
            for arm, c in zip(arms, computes):
                if arm is not None:
                    a = self.region_ab[0 if arm else 1]
                    a[0] += 1
                    a[1] += c
                    a[2] += c * c
        self.begin(t0s[-1], waits[-1], 0, False, starved[-1])
        self._marks = (transfer0, overhead0, comm0, part)
        self.region_arm = arms[-1]
        self.handed = t1s[-1]
        if len(part["step"]) >= FOLD_EVERY:
            self.fold()
        return int(max(0, first) + sum(computes))

    def fold(self) -> None:
        """Fold the per-step values gathered since the last fold into the record's Stats."""
        if self.fast:
            self.settle()
        rec = self.record
        for name, part in self._pending.items():
            for key, values in part.items():
                if values:
                    getattr(rec, name)[key].merge(Stat.of_many(values))
                    values.clear()
        for stats, pending in ((rec.regions, self._pending_regions),
                               (rec.host_regions, self._pending_host)):  # fmt: skip
            for key, values in pending.items():
                if values:
                    stats.setdefault(key, Stat()).merge(Stat.of_many(values))
                    values.clear()


def run_alone(source: Iterable[Any], session: Session, batches: int | None) -> None:
    """Iterate a profiled ``source`` with no training step, ``batches`` batches (None: all).

    Ctrl-C stops it and marks the session interrupted. The profile ends when the last batch is
    in, before the source is closed: shutting workers down or parsing a trace is not the
    pipeline's time.
    """
    session.start_ns = clock()
    cpu0 = time.process_time_ns()
    it = iter(source)
    try:
        for i, _ in enumerate(it):
            if batches is not None and i + 1 >= batches:
                break
    except KeyboardInterrupt:
        session.interrupted = True
    finally:
        session.end_ns = clock()
        session.meta["main_cpu_ns"] = time.process_time_ns() - cpu0
        it.close()  # type: ignore[attr-defined]


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
