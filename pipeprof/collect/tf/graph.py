"""A tf.data pipeline described from its dataset graph, and its ops named as pipeprof stages.

``dataset._as_serialized_graph()`` gives the GraphDef of the pipeline as the user built it. Each
dataset node carries a ``metadata`` attr whose name (``MapDataset:3``) is the ``name`` stat of
its iterator events in a profiler trace, even after TensorFlow's graph rewrites (a ``map`` made
parallel keeps its name; fused ops are named ``fused(ParallelMapDatasetV2:1,BatchDatasetV2:2)``).
Function attrs name the user's function (``__inference_Dataset_map_parse_record_56``), and the
parameters (``num_parallel_calls``, ``cycle_length``, batch and buffer sizes) are Const inputs.

NOTE [ Stage names in the user's words ]
The graph knows a function only by the name it was traced under: every ``lambda`` is
``lambda``, and a Keras utility's own map looks like the user's. The Python objects behind the
dataset still hold the callables (``python_functions``), matched to graph functions by name, so:
a named function keeps its name (``transform/augment``); a lambda is named by where it was
written (``transform/lambda@train.py:42``); a function defined in Keras' own source
(``image_dataset_from_directory`` reading and decoding each file) is part of getting a sample,
not the user's transform: ``load/decode`` when its body decodes (``Decode*`` ops), else
``load/read``, with the utility recorded (``utility``) so a fix can say how to change it there.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from typing import Any

#: tf.data iterator kinds (the last part of an iterator event's name) by pipeprof stage.
SOURCES = frozenset(
    {
        "Range",
        "TensorSlice",
        "FromTensor",
        "Tensor",
        "TFRecord",
        "TextLine",
        "FixedLengthRecord",
        "Generator",
        "SparseTensorSlice",
        "CSV",
        "Sql",
        "Load",
        "Random",
        "SSTable",
        "LMDB",
        "ListFiles",
        "MatchingFiles",
        "Snapshot",
        "Counter",
    }
)
#: Dataset ops (graph node names) that batch elements: an element of their output is a batch.
BATCH_OPS = frozenset(
    {
        "BatchDataset",
        "BatchDatasetV2",
        "PaddedBatchDataset",
        "PaddedBatchDatasetV2",
        "ParallelBatchDataset",
        "MapAndBatchDataset",
        "ExperimentalMapAndBatchDataset",
    }
)
INTERLEAVES = frozenset(
    {
        "Interleave",
        "ParallelInterleave",
        "ParallelInterleaveV2",
        "ParallelInterleaveV3",
        "ParallelInterleaveV4",
        "LegacyParallelInterleave",
    }
)
MAPS = frozenset(
    {
        "Map",
        "ParallelMap",
        "ParallelMapV2",
        "MapAndBatch",
        "Filter",
        "Scan",
        "ParseExample",
        "LegacyParallelMap",
    }
)
BATCHES = frozenset(
    {
        "Batch",
        "BatchV2",
        "PaddedBatch",
        "PaddedBatchV2",
        "ParallelBatch",
        "Rebatch",
        "RebatchV2",
        "DenseToSparseBatch",
        "Window",
    }
)
TRANSFERS = frozenset({"PrefetchToDevice", "CopyToDevice", "MultiDeviceIterator"})
CACHES = frozenset({"MemoryCache", "MemoryCacheImpl", "FileCache", "FileCacheImpl", "Cache"})
SKIP = frozenset(
    {
        "Root",
        "Model",
        "Options",
        "MaxIntraOpParallelism",
        "PrivateThreadPool",
        "ThreadPool",
        "AssertCardinality",
        "AssertNext",
    }
)

# Const inputs that hold parameters, counted from the end of the node's inputs.
_TAIL_PARAMS = {
    "ParallelMapDataset": ("num_parallel_calls",),
    "ParallelMapDatasetV2": ("num_parallel_calls",),
    "InterleaveDataset": ("cycle_length", "block_length"),
    "ParallelInterleaveDatasetV2": ("cycle_length", "block_length", "num_parallel_calls"),
    "ParallelInterleaveDatasetV3": ("cycle_length", "block_length", "num_parallel_calls"),
    "ParallelInterleaveDatasetV4": (
        "cycle_length",
        "block_length",
        "buffer_output_elements",
        "prefetch_input_elements",
        "num_parallel_calls",
    ),
    "MapAndBatchDataset": ("batch_size", "num_parallel_calls", "drop_remainder"),
}
# ... and counted from the start (after the input dataset).
_HEAD_PARAMS = {
    "BatchDatasetV2": ("batch_size",),
    "BatchDataset": ("batch_size",),
    "PaddedBatchDatasetV2": ("batch_size",),
    "PaddedBatchDataset": ("batch_size",),
    "ParallelBatchDataset": ("batch_size", "num_parallel_calls"),
    "PrefetchDataset": ("buffer_size",),
    "ShuffleDatasetV3": ("buffer_size",),
    "ShuffleDatasetV2": ("buffer_size",),
    "ShuffleDataset": ("buffer_size",),
    "ShuffleAndRepeatDatasetV2": ("buffer_size",),
}
#: Graph ops that run a map-like function once per element (the stage is the function's).
_MAP_OPS = frozenset(
    {
        "MapDataset",
        "ParallelMapDataset",
        "ParallelMapDatasetV2",
        "MapAndBatchDataset",
        "ExperimentalMapAndBatchDataset",
        "FilterDataset",
        "ScanDataset",
        "ExperimentalScanDataset",
    }
)
#: Keras' input utilities by the module that defines them (keras/src/utils/<stem>_utils.py).
KERAS_UTILITIES = {
    "image_dataset": "image_dataset_from_directory",
    "text_dataset": "text_dataset_from_directory",
    "audio_dataset": "audio_dataset_from_directory",
    "timeseries_dataset": "timeseries_dataset_from_array",
    "dataset": "split_dataset",
}
_PY_OPS = frozenset({"PyFunc", "EagerPyFunc", "PyFuncStateless"})
_TRANSFORMATIONS = (
    "map",
    "filter",
    "flat_map",
    "interleave",
    "parallel_interleave",
    "scan",
    "map_and_batch",
    "group_by_window",
    "reduce",
)


def user_function_name(fn: str) -> str:
    """``__inference_Dataset_map_parse_record_56`` -> ``parse_record``."""
    name = fn
    if name.startswith("__inference_"):
        name = name[len("__inference_") :]
    name = re.sub(r"_\d+$", "", name)
    if name.startswith("Dataset_"):
        name = name[len("Dataset_") :]
        for t in sorted(_TRANSFORMATIONS, key=len, reverse=True):
            if name.startswith(t + "_"):
                name = name[len(t) + 1 :]
                break
    return name or fn


def _metadata_name(node: Any) -> str:
    raw = node.attr["metadata"].s if "metadata" in node.attr else b""
    if not raw:
        return ""
    from tensorflow.core.framework import dataset_metadata_pb2

    meta = dataset_metadata_pb2.Metadata()
    try:
        meta.ParseFromString(raw)
    except Exception:  # pragma: no cover - a malformed attr: no name
        return ""
    name = meta.name
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


def _const(nodes: dict[str, Any], ref: str) -> int | None:
    node = nodes.get(ref.split(":")[0].lstrip("^"))
    if node is None or node.op != "Const":
        return None
    import tensorflow as tf

    try:
        value = tf.make_ndarray(node.attr["value"].tensor)
        return int(value) if value.size == 1 else None
    except (TypeError, ValueError):
        return None


def _params(node: Any, nodes: dict[str, Any]) -> dict[str, int]:
    inputs = [i for i in node.input if not i.startswith("^")]
    out: dict[str, int] = {}
    tail = _TAIL_PARAMS.get(node.op, ())
    for name, ref in zip(tail, inputs[len(inputs) - len(tail) :]):
        out[name] = _const(nodes, ref)  # type: ignore[assignment]
    head = _HEAD_PARAMS.get(node.op, ())
    for name, ref in zip(head, inputs[1:]):
        out[name] = _const(nodes, ref)  # type: ignore[assignment]
    return {k: v for k, v in out.items() if v is not None}


def describe(dataset: Any) -> dict[str, Any]:
    """The pipeline's ops, source first: dataset name, op, user function, parameters."""
    import tensorflow as tf

    try:
        graph = tf.compat.v1.GraphDef()
        graph.ParseFromString(dataset._as_serialized_graph().numpy())
    except Exception as exc:  # external state that cannot be serialised, and the like
        return {"ops": [], "error": f"{type(exc).__name__}: {exc}"[:300]}
    nodes = {n.name: n for n in graph.node}
    library = {f.signature.name: f for f in graph.library.function}
    python = python_functions(dataset)
    ops: list[dict[str, Any]] = []
    labels: dict[str, int] = {}
    for node in _chain(graph, nodes):
        op: dict[str, Any] = {"dataset": _metadata_name(node), "op": node.op}
        fns = [v.func.name for k, v in sorted(node.attr.items()) if v.HasField("func")]
        if fns:
            op["fn"] = user_function_name(fns[0])
            body_ops = _body_ops(fns[0], library)
            op["py_function"] = bool(body_ops & _PY_OPS)
            op.update(_origin(python.get(fns[0])))
            base = op["fn"]
            if "utility" in op:  # NOTE [ Stage names in the user's words ]
                base = "decode" if any(o.startswith("Decode") for o in body_ops) else "read"
            elif op["fn"] == "lambda" and "line" in op:
                base = f"lambda@{op['file']}:{op['line']}"
            n = labels[base] = labels.get(base, 0) + 1
            op["label"] = base if n == 1 else f"{base}#{n}"
            if node.op in _MAP_OPS:
                op["stage"] = ("load/" if "utility" in op else "transform/") + op["label"]
        op.update(_params(node, nodes))
        ops.append(op)
    return {"ops": ops}


