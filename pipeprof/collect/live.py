"""What the live view shows while a loop runs (docs/live.md): figures read once a second from
counters the loaders keep anyway, the samplers' latest readings and psutil.

NOTE [ The live view ]
A loader keeps, as it hands each batch over, the time the loop waited for it and the part of that
during which the batch was not ready (``wait_ns``, ``starved_ns``: two additions a batch). The
live view's thread reads those and the loader's count of batches once a second, keeps the last
WINDOW_S of readings, and gives throughput and the wait's share of the window from their
differences. The limiting stage is the leaf stage with the most time so far in the session's
folded figures (stages are folded off the loop's path: at ``pipeprof run``'s snapshots, the
first 5 s after the first batch and every 30 s after, or every 65,536 records), so it trails the
loop by up to a snapshot. Each worker's CPU share and the host's CPU and memory come from psutil
(one read a second each), the GPU's utilisation and memory from the NVML sampler's latest
reading. Nothing of it runs in the loop's thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

WINDOW_S = 5.0  # throughput and wait shares over this much of the run


class LiveFigures:
    """Reads the figures of the loop's main loader (the one that has made the most batches)
    each ``tick`` (NOTE [ The live view ]). ``loaders``: the profiled loaders now; ``gpu``: the
    GPU sampler's latest readings (``[(util %, memory used MB)]``) or None."""

    def __init__(self, loaders: Callable[[], list[Any]],
                 gpu: Callable[[], list[tuple[Any, Any]]] | None = None) -> None:  # fmt: skip
        self.loaders = loaders
        self.gpu = gpu
        self.t0 = time.monotonic()
        self._seen: deque[tuple[float, int, int, int]] = deque()
        self._procs: dict[int, Any] = {}
        try:
            import psutil

            self._psutil: Any = psutil
            psutil.cpu_percent(None)  # the first call primes the next
        except ImportError:
            self._psutil = None

    def tick(self) -> dict[str, Any]:
        now = time.monotonic()
        loaders = [lo for lo in self.loaders() if getattr(lo, "seen", 0) is not None]
        main = max(loaders, key=lambda lo: lo.seen, default=None)
        fig: dict[str, Any] = {"elapsed_s": now - self.t0, "steps": 0, "epoch": 0,
                               "samples_per_s": None, "wait_share": None,
                               "starved_share": None, "stage": None, "workers": [],
                               "gpu": self._gpus(), "host": self._host()}  # fmt: skip
        if main is None:
            return fig
        seen, wait, starved = main.seen, main.wait_ns, main.starved_ns
        self._seen.append((now, seen, wait, starved))
        while len(self._seen) > 2 and now - self._seen[1][0] >= WINDOW_S:
            self._seen.popleft()
        t, s0, w0, st0 = self._seen[0]
        span = now - t
        size = getattr(main.user_loader, "batch_size", None) or 1
        fig.update(steps=seen, epoch=main.passes, samples=seen * size)
        if span > 0 and len(self._seen) > 1:
            fig["samples_per_s"] = (seen - s0) * size / span
            fig["wait_share"] = min(1.0, (wait - w0) / 1e9 / span)
            fig["starved_share"] = min(1.0, (starved - st0) / 1e9 / span)
        fig["stage"] = _stage(main.session)
        fig["workers"] = self._workers(main)
        return fig

    def _workers(self, loader: Any) -> list[dict[str, Any]]:
        it = loader.current() if hasattr(loader, "current") else None
        pids = [w.pid for w in getattr(it, "_workers", []) or []]
        out = []
        for i, pid in enumerate(pids):
            out.append({"id": i, "pid": pid, "cpu": self._cpu(pid)})
        return out

    def _cpu(self, pid: int) -> float | None:
        if self._psutil is None:
            return None
        proc = self._procs.get(pid)
        try:
            if proc is None:
                proc = self._procs[pid] = self._psutil.Process(pid)
                proc.cpu_percent(None)  # primes the next
                return None
            return float(proc.cpu_percent(None)) / 100
        except Exception:  # gone: n/a
            self._procs.pop(pid, None)
            return None

    def _host(self) -> dict[str, Any] | None:
        if self._psutil is None:
            return None
        try:
            mem = self._psutil.virtual_memory()
            return {"cpu": self._psutil.cpu_percent(None) / 100, "mem_used_mb":
                    (mem.total - mem.available) / 2**20, "mem_total_mb": mem.total / 2**20}
        except Exception:
            return None

    def _gpus(self) -> list[dict[str, Any]] | None:
        if self.gpu is None:
            return None
        try:
            got = self.gpu()
        except Exception:
            return None
        return [{"index": i, "util": _num(u), "mem_used_mb": _num(m)}
                for i, (u, m) in enumerate(got)] or None  # fmt: skip


def gpu_readings(samplers: list[Any]) -> list[tuple[Any, Any]]:
    """The GPU sampler's latest (utilisation %, memory used MB) per device, of the running
    ``samplers``; [] without one."""
    for sampler in samplers:
        latest = getattr(sampler, "latest", None)
        if latest is not None:
            return latest()  # type: ignore[no-any-return]
    return []


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _stage(session: Any) -> dict[str, Any] | None:
    """The leaf stage with the most time so far, and its share of the leaves' (NOTE [ The live
    view ]); None before any stage was folded."""
    totals: dict[str, int] = {}
    for paths in list(getattr(session, "stages", {}).values()):
        for path, stat in list(paths.items()):
            totals[path] = totals.get(path, 0) + stat.total_ns
    leaves = {p: t for p, t in totals.items()
              if not any(q.startswith(p + "/") for q in totals)}  # fmt: skip
    total = sum(leaves.values())
    if not total:
        return None
    top = max(leaves, key=lambda p: leaves[p])
    return {"path": top, "share": leaves[top] / total}
