"""Loop-mode analysis: a training loop's time split into wait, transfer, compute and overhead.

Pure functions over the Session (NOTE [ Step attribution ] in collect/loop.py says how steps
are cut).
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypedDict, cast

from pipeprof.core.regions import STEP_REGIONS
from pipeprof.core.series import mean_over_spans
from pipeprof.core.session import Session
from pipeprof.core.stats import Figures, Stat, figures


class WaitSplit(TypedDict):
    """A group of steps' wait as *starved* and *hand-over* (``wait_split``)."""

    starved_s: float
    handover_s: float
    starved_fraction: float | None  # of the group's wall time
    handover_fraction: float | None
    handover_ms_per_step: float | None


class Split(WaitSplit):
    """A group of steps' time (the loop's, or its steady part's) in seconds and shares."""

    wait_s: float
    transfer_s: float
    compute_s: float
    comm_s: float
    overhead_s: float
    wall_s: float
    wait_fraction: float | None  # None: no time at all
    transfer_fraction: float | None
    compute_fraction: float | None
    comm_fraction: float | None
    overhead_fraction: float | None


class Steady(Split):
    """The steps after each epoch's first."""

    steps: int


class RegionFigures(Figures, total=False):
    timed_steps: int  # ``pipeprof run``'s Forward/Backward/Optimizer, timed in a sample


class Spread(TypedDict):
    """95 % half-widths of where a rerun's figure lands (NOTE [ Run-to-run spread ])."""

    steps: int
    wait_fraction: float | None  # None: too few steps to tell
    transfer_fraction: float | None
    step_ms: float | None


class Throughput(TypedDict):
    effective_samples_per_s: float | None
    compute_samples_per_s: float | None
    replay_compute_samples_per_s: float | None
    speedup_if_data_free: float | None


class GpuAlignment(TypedDict):
    gpu_util_waiting: float | None
    gpu_util_computing: float | None
    idle_while_waiting_fraction: float | None


class LoopSection(Split, GpuAlignment):
    """The report's ``loop`` section (docs/schema.md), loop mode only."""

    steps: int
    steps_total: int | None  # the steps the loop ran, where the report covers fewer (Keras)
    epochs: int
    startup_s: float | None
    startup_wait_s: float
    wait_split_known: bool
    view: Literal["steady", "all"]  # which the verdict and the summaries read
    steady: Steady
    step_ms: Figures
    wait_ms: Figures
    compute_ms: Figures
    regions: dict[str, RegionFigures]
    host_regions: dict[str, Figures]
    gpu_compute_s: float | None
    wait_moved_to_gpu_compute_s: float
    transfer_moved_to_gpu_compute_s: float
    compute_moved_to_comm_s: float | None
    spread: Spread
    throughput: Throughput
    replay: dict[str, Any] | None

TIMELINE_ROWS = 2000
# NOTE [ Run-to-run spread ]
# Where a rerun of the same loop may land is estimated from the steps of this one, by batch
# means: the recent steps of the verdict's view (the step ring) are cut into ``SPREAD_BLOCKS``
# runs of consecutive steps, each block's figure (wait share, transfer share, mean step) is
# computed, and their standard error is the standard error of the run's figure. Blocks, not
# single steps, because steps are correlated (a worker's slow batch delays the next few), which
# makes the spread of single steps understate how much a whole run can move. A rerun's figure
# differs from this run's by the error of both, so the half-width that says where a rerun
# lands (95 %) is Student's t times sqrt(2) times that standard error; the difference of two
# runs, each with half-width h1, h2, is noise within sqrt((h1² + h2²) / 2).
SPREAD_BLOCKS = 10
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)  # df 1..9, two-sided


def _parts(part: dict[str, Stat], h2d_s: float) -> dict[str, float]:
    """Seconds per category for one group of steps; ``h2d_s`` is pipeprof's own copy time."""
    wait = part["wait"].total_ns / 1e9
    transfer = part["transfer"].total_ns / 1e9 + part["user_transfer"].total_ns / 1e9
    transfer = max(transfer, h2d_s)
    compute = part["compute"].total_ns / 1e9
    overhead = part["overhead"].total_ns / 1e9
    comm = part["comm"].total_ns / 1e9
    return {"wait_s": wait, "transfer_s": transfer, "compute_s": compute, "comm_s": comm,
            "overhead_s": overhead}  # fmt: skip


