"""Every sample accounted for (docs/findings.md): which workers delivered the loader's samples,
in what shares, whether workers of an iterable dataset yielded the same samples, and which
indices the first pass read (a sketch, compared across ranks in the job report).

NOTE [ The same stream ]
An ``IterableDataset`` that does not shard its ``__iter__`` by ``get_worker_info()`` is copied
into each worker whole, and each worker yields all of it: the loop sees every sample once per
worker, and pays for each copy. The workers then deliver the same sequence, in the same order.
Each worker's first samples are fingerprinted (NOTE [ Sample fingerprints ] in core/batch.py),
part by part; two workers yield the same stream where, for some part, at least SAME_MATCH of
their first samples (MIN_COMPARED at least) match position by position, and where that part
varies enough that two independent streams would match at a position at most MAX_COLLISION of
the time (the chance that two draws of the part are equal: a constant part, or a label with two
classes, proves nothing). A label alone then suffices: each worker may crop its copy of an image
at random, but it yields it with the same label, at the same place.

An epoch's samples (NOTE [ An epoch's samples ] in collect/torch/epochs.py) are judged here from
what the pass recorded: ``epochs`` (the samples of each pass that ran to its end) against
``expected`` (a full pass's: the sampler's length less what ``drop_last`` leaves out, or an
iterable dataset's stated length), and ``repeated`` (passes of a shuffling DistributedSampler
that began at an epoch an earlier pass had used: the same order again).
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from typing import Any, TypedDict

from pipeprof.analyze.finding import Finding, finding
from pipeprof.core.batch import FINGERPRINT_PARTS, merged
from pipeprof.core.session import Session

MIN_COMPARED = 16  # NOTE [ The same stream ]
SAME_MATCH = 0.9
MAX_COLLISION = 0.5
LOW_SHARE = 0.25  # a worker below this fraction of an even share delivered far too little
MIN_BATCHES_A_WORKER = 2  # a worker's silence counts from this many batches a worker


class Accounting(TypedDict):
    """The report's ``accounting`` (docs/schema.md)."""

    workers: int  # the loader's num_workers
    delivered: dict[str, int]  # samples each worker delivered, by worker id
    silent: list[int]  # workers that delivered no batch
    low: list[int]  # workers far below an even share (LOW_SHARE)
    same_stream: list[list[int]]  # workers that yielded the same samples, in the same order
    compared: int  # samples compared a worker (0: no fingerprints, not an iterable dataset)
    sketch: list[int]  # the first pass's indices, sketched (NOTE [ Index sketches ])
    # an iterable dataset's first samples in a distributed job, fingerprinted: the lowest worker's
    # (or the training process's), compared between ranks in the job report
    stream: list[int]
    sampler: str | None  # the sampler's class (None: an iterable dataset)
    shuffle: bool | None  # whether it shuffles (None: the user's own sampler, not known)
    dataset_len: int | None  # the dataset's stated length (None: no __len__)
    shards: int | None  # the shards an iterable dataset says it has (Hugging Face's num_shards)
    expected: int | None  # samples a full pass delivers, by the sampler and drop_last
    dropped: int  # indices drop_last leaves out of each epoch
    epochs: list[int]  # samples of each pass that ran to its end
    repeated: int  # passes whose DistributedSampler epoch an earlier pass had used
    # the full pass whose last worker finished longest after the others: ``last`` (its id),
    # ``waited_s`` (by worker id: after its own last batch), ``batches`` (after the first worker
    # was done), ``wall_s``, ``share`` (of the pass's time) and ``pass`` (its index); None
    tail: dict[str, Any] | None
    # a stateful loader's (torchdata): ``every`` (snapshot_every_n_steps), ``calls`` to
    # state_dict(), ``ms`` a call, ``interval_steps`` between calls (median); None for others
    snapshots: dict[str, Any] | None
    # a stateful loader whose loop read a snapshot: ``restores`` ("state" or "fast-forward"),
    # ``sampler``, ``shuffles`` (True, False, None: not known) and ``resumes``, each resumed
    # pass measured (``at`` batches, ``before``, ``after``, ``repeated``, ``skipped``: NOTE [
    # Resumes ] in collect/torch/resume.py); None for others
    resume: dict[str, Any] | None


