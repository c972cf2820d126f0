"""``pipeprof tune`` against an exhaustive search over the same knobs (docs/tune.md).

For each pipeline of benchmarks/tune/ (and the held-out near_threshold_w0): ``pipeprof tune``
as a user runs it (its wall time, its choice), then every setting of the grid (num_workers
0-4, 6, 8 x prefetch_factor 2, 4 x persistent_workers) measured the same way, in as many
interleaved rounds, no setting dropped (its time: the trials'), then the tune's choice, the
grid's best and the script as it is side by side in fresh interleaved rounds (medians).

    .venv/bin/python benchmarks/tune_proof.py --json benchmarks/results/tune-proof.json
    .venv/bin/python benchmarks/tune_proof.py --only compute_bound --rounds 2
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

from _common import machine

from pipeprof.analyze import tune as choose
from pipeprof.tune import Tuner

HERE = Path(__file__).resolve().parent
PIPELINES = {
    "storage_epochs": HERE / "tune" / "storage_epochs.py",
    "python_transform": HERE / "tune" / "python_transform.py",
    "compute_bound": HERE / "tune" / "compute_bound.py",
    "near_threshold_w0": HERE / "heldout" / "near_threshold_w0.py",
}
GRID = [{"num_workers": 0}] + [
    {"num_workers": n, "prefetch_factor": pf, "persistent_workers": keep}
    for n in (1, 2, 3, 4, 6, 8) for pf in (2, 4) for keep in (False, True)
]  # fmt: skip


def run_tune(script: Path, batches: int, rounds: int, out: Path) -> dict:
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "pipeprof", "tune", "-q", "--batches", str(batches),
                    "--rounds", str(rounds), "--budget", "30m", "-o", str(out), str(script)],
                   check=True, capture_output=True, text=True)  # fmt: skip
    result = json.loads(out.read_text())
    result["wall_s"] = time.monotonic() - t
    return result


def exhaustive(script: Path, batches: int, rounds: int) -> tuple[dict, float, dict]:
    """Every setting of the grid, ``rounds`` interleaved rounds, none dropped."""
    tuner = Tuner(str(script), [], batches=batches, rounds=rounds, budget_s=4 * 3600,
                  prune=False)  # fmt: skip
    tuner.site = tuner.baseline()["meta"]["run_loader"]["site"]
    base = tuner.add({})
    names = [base] + [tuner.add(g) for g in GRID]
    t = time.monotonic()
    tuner.phase(list(dict.fromkeys(names)), base, seed=7)
    spent = time.monotonic() - t
    tuner.close()
    medians = {n: statistics.median(r) for n, r in tuner.rates.items() if r}
    best = max(medians, key=medians.__getitem__)
    return tuner.settings[best], spent, medians


def side_by_side(script: Path, batches: int, rounds: int, settings: dict[str, dict]) -> dict:
    """The settings (name -> knobs) in fresh interleaved rounds: each one's median rate."""
    tuner = Tuner(str(script), [], batches=batches, rounds=rounds, budget_s=4 * 3600,
                  prune=False)  # fmt: skip
    tuner.site = tuner.baseline()["meta"]["run_loader"]["site"]
    names = {label: tuner.add(knobs) for label, knobs in settings.items()}
    tuner.phase(list(dict.fromkeys(names.values())), tuner.add({}), seed=11)
    tuner.close()
    return {label: {"samples_per_s": statistics.median(tuner.rates[n]), "rates": tuner.rates[n],
                    "setting": n} for label, n in names.items()}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="pipelines, comma-separated")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--final-rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    names = args.only.split(",") if args.only else list(PIPELINES)
    out = {"machine": machine(), "batches": args.batches, "rounds": args.rounds,
           "pipelines": {}}  # fmt: skip
    for name in names:
        script = PIPELINES[name]
        with tempfile.TemporaryDirectory() as tmp:
            tuned = run_tune(script, args.batches, args.rounds, Path(tmp) / "tune.json")
        best, grid_s, medians = exhaustive(script, args.batches, args.rounds)
        final = side_by_side(script, args.batches, args.final_rounds,
                             {"as it is": {}, "tune": tuned["chosen"], "grid": best})  # fmt: skip
        row = {
            "tune_chosen": choose.key(tuned["chosen"]), "tune_changed": tuned["changed"],
            "tune_s": round(tuned["wall_s"], 1), "tune_trials": sum(t["runs"] for t in
                                                                    tuned["trials"]),
            # each setting the tune ran: its runs and median rate (which phase tried what)
            "tune_tried": {t["setting"]: [t["runs"], t["samples_per_s"]] for t in tuned["trials"]},
            "grid_best": choose.key(best), "grid_s": round(grid_s, 1),
            "grid_medians": {k: round(v, 1) for k, v in medians.items()},
            "final": final,
            "tune_over_grid": final["tune"]["samples_per_s"] / final["grid"]["samples_per_s"],
            "tune_over_baseline": final["tune"]["samples_per_s"]
            / final["as it is"]["samples_per_s"],
            "time_share": tuned["wall_s"] / grid_s,
            # to the choice (the baseline profile and the trials), the ceiling ladder's runs after
            "search_s": tuned["search_s"], "search_share": tuned["search_s"] / grid_s,
        }  # fmt: skip
        out["pipelines"][name] = row
        print(f"{name:18} tune: {row['tune_chosen']} ({row['tune_s']} s); grid best: "
              f"{row['grid_best']} ({row['grid_s']} s); tune/grid {row['tune_over_grid']:.3f}, "
              f"tune/as-is {row['tune_over_baseline']:.3f}, time {row['time_share']:.2f} (to the "
              f"choice {row['search_share']:.2f})",
              flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
