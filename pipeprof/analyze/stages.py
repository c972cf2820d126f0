"""Pure functions from a Session to the report dictionary (schema ``pipeprof/1``).

Nothing here prints, draws or reads a clock: the same Session always gives the same report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal, TypedDict, cast

from pipeprof.core.session import Session
from pipeprof.core.stats import Figures, Stat, figures


def _ms(ns: float) -> float | None:
    return None if math.isnan(ns) else round(ns / 1e6, 6)


def _s(ns: float) -> float:
    return round(ns / 1e9, 9)


def merged_stages(session: Session) -> dict[str, Stat]:
    """Stage stats summed over all processes."""
    out: dict[str, Stat] = {}
    for stats in session.stages.values():
        for path, stat in stats.items():
            out.setdefault(path, Stat()).merge(stat)
    return out


class _StageRow(Figures):
    per_sample_ms: float
    per_batch_ms: float
    share: float | None  # of the top-level total; None below the top level
    tracks: list[str]  # the processes that ran it: main, worker0...


class StageRow(_StageRow, total=False):
    """A row of the report's ``stages`` (docs/schema.md)."""

    derived: bool  # a parent summed from its children, never timed itself
    scaled: float  # each later timed call's weight (NOTE [ Unprofiled batches ])


class WorkerRow(TypedDict):
    """A row of the report's ``workers`` (docs/schema.md)."""

    id: int | None  # None: the main process (num_workers=0)
    track: str
    pid: int | None
    busy_s: float
    cpu_s: float | None  # None: not measured
    gc_full: int
    gc_s: float
    gc_faults: int
    batches: int
    samples: int
    shards: int | None  # the WebDataset shards it opened (None: no shard opened by any)
    # from the first pass's iter() to its first batch ready, and to its first shard opened
    # (None: not known; no shard opened)
    first_batch_s: float | None
    first_shard_s: float | None
    busy_fraction: float | None
    samples_per_busy_s: float | None


class Overhead(TypedDict):
    """The report's ``overhead``: pipeprof's own cost (docs/schema.md, docs/cost.md)."""

    per_event_ns: float  # one region's cost, calibrated once a process
    in_situ_ns: float | None  # an empty region timed where the pipeline's run (None: < 3 batches)
    warm_ns: float | None
    cold_share: float | None
    region_ns: float | None
    displaced_ns: float | None
    unprofiled_batches: dict[str, Any] | None  # NOTE [ Unprofiled batches ] in the loader
    pack_s: float
    events: int
    in_stages_fraction: float | None  # what the timed regions add to the stage times
    sampler_cores: float | None  # the samplers' threads after their start, in cores
    regions_s: float
    main_s: float
    loop_s: float
    step_regions_s: float
    step_regions: dict[str, Any] | None  # how: the timed steps against the quiet ones, or probes
    control_s: float
    settle_s: float
    sampler_s: float
    setup_s: float
    snapshot_s: float
    estimated_s: float
    estimated_fraction: float | None  # of ``basis``: the profiled processes' CPU time
    basis: Literal["cpu", "busy"]