def _body_ops(name: str, library: dict[str, Any], depth: int = 0) -> set[str]:
    """Op types in a library function, with those of the functions it calls (If/Case branches)."""
    body = library.get(name)
    if body is None or depth > 8:
        return set()
    out = {n.op for n in body.node_def}
    for n in body.node_def:
        for v in n.attr.values():
            if v.HasField("func"):
                out |= _body_ops(v.func.name, library, depth + 1)
            for f in v.list.func:
                out |= _body_ops(f.name, library, depth + 1)
    return out


def python_functions(dataset: Any, limit: int = 256) -> dict[str, Any]:
    """The Python callables behind the pipeline's functions, by their graph function name.

    Each transformation keeps its function in a ``StructuredFunctionWrapper`` (``_map_func``,
    ``_predicate``, ...) whose ``_function`` is the traced graph function and ``_func`` what the
    user passed; inputs are walked through ``_inputs()``. Private attributes: anything missing
    gives an empty answer, and stages keep their graph names.
    """
    out: dict[str, Any] = {}
    todo, seen = [dataset], 0
    while todo and seen < limit:
        ds = todo.pop()
        seen += 1
        try:
            attrs = list(vars(ds).values())
            todo.extend(ds._inputs())
        except Exception:
            continue
        for wrapper in attrs:
            fn, traced = getattr(wrapper, "_func", None), getattr(wrapper, "_function", None)
            name = getattr(traced, "name", None)
            if fn is not None and name is not None:
                out[name.decode() if isinstance(name, bytes) else str(name)] = fn
    return out


