"""Where ``pipeprof run``'s cost lands in issue 38's tiny step (docs/validation/run-cost.md).

The step of ``run_cost.step_us(0, ...)`` (``TensorDataset``, ``num_workers=0``, batch 8, a linear
model, SGD), each part timed by the wall clock around it: ``next()``, the forward, the loss,
``zero_grad``, the backward, the optimizer's step; plain, and under what ``pipeprof run``
installs (``Run``, no samplers), and with ``--hows`` also under ``pipeprof.Profiler`` by hand
(``hand``: ``wrap`` alone, no regions, no samplers) and by hand without its fast path
(``hand-slow``: every batch through the steps' generator, NOTE [ The fast path, by hand ] in
profiler.py). Each round runs them one after the other, its order turned each round; per
part, the median over rounds of each run's median step, and of its mean step
(the mean holds the rare slow steps: profiled batches, folds, garbage collection). A part
pipeprof runs no code in (the loss, ``zero_grad``) shows what its code beside it displaces.
Last, what the report states of its cost a step (``overhead.estimated_s`` over the steps),
against the mean step's added time; and the same less the Profiler's start and stop
(``control_s``: its calibration runs after the loop, where no step is timed).

    .venv/bin/python benchmarks/step_where.py --rounds 8 --steps 1500   # ~1 minute
    .venv/bin/python benchmarks/step_where.py --hows plain,run,hand,hand-slow
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pipeprof.attach.run import Run
from pipeprof.profiler import Profiler

PARTS = ("next", "forward", "loss", "zero_grad", "backward", "step")


def parts_ns(how: str, steps: int) -> dict[str, list[int]]:
    """Each part's wall time per step, ``how`` plain, run, hand or hand-slow (``"stated"``: the
    report's cost a step, in ns)."""
    torch.manual_seed(0)
    model = nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(steps * 8, 32), torch.randint(0, 4, (steps * 8,)))
    run = Run(sample_hz=0) if how == "run" else None
    prof = Profiler(sample_hz=0) if how.startswith("hand") else None
    if run is not None:
        run.install()
    clock = time.perf_counter_ns
    out: dict[str, list[int]] = {k: [] for k in PARTS}
    pass_of = Profiler._pass_of
    if how == "hand-slow":  # every batch through the generators
        Profiler._pass_of = lambda self, source, moves: self._steps(source, moves)  # type: ignore[method-assign]
    try:
        loader = DataLoader(data, batch_size=8)
        it = iter(loader if prof is None else prof.wrap(loader))
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
        Profiler._pass_of = pass_of  # type: ignore[method-assign]
        if prof is not None:
            prof.stop()
        if run is not None:
            run.uninstall()
            run.stop_profiling()
    if run is not None or prof is not None:
        report = run.reports()[0][1] if run is not None else prof.report()  # type: ignore[union-attr]
        o = report["overhead"]
        out["stated"] = [int(o["estimated_s"] * 1e9 / steps)]
        # the loop's own: less the Profiler's start and stop (its calibration after the loop)
        out["stated_loop"] = [int((o["estimated_s"] - o["control_s"]) * 1e9 / steps)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--hows", default="plain,run", help="plain and any of run,hand,hand-slow")
    args = p.parse_args()
    hows = args.hows.split(",")
    torch.set_num_threads(1)
    for how in hows:  # warm-up
        parts_ns(how, 300)
    runs: dict[str, list[dict[str, list[int]]]] = {how: [] for how in hows}
    for r in range(args.rounds):
        for how in hows[r % len(hows):] + hows[: r % len(hows)]:
            runs[how].append(parts_ns(how, args.steps))
    for how in hows[1:]:
        show(how, runs["plain"], runs[how])


def show(how: str, plain: list[dict[str, list[int]]], rs: list[dict[str, list[int]]]) -> None:
    print(f"\n{how}: {'part':10s} {'plain µs':>9s} {'added, median step':>19s} "
          f"{'added, mean step':>17s}")
    total = [0.0, 0.0]
    for k in PARTS:
        got = [[statistics.median(statistics.median(r[k]) for r in runs),
                statistics.median(statistics.mean(r[k]) for r in runs)]
               for runs in (plain, rs)]  # fmt: skip
        med = (got[1][0] - got[0][0]) / 1e3
        mean = (got[1][1] - got[0][1]) / 1e3
        total[0] += med
        total[1] += mean
        print(f"{k:10s} {got[0][0] / 1e3:9.1f} {med:+19.1f} {mean:+17.1f}")
    print(f"{'the step':10s} {'':9s} {total[0]:+19.1f} {total[1]:+17.1f}")
    stated = statistics.median(r["stated"][0] for r in rs) / 1e3
    loop = statistics.median(r["stated_loop"][0] for r in rs) / 1e3
    print(f"the report states {stated:.1f} µs a step: {stated / total[1]:.2f} of the mean's; "
          f"in the loop (less start and stop) {loop:.1f}: {loop / total[1]:.2f}")


if __name__ == "__main__":
    main()