def stage_table(session: Session) -> dict[str, StageRow]:
    """``stages`` of the report: every recorded path plus derived parents, sorted as a tree.

    A parent that was never timed itself (``transform`` over its per-transform children,
    ``transfer`` over pin and h2d) gets the sum of its children's totals and no percentiles.
    """
    merged = merged_stages(session)
    table: dict[str, Any] = {path: figures(stat) for path, stat in merged.items()}
    timed = {path: stat.total_ns / 1e9 for path, stat in merged.items()}  # as recorded
    # The batches fetched with the recorder off have no records in the loader's stages (NOTE
    # [ Unprofiled batches ] in collect/torch/loader.py): those stages' totals are scaled to
    # every sample, so that they add up with the ones timed on every batch (transfer/h2d, the
    # loop's) and with the wait; counts and per-call figures are of the profiled samples. In two
    # strata: the profile's first batches, all timed, count as they are; the later timed ones
    # stand for all the later batches. Where no later batch was timed (a profile a few batches
    # longer than the first ones), or the first ones' time is not known (a file from before),
    # every timed sample stands for the unprofiled ones alike.
    off = unprofiled_samples(session)
    first = session.meta.get("first_batches")
    first = first if isinstance(first, dict) else {}
    later = session.samples - first.get("samples", 0)
    if not 0 < off < later:
        first, later = {}, session.samples
    scale = later / (later - off) if 0 < off < later else 1.0
    if scale != 1.0:
        first_ns = first.get("ns") or {}
        for track, stats in session.stages.items():
            kept = first_ns.get(track) or {}
            for path, stat in stats.items():
                if track.startswith("worker") or _loader_path(path):
                    row = table[path]
                    sampled_ns = max(0, stat.total_ns - kept.get(path, 0))
                    row["total_s"] = round(row["total_s"] + sampled_ns * (scale - 1) / 1e9, 9)
                    row["scaled"] = round(scale, 6)  # each later timed call's weight
    ancestors = {a for p in merged for a in _ancestors(p)}
    for parent in sorted(ancestors - merged.keys(), key=lambda p: p.count("/"), reverse=True):
        kids = [k for k in table if parent_of(k) == parent]
        total = sum(table[k]["total_s"] for k in kids)
        timed[parent] = sum(timed[k] for k in kids)
        count = max((table[k]["count"] for k in kids), default=0)
        table[parent] = {  # the keys of a timed stage; no percentiles of its own
            **figures(Stat()),
            "total_s": round(total, 9),
            "count": count,
            # per call, of the calls timed: a loader's totals are scaled, its counts are not
            "mean_ms": round(timed[parent] * 1e3 / count, 6) if count else None,
            "derived": True,
        }
    # tf.data stages come from a trace of the first elements only: per sample of those; a stage
    # timed on every element (a device copy in Profiler.wrap: its track is not in
    # ``traced_tracks``) per sample of all
    tf = session.meta.get("tf") or {}
    covered = set(tf.get("traced_tracks") or ["tf.data"])
    every = (max(session.samples, 1), max(session.batches, 1))
    traced = (
        max(tf.get("traced_samples") or session.samples, 1),
        max(tf.get("traced_batches") or session.batches, 1),
    )
    pipeline_s = top_total(table) or 1.0
    for path, row in table.items():
        under = {t for t, st in session.stages.items() for p in st if _at_or_under(p, path)}
        samples, batches = traced if under and under <= covered else every
        row["per_sample_ms"] = round(row["total_s"] * 1e3 / samples, 6)
        row["per_batch_ms"] = round(row["total_s"] * 1e3 / batches, 6)
        row["share"] = round(row["total_s"] / pipeline_s, 6) if "/" not in path else None
        row["tracks"] = sorted(t for t, st in session.stages.items() if path in st)
    # merged (and so table) lists the recorded paths in the order they first ran
    return cast(dict[str, StageRow], {path: table[path] for path in tree_order(table)})


def recorded_s(session: Session) -> float:
    """The top-level stages' time as recorded, in seconds: as ``top_total`` of the stage table,
    but not scaled to the batches fetched unprofiled."""
    merged = merged_stages(session)  # a parent not timed itself sums its children: count those
    outer = [st for p, st in merged.items() if not any(a in merged for a in _ancestors(p))]
    return sum(st.total_ns for st in outer) / 1e9


def unprofiled_samples(session: Session, prefixes: tuple[str, ...] = ("ab", "abw")) -> int:
    """The samples of the batches fetched with the recorder off (NOTE [ Unprofiled batches ] in
    collect/torch/loader.py): in the training process (``ab``) and in the workers (``abw``)."""
    c = session.costs
    arms = ("off", "cold", "lean")  # lean: NOTE [ The short path ] in collect/torch/loader.py
    return sum(c.get(f"{k}_{arm}_samples", 0) for k in prefixes for arm in arms)