def accounting(session: Session) -> Accounting | None:
    """The loader's workers' shares and streams, and its indices sketched; None for what is
    not a DataLoader."""
    n = session.meta.get("num_workers")
    if not isinstance(n, int) or n < 0:
        return None
    workers = {int(t[6:]): w for t, w in session.workers.items() if t.startswith("worker")}
    batches = sum(w.batches for w in workers.values())
    samples = sum(w.samples for w in workers.values())
    judged = batches >= MIN_BATCHES_A_WORKER * n and not session.interrupted
    even = samples / n if n else 0.0
    silent = [i for i in range(n) if i not in workers or not workers[i].batches] if judged else []
    low = sorted(i for i, w in workers.items()
                 if judged and w.batches and w.samples < LOW_SHARE * even)  # fmt: skip
    groups, compared = _same_streams({i: w.ids for i, w in workers.items()})
    facts = session.meta.get("sampler") or {}
    passes = session.meta.get("epochs") or []
    shuffle = facts.get("shuffle")
    used = [e["epoch"] for e in passes if e["epoch"] is not None]
    return {
        "workers": n,
        "delivered": {str(i): workers[i].samples for i in sorted(workers)},
        "silent": silent,
        "low": low,
        "same_stream": groups,
        "compared": compared,
        "sketch": merged([w.sketch for w in session.workers.values() if w.sketch]),
        "stream": _stream(session),
        "sampler": facts.get("kind"),
        "shuffle": shuffle,
        "dataset_len": facts.get("dataset_len"),
        "shards": facts.get("shards"),
        "expected": _expected(facts),
        "dropped": facts.get("dropped", 0),
        "epochs": [e["samples"] for e in passes],
        "repeated": len(used) - len(set(used)) if shuffle else 0,
        "tail": _tail(passes),
        "snapshots": _snapshots(session.meta),
        "resume": _resume(session.meta),
    }


def _resume(meta: dict[str, Any]) -> dict[str, Any] | None:
    """How a stateful loader's snapshots restore its sampler, and the resumes measured (NOTE
    [ Resumes ] in collect/torch/resume.py)."""
    facts = meta.get("restore")
    if facts is None:
        return None
    return {**facts, "resumes": list(meta.get("resumes") or [])}


def _snapshots(meta: dict[str, Any]) -> dict[str, Any] | None:
    """A stateful loader's snapshots (NOTE [ An epoch's samples ], case 5): how often its
    workers take one, and the loop's ``state_dict()`` calls."""
    every = meta.get("snapshot_every_n_steps")
    if every is None:
        return None
    got = meta.get("state_dicts") or {"calls": 0, "total_ns": 0, "steps": []}
    steps = got["steps"]
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    return {
        "every": every,
        "calls": got["calls"],
        "ms": round(got["total_ns"] / got["calls"] / 1e6, 4) if got["calls"] else None,
        "interval_steps": statistics.median(gaps) if gaps else None,
    }


