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

On the GPU with NCCL a collective's future completes when its kernels are queued on the GPU's
stream, not when they end: the times here are the host's view, and the GPU's own comm time is
not measured (docs/distributed.md says what is covered).
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

    def __init__(self) -> None:
        self._done: deque[tuple[int, int]] = deque()  # (handed to the hook, all-reduce done) ns
        self.buckets = 0
        self.in_flight_ns = 0
        self.exposed_ns = 0
        self.hook = ""

    def record(self, t_call: int, t_done: int) -> None:
        self._done.append((t_call, t_done))

    def fold(self, log: Any, handed: int, t_end: int) -> None:
        """The buckets finished since the last fold, as the ``comm`` of the step that ran from
        ``handed`` to ``t_end`` (a ``StepLog``); see NOTE [ Comm ]."""
        if not self._done:
            return
        spans = []
        while self._done:
            t_call, t_done = self._done.popleft()
            spans.append((max(t_call, handed), min(t_done, t_end)))
        self.buckets += len(spans)
        last_call = max(c for c, _ in spans)
        last_done = max(d for _, d in spans)
        exposed = last_done - last_call
        if exposed > 0:
            log.comm(last_call, exposed)
            self.exposed_ns += exposed
        self.in_flight_ns += _union(spans)

    def to_dict(self) -> dict[str, Any]:
        """What ``session.meta["comm"]`` holds: seconds, the overlapped part of in-flight."""
        return {
            "hook": self.hook,
            "buckets": self.buckets,
            "exposed_s": round(self.exposed_ns / 1e9, 9),
            "in_flight_s": round(self.in_flight_ns / 1e9, 9),
            "overlapped_s": round(max(0, self.in_flight_ns - self.exposed_ns) / 1e9, 9),
        }


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
        t_call = clock()
        fut = hook(state, bucket)

        def done(f: Any) -> Any:
            comm.record(t_call, clock())
            return f.value()

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
