"""Where a DataLoader worker's start and batches cost more under pipeprof, step by step.

Usage: python benchmarks/worker_phases.py [--rounds 12] [--batches 8]

``worker_start.py``'s loader of cheap samples (a 4-float tensor each, batch 32, 2 forked
workers started afresh every epoch) runs one epoch plain and one under
``pipeprof.Profiler(sample_hz=0).wrap(loader)`` per round, in an order alternated from round to
round. Inside each worker, the steps of torch's
``_worker_loop`` are bracketed (the worker's main-thread CPU clock and its minor page faults,
``RUSAGE_THREAD``): ``torch.set_num_threads``, ``random.seed``, ``torch.manual_seed`` (which,
where CUDA is not initialised, formats the stack the worker was forked in: NOTE [ The stack a
forked worker formats ] in collect/torch/loader.py), NumPy's seeding, pipeprof's ``WorkerInit``,
making the fetcher, and each fetch (the dataset's samples and ``collate_fn``). Prints, per step,
the medians over the workers, plain and profiled, and their difference.
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data._utils.fetch as torch_fetch
import torch.utils.data._utils.worker as torch_worker
import worker_start  # its cheap loader's epochs, plain and profiled (benchmarks/ on sys.path)
from torch.utils.data import _DatasetKind

from pipeprof.collect.torch import loader as pipeprof_loader

_MARKS: list[tuple[str, int, int]] = []
_ORIGINAL = torch_worker._worker_loop


def _mark(tag: str) -> None:
    _MARKS.append(
        (tag, time.thread_time_ns(), resource.getrusage(resource.RUSAGE_THREAD).ru_minflt)
    )


def _bracketed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        _mark(name + " <")
        try:
            return fn(*args, **kwargs)
        finally:
            _mark(name + " >")

    return call


def _worker_loop(*args: Any, **kwargs: Any) -> Any:
    _MARKS.clear()
    _mark("start")
    try:
        return _ORIGINAL(*args, **kwargs)
    finally:
        _mark("end")
        worker_start._PIPE[1].send(list(_MARKS))  # its epoch() set the pipe up


def steps(marks: list[tuple[str, int, int]]) -> dict[str, tuple[int, int]]:
    """(CPU ns, faults) per bracketed step; the fetches after the first are summed."""
    out: dict[str, tuple[int, int]] = {}
    opened: dict[str, tuple[int, int]] = {}
    fetches = 0
    for tag, ns, faults in marks:
        name, _, side = tag.rpartition(" ")
        if side == "<":
            opened[name] = (ns, faults)
        elif side == ">" and name in opened:
            ns0, f0 = opened.pop(name)
            if name == "fetch":
                fetches += 1
                name = "first fetch" if fetches == 1 else "other fetches"
            was = out.get(name, (0, 0))
            out[name] = (was[0] + ns - ns0, was[1] + faults - f0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batches", type=int, default=8, help="batches an epoch (both workers)")
    args = ap.parse_args(argv)
    torch_worker._worker_loop = _worker_loop  # the loader's workers fork with these
    torch.set_num_threads = _bracketed("set_num_threads", torch.set_num_threads)
    random.seed = _bracketed("random.seed", random.seed)
    torch.manual_seed = _bracketed("torch.manual_seed", torch.manual_seed)
    torch_worker._generate_state = _bracketed("numpy seed", torch_worker._generate_state)
    init = pipeprof_loader.WorkerInit.__call__
    pipeprof_loader.WorkerInit.__call__ = _bracketed("WorkerInit", init)  # type: ignore[method-assign]
    _DatasetKind.create_fetcher = staticmethod(  # type: ignore[method-assign]
        _bracketed("create_fetcher", _DatasetKind.create_fetcher)
    )
    fetch = torch_fetch._MapDatasetFetcher.fetch
    torch_fetch._MapDatasetFetcher.fetch = _bracketed("fetch", fetch)  # type: ignore[method-assign]
    runs: dict[bool, list[dict[str, tuple[int, int]]]] = {False: [], True: []}
    for r in range(args.rounds + 1):
        for profiled in (False, True) if r % 2 else (True, False):
            workers = worker_start.epoch(args.batches, profiled)
            if r:  # the first round warms up
                runs[profiled] += [steps(m) for m in workers]
    names = list(dict.fromkeys(k for w in runs[True] + runs[False] for k in w))
    print(
        f"a worker's steps: its CPU (µs) and minor faults, medians over {len(runs[True])} workers"
    )
    for name in names:
        row = []
        for profiled in (False, True):
            got = [w.get(name, (0, 0)) for w in runs[profiled]]
            row.append(
                (statistics.median(g[0] for g in got) / 1e3, statistics.median(g[1] for g in got))
            )
        (us0, f0), (us1, f1) = row
        print(
            f"  {name:18s} plain {us0:8.0f} µs {f0:5.0f} faults   pipeprof {us1:8.0f} µs "
            f"{f1:5.0f} faults   {us1 - us0:+7.0f} µs {f1 - f0:+5.0f} faults"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
