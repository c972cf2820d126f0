"""The verdict: what limits a training loop (input, transfer, overhead or compute), or a loader.

Thresholds start from TensorFlow's input-bound rule (>= 20 % of step time waiting is "high",
>= 5 % "moderate") and torch-tb-profiler's (DataLoader time > 5 %); see docs/findings.md.
"""

from __future__ import annotations

from typing import Any

from pipeprof.analyze.finding import Verdict
from pipeprof.core.regions import region_class

HIGH_WAIT = 0.20  # TensorFlow's profiler: "highly input-bound"
MODERATE_WAIT = 0.05  # ... "moderately input-bound"; torch-tb-profiler's DataLoader > 5 %


def loop_view(loop: dict[str, Any]) -> dict[str, Any]:
    """The figures the verdict reads: the steady state when the loop section says so (``view``,
    see ``analyze.loop.steady_enough``), else all steps."""
    return (loop.get("steady") or {}) if loop.get("view") == "steady" else loop


def loop_verdict(report: dict[str, Any], facts: dict[str, Any]) -> Verdict:
    """input-, transfer-, comm- or overhead-bound when that share of step time passes 5 % (high
    at 20 %) and is the largest non-compute share; compute-bound otherwise. ``borderline`` when
    the 95 % interval of the deciding share (``loop.spread``) holds a threshold."""
    restarts = restarting(report)
    if restarts is not None:
        return restart_verdict(report, restarts)
    view = loop_view(report["loop"])
    parts = ("wait", "transfer", "comm", "overhead")
    shares = {k: view.get(f"{k}_fraction") or 0.0 for k in parts}
    part = max(shares, key=lambda k: shares[k])
    frac = shares[part]
    who = "the GPU" if (report.get("gpu") or {}).get("available") else "the loop"
    doubt = _doubt(view, report["loop"].get("spread") or {}, part, shares)
    if frac < MODERATE_WAIT:
        computing = view.get("compute_fraction") or 0.0
        headline = f"compute-bound: {who} spent {computing:.0%} of step time computing"
        if doubt["borderline"]:
            what = {"wait": "waited for data", "transfer": "copied batches"}[doubt["part"]]
            headline = (
                f"compute-bound, {_unsure(doubt)}: {who} {what} {shares[doubt['part']]:.0%} of "
                f"the time ({_doubt_words(doubt, view)})"
            )
        else:
            headline += "; data was ready"
        verdict: Verdict = {
            "kind": "compute-bound",
            "severity": "low",
            "stage": None,
            "stages": [],
            "fraction": round(computing, 4),
            "headline": headline,
        }
        return _add_doubt(verdict, doubt)
    kind = {"wait": "input-bound", "transfer": "transfer-bound", "comm": "comm-bound",
            "overhead": "overhead-bound"}[part]  # fmt: skip
    what = {
        "wait": "waited for data",
        "transfer": "copied batches to the device",
        # a DDP rank whose all-reduce took 65-68 % of every step was called input-bound on
        # its 6-10 % wait: the step's largest part that is not compute names the verdict
        "comm": "waited in gradient all-reduce and other collectives (exposed comm)",
        "overhead": _overhead_words(report["loop"]),
    }[part]
    saturated = workers_saturated(report, view)
    filled = workers_fill_cores(report, view, facts["cores"])
    led = part == "wait" and handover_led(report["loop"], view)
    handover = led and saturated is None and filled is None
    stages = (
        ([] if handover else facts["limiting_group"])
        if part == "wait"
        else (["transfer/h2d"] if part == "transfer" else [])
    )
    stage = stages[0] if stages else None
    headline = f"{kind}: {who} {what} {frac:.0%} of the time"
    if frac < HIGH_WAIT:  # a part that could at most take that share off the step: say so
        headline = (
            f"moderately {kind} (at most ×{1 / (1 - frac):.2f} faster if it took no time): "
            f"{who} {what} {frac:.0%} of the time"
        )
    if doubt["borderline"]:
        headline = (
            f"{kind}, {_unsure(doubt)}: {who} {what} {frac:.0%} of the time "
            f"({_doubt_words(doubt, view)})"
        )
    if handover:
        per_step = (view.get("handover_s") or 0.0) * 1e3 / max(1, view.get("steps") or 1)
        headline += (
            f", but the batches were ready: the wait is their hand-over to the training "
            f"process ({per_step:.2g} ms per step), not a slow stage"
        )
    elif stage and part == "wait":
        headline += f"; {stage_phrase(stages, facts)} the pipeline{_blocked_most(report, facts)}"
        if led and saturated is not None:
            headline += (
                f" (the workers were busy {saturated:.0%} of each step's time: each batch's "
                "hand-over overlapped the making of the next)"
            )
        elif led and filled is not None:
            headline += (
                f" (its {facts['n_workers']} workers kept {filled:.0%} of the "
                f"{facts['cores']} cores busy: the cores, not the hand-over, limit)"
            )
    out: Verdict = {
        "kind": kind,
        "severity": "high" if frac >= HIGH_WAIT else "moderate",
        "stage": stage,
        "stages": stages,
        "fraction": round(frac, 4),
        "headline": headline,
    }
    _add_doubt(out, doubt)
    if part == "wait":
        out["cause"] = "hand-over" if handover else "starved"
        if saturated is not None or filled is not None:
            out["handover_overlapped"] = led
        if saturated is not None:
            out["workers_busy"] = round(saturated, 4)
        if filled is not None:  # their CPU fills the cores: they do not wait (rules.py)
            out["workers_cores"] = round(filled, 4)
    return out