def timed_batches(session: Session) -> int:
    """The batches whose loader stages were timed: all but those fetched with the recorder off
    (NOTE [ Unprofiled batches ] in collect/torch/loader.py), in the training process and in
    the workers, the cold ones included."""
    c = session.costs
    arms = ("off", "cold", "lean")
    off = sum(c.get(f"{k}_{arm}_batches", 0) for k in ("ab", "abw") for arm in arms)
    return max(0, session.batches - off)


def _loader_path(path: str) -> bool:
    """A stage a DataLoader's pipeline records (not the loop's): none in unprofiled batches."""
    return path.split("/")[0] in ("load", "transform", "collate") or path == "transfer/pin"


def _ancestors(path: str) -> list[str]:
    return [path.rsplit("/", i)[0] for i in range(1, path.count("/") + 1)]


def _at_or_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent + "/")


def top_total(stages: dict[str, dict[str, Any]]) -> float:
    """Seconds of all top-level stages together: the pipeline's time."""
    return sum(r["total_s"] for p, r in stages.items() if "/" not in p) or 0.0


def parent_of(path: str) -> str | None:
    return path.rsplit("/", 1)[0] if "/" in path else None


_TOP = {"load": 0, "transform": 1, "collate": 2, "transfer": 3}


def tree_order(paths: Iterable[str]) -> list[str]:
    """``paths`` as a tree: load, transform, collate, transfer, then any other; a parent before
    its children; siblings in the order they first appear in ``paths`` (pipeline order: a
    ``Compose``'s steps as they run)."""
    paths = list(dict.fromkeys(paths))
    first: dict[str, int] = {}
    for i, path in enumerate(paths):
        parts = path.split("/")
        for j in range(1, len(parts) + 1):
            first.setdefault("/".join(parts[:j]), i)

    def key(path: str) -> tuple[int, ...]:
        parts = path.split("/")
        ranks = (first["/".join(parts[:j])] for j in range(1, len(parts) + 1))
        return (_TOP.get(parts[0], 9), *ranks)

    return sorted(paths, key=key)


def worker_table(session: Session, wall_ns: int) -> list[WorkerRow]:
    rows: list[WorkerRow] = []
    opened = any(w.shards for w in session.workers.values())
    # the first pass's iter(), on the clock the workers share (NOTE [ Shards a worker opened ]
    # in collect/torch/dataset.py)
    first, took = session.first_ready_ns, session.first_batch_ns
    t_iter = first - took if first is not None and took is not None else None

    def since(t_ns: int) -> float | None:
        return round(max(0, t_ns - t_iter) / 1e9, 6) if t_ns and t_iter is not None else None

    for track, w in sorted(session.workers.items(), key=lambda kv: _worker_key(kv[0])):
        rows.append(
            {
                "id": int(track[6:]) if track.startswith("worker") else None,
                "track": track,
                "pid": w.pid,
                "busy_s": _s(w.busy_ns),
                "cpu_s": _s(w.cpu_ns) if w.cpu_ns else None,  # None: not measured
                "gc_full": w.gc_full,  # its full garbage collections, as shipped with batches
                "gc_s": _s(w.gc_ns),
                "gc_faults": w.gc_faults,
                "batches": w.batches,
                "samples": w.samples,
                "shards": w.shards if opened else None,
                "first_batch_s": since(w.first_ready_ns),
                "first_shard_s": since(w.first_shard_ns),
                "busy_fraction": round(min(1.0, w.busy_ns / wall_ns), 6) if wall_ns else None,
                "samples_per_busy_s": round(w.samples / (w.busy_ns / 1e9), 3)
                if w.busy_ns
                else None,
            }
        )
    return rows


def _worker_key(track: str) -> tuple[int, str]:
    return (int(track[6:]), track) if track.startswith("worker") else (-1, track)