def _tail(passes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The full pass whose workers finished furthest apart, for its share of the pass's time
    (NOTE [ An epoch's samples ], case 4)."""
    tails = [
        {**p["tail"], "pass": i, "share": round(max(p["tail"]["waited_s"].values())
                                                / p["tail"]["wall_s"], 4)}
        for i, p in enumerate(passes)
        if p.get("tail") and p["tail"]["wall_s"] > 0
    ]  # fmt: skip
    return max(tails, key=lambda t: t["share"]) if tails else None


STREAM_KEPT = 64  # samples of a rank's stream kept for the job report


def _stream(session: Session) -> list[int]:
    """A distributed rank's iterable stream, its first STREAM_KEPT samples' fingerprints: its
    lowest worker's, or the training process's (no workers)."""
    if not session.meta.get("iterable"):
        return []
    tracks = sorted((t for t, w in session.workers.items() if w.ids),
                    key=lambda t: (t == "main", int(t[6:]) if t.startswith("worker") else 0))
    if not tracks:
        return []
    return session.workers[tracks[0]].ids[: STREAM_KEPT * FINGERPRINT_PARTS]


def same_stream(a: list[int], b: list[int]) -> float | None:
    """How many of two streams' first samples match, position by position, where at least
    MIN_COMPARED of each are known and a part varies enough (NOTE [ The same stream ]); None
    where they cannot tell."""
    m = min(len(a), len(b)) // FINGERPRINT_PARTS
    if m < MIN_COMPARED:
        return None
    return _match(a, b, m)


def _expected(facts: dict[str, Any]) -> int | None:
    """Samples a full pass delivers (NOTE [ An epoch's samples ]): the sampler's length less what
    drop_last leaves out; an iterable dataset's stated length."""
    if facts.get("kind") is None:
        n: int | None = facts.get("dataset_len")
        return n
    n = facts.get("sampler_len")
    return None if n is None else n - facts.get("dropped", 0)


def _same_streams(ids: dict[int, list[int]]) -> tuple[list[list[int]], int]:
    """Groups of workers whose first samples match (NOTE [ The same stream ]), and how many
    samples a worker were compared."""
    k = FINGERPRINT_PARTS
    seqs = {i: v for i, v in ids.items() if len(v) >= MIN_COMPARED * k}
    if len(seqs) < 2:
        return [], 0
    m = min(len(v) for v in seqs.values()) // k  # samples compared a worker
    groups: list[list[int]] = []
    for i in sorted(seqs):
        for group in groups:
            if _same(seqs[group[0]], seqs[i], m):
                group.append(i)
                break
        else:
            groups.append([i])
    return [g for g in groups if len(g) > 1], m


def _same(a: list[int], b: list[int], m: int) -> bool:
    match = _match(a, b, m)
    return match is not None and match >= SAME_MATCH


def _match(a: list[int], b: list[int], m: int) -> float | None:
    """The largest share of positions where a part of the first ``m`` samples matches, over
    the parts that vary enough to tell (None: none does)."""
    k = FINGERPRINT_PARTS
    best = None
    for part in range(k):
        x, y = a[part : m * k : k], b[part : m * k : k]
        if not any(x):  # no such part
            continue
        counts = Counter(x)
        collision = sum(c * c for c in counts.values()) / (m * m)
        if collision > MAX_COLLISION:
            continue
        share = sum(p == q for p, q in zip(x, y)) / m
        best = share if best is None else max(best, share)
    return best


def rule_same_stream(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ The same stream ]: workers that yielded the same samples."""
    acc = report.get("accounting")
    if not acc or not acc["same_stream"]:
        return None
    group = max(acc["same_stream"], key=len)
    init = (report.get("meta") or {}).get("worker_init_fn")
    k, n = len(group), acc["workers"]
    names = ", ".join(str(i) for i in group[:-1]) + f" and {group[-1]}"
    return finding(
        "same-samples-in-workers",
        "critical",
        None,
        f"workers {names} of {n} yielded the same samples in the same order (the first "
        f"{acc['compared']} of each matched): the IterableDataset runs whole in each worker, so "
        f"the loop sees every sample {k} times, and the workers do {k}× the work for the same "
        "data",
        {"workers": group, "num_workers": n, "compared": acc["compared"]},
        (f"the loader's worker_init_fn ({init}) runs in each worker but leaves every worker "
         "the whole stream: shard there (set this worker's part of the source from "
         "`get_worker_info()`, as torch's IterableDataset example does), or "
         if init else "")
        + "shard the stream by worker in the dataset's __iter__: `info = "
        "torch.utils.data.get_worker_info()`, then yield only the items (or open only the "
        "files) where `i % info.num_workers == info.id`; under DDP shard by rank as well. An "
        f"epoch is then the data once: {k}× fewer batches for the same samples "
        "(docs/findings.md#same-samples-in-workers)",
    )


def _opened(opened: dict[Any, int | None]) -> str:
    """``worker 0: 2, worker 1: 1``: the shards each worker that opened any opened."""
    return ", ".join(f"worker {i}: {k}" for i, k in sorted(opened.items(), key=str) if k)


def rule_idle_workers(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Workers that delivered no batch, or far below an even share of the samples."""
    acc = report.get("accounting")
    if not acc or not (acc["silent"] or acc["low"]):
        return None
    n = acc["workers"]
    total = sum(acc["delivered"].values()) or 1
    if acc["silent"]:
        ids = acc["silent"]
        said = (f"worker {ids[0]}" if len(ids) == 1 else f"workers {', '.join(map(str, ids))}")
        message = (f"{said} of {n} delivered no batch in {report['batches']} batches: "
                   "its share of the data was empty")  # fmt: skip
    else:
        ids = acc["low"]
        shares = ", ".join(f"worker {i}: {acc['delivered'][str(i)] / total:.0%}" for i in ids)
        message = (f"{shares} of the samples, far below an even share ({1 / n:.0%}): the "
                   "others did its work")  # fmt: skip
    shards = acc.get("shards")
    wds = bool((report.get("meta") or {}).get("stream"))  # a WebDataset pipeline's steps
    opened = {w["id"]: w.get("shards") for w in report.get("workers") or []}
    if wds and acc["silent"] and any(opened.values()):  # NOTE [ Shards a worker opened ]
        who = "it" if len(acc["silent"]) == 1 else "they"
        message += f"; {who} opened no shard (the others opened {_opened(opened)})"
    if shards is not None and shards < n:
        what = "in its shard list" if wds else "(num_shards)"
        message += f"; the dataset has {shards} shard(s) {what} for {n} workers"
    iterable = bool(report.get("meta", {}).get("iterable"))
    fix = (
        "WebDataset gives each worker its own shards (split_by_worker): with fewer shards "
        "than workers some get none, and shards that do not divide evenly leave some workers "
        "short at each epoch's end; write the data as many more shards than workers (a "
        "multiple of num_workers × the ranks: webdataset's ShardWriter(maxcount=...) sets "
        "the samples a shard), or set num_workers to at most the shards a rank reads; an idle "
        "worker costs its memory and start-up for nothing"
        + (f"; here: at least {n} shards, or num_workers={shards}"
           if shards is not None and shards < n else "")
        if wds
        else "an IterableDataset whose source has fewer shards than workers (a Hugging Face "
        "IterableDataset with n_shards=1, fewer files than workers) leaves workers without "
        "data, and uneven shards leave them short: set num_workers to at most the number of "
        "shards, or split the source into more, even shards (Hugging Face: "
        "`to_iterable_dataset(num_shards=...)`); an idle worker costs its memory and start-up "
        "for nothing"
        + (f"; here: to_iterable_dataset(num_shards={n}) or a multiple of it, or "
           f"num_workers={shards}" if shards is not None and shards < n else "")
        if iterable
        else "the batches did not reach every worker: check a custom batch_sampler or "
        "worker_init_fn; an idle worker costs its memory and start-up for nothing"
    )
    return finding("idle-workers", "warning", None, message,
                   {"workers": ids, "num_workers": n, "delivered": acc["delivered"]},
                   fix)  # fmt: skip


def rule_order_repeats(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ An epoch's samples ], case 1: a shuffling DistributedSampler whose epoch stayed
    put from one pass to the next."""
    acc = report.get("accounting")
    if not acc or not acc.get("repeated"):
        return None
    passes, repeated = len(acc["epochs"]), acc["repeated"]
    said = "every epoch" if repeated == passes - 1 else f"{repeated} of {passes} epochs"
    return finding(
        "same-order-every-epoch",
        "warning",
        None,
        f"the {acc['sampler']} shuffles, but its epoch did not change between passes: "
        f"{said} read the samples in the same order as an earlier one (set_epoch was not "
        "called), so the shuffle gives the model one fixed order",
        {"epochs": passes, "repeated": repeated, "sampler": acc["sampler"]},
        "call `sampler.set_epoch(epoch)` at the start of each epoch, before iterating the "
        "loader (Lightning, the HF Trainer and Accelerate do this themselves); each epoch is "
        "then a new order (docs/findings.md#same-order-every-epoch)",
    )


SHARE_NEVER_SEEN = 0.01  # NOTE [ An epoch's samples ], case 2: a warning from this share
SHARE_DROPPED = 0.05  # with a shuffling (or unknown) sampler: a hint from this share


def rule_dropped(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ An epoch's samples ], case 2: what ``drop_last`` leaves out of each epoch."""
    acc = report.get("accounting")
    if not acc or not acc.get("dropped") or acc["expected"] is None:
        return None
    k = acc["dropped"]
    n = acc["expected"] + k
    share = k / n
    size = report.get("meta", {}).get("batch_size")
    # an order that repeats (same-order-every-epoch) leaves the same samples out, as no shuffle
    fixed = acc["shuffle"] is False or bool(acc.get("repeated"))
    if share < (SHARE_NEVER_SEEN if fixed else SHARE_DROPPED):
        return None
    said = (
        ("and the sampler does not shuffle" if acc["shuffle"] is False
         else "and every epoch repeats one order")
        + ": the same samples are left out every epoch, so the model never sees them"
        if fixed
        else "a different draw each epoch, as the sampler shuffles"
    )  # fmt: skip
    return finding(
        "samples-dropped",
        "warning" if fixed else "info",
        None,
        f"drop_last=True leaves the last {k} of {n} samples ({share:.0%}) out of each epoch "
        f"(batch_size={size}), {said}",
        {"dropped": k, "samples": n, "share": round(share, 4), "batch_size": size,
         "shuffle": acc["shuffle"]},
        f"a batch_size that divides {n}, or drop_last=False (the last batch is then smaller)"
        + ("; or shuffle=True, so that each epoch leaves out others" if fixed else "")
        + " (docs/findings.md#samples-dropped)",
    )  # fmt: skip


def rule_epoch_length(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ An epoch's samples ], case 3: an iterable dataset whose full passes yielded
    another count than its ``__len__`` states."""
    acc = report.get("accounting")
    if not acc or acc["sampler"] is not None or acc["expected"] is None or not acc["epochs"]:
        return None
    n, got = acc["expected"], acc["epochs"]
    meta = report.get("meta", {})
    # drop_last leaves each worker's short last batch out
    slack = (meta.get("batch_size") or 1) * max(1, acc["workers"]) if meta.get("drop_last") else 0
    off = [m for m in got if not n - slack <= m <= n]
    if not off or not n:
        return None
    m = off[0]
    k = acc["workers"]
    why = (
        f"each of the {k} workers yielded the whole stream (same-samples-in-workers)"
        if k > 1 and abs(m - k * n) <= slack + k
        else "its __iter__ yields more than __len__ counts"
        if m > n
        else "its __iter__ stopped early, or skips items (a filter, unread shards) that "
        "__len__ counts"
    )
    return finding(
        "epoch-length",
        "warning",
        None,
        f"the IterableDataset states {n} samples (__len__), but "
        + (f"a full pass yielded {m}" if len(off) == 1 else f"{len(off)} full passes yielded "
           f"{', '.join(map(str, off[:3]))}")
        + f" (×{m / n:.2f}): {why}",
        {"stated": n, "delivered": off, "workers": k},
        "make __len__ and __iter__ agree: shard the stream by worker (and rank) in __iter__, "
        "and count in __len__ what one epoch yields; the loop's len(), progress bars and "
        "schedulers read __len__ (docs/findings.md#epoch-length)",
    )  # fmt: skip


SNAPSHOT_SPARE = 10  # state_dict() read once in this many snapshots, or fewer: a hint


def rule_snapshots(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ An epoch's samples ], case 5: workers that snapshot far more often than the loop
    reads a state."""
    acc = report.get("accounting") or {}
    snap = acc.get("snapshots")
    if not snap or not acc["workers"] or not snap["interval_steps"]:
        return None
    every, interval = snap["every"], snap["interval_steps"]
    if interval < SNAPSHOT_SPARE * every:
        return None
    wall = (report.get("loop") or {}).get("wall_s") or report.get("wall_s") or 0
    spent = snap["calls"] * snap["ms"] / 1e3
    share = f", {spent / wall:.1%} of the loop" if wall else ""
    return finding(
        "snapshots-unread",
        "info",
        None,
        f"the StatefulDataLoader's workers snapshot their state every {every} step(s), but the "
        f"loop reads one (state_dict()) every {interval:g} steps: {interval / every:.0f} "
        f"snapshots copied for each one used (state_dict() took {snap['ms']:.3g} ms a call, "
        f"{snap['calls']} calls{share})",
        {"snapshot_every_n_steps": every, "interval_steps": interval, "calls": snap["calls"],
         "state_dict_ms": snap["ms"]},
        f"worth trying, not measured: StatefulDataLoader(..., snapshot_every_n_steps={interval:g}"
        "), the interval at which the loop checkpoints; each snapshot copies the dataset's and "
        "sampler's state in a worker and sends it with a batch (snapshots at every step cost "
        "0.07 ms a batch on a 2-core machine, 0.10 ms with 1 MB of dataset state) "
        "(docs/findings.md#snapshots-unread)",
    )  # fmt: skip


def rule_resume(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ Resumes ] in collect/torch/resume.py: a resume measured to repeat or skip
    samples, or, with none measured, snapshots that a resume would fast-forward through a
    sampler that draws a new order each time."""
    acc = report.get("accounting")
    got = acc.get("resume") if acc else None
    if not got:
        return None
    bad = [r for r in got["resumes"] if r["repeated"] or r["skipped"]]
    if got["resumes"] and not bad:
        return None  # measured, and right
    if not bad and not (got["restores"] == "fast-forward" and got["shuffles"]):
        return None
    sampler = got["sampler"]
    if bad:
        r = bad[0]
        said = (f"the pass resumed after {r['at']} batches read {r['after']} samples, "
                f"{r['repeated']} of them already read before the snapshot, and left "
                f"{r['skipped'] if r['skipped'] is not None else 'an unknown number of'} "
                "samples of the epoch unread")  # fmt: skip
        evidence = {**r, "sampler": sampler, "restores": got["restores"]}
    else:
        said = ("no resume was measured in this run, but one would draw the rest of the "
                "epoch from a new order")  # fmt: skip
        evidence = {"sampler": sampler, "restores": got["restores"]}
    return finding(
        "resume-repeats",
        "warning",
        None,
        f"the StatefulDataLoader's {sampler} keeps no state of its own: a resume from its "
        "state_dict() draws the sampler's order anew and skips as many indices as were read, "
        f"so it repeats samples and misses others; {said}",
        evidence,
        "pass shuffle=True instead of sampler=RandomSampler(...) (torchdata puts its own "
        "RandomSampler in place, whose state the snapshot keeps), or give your sampler "
        "state_dict()/load_state_dict(); followed, the same resume read each sample of the "
        "epoch once (docs/findings.md#resume-repeats)",
    )  # fmt: skip


TAIL_SHARE = 0.1  # a pass's last worker alone for this share of it, or more
TAIL_ROUNDS = 2  # and for this many batches a worker (a balanced pass: under one)


def rule_uneven_tail(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ An epoch's samples ], case 4: one worker made a pass's last batches alone."""
    acc = report.get("accounting")
    tail = acc.get("tail") if acc else None
    if not acc or not tail or acc["silent"]:  # a silent worker is idle-workers' to name
        return None
    n = acc["workers"]
    if tail["share"] < TAIL_SHARE or tail["batches"] < max(3, TAIL_ROUNDS * n):
        return None
    last = tail["last"]
    waited = max(tail["waited_s"].values())
    gain = waited * (n - 1) / n  # the tail's work shared by every worker instead of one
    epoch = f"epoch {tail['pass'] + 1}" if len(acc["epochs"]) > 1 else "the epoch"
    iterable = acc["sampler"] is None
    return finding(
        "uneven-shards",
        "warning",
        None,
        f"worker {last} delivered {epoch}'s last batch {waited:.3g} s after the first worker "
        f"to finish had delivered its own ({tail['share']:.0%} of the pass): it made the last "
        f"{tail['batches']} batches while the other workers had nothing left to do",
        {"worker": last, "waited_s": tail["waited_s"], "tail_batches": tail["batches"],
         "share": tail["share"], "pass": tail["pass"], "gain_s": round(gain, 6)},
        ("split the stream into shards of even size, or into many more shards than workers "
         "(a multiple of num_workers), so that the workers finish together"
         if iterable else
         "the workers' shares were uneven: check a custom batch_sampler, or samples whose cost "
         "varies by orders of magnitude")
        + f"; about {gain:.3g} s a pass to gain where the loop waits for its data (the tail "
        f"shared by the {n} workers) (docs/findings.md#uneven-shards)",
    )  # fmt: skip


ACCOUNTING_RULES = [
    rule_same_stream,
    rule_idle_workers,
    rule_order_repeats,
    rule_dropped,
    rule_epoch_length,
    rule_uneven_tail,
    rule_snapshots,
    rule_resume,
]