def _overhead_words(loop: dict[str, Any]) -> str:
    """What the loop's non-compute time was: its largest named regions outside compute when
    they hold most of it (a Lightning validation at each epoch's end was called "logging,
    callbacks"), else the time outside the timed regions."""
    total = loop.get("overhead_s") or 0.0
    named = sorted(
        ((k, r) for k, r in (loop.get("regions") or {}).items()
         if region_class(k) == "overhead" and (r.get("total_s") or 0.0) >= total / 10),
        key=lambda kr: -kr[1]["total_s"],
    )[:2]  # fmt: skip
    if total > 0 and named and sum(r["total_s"] for _, r in named) >= total / 2:
        said = " and ".join(
            f"{k} ({r['count']} call{'s' if r['count'] != 1 else ''}, {r['total_s']:.3g} s)"
            for k, r in named
        )
        return f"ran {said} outside compute"
    return "ran code outside compute (logging, callbacks, untimed work)"


def _doubt(
    view: dict[str, Any], spread: dict[str, Any], part: str, shares: dict[str, float]
) -> dict[str, Any]:
    """The 95 % interval of the share that decides the verdict (``part``; for a compute-bound
    loop the wait or transfer share whose interval reaches highest) and the threshold inside it,
    if any. Overhead has no interval (the step ring keeps none): never borderline."""
    intervals = {}
    for k in ("wait", "transfer"):
        half = spread.get(f"{k}_fraction")
        if half is not None and view.get(f"{k}_fraction") is not None:
            f = view[f"{k}_fraction"]
            intervals[k] = (max(0.0, f - half), min(1.0, f + half))
    if shares[part] < MODERATE_WAIT and intervals:
        part = max(intervals, key=lambda k: intervals[k][1])
    interval = intervals.get(part)
    threshold = None
    if interval is not None:
        threshold = next(
            (t for t in (MODERATE_WAIT, HIGH_WAIT) if interval[0] < t <= interval[1]), None
        )
    return {
        "part": part,
        "interval": interval,
        "wait_interval": intervals.get("wait"),
        "threshold": threshold,
        "borderline": threshold is not None,
    }


def _add_doubt(verdict: Verdict, doubt: dict[str, Any]) -> Verdict:
    """``verdict`` with how sure it is: ``borderline``, ``too_short``, ``threshold`` and
    ``wait_fraction_interval``."""
    wait = doubt["wait_interval"]
    interval = doubt["interval"]
    verdict["borderline"] = doubt["borderline"]
    verdict["too_short"] = bool(doubt["borderline"] and interval[1] - interval[0] >= TOO_WIDE)
    verdict["threshold"] = doubt["threshold"]
    verdict["wait_fraction_interval"] = (
        None if wait is None else [round(wait[0], 4), round(wait[1], 4)]
    )
    return verdict


def _range(lo: float, hi: float) -> str:
    return f"95% interval {lo * 100:.1f}–{hi * 100:.1f}%"


# An interval this wide says nothing about the share: the run had too few steps, or steps too
# uneven, to tell (a short Keras run printed "95 % interval 0.0–100.0 %" as a borderline).
TOO_WIDE = 0.5


