"""CPU cost of the host sampler thread (``HostSampler``) at its default rate, with worker children.

Usage: python benchmarks/sampler_cost.py [--children 2] [--loader] [--hz 10] [--seconds 5]
       [--runs 5]

Each run starts ``--children`` child processes, then a ``HostSampler(hz=--hz)``, waits for it to
prime plus 0.5 s (so start-up and the psutil import are not counted), and measures a window of
``--seconds``: the CPU time of the sampler thread ``pipeprof-host`` alone (its ``cpu_ns`` when
``Sampler`` keeps one, else ``/proc/self/task/<tid>/schedstat``, time on CPU in ns) and the samples
it took (``lateness.count``), to confirm the rate is kept. The children are either forked
``multiprocessing`` processes that spin 2 ms and sleep 18 ms in a loop (about 10 % of a core
each; the default), or with ``--loader`` the workers of a torch ``DataLoader(num_workers=N,
persistent_workers=True)`` over a dummy dataset (each item sleeps 2 ms), iterated by the main
thread throughout (torch's threads make the main process realistic). Prints each run and the
median: sampler CPU in % of one core, microseconds of CPU per sample, and samples per second
(and children look-ups per second where the sampler counts them, ``HostSampler.lookups``). For
scale: a sampler thread that does nothing costs ~0.1 ms a sample here (waking up).
Linux only (schedstat); the sampler itself runs anywhere psutil does.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import threading
import time
from typing import Any

from pipeprof.collect.samplers import HostSampler


def _spin(stop: Any) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.002:
            pass
        time.sleep(0.018)


def _thread_cpu_ns(sampler: HostSampler) -> int:
    if hasattr(sampler, "cpu_ns"):
        return int(sampler.cpu_ns)
    (thread,) = [t for t in threading.enumerate() if t.name == sampler.thread_name]
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[0])


class _Items:
    """A dummy map-style dataset: 2 ms per item (sleep), a small tensor each."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> Any:
        import torch

        time.sleep(0.002)
        return torch.full((64,), float(i))


def one_run(args: argparse.Namespace) -> tuple[float, float, float, float]:
    """(% of a core, µs CPU per sample, samples per second, children look-ups per second; -1
    where the sampler does not count them) of the sampler over one window."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    procs = []
    loader_iter: Any = None
    if args.loader:
        from torch.utils.data import DataLoader

        items: Any = _Items()
        loader = DataLoader(items, batch_size=8, num_workers=args.children, persistent_workers=True)
        loader_iter = iter(loader)
        next(loader_iter)  # the workers are up
    else:
        procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.children)]
        for p in procs:
            p.start()
    sampler = HostSampler(hz=args.hz)
    sampler.start()
    try:
        while not sampler.available:
            time.sleep(0.01)
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            next(loader_iter) if loader_iter is not None else time.sleep(0.05)
        cpu0, n0, t0 = _thread_cpu_ns(sampler), sampler.lateness.count, time.perf_counter()
        looks0 = getattr(sampler, "lookups", -1)
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            next(loader_iter) if loader_iter is not None else time.sleep(0.05)
        cpu1, n1, t1 = _thread_cpu_ns(sampler), sampler.lateness.count, time.perf_counter()
        looks1 = getattr(sampler, "lookups", -1)
    finally:
        sampler.stop()
        stop.set()
        for p in procs:
            p.join(5)
        del loader_iter
    wall, ticks = t1 - t0, max(1, n1 - n0)
    looks = (looks1 - looks0) / wall if looks0 >= 0 else -1.0
    return 100 * (cpu1 - cpu0) / 1e9 / wall, (cpu1 - cpu0) / 1e3 / ticks, (n1 - n0) / wall, looks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=2, help="child processes (default 2)")
    parser.add_argument("--loader", action="store_true", help="torch DataLoader workers")
    parser.add_argument("--hz", type=float, default=10.0, help="sampling rate (default 10)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per run")
    parser.add_argument("--runs", type=int, default=5, help="runs (default 5)")
    args = parser.parse_args()
    kind = "DataLoader workers" if args.loader else "spinning children"
    print(f"HostSampler at {args.hz:g} Hz, main + {args.children} {kind}, pid {os.getpid()}")
    results = []
    for i in range(args.runs):
        pct, us, rate, looks = one_run(args)
        results.append((pct, us, rate, looks))
        also = f", {looks:.2f} children look-ups/s" if looks >= 0 else ""
        print(
            f"  run {i + 1}: {pct:.3f} % of a core, {us:.0f} µs/sample, {rate:.2f} samples/s{also}"
        )
    pct, us, rate = (statistics.median(r[k] for r in results) for k in range(3))
    print(f"median: {pct:.3f} % of a core, {us:.0f} µs CPU per sample, {rate:.2f} samples/s")


if __name__ == "__main__":
    main()
