"""Before/after: what a change to the pipeline bought, stage by stage and for the loop.

``compare_dicts(before, after)`` compares two report dictionaries as plain data (schema
``pipeprof-compare/1``); ``pipeprof.compare`` (report.py) wraps it in a ``Comparison`` that shows
itself like a Report.
Every figure is a *delta*: ``{before, after, change, ratio, improved, noise, uncertain}``, where
``change`` is ``after - before``, ``ratio`` is ``after / before`` (None when before is 0 or n/a),
``improved`` says whether the change is for the better (None: unchanged within 2 %, n/a, or
``uncertain``), ``noise`` is the 95 % half-width of a change between two runs of the same
pipeline, from both files' spread (None: not known), and ``uncertain`` says why a change is not
called better or worse: ``"noise"`` (within ``noise``) or ``"machine-load"`` (the two runs saw
different load from other processes: ``machine``), else None.
"""

from __future__ import annotations

import math
from typing import Any

from pipeprof.analyze.stages import top_total, tree_order
from pipeprof.analyze.verdict import loop_view, other_load
from pipeprof.core.units import num, pct

SCHEMA = "pipeprof-compare/1"
SAME = 0.02  # relative changes below this count as unchanged
# Other processes' CPU (cores) that differs by more than this between the runs makes their
# times incomparable: at least half a core, or a tenth of the machine's cores.
LOAD_CORES, LOAD_SHARE = 0.5, 0.10


def delta(
    before: Any, after: Any, higher_is_better: bool = False, noise: float | None = None
) -> dict[str, Any]:
    """One figure before and after (see the module docstring); ``noise``: the 95 % half-width
    of the change between two runs of the same pipeline, if known."""
    out: dict[str, Any] = {
        "before": before,
        "after": after,
        "change": None,
        "ratio": None,
        "improved": None,
        "noise": None if noise is None else round(noise, 9),
        "uncertain": None,
    }
    if before is None or after is None:
        return out
    out["change"] = round(after - before, 9)
    if before:
        out["ratio"] = round(after / before, 6)
    scale = max(abs(before), abs(after))
    if scale and abs(after - before) / scale >= SAME:
        if noise is not None and abs(after - before) <= noise:
            out["uncertain"] = "noise"
        else:
            out["improved"] = (after > before) == higher_is_better
    return out


def _both(hb: float | None, ha: float | None) -> float | None:
    """The half-width of a difference of two runs whose rerun half-widths are ``hb`` and
    ``ha`` (NOTE [ Run-to-run spread ] in analyze/loop.py)."""
    return None if hb is None or ha is None else math.sqrt((hb * hb + ha * ha) / 2)


def _rel(half: float | None, value: float | None) -> float | None:
    return half / value if half is not None and value else None


def _loop(b: dict[str, Any] | None, a: dict[str, Any] | None) -> dict[str, Any] | None:
    if not b or not a:
        return None
    vb, va = loop_view(b), loop_view(a)
    pb, pa = b.get("spread") or {}, a.get("spread") or {}
    out = {
        f"{k}_fraction": delta(
            vb.get(f"{k}_fraction"),
            va.get(f"{k}_fraction"),
            noise=_both(pb.get(f"{k}_fraction"), pa.get(f"{k}_fraction")),
        )
        for k in ("wait", "transfer", "compute", "overhead")
    }
    out["compute_fraction"]["improved"] = None  # a bigger compute share is a symptom, not a goal
    sb, sa = b.get("step_ms") or {}, a.get("step_ms") or {}
    step_noise = _both(pb.get("step_ms"), pa.get("step_ms"))
    out["step_mean_ms"] = delta(sb.get("mean_ms"), sa.get("mean_ms"), noise=step_noise)
    out["step_p95_ms"] = delta(sb.get("p95_ms"), sa.get("p95_ms"))
    tb, ta = b.get("throughput") or {}, a.get("throughput") or {}
    rb, ra = tb.get("effective_samples_per_s"), ta.get("effective_samples_per_s")
    # a rate is samples over the steps' time: its relative spread is the mean step's
    rel = _both(
        _rel(pb.get("step_ms"), sb.get("mean_ms")), _rel(pa.get("step_ms"), sa.get("mean_ms"))
    )
    out["samples_per_s"] = delta(
        rb, ra, True, None if rel is None or not rb or not ra else rel * (rb + ra) / 2
    )
    out["startup_s"] = delta(b.get("startup_s"), a.get("startup_s"))
    out["gpu_idle_while_waiting_fraction"] = delta(
        b.get("idle_while_waiting_fraction"), a.get("idle_while_waiting_fraction")
    )
    regions = list(dict.fromkeys([*(b.get("regions") or {}), *(a.get("regions") or {})]))
    out["regions"] = {
        r: delta(
            ((b.get("regions") or {}).get(r) or {}).get("mean_ms"),
            ((a.get("regions") or {}).get(r) or {}).get("mean_ms"),
        )
        for r in regions
    }
    return out


