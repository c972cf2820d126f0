"""The rule of NOTE [ Unprofiled batches ] (collect/torch/loader.py) stated again, from its
constants, so that the tests derive which batches a profile times from the rule, not from
counts written out by hand.

Each batch a profile yields, in order, gets an arm: ``"timed"`` (profiled, outside the
comparison: the profile's first TIMED_FIRST batches, a short pass's, and a cold profiled one),
``"on"`` (profiled, compared), ``"off"`` (fetched unprofiled, compared), ``"cold"`` (fetched
unprofiled, the first of a pass or of a worker: compared with none) or ``"lean"`` (in the training
process, fetched unprofiled on the short path, compared with none: NOTE [ The short path ]).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pipeprof.collect.torch.loader import (
    AB_PAIRS_EVERY,
    AB_PAIRS_FIRST,
    SAMPLE_MIN_BATCHES,
    TIMED_FIRST,
)
from pipeprof.core.recorder import STAGE_EVERY

PROFILED = ("timed", "on")


def arms(passes: Sequence[int], workers: int = 0, every: int = STAGE_EVERY) -> list[str]:
    """The arm of each batch yielded over passes of ``passes[i]`` batches each (a map-style
    loader of that length, or the ``batches`` a profile takes of it), with ``workers`` worker
    processes started afresh for each pass (taking its batches in turn)."""
    out: list[str] = []
    seen = 0
    for p, n in enumerate(passes):
        sampled = every >= 2 and n >= (SAMPLE_MIN_BATCHES if p == 0 else 1)
        for i in range(n):
            if not sampled:
                out.append("timed")
            elif not workers:  # the training process's rule, on the profile's count
                s = seen + i
                pos, on_at = s % every, every // 2
                cycle = (s + (on_at - pos) % every - TIMED_FIRST) // every
                paired = cycle < AB_PAIRS_FIRST or not cycle % AB_PAIRS_EVERY
                if s < TIMED_FIRST:
                    out.append("timed")
                elif pos == on_at and paired:  # a cycle's batch profiled, in the paired ones
                    out.append("on" if i else "timed")
                elif not i:
                    out.append("cold")
                else:  # the batch before a compared profiled one is compared; the others: lean
                    compared = paired and pos == (on_at - 1) % every
                    out.append("off" if compared else "lean")
            else:  # each worker's rule, on its own count since its start
                phase = seen // workers % every
                first = -(-max(0, TIMED_FIRST - seen) // workers)
                k = i // workers
                if k < first:
                    out.append("timed")
                elif (k + phase) % every == every // 2:
                    out.append("on" if k else "timed")
                else:
                    out.append("off" if k else "cold")
        seen += n
    return out


def counts(passes: Sequence[int], workers: int = 0, every: int = STAGE_EVERY) -> Counter[str]:
    """How many batches of each arm (``arms``); ``"profiled"``: those whose stages were timed."""
    c = Counter(arms(passes, workers, every))
    c["profiled"] = c["timed"] + c["on"]
    c["unprofiled"] = c["off"] + c["cold"] + c["lean"]
    return c


def timed_indices(passes: Sequence[int], workers: int = 0, every: int = STAGE_EVERY) -> list[int]:
    """The indices (over the whole profile) of the batches whose stages were timed."""
    return [i for i, arm in enumerate(arms(passes, workers, every)) if arm in PROFILED]


def cpu_reads(session) -> float:
    """The most steps of a profile that its CPU-time reads sent through the generators, one
    each CPU_GAP_NS of the steps' span (NOTE [ CPU training shares the cores ] in profiler.py):
    a slower run has more of them, so a bound on the steps fetched the fast way leaves them out
    and holds whatever the machine's load."""
    from pipeprof.profiler import CPU_GAP_NS

    ring = list(session.loop.step_ring)
    last = ring[-1]
    return (last[0] + last[1] + last[2] + last[3] - ring[0][0]) / CPU_GAP_NS + 1
