"""Time in collective communication, kept apart from compute (the step's ``comm`` part).

NOTE [ Comm ]
DDP's gradient all-reduce runs in C++ (the reducer), not through ``torch.distributed``'s Python
functions, so pipeprof times it with a DDP communication hook (``register_comm_hook``, public):
the hook pipeprof registers is torch's own ``allreduce_hook`` (the documented Python equivalent
of DDP's default, same division, same all-reduce) or the user's hook, wrapped. The wrapper reads
the clock when DDP hands it a bucket (its gradients are ready) and, through ``Future.then``,
when the bucket's all-reduce is done.

A bucket's all-reduce runs while backward computes the next buckets' gradients (overlap). What
the step loses to communication is the time after the *last* bucket was handed over (backward's
compute is done) until the last all-reduce completes: DDP's reducer blocks backward until then.
That is the step's ``comm`` (exposed) time, taken out of compute: on a rank whose peers are
slower, it is the wait for them. The time buckets spent in flight in all is kept too
(``in_flight_s``, the union of their intervals), and its overlapped part (``in_flight_s`` minus
exposed), reported, never counted twice.

Explicit collectives (``torch.distributed.all_reduce(t)``, ``barrier()``...) are ``Comm``
regions: under ``pipeprof run`` the functions of ``torch.distributed`` are wrapped (only the
blocking calls: ``async_op=True`` returns at once and its wait is the caller's ``work.wait()``);
with the hand-written Profiler, ``with prof.region("Comm"):``.

NOTE [ Comm on the GPU ]
On the GPU with NCCL a collective's future completes when its kernels are queued on the GPU's
stream, not when they end: the host's view of a bucket is a few microseconds, and the GPU's wait
for the all-reduce lands wherever the host next waits for the GPU (in compute, or in the wait
that CUDA events move to compute: NOTE [ Step attribution ]). So where the Profiler times
compute with CUDA events and a bucket lives on a GPU, the hook also records an event on the
current stream when DDP hands it the bucket (its gradients are computed, on the GPU) and one in
``Future.then``'s callback, which torch runs on streams that wait for the all-reduce's kernels
(the all-reduce is done, on the GPU). The events are read back without synchronising, a group
per step, once they completed (``resolve``), and at the end. A step's exposed comm on the GPU is
the time from the last bucket's gradients to the last all-reduce done, as on the host. Summed
over the start-up steps and over the steady steps, with the host's view of the same steps beside
it, the GPU's excess is taken out of compute into comm by the analysis (never out of wait, never
set off against other comm: analyze/loop.py ``_comm_shift``); ``meta.comm.gpu`` keeps the GPU's
in-flight, overlapped and exposed time. pipeprof's events never fail DDP's step: an error ends
the GPU's view with a note.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any

from pipeprof.core.recorder import clock

# the blocking collectives of torch.distributed timed as Comm regions under ``pipeprof run``
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather",
    "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "monitored_barrier",
)  # fmt: skip


class CommClock:
    """The all-reduces of one Profiler's steps: intervals recorded on DDP's and the process
    group's threads (a deque append each), folded into the step by the loop's thread."""

    RESOLVE_EVERY = 16  # steps of GPU events kept before trying to read them back

    def __init__(self, events: Callable[[], Any] | None = None) -> None:
        self._done: deque[tuple[int, int]] = deque()  # (handed to the hook, all-reduce done) ns
        self.buckets = 0
        self.in_flight_ns = 0
        self.exposed_ns = 0
        self.hook = ""
        #: makes the CUDA events of GPU buckets (None: the host's view only); NOTE [ Comm on
        #: the GPU ]
        self.events = events
        self.note: str | None = None  # why the GPU's view ended early
        self._gpu_done: deque[tuple[int, Any, Any]] = deque()  # (t_call, handed, done events)
        # a step's GPU events: (a start-up step, the host's exposed ns, [(t_call, handed, done)])
        self._gpu_steps: deque[tuple[bool, int, list[tuple[int, Any, Any]]]] = deque()
        self.gpu: dict[str, int] = {}  # ns and counts, replaced whole (read from any thread)

    def record(self, t_call: int, t_done: int) -> None:
        self._done.append((t_call, t_done))

    def record_gpu(self, t_call: int, handed: Any, done: Any) -> None:
        self._gpu_done.append((t_call, handed, done))

    def give_up(self, exc: BaseException) -> None:
        """CUDA events failed: the host's view from now on, and a note that says so."""
        self.events = None
        self.note = (
            f"DDP's all-reduce is timed from the host only: its CUDA events failed "
            f"({type(exc).__name__}: {exc})"
        )

    def fold(self, log: Any, handed: int, t_end: int) -> None:
        """The buckets finished since the last fold, as the ``comm`` of the step that ran from
        ``handed`` to ``t_end`` (a ``StepLog``); see NOTE [ Comm ]."""
        exposed = 0
        if self._done:
            spans = []
            while self._done:
                t_call, t_done = self._done.popleft()
                spans.append((max(t_call, handed), min(t_done, t_end)))
            self.buckets += len(spans)
            last_call = max(c for c, _ in spans)
            exposed = max(0, max(d for _, d in spans) - last_call)
            if exposed:
                log.comm(last_call, exposed)
                self.exposed_ns += exposed
            self.in_flight_ns += _union(spans)
        if self._gpu_done:
            pairs = []
            while self._gpu_done:
                pair = self._gpu_done.popleft()
                if pair[0] >= handed:  # a backward before this step's batch is not its comm
                    pairs.append(pair)
            if pairs:
                pairs.sort(key=lambda p: p[0])  # the order DDP handed the buckets over
                self._gpu_steps.append((log.first, exposed, pairs))
                if len(self._gpu_steps) >= self.RESOLVE_EVERY:
                    self.resolve(block=False)

    def resolve(self, block: bool) -> None:
        """Read back the GPU events of the steps whose all-reduces completed, in order (all of
        them, waiting for the GPU, with ``block``): NOTE [ Comm on the GPU ]. An error reading
        them ends the GPU's view with a note; it never reaches the training loop."""
        if not self._gpu_steps:
            return
        g = dict(self.gpu)
        try:
            while self._gpu_steps:
                first, host, pairs = self._gpu_steps[0]
                events = [e for _, a, b in pairs for e in (a, b)]
                if block:
                    for e in events:
                        e.synchronize()
                elif not all(e.query() for e in events):
                    break
                self._gpu_steps.popleft()
                ref = pairs[0][1]  # the first bucket handed over
                spans = [(round(ref.elapsed_time(a) * 1e6), round(ref.elapsed_time(b) * 1e6))
                         for _, a, b in pairs]  # fmt: skip
                exposed = max(0, max(b for _, b in spans) - max(a for a, _ in spans))
                part = "first" if first else "steady"
                g[f"exposed_{part}"] = g.get(f"exposed_{part}", 0) + exposed
                g[f"host_{part}"] = g.get(f"host_{part}", 0) + host
                g["in_flight"] = g.get("in_flight", 0) + _union(spans)
                g["buckets"] = g.get("buckets", 0) + len(pairs)
                g["steps"] = g.get("steps", 0) + 1
        except Exception as exc:  # a CUDA error: the steps read so far stand
            self._gpu_steps.clear()
            self.give_up(exc)
        self.gpu = g

    def to_dict(self) -> dict[str, Any]:
        """What ``session.meta["comm"]`` holds: seconds, the overlapped part of in-flight; with
        ``gpu``, the same as CUDA events saw it, and the host's exposed time of the same steps
        by group (start-up, steady), which the analysis compares."""
        out: dict[str, Any] = {
            "hook": self.hook,
            "buckets": self.buckets,
            "exposed_s": round(self.exposed_ns / 1e9, 9),
            "in_flight_s": round(self.in_flight_ns / 1e9, 9),
            "overlapped_s": round(max(0, self.in_flight_ns - self.exposed_ns) / 1e9, 9),
        }
        g = self.gpu
        if g:
            exposed = g.get("exposed_first", 0) + g.get("exposed_steady", 0)
            out["gpu"] = {
                "steps": g["steps"],
                "buckets": g["buckets"],
                "exposed_s": round(exposed / 1e9, 9),
                "in_flight_s": round(g["in_flight"] / 1e9, 9),
                "overlapped_s": round(max(0, g["in_flight"] - exposed) / 1e9, 9),
            }
            for part in ("first", "steady"):
                out["gpu"][f"{part}_exposed_s"] = round(g.get(f"exposed_{part}", 0) / 1e9, 9)
                out["gpu"][f"{part}_host_exposed_s"] = round(g.get(f"host_{part}", 0) / 1e9, 9)
        return out


