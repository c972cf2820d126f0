"""One report for a distributed job: its ranks' reports side by side (schema ``pipeprof-job/1``).

NOTE [ Job report ]
Each rank's report (analyze.analysis) splits its steps into wait / transfer / compute / comm /
other. Data-parallel training is synchronous: every step ends in the gradient all-reduce, so a
rank whose input pipeline is slow makes every other rank wait there. The job report reads that
back from the ranks' figures:

- **straggler**: the rank that waited for data the longest (its loop's ``wait_fraction``), when
  it waited ``STRAGGLER_MARGIN`` of step time more than the median of the other ranks; its
  slow stage is its own verdict's stage (or its slowest stage). The other ranks' comm is where
  they waited for it.
- **POP efficiencies** (the POP Centre of Excellence's metrics), over each rank's *useful* time,
  its compute (``compute_s``; comm, wait, transfer and other are not useful): load balance =
  mean / max of useful time; communication efficiency = max useful / runtime (the longest
  rank's loop); parallel efficiency = their product = mean useful / runtime.
- **what-if**: the job's rate if every rank's pipeline kept up: each rank's step keeps its
  compute, transfer and other and waits only as long as the least-waiting rank per step; the
  step of the job is the slowest such rank plus the least comm any rank paid per step (the
  all-reduce's own cost: the last rank to arrive waits least in it). An estimate from measured
  figures, as the single-process what-ifs are.

Nothing here reads files or clocks: the job dict follows from the rank dicts.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any, Literal, TypedDict

from pipeprof.analyze.accounting import SAME_MATCH, same_stream
from pipeprof.core.batch import overlap

JOB_SCHEMA = "pipeprof-job/1"
STRAGGLER_MARGIN = 0.05  # TensorFlow's "moderately input-bound" share of step time
PARTS = ("wait", "transfer", "compute", "comm", "overhead")


class RankRow(TypedDict):
    """A row of the job report's ``ranks``: one rank's loop, from its report."""

    rank: int
    local_rank: int | None
    host: str
    file: str  # the rank's report file, or its label
    steps: int
    samples: int
    wall_s: float
    verdict: str | None  # the rank's verdict's kind
    stage: str | None  # its verdict's stage, else its slowest stage
    interrupted: bool
    wait_s: float
    wait_fraction: float
    transfer_s: float
    transfer_fraction: float
    compute_s: float
    compute_fraction: float
    comm_s: float
    comm_fraction: float
    overhead_s: float
    overhead_fraction: float
    samples_per_s: float | None


class Efficiency(TypedDict):
    """POP's efficiencies over useful time (NOTE [ Job report ]); None: no useful time."""

    useful: str  # what counts as useful: ``compute_s``
    load_balance: float | None
    communication: float | None
    parallel: float | None


class Straggler(TypedDict):
    rank: int
    host: str
    stage: str | None
    wait_fraction: float
    excess_wait_fraction: float  # over the other ranks' median
    excess_wait_s: float
    others_comm_fraction: float  # the other ranks' median comm share: where they waited
    message: str


class KeptUp(TypedDict):
    """The job's rate if every rank's pipeline kept up (NOTE [ Job report ])."""

    step_ms: float | None  # None: no steps to tell
    samples_per_s: float | None
    speedup: float | None
    how: str


class SamePair(TypedDict):
    ranks: list[int]
    overlap: float
    by: Literal["indices", "stream"]


class RanOut(TypedDict):
    first: int  # the rank whose data ran out first
    last: int
    steps: dict[str, int]  # by rank


# "in" is a keyword: the functional form
StoppedFirst = TypedDict(
    "StoppedFirst",
    {
        "rank": int,
        "in": str | None,  # data, or where the training thread was (a collective, backward...)
        "at": str | None,  # the user's frame it was in
        "stalled_s": float | None,
        "last_batch_unix": float | None,
        "waiting": dict[str, str | None],  # the other stalled ranks, by rank: where each was
    },
)


class Job(TypedDict):
    """The job report (schema ``pipeprof-job/1``; docs/schema.md)."""

    schema: str
    world_size: int
    ranks_present: list[int]
    missing_ranks: list[int]
    hosts: list[str]
    ranks: list[RankRow]
    runtime_s: float  # the longest rank's loop
    samples_per_s: float
    efficiency: Efficiency
    stragglers: list[Straggler]
    what_if: KeptUp
    same_samples: list[SamePair]
    ran_out: RanOut | None
    stopped_first: StoppedFirst | None
    notes: list[str]
    headline: str
    gather_s: float | None  # ``pipeprof run`` under torchrun: the gather's seconds


