"""Findings in tf.data's own terms: num_parallel_calls, prefetch, cache, interleave, vectorising.

Pure rules over the report dictionary, registered in ``analyze.rules.RULES``; each returns
None unless the report is of a tf.data pipeline (``framework == "tf"`` with the pipeline that
collect/tf/dataset.py describes in ``meta.tf``). Nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import Any

from pipeprof.analyze.finding import Finding, finding

AUTOTUNE = -1
READS = frozenset(
    {
        "load/TFRecord",
        "load/TextLine",
        "load/FixedLengthRecord",
        "load/CSV",
        "load/flat_map",
        "load/interleave",
    }
)
CACHE_SHARE = 0.30  # load stages above this share of pipeline work: caching pays
VECTORISE_MS = 0.2  # a map cheaper than this per element is mostly per-call overhead
VECTORISE_SHARE = 0.20


def _tf(report: dict[str, Any]) -> dict[str, Any] | None:
    if report.get("framework") != "tf":
        return None
    tf = (report.get("meta") or {}).get("tf")
    return tf if isinstance(tf, dict) else None


def _op_of(tf: dict[str, Any], stage: str) -> dict[str, Any] | None:
    """The pipeline op (from the graph) behind a ``transform/<label>`` stage."""
    label = stage.split("/", 1)[1] if stage.startswith("transform/") else None
    return next((op for op in tf.get("pipeline", []) if op.get("label") == label), None)


def _iterator_of(tf: dict[str, Any], stage: str) -> dict[str, Any] | None:
    rows = [r for r in tf.get("iterators", []) if r.get("stage") == stage]
    return max(rows, key=lambda r: r.get("work_s") or 0) if rows else None


def _work(report: dict[str, Any]) -> dict[str, float]:
    """Seconds of work per leaf stage (tf.data track only)."""
    stages = report.get("stages") or {}
    parents = {p.rsplit("/", 1)[0] for p in stages if "/" in p}
    return {
        p: r["total_s"]
        for p, r in stages.items()
        if p not in parents and "tf.data" in (r.get("tracks") or [])
    }


def _parallelism(tf: dict[str, Any], stage: str) -> tuple[int | None, bool]:
    """Parallel calls a map ran with (autotuned value when traced) and whether it is AUTOTUNE."""
    op = _op_of(tf, stage) or {}
    it = _iterator_of(tf, stage) or {}
    params = it.get("params") or {}
    autotune = op.get("num_parallel_calls") == AUTOTUNE or params.get("autotune") == "true"
    value = params.get("parallelism")
    if isinstance(value, int) and value > 0:
        return value, autotune
    n = op.get("num_parallel_calls")
    return (n if isinstance(n, int) and n > 0 else None), autotune


def rule_tf_bottleneck(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """The stage TensorFlow's rule names, with the fix in tf.data's terms."""
    tf = _tf(report)
    bott = (tf or {}).get("bottleneck")
    if tf is None or not bott:
        return None
    stage, cores = bott["stage"], int(facts.get("cores") or 1)
    row = (report.get("stages") or {}).get(stage) or {}
    per_ms = row.get("mean_ms")
    evidence = {
        "blocking_s": bott["blocking_s"],
        "blocking_share": bott["share"],
        "per_element_ms": per_ms,
        "cores": cores,
    }
    msg = (
        f"{stage} limits the pipeline: {bott['share']:.0%} of the time the consumer was "
        f"blocked is spent there (TensorFlow's rule)"
    )
    fix = _fix_for(tf, stage, per_ms, cores, evidence)
    kind = (report.get("verdict") or {}).get("kind")
    severity = "warning" if kind in ("input-bound", "balanced", None) else "info"
    return finding("tf-bottleneck", severity, stage, msg, evidence, fix)


def _fix_for(
    tf: dict[str, Any], stage: str, per_ms: float | None, cores: int, evidence: dict[str, Any]
) -> str:
    rate = f"{1000 / per_ms:.0f}" if per_ms else "?"
    if stage.startswith("transform/"):
        op = _op_of(tf, stage) or {}
        fn = stage.split("/", 1)[1]
        par, autotune = _parallelism(tf, stage)
        evidence.update(
            {
                "num_parallel_calls": par,
                "autotune": autotune,
                "py_function": bool(op.get("py_function")),
            }
        )
        gil = (
            (
                " It calls a py_function, which holds Python's GIL while Python code runs: "
                "parallel calls help only while it sleeps or waits for I/O; rewrite it with "
                "TensorFlow ops to use every core."
            )
            if op.get("py_function")
            else ""
        )
        if not par or par <= 1:
            return (
                f"map({fn}, num_parallel_calls=tf.data.AUTOTUNE): one call at a time gives "
                f"{rate} elements/s at {per_ms or 0:.3g} ms each; {cores} parallel calls "
                f"could give up to {cores * 1000 / per_ms:.0f}/s."
                if per_ms
                else f"map({fn}, num_parallel_calls=tf.data.AUTOTUNE)"
            ) + gil
        if par < cores and not autotune:
            return (
                f"num_parallel_calls={par} leaves cores idle: use tf.data.AUTOTUNE "
                f"(up to {cores} calls, about {cores / par:.1f}× the rate)."
            ) + gil
        return (
            f"{fn} already runs {par} calls in parallel on {cores} cores: make it cheaper, "
            "batch before mapping so it runs once per batch (vectorised), or cache() its "
            "output if it is deterministic."
        ) + gil
    if stage in READS or stage.startswith("load/"):
        return (
            "reading is the bottleneck: read several files at once with "
            "files.interleave(tf.data.TFRecordDataset, cycle_length=N, num_parallel_calls="
            "tf.data.AUTOTUNE) (shard the data into many files), and cache() the data if it "
            f"fits in memory; one reader delivers {rate} elements/s here."
        )
    if stage == "collate":
        return (
            "batching is the bottleneck: batch(..., num_parallel_calls=tf.data.AUTOTUNE) "
            "copies elements in parallel; fixed-size elements batch faster than padded ones"
        )
    if stage == "shuffle":
        return "a smaller shuffle buffer, or shuffle file names and interleave files instead"
    if stage == "cache":
        return "reading the cache file is the bottleneck: cache() in memory if the data fits"
    return (
        f"{stage} blocks the consumer while no stage upstream was seen working: the pipeline's "
        "threads were short of CPU; give tf.data more cores or make its stages cheaper"
    )


def rule_tf_prefetch(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """No prefetch at the end of the pipeline: input does not overlap compute."""
    tf = _tf(report)
    if tf is None or not tf.get("pipeline"):
        return None
    last = tf["pipeline"][-1]
    if last.get("op") == "PrefetchDataset":
        return None
    runtime = [
        r for r in tf.get("iterators", []) if r.get("iterator") == "Iterator::Root::Prefetch"
    ]
    if runtime:  # TensorFlow injected one (the inject_prefetch optimisation)
        return None
    wait = (report.get("latency") or {}).get("mean_ms")
    return finding(
        "tf-prefetch",
        "warning",
        None,
        f"the pipeline ends with {last.get('op')}, not prefetch: the training step waits "
        f"while each batch is made{f' ({wait:.3g} ms per batch)' if wait else ''}",
        {"last_op": last.get("op"), "wait_mean_ms": wait},
        "end the pipeline with .prefetch(tf.data.AUTOTUNE) so the next batch is made while "
        "the model computes",
    )


def rule_tf_cache(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Reading dominates a finite pipeline without cache(): every epoch reads everything again."""
    tf = _tf(report)
    if tf is None or not tf.get("pipeline"):
        return None
    if any("Cache" in op.get("op", "") for op in tf["pipeline"]):
        return None
    work = _work(report)
    total = sum(work.values())
    load = sum(v for p, v in work.items() if p.startswith("load"))
    card = (report.get("meta") or {}).get("cardinality")
    if not total or load / total < CACHE_SHARE or card in ("infinite", None):
        return None
    per_ms = load * 1e3 / max(report.get("samples") or 1, 1)
    return finding(
        "tf-cache",
        "info",
        "load",
        f"reading takes {load / total:.0%} of the pipeline's work and is repeated every epoch",
        {
            "load_share": round(load / total, 4),
            "load_per_sample_ms": round(per_ms, 6),
            "cardinality": card,
        },
        f".cache() after the deterministic part (reading, parsing, decoding) and before random "
        f"augmentation saves about {per_ms:.3g} ms per sample from the second epoch on, if the "
        "data fits in memory (cache(filename) otherwise)",
    )


