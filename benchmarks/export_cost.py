"""What ``report.log_to(tool)`` costs, once per run, for TensorBoard, MLflow and W&B.

A report of a real loop (2,000 steps: the most timeline rows a report keeps, so the most
per-step points a tool gets) is saved once; then each round starts a fresh Python process per
tool (rounds interleave the tools, so a noisy neighbour slows all alike) that loads the report
and times, with ``time.perf_counter``:

  import    importing the tool (what ``import pipeprof`` never pays);
  first     the first ``report.log_to(tool)``: the import, then the logging (W&B: its service
            process starting, a new run, finishing it);
  again     a second ``log_to`` in the same process: the logging alone.

Local stores only, nothing over the network: TensorBoard event files, MLflow's file store
(``MLFLOW_ALLOW_FILE_STORE=true``), W&B offline (``WANDB_MODE=offline``). The table gives the
median over rounds and the min-max spread.

    python benchmarks/export_cost.py                  # table
    python benchmarks/export_cost.py --rounds 7 --json export_cost.json
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

TOOLS = ("tensorboard", "mlflow", "wandb")

CHILD = """
import json, sys, time
import pipeprof
tool, saved, where = sys.argv[1:4]
report = pipeprof.load(saved)
options = {"tensorboard": {"log_dir": where}, "mlflow": {"tracking_uri": where}}.get(tool, {})
t0 = time.perf_counter()
__import__(tool)
t1 = time.perf_counter()
report.log_to(tool, **options)  # the tool is imported already: first = import + this
t2 = time.perf_counter()
report.log_to(tool, **options)
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first": t2 - t0, "again": t3 - t2}))
"""


def make_report(path: Path, steps: int) -> None:
    import torch
    from torch.utils.data import DataLoader

    import pipeprof

    torch.set_num_threads(1)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(DataLoader(list(range(steps)), batch_size=1)):
            time.sleep(0.0002)
    prof.report().save(path)


def one(tool: str, saved: Path, tmp: Path, i: int) -> dict[str, float]:
    where = str(tmp / f"{tool}{i}")
    if tool == "mlflow":
        where = Path(where).as_uri()
    env = dict(os.environ, MLFLOW_ALLOW_FILE_STORE="true", WANDB_MODE="offline",
               WANDB_DIR=str(tmp), WANDB_SILENT="true", WANDB_CONSOLE="off",
               WANDB_DISABLE_GIT="true")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", CHILD, tool, str(saved), where],
                         capture_output=True, text=True, env=env, check=True)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipeprof-export-") as name:
        tmp = Path(name)
        saved = tmp / "report.json"
        make_report(saved, args.steps)
        runs: dict[str, list[dict[str, float]]] = {t: [] for t in TOOLS}
        for i in range(args.rounds):
            for tool in TOOLS:
                runs[tool].append(one(tool, saved, tmp, i))
    table = {}
    print(f"log_to cost, {args.rounds} rounds, a report of {args.steps} steps: median (min-max) s")
    print(f"{'tool':<12}{'import':>22}{'first log_to':>22}{'again':>22}")
    for tool, rows in runs.items():
        table[tool] = {k: [r[k] for r in rows] for k in ("import", "first", "again")}
        cells = [
            f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for v in table[tool].values()
        ]
        print(f"{tool:<12}" + "".join(f"{c:>22}" for c in cells))
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": args.steps, "runs": table}, indent=1))


if __name__ == "__main__":
    main()
