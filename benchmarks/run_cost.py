"""What ``pipeprof run`` costs a script: at start-up and per training step
(docs/validation/run-cost.md).

Side by side, interleaved, ``--rounds`` rounds, medians reported:

  start-up   a script that imports torch and does nothing else: wall time of ``python s.py``
             against ``pipeprof run s.py`` (pipeprof's import, the import hook, patching torch
             once it is imported, writing nothing), in subprocesses;
  per step   in this process, the tiny step of issue 38: ``TensorDataset``, ``num_workers=0``,
             batch 8, a linear model, SGD, 3,000 steps; and a model of ``--layers`` hidden
             layers (2 Module calls each). The training thread's CPU time per step of the loop
             (``time.thread_time``: what the VM's other tenants take is not in it), plain,
             under what ``pipeprof run`` installs (``Run``), and the same with
             ``--no-regions``; the three one after the other in each round, their order turned,
             and the medians of each round's differences: ``run - no-regions`` is the
             Forward / Backward / Optimizer regions, ``no-regions - plain`` the profiled
             ``next()``;
  realistic  tests/scripts/train.py with 2 workers, 0.2 ms of loading per sample and a 10 ms
             step, in subprocesses: the ratio of the script's own loop time, run / plain.

    .venv/bin/python benchmarks/run_cost.py                 # 7 rounds, ~10 minutes
    .venv/bin/python benchmarks/run_cost.py --rounds 9 --json run_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import compiled, machine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pipeprof.attach.run import Run

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "tests" / "scripts" / "train.py")
PY = sys.executable


def wall(cmd: list[str], cwd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, capture_output=True)
    return time.perf_counter() - t0


def loop_s(cmd: list[str], cwd: str) -> float:
    out = subprocess.run(cmd, check=True, cwd=cwd, capture_output=True, text=True).stdout
    return float(next(ln for ln in out.splitlines() if ln.startswith("loop_s")).split()[1])


def step_us(layers: int, how: str, steps: int = 3000) -> float:
    """The training thread's CPU µs per step of a small training loop (batch 8; ``layers`` 0: a
    linear model, issue 38's tiny step): plain, or under ``Run`` (with regions or without)."""
    torch.manual_seed(0)
    if layers:
        hidden = [m for _ in range(layers) for m in (nn.Linear(16, 16), nn.ReLU())]
        model: nn.Module = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), *hidden, nn.Linear(16, 4))
    else:
        model = nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(steps * 8, 32), torch.randint(0, 4, (steps * 8,)))
    run = None if how == "plain" else Run(sample_hz=0, regions=how == "run")
    if run is not None:
        run.install()
    try:
        t0, n = time.thread_time(), 0
        for x, y in DataLoader(data, batch_size=8):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
        return (time.thread_time() - t0) / n * 1e6
    finally:
        if run is not None:
            run.uninstall()
            run.stop_profiling()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    compiled()
    torch.set_num_threads(1)  # steadier step times on a small shared machine
    run = [PY, "-m", "pipeprof", "run", "-q", "-o"]
    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "r.json")
        script = str(Path(tmp) / "s.py")
        Path(script).write_text("import torch\n")
        real = ["--workers", "2", "--load-ms", "0.2", "--step-ms", "10", "--samples", "1600",
                "--time"]  # fmt: skip
        step_us(0, "run", 300)  # warm-up: first calls, imports
        hows = ["plain", "no-regions", "run"]
        for r in range(args.rounds):
            add("startup_plain_s", wall([PY, script], tmp))
            add("startup_run_s", wall([*run, out, script], tmp))
            for layers in (0, args.layers):
                took = {how: step_us(layers, how) for how in hows[r % 3:] + hows[: r % 3]}
                for how, us in took.items():
                    add(f"step_{how}_{layers}_us", us)
                add(f"next_added_{layers}_us", took["no-regions"] - took["plain"])
                add(f"regions_added_{layers}_us", took["run"] - took["no-regions"])
                add(f"run_added_{layers}_us", took["run"] - took["plain"])
            add("realistic_plain_s", loop_s([PY, TRAIN, *real], tmp))
            add("realistic_run_s", loop_s([*run, out, TRAIN, *real], tmp))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in results.items()}
    n = args.layers
    summary = {
        "startup_added_s": med["startup_run_s"] - med["startup_plain_s"],
        "tiny_run_added_us": med["run_added_0_us"],  # issue 38: at most 30
        "realistic_ratio": med["realistic_run_s"] / med["realistic_plain_s"],
    }
    # the deep model's 2n + 3 Module calls against the linear model's one: the wrapper's cost
    # per inner call (the outermost is the Forward region either way)
    summary["per_module_call_us"] = (
        med[f"regions_added_{n}_us"] - med["regions_added_0_us"]
    ) / (2 * n + 2)
    for k, v in {**med, **summary}.items():
        print(f"{k:30s} {v:10.3f}")
    if args.json:
        data = {"machine": machine(), "rounds": results, "median": med, "summary": summary}
        Path(args.json).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