def _fractions(p: dict[str, float], part: dict[str, Stat]) -> Split:
    wall = sum(p.values())

    def share(k: str) -> float | None:
        return round(p[f"{k}_s"] / wall, 6) if wall else None

    return {
        "wait_s": round(p["wait_s"], 9),
        "transfer_s": round(p["transfer_s"], 9),
        "compute_s": round(p["compute_s"], 9),
        "comm_s": round(p["comm_s"], 9),
        "overhead_s": round(p["overhead_s"], 9),
        "wall_s": round(wall, 9),
        "wait_fraction": share("wait"),
        "transfer_fraction": share("transfer"),
        "compute_fraction": share("compute"),
        "comm_fraction": share("comm"),
        "overhead_fraction": share("overhead"),
        **wait_split(part, p["wait_s"], wall),
    }


def wait_split(part: dict[str, Stat], wait_s: float, wall_s: float) -> WaitSplit:
    """The wait of a group of steps as *starved* (the batch was not ready) and *hand-over* (it
    was, and was being moved): NOTE [ Wait, split ] in collect/torch/loader.py. ``wait_s`` may
    be less than recorded (moved to GPU compute: the GPU was still busy when the loop asked,
    the first part of a wait, so it comes off the starved part first). A file from before the
    split has none: all of its wait is starved, as the verdict read it then."""
    recorded = part["wait"].total_ns / 1e9
    starved_rec = part["starved"].total_ns / 1e9 if part["starved"].count else recorded
    starved = max(0.0, starved_rec - max(0.0, recorded - wait_s))
    handover = max(0.0, wait_s - starved)
    steps = part["wait"].count
    return {
        "starved_s": round(starved, 9),
        "handover_s": round(handover, 9),
        "starved_fraction": round(starved / wall_s, 6) if wall_s else None,
        "handover_fraction": round(handover / wall_s, 6) if wall_s else None,
        "handover_ms_per_step": round(handover * 1e3 / steps, 6) if steps else None,
    }


def _regions(
    regions: dict[str, Stat], sampled: dict[str, Any] | None
) -> dict[str, RegionFigures]:
    """The regions' figures; ``pipeprof run``'s own, timed in a sample of the steps (NOTE
    [ Regions in a sample of the steps ] in attach/run.py), with their totals scaled to every step
    (``count`` and the per-call figures stay those of the calls timed)."""
    out = {k: cast(RegionFigures, figures(v)) for k, v in regions.items()}
    steps, timed = (sampled or {}).get("steps") or 0, (sampled or {}).get("timed_steps") or 0
    if 0 < timed < steps:
        for k in STEP_REGIONS:
            if k in out:
                out[k]["total_s"] = round(out[k]["total_s"] * steps / timed, 9)
                out[k]["timed_steps"] = timed
    return out


