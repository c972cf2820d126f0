"""``analyze``: the pure function from a Session to the report dictionary (schema ``pipeprof/1``).

Nothing here prints, draws or reads a clock: the same Session always gives the same report.
"""

from __future__ import annotations

from typing import Any, TypedDict, cast

from pipeprof.analyze.accounting import Accounting, accounting
from pipeprof.analyze.fetch import FetchRow, fetch_section, object_rows
from pipeprof.analyze.finding import Finding, Verdict, pipeline_facts
from pipeprof.analyze.hdf5 import h5_section
from pipeprof.analyze.loop import LoopSection, loop_section, timeline
from pipeprof.analyze.rules import RULES
from pipeprof.analyze.scenarios import report_what_if
from pipeprof.analyze.stages import (
    Overhead,
    Rates,
    StageRow,
    SteadyRates,
    WorkerRow,
    overhead,
    stage_table,
    throughput,
    timed_batches,
    worker_table,
)
from pipeprof.analyze.tokens import Tokens, tokens_section
from pipeprof.analyze.verdict import empty_verdict, loader_verdict, loop_verdict
from pipeprof.core.session import Session
from pipeprof.core.stats import Figures, Stat, figures

SCHEMA = "pipeprof/1"
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


class _Measured(TypedDict):
    """What every profile measured: the report before its verdict (docs/schema.md's keys)."""

    schema: str
    mode: str  # "loader" (pipeprof.profile) or "loop" (Profiler)
    framework: str  # "torch" or "tf"
    batches: int
    samples: int
    wall_s: float
    throughput: Rates
    startup_s: float | None
    steady: SteadyRates
    latency: Figures
    wait: WaitSection
    stages: dict[str, StageRow]
    loop: LoopSection | None
    workers: list[WorkerRow]
    gpu: dict[str, Any] | None  # the NVML sampler's (collect/samplers)
    host: dict[str, Any] | None  # the psutil sampler's
    meta: dict[str, Any]
    notes: list[str]
    interrupted: bool
    overhead: Overhead
    timeline: dict[str, Any] | None
    accounting: Accounting | None


class Measured(_Measured, total=False):
    """... and what some did: ``hdf5``, ``fetch`` and ``tokens`` are there only where h5py
    reads, HTTP requests or token batches were seen."""

    hdf5: list[dict[str, Any]]
    fetch: list[FetchRow]
    tokens: Tokens | None


class RunReport(Measured):
    """The report of one profile, schema ``pipeprof/1`` (``Report.to_dict()``): what was
    measured, and what it means (tests/test_report.py holds docs/schema.md to these keys)."""

    verdict: Verdict
    findings: list[Finding]
    what_if: list[dict[str, Any]]


def analyze(session: Session) -> RunReport:
    """The report for ``session`` (the report contract: docs/schema.md)."""
    with session.settled():  # queued records folded in; no background fold while we read
        return _analyze(session)


def _analyze(session: Session) -> RunReport:
    stages = stage_table(session)
    overall, steady = throughput(session)
    loop = loop_section(session, session.samples / max(session.batches, 1))
    gpu = session.gpu
    if gpu is not None and loop is not None:
        gpu = {**gpu, "idle_while_waiting_fraction": loop["idle_while_waiting_fraction"]}
    measured: Measured = {
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
        "loop": loop,
        "workers": worker_table(session, session.wall_ns),
        "gpu": gpu,
        "host": session.host,
        "meta": _meta(session),
        "notes": list(session.notes),
        "interrupted": session.interrupted,
        "overhead": overhead(session, stages),
        "timeline": timeline(session),
        "accounting": accounting(session),
    }
    if session.h5:  # h5py reads were timed (docs/hdf5.md)
        measured["hdf5"] = h5_section(session)
    if session.fetch:  # HTTP requests were timed (docs/streaming.md)
        measured["fetch"] = fetch_section(session)
    if session.tokens:  # token batches (NOTE [ Padding ] in analyze/tokens.py)
        measured["tokens"] = tokens_section(session)
    # the rules read the report as plain data, the verdict in it once made
    verdict, findings, what_if_rows = assess(cast("dict[str, Any]", dict(measured)))
    return {**measured, "verdict": verdict, "findings": findings, "what_if": what_if_rows}


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


class WaitSection(TypedDict):
    """``wait``: the wait per batch after the first, split into starved and hand-over."""

    batches: int
    total_s: float
    starved_s: float
    handover_s: float
    starved_ms_per_batch: float | None
    handover_ms_per_batch: float | None
    startup_s: float | None
    split_known: bool
    batch_mb: float | None


def wait_section(session: Session) -> WaitSection:
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
