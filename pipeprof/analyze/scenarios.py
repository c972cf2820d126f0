"""The Report's ``what_if`` list: the worker-pool model of whatif.py, built from a profile.

A profile has each stage's wall time inside the workers but no CPU time per stage: the workers'
CPU share comes from their own CPU clocks (read once per batch), else from the host sampler when it
ran, else every stage counts as CPU-bound (the cautious side, said in each entry's ``basis``).
"""

from __future__ import annotations

from typing import Any

from pipeprof.analyze.loop import loop_floor
from pipeprof.analyze.whatif import (
    Model,
    StageCost,
    _round,
    cached,
    ceiling,
    faster,
    solve,
    throughput,
    workers_for,
)


def from_report(report: dict[str, Any], cores: int) -> Model | None:
    """A Model from a profile's stage totals (wall time in the workers, per sample).

    A profile has no CPU time per stage: every stage gets the workers' CPU share of their busy
    time (see the module's docstring).
    """
    samples, batches = report.get("samples") or 0, report.get("batches") or 0
    if not samples or not batches:
        return None
    cpu_share = _worker_cpu_share(report)
    stages = []
    for path, row in report["stages"].items():
        if path == "collate" or path.startswith("transfer") or row.get("derived"):
            continue
        wall = row["total_s"] * 1e3 / samples
        stages.append(StageCost(path, wall, wall * (1.0 if cpu_share is None else cpu_share)))
    if not stages:
        return None
    collate = report["stages"].get("collate", {}).get("total_s", 0.0) * 1e3 / batches
    size = max(1, round(samples / batches))
    # the main process receives one batch at a time: the measured hand-over per batch is the
    # floor of its time between batches, whatever the worker count
    handover = (report.get("wait") or {}).get("handover_ms_per_batch") or 0.0
    if not (report.get("meta") or {}).get("num_workers"):  # no workers, no hand-over to measure
        handover = 0.0
    return Model(tuple(stages), size, float(cores), 0.0, collate, collate, handover_ms=handover)


def _worker_cpu_share(report: dict[str, Any]) -> float | None:
    """CPU time / busy time of the workers: their own CPU clocks, else the host sampler's."""
    workers = [w for w in report.get("workers") or [] if w.get("cpu_s") and w.get("busy_s")]
    if workers:
        share = float(sum(w["cpu_s"] for w in workers) / sum(w["busy_s"] for w in workers))
        return min(1.0, share)
    procs = {p.get("pid"): p for p in ((report.get("host") or {}).get("per_process") or [])}
    shares = []
    for w in report.get("workers") or []:
        p, busy = procs.get(w.get("pid")), w.get("busy_fraction")
        cpu = p.get("cpu_mean") if p else None
        if isinstance(cpu, (int, float)) and busy:
            shares.append(min(1.0, cpu / 100.0 / busy))
    return sum(shares) / len(shares) if shares else None


def report_what_if(report: dict[str, Any], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The Report's ``what_if`` list: throughput at other worker counts, the ceiling, the
    workers that feed the measured compute, and the limiting stage made 2× faster or cached."""
    cores = int(facts["cores"])
    model = from_report(report, cores)
    if model is None:
        return []
    basis = "model from this profile's stage times" + (
        ", the loading processes' CPU share measured"
        if _worker_cpu_share(report) is not None
        else ", stages taken as CPU-bound (pipeprof.bench measures their CPU time)"
    )
    n = int(facts["n_workers"])
    out: list[dict[str, Any]] = []
    for k in sorted({1, 2, 4, 8, cores, max(1, cores - 1), max(1, n)}):
        res = solve(model, k)
        out.append({"kind": "workers", "workers": k, "limit": res["limit"], "basis": basis,
                    "samples_per_s": round(res["samples_per_s"], 1)})  # fmt: skip
    top, top_k = ceiling(model)
    out.append({"kind": "ceiling", "workers": top_k, "samples_per_s": _round(top),
                "basis": f"the most any worker count gives on {cores} cores"})  # fmt: skip
    floor = loop_floor(report.get("loop") or {}, model.batch_size)
    if floor:
        rate = floor["samples_per_s"]
        out.append({"kind": "data-free", "samples_per_s": round(rate, 1),
                    "basis": "measured compute, transfer, other regions and hand-over per step: "
                    "the loop's rate if batches were always ready"})  # fmt: skip
        out.append({"kind": "workers-for-compute", "workers": workers_for(model, rate),
                    "samples_per_s": round(rate, 1), "basis": basis})  # fmt: skip
    stage = facts.get("limiting")
    if stage in {s.path for s in model.stages}:
        k = max(1, n)
        for kind, m in (
            ("faster", faster(model, {stage: 2.0})),
            ("cached", cached(model, [stage])),
        ):
            out.append({"kind": kind, "stage": stage, "workers": k, "basis": basis,
                        "factor": 2.0 if kind == "faster" else None,
                        "samples_per_s": round(throughput(m, k), 1)})  # fmt: skip
    return out
