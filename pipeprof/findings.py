"""Verdict, findings and what-if estimates: pure rules over the report's figures.

Each rule reads the report dictionary built so far and returns a finding or None. A finding
carries the figures it rests on (``evidence``, units in the key names) and a fix with numbers.
Thresholds start from TensorFlow's input-bound rule (≥ 20 % of step time waiting is "high",
≥ 5 % "moderate") and torch-tb-profiler's (DataLoader time > 5 %); see docs/findings.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from pipeprof.collectors.tf_findings import TF_RULES

Finding = dict[str, Any]
Rule = Callable[[dict[str, Any], dict[str, Any]], "Finding | None"]

DOMINANT_SHARE = 0.40  # a leaf stage above this share of pipeline time is called out
SATURATED_BUSY = 0.85  # workers busier than this cannot go faster without more of them
IMBALANCE = 1.30  # busiest worker / mean worker
SLOW_STARTUP = 0.25  # start-up above this share of wall time


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
    busy_s = sum(w["busy_s"] for w in report["workers"])
    samples = sum(w["samples"] for w in report["workers"])
    rate = samples / busy_s if busy_s else None  # samples per busy second of one process
    parallel = max(1, len(workers)) if n_workers else 1
    costs = {}
    for path, row in leaves(report["stages"]).items():
        in_workers = row["tracks"] and all(t.startswith("worker") for t in row["tracks"])
        costs[path] = row["total_s"] / (parallel if in_workers else 1)
    limiting = max(costs, key=lambda p: costs[p]) if costs else None
    if meta.get("limiting_stage") in report["stages"]:  # the collector knows better (tf.data)
        limiting = meta["limiting_stage"]
    pipeline_s = sum(r["total_s"] for r in leaves(report["stages"]).values()) or None
    return {
        "n_workers": n_workers,
        "cores": cores,
        "rate": rate,
        "limiting": limiting,
        "costs": costs,
        "pipeline_s": pipeline_s,
        "workers": workers,
        "busy_mean": (sum(w["busy_fraction"] or 0 for w in workers) / len(workers))
        if workers
        else None,
    }


def _finding(
    fid: str, severity: str, stage: str | None, message: str, evidence: dict[str, Any], fix: str
) -> Finding:
    return {
        "id": fid,
        "severity": severity,
        "stage": stage,
        "message": message,
        "evidence": evidence,
        "fix": fix,
    }


_FIXES = {
    "load/read": "reading is storage-bound: cache the data set in RAM or on a local SSD, pack "
    "small "
    "files into shards (WebDataset, TFRecord), or add workers so that reads overlap",
    "load/decode": "store the images pre-resized to the training resolution, decode at reduced "
    "size (PIL's Image.draft), or use a faster decoder (torchvision.io.decode_jpeg, on the GPU "
    "with device='cuda'; pillow-simd)",
    "collate": "return tensors (not Python lists or NumPy) from the dataset, or batch inside the "
    "dataset with __getitems__",
    "load": "split it with pipeprof.stage('read') / pipeprof.stage('decode') inside __getitem__ to "
    "see which part costs",
}


def rule_dominant_stage(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    path, total = facts["limiting"], facts["pipeline_s"]
    if path is None or not total or report.get("framework") == "tf":  # tf: see tf_findings
        return None
    row = report["stages"][path]
    share = row["total_s"] / total
    if share < DOMINANT_SHARE:
        return None
    if path in _FIXES:
        fix = _FIXES[path]
    elif path.startswith("transform/"):
        fix = (
            f"{path.split('/')[-1]} runs on the CPU once per sample: apply it to whole batches on "
            "the GPU (torchvision.transforms.v2 works on batched tensors), precompute it offline "
            "if it is deterministic, or make it cheaper"
        )
    elif path.startswith("transfer/"):
        fix = "see the transfer findings: pin_memory=True with non_blocking copies"
    else:
        fix = f"make {path} cheaper, or move it off the per-sample path"
    return _finding(
        "dominant-stage",
        "warning" if share >= 0.6 else "info",
        path,
        f"{path} takes {share:.0%} of the pipeline's time "
        f"({row['per_sample_ms']:.3g} ms per sample)",
        {
            "share": round(share, 4),
            "per_sample_ms": row["per_sample_ms"],
            "total_s": row["total_s"],
        },
        fix,
    )


def rule_more_workers(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    n, cores, rate = facts["n_workers"], facts["cores"], facts["rate"]
    if rate is None:
        return None
    target = max(1, cores - 1)  # leave a core for the training process
    if n == 0:
        return _finding(
            "no-workers",
            "warning",
            facts["limiting"],
            f"loading runs in the training process (num_workers=0) at {rate:.0f} samples/s",
            {"samples_per_s_per_worker": round(rate, 1), "cores": cores},
            f"num_workers={target} would give about {rate * target:.0f} samples/s "
            f"({target} × {rate:.0f}), and overlap loading with compute",
        )
    busy = facts["busy_mean"] or 0.0
    if busy < SATURATED_BUSY or n >= target:
        return None
    return _finding(
        "workers-saturated",
        "info",
        facts["limiting"],
        f"the {n} workers are busy {busy:.0%} of the time; each delivers {rate:.0f} samples/s",
        {
            "busy_fraction": round(busy, 4),
            "samples_per_s_per_worker": round(rate, 1),
            "num_workers": n,
            "cores": cores,
        },
        f"num_workers={target} would give about {rate * target:.0f} samples/s on {cores} cores",
    )


def rule_oversubscribed(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    n, cores = facts["n_workers"], facts["cores"]
    threads = int(report.get("meta", {}).get("torch_threads") or 1)
    if n <= cores:
        return None
    return _finding(
        "cpu-oversubscribed",
        "warning",
        None,
        f"{n} workers (+ the main process with {threads} intra-op threads) share {cores} cores",
        {"num_workers": n, "cores": cores, "torch_threads": threads},
        f"use at most num_workers={max(1, cores - 1)}; extra workers only add switching and memory",
    )


def rule_imbalance(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    ws = [w for w in facts["workers"] if w["busy_s"] > 0]
    if len(ws) < 2:
        return None
    mean = sum(w["busy_s"] for w in ws) / len(ws)
    top = max(ws, key=lambda w: w["busy_s"])
    ratio = top["busy_s"] / mean
    if ratio < IMBALANCE:
        return None
    return _finding(
        "worker-imbalance",
        "info",
        None,
        f"worker {top['id']} is busy {ratio:.2f}× the mean worker",
        {"busiest_busy_s": top["busy_s"], "mean_busy_s": round(mean, 6), "ratio": round(ratio, 3)},
        "samples differ a lot in cost: sort or bucket them by size, or shard an IterableDataset "
        "evenly across workers (get_worker_info())",
    )


def rule_slow_startup(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    start, wall = report.get("startup_s"), report.get("wall_s")
    meta = report.get("meta", {})
    if not start or not wall or start / wall < SLOW_STARTUP or not meta.get("num_workers"):
        return None
    fix = (
        "persistent_workers=True keeps workers alive across epochs, paying this once"
        if not meta.get("persistent_workers")
        else "start-up is a one-off; profile more batches to see the steady state"
    )
    return _finding(
        "slow-startup",
        "info",
        None,
        f"the first batch took {start:.2f} s, {start / wall:.0%} of the profile",
        {"startup_s": start, "wall_s": wall},
        fix,
    )


def rule_pin_memory(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    meta = report.get("meta", {})
    device = str(meta.get("device") or "")
    if not device.startswith("cuda") or meta.get("pin_memory"):
        return None
    h2d = report["stages"].get("transfer/h2d", {})
    return _finding(
        "pin-memory",
        "info",
        "transfer/h2d",
        f"batches are copied to {device} from pageable memory "
        f"({h2d.get('mean_ms') or 0:.3g} ms per batch)",
        {"h2d_mean_ms": h2d.get("mean_ms"), "pin_memory": False},
        "DataLoader(pin_memory=True) and .to(device, non_blocking=True) let copies overlap compute",
    )


def rule_overhead(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    frac = (report.get("overhead") or {}).get("estimated_fraction")
    if frac is None or frac < 0.02:
        return None
    return _finding(
        "profiler-overhead",
        "warning",
        None,
        f"pipeprof's own timing is about {frac:.1%} of the measured time",
        {"estimated_fraction": frac},
        "stages are very short: time fewer, coarser stages",
    )


HIGH_WAIT = 0.20  # TensorFlow's profiler: "highly input-bound"
MODERATE_WAIT = 0.05  # ... "moderately input-bound"; torch-tb-profiler's DataLoader > 5 %


def _loop_view(loop: dict[str, Any]) -> dict[str, Any]:
    """The steady state when there is enough of it, else all steps."""
    steady = loop.get("steady") or {}
    return steady if (steady.get("steps") or 0) >= 3 and steady.get("wall_s") else loop


def loop_verdict(report: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """input-, transfer- or overhead-bound when that share of step time passes 5 % (high at
    20 %) and is the largest non-compute share; compute-bound otherwise."""
    view = _loop_view(report["loop"])
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
    stage = (
        facts["limiting"] if part == "wait" else ("transfer/h2d" if part == "transfer" else None)
    )
    return {
        "kind": kind,
        "severity": "high" if frac >= HIGH_WAIT else "moderate",
        "stage": stage,
        "fraction": round(frac, 4),
        "headline": f"{kind}: {who} {what} {frac:.0%} of the time"
        + (f"; {stage} limits the pipeline" if stage and part == "wait" else ""),
    }


def rule_workers_needed(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    loop = report.get("loop")
    rate, n, cores = facts["rate"], facts["n_workers"], facts["cores"]
    if not loop or rate is None or report["verdict"]["kind"] != "input-bound":
        return None
    compute_rate = (loop.get("throughput") or {}).get("compute_samples_per_s")
    if not compute_rate:
        return None
    need = max(1, math.ceil(compute_rate / rate))
    if need <= n:
        return None
    evidence = {
        "compute_samples_per_s": compute_rate,
        "samples_per_s_per_worker": round(rate, 1),
        "workers_needed": need,
        "num_workers": n,
        "cores": cores,
    }
    msg = (
        f"{need} workers would feed the measured {compute_rate:.0f} samples/s of compute "
        f"({rate:.0f} samples/s per worker); you have {n}"
    )
    if need <= cores - 1:
        fix = f"DataLoader(num_workers={need})"
    else:
        fix = (
            f"{need} workers exceed the {cores} cores: make {facts['limiting']} cheaper "
            f"(it limits the pipeline), cache decoded data, or move augmentation to the GPU"
        )
    return _finding("workers-needed", "critical", facts["limiting"], msg, evidence, fix)


def rule_transfer(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    loop = report.get("loop")
    if not loop:
        return None
    frac = _loop_view(loop).get("transfer_fraction") or 0.0
    if frac < MODERATE_WAIT:
        return None
    pinned = bool(report.get("meta", {}).get("pin_memory"))
    fix = (
        "DataLoader(pin_memory=True) and batch.to(device, non_blocking=True) overlap the copy "
        "with compute"
        if not pinned
        else "copies are pinned already: send smaller batches (uint8 images, normalise on the GPU)"
    )
    return _finding(
        "transfer",
        "warning",
        "transfer/h2d",
        f"copying batches to the device takes {frac:.0%} of step time",
        {"transfer_fraction": frac, "pin_memory": pinned},
        fix,
    )


def rule_threads(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    meta = report.get("meta", {})
    threads, n, cores = int(meta.get("torch_threads") or 0), facts["n_workers"], facts["cores"]
    if not report.get("loop") or not threads or n + threads <= cores:
        return None
    return _finding(
        "threads-oversubscribed",
        "warning",
        None,
        f"{n} workers + {threads} intra-op threads in the training process on {cores} cores",
        {"num_workers": n, "torch_threads": threads, "cores": cores},
        f"torch.set_num_threads({max(1, cores - n)}) in the training process, or fewer workers",
    )


def rule_overhead_regions(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    loop = report.get("loop")
    if not loop:
        return None
    frac = _loop_view(loop).get("overhead_fraction") or 0.0
    if frac < MODERATE_WAIT:
        return None
    from pipeprof.loop import region_class

    regions = {k: v for k, v in loop["regions"].items() if region_class(k) == "overhead"}
    top = max(regions, key=lambda k: regions[k]["total_s"]) if regions else "?"
    return _finding(
        "overhead-regions",
        "warning",
        None,
        f"non-compute regions take {frac:.0%} of step time; '{top}' is the largest",
        {"overhead_fraction": frac, "region": top},
        f"run '{top}' less often (every N steps) or asynchronously",
    )


RULES: list[Rule] = [
    rule_workers_needed,
    rule_transfer,
    rule_threads,
    rule_overhead_regions,
    rule_dominant_stage,
    rule_more_workers,
    rule_oversubscribed,
    rule_imbalance,
    rule_slow_startup,
    rule_pin_memory,
    rule_overhead,
    *TF_RULES,  # tf.data's terms (pipeprof/collectors/tf_findings.py); None for torch reports
]


def what_if(report: dict[str, Any], facts: dict[str, Any]) -> list[dict[str, Any]]:
    """Throughput at other worker counts, the ceiling, the workers that feed the measured
    compute, the limiting stage 2× faster or cached: the model of pipeprof.whatif (estimates)."""
    if report.get("framework") == "tf":  # tf.data runs in threads: worker counts do not apply
        return []
    from pipeprof.whatif_report import report_what_if

    return report_what_if(report, facts)


def assess(report: dict[str, Any]) -> tuple[dict[str, Any], list[Finding], list[dict[str, Any]]]:
    """Verdict, findings (most severe first) and what-if estimates for a report."""
    facts = pipeline_facts(report)
    loop = report.get("loop")
    if not (loop.get("steps") if loop else report.get("batches")):
        verdict = empty_verdict(report)
    else:
        verdict = loop_verdict(report, facts) if loop else loader_verdict(report, facts)
    report["verdict"] = verdict  # rules read it
    found = [f for rule in RULES if (f := rule(report, facts)) is not None]
    order = {"critical": 0, "warning": 1, "info": 2}
    found.sort(key=lambda f: order.get(f["severity"], 3))
    return verdict, found, what_if(report, facts)


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
    return {
        "kind": "balanced",
        "severity": "info",
        "stage": path,
        "headline": headline,
        "note": "loader profiled alone: wrap a training loop to attribute wait vs compute",
    }
