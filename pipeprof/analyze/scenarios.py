"""The Report's ``what_if`` list: the worker-pool model of whatif.py, built from a profile.

A profile has each stage's wall time inside the workers but no CPU time per stage: the workers'
CPU share comes from their own CPU clocks (read once per batch), else from the host sampler when it
ran, else every stage counts as CPU-bound (the cautious side, said in each entry's ``basis``).

NOTE [ CPU training shares the cores ]
On a CPU-only run the training step computes on the same cores the workers load on. While it
computes it keeps ``o`` cores busy: the training process's CPU time during its compute phases
(read from the process's CPU clock when a batch is handed over and when the next is asked for)
over their wall time, rounded, at most ``torch.get_num_threads()``. A step's threads wait for
each other (torch's thread pool: the fastest spin until the slowest is done), so CPU work of the
pipeline that lands on their cores delays the step by about as much: per step, the pipeline's
CPU ``D`` (loading a batch and receiving it) fits beside the step on its ``P - o`` spare cores
up to ``(P - o) × step``; the rest is added to the step. The pipeline, in turn, sees the step's
``o`` threads, and the cores other programs used during the run (the host sampler's), as
runnable tasks besides its own (``background`` in whatif.py). A step whose process used more
than 1.1 cores while computing is taken to want as many cores as it has threads (its ops split
over all of them); one that used half a core or more, one; less (a GPU computes, or the step
sleeps), none. The loop runs at the slower of the two, found by iteration (``loop_rate``). Fair
sharing (the step stretched by ``(o + w) / P``) was tried first: it promised ×1.06 where one
worker made the loop ×0.95 slower, on 2 cores. A step that fills the cores leaves loading
nowhere to go: moving it to workers buys little or nothing, and the findings say so instead of
promising the loader's rate. Measured: docs/validation/diagnosis.md.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pipeprof.analyze.budget import budget, limit
from pipeprof.analyze.loop import loop_floor, measured_rate
from pipeprof.analyze.verdict import handover_overlapped, other_load
from pipeprof.analyze.whatif import (
    Model,
    StageCost,
    _round,
    cached,
    ceiling,
    faster,
    solve,
    throughput,
    workers_to_feed,
)


def from_report(report: dict[str, Any], cores: int) -> Model | None:
    """A Model from a profile's stage totals (wall time in the workers, per sample).

    A profile has no CPU time per stage: every stage gets the workers' CPU share of their busy
    time (see the module's docstring).
    """
    samples, batches = report.get("samples") or 0, report.get("batches") or 0
    if not samples or not batches:
        return None
    cpu_share = worker_cpu_share(report)
    # NOTE [ Full cores are not waiting ]: a worker's busy time beyond its CPU time is waiting
    # (storage, the network, a sleep), which more workers overlap, unless the cores were full:
    # then it is the wait for a core, and more workers only wait longer. There, each stage
    # costs its CPU time and nothing more (the diagnosis matrix: 2.5 ms of Python a sample, 2
    # workers on 2 cores, read as half waiting, asked for 14 workers and promised more than the
    # loop then ran: 132 against 139-148 samples/s, where 2 workers ran it at 291-300)
    full = cpu_share is not None and cores_full(report, cores)
    effective, alone = scaled_cores(report, cores)
    stages = []
    for path, row in report["stages"].items():
        if path == "collate" or path.startswith("transfer") or row.get("derived"):
            continue
        wall = row.get("per_sample_ms") or row["total_s"] * 1e3 / samples  # of the timed samples
        cpu = wall * (1.0 if cpu_share is None else cpu_share)
        wall, cpu = wall - cpu * (1.0 - alone), cpu * alone  # its CPU at a lone core's speed
        stages.append(StageCost(path, cpu if full else wall, cpu))
    if not stages:
        return None
    row = report["stages"].get("collate") or {}
    collate = row.get("per_batch_ms") or row.get("total_s", 0.0) * 1e3 / batches
    size = max(1, round(samples / batches))
    # the main process receives one batch at a time: the measured hand-over per batch is the
    # floor of its time between batches, whatever the worker count
    handover = (report.get("wait") or {}).get("handover_ms_per_batch") or 0.0
    if not (report.get("meta") or {}).get("num_workers"):  # no workers, no hand-over to measure
        handover = 0.0
    if handover_overlapped(report):  # it overlapped busy workers: no floor
        handover = 0.0
    # collate is a stage of the workers' busy time like the others: it gets their CPU share too
    # (counted whole, the README demo's model put 129 ms of CPU in a batch where its workers'
    # own clocks measured 109, and its loop's rate with 3-5 workers 11-14 % under the rate
    # measured with them; now 4-7 %)
    collate_cpu = collate * (1.0 if cpu_share is None else cpu_share)
    collate, collate_cpu = collate - collate_cpu * (1.0 - alone), collate_cpu * alone
    return Model(tuple(stages), size, effective, 0.0, collate_cpu if full else collate,
                 collate_cpu, handover_ms=handover, shards=stream_shards(report))  # fmt: skip


def stream_shards(report: dict[str, Any]) -> int | None:
    """The shards an iterable dataset says it has (``accounting.shards``: Hugging Face's
    ``num_shards``, a WebDataset's shard list): workers past them get no data."""
    acc = report.get("accounting") or {}
    shards = acc.get("shards") if (report.get("meta") or {}).get("iterable") else None
    return shards if isinstance(shards, int) and shards > 0 else None


def scaled_cores(report: dict[str, Any], cores: int) -> tuple[float, float]:
    """(the cores as the model counts them, a stage's cost alone over its cost in this run).

    NOTE [ Cores are not all equal ] (collect/machine.py): with every core busy, each does
    ``per_process`` of a lone core's work, so ``P`` cores count as ``P × per_process``. The
    stage costs were measured with the run's own ``m`` busy processes (its CPU time over its wall
    time, the training process's and the workers'): each ran at ``1 - (1 - per_process) ×
    (m - 1) / (P - 1)`` of its lone speed, taken as linear between one busy process and ``P``.
    A profile without the probe (older files, a probe that could not run) counts whole cores.
    """
    scaling = (report.get("meta") or {}).get("core_scaling") or {}
    per = scaling.get("per_process")
    if not isinstance(per, (int, float)) or not 0 < per < 1 or cores < 2:
        return float(cores), 1.0
    m = min(float(cores), max(1.0, busy_cores(report) or 1.0))
    speed = 1.0 - (1.0 - per) * (m - 1.0) / (cores - 1.0)
    return max(1.0, cores * per), speed


FULL_CORES = 0.85  # CPU time over wall time, of all cores: what a busy 2-core VM reaches


def busy_cores(report: dict[str, Any]) -> float | None:
    """Cores the profiled job kept busy on average: the training process's CPU time and its
    workers', over the profile's wall time (None: no wall time)."""
    wall, meta = report.get("wall_s") or 0.0, report.get("meta") or {}
    if not wall:
        return None
    main_ns = meta.get("main_cpu_ns")
    main = main_ns / 1e9 if isinstance(main_ns, int) else 0.0
    workers = sum(w.get("cpu_s") or 0.0 for w in report.get("workers") or [])
    return (main + workers) / wall


def cores_full(report: dict[str, Any], cores: int) -> bool:
    """The profiled job filled the cores: the training process's CPU time and its workers' are
    at least ``FULL_CORES`` of them over the profile. Other programs' load is not counted: under
    it, waiting workers still wait, and more workers get more of a fairly shared CPU."""
    busy = busy_cores(report)
    return bool(busy is not None and cores and busy >= FULL_CORES * cores)


def training_cores(report: dict[str, Any], cores: int) -> int:
    """The cores a CPU-only training step keeps busy while it computes (0: a GPU computes, or
    nothing to tell). NOTE [ CPU training shares the cores ]."""
    loop, meta = report.get("loop") or {}, report.get("meta") or {}
    gpu = (report.get("gpu") or {}).get("available")
    device = str(meta.get("device") or "")
    if not loop or gpu or device.startswith("cuda") or report.get("framework") == "tf":
        return 0
    compute_s, cpu_s = loop.get("compute_s") or 0.0, (meta.get("compute_cpu_ns") or 0) / 1e9
    if compute_s <= 0 or cpu_s <= 0:  # a file from before the compute's CPU time was kept
        return 0
    busy = cpu_s / compute_s  # cores used on average while computing
    threads = min(cores, int(meta.get("torch_threads") or 1))
    if busy > 1.1:  # a multi-threaded step: its ops want every thread's core at once
        return threads
    return 1 if busy >= 0.5 else 0


def loop_rate(
    model: Model, floor: dict[str, float], workers: int, occupied: int, others: float = 0.0
) -> float:
    """Samples/s the training loop runs at with ``workers`` workers: its steps when data is
    ready (``floor``), or the pipeline's rate; on a CPU-only run the pipeline and the training
    step share the cores (``occupied``: the step's, NOTE [ CPU training shares the cores ])
    with what other programs used (``others``, in cores)."""
    b = model.batch_size
    if workers == 0:  # loading and the step take turns in one process
        return b * 1e3 / (floor["step_ms"] + model.batch_ms(send=False)[0])
    busy = model.background + occupied + (others if occupied else 0.0)
    pipe = solve(replace(model, background=busy), workers)["samples_per_s"]
    period = b * 1e3 / pipe if pipe > 0 else math.inf
    if not occupied:
        return b * 1e3 / max(period, floor["step_ms"])
    cpu = model.batch_ms()[1] + model.main_ms  # the pipeline's CPU ms per batch
    spare_cores = max(0.0, model.cores - occupied - others)
    # What does not fit beside the step's threads delays the step: its time s solves
    # s = floor + max(0, cpu - spare * s). The right side falls as s grows, so there is one
    # solution, in closed form. (Iterating the equation does not find it: with one spare core
    # it swings between two values for ever, with more it swings wider.)
    step = floor["step_ms"]
    if cpu > spare_cores * step:
        step = (step + cpu) / (1.0 + spare_cores)
    return b * 1e3 / max(period, step)


def worker_cpu_share(report: dict[str, Any]) -> float | None:
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


def worker_rows(
    report: dict[str, Any], cores: int, ks: list[int], model: Model | None = None,
    floor: dict[str, Any] | None = None, basis: str = "",
) -> list[dict[str, Any]]:
    """The what-if's rows for ``ks`` workers: the rate each would run at (a training loop's,
    with the loader's alone as ``loader_samples_per_s``), what limits it, and the budget it
    exceeds. ``pipeprof tune`` reads the promises of the worker counts it tries here."""
    model = model or from_report(report, cores)
    if model is None:
        return []
    if floor is None:
        floor = loop_floor(report.get("loop") or {}, model.batch_size,
                           handover=not handover_overlapped(report))  # fmt: skip
    occupied = training_cores(report, cores)
    others = (other_load(report) or {}).get("other_cores", 0.0)
    held = budget(report, cores)  # NOTE [ The workers' budget ] in budget.py
    rows = []
    for k in ks:
        res = solve(model, k)
        row = {"kind": "workers", "workers": k, "limit": res["limit"], "basis": basis,
               "samples_per_s": round(res["samples_per_s"], 1),
               "exceeds": limit(held, k)}  # fmt: skip
        if floor:  # a training loop: the rate it runs at, and the loader's alone, labelled
            row["loader_samples_per_s"] = row["samples_per_s"]
            row["samples_per_s"] = round(loop_rate(model, floor, k, occupied, others), 1)
            row["training_cores"] = occupied
        rows.append(row)
    return rows


def report_what_if(report: dict[str, Any], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The Report's ``what_if`` list: throughput at other worker counts, the ceiling, the
    workers that feed the measured compute, and the limiting stage made 2× faster or cached."""
    cores = int(facts["cores"])
    model = from_report(report, cores)
    if model is None:
        return []
    basis = "model from this profile's stage times" + (
        ", the loading processes' CPU share measured"
        if worker_cpu_share(report) is not None
        else ", stages taken as CPU-bound (pipeprof.bench measures their CPU time)"
    )
    if model.cores < cores:  # NOTE [ Cores are not all equal ]: say what the model took
        basis += (f", the {cores} cores counted as {model.cores:.3g}: busy at once, each did "
                  f"{model.cores / cores:.0%} of a lone core's work (measured)")  # fmt: skip
    n = int(facts["n_workers"])
    floor = loop_floor(report.get("loop") or {}, model.batch_size,
                       handover=not handover_overlapped(report))  # fmt: skip
    measured = measured_rate(report["loop"], model.batch_size) if floor else None
    ks = sorted({1, 2, 4, 8, cores, max(1, cores - 1), max(1, n)})
    out: list[dict[str, Any]] = []
    for row in worker_rows(report, cores, ks, model, floor, basis):
        if floor and row["workers"] == n and measured:  # the model's figure beside the run's
            row["measured_samples_per_s"] = round(measured, 1)
        out.append(row)
    top, top_k = ceiling(model)
    out.append({"kind": "ceiling", "workers": top_k, "samples_per_s": _round(top),
                "basis": f"the most any worker count gives on {cores} cores"})  # fmt: skip
    if floor:
        rate = floor["samples_per_s"]
        out.append({"kind": "data-free", "samples_per_s": round(rate, 1),
                    "basis": "measured compute, transfer, other regions and hand-over per step: "
                    "the loop's rate if batches were always ready"})  # fmt: skip
        out.append({"kind": "workers-for-compute", "workers": workers_to_feed(model, rate),
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
