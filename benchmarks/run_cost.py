"""What ``pipeprof run`` costs a script: at start-up and per training step (docs/run.md).

Three side-by-side comparisons, interleaved, ``--rounds`` rounds each, medians reported:

  start-up   a script that imports torch and does nothing else: wall time of ``python s.py``
             against ``pipeprof run s.py`` (pipeprof's own import, the import hook, patching
             torch once it is imported, writing nothing);
  per step   tests/scripts/train.py with data that costs nothing (``--load-ms 0``, no workers)
             and no sleep in the step, a model of 1 and of ``--layers`` hidden layers: the
             script's own loop time per step, plain and under ``pipeprof run``. The difference
             is what pipeprof adds to a step: the profiled ``next()``, and the Forward /
             Backward / Optimizer regions (one global hook call per module call);
  realistic  the same with a 10 ms step and 0.2 ms of loading per sample (2 workers): the
             ratio of loop times, which is what a user sees.

    .venv/bin/python benchmarks/run_cost.py                 # 7 rounds, ~3 minutes
    .venv/bin/python benchmarks/run_cost.py --rounds 9 --json run_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "tests" / "scripts" / "train.py")
PY = sys.executable


def wall(cmd: list[str], cwd: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=cwd, capture_output=True)
    return time.perf_counter() - t0


def loop_s(cmd: list[str], cwd: str) -> tuple[float, int]:
    out = subprocess.run(cmd, check=True, cwd=cwd, capture_output=True, text=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("loop_s"))
    _, secs, _, steps = line.split()
    return float(secs), int(steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    run = [PY, "-m", "pipeprof", "run", "-q", "-o"]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        script = os.path.join(tmp, "s.py")
        Path(script).write_text("import torch\n")
        cheap = ["--workers", "0", "--load-ms", "0", "--step-ms", "0", "--samples", "4096",
                 "--time"]  # fmt: skip
        real = ["--workers", "2", "--load-ms", "0.2", "--step-ms", "10", "--samples", "1600",
                "--time"]  # fmt: skip
        for r in range(args.rounds):
            results.setdefault("startup_plain_s", []).append(wall([PY, script], tmp))
            results.setdefault("startup_run_s", []).append(wall([*run, out, script], tmp))
            for layers in (1, args.layers):
                for name, cmd in (("plain", [PY, TRAIN]), ("run", [*run, out, TRAIN])):
                    secs, steps = loop_s([*cmd, *cheap, "--layers", str(layers)], tmp)
                    results.setdefault(f"step_{name}_{layers}_us", []).append(secs / steps * 1e6)
            for name, cmd in (("plain", [PY, TRAIN]), ("run", [*run, out, TRAIN])):
                secs, _ = loop_s([*cmd, *real], tmp)
                results.setdefault(f"realistic_{name}_s", []).append(secs)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in results.items()}
    summary = {
        "startup_added_s": med["startup_run_s"] - med["startup_plain_s"],
        "step_added_us_1_layer": med["step_run_1_us"] - med["step_plain_1_us"],
        f"step_added_us_{args.layers}_layers": (
            med[f"step_run_{args.layers}_us"] - med[f"step_plain_{args.layers}_us"]
        ),
        "realistic_ratio": med["realistic_run_s"] / med["realistic_plain_s"],
    }
    # each extra hidden layer is 2 module calls (Linear, ReLU): the hook's cost per module call
    summary["per_module_call_us"] = (
        summary[f"step_added_us_{args.layers}_layers"] - summary["step_added_us_1_layer"]
    ) / (2 * (args.layers - 1))
    for k, v in med.items():
        print(f"{k:28s} {v:10.4f}")
    for k, v in summary.items():
        print(f"{k:28s} {v:10.4f}")
    if args.json:
        data = {"machine": machine(), "rounds": results, "median": med, "summary": summary}
        Path(args.json).write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