class Rates(TypedDict):
    """``throughput``: samples and batches a second over the whole profile (None: no time)."""

    samples_per_s: float | None
    batches_per_s: float | None


class SteadyRates(Rates):
    """``steady``: the same after the first batch, and the seconds they cover."""

    wall_s: float | None


def throughput(session: Session) -> tuple[Rates, SteadyRates]:
    """Overall and steady-state (after the first batch) rates."""
    wall = session.wall_ns / 1e9
    overall: Rates = {
        "samples_per_s": round(session.samples / wall, 3) if wall else None,
        "batches_per_s": round(session.batches / wall, 3) if wall else None,
    }
    steady: SteadyRates = {"samples_per_s": None, "batches_per_s": None, "wall_s": None}
    t_first, first_samples, t_last = _steady_window(session)
    if t_first is not None and session.batches > 1 and session.first_batch_ns is not None:
        steady_wall = (t_last - t_first) / 1e9
        if steady_wall > 0:
            steady = {
                "samples_per_s": round((session.samples - first_samples) / steady_wall, 3),
                "batches_per_s": round((session.batches - 1) / steady_wall, 3),
                "wall_s": round(steady_wall, 6),
            }
    return overall, steady


def _steady_window(session: Session) -> tuple[int | None, int, int]:
    """From the first batch's arrival to the last one's; files from before those fields were
    kept read the batch ring and the end of the profile."""
    if session.first_ready_ns is not None:
        return session.first_ready_ns, session.first_samples, session.last_ready_ns
    first = session.batch_ring[0] if session.batch_ring else None
    return (first[2], first[4], session.end_ns) if first is not None else (None, 0, 0)


MIN_PROBES = 3  # batches probed before the in-situ region cost is used (the median of 3 drops one
# preempted probe; below that, the warm calibration, which states a third of a region in situ)
# The user's work between two regions, on average, from which on a region counts as following
# real work (its caches cold; less counts in proportion): a few thousand instructions, what it
# takes to turn the first-level caches over (NOTE [ In-situ region cost ])
COLD_AFTER_NS = 10_000


AB_MIN_OFF = 8  # unprofiled batches before their comparison is used (NOTE [ Unprofiled batches ])


def unprofiled_ab(session: Session, prefix: str = "ab") -> dict[str, Any] | None:
    """NOTE [ Unprofiled batches ] in collect/torch/loader.py: the CPU per sample of the
    profiled batches against the unprofiled ones among them, and the standard error of the
    difference from the spread between batches (None below AB_MIN_OFF batches of each, when
    they say too little); None when no batch was fetched unprofiled. ``prefix`` ``ab``: the
    process's CPU inside ``next()`` (all its threads), no workers; ``abw``: each worker's CPU
    for its batches."""
    c = session.costs
    if not (c.get(f"{prefix}_off_batches", 0) or c.get(f"{prefix}_lean_batches", 0)):
        return None
    arms = {}
    for arm in ("on", "off"):
        n, samples = c.get(f"{prefix}_{arm}_batches", 0), c.get(f"{prefix}_{arm}_samples", 0)
        q, qq = c.get(f"{prefix}_{arm}_q", 0), c.get(f"{prefix}_{arm}_qq", 0)
        var = max(0.0, (qq - q * q / n) / (n - 1)) if n > 1 else 0.0
        arms[arm] = (c.get(f"{prefix}_{arm}_ns", 0) / max(samples, 1), var / max(n, 1), n)
    (on, v_on, n_on), (off, v_off, n_off) = arms["on"], arms["off"]
    enough = min(n_on, n_off) >= AB_MIN_OFF
    return {
        "in": "workers" if prefix == "abw" else "main",
        "profiled_ns": round(on, 1) if n_on else None,
        "unprofiled_ns": round(off, 1),
        "per_sample_ns": round(on - off, 1) if enough else None,
        "stderr_ns": round(math.sqrt(v_on + v_off), 1) if enough else None,
        "batches": [n_on, n_off],
        # with the first batch of a pass (or of a worker), unprofiled but compared with none
        "unprofiled_samples": unprofiled_samples(session, (prefix,)),
    }


