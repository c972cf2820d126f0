"""Validate pipeprof's what-if predictions against real DataLoader runs.

    .venv/bin/python benchmarks/whatif_validation.py                  # 3 rounds, ~3 minutes
    .venv/bin/python benchmarks/whatif_validation.py --rounds 5 --json whatif.json --nice -5

Every prediction comes from ``pipeprof.bench`` on a fixed sample set: each stage timed on its own
(wall and CPU time), the batch hand-over, the cores. It is then checked against a real DataLoader
over the same samples, run by ``pipeprof.bench.scaling.run_loader`` (steady samples/s after every
worker's first batch). Pipelines:

  cpu      two busy-loop steps, 2 + 1 ms per sample                (CPU-bound)
  waiting  3 ms sleep (storage-like) + 0.2 ms busy per sample      (waiting-bound)
  mixed    2 ms sleep + 1 ms busy per sample
  image    pipeprof's demo: 64 JPEGs (500×375) in ImageFolder layout, PIL read + decode,
           RandomResizedCrop(224), flip, ColorJitter, ToTensor, Normalize, batches of 16

Kinds of prediction checked:

  workers     throughput at k workers (k within the cores; waiting-bound also beyond them)
  feed        the fewest workers that feed a compute rate: measured at that count and one fewer
  compute     a training loop whose step waits (accelerator-like) for 1/rate s per sample:
              min(loader, compute) samples/s; and the same loop on in-memory batches (data free)
  faster      a stage made 2× faster (the busy step of ``cpu`` halved), predicted from the original
  cached      a stage made free (``waiting``'s sleep removed; ``image``'s load from memory)

The machine may be shared. Each measured run records the cores other programs kept busy during
it (``/proc/stat`` minus this process tree), and the model (``Bench.base``: all the cores, stage
costs from the stand-alone timings) re-predicts each run for that load ("model"); "probe" is what
``Bench.predict()`` says, from the CPU probe taken before the runs.
"run CPU" is the model fed the CPU per batch the workers actually used in that run (read from
``/proc/<pid>/task/*/schedstat``): it checks the scaling model alone, apart from how far the
stand-alone stage costs drift from the workers' (``cpu×`` in the log: on a VM whose host is shared,
memory-heavy steps cost ±20 % more or less CPU from one second to the next).
Error of one run: predicted / measured - 1; a set of runs is summarised by the geometric mean of
max(p/m, m/p) - 1 (so +10% and -10% count alike).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from typing import Any

import torch

import pipeprof
from pipeprof.analyze import whatif
from pipeprof.bench.scaling import Cycled, run_loader


def spin(ms: float) -> None:
    """``ms`` of this thread's CPU time: a fixed amount of work however busy the machine is (a
    wall-clock spin would do less work when other programs preempt it)."""
    end = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < end:
        pass


class Busy:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        spin(self.ms)
        return x


class Wait:
    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        time.sleep(self.ms / 1e3)
        return x


class Memo:
    """An ImageFolder whose decoded images come from memory: its ``load`` cached."""

    def __init__(self, dataset: Any, indices: list[int]) -> None:
        self.images = {i: dataset.loader(dataset.samples[i][0]) for i in indices}
        self.targets = {i: dataset.samples[i][1] for i in indices}
        self.transform = dataset.transform

    def __len__(self) -> int:
        return max(self.images) + 1

    def __getitem__(self, i: int) -> Any:
        return self.transform(self.images[i]), self.targets[i]


def tensors(n: int = 32) -> list[torch.Tensor]:
    return [torch.full((3,), float(i)) for i in range(n)]


def with_cpu(model: whatif.Model, factor: float) -> whatif.Model:
    """``model`` with every CPU millisecond ``factor`` times longer (the waiting unchanged)."""
    stages = tuple(replace(s, wall_ms=s.wall_ms + s.cpu_ms * (factor - 1), cpu_ms=s.cpu_ms * factor)
                   for s in model.stages)  # fmt: skip
    extra = model.collate_cpu_ms * (factor - 1)
    return replace(model, stages=stages, send_ms=model.send_ms * factor,
                   collate_cpu_ms=model.collate_cpu_ms * factor,
                   collate_wall_ms=model.collate_wall_ms + extra)  # fmt: skip


def gerr(pairs: list[tuple[float, float]]) -> float | None:
    """Geometric mean of max(p/m, m/p) - 1 over (predicted, measured) pairs."""
    logs = [abs(math.log(p / m)) for p, m in pairs if p and m]
    return math.exp(sum(logs) / len(logs)) - 1 if logs else None


class Validation:
    def __init__(self, seconds: float, cores: int) -> None:
        self.seconds, self.cores = seconds, cores
        self.rows: list[dict[str, Any]] = []
        self.timing_steal: float | None = None  # cores stolen while the current bench timed

    def bench(self, *args: Any, **kwargs: Any) -> pipeprof.Bench:
        b = pipeprof.bench(*args, **kwargs)
        self.timing_steal = b.config.get("stolen_cores_while_timing")
        return b

    def add(self, kind: str, case: str, k: int, measured: dict[str, Any], model: whatif.Model,
            probe: float, extra: str = "", predicted: float | None = None) -> None:  # fmt: skip
        """One check: the model re-predicted for the other programs' load during the run."""
        x = measured["samples_per_s"]
        others = measured.get("others_cores") or 0.0
        wcpu, alone = measured.get("worker_cpu_ms"), model.batch_ms()[1]
        run_cpu = None  # the scaling model alone: fed the CPU per batch the workers really used
        if predicted is None:
            m = replace(model, background=whatif.background_for(model, k, others))
            predicted = whatif.throughput(m, k)
            if wcpu and alone:
                run_cpu = whatif.throughput(with_cpu(m, wcpu / alone), k)
        row = {"kind": kind, "case": case, "workers": k, "measured": round(x, 2),
               "model": round(predicted, 2), "probe": round(probe, 2),
               "error": round(predicted / x - 1, 4), "probe_error": round(probe / x - 1, 4),
               "others_cores": others, "note": extra,
               "cpu_inflation": round(wcpu / alone, 3) if wcpu and alone else None,
               "run_cpu": round(run_cpu, 2) if run_cpu else None,
               "stolen_cores": measured.get("stolen_cores"),
               "stolen_cores_while_timing": self.timing_steal}  # fmt: skip
        self.rows.append(row)
        print(f"  {kind:8} {case:8} k={k:<2} measured {x:8.1f}  model {predicted:8.1f} "
              f"({row['error']:+.1%})  probe {probe:8.1f} ({row['probe_error']:+.1%})  "
              f"others {others:.2f} (stolen {measured.get('stolen_cores') or 0:.2f}) "
              f"cpu×{row['cpu_inflation'] or 0:.2f} {extra}",
              flush=True)  # fmt: skip

    def run(self, dataset: Any, idx: list[int], k: int, batch: int, **kw: Any) -> dict[str, Any]:
        expected = kw.pop("expected", None)
        return run_loader(dataset, idx, k, batch, torch.utils.data.default_collate, self.seconds,
                          expected, **kw)  # fmt: skip