def loop_section(session: Session, samples_per_step: float) -> LoopSection | None:
    """The report's ``loop`` section, or None outside loop mode."""
    loop = session.loop
    if session.mode != "loop" or loop is None:
        return None
    first, steady = loop.first, loop.steady
    h2d = session.stages.get("main", {}).get("transfer/h2d")
    h2d_s = h2d.total_ns / 1e9 if h2d is not None else 0.0
    n_first, n_steady = first["step"].count, steady["step"].count
    share = n_steady / (n_first + n_steady) if n_first + n_steady else 0.0
    p_first = _parts(first, h2d_s * (1 - share))
    p_steady = _parts(steady, h2d_s * share)
    gpu_copies = session.meta.get("h2d_clock") == "cuda"
    shift, held = _gpu_shift(
        loop.gpu_compute,
        (first, p_first, _held(first, h2d_s * (1 - share), gpu_copies)),
        (steady, p_steady, _held(steady, h2d_s * share, gpu_copies)),
    )
    comm_gpu = (session.meta.get("comm") or {}).get("gpu") or {}
    comm_shift = _comm_shift(comm_gpu, ("first", p_first), ("steady", p_steady))
    total = {k: p_first[k] + p_steady[k] for k in p_first}
    both = {k: Stat() for k in ("wait", "starved", "handover")}
    for part in (first, steady):
        for k, stat in both.items():
            stat.merge(part[k])
    split = _fractions(total, both)
    view: Literal["steady", "all"] = "steady" if steady_enough(n_steady, p_steady) else "all"
    samples = session.samples
    eff = samples / split["wall_s"] if split["wall_s"] else None
    compute_rate = samples / total["compute_s"] if total["compute_s"] else None
    replay = loop.replay or {}
    measured = replay.get("compute_samples_per_s")
    return {
        **split,
        "steps": loop.steps,
        "steps_total": session.meta.get("steps_total"),
        "epochs": loop.epochs,
        "startup_s": round(loop.startup_ns / 1e9, 9) if loop.startup_ns is not None else None,
        "steady": {"steps": n_steady, **_fractions(p_steady, steady)},
        "startup_wait_s": round(p_first["wait_s"], 9),
        "wait_split_known": bool(session.meta.get("wait_split")),
        "view": view,
        "step_ms": figures(steady["step"] if n_steady else first["step"]),
        "wait_ms": figures(steady["wait"]),
        "compute_ms": figures(steady["compute"]),
        "regions": _regions(loop.regions, session.meta.get("step_regions")),
        "host_regions": {k: figures(v) for k, v in loop.host_regions.items()},
        "gpu_compute_s": round(loop.gpu_compute.total_ns / 1e9, 9)
        if loop.gpu_compute.count
        else None,
        "wait_moved_to_gpu_compute_s": round(shift, 9),
        "transfer_moved_to_gpu_compute_s": round(held, 9),
        "compute_moved_to_comm_s": round(comm_shift, 9) if comm_gpu else None,
        "spread": step_spread(session, steady=view == "steady"),
        "throughput": {
            "effective_samples_per_s": round(eff, 3) if eff else None,
            "compute_samples_per_s": round(compute_rate, 3) if compute_rate else None,
            "replay_compute_samples_per_s": measured,
            "speedup_if_data_free": round((measured or compute_rate or 0) / eff, 3)
            if eff and (measured or compute_rate)
            else None,
        },
        "replay": replay or None,
        **gpu_alignment(session, split),
    }


STEADY_MIN_STEPS = 3


def loop_floor(
    loop: dict[str, Any], samples_per_step: float, handover: bool = True
) -> dict[str, float] | None:
    """What the loop's steps cost when its data is never late, per step in ms: compute,
    transfer, other regions and the hand-over of a ready batch (which more workers do not
    remove; left out where it overlapped busy workers, ``handover=False``: NOTE [ Capacity
    before hand-over ] in verdict.py), and the rate in samples/s that this allows: the most any
    data pipeline can give. Read from the view the verdict reads (``loop["view"]``)."""
    view = (loop.get("steady") or {}) if loop.get("view") == "steady" else loop
    steps = view.get("steps") or loop.get("steps") or 0
    if not steps or not samples_per_step:
        return None
    parts = {k: (view.get(f"{k}_s") or 0.0) * 1e3 / steps
             for k in ("compute", "comm", "transfer", "overhead", "handover")}  # fmt: skip
    if not handover:
        parts["handover"] = 0.0
    total = sum(parts.values())
    if total <= 0:
        return None
    out = {f"{k}_ms": round(v, 6) for k, v in parts.items()}
    return {**out, "step_ms": round(total, 6), "samples_per_s": samples_per_step * 1e3 / total}


def measured_rate(loop: dict[str, Any], samples_per_step: float) -> float | None:
    """The loop's samples/s as it ran, in the view the verdict reads (its steady steps, else
    all of them): the steps' samples over their wall time."""
    view = (loop.get("steady") or {}) if loop.get("view") == "steady" else loop
    steps, wall = view.get("steps") or 0, view.get("wall_s") or 0.0
    return steps * samples_per_step / wall if steps and wall > 0 else None


def half_width(num: list[int], den: list[int], blocks: int = SPREAD_BLOCKS) -> float | None:
    """The 95 % half-width of where a rerun's ``sum(num) / sum(den)`` lands, by batch means
    (NOTE [ Run-to-run spread ]); None below two blocks of two steps."""
    n = len(num)
    k = min(blocks, n // 2)
    if k < 2:
        return None
    ratios = []
    for j in range(k):
        lo, hi = j * n // k, (j + 1) * n // k
        d = sum(den[lo:hi])
        if d > 0:
            ratios.append(sum(num[lo:hi]) / d)
    if len(ratios) < 2:
        return None
    mean = sum(ratios) / len(ratios)
    var = sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1)
    return T95[len(ratios) - 2] * math.sqrt(2 * var / len(ratios))


