"""Memory of a loop profile over many steps: it must stay flat (aggregates + bounded rings).

    .venv/bin/python benchmarks/loop_memory.py --steps 1000000

Profiles a loop over a plain iterable (pipeprof's per-step path: the wait around ``next()``, a
``Forward`` region, step attribution) and prints Python heap (tracemalloc) and RSS at
checkpoints, plus the per-step cost of the profiled loop against the same loop unprofiled.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import psutil
from _common import emit

import pipeprof


def plain(steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        pass
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--tracemalloc", action="store_true", help="also trace the Python heap (slow)")
    args = ap.parse_args()
    marks = sorted({args.steps // 100, args.steps // 10, args.steps // 2, args.steps})
    proc = psutil.Process()
    if args.tracemalloc:
        tracemalloc.start()
    prof = pipeprof.Profiler(sample_hz=0)
    rows = []
    t0 = time.perf_counter()
    with prof:
        for i, _ in enumerate(prof.wrap(range(args.steps)), 1):
            with prof.region("Forward"):
                pass
            if i in marks:
                heap = tracemalloc.get_traced_memory()[0] if args.tracemalloc else 0
                rows.append(
                    {
                        "steps": i,
                        "heap_mb": round(heap / 2**20, 2),
                        "rss_mb": round(proc.memory_info().rss / 2**20, 1),
                        "elapsed_s": round(time.perf_counter() - t0, 2),
                    }
                )
                print(rows[-1], flush=True)
    elapsed = time.perf_counter() - t0
    tracemalloc.stop()
    report = prof.report()
    assert report["loop"]["steps"] == args.steps
    base = plain(args.steps)
    out = {
        "rows": rows,
        "profiled_us_per_step": round(elapsed / args.steps * 1e6, 3),
        "plain_us_per_step": round(base / args.steps * 1e6, 3),
        "heap_growth_mb_from_1pct": round(rows[-1]["heap_mb"] - rows[0]["heap_mb"], 2),
        "rss_growth_mb_from_1pct": round(rows[-1]["rss_mb"] - rows[0]["rss_mb"], 1),
    }
    emit(out, args.json)


if __name__ == "__main__":
    main()