def case_scaling(v: Validation, name: str, b: pipeprof.Bench) -> None:
    for r in b.scaling:
        k = r["workers"]
        v.add("workers", name, k, r, b.base, float(b.predict(workers=k)),
              "beyond cores" if k > v.cores else "")  # fmt: skip


def synthetic(v: Validation, batch: int) -> None:
    cores = v.cores
    cases = {
        "cpu": ([Busy(2.0), Busy(1.0)], sorted({1, cores})),
        "waiting": ([Wait(3.0), Busy(0.2)], sorted({1, 2, cores, 2 * cores, 4 * cores})),
        "mixed": ([Wait(2.0), Busy(1.0)], sorted({1, cores, 2 * cores})),
    }
    data = tensors()
    idx = list(range(len(data)))
    for name, (steps, ks) in cases.items():
        b = v.bench(data, steps, workers=ks, batch_size=batch, seconds=v.seconds)
        case_scaling(v, name, b)
        if name == "cpu":  # the first busy step made 2× faster, for real
            model = whatif.faster(b.base, {"transform/Busy": 2})
            for k in ks:
                real = v.run(Cycled(data, [Busy(1.0), Busy(1.0)]), idx, k, batch)
                p = b.predict(workers=k, speedup={"transform/Busy": 2})
                v.add("faster", name, k, real, model, float(p), "Busy(2 ms) at 1 ms")
        if name == "waiting":  # the sleep cached away; workers to feed a compute rate
            model = whatif.cached(b.base, ["transform/Wait"])
            for k in (1, cores):
                real = v.run(Cycled(data, [Busy(0.2)]), idx, k, batch, expected=5000)
                p = b.predict(workers=k, cached=["transform/Wait"])
                v.add("cached", name, k, real, model, float(p), "sleep removed")
            feed(v, name, b, data, steps, batch)
        if name == "mixed":
            compute(v, name, b, data, steps, batch)