def step_spread(session: Session, steady: bool) -> Spread:
    """How far the loop's figures may move on a rerun: 95 % half-widths of the wait and
    transfer shares (of wait + transfer + compute: the ring keeps no overhead) and of the mean
    step in ms, from the recent steps of the view (NOTE [ Run-to-run spread ]). None: too few
    steps to tell."""
    rows = [r for r in session.loop.step_ring if not (steady and r[4])] if session.loop else []
    steps = [r[1] + r[2] + r[3] for r in rows]
    wait = half_width([r[1] for r in rows], steps)
    transfer = half_width([r[2] for r in rows], steps)
    step = half_width(steps, [1] * len(steps))
    return {
        "steps": len(rows),
        "wait_fraction": None if wait is None else round(wait, 6),
        "transfer_fraction": None if transfer is None else round(transfer, 6),
        "step_ms": None if step is None else round(step / 1e6, 6),
    }


def steady_enough(steps: int, parts: dict[str, float]) -> bool:
    """The verdict and the summaries read the steady state when it has at least
    ``STEADY_MIN_STEPS`` steps and some time, else all steps (``loop["view"]``)."""
    return steps >= STEADY_MIN_STEPS and sum(parts.values()) > 0


BRACKETED = ("compute", "overhead", "user_transfer", "comm")  # a step's part after hand-over


def _held(part: dict[str, Stat], h2d_s: float, gpu_copies: bool) -> float:
    """Seconds the loop's thread spent in pipeprof's copies beyond the copies' own GPU time
    (CUDA events, ``gpu_copies``): held behind the GPU's queued work (a pageable copy waits for
    the kernels before it; a full launch queue holds any call), which is GPU compute too."""
    return max(0.0, part["transfer"].total_ns / 1e9 - h2d_s) if gpu_copies else 0.0


def _gpu_shift(
    gpu: Stat, *parts: tuple[dict[str, Stat], dict[str, float], float]
) -> tuple[float, float]:
    """Move wait to compute where CUDA events saw the GPU busy longer than the CPU between the
    same events (NOTE [ GPU compute by events ] in profiler.py): in each group of steps
    (start-up, steady) by the events of the steps before its own, the wait first, then the time
    the copies were held behind the GPU (``held``, seconds of transfer). Files from before the
    CPU's span was kept compare with the steps' parts after the hand-over (compute, other
    regions, the user's transfer, comm); files from before the groups were kept share the
    excess out by CPU compute. Returns the seconds moved from wait and from transfer."""
    if not gpu.count:
        return 0.0, 0.0
    moved = copied = 0.0
    if any("gpu_compute" in stats for stats, _, _ in parts):
        for stats, p, held in parts:
            ns = stats["gpu_compute"].total_ns if "gpu_compute" in stats else 0
            if "gpu_cpu" in stats:
                cpu = stats["gpu_cpu"].total_ns / 1e9
            else:
                cpu = sum(stats[k].total_ns for k in BRACKETED) / 1e9
            excess = max(0.0, ns / 1e9 - cpu)
            m = min(p["wait_s"], excess)
            t = min(held, p["transfer_s"], excess - m)
            p["wait_s"] -= m
            p["transfer_s"] -= t
            p["compute_s"] += m + t
            moved += m
            copied += t
        return moved, copied
    cpu = sum(p["compute_s"] for _, p, _ in parts)
    excess = gpu.total_ns / 1e9 - cpu
    for _, p, _ in parts:
        if excess <= 0:
            break
        m = min(p["wait_s"], excess * (p["compute_s"] / cpu if cpu else 1.0))
        p["wait_s"] -= m
        p["compute_s"] += m
        moved += m
    return moved, 0.0