def _unsure(doubt: dict[str, Any]) -> str:
    lo, hi = doubt["interval"]
    return "too short to tell" if hi - lo >= TOO_WIDE else "borderline"


def _doubt_words(doubt: dict[str, Any], view: dict[str, Any]) -> str:
    lo, hi = doubt["interval"]
    if hi - lo >= TOO_WIDE:
        steps = view.get("steps")
        over = f" over {steps} steps" if steps else ""
        return f"{_range(lo, hi)}{over}: profile more steps to tell"
    return f"{_range(lo, hi)}, either side of the {doubt['threshold']:.0%} threshold"


def _blocked_most(report: dict[str, Any], facts: dict[str, Any]) -> str:
    """Where tf.data names the stage by TensorFlow's rule (the one the consumer was blocked on
    most) and another stage takes more of the pipeline's time, the words that reconcile the
    two with the stage table: time that runs in parallel, or ahead of the consumer, is not
    waited for (a Keras script's headline named its augmentation lambda, 21 % of the time,
    while the table showed decode at 78 %)."""
    meta = report.get("meta") or {}
    named = meta.get("limiting_stage")
    costs = facts.get("costs") or {}
    if report.get("framework") != "tf" or not named or not costs:
        return ""
    top = max(costs, key=lambda p: costs[p])
    total = sum(costs.values())
    if top == named or top.startswith(named + "/") or not total:
        return ""
    return (
        f": the consumer was blocked on it most (TensorFlow's rule); {top} takes more of the "
        f"pipeline's time ({costs[top] / total:.0%}) but ran in parallel or ahead of it"
    )


def stage_phrase(stages: list[str], facts: dict[str, Any]) -> str:
    """``load limits``, or ``load/decode or transform/ToTensor (within 6 % of each other)
    limit`` when the runner-up is within ``STAGE_MARGIN`` (``pipeline_facts``)."""
    if len(stages) < 2:
        return f"{stages[0]} limits"
    costs = facts["costs"]
    gap = 1 - costs[stages[-1]] / costs[stages[0]] if costs[stages[0]] else 0.0
    return f"{' or '.join(stages)} (within {max(gap, 0.01):.0%} of each other) limit"


# NOTE [ Capacity before hand-over ]
# A wait whose batches were ready when the loop asked is hand-over by the wait split (NOTE
# [ Wait, split ] in collect/torch/loader.py). But when the workers are busy all along, the
# pipeline's capacity is what limits the loop, however the last step of each batch's trip went:
# with the default file_descriptor sharing, rebuilding a received tensor asks the worker's
# resource-sharer thread, which waits for the GIL that the worker's Python holds while it makes
# the next batch, so each hand-over takes as long as the worker is busy, and overlaps it. So
# the wait is starved, and a stage limits, whenever the workers' busy time per batch, over the
# number of workers, is at least SATURATED of the loop's time per step; the hand-over is blamed
# only where the workers had slack.
SATURATED = 0.8


def _worker_rows(report: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The loader's ``num_workers``, and the report's rows of its worker processes."""
    n = (report.get("meta") or {}).get("num_workers") or 0
    rows = [w for w in report.get("workers") or [] if str(w.get("track", "")).startswith("worker")]
    return n, rows


def _busy_per_batch(report: dict[str, Any]) -> float | None:
    """The workers' busy seconds per batch, over their number (NOTE [ Capacity before
    hand-over ]); None without workers' batches."""
    n, rows = _worker_rows(report)
    batches = sum(w.get("batches") or 0 for w in rows)
    if not (n and batches):
        return None
    return float(sum(w.get("busy_s") or 0.0 for w in rows) / batches / n)


def workers_saturated(report: dict[str, Any], view: dict[str, Any]) -> float | None:
    """The workers' busy time per batch, over their number, as a share of the loop's time per
    step, where it reaches ``SATURATED`` (NOTE [ Capacity before hand-over ]); else None."""
    busy = _busy_per_batch(report)
    steps, wall = view.get("steps") or 0, view.get("wall_s") or 0.0
    if busy is None or not (steps and wall):
        return None
    share = busy / (wall / steps)
    return share if share >= SATURATED else None


