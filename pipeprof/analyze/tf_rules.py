"""Findings in tf.data's own terms: num_parallel_calls, prefetch, cache, interleave, vectorising.

Pure rules over the report dictionary, registered in ``analyze.rules.RULES``; each returns
None unless the report is of a tf.data pipeline (``framework == "tf"`` with the pipeline that
collect/tf/dataset.py describes in ``meta.tf``). Nothing here imports TensorFlow.
"""

from __future__ import annotations

from typing import Any

from pipeprof.analyze.finding import Finding, Severity, finding

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
READY_MS = 0.05  # TensorFlow: a next() that returns within 50 µs found its data ready
LOOP_SHARE = 0.05  # TensorFlow: a step is moderately input-bound from 5 % waiting


def _tf(report: dict[str, Any]) -> dict[str, Any] | None:
    if report.get("framework") != "tf":
        return None
    tf = (report.get("meta") or {}).get("tf")
    return tf if isinstance(tf, dict) else None


def stage_of(op: dict[str, Any]) -> str | None:
    """The stage a pipeline op's function is timed under (files before ``stage`` was kept:
    ``transform/<label>``)."""
    if op.get("stage"):
        return str(op["stage"])
    return f"transform/{op['label']}" if op.get("label") else None


def _op_of(tf: dict[str, Any], stage: str) -> dict[str, Any] | None:
    """The pipeline op (from the graph) behind a map's stage."""
    return next((op for op in tf.get("pipeline", []) if stage_of(op) == stage), None)


def code_name(op: dict[str, Any]) -> str:
    """The user's function as code would name it: ``augment``, or ``<lambda at train.py:42>``."""
    fn = str(op.get("fn") or "?")
    if fn == "lambda" and op.get("line"):
        return f"<lambda at {op.get('file')}:{op['line']}>"
    return fn


def _before_batch(tf: dict[str, Any], op: dict[str, Any]) -> bool:
    """``op`` runs on elements, before the pipeline's first batching op."""
    ops = tf.get("pipeline", [])
    at = next((i for i, o in enumerate(ops) if "Batch" in o.get("op", "")), len(ops))
    return any(o is op for o in ops[:at]) and "Batch" not in op.get("op", "")


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
    slight = _slight(report, tf, bott, evidence)
    if slight:
        return finding("tf-bottleneck", "info", stage, slight, evidence, "none needed")
    msg = (
        f"{stage} limits the pipeline: {bott['share']:.0%} of the time the consumer was "
        f"blocked is spent there (TensorFlow's rule)"
    )
    fix = _fix_for(tf, stage, per_ms, cores, evidence)
    kind = (report.get("verdict") or {}).get("kind")
    severity: Severity = "warning" if kind in ("input-bound", "balanced", None) else "info"
    return finding("tf-bottleneck", severity, stage, msg, evidence, fix)


def _slight(
    report: dict[str, Any], tf: dict[str, Any], bott: dict[str, Any], evidence: dict[str, Any]
) -> str | None:
    """Why the blocking TensorFlow's rule found does not limit anything, or None if it may.

    The rule always names the iterator with the most blocking, however little there was. It
    matters only if a batch was not ready when asked for: more than ``READY_MS`` of blocking
    per batch (TensorFlow's "a next() within 50 µs means data was ready"), and in a training
    loop at least ``LOOP_SHARE`` of its time (TensorFlow's moderately input-bound step)."""
    calls = max(1, int(tf.get("root_calls") or 1))
    per_batch_ms = bott["blocking_s"] * 1e3 / calls
    wall = (report.get("loop") or {}).get("wall_s")
    share = bott["blocking_s"] / wall if wall else None
    evidence.update(
        {"blocking_ms_per_batch": round(per_batch_ms, 6), "loop_share": share and round(share, 6)}
    )
    if per_batch_ms > READY_MS and (share is None or share >= LOOP_SHARE):
        return None
    why = (
        "data was ready when asked for"
        if per_batch_ms <= READY_MS
        else f"below the {LOOP_SHARE:.0%} of a step at which TensorFlow calls it input-bound"
    )
    where = f" of a {wall:.3g} s loop ({share:.2%})" if share is not None else ""
    return (
        f"no tf.data stage limits this run: the consumer was blocked "
        f"{bott['blocking_s'] * 1e3:.3g} ms in all{where}, {per_batch_ms * 1e3:.3g} µs per "
        f"batch: {why} (most of it in {bott['stage']})"
    )


