"""Worker memory (docs/findings.md#copy-on-read): forked workers that copy the dataset's Python
objects as they read them (NOTE [ Copy-on-read ] in collect/torch/memory.py), and private
memory that keeps growing after the first epoch (NOTE [ Memory that keeps growing ]).

NOTE [ Memory that keeps growing ]
A process's private memory (USS, NOTE [ Private memory ] in collect/samplers/host.py) that grows
through the first epoch may be filling once (a cache of the dataset, the workers' copies of what
they read); one that still grows after it fills the machine in the end. Each process's readings
after the first full pass ended (``timeline.epoch_ends_s``) are fitted with a line (least
squares): at least GROWTH_READINGS of them, a rise of GROWTH_MB or more over them. Its slope is
given per second and per 1,000 of the loop's batches, and the memory the machine had available
at the last reading (``host.mem_available_mb``) over the slopes of all such processes is the time
left before it runs out.
"""

from __future__ import annotations

import statistics
from typing import Any

from pipeprof.analyze.finding import Finding, finding

COPIED_MB = 64.0  # containers of Python objects this large, or more, are judged
COPIED_SHARE = 0.3  # a worker's private memory at this share of their size, or more: copied


def rule_copy_on_read(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ Copy-on-read ]: forked workers whose private memory (USS) reached a good share of
    the dataset's containers of Python objects."""
    meta = report.get("meta") or {}
    held = meta.get("py_containers") or []
    n = meta.get("num_workers") or 0
    if not held or not n or meta.get("multiprocessing_context") != "fork":
        return None
    size = sum(c["mb"] for c in held)
    procs = (report.get("host") or {}).get("per_process") or []
    mine = worker_pids(report)  # the loader's workers, not every child of the process
    private = [p["uss_max_mb"] for p in procs
               if p.get("pid") in mine and p.get("uss_max_mb") is not None]  # fmt: skip
    if size < COPIED_MB or not private:
        return None
    each = statistics.median(private)
    if each < COPIED_SHARE * size:
        return None
    top = held[0]
    named = f"{top['name']} ({top['kind']}, {top['items']:,} items, about {top['mb']:,.0f} MB)"
    more = f" and {len(held) - 1} more" if len(held) > 1 else ""
    return finding(
        "copy-on-read",
        "warning",
        None,
        f"each worker's private memory reached {each:,.0f} MB (USS, the median of "
        f"{len(private)}) while the dataset holds {named}{more}: reading a Python object writes "
        "its reference count, so each forked worker copies the pages it reads, and "
        f"{n} workers hold {n} copies",
        {"uss_mb": round(each, 1), "workers_read": len(private), "containers": held,
         "containers_mb": round(size, 1)},
        f"store {top['name']} as an array: numpy (fixed-width strings, or offsets into one "
        "bytes buffer), Arrow, or a memory-mapped file; reading an array's items writes "
        "nothing, so the workers share one copy. persistent_workers=True makes the copy once "
        "rather than every epoch (docs/findings.md#copy-on-read)",
    )  # fmt: skip


def worker_pids(report: dict[str, Any]) -> set[int]:
    """The pids of the loader's workers (not every child of the training process)."""
    return {w["pid"] for w in report.get("workers") or []
            if str(w.get("track", "")).startswith("worker") and w.get("pid")}  # fmt: skip


GROWTH_READINGS = 3  # NOTE [ Memory that keeps growing ]
GROWTH_MB = 32.0


def _slope(t: list[float], v: list[float]) -> float:
    """Least squares: MB a second."""
    mt, mv = sum(t) / len(t), sum(v) / len(v)
    den = sum((x - mt) ** 2 for x in t)
    return sum((x - mt) * (y - mv) for x, y in zip(t, v)) / den if den > 0 else 0.0