def _stages(b: dict[str, Any], a: dict[str, Any]) -> dict[str, dict[str, Any]]:
    sb, sa = b.get("stages") or {}, a.get("stages") or {}
    tb, ta = top_total(sb) or 1.0, top_total(sa) or 1.0
    out = {}
    for path in tree_order([*sb, *sa]):  # a stage new in one report sits under its parent
        rb, ra = sb.get(path) or {}, sa.get(path) or {}
        noise = _both(_stage_half(rb), _stage_half(ra))
        out[path] = {
            "per_sample_ms": delta(rb.get("per_sample_ms"), ra.get("per_sample_ms"), noise=noise),
            "per_batch_ms": delta(rb.get("per_batch_ms"), ra.get("per_batch_ms")),
            "p95_ms": delta(rb.get("p95_ms"), ra.get("p95_ms")),
            "share": delta(rb["total_s"] / tb if rb else None, ra["total_s"] / ta if ra else None),
        }
    return out


def _stage_half(row: dict[str, Any]) -> float | None:
    """A stage's rerun half-width in ms per sample: its calls' spread (``std_ms``) as for
    independent calls, each weighing what it stands for in ``total_s``. Of a stage timed in
    two strata (NOTE [ Unprofiled batches ] in collect/torch/loader.py), the first calls count
    once and the later ones ``scaled`` times each; their numbers follow from the totals (as if
    of one mean): a total of ``n_f + scaled * n_l`` calls' time over ``count = n_f + n_l``
    timed."""
    std, n, mean, per, total = (
        row.get(k) for k in ("std_ms", "count", "mean_ms", "per_sample_ms", "total_s")
    )
    if std is None or not n or not mean or per is None:
        return None
    weight = row.get("scaled") or 1.0
    calls = (total or 0) * 1e3 / mean  # the calls the total stands for
    later = min(n, max(0.0, (calls - n) / (weight - 1))) if weight > 1 else 0.0
    spread = math.sqrt(n - later + weight * weight * later)  # the weights' root sum of squares
    return float(1.96 * math.sqrt(2) * std * spread * per / (mean * (n - later + weight * later)))


def _verdict(v: dict[str, Any]) -> dict[str, Any]:
    keys = ("kind", "severity", "stage", "stages", "fraction", "borderline", "headline")
    return {k: v.get(k) for k in keys}


def machine(b: dict[str, Any], a: dict[str, Any], labels: tuple[str, str]) -> dict[str, Any]:
    """Whether the two runs saw different load from other processes (``differs``), and a
    ``note`` saying so."""
    lb, la = other_load(b), other_load(a)
    out: dict[str, Any] = {"before": lb, "after": la, "differs": False, "note": None}
    if lb is None or la is None:
        return out
    cores = max(lb["cpu_count"], la["cpu_count"])
    gap = la["other_cores"] - lb["other_cores"]
    if abs(gap) >= max(LOAD_CORES, LOAD_SHARE * cores):
        busier = labels[1] if gap > 0 else labels[0]
        out["differs"] = True
        out["note"] = (
            f"the machine was busier during {busier}: other processes used "
            f"{lb['other_cores']:.1f} of {cores} cores in {labels[0]}, {la['other_cores']:.1f} in "
            f"{labels[1]}{_stolen(lb, la)}; changes in time may be the machine's, so none is "
            "called better or worse"
        )
    return out


def _stolen(lb: dict[str, Any], la: dict[str, Any]) -> str:
    """ " (the hypervisor's steal: X and Y)" where both runs read it and either was >= 0.05."""
    sb, sa = lb.get("stolen_cores"), la.get("stolen_cores")
    if sb is None or sa is None or max(sb, sa) < 0.05:
        return ""
    return f" (of which the hypervisor took {sb:.2f} and {sa:.2f} cores: steal)"


def _confound(data: dict[str, Any]) -> None:
    """Every delta of ``data``: neither better nor worse, ``uncertain`` "machine-load"."""
    if isinstance(data, dict):
        if "improved" in data and "before" in data:
            if data["improved"] is not None or data["uncertain"] == "noise":
                data["improved"], data["uncertain"] = None, "machine-load"
            return
        for v in data.values():
            _confound(v)