def feed(v: Validation, name: str, b: pipeprof.Bench, data: list[Any], steps: list[Any],
         batch: int) -> None:  # fmt: skip
    """The fewest workers predicted to feed 95% of what 3 workers give: measured there and at
    one fewer (the rate must be reached there and missed one worker below)."""
    rate = 0.95 * whatif.throughput(b.base, 3)
    need = whatif.workers_for(b.base, rate)
    idx = list(range(len(data)))
    for k in (need - 1, need):
        real = v.run(Cycled(data, steps), idx, k, batch)
        ok = real["samples_per_s"] >= 0.95 * rate if k == need else real["samples_per_s"] < rate
        v.add("feed", name, k, real, b.base, float(b.predict(workers=k)),
              f"rate {rate:.0f}/s needs {need}: {'ok' if ok else 'WRONG'}")  # fmt: skip


def compute(v: Validation, name: str, b: pipeprof.Bench, data: list[Any], steps: list[Any],
            batch: int) -> None:  # fmt: skip
    """A training loop whose step waits 1/rate s per sample, fed by 1 worker: once
    compute-bound (rate below the loader's), once input-bound; and on in-memory batches."""
    idx = list(range(len(data)))
    loader_rate = whatif.throughput(b.base, 1)
    for factor in (0.6, 1.6):
        rate = factor * loader_rate

        def step(_: Any, s: float = batch / rate) -> None:
            time.sleep(s)

        real = v.run(Cycled(data, steps), idx, 1, batch, consume=step)
        p = b.predict(workers=1, compute_rate=rate)
        model_x = whatif.throughput(replace(b.base, background=whatif.background_for(
            b.base, 1, real.get("others_cores") or 0.0)), 1)  # fmt: skip
        v.add("compute", name, 1, real, b.base, float(p), f"compute {rate:.0f}/s",
              predicted=min(model_x, rate))  # fmt: skip
        free = v.run(Cycled([data[0]] * len(data)), idx, 0, batch, consume=step)
        v.add("compute", "free", 0, free, b.base, rate, f"data free at {rate:.0f}/s",
              predicted=rate)  # fmt: skip


def image(v: Validation, root: str, batch: int) -> None:
    from pipeprof.demo import demo_loader, make_images

    make_images(root, count=64)
    loader = demo_loader(root, workers=v.cores, batch_size=batch)
    ks = sorted({1, v.cores})
    b = v.bench(loader, samples=64, workers=ks, seconds=2 * v.seconds)
    case_scaling(v, "image", b)
    ds = loader.dataset
    idx = list(range(len(ds)))
    memo = Memo(ds, idx)
    model = whatif.cached(b.base, ["load"])
    for k in ks:
        real = v.run(memo, idx, k, batch, expected=float(b.predict(workers=k, cached=["load"])))
        v.add("cached", "image", k, real, model, float(b.predict(workers=k, cached=["load"])),
              "decoded images in memory")  # fmt: skip


STEAL = 0.02  # a run, or the timings it was predicted from, with more cores stolen is "disturbed"


