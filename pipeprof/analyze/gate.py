"""A regression gate for CI (docs/gate.md): conditions over two reports (``pipeprof compare
--fail-if``) or over one against fixed budgets (``pipeprof check --max/--min``).

NOTE [ The gate ]
A condition is ``METRIC OP VALUE``: ``throughput < -5%``, ``wait_fraction > +0.05``,
``stage:load/decode.per_sample_ms > +10%``, ``wait_fraction > 0.3``. ``OP`` is one of ``<``,
``<=``, ``>``, ``>=``. A signed ``VALUE`` is a change from the first report to the second: with
``%`` relative to the first (``-5%``: five percent less), without it in the metric's own unit
(``+0.05``: five points more of a fraction). An unsigned ``VALUE`` is a bound on the second
report's own figure (the only kind ``check`` takes: ``--max wait_fraction=0.1`` is
``wait_fraction > 0.1``). The gate fails when a condition holds.

A change is judged against the run-to-run noise of the two reports (``noise`` of the comparison's
delta, analyze/compare.py: the 95 % half-width of a change between two runs of the same
pipeline, from each run's spread of steps): a condition on a change that holds but whose change
is within that noise does not fail the gate unless ``strict``; it is reported as "within noise".
A metric that either report lacks fails the gate (a gate that cannot see is no gate), as
"not measured".
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from typing import Any

GATE_SCHEMA = "pipeprof-gate/1"
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
}  # fmt: skip
# a metric's name -> where the comparison holds it: (section, key) of ``loop``, else ``overview``
_LOOP = {
    "throughput": "samples_per_s",
    "samples_per_s": "samples_per_s",
    "wait_fraction": "wait_fraction",
    "transfer_fraction": "transfer_fraction",
    "compute_fraction": "compute_fraction",
    "overhead_fraction": "overhead_fraction",
    "step_ms": "step_mean_ms",
    "step_mean_ms": "step_mean_ms",
    "step_p95_ms": "step_p95_ms",
    "startup_s": "startup_s",
    "gpu_idle_fraction": "gpu_idle_while_waiting_fraction",
}
_OVERVIEW = {
    "throughput": "samples_per_s",
    "samples_per_s": "samples_per_s",
    "startup_s": "startup_s",
    "gpu_util": "gpu_util_mean",
    "cpu_util": "cpu_util_mean",
    "wait_p50_ms": "wait_p50_ms",
    "wait_p95_ms": "wait_p95_ms",
}
_STAGE_FIELDS = ("per_sample_ms", "per_batch_ms", "p95_ms", "share")
METRICS = sorted({*_LOOP, *_OVERVIEW}) + [f"stage:PATH.{f}" for f in _STAGE_FIELDS]
_CONDITION = re.compile(r"^\s*(?P<metric>\S+?)\s*(?P<op><=|>=|<|>)\s*(?P<value>\S+)\s*$")
_VALUE = re.compile(r"^(?P<sign>[+-]?)(?P<number>\d+(?:\.\d*)?|\.\d+)(?P<pct>%?)$")


class GateError(ValueError):
    """A condition that cannot be read (exit 2)."""


def parse(text: str) -> dict[str, Any]:
    """``METRIC OP VALUE`` as ``{text, metric, op, value, change, relative}`` (NOTE [ The
    gate ]); GateError says what is wrong."""
    got = _CONDITION.match(text)
    if not got:
        raise GateError(
            f"cannot read the condition {text!r}: write METRIC OP VALUE, e.g. 'throughput < -5%'"
            ", 'wait_fraction > +0.05' or 'wait_fraction > 0.3' (OP: <, <=, >, >=)"
        )
    metric, op, raw = got["metric"], got["op"], got["value"]
    _check_metric(metric, text)
    value = _VALUE.match(raw)
    if not value:
        raise GateError(
            f"cannot read the value {raw!r} in {text!r}: a number, signed for a change "
            "(+0.05, -5%), unsigned for a bound on the second report's figure (0.3)"
        )
    change = bool(value["sign"])
    relative = bool(value["pct"])
    if relative and not change:
        raise GateError(
            f"{raw!r} in {text!r}: a percentage is a change and takes a sign ('-5%', '+10%')"
        )
    number = float(value["number"]) * (-1 if value["sign"] == "-" else 1)
    return {"text": text.strip(), "metric": metric, "op": op,
            "value": number / 100 if relative else number, "change": change,
            "relative": relative}  # fmt: skip


def budget(text: str, kind: str) -> dict[str, Any]:
    """``METRIC=VALUE`` of ``check --max`` (``kind`` "max") or ``--min`` as a condition."""
    metric, sep, raw = text.partition("=")
    if not sep or not metric.strip() or not raw.strip():
        raise GateError(f"cannot read --{kind} {text!r}: write METRIC=VALUE, e.g. "
                        "'wait_fraction=0.1'")  # fmt: skip
    if raw.strip()[:1] in "+-":
        raise GateError(f"--{kind} {text!r}: a budget is a figure of the report, unsigned")
    return parse(f"{metric.strip()} {'>' if kind == 'max' else '<'} {raw.strip()}")


def _check_metric(metric: str, text: str) -> None:
    if metric.startswith("stage:"):
        path, dot, field = metric[len("stage:"):].rpartition(".")
        if dot and path and field in _STAGE_FIELDS:
            return
        raise GateError(
            f"cannot read the stage metric {metric!r} in {text!r}: write stage:PATH.FIELD, "
            f"FIELD one of {', '.join(_STAGE_FIELDS)} (e.g. stage:load/decode.per_sample_ms)"
        )
    if metric not in _LOOP and metric not in _OVERVIEW:
        raise GateError(f"unknown metric {metric!r} in {text!r}: one of {', '.join(METRICS)}")


def figure(comparison: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """A metric's delta in a comparison dict (analyze/compare.py); None where it has none."""
    if metric.startswith("stage:"):
        path, _, field = metric[len("stage:"):].rpartition(".")
        return ((comparison.get("stages") or {}).get(path) or {}).get(field)
    loop = comparison.get("loop")
    if loop and metric in _LOOP:
        return loop.get(_LOOP[metric])  # type: ignore[no-any-return]
    if metric in _OVERVIEW:
        return (comparison.get("overview") or {}).get(_OVERVIEW[metric])  # type: ignore[no-any-return]
    return None