def _findings(b: dict[str, Any], a: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    def key(f: dict[str, Any]) -> tuple[Any, Any]:
        return f.get("id"), f.get("stage")

    fb = {key(f): f for f in b.get("findings") or []}
    fa = {key(f): f for f in a.get("findings") or []}
    pick = ("id", "severity", "stage", "message")
    return {
        "resolved": [{k: f.get(k) for k in pick} for x, f in fb.items() if x not in fa],
        "new": [{k: f.get(k) for k in pick} for x, f in fa.items() if x not in fb],
        "remaining": [{k: f.get(k) for k in pick} for x, f in fa.items() if x in fb],
    }


def _gpu_util(data: dict[str, Any]) -> float | None:
    devices = (data.get("gpu") or {}).get("devices") or []
    utils = [d["util_mean"] for d in devices if d.get("util_mean") is not None]
    return sum(utils) / len(utils) if utils else None


def _overview(b: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    def rate(d: dict[str, Any]) -> Any:
        return (d.get("steady") or {}).get("samples_per_s") or d["throughput"].get("samples_per_s")

    mb, ma = b.get("meta") or {}, a.get("meta") or {}
    return {
        "samples_per_s": delta(
            b["throughput"].get("samples_per_s"), a["throughput"].get("samples_per_s"), True
        ),
        "steady_samples_per_s": delta(rate(b), rate(a), True),
        "startup_s": delta(b.get("startup_s"), a.get("startup_s")),
        "wait_p50_ms": delta(
            (b.get("latency") or {}).get("p50_ms"), (a.get("latency") or {}).get("p50_ms")
        ),
        "wait_p95_ms": delta(
            (b.get("latency") or {}).get("p95_ms"), (a.get("latency") or {}).get("p95_ms")
        ),
        "gpu_util_mean": delta(_gpu_util(b), _gpu_util(a), True),
        "cpu_util_mean": delta(
            (b.get("host") or {}).get("cpu_util_mean"),
            (a.get("host") or {}).get("cpu_util_mean"),
            True,
        ),
        "num_workers": {"before": mb.get("num_workers"), "after": ma.get("num_workers")},
    }


def summary_lines(data: dict[str, Any]) -> list[str]:
    """A few sentences: verdict, throughput, wait share, the stage that changed most."""
    vb, va = data["verdict"]["before"], data["verdict"]["after"]
    lines = [
        f"verdict: {vb['kind']} → {va['kind']}"
        if vb["kind"] != va["kind"]
        else f"verdict: still {va['kind']}"
    ]
    doubt = [data["labels"][k] for k, v in (("before", vb), ("after", va)) if v.get("borderline")]
    if doubt:
        lines[0] += f" (borderline in {' and '.join(doubt)})"
    loop = data.get("loop")
    rate = loop["samples_per_s"] if loop else data["overview"]["steady_samples_per_s"]
    if rate["before"] is not None and rate["after"] is not None:
        times = f" (×{rate['ratio']:.2f})" if rate["ratio"] else ""
        lines.append(f"throughput: {num(rate['before'])} → {num(rate['after'])} samples/s{times}")
    if loop:
        w = loop["wait_fraction"]
        lines.append(f"waiting for data: {pct(w['before'])} → {pct(w['after'])} of step time")
    moved = [
        (abs(d["per_sample_ms"]["change"] or 0), p, d["per_sample_ms"])
        for p, d in data["stages"].items()
        if d["per_sample_ms"]["change"]  # None (a side is missing) or 0: nothing moved
    ]
    if moved:
        _, path, d = max(moved)
        lines.append(
            f"biggest stage change: {path} {num(d['before'])} → {num(d['after'])} ms/sample"
        )
    return lines


def compare_dicts(
    before: dict[str, Any], after: dict[str, Any], labels: tuple[str, str] = ("before", "after")
) -> dict[str, Any]:
    """The comparison of two report dictionaries as plain data."""
    vb, va = _verdict(before.get("verdict") or {}), _verdict(after.get("verdict") or {})
    data: dict[str, Any] = {
        "schema": SCHEMA,
        "labels": {"before": labels[0], "after": labels[1]},
        "modes": {"before": before.get("mode"), "after": after.get("mode")},
        "verdict": {
            "before": vb,
            "after": va,
            "changed": (vb["kind"], vb["stage"]) != (va["kind"], va["stage"]),
        },
        "overview": _overview(before, after),
        "loop": _loop(before.get("loop"), after.get("loop")),
        "stages": _stages(before, after),
        "findings": _findings(before, after),
        "machine": machine(before, after, labels),
    }
    if data["machine"]["differs"]:
        for key in ("overview", "loop", "stages"):
            _confound(data[key])
    data["notes"] = notes(data)
    data["summary"] = summary_lines(data)
    return data


def notes(data: dict[str, Any]) -> list[str]:
    """What to keep in mind before reading a change as better or worse."""
    out = [data["machine"]["note"]] if data["machine"]["differs"] else []

    def any_noise(d: Any) -> bool:
        if isinstance(d, dict):
            return d.get("uncertain") == "noise" or any(any_noise(v) for v in d.values())
        return False

    if any(any_noise(data[k]) for k in ("overview", "loop", "stages")):
        out.append(
            "~ marks a change within run-to-run noise (the 95% interval of a difference "
            "between two runs of the same pipeline, from each run's spread): not called better "
            "or worse"
        )
    return out
