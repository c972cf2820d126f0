"""The shared memory a loader's workers need, against what ``/dev/shm`` has (docs/findings.md,
"shm-too-small").

NOTE [ Shared memory ]
A worker collates each batch's tensors into shared memory (files in ``/dev/shm``, a tmpfs;
containers get 64 MB unless told otherwise) and the training process maps them. torch reserves
the file's pages as it makes it: where the tmpfs is full the worker fails ("unable to allocate
shared memory(shm) ... No space left on device"; without the reservation, a bus error). Up to
``num_workers × prefetch_factor`` batches are in flight, and the loop holds the one it is using
while the next arrives: a loader needs about ``(num_workers × prefetch_factor + 1) × batch
bytes`` (IN_FLIGHT_EXTRA: the one held). Pinning (``pin_memory=True``) copies each batch out of
shared memory into page-locked RAM, which the pin thread's queue holds (PINNED_BATCHES); it
frees the shared memory no later.

The tmpfs's free space is read at each pass's start (``statvfs``, about 2 µs), before the
workers write to it; the batch's bytes at its first batch (what the loader measures anyway).
``need`` is then compared with it, once a pass, in the training process. Where it does not fit,
a line goes to stderr at once (the failure usually comes a few batches later) and the facts go
to ``meta["shm"]``: the report's ``shm-too-small`` finding gives the largest configuration that
fits (MARGIN of the free space). A worker's failure to get shared memory, as it passes through
the pass on its way to the user unchanged, is noted there too (``failed``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

SHM_PATH = "/dev/shm"
IN_FLIGHT_EXTRA = 1  # the batch the loop holds while the next arrives
PINNED_BATCHES = 2  # page-locked RAM a pinning loader holds: the pin queue's and the loop's
MARGIN = 0.9  # a configuration fits in this share of the free space
FAILED = ("unable to allocate shared memory", "out of shared memory", "bus error")


def free_mb(path: str = SHM_PATH) -> tuple[float, float] | None:
    """(free, size) of the tmpfs at ``path`` in MB; None where it cannot be read."""
    try:
        got = os.statvfs(path)
    except OSError:
        return None
    return got.f_bavail * got.f_frsize / 2**20, got.f_blocks * got.f_frsize / 2**20


def need(loader: Any, batch_bytes: int, free: tuple[float, float] | None) -> dict[str, Any]:
    """What the loader's workers need of shared memory for batches of ``batch_bytes``, against
    ``free`` read at the pass's start (NOTE [ Shared memory ])."""
    workers, prefetch = loader.num_workers, loader.prefetch_factor or 2
    batch_mb = batch_bytes / 2**20
    in_flight = workers * prefetch + IN_FLIGHT_EXTRA
    got: dict[str, Any] = {
        "path": SHM_PATH,
        "batch_mb": round(batch_mb, 3),
        "in_flight": in_flight,
        "need_mb": round(in_flight * batch_mb, 1),
        "pinned_mb": round(PINNED_BATCHES * batch_mb, 1) if loader.pin_memory else 0.0,
        "free_mb": round(free[0], 1) if free else None,
        "size_mb": round(free[1], 1) if free else None,
        "num_workers": workers,
        "prefetch_factor": prefetch,
        "batch_size": loader.batch_size,
    }
    got["fits"] = free is None or got["need_mb"] <= free[0]
    return got


def warn(facts: dict[str, Any], label: str) -> None:
    """The line on stderr when a loader's batches will not fit (NOTE [ Shared memory ])."""
    print(
        f"pipeprof: {label}'s workers need about {facts['need_mb']:,.0f} MB of shared memory "
        f"({facts['in_flight']} batches of {facts['batch_mb']:,.1f} MB in flight) but "
        f"{facts['path']} has {facts['free_mb']:,.0f} MB free: a worker will fail to allocate "
        "its batch (the report says what fits)",
        file=sys.stderr,
    )


def failure(exc: BaseException) -> str | None:
    """The first line of a worker's shared-memory failure, or None for any other exception."""
    text = str(exc)
    lower = text.lower()
    if not any(f in lower for f in FAILED):
        return None
    lines = [line for line in text.splitlines() if any(f in line.lower() for f in FAILED)]
    return (lines[-1] if lines else text.splitlines()[0]).strip()[:300]
