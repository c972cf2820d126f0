"""What ``pipeprof run`` adds to each step, part by part, on a loop that costs almost nothing
(docs/validation/run-cost.md): the smallest figures this noisy 2-core VM can resolve.

A DataLoader over a list of ints (batches of 8, ``num_workers=0``, the default sampling of the
stages), in this process, under what ``pipeprof run`` installs (``Run``, no samplers):

  next     the loop does nothing with its batches: the training thread's CPU per step under
           ``Run(regions=False)`` against plain; the profiled ``next()`` and the step split;
  regions  each step calls an ``nn.Identity``, a backward of a one-element parameter and an
           SGD step: ``Run()`` against ``Run(regions=False)``; the Forward, Backward and
           Optimizer regions.

Each round runs the two one after the other, its order turned each round; the medians (and
quartiles) of the rounds' differences, in µs a step.

    .venv/bin/python benchmarks/step_parts.py --rounds 20 --steps 1000   # ~1 minute
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from _common import machine
from torch import nn
from torch.utils.data import DataLoader

from pipeprof.attach.run import Run


def per_step_us(steps: int, how: str, step: bool) -> float:
    """The training thread's CPU µs per step: ``how`` plain, no-regions or run."""
    w = nn.Parameter(torch.ones(1))
    model, opt = nn.Identity(), torch.optim.SGD([w], lr=0.01)
    run = None if how == "plain" else Run(sample_hz=0, regions=how == "run")
    if run is not None:
        run.install()
    try:
        t0, n = time.thread_time(), 0
        for x in DataLoader(list(range(steps * 8)), batch_size=8):
            if step:
                model(x)
                w.sum().backward()
                opt.step()
            n += 1
        return (time.thread_time() - t0) / n * 1e6
    finally:
        if run is not None:
            run.uninstall()
            run.stop_profiling()


def paired(rounds: int, steps: int, a: str, b: str, step: bool) -> list[float]:
    for _ in range(2):  # warm-up
        per_step_us(steps // 4, a, step), per_step_us(steps // 4, b, step)
    out = []
    for r in range(rounds):
        if r % 2:
            x = per_step_us(steps, a, step)
            y = per_step_us(steps, b, step)
        else:
            y = per_step_us(steps, b, step)
            x = per_step_us(steps, a, step)
        out.append(y - x)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    results = {
        "next": paired(args.rounds, args.steps, "plain", "no-regions", step=False),
        "regions": paired(args.rounds, args.steps, "no-regions", "run", step=True),
    }
    summary = {}
    for k, v in results.items():
        q = statistics.quantiles(v, n=4)
        summary[k] = {"median_us": statistics.median(v), "q1_us": q[0], "q3_us": q[2]}
        print(f"{k:8s} +{summary[k]['median_us']:6.1f} µs a step (quartiles {q[0]:.1f}-{q[2]:.1f})")
    if args.json:
        data = {"machine": machine(), "rounds": results, "summary": summary}
        Path(args.json).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