def clean(r: dict[str, Any]) -> bool:
    """Neither the run nor the stand-alone timings behind it lost CPU to the hypervisor."""
    return (r.get("stolen_cores") or 0.0) <= STEAL and (
        r.get("stolen_cores_while_timing") or 0.0) <= STEAL  # fmt: skip


def summary(rows: list[dict[str, Any]], cores: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        beyond = r["workers"] > cores
        key = r["kind"] + (" (beyond cores)" if beyond else "")
        groups.setdefault(key, []).append(r)
        groups.setdefault(f"{key}: {r['case']}", []).append(r)
        if r["kind"] == "workers" and not beyond and r["case"] in ("cpu", "waiting"):
            groups.setdefault("workers: cpu + waiting", []).append(r)
            if clean(r):
                groups.setdefault("workers: cpu + waiting, undisturbed runs", []).append(r)
        if r["kind"] == "workers" and not beyond and clean(r):
            groups.setdefault(f"workers: {r['case']}, undisturbed runs", []).append(r)
    for key, rs in sorted(groups.items()):
        run_cpu = [(r["run_cpu"], r["measured"]) for r in rs if r.get("run_cpu")]
        out[key] = {
            "runs": len(rs),
            "geomean_error_model": round(gerr([(r["model"], r["measured"]) for r in rs]) or 0, 4),
            "geomean_error_probe": round(gerr([(r["probe"], r["measured"]) for r in rs]) or 0, 4),
            "geomean_error_run_cpu": round(gerr(run_cpu), 4) if run_cpu else None,
            "max_abs_error_model": round(max(abs(r["error"]) for r in rs), 4),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="repetitions of every case (3)")
    ap.add_argument("--seconds", type=float, default=1.0, help="steady time per run (1.0)")
    ap.add_argument("--batch", type=int, default=8, help="batch size of the synthetic cases")
    ap.add_argument("--nice", type=int, default=0, help="os.nice() increment (negative: root)")
    ap.add_argument("--only", default=None, help="comma-separated: synthetic,image")
    ap.add_argument("--json", default=None, help="write rows and summary here")
    ap.add_argument("--summarize", default=None, help="only summarise the rows of this JSON")
    args = ap.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            saved = json.load(f)
        report(summary(saved["rows"], saved["cores"]), saved["rows"])
        return 0
    if args.nice:
        os.nice(args.nice)
    only = set((args.only or "synthetic,image").split(","))
    cores = len(os.sched_getaffinity(0))
    v = Validation(args.seconds, cores)
    print(f"{cores} cores, load average {os.getloadavg()}, nice {os.nice(0)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pipeprof-whatif-") as tmp:
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", flush=True)
            if "synthetic" in only:
                synthetic(v, args.batch)
            if "image" in only:
                image(v, os.path.join(tmp, "img"), 16)
    summ = summary(v.rows, cores)
    report(summ, v.rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": v.rows, "summary": summ, "cores": cores,
                       "argv": sys.argv}, f, indent=1)  # fmt: skip
    return 0


def report(summ: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print("\nkind                               runs  geomean error: model  probe  run CPU"
          "  max |err| model")  # fmt: skip
    for key, s in summ.items():
        rc = s["geomean_error_run_cpu"]
        print(f"{key:34} {s['runs']:4}  {s['geomean_error_model']:19.1%}  "
              f"{s['geomean_error_probe']:5.1%}  {'' if rc is None else f'{rc:7.1%}':>7}  "
              f"{s['max_abs_error_model']:8.1%}")  # fmt: skip
    disturbed = sum(1 for r in rows if not clean(r))
    print(f"{disturbed} of {len(rows)} runs disturbed: over {STEAL} cores stolen by the "
          "hypervisor during the run or the timings behind its prediction")  # fmt: skip
    wrong = [r for r in rows if "WRONG" in r["note"]]
    print(f"feed decisions: {sum(1 for r in rows if r['kind'] == 'feed') - len(wrong)} right, "
          f"{len(wrong)} wrong; load average now {os.getloadavg()}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
