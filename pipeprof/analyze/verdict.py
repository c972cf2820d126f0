"""The verdict: what limits a training loop (input, transfer, overhead or compute), or a loader.

Thresholds start from TensorFlow's input-bound rule (>= 20 % of step time waiting is "high",
>= 5 % "moderate") and torch-tb-profiler's (DataLoader time > 5 %); see docs/findings.md.
"""

from __future__ import annotations

from typing import Any

HIGH_WAIT = 0.20  # TensorFlow's profiler: "highly input-bound"
MODERATE_WAIT = 0.05  # ... "moderately input-bound"; torch-tb-profiler's DataLoader > 5 %


def loop_view(loop: dict[str, Any]) -> dict[str, Any]:
    """The figures the verdict reads: the steady state when the loop section says so (``view``,
    see ``analyze.loop.steady_enough``), else all steps."""
    return (loop.get("steady") or {}) if loop.get("view") == "steady" else loop


def loop_verdict(report: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """input-, transfer- or overhead-bound when that share of step time passes 5 % (high at
    20 %) and is the largest non-compute share; compute-bound otherwise."""
    view = loop_view(report["loop"])
    shares = {k: view.get(f"{k}_fraction") or 0.0 for k in ("wait", "transfer", "overhead")}
    part = max(shares, key=lambda k: shares[k])
    frac = shares[part]
    who = "the GPU" if (report.get("gpu") or {}).get("available") else "the loop"
    if frac < MODERATE_WAIT:
        return {
            "kind": "compute-bound",
            "severity": "low",
            "stage": None,
            "fraction": round(view.get("compute_fraction") or 0.0, 4),
            "headline": f"compute-bound: {who} spent "
            f"{view.get('compute_fraction') or 0:.0%} of step time computing; data was ready",
        }
    kind = {"wait": "input-bound", "transfer": "transfer-bound", "overhead": "overhead-bound"}[part]
    what = {
        "wait": "waited for data",
        "transfer": "copied batches to the device",
        "overhead": "ran non-compute regions (logging, callbacks)",
    }[part]
    handover = part == "wait" and handover_led(report["loop"], view)
    stage = (
        (None if handover else facts["limiting"])
        if part == "wait"
        else ("transfer/h2d" if part == "transfer" else None)
    )
    headline = f"{kind}: {who} {what} {frac:.0%} of the time"
    if handover:
        per_step = (view.get("handover_s") or 0.0) * 1e3 / max(1, view.get("steps") or 1)
        headline += (
            f", but the batches were ready: the wait is their hand-over to the training "
            f"process ({per_step:.2g} ms per step), not a slow stage"
        )
    elif stage and part == "wait":
        headline += f"; {stage} limits the pipeline"
    out = {
        "kind": kind,
        "severity": "high" if frac >= HIGH_WAIT else "moderate",
        "stage": stage,
        "fraction": round(frac, 4),
        "headline": headline,
    }
    if part == "wait":
        out["cause"] = "hand-over" if handover else "starved"
    return out


def handover_led(loop: dict[str, Any], view: dict[str, Any]) -> bool:
    """The loop's wait is mostly hand-over: its batches were ready when it asked (NOTE [ Wait,
    split ] in collect/torch/loader.py). Only a loop that was starved has a limiting stage."""
    wait, handover = view.get("wait_s") or 0.0, view.get("handover_s") or 0.0
    return bool(loop.get("wait_split_known")) and wait > 0 and handover > 0.5 * wait


def empty_verdict(report: dict[str, Any]) -> dict[str, Any]:
    """Nothing to judge: no batch reached the loop (a crash, Ctrl-C or an empty loader)."""
    what = "no step" if report.get("loop") else "no batch"
    why = " before the profile was interrupted" if report.get("interrupted") else ""
    return {
        "kind": "balanced",
        "severity": "info",
        "stage": None,
        "headline": f"nothing to attribute: {what} was measured{why}",
        "note": "run at least a few batches; any stage times shown are from what did run",
    }


def loader_verdict(report: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """A loader profiled alone has no compute to compare with: name what limits its rate."""
    path = facts["limiting"]
    rate = (report.get("steady") or {}).get("samples_per_s") or report["throughput"][
        "samples_per_s"
    ]
    headline = f"the loader delivers {rate or 0:.0f} samples/s"
    if path:
        share = report["stages"][path]["total_s"] / (facts["pipeline_s"] or 1)
        headline += f"; {path} limits it ({share:.0%} of pipeline time)"
    wait = report.get("wait") or {}
    if wait.get("split_known") and (wait.get("handover_s") or 0) > (wait.get("starved_s") or 0):
        headline += (
            f"; a ready batch takes {wait['handover_ms_per_batch']:.2g} ms to reach this "
            "process (hand-over)"
        )
    return {
        "kind": "balanced",
        "severity": "info",
        "stage": path,
        "headline": headline,
        "note": "loader profiled alone: wrap a training loop to attribute wait vs compute",
    }