def _measured(ab: dict[str, Any] | None) -> bool:
    """An unprofiled-batch comparison that says more than its noise (used from one standard
    error on: a few preempted batches widen the error more than they move the difference)."""
    return ab is not None and ab["per_sample_ns"] is not None and (
        ab["per_sample_ns"] > ab["stderr_ns"]
    )


def _r1(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def overhead(session: Session, stages: dict[str, StageRow]) -> Overhead:
    """pipeprof's own cost (docs/validation/overhead.md). The timed regions: ``events`` times the
    cost of one region measured in situ (``in_situ_ns``, the median probe: NOTE [ In-situ region
    cost ] in core/recorder.py) and what it displaces from the user's code around it
    (``displaced_ns``: the cold probe's excess over the warm one), plus the packing of their
    records, measured per batch (``pack_s``); where no batch was probed (tf.data, older files),
    ``events`` times the cost calibrated with warm caches (``per_event_ns``: open, close, packing).
    With enough batches fetched unprofiled, in the training process or in the workers, the regions'
    cost is measured instead: the CPU per sample of the profiled batches over the unprofiled ones
    (``unprofiled_batches``, see ``unprofiled_ab``). Measured: the bookkeeping on the loop's thread
    inside ``next()`` (``main_s``; with ``pipeprof run``'s fast path, its own: ``fast_ns``), between
    the loop's steps (``loop_s``, by the clock) and in ``Profiler()``, ``start`` and ``stop``
    (``control_s``), folding the records (``settle_s``), the sampler threads (``sampler_s``) and
    building the profiled twin of a loader (``setup_s``) and the snapshots of a running loop
    (``snapshot_s``: wall time on the loop's thread; NOTE [ Snapshots ] in profiler.py).
    ``estimated_fraction`` is their sum over the CPU time of the profiled processes (main and
    workers) when known."""
    costs = session.costs
    probes = session.probe.count  # the median probe: a preempted one says nothing of a region
    in_situ_ns = session.probe.percentile_ns(50) if probes >= MIN_PROBES else None
    stage_s = recorded_s(session)  # what the regions ran in
    region_ns, warm_ns, cold_share, displaced_ns = in_situ_ns, None, None, 0.0
    if in_situ_ns is not None and session.probe_warm.count >= MIN_PROBES:
        # NOTE [ In-situ region cost ]: the cold probe's excess over the warm one, in the
        # region and once more in the user's code after it, for the regions that follow real
        # work; regions back to back (empty pipeprof.stage ticks) cost what the warm one does
        warm_ns = min(in_situ_ns, session.probe_warm.percentile_ns(50))
        between_ns = stage_s * 1e9 / session.events if session.events else 0.0
        cold_share = min(1.0, between_ns / COLD_AFTER_NS)
        displaced_ns = cold_share * (in_situ_ns - warm_ns)
        region_ns = warm_ns + displaced_ns
    pack_s = costs.get("pack_ns", 0) / 1e9
    if in_situ_ns is not None and region_ns is not None:  # the probes are regions too
        in_stages_s = session.events * (region_ns + displaced_ns) / 1e9
        regions_s = in_stages_s + probes * (in_situ_ns + (warm_ns or 0.0)) / 1e9 + pack_s
    else:
        in_stages_s = regions_s = session.events * session.overhead_ns / 1e9
    ab = unprofiled_ab(session)
    workers = any(t.startswith("worker") for t in session.workers)  # another loader's regions
    if ab is not None and _measured(ab) and not workers:
        # measured in situ, displacement and all: what the profiled samples cost over the
        # unprofiled ones (the rest are the batches fetched with the recorder off), else the
        # probes
        profiled = session.samples - ab["unprofiled_samples"]
        ab["probed_s"] = round(regions_s, 6)  # what the probes would have stated
        regions_s = ab["per_sample_ns"] * profiled / 1e9
        ab["used"] = True
    wab = unprofiled_ab(session, "abw") if ab is None or not ab.get("used") else None
    if wab is not None:
        ab = wab
        if _measured(wab):
            # the same, in the workers: their regions, packing and probes are in the difference;
            # the training process's own regions (its copies, the loop's stages) as modelled
            kept = [w.samples for t, w in session.workers.items() if t.startswith("worker")]
            profiled = sum(kept) - wab["unprofiled_samples"]
            main_events = max(0, session.events - costs.get("worker_events", 0))
            each_ns = (
                region_ns + displaced_ns
                if in_situ_ns is not None and region_ns is not None
                else session.overhead_ns
            )
            wab["probed_s"] = round(regions_s, 6)
            regions_s = (wab["per_sample_ns"] * profiled + main_events * each_ns) / 1e9
            wab["used"] = True
    # in next(): the loader's bookkeeping, and the fast path's own (NOTE [ The fast path ])
    main_s = (costs.get("main_ns", 0) + costs.get("fast_ns", 0)) / 1e9
    loop_s = costs.get("loop_ns", 0) / 1e9
    control_s = costs.get("control_ns", 0) / 1e9  # Profiler(), start() and stop()
    settle_s = costs.get("settle_ns", 0) / 1e9
    sampler_s = costs.get("sampler_ns", 0) / 1e9
    # the samplers' start (priming, the first sample) is once a run: not what sample_hz scales
    steady_sampler_s = max(0.0, sampler_s - costs.get("sampler_first_ns", 0) / 1e9)
    setup_s = costs.get("setup_ns", 0) / 1e9
    snapshot_s = costs.get("snapshot_ns", 0) / 1e9
    # ``pipeprof run``'s Forward / Backward / Optimizer regions in the steps (attach/run.py)
    step_regions_s = costs.get("step_regions_ns", 0) / 1e9
    cost_s = regions_s + main_s + loop_s + control_s + settle_s + sampler_s + setup_s + snapshot_s
    cost_s += step_regions_s
    main_cpu = session.meta.get("main_cpu_ns")
    basis: Literal["cpu", "busy"]
    if isinstance(main_cpu, int) and main_cpu > 0:
        base_s = (main_cpu + sum(w.cpu_ns for w in session.workers.values())) / 1e9
        basis = "cpu"
    else:  # a file from before CPU time was kept: the time the pipeline and the loop took
        base_s = stage_s + session.wait.total_ns / 1e9
        basis = "busy"
    wall_s = session.wall_ns / 1e9
    return {
        "per_event_ns": round(session.overhead_ns, 1),
        "in_situ_ns": _r1(in_situ_ns),
        "warm_ns": _r1(warm_ns),
        "cold_share": None if cold_share is None else round(cold_share, 3),
        "region_ns": _r1(region_ns),
        "displaced_ns": None if in_situ_ns is None else round(displaced_ns, 1),
        "unprofiled_batches": ab,
        "pack_s": round(pack_s, 6),
        "events": session.events,
        "in_stages_fraction": round(in_stages_s / stage_s, 6) if stage_s > 0 else None,
        "sampler_cores": round(steady_sampler_s / wall_s, 6) if wall_s > 0 else None,
        "regions_s": round(regions_s, 6),
        "main_s": round(main_s, 6),
        "loop_s": round(loop_s, 6),
        "step_regions_s": round(step_regions_s, 6),
        "step_regions": session.meta.get("step_regions"),
        "control_s": round(control_s, 6),
        "settle_s": round(settle_s, 6),
        "sampler_s": round(sampler_s, 6),
        "setup_s": round(setup_s, 6),
        "snapshot_s": round(snapshot_s, 6),
        "estimated_s": round(cost_s, 6),
        "estimated_fraction": round(cost_s / base_s, 6) if base_s > 0 else None,
        "basis": basis,
    }
