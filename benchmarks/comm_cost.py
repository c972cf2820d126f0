"""What timing DDP's all-reduce costs per step (docs/validation/distributed.md).

Side by side, in one process (a gloo group of one rank, CPU): the same DDP training step under
``pipeprof.Profiler`` with DDP's built-in (C++) all-reduce, with torch's Python
``allreduce_hook`` registered by hand (not timed), and with ``Profiler.time_comm(model)`` (that
hook, timed). Rounds alternate between the three so that load on the machine hits them alike;
each round times ``STEPS`` steps; the figures are the median per-step times.

    PYTHONPATH=. python benchmarks/comm_cost.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pipeprof

STEPS, ROUNDS = 200, 11


def one_round(kind: str) -> float:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 3)))
    prof = pipeprof.Profiler(sample_hz=0)
    if kind == "hook":
        model.register_comm_hook(None, allreduce_hook)
    elif kind == "timed":
        prof.time_comm(model)
    batch = torch.ones(8, 32)
    t0 = time.perf_counter()
    with prof:
        for x in prof.wrap([batch] * STEPS):
            model(x).sum().backward()
    return (time.perf_counter() - t0) / STEPS


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/s", 1), rank=0,
                                world_size=1)  # fmt: skip
        kinds = ("built-in", "hook", "timed")
        for kind in kinds:
            one_round(kind)  # warm-up
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(ROUNDS):
            for kind in kinds:
                times[kind].append(one_round(kind))
        dist.destroy_process_group()
    b, h, t = (statistics.median(times[k]) * 1e6 for k in kinds)
    print(f"torch {torch.__version__}, {ROUNDS} rounds of {STEPS} steps", file=sys.stderr)
    print(f"median step: built-in all-reduce {b:.1f} us, allreduce_hook {h:.1f} us, timed "
          f"{t:.1f} us; timing costs {t - h:+.1f} us per step over the hook, {t - b:+.1f} us "
          "over the built-in")


if __name__ == "__main__":
    main()