class JobError(ValueError):
    """Rank reports that do not make one job (duplicate ranks, other world sizes, other jobs)."""


def check_job(ranks: list[tuple[str, dict[str, Any]]]) -> None:
    """Raise ``JobError`` when the ``(file, report)`` pairs are not ranks of one job."""
    if not ranks:
        raise JobError("no rank reports given: pass the files each rank wrote (run.rank*.json)")
    seen: dict[int, str] = {}
    worlds: dict[int, str] = {}
    for name, report in ranks:
        info = (report.get("meta") or {}).get("rank")
        if not isinstance(info, dict) or not isinstance(info.get("rank"), int):
            raise JobError(
                f"{name} says nothing of its rank (no meta.rank): it was written by a pipeprof "
                "without distributed support; profile the job again"
            )
        if report.get("mode") != "loop" or not report.get("loop"):
            raise JobError(f"{name} is not a training loop's report: merge reads loop reports")
        r = info["rank"]
        if r in seen:
            raise JobError(
                f"rank {r} appears twice ({seen[r]} and {name}): give each rank's file once"
            )
        seen[r] = name
        worlds.setdefault(int(info.get("world_size") or 1), name)
    if len(worlds) > 1:
        sizes = ", ".join(f"{w} in {n}" for w, n in sorted(worlds.items()))
        raise JobError(f"the files are from jobs of different sizes (world size {sizes}): "
                       "merge the files of one job")  # fmt: skip
    world = next(iter(worlds))
    beyond = sorted(r for r in seen if not 0 <= r < world)
    if beyond:
        raise JobError(f"rank {beyond[0]} ({seen[beyond[0]]}) is outside a job of {world} ranks")
    jobs = {str((rep.get("meta") or {}).get("rank", {}).get("job") or "") for _, rep in ranks}
    if len(jobs - {""}) > 1:
        raise JobError(f"the files are from different jobs ({', '.join(sorted(jobs - {''}))}): "
                       "merge the files of one job")  # fmt: skip
    _check_overlap(ranks)


def _check_overlap(ranks: list[tuple[str, dict[str, Any]]]) -> None:
    """The ranks of one job run at the same time: two files whose runs never overlapped (by
    their wall-clock start and length) are from two runs."""
    spans = []
    for name, rep in ranks:
        start = rep.get("started_at")  # the session's, added by merge
        if isinstance(start, (int, float)):
            spans.append((float(start), float(start) + float(rep.get("wall_s") or 0.0), name))
    spans.sort()
    for (_, a1, an), (b0, _, bn) in itertools.pairwise(spans):
        if b0 > a1 + 60.0:  # a minute's grace: start-up, clocks of different hosts
            raise JobError(
                f"{an} and {bn} are from different runs: {bn} started {b0 - a1:.0f} s after "
                f"{an} ended; merge the files of one job"
            )


def job_dict(ranks: list[tuple[str, dict[str, Any]]]) -> Job:
    """The job report for the ``(file, report dict)`` of each rank (NOTE [ Job report ])."""
    check_job(ranks)
    rows = sorted((_rank_row(name, rep) for name, rep in ranks), key=lambda r: r["rank"])
    world = int(ranks[0][1]["meta"]["rank"].get("world_size") or 1)
    runtime_s = round(max(r["wall_s"] for r in rows), 9)
    rate = round(sum(r["samples"] for r in rows) / max(runtime_s, 1e-12), 3)
    out: Job = {
        "schema": JOB_SCHEMA,
        "world_size": world,
        "ranks_present": [r["rank"] for r in rows],
        "missing_ranks": sorted(set(range(world)) - {r["rank"] for r in rows}),
        "hosts": sorted({r["host"] for r in rows}),
        "ranks": rows,
        "runtime_s": runtime_s,
        "samples_per_s": rate,
        "efficiency": efficiencies(rows, runtime_s),
        "stragglers": stragglers(rows),
        "what_if": kept_up(rows, rate),
        "same_samples": same_samples(ranks),
        "ran_out": ran_out(rows),
        "stopped_first": stopped_first(ranks),
        "notes": [],
        "headline": "",
        "gather_s": None,
    }
    out["notes"] = _notes(out)
    out["headline"] = _headline(out)
    return out


