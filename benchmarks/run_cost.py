"""What ``pipeprof run`` costs a script: at start-up and per training step (docs/run.md).

Side by side, interleaved, ``--rounds`` rounds, medians reported:

  start-up   a script that imports torch and does nothing else: wall time of ``python s.py``
             against ``pipeprof run s.py`` (pipeprof's import, the import hook, patching torch
             once it is imported, writing nothing), in subprocesses;
  per step   in this process, a loop over a DataLoader with no workers and data that costs
             nothing, a model of 1 and of ``--layers`` hidden layers (2 Module calls each), SGD:
             microseconds per step plain, under what ``pipeprof run`` installs (``Run``), and
             the same with ``--no-regions``. ``run - no-regions`` is the Forward / Backward /
             Optimizer regions (a wrapper on ``Module.__call__``, on ``Tensor.backward``, the
             optimizer's step hooks); ``no-regions - plain`` is the profiled ``next()``;
  realistic  tests/scripts/train.py with 2 workers, 0.2 ms of loading per sample and a 10 ms
             step, in subprocesses: the ratio of the script's own loop time, run / plain.

    .venv/bin/python benchmarks/run_cost.py                 # 7 rounds, ~2 minutes
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
from _common import machine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pipeprof.runner import Run

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


def step_us(layers: int, how: str) -> float:
    """Mean µs per step of a small training loop: plain, or under ``Run`` (with regions or
    without)."""
    hidden = [m for _ in range(layers) for m in (nn.Linear(16, 16), nn.ReLU())]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), *hidden, nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(2048, 8), torch.randint(0, 2, (2048,)))
    run = None if how == "plain" else Run(sample_hz=0, regions=how == "run")
    if run is not None:
        run.install()
    try:
        t0, n = time.perf_counter(), 0
        for x, y in DataLoader(data, batch_size=16):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += 1
        return (time.perf_counter() - t0) / n * 1e6
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
        step_us(1, "run")  # warm-up: first calls, imports
        for r in range(args.rounds):
            add("startup_plain_s", wall([PY, script], tmp))
            add("startup_run_s", wall([*run, out, script], tmp))
            for layers in (1, args.layers):
                for how in ("plain", "no-regions", "run"):
                    add(f"step_{how}_{layers}_us", step_us(layers, how))
            add("realistic_plain_s", loop_s([PY, TRAIN, *real], tmp))
            add("realistic_run_s", loop_s([*run, out, TRAIN, *real], tmp))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in results.items()}
    n = args.layers
    summary = {
        "startup_added_s": med["startup_run_s"] - med["startup_plain_s"],
        "next_added_us": med["step_no-regions_1_us"] - med["step_plain_1_us"],
        "regions_added_us_1_layer": med["step_run_1_us"] - med["step_no-regions_1_us"],
        f"regions_added_us_{n}_layers": med[f"step_run_{n}_us"] - med[f"step_no-regions_{n}_us"],
        "realistic_ratio": med["realistic_run_s"] / med["realistic_plain_s"],
    }
    # each extra hidden layer is 2 Module calls (Linear, ReLU): the wrapper's cost per call
    summary["per_module_call_us"] = (
        summary[f"regions_added_us_{n}_layers"] - summary["regions_added_us_1_layer"]
    ) / (2 * (n - 1))
    for k, v in {**med, **summary}.items():
        print(f"{k:30s} {v:10.3f}")
    if args.json:
        data = {"machine": machine(), "rounds": results, "median": med, "summary": summary}
        Path(args.json).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