def rule_tf_interleave(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """File reads limit the pipeline and are not interleaved in parallel."""
    tf = _tf(report)
    bott = (tf or {}).get("bottleneck") or {}
    stage = bott.get("stage") or ""
    if tf is None or not (stage in READS or stage.startswith("load/")):
        return None
    inter = [op for op in tf.get("pipeline", []) if "Interleave" in op.get("op", "")]
    cores = int(facts.get("cores") or 1)
    if inter:
        op = inter[-1]
        cycle, calls = op.get("cycle_length"), op.get("num_parallel_calls")
        # TensorFlow saves the cycle length it picked for AUTOTUNE (1 on 2 cores), not AUTOTUNE:
        # with parallel calls on AUTOTUNE the user's choice cannot be told from TF's own
        if calls == AUTOTUNE or (cycle is not None and cycle >= cores and calls and calls > 1):
            return None
        fix = (
            f"interleave(..., cycle_length={max(cores, cycle or 0)}, num_parallel_calls="
            f"tf.data.AUTOTUNE): now cycle_length={cycle}, num_parallel_calls={calls}"
        )
        evidence = {"cycle_length": cycle, "num_parallel_calls": calls, "cores": cores}
    else:
        fix = (
            "tf.data.Dataset.list_files(pattern).interleave(tf.data.TFRecordDataset, "
            f"cycle_length={cores}, num_parallel_calls=tf.data.AUTOTUNE) reads {cores} "
            "files at once instead of one after another"
        )
        evidence = {"interleave": False, "cores": cores}
    return finding(
        "tf-interleave",
        "warning",
        stage,
        f"{stage} limits the pipeline and files are read one at a time",
        evidence,
        fix,
    )


def rule_tf_vectorise(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """A cheap map before batch: per-element call overhead that batching first would amortise."""
    tf = _tf(report)
    if tf is None:
        return None
    ops = tf.get("pipeline", [])
    batch_at = next((i for i, op in enumerate(ops) if "Batch" in op.get("op", "")), None)
    if batch_at is None:
        return None
    work = _work(report)
    total = sum(work.values()) or 0.0
    best: tuple[float, dict[str, Any], dict[str, Any]] | None = None
    for op in ops[:batch_at]:
        stage = f"transform/{op.get('label')}"
        row = (report.get("stages") or {}).get(stage)
        if not op.get("label") or op.get("py_function") or not row or "Map" not in op["op"]:
            continue
        share = work.get(stage, 0.0) / total if total else 0.0
        cheap = (row.get("mean_ms") or 1e9) < VECTORISE_MS and share >= VECTORISE_SHARE
        if cheap and (best is None or share > best[0]):
            best = (share, op, row)
    if best is None:
        return None
    share, op, row = best
    size = ops[batch_at].get("batch_size")
    return finding(
        "tf-vectorise",
        "info",
        f"transform/{op['label']}",
        f"{op['fn']} runs once per element at {row['mean_ms'] * 1e3:.0f} µs, mostly the fixed "
        f"cost of a function call, and takes {share:.0%} of the pipeline's work",
        {"per_element_ms": row["mean_ms"], "share": round(share, 4), "batch_size": size},
        f"batch first, then map: .batch({size or 'B'}).map({op['fn']}) calls it once per batch "
        f"({size or 'B'}× fewer calls) if {op['fn']} works on a batch (most TensorFlow ops do)",
    )


TF_RULES = [
    rule_tf_bottleneck,
    rule_tf_prefetch,
    rule_tf_cache,
    rule_tf_interleave,
    rule_tf_vectorise,
]