def _union(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(spans):
        if b <= a:
            continue
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def timed_hook(hook: Callable[..., Any], target: Callable[[], CommClock | None]) -> Any:
    """``hook`` (a DDP communication hook) timed into the CommClock ``target()`` gives when DDP
    calls it (None: not timed). Its name and signature are the hook's: DDP reads both."""

    name = getattr(hook, "__qualname__", type(hook).__name__)

    @functools.wraps(hook)
    def pipeprof_timed(state: Any, bucket: Any) -> Any:
        comm = target()
        if comm is None:
            return hook(state, bucket)
        comm.hook = name
        handed = None
        if comm.events is not None and bucket.buffer().is_cuda:  # NOTE [ Comm on the GPU ]
            try:
                handed = comm.events()
                handed.record()
            except Exception as exc:  # the host's view stands; DDP never sees pipeprof fail
                comm.give_up(exc)
                handed = None
        t_call = clock()
        fut = hook(state, bucket)

        def done(f: Any) -> Any:
            value = f.value()  # a failed all-reduce raises here, as it would without pipeprof
            comm.record(t_call, clock())
            events = comm.events
            if handed is not None and events is not None:
                try:
                    end = events()
                    end.record()  # on a stream that waits for the all-reduce's kernels
                except Exception as exc:
                    comm.give_up(exc)
                else:
                    comm.record_gpu(t_call, handed, end)
            return value

        return fut.then(done)

    pipeprof_timed.pipeprof_timed = True  # type: ignore[attr-defined]
    return pipeprof_timed


def default_hook() -> Callable[..., Any]:
    """DDP's default all-reduce as a hook: torch's ``allreduce_hook`` (same results)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook  # type: ignore[no-any-return]


def time_ddp(model: Any, target: Callable[[], CommClock | None], hook: Any = None,
             state: Any = None) -> None:  # fmt: skip
    """Register ``hook`` (default: DDP's all-reduce) on the DDP ``model``, timed. DDP takes one
    hook per model, registered before its first backward."""
    chosen = hook if hook is not None else default_hook()
    state = state if hook is not None else model.process_group
    model.register_comm_hook(state, timed_hook(chosen, target))


def collective(fn: Callable[..., Any], region: Callable[[], Any]) -> Callable[..., Any]:
    """A blocking collective of ``torch.distributed`` timed as a ``Comm`` region: ``region()``
    gives the Timer of the step under way (None: not timed)."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        timer = region()
        if timer is None or kwargs.get("async_op"):
            return fn(*args, **kwargs)
        timer.start("Comm")
        try:
            return fn(*args, **kwargs)
        finally:
            timer.end("Comm")

    return timed
