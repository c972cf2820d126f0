"""``pipeprof tune``'s choices, as pure functions over reports and measured rates (docs/tune.md):
which settings to try first, which trials to drop, and whether the best one beats the script's
own settings by more than the noise.

NOTE [ Tuning ]
Candidates come from the baseline's profile first: the worker counts the what-if model ranks
best (with the rate each is promised), the ``workers-needed`` finding's count, the counts next
to the best one, and the script's own. Then, at the winning worker count, one knob at a time
where a finding points at it: ``persistent_workers`` where the workers restarted each epoch
(the baseline saw two passes or more: a trial of one pass cannot show what it saves, so a
one-pass profile's start-up hint leaves it untried, noted),
``prefetch_factor`` 4 where the loop waited for data, ``pin_memory`` on a CUDA device, the
``file_system`` sharing strategy where the hand-over cost, and the training process's threads
on a CPU-trained loop. A knob is kept only where it won, in two paired rounds or more where the
tune runs more (one dropped after a round, behind another knob, is not). Where
``persistent_workers`` is a candidate, the worker counts kept workers would want (``recount``)
are tried beside it, in the knobs' phase: a pass no longer starts its workers, so each added
worker stops costing a start-up every epoch, and the best count moves up, toward the what-if's,
which is the steady state's (a proof pipeline of short epochs: 3 or 4 workers best without it,
8 with it; docs/tune.md). Where it was kept some other way (a ``--try``), the counts are tried
again with it in a phase of their own. The phases after the first run one round fewer (2 at
least): what they compare is the best so far, already measured beside the script's own.

Trials are measured in rounds: every setting still in once a round, in a shuffled order, so
that the machine's drift lands on all of them alike. After each round, a setting whose best
rate is under ``DROP`` of the leader's median is dropped (clearly worse); one trial is stopped
halfway when its rate so far is under ``FLOOR`` of the leader's. Each setting has one it must
beat in every round that ran both (the script's own for the worker counts, the best so far for
the knobs and the counts tried again): one that lost a round to it stops there and is not
chosen, since no later round can undo the loss. Only the first phase (the worker counts) runs
the script's own settings; a later phase runs the best so far beside its settings, and their
gain over the script is chained (``chain``): the gain over the best so far, times the best so
far's own gain over the script, measured in the phase before. The winner is the setting with the
best gain; it replaces the script's own settings only where it beat them in every round of each
link, by ``MIN_GAIN`` or more at the median, with a 95 % interval of the gain (t over the rounds'
log ratios, the links' ends multiplied) above 1 (from a single round, where there is no interval,
by ``ONE_ROUND_GAIN``): a pipeline that is already at its best is left as it is, and no chosen
setting measured slower than the script's own. Where the leader did not beat it, the next in
order that did is chosen.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

DROP = 0.80  # a setting whose best round is under this share of the leader's median is dropped
FLOOR = 0.60  # a trial whose rate halfway is under this share of the leader's is stopped there
MIN_GAIN = 1.03  # the least median gain (with every paired round a gain) that changes a setting
ONE_ROUND_GAIN = 1.10  # the least gain from a single paired round (no interval to read)
LOADER_KNOBS = ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory")
PROCESS_KNOBS = ("sharing_strategy", "torch_threads", "worker_threads")
KNOBS = (*LOADER_KNOBS, *PROCESS_KNOBS)
# What torch refuses without workers, and the value each takes then (a trial's arguments and
# the proposed edit alike)
WITHOUT_WORKERS = {"prefetch_factor": None, "persistent_workers": False,
                   "multiprocessing_context": None}  # fmt: skip


def current(report: dict[str, Any]) -> dict[str, Any]:
    """The script's own settings, as the baseline's profile saw them."""
    meta = report.get("meta") or {}
    n = int(meta.get("num_workers") or 0)
    return {
        "num_workers": n,
        "prefetch_factor": meta.get("prefetch_factor") if n else None,
        "persistent_workers": bool(meta.get("persistent_workers")) if n else False,
        "pin_memory": bool(meta.get("pin_memory")),
        "sharing_strategy": meta.get("sharing_strategy"),
        "torch_threads": meta.get("torch_threads"),
    }


def most_workers(cores: int) -> int:
    """The most workers a tune tries: twice the cores, and at least 8."""
    return max(8, 2 * cores)


def worker_counts(report: dict[str, Any], cores: int,
                  rows: list[dict[str, Any]] | None = None) -> list[int]:
    """The worker counts to try first: the script's own, the what-if's best (the fewest within
    3 % of its top rate) among ``rows`` (scenarios.worker_rows for every count up to
    most_workers; else the report's own what-if), its neighbours, and the ``workers-needed``
    finding's count."""
    most = most_workers(cores)
    n = current(report)["num_workers"]
    if rows is None:
        rows = report.get("what_if") or []
    ks = {n}
    best = model_best(rows, most)
    if best is not None:
        ks |= {best, best - 1, best + 1}
    for f in report.get("findings") or []:
        if f.get("id") == "workers-needed":
            k = (f.get("evidence") or {}).get("workers_needed")
            if isinstance(k, int):
                ks |= {k, k + 1}
    if best is None and not n:
        ks |= {1, 2}
    too_many = past_memory(rows)
    return sorted(k for k in ks if 0 <= k <= most and (k == n or k not in too_many))


def model_best(rows: list[dict[str, Any]], most: int) -> int | None:
    """The what-if's best worker count among ``rows`` (scenarios.worker_rows): the fewest within
    3 % of its top rate, up to ``most`` and short of the memory; None without rows."""
    usable = [r for r in rows if r.get("kind") == "workers" and not r.get("exceeds")
              and r["workers"] <= most and r.get("samples_per_s")]  # fmt: skip
    if not usable:
        return None
    top = max(r["samples_per_s"] for r in usable)
    return int(min(r["workers"] for r in usable if r["samples_per_s"] >= 0.97 * top))


def past_memory(rows: list[dict[str, Any]]) -> set[int]:
    """The worker counts the what-if's rows say exceed the RAM or the shared memory."""
    return {r["workers"] for r in rows if r.get("kind") == "workers" and r.get("exceeds")}


def recount(workers: int, cores: int, rows: list[dict[str, Any]]) -> list[int]:
    """The worker counts to try again once ``persistent_workers`` was kept at ``workers``
    (NOTE [ Tuning ]): one more and twice as many; where the what-if's best count (its steady
    state, which kept workers reach) is past twice as many, twice as many and that one. Up to
    most_workers and short of a count past the RAM or the shared memory (``rows``' ``exceeds``,
    scenarios.worker_rows)."""
    too_many, most = past_memory(rows), most_workers(cores)
    best = model_best(rows, most)
    counts = {2 * workers, best} if best is not None and best > 2 * workers else {
        workers + 1, 2 * workers}
    return sorted(n for n in counts if workers < n <= most and n not in too_many)


def knob_candidates(report: dict[str, Any], workers: int, cores: int) -> list[dict[str, Any]]:
    """The knobs to try one at a time at ``workers`` workers, each where a finding or the
    loop's own figures point at it (NOTE [ Tuning ])."""
    now = current(report)
    meta = report.get("meta") or {}
    ids = {f.get("id") for f in report.get("findings") or []}
    verdict = report.get("verdict") or {}
    loop = report.get("loop") or {}
    out: list[dict[str, Any]] = []
    if workers:
        restarts = (loop.get("epochs") or 0) > 1  # one pass: nothing for kept workers to save
        if restarts and not now["persistent_workers"]:
            out.append({"persistent_workers": True})
        if verdict.get("kind") == "input-bound" and (now["prefetch_factor"] or 2) < 4:
            out.append({"prefetch_factor": 4})
        if "handover" in ids and now["sharing_strategy"] == "file_descriptor":
            out.append({"sharing_strategy": "file_system"})
    device = str(meta.get("device") or "")
    if device.startswith("cuda") and not now["pin_memory"]:
        out.append({"pin_memory": True})
    threads = now["torch_threads"]
    if not device.startswith("cuda") and threads and workers and cores > 1:
        spare = max(1, cores - workers)
        if spare != threads:
            out.append({"torch_threads": spare})
    return out


def promised(settings: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """The rate the baseline's what-if promised for ``settings`` (its worker count; the other
    knobs are not in the model), from ``rows`` (scenarios.worker_rows)."""
    if set(settings) - {"num_workers"}:
        return None
    k = settings.get("num_workers")
    for row in rows:
        if row["workers"] == k:
            return float(row["samples_per_s"])
    return None


def median(rates: list[float]) -> float | None:
    return statistics.median(rates) if rates else None


def leader(rates: dict[str, list[float]]) -> str | None:
    """The setting with the best median rate."""
    ranked = [(statistics.median(r), key) for key, r in rates.items() if r]
    return max(ranked)[1] if ranked else None


def dropped(rates: dict[str, list[float]], keep: set[str]) -> set[str]:
    """Settings clearly worse than the leader: their best round under DROP of its median
    (never those in ``keep``: the baseline, the leader)."""
    top = leader(rates)
    if top is None:
        return set()
    bar = DROP * statistics.median(rates[top])
    return {k for k, r in rates.items() if r and k not in keep | {top} and max(r) < bar}


def gain(paired: list[tuple[float, float]]) -> dict[str, Any] | None:
    """A setting's gain over the baseline from rounds that ran both (``(rate, baseline)``):
    the median ratio, its range, and a 95 % interval (t on the log ratios, two rounds or
    more)."""
    ratios = [a / b for a, b in paired if a and b]
    if not ratios:
        return None
    out: dict[str, Any] = {
        "ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
        "rounds": len(ratios), "interval": None,
    }  # fmt: skip
    if len(ratios) >= 2:
        logs = [math.log(r) for r in ratios]
        mean, sd = statistics.mean(logs), statistics.stdev(logs)
        t = T95[min(len(logs) - 2, len(T95) - 1)]
        half = t * sd / math.sqrt(len(logs))
        out["interval"] = [math.exp(mean - half), math.exp(mean + half)]
    return out


T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)  # two-sided, df 1..10


def chain(step: dict[str, Any] | None, ref: dict[str, Any] | None,
          via: str) -> dict[str, Any] | None:
    """A setting's gain over the baseline through ``via``, the setting it was paired with:
    its gain over ``via`` (``step``) times ``via``'s over the baseline (``ref``). The range and
    the interval multiply their ends, which is wider than either (both links must hold); the
    rounds are the fewer of the two, and one link of one round leaves no interval. ``worst``
    is the lowest round's ratio in any link: ``beats`` wants every link won in every round."""
    if step is None or ref is None:
        return None
    both = step["interval"] is not None and ref["interval"] is not None
    return {
        "ratio": step["ratio"] * ref["ratio"], "low": step["low"] * ref["low"],
        "high": step["high"] * ref["high"], "rounds": min(step["rounds"], ref["rounds"]),
        "interval": [a * b for a, b in zip(step["interval"], ref["interval"])] if both else None,
        "via": via, "worst": min(step["low"], ref.get("worst", ref["low"])),
    }  # fmt: skip


def beats(g: dict[str, Any] | None) -> bool:
    """Enough to change the script: a gain in every paired round (of every link, chained),
    MIN_GAIN at the median, and (two rounds or more) a 95 % interval above 1."""
    if g is None or g.get("worst", g["low"]) <= 1.0 or g["ratio"] < MIN_GAIN:
        return False
    if g["interval"] is None:  # one round: a larger bar instead
        return bool(g["ratio"] >= ONE_ROUND_GAIN)
    return bool(g["interval"][0] > 1.0)


def key(settings: dict[str, Any]) -> str:
    """A setting's name in the table: its knobs, in KNOBS' order."""
    parts = [f"{k}={settings[k]}" for k in (*KNOBS, "_mode") if k in settings]
    return ", ".join(parts) or "as it is"


# NOTE [ The ceiling ladder ]
# How fast the loop could go, rung by rung, from runs of the script at the chosen setting:
# - "cold page cache": every file read dropped from the page cache first (NOTE [ A cold page
#   cache ] in attach/trial.py), against the warm runs of the tune;
# - "as it is", and the chosen setting ("tuned");
# - "no hand-over": workers make each batch and hand over nothing, the training process replays
#   the first batches (what the hand-over costs: the pickling, the shared memory, the queue);
# - "stages at their best worker counts": the what-if model's ceiling for the loader, capped by
#   the loop's data-free rate (a model, not a run);
# - "compute alone": the first batches replayed, no loader at all: the step's own rate.
# Each rung's share of the step time it recovers is 1 - (as it is) / (its rate). The next rung to
# climb, once the edit is applied, is the lowest one above the chosen setting by NEXT_RUNG or
# more.
NEXT_RUNG = 1.05
RUNGS = {
    "cold page cache": "reads from the disk: a local copy, a cache, faster storage",
    "as it is": "the script's own settings",
    "tuned": "the chosen setting: apply the edit",
    "no hand-over": "handing batches over: fewer, larger tensors; file_system sharing",
    "stages at their best worker counts": "the stages: more cores, or cheaper ones (bench)",
    "compute alone": "the step itself: data is no longer the limit",
}


def model_ceiling(report: dict[str, Any]) -> float | None:
    """The what-if's ceiling for the loader, capped by the loop's data-free rate."""
    rows = {r.get("kind"): r for r in report.get("what_if") or []}
    top = (rows.get("ceiling") or {}).get("samples_per_s")
    free = (rows.get("data-free") or {}).get("samples_per_s")
    if top is None:
        return None
    return float(min(top, free) if free else top)


def ladder(base: float | None, tuned: float | None, measured: dict[str, float | None],
           model: float | None) -> dict[str, Any] | None:
    """The rungs (NOTE [ The ceiling ladder ]), slowest first, each with its rate, its share of
    the step time recovered from the script as it is, and what climbs it; and the next one."""
    if not base:
        return None
    rates: dict[str, float | None] = {"as it is": base, "tuned": tuned, **measured,
                                      "stages at their best worker counts": model}  # fmt: skip
    rungs: list[dict[str, Any]] = [
        {"rung": name, "samples_per_s": rate, "recovered": 1 - base / rate,
         "measured": name != "stages at their best worker counts", "what": RUNGS[name]}
        for name, rate in rates.items() if rate
    ]  # fmt: skip
    rungs.sort(key=lambda r: r["samples_per_s"])
    at = max(base, tuned or 0.0)
    above = [r for r in rungs if r["samples_per_s"] >= NEXT_RUNG * at]
    return {"rungs": rungs, "next": above[0]["rung"] if above else None}