def _origin(fn: Any) -> dict[str, Any]:
    """Where a map's Python function was defined: ``file`` (base name) and ``line``, and the
    Keras utility it belongs to (``utility``) when Keras' own source defines it."""
    fn = inspect.unwrap(getattr(fn, "func", fn)) if fn is not None else None  # partial, wraps
    code = getattr(fn, "__code__", None)
    if code is None and callable(fn):  # a callable object: its class's __call__
        code = getattr(type(fn).__call__, "__code__", None)
    if code is None:
        return {}
    path = os.path.abspath(code.co_filename)
    out: dict[str, Any] = {"file": os.path.basename(path), "line": code.co_firstlineno}
    for package in ("keras", "tf_keras"):  # defined in Keras: Keras is imported already
        module = sys.modules.get(package)
        root = os.path.dirname(getattr(module, "__file__", None) or "")
        if root and path.startswith(root + os.sep):
            stem = os.path.splitext(out["file"])[0].removesuffix("_utils")
            out["utility"] = f"keras.utils.{KERAS_UTILITIES.get(stem, stem)}"
    return out


def _chain(graph: Any, nodes: dict[str, Any]) -> list[Any]:
    """Dataset nodes from the source to the output, following every dataset input."""
    out_node = next((n for n in graph.node if n.op == "_Retval"), None)
    order: list[Any] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        node = nodes.get(name.split(":")[0].lstrip("^"))
        if node is None or node.name in seen:
            return
        seen.add(node.name)
        for inp in node.input:
            visit(inp)
        if "Dataset" in node.op:
            order.append(node)

    if out_node is not None:
        visit(out_node.input[0])
    return order


def stage_for(kind: str, dataset: str, ops: dict[str, dict[str, Any]]) -> str | None:
    """The pipeprof stage path of an iterator (``kind``, dataset name), None for pass-throughs."""
    if kind in SKIP:
        return None
    if kind in MAPS:
        for name in fused_names(dataset):
            op = ops.get(name)
            if op is not None and (op.get("stage") or op.get("label")):
                return str(op.get("stage") or f"transform/{op['label']}")
        # no graph to name the function by (Keras without dataset=): the dataset's own name
        return f"transform/{dataset or kind}"
    if kind in SOURCES:
        return f"load/{kind}"
    if kind in INTERLEAVES:
        return "load/interleave"
    if kind == "FlatMap":
        return "load/flat_map"
    if kind in BATCHES:
        return "collate"
    if kind in TRANSFERS:
        return "transfer/h2d"
    if kind in CACHES:
        return "cache"
    if kind in ("Shuffle", "ShuffleAndRepeat"):
        return "shuffle"
    if kind == "Prefetch":
        return "prefetch"
    return f"other/{kind}"


def fused_names(dataset: str) -> list[str]:
    """``fused(ParallelMapDatasetV2:1,BatchDatasetV2:2)`` -> both names; a plain name alone."""
    if dataset.startswith("fused(") and dataset.endswith(")"):
        return dataset[6:-1].split(",")
    return [dataset]