def _rank_row(name: str, rep: dict[str, Any]) -> RankRow:
    loop, info = rep["loop"], rep["meta"]["rank"]
    verdict = rep.get("verdict") or {}
    wall_s = loop.get("wall_s") or 0.0
    samples = rep.get("samples") or 0

    def part(key: str) -> float:
        return float(loop.get(key) or 0.0)

    return {
        "rank": info["rank"],
        "local_rank": info.get("local_rank"),
        "host": info.get("host") or "",
        "file": name,
        "steps": loop.get("steps") or 0,
        "samples": samples,
        "wall_s": wall_s,
        "verdict": verdict.get("kind"),
        "stage": verdict.get("stage") or _slowest_stage(rep),
        "interrupted": bool(rep.get("interrupted")),
        "wait_s": part("wait_s"),
        "wait_fraction": part("wait_fraction"),
        "transfer_s": part("transfer_s"),
        "transfer_fraction": part("transfer_fraction"),
        "compute_s": part("compute_s"),
        "compute_fraction": part("compute_fraction"),
        "comm_s": part("comm_s"),
        "comm_fraction": part("comm_fraction"),
        "overhead_s": part("overhead_s"),
        "overhead_fraction": part("overhead_fraction"),
        "samples_per_s": round(samples / wall_s, 3) if wall_s else None,
    }


def _slowest_stage(rep: dict[str, Any]) -> str | None:
    stages = {p: s.get("total_s") or 0.0 for p, s in (rep.get("stages") or {}).items()
              if "/" not in p and p != "transfer"}  # fmt: skip
    return max(stages, key=lambda p: stages[p]) if stages else None


def efficiencies(rows: list[RankRow], runtime_s: float) -> Efficiency:
    """POP's load balance, communication and parallel efficiency over useful (compute) time."""
    useful = [r["compute_s"] for r in rows]
    top = max(useful)
    lb = statistics.fmean(useful) / top if top else None
    ce = top / runtime_s if runtime_s else None
    return {
        "useful": "compute_s",
        "load_balance": None if lb is None else round(lb, 4),
        "communication": None if ce is None else round(ce, 4),
        "parallel": None if lb is None or ce is None else round(lb * ce, 4),
    }


def stragglers(rows: list[RankRow]) -> list[Straggler]:
    """The ranks whose input pipeline holds the others up, slowest first."""
    if len(rows) < 2:
        return []
    out: list[Straggler] = []
    for r in rows:
        others = [o for o in rows if o is not r]
        base = statistics.median(o["wait_fraction"] for o in others)
        excess = r["wait_fraction"] - base
        if excess < STRAGGLER_MARGIN:
            continue
        comm = statistics.median(o["comm_fraction"] for o in others)
        waits_on = [o["rank"] for o in others if o["comm_fraction"] >= r["comm_fraction"]]
        stage = f": {r['stage']}" if r["stage"] else ""
        message = f"rank {r['rank']} waits {r['wait_fraction']:.0%} for data{stage}"
        message += (f" ({excess:.0%} of step time more than the other ranks' median)")
        if waits_on and comm > r["comm_fraction"]:
            which = "the other ranks" if len(waits_on) == len(others) else (
                "rank" + ("s " if len(waits_on) > 1 else " ") + ", ".join(map(str, waits_on)))
            message += f"; {which} wait on it in all-reduce ({comm:.0%} comm, median)"
        out.append({
            "rank": r["rank"], "host": r["host"], "stage": r["stage"],
            "wait_fraction": r["wait_fraction"], "excess_wait_fraction": round(excess, 6),
            "excess_wait_s": round(excess * r["wall_s"], 6), "others_comm_fraction": comm,
            "message": message,
        })  # fmt: skip
    out.sort(key=lambda s: -s["excess_wait_fraction"])
    return out


def kept_up(rows: list[RankRow], now: float) -> KeptUp:
    """The job's samples/s if every rank's pipeline kept up (NOTE [ Job report ])."""
    how = ("every rank waits for data no longer than the least-waiting rank, and pays the least "
           "comm any rank paid per step")  # fmt: skip
    steps = [r for r in rows if r["steps"]]
    if not steps or not now:
        return {"step_ms": None, "samples_per_s": None, "speedup": None, "how": how}
    per = {r["rank"]: {k: _seconds(r, k) / r["steps"] for k in PARTS} for r in steps}
    least_wait = min(p["wait"] for p in per.values())
    least_comm = min(p["comm"] for p in per.values())
    step = max(p["compute"] + p["transfer"] + p["overhead"] for p in per.values())
    step += least_wait + least_comm
    samples_per_step = sum(r["samples"] / r["steps"] for r in steps)
    rate = samples_per_step / step if step else None
    return {
        "step_ms": round(step * 1e3, 6),
        "samples_per_s": None if rate is None else round(rate, 3),
        "speedup": None if rate is None else round(rate / now, 3),
        "how": how,
    }