def loader_saturated(report: dict[str, Any]) -> bool:
    """A loader profiled alone (no loop): whether its workers' busy time per batch, over their
    number, fills at least ``SATURATED`` of the time between batches (NOTE [ Capacity before
    hand-over ]): each hand-over then overlapped the making of the next batch."""
    busy = _busy_per_batch(report)
    per_s = (report.get("steady") or {}).get("batches_per_s")
    return bool(busy is not None and per_s and busy * per_s >= SATURATED)


# NOTE [ Workers past the cores ]
# More workers than cores take turns on them, so each one's busy time stretches with the
# others' turns and busy time over the number of workers under-reads what they make together.
# There the pipeline's capacity is the cores: where the workers' CPU time per batch, at the
# loop's rate, fills at least FILLED of the cores, the workers are the limit and each hand-over
# overlapped the making of other batches. Measured on the diagnosis matrix (2 cores, 4 workers,
# fork, free cores, plain loop, 3 runs each): 16 ms of Python collate ran 724 samples/s
# (file_descriptor sharing) and 823 (file_system); 2.5 ms of Python a sample, 579 and 616: the
# sharing strategy moves it 6-14 %, the cores (1,000 and 800 samples/s of CPU) bound it.
FILLED = 0.85
BUSY_CHILD = 20.0  # % of a core: a child process this busy competes for the cores


def workers_fill_cores(report: dict[str, Any], view: dict[str, Any], cores: int) -> float | None:
    """The share of the cores the workers' CPU fills at the loop's rate (of the cores this job
    gets beside other programs' busy processes, shared fairly), where there are more workers
    than cores and it reaches ``FILLED`` (NOTE [ Workers past the cores ]); else None."""
    n, rows = _worker_rows(report)
    # a worker's first batch carries no CPU time (its start is not the pipeline's)
    counted = sum(w.get("batches") or 0 for w in rows) - len(rows)
    cpu = sum(w.get("cpu_s") or 0.0 for w in rows)
    steps, wall = view.get("steps") or 0, view.get("wall_s") or 0.0
    if not (cores and n > cores and counted > 0 and cpu and steps and wall):
        return None
    # other busy processes take their fair turns too: the cores this job could get. A busy
    # child of the training process that is no worker of this loader (another pool, a
    # validation loader's workers) counts as one; other programs by the cores they used
    pids = {w.get("pid") for w in rows}
    children = [p for p in (report.get("host") or {}).get("per_process") or []
                if p.get("role") == "child" and p.get("pid") not in pids
                and (p.get("cpu_mean") or 0.0) >= BUSY_CHILD]  # fmt: skip
    others = len(children) + (other_load(report) or {}).get("other_cores", 0.0)
    ours = cores * (n + 1) / (n + 1 + others)
    share = cpu / counted * (steps / wall) / ours
    return share if share >= FILLED else None


def other_load(data: dict[str, Any]) -> dict[str, Any] | None:
    """What other processes did to the machine during a run: ``other_cores``, the CPU (in
    cores) that the host sampler saw used beyond the profiled processes, ``stolen_cores``, the
    part of it a hypervisor gave to other machines (steal; None where not read), and
    ``cpu_count``; None when the host was not sampled."""
    host = data.get("host") or {}
    util, cores = host.get("cpu_util_mean"), host.get("cpu_count")
    if util is None or not cores:
        return None
    ours = sum(p.get("cpu_mean") or 0.0 for p in host.get("per_process") or []) / 100
    steal = host.get("steal_mean")
    return {
        "other_cores": round(max(0.0, util / 100 * cores - ours), 3),
        "stolen_cores": None if steal is None else round(steal / 100 * cores, 3),
        "cpu_count": cores,
    }


def handover_overlapped(report: dict[str, Any]) -> bool:
    """The wait split said hand-over, but the verdict found the workers busy all along: that
    hand-over overlapped the making of the next batches, and is no floor on the loop's time per
    batch (a hand-over beside a starved wait, where the split says so, stays one)."""
    return bool((report.get("verdict") or {}).get("handover_overlapped"))


def handover_led(loop: dict[str, Any], view: dict[str, Any]) -> bool:
    """The loop's wait is mostly hand-over: its batches were ready when it asked (NOTE [ Wait,
    split ] in collect/torch/loader.py). Only a loop that was starved has a limiting stage."""
    wait, handover = view.get("wait_s") or 0.0, view.get("handover_s") or 0.0
    return bool(loop.get("wait_split_known")) and wait > 0 and handover > 0.5 * wait


