"""A prefix-by-prefix benchmark of a tf.data pipeline: each stage's marginal cost, stand-alone.

NOTE [ Prefix benchmark ]
``dataset`` is a chain of ops (each tf.data transformation keeps its input as
``_input_dataset``). Iterating each prefix alone (source, source+map, ..., the whole pipeline)
after a warm-up gives its throughput; the difference in time per sample between a prefix and
the previous one is the marginal cost of the op that was added. This is stand-alone, not in situ:
each prefix runs on its own with TensorFlow's rewrites applied to that prefix, an op behind a
parallel map or a prefetch overlaps with its input (its marginal cost can be ~0 or negative),
and a ``cache`` fills during the warm-up. It complements the profiler trace (tfdata.py) and
stands in for it where the profiler cannot run; no trace, so no overhead from tracing.
"""

from __future__ import annotations

import re
from typing import Any

from pipeprof.collectors import tf_graph
from pipeprof.recorder import clock


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


def benchmark_prefixes(dataset: Any, elements: int = 100, warmup: int = 5) -> list[dict[str, Any]]:
    """Time ``elements`` elements of every prefix; per row the op added, its stage and its
    marginal milliseconds per sample (see NOTE [ Prefix benchmark ] for what they mean)."""
    rows: list[dict[str, Any]] = []
    previous = 0.0
    for prefix in prefixes(dataset):
        ops = tf_graph.describe(prefix)["ops"]
        op = ops[-1] if ops else {"op": type(prefix).__name__}
        by_name = {o["dataset"]: o for o in ops if o.get("dataset")}
        stage = tf_graph.stage_for(kind_of_op(op["op"]), op.get("dataset", ""), by_name)
        ns, samples, n = _time(prefix, elements, warmup)
        per_sample = ns / 1e6 / samples if samples else float("nan")
        rows.append(
            {
                "op": op["op"],
                "dataset": op.get("dataset"),
                "stage": stage,
                "elements": n,
                "samples": samples,
                "ms_per_sample": round(per_sample, 6),
                "samples_per_s": round(samples / (ns / 1e9), 3) if ns else None,
                "marginal_ms_per_sample": round(per_sample - previous, 6),
            }
        )
        previous = per_sample
    return rows


def _time(dataset: Any, elements: int, warmup: int) -> tuple[int, int, int]:
    from pipeprof.collectors.tfdata import leading_dim

    batched = any(o["op"] in tf_graph.BATCH_OPS for o in tf_graph.describe(dataset)["ops"])
    it = iter(dataset)
    for _ in range(warmup):
        if next(it, None) is None:
            break
    samples = n = 0
    t0 = clock()
    for element in it:
        samples += leading_dim(element) if batched else 1
        n += 1
        if n >= elements:
            break
    return clock() - t0, samples, n


def fill_session(session: Any, dataset: Any, elements: int = 100) -> None:
    """Stage estimates from the prefix benchmark where no trace could be taken: each stage's
    marginal time per sample, over the samples the profile saw (``meta.tf.method`` says so)."""
    from pipeprof.stats import Stat

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
