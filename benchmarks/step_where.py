"""Where ``pipeprof run``'s cost lands in issue 38's tiny step (docs/run.md "What it costs").

The step of ``run_cost.step_us(0, ...)`` (``TensorDataset``, ``num_workers=0``, batch 8, a linear
model, SGD), each part timed by the wall clock around it: ``next()``, the forward, the loss,
``zero_grad``, the backward, the optimizer's step; plain, and under what ``pipeprof run``
installs (``Run``, no samplers). Each round runs the two one after the other, its order turned
each round; per part, the median over rounds of each run's median step, and of its mean step
(the mean holds the rare slow steps: profiled batches, folds, garbage collection). A part
pipeprof runs no code in (the loss, ``zero_grad``) shows what its code beside it displaces.
Last, what the report states of its cost a step (``overhead.estimated_s`` over the steps),
against the mean step's added time; and the same less the Profiler's start and stop
(``control_s``: its calibration runs after the loop, where no step is timed).

    .venv/bin/python benchmarks/step_where.py --rounds 8 --steps 1500   # ~1 minute
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pipeprof.runner import Run

PARTS = ("next", "forward", "loss", "zero_grad", "backward", "step")


def parts_ns(how: str, steps: int) -> dict[str, list[int]]:
    """Each part's wall time per step, ``how`` plain or run (``"stated"``: the report's cost a
    step, in ns)."""
    torch.manual_seed(0)
    model = nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(steps * 8, 32), torch.randint(0, 4, (steps * 8,)))
    run = None if how == "plain" else Run(sample_hz=0)
    if run is not None:
        run.install()
    clock = time.perf_counter_ns
    out: dict[str, list[int]] = {k: [] for k in PARTS}
    try:
        it = iter(DataLoader(data, batch_size=8))
        while True:
            t0 = clock()
            try:
                x, y = next(it)
            except StopIteration:
                break
            t1 = clock()
            z = model(x)
            t2 = clock()
            loss = nn.functional.cross_entropy(z, y)
            t3 = clock()
            opt.zero_grad()
            t4 = clock()
            loss.backward()
            t5 = clock()
            opt.step()
            t6 = clock()
            for k, dt in zip(PARTS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
                out[k].append(dt)
    finally:
        if run is not None:
            run.uninstall()
            run.stop_profiling()
    if run is not None:
        report = run.reports()[0][1]
        o = report["overhead"]
        out["stated"] = [int(o["estimated_s"] * 1e9 / steps)]
        # the loop's own: less the Profiler's start and stop (its calibration after the loop)
        out["stated_loop"] = [int((o["estimated_s"] - o["control_s"]) * 1e9 / steps)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=1500)
    args = p.parse_args()
    torch.set_num_threads(1)
    parts_ns("run", 300), parts_ns("plain", 300)  # warm-up
    runs: dict[str, list[dict[str, list[int]]]] = {"plain": [], "run": []}
    for r in range(args.rounds):
        for how in ("plain", "run") if r % 2 else ("run", "plain"):
            runs[how].append(parts_ns(how, args.steps))
    print(f"{'part':10s} {'plain µs':>9s} {'added, median step':>19s} {'added, mean step':>17s}")
    total = [0.0, 0.0]
    for k in PARTS:
        got = {}
        for how, rs in runs.items():
            got[how] = [statistics.median(statistics.median(r[k]) for r in rs),
                        statistics.median(statistics.mean(r[k]) for r in rs)]  # fmt: skip
        med = (got["run"][0] - got["plain"][0]) / 1e3
        mean = (got["run"][1] - got["plain"][1]) / 1e3
        total[0] += med
        total[1] += mean
        print(f"{k:10s} {got['plain'][0] / 1e3:9.1f} {med:+19.1f} {mean:+17.1f}")
    print(f"{'the step':10s} {'':9s} {total[0]:+19.1f} {total[1]:+17.1f}")
    stated = statistics.median(r["stated"][0] for r in runs["run"]) / 1e3
    loop = statistics.median(r["stated_loop"][0] for r in runs["run"]) / 1e3
    print(f"the report states {stated:.1f} µs a step: {stated / total[1]:.2f} of the mean's; "
          f"in the loop (less start and stop) {loop:.1f}: {loop / total[1]:.2f}")


if __name__ == "__main__":
    main()