def _seconds(row: RankRow, part: str) -> float:
    """A rank row's seconds of one of PARTS."""
    return {"wait": row["wait_s"], "transfer": row["transfer_s"], "compute": row["compute_s"],
            "comm": row["comm_s"], "overhead": row["overhead_s"]}[part]  # fmt: skip


SAME_RANKS = 0.5  # two ranks with this share of their first pass's samples in common


def ran_out(rows: list[RankRow]) -> RanOut | None:
    """Where the ranks ran different numbers of steps: the rank whose data ran out first and
    the one whose ran out last (``{first, last, steps}``, steps by rank); else None."""
    steps = {r["rank"]: r["steps"] for r in rows}
    if len(set(steps.values())) < 2:
        return None
    return {
        "first": min(steps, key=lambda r: (steps[r], r)),
        "last": max(steps, key=lambda r: (steps[r], -r)),
        "steps": {str(r): n for r, n in sorted(steps.items())},
    }


WAITING = ("collective", "backward")  # where a rank waits for the others (DDP's all-reduce)


def stopped_first(ranks: list[tuple[str, dict[str, Any]]]) -> StoppedFirst | None:
    """NOTE [ Hangs ] in collect/torch/hangs.py, ranks: of the ranks that stopped making
    progress (``meta.hang``: waiting for a batch; ``meta.stall``: no batch, the training thread
    elsewhere), the one that stopped first: one stuck in its own code or its data while others
    wait for it in a collective (or a backward pass, where DDP waits for its all-reduce), the
    earliest last batch among them; where every stalled rank waits on the others, a rank that
    recorded no stall (it never reached the collective). None where no rank stalled."""
    stalls: dict[int, dict[str, Any]] = {}
    for _, rep in ranks:
        meta = rep.get("meta") or {}
        rank = meta["rank"]["rank"]
        hang, stall = meta.get("hang"), meta.get("stall")
        if hang:
            who = next((w for w in hang["workers"] if w["waited_for"]), None) or hang.get("main")
            stalls[rank] = {"in": "data", "at": (who or {}).get("at"),
                            "stalled_s": hang.get("resumed_s") or hang["waited_s"],
                            "last_batch_unix": hang.get("last_batch_unix")}  # fmt: skip
        elif stall:
            stalls[rank] = {k: stall.get(k) for k in ("in", "at", "stalled_s", "last_batch_unix")}
    if not stalls:
        return None
    own = [r for r, s in stalls.items() if s["in"] not in WAITING]
    quiet = sorted({_rank_of(rep) for _, rep in ranks} - set(stalls))
    if own or not quiet:
        rank = min(own or stalls, key=lambda r: (stalls[r]["last_batch_unix"] or 0.0, r))
        seen = stalls[rank]
    else:  # every stalled rank waits on the others: one that recorded no stall holds them
        rank, seen = quiet[0], {"in": None, "at": None, "stalled_s": None, "last_batch_unix": None}
    return {
        "rank": rank,
        "in": seen["in"],
        "at": seen["at"],
        "stalled_s": seen["stalled_s"],
        "last_batch_unix": seen["last_batch_unix"],
        "waiting": {str(r): s["in"] for r, s in sorted(stalls.items()) if r != rank},
    }


def _rank_of(rep: dict[str, Any]) -> int:
    return int(rep["meta"]["rank"]["rank"])


def same_samples(ranks: list[tuple[str, dict[str, Any]]]) -> list[SamePair]:
    """Pairs of ranks whose first passes read the same samples: ``{ranks, overlap, by}``, the
    largest overlap first; ``by`` "indices" (a map-style dataset's, NOTE [ Index sketches ] in
    core/batch.py) or "stream" (an iterable one's first samples, NOTE [ The same stream ] in
    analyze/accounting.py: ``overlap`` is then the share of positions that matched)."""
    sketches, streams = [], []
    for _, rep in ranks:
        acc = rep.get("accounting") or {}
        rank = rep["meta"]["rank"]["rank"]
        if acc.get("sketch"):
            sketches.append((rank, acc["sketch"]))
        if acc.get("stream"):  # an iterable dataset's (NOTE [ The same stream ])
            streams.append((rank, acc["stream"]))
    pairs: list[SamePair] = []
    for (a, sa), (b, sb) in itertools.combinations(sorted(sketches), 2):
        share = overlap(sa, sb)
        if share is not None and share >= SAME_RANKS:
            pairs.append({"ranks": [a, b], "overlap": round(share, 3), "by": "indices"})
    for (a, sa), (b, sb) in itertools.combinations(sorted(streams), 2):
        share = same_stream(sa, sb)
        if share is not None and share >= SAME_MATCH:
            pairs.append({"ranks": [a, b], "overlap": round(share, 3), "by": "stream"})
    return sorted(pairs, key=lambda p: -p["overlap"])


