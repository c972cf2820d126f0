"""How many workers the machine holds (docs/findings.md#workers-needed): cores, RAM and shared
memory, each a limit on the worker counts the what-if table and ``workers-needed`` recommend.

NOTE [ The workers' budget ]
- **Cores**: as the rules count them (a core left to the training process).
- **RAM**: each worker adds its private memory (USS, NOTE [ Private memory ] in
  collect/samplers/host.py), its pages shared with the training process added once. The
  workers' median peak USS, over the memory the machine had available at the last reading
  (``host.mem_available_mb``, which counts the workers already running), gives the workers that
  can be added within MARGIN of it. None where no worker's USS was read.
- **Shared memory**: each worker holds ``prefetch_factor`` batches in ``/dev/shm`` (NOTE [ Shared
  memory ] in collect/torch/shm.py); the free space read at the pass's start, before this
  loader's workers wrote to it, within MARGIN, gives the workers whose batches fit. None where it
  was not read (no workers, not Linux).
The lowest of the three limits a recommendation; the report says which.
"""

from __future__ import annotations

import statistics
from typing import Any, TypedDict

from pipeprof.analyze.memory import worker_pids

MARGIN = 0.9  # a budget uses at most this share of the memory free


class Budget(TypedDict):
    """The most workers each resource holds (None: not known), and what each costs."""

    cores: int
    ram: int | None
    shm: int | None
    worker_mb: float | None  # a worker's private memory (median peak USS)
    available_mb: float | None  # the machine's available memory at the last reading
    batch_mb: float | None  # a batch's bytes, in shared memory while in flight


def budget(report: dict[str, Any], cores: int) -> Budget:
    """The workers each of cores, RAM and shared memory holds (NOTE [ The workers' budget ])."""
    meta = report.get("meta") or {}
    n = int(meta.get("num_workers") or 0)
    host = report.get("host") or {}
    mine = worker_pids(report)
    private = [p["uss_max_mb"] for p in host.get("per_process") or []
               if p.get("pid") in mine and p.get("uss_max_mb")]  # fmt: skip
    worker_mb = statistics.median(private) if private else None
    available = host.get("mem_available_mb")
    ram = n + int(MARGIN * available / worker_mb) if worker_mb and available is not None else None
    shm = meta.get("shm") or {}
    batch, free = shm.get("batch_mb"), shm.get("free_mb")
    prefetch = shm.get("prefetch_factor") or 2
    held = None
    if batch and free is not None:
        held = max(0, int((MARGIN * free / batch - 1) // prefetch))
    return {"cores": max(1, cores - 1), "ram": ram, "shm": held,
            "worker_mb": round(worker_mb, 1) if worker_mb else None,
            "available_mb": round(available, 1) if available is not None else None,
            "batch_mb": batch}  # fmt: skip


def limit(held: Budget, workers: int) -> str | None:
    """Which memory ``workers`` workers do not fit in: "RAM", "shared memory", or None."""
    if held["ram"] is not None and workers > held["ram"]:
        return "RAM"
    if held["shm"] is not None and workers > held["shm"]:
        return "shared memory"
    return None


def memory_cap(held: Budget) -> tuple[int | None, str | None]:
    """The most workers memory holds, and which memory; (None, None) where neither is known."""
    known = [(v, name) for v, name in ((held["ram"], "RAM"), (held["shm"], "shared memory"))
             if v is not None]  # fmt: skip
    if not known:
        return None, None
    return min(known)
