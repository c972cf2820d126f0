"""What ``pipeprof run`` costs an HF Trainer and a Lightning run, against what its report states
(issue 38; docs/validation/run-cost.md).

Each held-out script (benchmarks/heldout/) prints its own meter: samples a second over its
training (HF's ``train_samples_per_second``; the Lightning script's training epochs, their
validation apart), made seconds for the samples the report counts. Side by side,
``--rounds`` rounds, plain and ``pipeprof run`` one after the other, their order turned each
round. Measured: the training's own seconds for the same samples, run against plain, by the
medians of the rounds, with the spread of the rounds' differences. Stated: the report's
``overhead.estimated_s`` less the Profiler's start and stop (``control_s``: its calibration runs
after the training, outside the meter), the median over the profiled runs.

    .venv/bin/python benchmarks/framework_cost.py --rounds 5           # ~6 minutes
    .venv/bin/python benchmarks/framework_cost.py --only hf_text --rounds 7 --json fw.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import compiled, machine

HERE = Path(__file__).resolve().parent / "heldout"
SCRIPTS = {
    "hf_text": ["--steps", "60"],  # num_workers=0: the Trainer's loader in the training process
    "lightning_images": ["--workers", "1", "--epochs", "2"],
}


def once(script: str, profiled: bool, tmp: str) -> dict[str, float]:
    """One run: its training's seconds by its own meter, and (profiled) what the report states."""
    out = Path(tmp) / "run.json"
    head = [sys.executable, *(["-m", "pipeprof", "run", "-o", str(out)] if profiled else [])]
    cmd = [*head, str(HERE / f"{script}.py"), *SCRIPTS[script]]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, check=True)
    meters = json.loads(next(ln[7:] for ln in done.stdout.splitlines() if ln.startswith("METERS ")))
    got = {"per_sample_s": 1.0 / meters["samples_per_s"]}
    if profiled:
        report = json.loads(out.read_text())
        o = report["overhead"]
        got["stated_s"] = o["estimated_s"] - o["control_s"]
        got["samples"] = report["samples"]  # the training loader's: the meter's samples
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default=None, help="one script")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    compiled()
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for script in [args.only] if args.only else list(SCRIPTS):
            r: dict[str, list[float]] = {"plain": [], "run": [], "stated_s": [], "samples": []}
            for k in range(args.rounds):
                for profiled in (False, True) if k % 2 else (True, False):
                    got = once(script, profiled, tmp)
                    r["run" if profiled else "plain"].append(got["per_sample_s"])
                    if profiled:
                        r["stated_s"].append(got["stated_s"])
                        r["samples"].append(got["samples"])
                print(f"{script}: round {k + 1}/{args.rounds} done", file=sys.stderr)
            results[script] = r
    summary = {}
    for script, r in results.items():
        n = statistics.median(r["samples"])  # the training's seconds for these samples
        plain, run = n * statistics.median(r["plain"]), n * statistics.median(r["run"])
        diffs = [n * (b - a) for a, b in zip(r["plain"], r["run"])]
        stated = statistics.median(r["stated_s"])
        summary[script] = {
            "plain_s": round(plain, 4), "run_s": round(run, 4),
            "measured_s": round(run - plain, 4),
            "round_diffs_s": [round(d, 4) for d in sorted(diffs)],
            "stated_s": round(stated, 4),
            "stated_over_measured": round(stated / (run - plain), 3) if run > plain else None,
        }  # fmt: skip
        print(f"{script:18s} plain {plain:.3f} s, run {run:.3f} s: measured {run - plain:+.3f} s "
              f"(rounds {min(diffs):+.3f} to {max(diffs):+.3f}); stated {stated:.4f} s")
    if args.json:
        data = {"machine": machine(), "rounds": results, "summary": summary}
        Path(args.json).write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
