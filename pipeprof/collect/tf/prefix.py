"""A prefix-by-prefix benchmark of a tf.data pipeline: each stage's marginal cost, stand-alone.

NOTE [ Prefix benchmark ]
``dataset`` is a chain of ops (each tf.data transformation keeps its input as
``_input_dataset``). Iterating each prefix alone (source, source+map, ..., the whole pipeline)
after a warm-up gives its throughput; the difference in time per sample between a prefix and
the previous one is the marginal cost of the op that was added. This is stand-alone, not in situ:
each prefix runs on its own with TensorFlow's rewrites applied to that prefix, an op behind a
parallel map or a prefetch overlaps with its input (its marginal cost can be ~0 or negative),
and a ``cache`` fills during the warm-up. It complements the profiler trace (trace.py) and
stands in for it where the profiler cannot run; no trace, so no overhead from tracing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pipeprof.collect.tf import graph as tf_graph
from pipeprof.core.batch import batch_size
from pipeprof.core.recorder import clock


def prefixes(dataset: Any) -> list[Any]:
    """The dataset's prefixes, source first (ops with several inputs end the walk)."""
    chain = [dataset]
    while getattr(chain[-1], "_input_dataset", None) is not None:
        chain.append(chain[-1]._input_dataset)
    return list(reversed(chain))


def kind_of_op(op: str) -> str:
    """A graph op's iterator kind: ``ParallelMapDatasetV2`` -> ``ParallelMapV2``."""
    kind = op.replace("Experimental", "").replace("Dataset", "")
    if re.fullmatch(r"Cache(V\d+)?", kind):
        return "Cache"
    if re.fullmatch(r"Shuffle(AndRepeat)?(V\d+)?", kind):
        return "Shuffle"
    known = tf_graph.SOURCES | tf_graph.MAPS | tf_graph.BATCHES | tf_graph.INTERLEAVES
    bare = re.sub(r"V\d+$", "", kind)
    return kind if kind in known or bare not in known else bare


def walk(dataset: Any) -> Iterator[tuple[Any, dict[str, Any], str | None, bool]]:
    """Each prefix of ``dataset``, source first, with the op it adds, that op's stage and
    whether the prefix yields batches."""
    for prefix in prefixes(dataset):
        ops = tf_graph.describe(prefix)["ops"]
        op = ops[-1] if ops else {"op": type(prefix).__name__}
        by_name = {o["dataset"]: o for o in ops if o.get("dataset")}
        stage = tf_graph.stage_for(kind_of_op(op["op"]), op.get("dataset", ""), by_name)
        yield prefix, op, stage, any(o["op"] in tf_graph.BATCH_OPS for o in ops)


def time_elements(
    prefix: Any, elements: int, warmup: int, batched: bool
) -> tuple[list[int], int, Any]:
    """One pass over ``prefix``: ns of each of ``elements`` ``next()`` calls after ``warmup``,
    the samples they held, and the last element."""
    it = iter(prefix)
    for _ in range(warmup):
        if next(it, None) is None:
            break
    times: list[int] = []
    seen = 0
    last = None
    while len(times) < elements:
        t0 = clock()
        try:
            last = next(it)
        except StopIteration:
            break
        times.append(clock() - t0)
        seen += batch_size(last) if batched else 1
    return times, seen, last


def benchmark_prefixes(dataset: Any, elements: int = 100, warmup: int = 5) -> list[dict[str, Any]]:
    """Time ``elements`` elements of every prefix; per row the op added, its stage and its
    marginal milliseconds per sample (see NOTE [ Prefix benchmark ] for what they mean)."""
    rows: list[dict[str, Any]] = []
    previous = 0.0
    for prefix, op, stage, batched in walk(dataset):
        times, samples, _ = time_elements(prefix, elements, warmup, batched)
        ns = sum(times)
        per_sample = ns / 1e6 / samples if samples else float("nan")
        rows.append(
            {
                "op": op["op"],
                "dataset": op.get("dataset"),
                "stage": stage,
                "elements": len(times),
                "samples": samples,
                "ms_per_sample": round(per_sample, 6),
                "samples_per_s": round(samples / (ns / 1e9), 3) if ns else None,
                "marginal_ms_per_sample": round(per_sample - previous, 6),
            }
        )
        previous = per_sample
    return rows


def fill_session(session: Any, dataset: Any, elements: int = 100) -> None:
    """Stage estimates from the prefix benchmark where no trace could be taken: each stage's
    marginal time per sample, over the samples the profile saw (``meta.tf.method`` says so)."""
    from pipeprof.core.stats import Stat

    rows = benchmark_prefixes(dataset, elements)
    samples = max(1, session.samples)
    stages = session.stages.setdefault("tf.data", {})
    for row in rows:
        ms = row["marginal_ms_per_sample"]
        if row["stage"] and ms == ms and ms > 0:  # ms == ms: not NaN
            stages.setdefault(row["stage"], Stat()).add(int(ms * 1e6 * samples), samples)
    tf_meta = session.meta.setdefault("tf", {})
    tf_meta["method"] = "prefix benchmark"
    tf_meta["prefix_benchmark"] = rows