def evaluate(
    comparison: dict[str, Any], conditions: list[dict[str, Any]], strict: bool = False,
    one: bool = False,
) -> dict[str, Any]:
    """Each condition against the comparison (NOTE [ The gate ]): ``{schema, passed, failed,
    conditions: [{text, before, after, change, relative_change, noise, holds, result}]}``,
    ``result`` one of "pass", "fail", "within noise", "not measured". With ``one`` the
    comparison is of one report with itself (``check``): its figure is ``after``, and there is
    no ``before`` nor noise."""
    rows = [_row(comparison, c, strict) for c in conditions]
    if one:
        rows = [{**r, "before": None, "noise": None} for r in rows]
    failed = [r["text"] for r in rows if r["result"] in ("fail", "not measured")]
    machine = comparison.get("machine") or {}
    return {"schema": GATE_SCHEMA, "passed": not failed, "failed": failed,
            "strict": strict, "one_report": one,
            "machine": machine.get("note") if machine.get("differs") else None,
            "conditions": rows}  # fmt: skip


def _row(comparison: dict[str, Any], cond: dict[str, Any], strict: bool) -> dict[str, Any]:
    d = figure(comparison, cond["metric"]) or {}
    before, after = d.get("before"), d.get("after")
    row: dict[str, Any] = {"text": cond["text"], "metric": cond["metric"], "before": before,
                           "after": after, "change": None, "relative_change": None,
                           "noise": d.get("noise"), "holds": None}  # fmt: skip
    if after is None or (cond["change"] and before is None):
        return {**row, "result": "not measured"}
    if cond["change"]:
        change = after - before
        row["change"] = round(change, 9)
        row["relative_change"] = round(change / before, 6) if before else None
        seen = row["relative_change"] if cond["relative"] else change
        if seen is None:  # relative to a figure of 0
            return {**row, "result": "not measured"}
        holds = _OPS[cond["op"]](seen, cond["value"])
        noisy = d.get("noise") is not None and abs(change) <= d["noise"]
        row["holds"] = holds
        result = "pass" if not holds else ("within noise" if noisy and not strict else "fail")
        return {**row, "result": result}
    holds = _OPS[cond["op"]](after, cond["value"])
    return {**row, "holds": holds, "result": "fail" if holds else "pass"}