# NOTE [ Start-up every epoch ]
# The verdict reads the steady state (``loop_view``) so that a one-off start-up does not decide
# it. But workers that are not kept (``persistent_workers=False``) start again every epoch, and
# each epoch's first batches wait for them: over a job of many short epochs, that wait recurs
# as often as the epochs do, and may be most of the loop. Where a loop ran 2 epochs or more with
# such workers, and its epochs' start-ups (the first batches of each, until every worker has
# delivered one: ``loop.startup_wait_s``) waited at least MODERATE_WAIT of the whole loop and
# more than the steady steps' wait, and the wait is the loop's largest part besides compute
# (not a rank's all-reduce, not logging), the verdict reads all the steps and names the cause
# "start-up": no stage limits, more workers start slower, and the fix is to keep the workers
# (``slow-startup`` in analyze/rules.py, which prices it).


def restarting(report: dict[str, Any]) -> float | None:
    """The share of the loop its epochs' start-ups waited, where NOTE [ Start-up every epoch ]
    makes it the verdict; else None."""
    loop, meta = report.get("loop") or {}, report.get("meta") or {}
    if (loop.get("epochs") or 1) < 2 or not meta.get("num_workers") or meta.get(
        "persistent_workers"
    ):
        return None
    wall, start = loop.get("wall_s") or 0.0, loop.get("startup_wait_s") or 0.0
    steady = (loop.get("steady") or {}).get("wait_s") or 0.0
    if not wall or start < MODERATE_WAIT * wall or start <= steady:
        return None
    # ... and only where the wait, start-ups included, is the loop's largest part besides
    # compute: a DDP rank whose all-reduce took 28 % of the loop was called input-bound on a
    # 10 % wait, 5 % of it start-ups (2 runs of 3 of the held-out ddp_files.py)
    others = ("transfer", "comm", "overhead")
    if (loop.get("wait_fraction") or 0.0) < max(loop.get(f"{k}_fraction") or 0.0 for k in others):
        return None
    return start / wall


def restart_verdict(report: dict[str, Any], share: float) -> Verdict:
    """Input-bound by the workers' start every epoch (NOTE [ Start-up every epoch ])."""
    loop = report["loop"]
    frac = loop.get("wait_fraction") or share
    who = "the GPU" if (report.get("gpu") or {}).get("available") else "the loop"
    epochs = loop.get("epochs") or 2
    return {
        "kind": "input-bound",
        "severity": "high" if frac >= HIGH_WAIT else "moderate",
        "stage": None,
        "stages": [],
        "fraction": round(frac, 4),
        "headline": (
            f"input-bound: {who} waited for data {frac:.0%} of the time, {share:.0%} at the "
            f"start of its {epochs} epochs, for workers started again each epoch "
            "(persistent_workers=False); not a slow stage"
        ),
        "borderline": False,
        "threshold": None,
        "wait_fraction_interval": None,
        "cause": "start-up",
        "startup_fraction": round(share, 4),
    }


def empty_verdict(report: dict[str, Any]) -> Verdict:
    """Nothing to judge: no batch reached the loop (a crash, Ctrl-C or an empty loader)."""
    what = "no step" if report.get("loop") else "no batch"
    why = " before the profile was interrupted" if report.get("interrupted") else ""
    return {
        "kind": "balanced",
        "severity": "info",
        "stage": None,
        "stages": [],
        "headline": f"nothing to attribute: {what} was measured{why}",
        "note": "run at least a few batches; any stage times shown are from what did run",
    }


def loader_verdict(report: dict[str, Any], facts: dict[str, Any]) -> Verdict:
    """A loader profiled alone has no compute to compare with: name what limits its rate."""
    path = facts["limiting"]
    stages = facts["limiting_group"]
    rate = (report.get("steady") or {}).get("samples_per_s") or report["throughput"][
        "samples_per_s"
    ]
    headline = f"the loader delivers {rate or 0:.0f} samples/s"
    if len(stages) > 1:
        headline += f"; {stage_phrase(stages, facts)} it"
    elif path:
        share = report["stages"][path]["total_s"] / (facts["pipeline_s"] or 1)
        blocked = _blocked_most(report, facts)
        headline += f"; {path} limits it ({share:.0%} of pipeline time){blocked}"
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
        "stages": stages,
        "headline": headline,
        "note": "loader profiled alone: wrap a training loop to attribute wait vs compute",
    }
