"""``analyze``: the pure function from a Session to the report dictionary (schema ``pipeprof/1``).

Nothing here prints, draws or reads a clock: the same Session always gives the same report.
"""

from __future__ import annotations

from typing import Any

from pipeprof.analyze.accounting import accounting
from pipeprof.analyze.fetch import fetch_section, object_rows
from pipeprof.analyze.finding import Finding, Verdict, pipeline_facts
from pipeprof.analyze.hdf5 import h5_section
from pipeprof.analyze.loop import loop_section, timeline
from pipeprof.analyze.rules import RULES
from pipeprof.analyze.scenarios import report_what_if
from pipeprof.analyze.stages import (
    overhead,
    stage_table,
    throughput,
    timed_batches,
    worker_table,
)
from pipeprof.analyze.tokens import tokens_section
from pipeprof.analyze.verdict import empty_verdict, loader_verdict, loop_verdict
from pipeprof.core.session import Session
from pipeprof.core.stats import Figures, Stat, figures

SCHEMA = "pipeprof/1"
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def analyze(session: Session) -> dict[str, Any]:
    """The report dictionary for ``session`` (the report contract: docs/schema.md)."""
    with session.settled():  # queued records folded in; no background fold while we read
        return _analyze(session)


def _analyze(session: Session) -> dict[str, Any]:
    stages = stage_table(session)
    overall, steady = throughput(session)
    workers = worker_table(session, session.wall_ns)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": session.mode,
        "framework": session.framework,
        "batches": session.batches,
        "samples": session.samples,
        "wall_s": round(session.wall_ns / 1e9, 9),
        "throughput": overall,
        "startup_s": round(session.first_batch_ns / 1e9, 9)
        if session.first_batch_ns is not None
        else None,
        "steady": steady,
        "latency": _latency(session.wait),
        "wait": wait_section(session),
        "stages": stages,
        "loop": loop_section(session, session.samples / max(session.batches, 1)),
        "workers": workers,
        "gpu": session.gpu,
        "host": session.host,
        "meta": _meta(session),
        "notes": list(session.notes),
        "interrupted": session.interrupted,
        "overhead": overhead(session, stages),
    }
    if report["gpu"] is not None and report["loop"] is not None:
        report["gpu"] = {
            **report["gpu"],
            "idle_while_waiting_fraction": report["loop"]["idle_while_waiting_fraction"],
        }
    if session.h5:  # h5py reads were timed (docs/hdf5.md)
        report["hdf5"] = h5_section(session)
    if session.fetch:  # HTTP requests were timed (docs/streaming.md)
        report["fetch"] = fetch_section(session)
    if session.tokens:  # token batches (NOTE [ Padding ] in analyze/tokens.py)
        report["tokens"] = tokens_section(session)
    report["timeline"] = timeline(session)
    report["accounting"] = accounting(session)
    report["verdict"], report["findings"], report["what_if"] = assess(report)
    return report


def _meta(session: Session) -> dict[str, Any]:
    """The session's meta; where the loader's stages were timed in a sample of the batches
    (``stage_every``), with how many batches they were timed in (``timed_batches``), and
    without the first batches' stage time (``first_batches``: the session's, for the stage
    table; NOTE [ Unprofiled batches ] in collect/torch/loader.py)."""
    if "stage_every" not in session.meta:
        return session.meta
    meta = {k: v for k, v in session.meta.items() if k != "first_batches"}
    meta["timed_batches"] = timed_batches(session)
    return meta


def what_if(report: dict[str, Any], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """Throughput at other worker counts, the ceiling, the workers that feed the measured
    compute, the limiting stage 2× faster or cached, larger objects for a latency-bound fetch:
    the model of analyze/whatif.py (estimates)."""
    if report.get("framework") == "tf":  # tf.data runs in threads: worker counts do not apply
        return []
    return report_what_if(report, facts) + object_rows(report, facts)


def assess(report: dict[str, Any]) -> tuple[Verdict, list[Finding], list[dict[str, Any]]]:
    """Verdict, findings (most severe first) and what-if estimates for a report."""
    facts = pipeline_facts(report)
    loop = report.get("loop")
    if not (loop.get("steps") if loop else report.get("batches")):
        verdict = empty_verdict(report)
    else:
        verdict = loop_verdict(report, facts) if loop else loader_verdict(report, facts)
    report["verdict"] = verdict  # rules read it
    found = [f for rule in RULES if (f := rule(report, facts)) is not None]
    if verdict["kind"] in ("compute-bound", "comm-bound"):  # the pipeline does not limit now
        found = [_not_now(f, verdict["kind"]) if f["id"] in PIPELINE_ONLY else f for f in found]
    found.sort(key=lambda f: SEVERITY_ORDER.get(f["severity"], 3))  # stable: RULES' order
    return verdict, found, what_if(report, facts)


def wait_section(session: Session) -> dict[str, Any]:
    """The consumer's wait per batch after the first, split (NOTE [ Wait, split ] in
    collect/torch/loader.py): *starved* while the batch was not ready, *hand-over* while a ready
    batch moved to the training process; and the batch's size in bytes."""
    n = session.wait.count
    starved = session.starved.total_ns if session.starved.count else session.wait.total_ns
    handover = session.handover.total_ns if session.starved.count else 0
    size = session.batch_bytes
    return {
        "batches": n,
        "total_s": round(session.wait.total_ns / 1e9, 9),
        "starved_s": round(starved / 1e9, 9),
        "handover_s": round(handover / 1e9, 9),
        "starved_ms_per_batch": round(starved / n / 1e6, 6) if n else None,
        "handover_ms_per_batch": round(handover / n / 1e6, 6) if n else None,
        "startup_s": round(session.first_batch_ns / 1e9, 9)
        if session.first_batch_ns is not None
        else None,
        "split_known": bool(session.meta.get("wait_split")),
        "batch_mb": round(size.total_ns / size.count / 1e6, 6) if size.count else None,
    }


# Findings about the pipeline's own speed: on a compute-bound loop they save no training time.
PIPELINE_ONLY = {
    "dominant-stage",
    "no-workers",
    "workers-saturated",
    "worker-imbalance",
    "uneven-shards",
    "fetch-cache",
}


def _not_now(f: Finding, kind: str = "compute-bound") -> Finding:
    """A pipeline finding on a compute- or comm-bound loop: informational, and it says why."""
    return {
        **f,
        "severity": "info",
        "message": f["message"] + f" (the loop is {kind}: this does not slow training now)",
    }


def _latency(wait: Stat) -> Figures:
    """Time the consumer waited in next() per batch, after the first one."""
    return figures(wait)
