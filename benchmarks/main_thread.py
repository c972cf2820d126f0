"""The training process's main thread, plain and profiled, taken apart call by call.

Usage: python benchmarks/main_thread.py [--root /tmp/jpeg160] [--rounds 14]

Each round runs one epoch of the ``benchmarks/overhead.py`` pipeline (1,024 JPEGs of 160 px,
batch 32, 2 workers started afresh) plain and under ``pipeprof.Profiler().wrap(loader)``, in an
order rotated from round to round, and reads this thread's CPU clock (``time.thread_time_ns``)
and its minor page faults (``RUSAGE_THREAD``) around each call the loop makes:

  Profiler()   start()   wrap()   the first batch (``iter()`` and ``next()``: the workers fork)
  the later batches   of which inside torch's own ``__next__``   stop()

and, for the profiled epoch, what the report names of it: ``main_s`` + ``loop_s`` (pipeprof's
bookkeeping per batch and per step) and ``setup_s``. Prints the medians over the rounds (the
first round warms up and is not counted) and, for the later batches, the per-round differences.
The samplers' threads and the workers are not in these figures (``overhead.py`` has them).
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import time
from typing import Any

from _common import jpeg160_images
from overhead import make_loader
from torch.utils.data import dataloader

import pipeprof

_IN_TORCH = [0, 0]  # CPU ns and faults inside torch's __next__ since the last reset


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _counting(next_: Any) -> Any:
    def wrapped(self: Any) -> Any:
        t, f = time.thread_time_ns(), _faults()
        try:
            return next_(self)
        finally:
            _IN_TORCH[0] += time.thread_time_ns() - t
            _IN_TORCH[1] += _faults() - f

    return wrapped


def epoch(loader: Any, variant: str) -> dict[str, float]:
    gc.collect()
    out: dict[str, float] = {}
    clock = time.thread_time_ns
    t, f0 = clock(), _faults()
    prof: Any = None
    if variant == "plain":
        source: Any = loader
    else:
        prof = pipeprof.Profiler()
        out["Profiler()"], t = clock() - t, clock()
        prof.start()
        out["start()"], t = clock() - t, clock()
        source = prof.wrap(loader)
        out["wrap()"], t = clock() - t, clock()
    it = iter(source)
    next(it)
    out["first batch"], t = clock() - t, clock()
    f1 = _faults()
    _IN_TORCH[:] = [0, 0]
    for _ in it:
        pass
    out["later batches"], t = clock() - t, clock()
    out["  in torch's __next__"] = _IN_TORCH[0]
    out["later batches: faults"] = _faults() - f1
    if prof is not None:
        prof.stop()
        out["stop()"] = clock() - t
        out["all: faults"] = _faults() - f0
        o = prof.report()["overhead"]
        out["named: main_s + loop_s"] = (o["main_s"] + o["loop_s"]) * 1e9
        out["named: setup_s"] = o["setup_s"] * 1e9
    else:
        out["all: faults"] = _faults() - f0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/tmp/jpeg160", help="the JPEGs (made there if missing)")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=14)
    args = ap.parse_args(argv)
    jpeg160_images(args.root, args.images)
    loader = make_loader(args.root, 2, 32)
    dataloader._BaseDataLoaderIter.__next__ = _counting(dataloader._BaseDataLoaderIter.__next__)
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "pipeprof": []}
    for r in range(args.rounds + 1):
        for variant in ("plain", "pipeprof") if r % 2 else ("pipeprof", "plain"):
            out = epoch(loader, variant)
            if r:
                runs[variant].append(out)
    print(f"main thread, ms of CPU an epoch (faults: counts); medians of {args.rounds} rounds")
    print(f"{'':26s}{'plain':>10s}{'pipeprof':>10s}{'added':>10s}")
    for key in runs["pipeprof"][0]:
        scale = 1.0 if "faults" in key else 1e6
        b = statistics.median(x[key] for x in runs["pipeprof"]) / scale
        plain = [x[key] for x in runs["plain"] if key in x]
        a = statistics.median(plain) / scale if plain else 0.0
        print(f"{key:26s}{a:10.2f}{b:10.2f}{b - a:+10.2f}")
    diff = sorted(
        (p["later batches"] - q["later batches"]) / 1e6
        for p, q in zip(runs["pipeprof"], runs["plain"], strict=True)
    )
    print("later batches, added per round (ms):", " ".join(f"{d:+.2f}" for d in diff))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