def growing(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The processes whose private memory still grew after the first full pass (NOTE [ Memory
    that keeps growing ]): ``{pid, role, mb_per_s, rise_mb, readings}``, the steepest first."""
    tl = report.get("timeline") or {}
    ends = tl.get("epoch_ends_s") or []
    if not ends:
        return []
    out = []
    for p in tl.get("memory") or []:
        late = [(t, u) for t, u in zip(p["t_s"], p["uss_mb"]) if u is not None and t > ends[0]]
        if len(late) < GROWTH_READINGS:
            continue
        t, v = [x for x, _ in late], [y for _, y in late]
        slope = _slope(t, v)
        rise = slope * (t[-1] - t[0])
        if slope > 0 and rise >= GROWTH_MB:
            out.append({"pid": p["pid"], "role": p["role"], "mb_per_s": round(slope, 3),
                        "rise_mb": round(rise, 1), "readings": len(late)})  # fmt: skip
    return sorted(out, key=lambda g: -g["mb_per_s"])


def rule_memory_growth(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ Memory that keeps growing ]."""
    grow = growing(report)
    if not grow:
        return None
    top = grow[0]
    wall, batches = report.get("wall_s") or 0.0, report.get("batches") or 0
    per_k = top["mb_per_s"] * wall / batches * 1000 if batches and wall else None
    rate = sum(g["mb_per_s"] for g in grow)
    free = (report.get("host") or {}).get("mem_available_mb")
    left = free / rate if free and rate > 0 else None
    who = ("the training process" if top["role"] == "main"
           else f"worker pid {top['pid']}" if top["pid"] in worker_pids(report)
           else f"child process pid {top['pid']}")  # fmt: skip
    more = f" (and {len(grow) - 1} more process{'es' * (len(grow) > 2)})" if len(grow) > 1 else ""
    said = f", {per_k:,.1f} MB every 1,000 batches" if per_k is not None else ""
    when = (f"; at that rate the {free:,.0f} MB the machine has available run out in "
            f"{_duration(left)}" if left is not None else "")  # fmt: skip
    return finding(
        "memory-growth",
        "warning",
        None,
        f"{who}'s private memory kept growing after the first epoch{more}: "
        f"+{top['rise_mb']:,.0f} MB over {top['readings']} readings, {top['mb_per_s']:.3g} "
        f"MB a second{said}{when}",
        {"processes": grow, "mb_per_1000_batches": None if per_k is None else round(per_k, 2),
         "mem_available_mb": free, "hours_left": None if left is None else round(left / 3600, 2)},
        "find what is kept from step to step: a cache or list the dataset fills as it reads "
        "(bound it, or clear it each epoch), tensors the loop keeps (log loss.item(), not the "
        "loss), or, in persistent workers, the copy-on-read of the dataset's Python objects "
        "(docs/findings.md#memory-growth)",
    )  # fmt: skip


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


SHM_MARGIN = 0.9  # a configuration fits in this share of /dev/shm's free space
SHM_STEP_MB = 64  # a larger /dev/shm is given in steps of this


def shm_fits(facts: dict[str, Any]) -> dict[str, Any]:
    """The largest configuration whose batches fit in SHM_MARGIN of /dev/shm's free space
    (NOTE [ Shared memory ] in collect/torch/shm.py): the most workers (prefetch_factor 1 at
    least), then the most prefetch for them; else the batch size that fits as configured; and
    the /dev/shm size that fits the loader as it is."""
    batch, free = facts["batch_mb"], facts["free_mb"]
    need, extra = facts["need_mb"], facts["in_flight"] - facts["num_workers"] * facts[
        "prefetch_factor"]
    room = SHM_MARGIN * free / batch - extra if batch > 0 else 0.0  # batches that fit
    workers = min(facts["num_workers"], int(room))
    prefetch = min(facts["prefetch_factor"], int(room // workers)) if workers >= 1 else 0
    size = facts.get("batch_size")
    smaller = int(size * SHM_MARGIN * free / need) if size and need > 0 else 0
    step = SHM_STEP_MB
    return {
        "num_workers": workers if workers >= 1 else None,
        "prefetch_factor": prefetch if workers >= 1 else None,
        "batch_size": smaller if smaller >= 1 and smaller < (size or 0) else None,
        "shm_mb": int(-(-need / SHM_MARGIN // step) * step),
    }


def rule_shm(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ Shared memory ] in collect/torch/shm.py: a loader whose batches in flight do not
    fit in /dev/shm's free space, or whose worker failed to get shared memory."""
    shm = (report.get("meta") or {}).get("shm")
    if not shm:
        return None
    failed = shm.get("failed")
    known = shm.get("need_mb") is not None and shm.get("free_mb") is not None
    if not failed and (not known or shm["fits"]):
        return None
    if known:
        said = (f"the workers need about {shm['need_mb']:,.0f} MB of shared memory "
                f"({shm['in_flight']} batches of {shm['batch_mb']:,.1f} MB in flight: "
                f"{shm['num_workers']} workers × prefetch_factor {shm['prefetch_factor']}, and "
                f"the one the loop holds) but {shm['path']} had {shm['free_mb']:,.0f} MB free "
                f"(of {shm['size_mb']:,.0f} MB)")  # fmt: skip
    else:
        said = f"a worker could not get shared memory from {shm['path']}"
    if failed:
        said += f"; a worker failed: {failed}"
    fits = shm_fits(shm) if known else None
    options = []
    if fits and fits["num_workers"]:
        options.append(f"num_workers={fits['num_workers']}, "
                       f"prefetch_factor={fits['prefetch_factor']}")  # fmt: skip
    if fits and fits["batch_size"]:
        options.append(f"batch_size={fits['batch_size']}")
    tried = (" or ".join(options) + " fits; " if options else "")
    size = f"{fits['shm_mb']}m" if fits else "<more>"
    return finding(
        "shm-too-small",
        "critical" if failed else "warning",
        None,
        said,
        {**shm, "fits_with": fits},
        f"{tried}or give the container a larger /dev/shm for the loader as it is: `docker run "
        f"--shm-size={size}`, or in Kubernetes an emptyDir with medium: Memory mounted at "
        "/dev/shm; sharing strategy 'file_system' uses /dev/shm too "
        "(docs/findings.md#shm-too-small)",
    )  # fmt: skip


MEMORY_RULES = [rule_copy_on_read, rule_memory_growth, rule_shm]
