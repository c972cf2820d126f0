"""How the machine's cores scale, and the 2-worker prediction that rests on it (issue 36, item 3).

    .venv/bin/python benchmarks/core_scaling.py              # 3 rounds, about 1 minute
    .venv/bin/python benchmarks/core_scaling.py --rounds 5 --json scaling.json

Per round:

  probe      collect/machine.probe: work per CPU second, all cores busy against one alone (raw
             median, before WHOLE)
  wall       the same loop's work per wall second, 1 process against one per core (what other
             programs and the hypervisor leave shows here, not in the probe)
  numpy / python
             a dataset whose samples cost numpy work (a 256×256 float32 FFT) or Python work
             (bytecode): ``pipeprof.bench(ds, workers=[1])`` predicts 2 workers
             (``predict(workers=2)``, anchored to the 1-worker run; "model alone" unanchored),
             then a real 2-worker DataLoader over the same samples (``bench.scaling.run_loader``,
             steady samples/s): error = predicted / measured - 1

Medians over the rounds; the machine is shared, so each round takes its figures side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import numpy as np
from torch.utils.data import Dataset, default_collate

import pipeprof
from pipeprof.analyze import whatif
from pipeprof.bench.scaling import Cycled, run_loader
from pipeprof.collect import machine


class NumpyWork(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> Any:
        a = np.random.default_rng(i).random((256, 256), dtype=np.float32)
        return np.abs(np.fft.rfft2(a)).astype(np.float32)[:8, :8].copy()


class PythonWork(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> Any:
        acc: dict[int, int] = {}
        for j in range(20_000):
            acc[j & 31] = acc.get(j & 31, 0) + j * i
        return np.array([acc[0]], dtype=np.float64)


def wall_scaling(k: int, seconds: float = 0.3) -> float:
    """The probe's loop: work per wall second of k processes at once, over one alone's."""

    def rate(n: int) -> float:
        got = machine.at_once(machine.python_unit, n, seconds)
        return sum(units / wall for units, _, wall in got) if got else float("nan")

    return rate(k) / rate(1)


def predicted_vs_real(ds: Dataset) -> dict[str, float]:
    b = pipeprof.bench(ds, samples=32, repeat=2, warmup=2, batch_size=8, workers=[1], seconds=1.5)
    predicted = b.predict(workers=2)  # anchored to the 1-worker run (NOTE [ Anchored predictions ])
    model_2 = whatif.throughput(b.model, 2)  # the model alone
    one = next(r["samples_per_s"] for r in b.scaling if r["workers"] == 1)
    row = run_loader(Cycled(ds), list(range(32)), 2, 8, default_collate, 2.0, predicted, 0, None)
    real = row["samples_per_s"]
    return {"one_worker": one, "predicted_2": float(predicted), "model_2": model_2, "real_2": real,
            "error": predicted / real - 1, "model_error": model_2 / real - 1,
            "anchor": (predicted.details["anchor"] or {}).get("factor")}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    cores = machine.usable_cores()
    rows = []
    for r in range(args.rounds):
        probe = machine.work_scaling(machine.python_unit, cores)
        row: dict[str, Any] = {"probe": probe, "wall": wall_scaling(cores)}
        for name, ds in (("numpy", NumpyWork()), ("python", PythonWork())):
            row[name] = predicted_vs_real(ds)
        print(f"round {r}: probe {row['probe']:.3f}, wall ×{row['wall']:.2f}; " + "; ".join(
            f"{n}: 1 worker {row[n]['one_worker']:.0f}, 2 real {row[n]['real_2']:.0f}, predicted "
            f"{row[n]['predicted_2']:.0f} ({row[n]['error']:+.1%}), model alone "
            f"{row[n]['model_2']:.0f} ({row[n]['model_error']:+.1%})" for n in ("numpy", "python")
        ), flush=True)  # fmt: skip
        rows.append(row)
    kinds = ("numpy", "python")
    med = {
        "probe": statistics.median(r["probe"] for r in rows),
        "wall": statistics.median(r["wall"] for r in rows),
        **{f"{n}_error": statistics.median(r[n]["error"] for r in rows) for n in kinds},
        **{f"{n}_model_error": statistics.median(r[n]["model_error"] for r in rows) for n in kinds},
        **{
            f"{n}_scaling": statistics.median(r[n]["real_2"] / r[n]["one_worker"] for r in rows)
            for n in kinds
        },
    }
    print("medians:", {k: round(v, 3) for k, v in med.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cores": cores, "rounds": rows, "medians": med}, f, indent=1)


if __name__ == "__main__":
    main()