def _comm_shift(gpu: dict[str, Any], *groups: tuple[str, dict[str, float]]) -> float:
    """Move compute to comm where CUDA events saw a group of steps' (start-up or steady) DDP
    all-reduces exposed longer than the host did for the same steps (NCCL: NOTE [ Comm on the
    GPU ] in collect/comm.py), from that group's compute, and what it cannot hold from the
    other's: a step's GPU time counts with the step after it (NOTE [ GPU compute by events ]
    in profiler.py), so the start-up steps' last all-reduce is in the steady steps' compute.
    Other comm (a ``Comm`` region) is not compared."""
    moved = spill = 0.0
    for name, part in groups:
        excess = (gpu.get(f"{name}_exposed_s") or 0.0) - (gpu.get(f"{name}_host_exposed_s") or 0.0)
        m = min(max(0.0, excess), part["compute_s"])
        spill += max(0.0, excess) - m
        part["compute_s"] -= m
        part["comm_s"] += m
        moved += m
    for _, part in groups:
        m = min(spill, part["compute_s"])
        part["compute_s"] -= m
        part["comm_s"] += m
        moved += m
        spill -= m
    return moved


def step_spans(session: Session) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Wait spans and compute spans of the recent steps (the step ring)."""
    waits, computes = [], []
    for t, wait, transfer, compute, _ in session.loop.step_ring if session.loop else ():
        waits.append((t, t + wait))
        c0 = t + wait + transfer
        computes.append((c0, c0 + compute))
    return waits, computes


def gpu_alignment(session: Session, loop: Split) -> GpuAlignment:
    """GPU utilisation while waiting vs computing, and the GPU time lost to waiting."""
    gpu = session.gpu or {}
    out: GpuAlignment = {
        "gpu_util_waiting": None,
        "gpu_util_computing": None,
        "idle_while_waiting_fraction": None,
    }
    tl = gpu.get("timeline") or {}
    if not gpu.get("available") or not tl.get("t_ns"):
        return out
    util0 = [row[0] if row else None for row in tl.get("util", [])]
    waits, computes = step_spans(session)
    uw = mean_over_spans(tl["t_ns"], util0, waits, hold="backward")
    uc = mean_over_spans(tl["t_ns"], util0, computes, hold="backward")
    out["gpu_util_waiting"] = None if uw is None else round(uw, 2)
    out["gpu_util_computing"] = None if uc is None else round(uc, 2)
    if uw is not None and loop["wall_s"]:
        idle = loop["wait_s"] * (1 - uw / 100.0) / loop["wall_s"]
        out["idle_while_waiting_fraction"] = round(max(0.0, idle), 6)
    return out


def timeline(session: Session) -> dict[str, Any] | None:
    """Down-sampled series for charts: steps, GPU and CPU utilisation, seconds from the start."""
    t0 = session.start_ns
    ring = list(session.loop.step_ring) if session.loop else []
    stride = max(1, len(ring) // TIMELINE_ROWS)
    steps = [
        [
            round((r[0] - t0) / 1e9, 6),
            round(r[1] / 1e6, 4),
            round(r[2] / 1e6, 4),
            round(r[3] / 1e6, 4),
        ]
        for r in ring[::stride]
    ]
    # row i is the loop's step first_step + i * stride (0-based; the ring keeps the latest steps)
    first = session.loop.steps - len(ring) if session.loop else 0
    out: dict[str, Any] = {
        "steps": steps,
        "first_step": first,
        "stride": stride,
        "gpu": None,
        "cpu": None,
    }
    gtl = (session.gpu or {}).get("timeline") or {}
    if gtl.get("t_ns"):
        out["gpu"] = {
            "t_s": [round((t - t0) / 1e9, 4) for t in gtl["t_ns"]],
            "util": gtl.get("util", []),
        }
    htl = (session.host or {}).get("timeline") or {}
    if htl.get("t_ns"):
        out["cpu"] = {
            "t_s": [round((t - t0) / 1e9, 4) for t in htl["t_ns"]],
            "cpu": htl.get("cpu", []),
        }
    # NOTE [ Private memory ] in collect/samplers/host.py: each process's readings, where read
    out["memory"] = [
        {"pid": p["pid"], "role": p["role"],
         "t_s": [round((t - t0) / 1e9, 4) for t in p["memory"]["t_ns"]],
         "uss_mb": p["memory"]["uss_mb"], "rss_mb": p["memory"]["rss_mb"]}
        for p in (session.host or {}).get("per_process") or []
        if (p.get("memory") or {}).get("t_ns")
    ]  # fmt: skip
    ends = [e.get("end_ns") for e in session.meta.get("epochs") or []]  # full passes
    out["epoch_ends_s"] = [round((t - t0) / 1e9, 4) for t in ends if t]
    if not steps and out["gpu"] is None and out["cpu"] is None:
        return None
    return out