def _same_message(job: Job) -> str:
    pairs = job["same_samples"]
    ranks = sorted({r for p in pairs for r in p["ranks"]})
    top = pairs[0]["overlap"]
    names = ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"
    return (
        f"ranks {names} read the same samples ("
        + (f"their streams' first samples matched at {top:.0%} of positions"
           if pairs[0].get("by") == "stream"
           else f"an estimated {top:.0%} of their first pass in common")
        + f"): each trains on the whole dataset, so the job does {len(ranks)}× the work "
        "for one epoch's data. Give each rank its share: "
        + (
            "shard the stream by rank in the dataset's __iter__ (torch.distributed.get_rank() "
            "and get_world_size(), with get_worker_info() inside each rank), or for a Hugging "
            "Face dataset datasets.distributed.split_dataset_by_node(ds, rank, world_size)"
            if pairs[0].get("by") == "stream"
            else "DataLoader(dataset, sampler=DistributedSampler(dataset)) and "
            "sampler.set_epoch(epoch) at each epoch's start"
        )
        + " (docs/findings.md#same-samples-in-ranks)"
    )


def _notes(job: Job) -> list[str]:
    notes = []
    if job["missing_ranks"]:
        names = ", ".join(map(str, job["missing_ranks"]))
        notes.append(
            f"rank{'s' if len(job['missing_ranks']) > 1 else ''} {names} of {job['world_size']} "
            "missing: no file given (did it crash before writing?); the figures cover the "
            "ranks present"
        )
    out = job.get("ran_out")
    if out:
        first, last = out["first"], out["last"]
        notes.append(
            f"rank {first}'s data ran out first ({out['steps'][str(first)]} steps), rank "
            f"{last}'s last ({out['steps'][str(last)]}): a rank stopped early (a crash, "
            "--batches) or its shard was smaller; under DDP the others wait for it at their "
            "next collective, or hang. Give each rank an even share (DistributedSampler pads "
            "the last one), or join uneven inputs (torch.distributed.algorithms.Join)"
        )
    stop = job.get("stopped_first")
    if stop:
        notes.append(_stopped_message(stop))
    bad = [str(r["rank"]) for r in job["ranks"] if r["interrupted"]]
    if bad:
        notes.append(f"interrupted (partial) report from rank {', '.join(bad)}")
    return notes


_IN = {"code": "in its own code", "data": "waiting for its data",
       "collective": "in a collective", "backward": "in a backward pass (DDP's all-reduce)"}


def _stopped_message(stop: StoppedFirst) -> str:
    """NOTE [ Hangs ], ranks: the rank that stopped progressing first, and where."""
    said = f"rank {stop['rank']} stopped progressing first"
    if stop["in"] is None:
        said += " (it recorded no stall: it never reached the collective the others wait in)"
    else:
        said += f", {_IN.get(stop['in'], stop['in'])}"
        if stop.get("at"):
            said += f" at {stop['at']}"
        if stop.get("stalled_s"):
            said += f", for {stop['stalled_s']:.0f} s"
    waiting = stop.get("waiting") or {}
    if waiting:
        said += "; " + ", ".join(f"rank {r} then waited {_IN.get(k or '', k)}"
                                 for r, k in waiting.items())  # fmt: skip
    return said


def _headline(job: Job) -> str:
    eff = job["efficiency"]
    pe = eff["parallel"]
    head = f"{len(job['ranks'])} of {job['world_size']} ranks"
    if pe is not None:
        head += f", parallel efficiency {pe:.0%}"
    if (stop := job["stopped_first"]) is not None:
        return f"{head}: {_stopped_message(stop)}"
    if job.get("same_samples"):
        return f"{head}: {_same_message(job)}"
    if job["stragglers"]:
        return f"{head}: {job['stragglers'][0]['message']}"
    if job["missing_ranks"]:
        comm = max(r["comm_fraction"] for r in job["ranks"])
        return (f"{head}: no straggler among the ranks present (up to {comm:.0%} comm: the one "
                f"they wait on may be a missing rank, {', '.join(map(str, job['missing_ranks']))})")
    return head + ": no rank's input pipeline holds the others up"