def _fix_for(
    tf: dict[str, Any], stage: str, per_ms: float | None, cores: int, evidence: dict[str, Any]
) -> str:
    rate = f"{1000 / per_ms:.0f}" if per_ms else "?"
    op = _op_of(tf, stage)
    if op is not None and op.get("utility"):
        par, _ = _parallelism(tf, stage)
        evidence.update({"num_parallel_calls": par, "utility": op["utility"]})
        return utility_fix(op, stage, par)
    if stage.startswith("transform/"):
        op = op or {}
        fn = code_name(op) if op else stage.split("/", 1)[1]
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
        vectorise = (
            "batch before mapping so it runs once per batch (vectorised), "
            if _before_batch(tf, op)
            else ""
        )
        return (
            f"{fn} already runs {par} calls in parallel on {cores} cores: make it cheaper, "
            f"{vectorise}or cache() its output if it is deterministic."
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


def utility_fix(op: dict[str, Any], stage: str, par: int | None) -> str:
    """How to change a map that runs inside a Keras utility: from the outside, through the
    utility's own arguments or on what it returns."""
    name = op["utility"]
    calls = f"{par} parallel calls" if par else "parallel calls"
    image = "image_dataset" in name
    return (
        f"{stage} is {name}'s own map ({calls}, AUTOTUNE): you cannot edit it, but you can "
        f"cache what it makes — ds = {name}(...).cache() before your own maps keeps the "
        "decoded samples in memory from the second epoch on (cache(filename) if they do not "
        "fit)"
        + (
            "; store the images at the image_size= you train on, which makes decoding cheaper "
            "and the resize a no-op"
            if image
            else ""
        )
        + f"; to batch or map in your own order, call {name}(..., batch_size=None) and "
        "batch yourself"
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
    utility = next((op["utility"] for op in tf["pipeline"] if op.get("utility")), None)
    where = (
        f"call .cache() on what {utility}(...) returns, before your own maps: it"
        if utility
        else ".cache() after the deterministic part (reading, parsing, decoding) and before "
        "random augmentation"
    )
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
        f"{where} saves about {per_ms:.3g} ms per sample from the second epoch on, if the "
        "data fits in memory (cache(filename) otherwise)",
    )


def rule_tf_interleave(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """File reads limit the pipeline and are not interleaved in parallel."""
    tf = _tf(report)
    bott = (tf or {}).get("bottleneck") or {}
    stage = bott.get("stage") or ""
    if tf is None or not (stage in READS or stage.startswith("load/")):
        return None
    if (_op_of(tf, stage) or {}).get("utility"):  # a Keras utility's map reads files in parallel
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
        stage = stage_of(op) or ""
        row = (report.get("stages") or {}).get(stage)
        if op.get("py_function") or op.get("utility") or not row or "Map" not in op["op"]:
            continue  # a Keras utility's map cannot be moved after its batch
        share = work.get(stage, 0.0) / total if total else 0.0
        cheap = (row.get("mean_ms") or 1e9) < VECTORISE_MS and share >= VECTORISE_SHARE
        if cheap and (best is None or share > best[0]):
            best = (share, op, row)
    if best is None:
        return None
    share, op, row = best
    fn = code_name(op)
    size = ops[batch_at].get("batch_size")
    return finding(
        "tf-vectorise",
        "info",
        stage_of(op),
        f"{fn} runs once per element at {row['mean_ms'] * 1e3:.0f} µs, mostly the fixed "
        f"cost of a function call, and takes {share:.0%} of the pipeline's work",
        {"per_element_ms": row["mean_ms"], "share": round(share, 4), "batch_size": size},
        f"batch first, then map: .batch({size or 'B'}).map({fn}) calls it once per batch "
        f"({size or 'B'}× fewer calls) if it works on a batch (most TensorFlow ops do)",
    )


TF_RULES = [
    rule_tf_bottleneck,
    rule_tf_prefetch,
    rule_tf_cache,
    rule_tf_interleave,
    rule_tf_vectorise,
]
