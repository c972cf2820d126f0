"""What every rule shares: the Finding record and the facts about the pipeline it reads.

A finding carries the figures it rests on (``evidence``, units in the key names) and a fix with
numbers (docs/findings.md).
"""

from __future__ import annotations

import os
from typing import Any, Literal, TypedDict

Severity = Literal["critical", "warning", "info"]


class Finding(TypedDict):
    """One finding of the report's ``findings`` list (docs/schema.md)."""

    id: str  # the rule's name: ``workers-needed``, ``dominant-stage``...
    severity: Severity
    stage: str | None  # the stage path it is about, if one
    message: str  # what was found, with its figures
    evidence: dict[str, Any]  # the figures it rests on, units in the key names
    fix: str  # what to change, with what following it gains


class _Verdict(TypedDict):
    # input-bound, transfer-bound, comm-bound, overhead-bound, compute-bound; balanced (a loader
    # alone, or nothing to judge)
    kind: str
    severity: str  # high, moderate, low; info
    stage: str | None  # the limiting stage, the first of ``stages``
    stages: list[str]  # the limiting stage and any within STAGE_MARGIN of it
    headline: str


class Verdict(_Verdict, total=False):
    """The report's ``verdict`` (docs/schema.md): what limits the loop, or the loader; the keys
    of ``_Verdict`` always, these where they apply."""

    fraction: float  # the deciding share of step time
    cause: str  # input-bound only: starved, hand-over or start-up
    startup_fraction: float  # cause start-up: the epochs' start-ups' share of the loop
    workers_busy: float  # where >= 0.8: the workers' busy share of each step
    workers_cores: float  # where their CPU fills the cores: the share of the cores they keep busy
    handover_overlapped: bool
    borderline: bool  # a rerun's share could land past ``threshold``
    too_short: bool  # borderline because the run was too short to tell
    threshold: float | None
    wait_fraction_interval: list[float] | None  # [lo, hi], 95 %
    note: str  # a loader alone, or nothing measured: what to do for a verdict


MAX_CORES = 4096
# The limiting stage is named alone only when the next one costs at least this much less: two
# stages closer than that trade places between identical runs (docs/findings.md).
STAGE_MARGIN = 0.10


def finding(
    fid: str, severity: Severity, stage: str | None, message: str, evidence: dict[str, Any],
    fix: str,
) -> Finding:
    """One finding: ``severity`` is critical, warning or info; ``stage`` the path it is about."""
    return {
        "id": fid,
        "severity": severity,
        "stage": stage,
        "message": message,
        "evidence": evidence,
        "fix": fix,
    }


def leaves(stages: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Where time is actually spent: stages with no children, and a timed parent's own time
    outside its children (``load`` when only part of it is marked ``pipeprof.stage("read")``)."""
    kids: dict[str, float] = {}
    for path, row in stages.items():
        if "/" in path:
            parent = path.rsplit("/", 1)[0]
            kids[parent] = kids.get(parent, 0.0) + row["total_s"]
    out = {}
    for path, row in stages.items():
        if path not in kids:
            out[path] = row
        elif not row.get("derived"):  # timed itself: its children ran inside it
            rest = row["total_s"] - kids[path]
            if rest > 0.01 * row["total_s"]:
                out[path] = {**row, "total_s": rest}
    return out


def pipeline_facts(report: dict[str, Any]) -> dict[str, Any]:
    """Figures several rules share: worker rates, the limiting stage, cores."""
    meta = report.get("meta", {})
    workers = [w for w in report["workers"] if w["track"].startswith("worker")]
    n_workers = int(meta.get("num_workers") or 0)
    cores = int(
        (report.get("host") or {}).get("cpu_count") or meta.get("cpu_count") or os.cpu_count() or 1
    )
    cores = min(max(cores, 1), MAX_CORES)  # a damaged file must not send the what-if searching
    busy_s = sum(w["busy_s"] for w in report["workers"])
    samples = sum(w["samples"] for w in report["workers"])
    rate = samples / busy_s if busy_s else None  # samples per busy second of one process
    parallel = max(1, len(workers)) if n_workers else 1
    costs = {}
    for path, row in leaves(report["stages"]).items():
        in_workers = row["tracks"] and all(t.startswith("worker") for t in row["tracks"])
        costs[path] = row["total_s"] / (parallel if in_workers else 1)
    ranked = sorted(costs, key=lambda p: costs[p], reverse=True)
    top = costs[ranked[0]] if ranked else 0.0
    group = [p for p in ranked if top > 0 and costs[p] >= (1 - STAGE_MARGIN) * top] or ranked[:1]
    if meta.get("limiting_stage") in report["stages"]:  # the collector knows better (tf.data)
        group = [meta["limiting_stage"]]
    limiting = group[0] if group else None
    pipeline_s = sum(r["total_s"] for r in leaves(report["stages"]).values()) or None
    return {
        "n_workers": n_workers,
        "cores": cores,
        "rate": rate,
        "limiting": limiting,
        "limiting_group": group,  # the limiting stage and any within STAGE_MARGIN of it
        "costs": costs,
        "pipeline_s": pipeline_s,
        "workers": workers,
        "busy_mean": (sum(w["busy_fraction"] or 0 for w in workers) / len(workers))
        if workers
        else None,
    }
