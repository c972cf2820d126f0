"""tf.data collector: the consumer's waits, timed here, and every stage, traced in situ.

NOTE [ tf.data collection ]
A tf.data pipeline runs in TensorFlow's C++ threads: no Python seam sees its stages. While the
first ``trace_batches`` elements are taken, the TensorFlow profiler (host tracer only) records
every iterator's GetNext, and trace.py turns that into per-stage work, waits and TensorFlow's
bottleneck (NOTE [ tf.data iterator events ]). graph.py names the stages from the dataset's
graph: sources -> ``load/<Kind>``, each ``map``/``filter`` -> ``transform/<the function's name>``,
``batch``/``padded_batch`` -> ``collate``, device copies -> ``transfer/h2d``; ``shuffle``,
``cache`` and ``prefetch`` keep their names. The user's dataset is not changed: the elements
are those of ``iter(dataset)``. Where the profiler cannot run (another capture is active), only
the waits are measured and the session's notes say so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from pipeprof.collect.loop import run_alone
from pipeprof.collect.tf import graph as tf_graph
from pipeprof.collect.tf import trace as tf_trace
from pipeprof.collect.tf.capture import Capture
from pipeprof.collect.tf.trace import Trace
from pipeprof.core.batch import batch_size
from pipeprof.core.recorder import clock, measure_overhead
from pipeprof.core.session import Session
from pipeprof.core.stats import Stat

TRACK = "tf.data"
WAIT_SPAN = "tf.data.Iterator.__next__"
TRACE_BATCHES = 200  # elements traced by default: bounds the profiler's memory and parse time
TRACE_SAMPLES = 5_000  # samples traced at most: a map before batch(B) is B calls per element
SPANS_PER_TRACE = 50_000
TRACE_EVENT_NS = 5_000  # measured: 2-core VM, TF 2.21, cheap maps (benchmarks in docs/tfdata.md)


def import_tf() -> Any:
    try:
        import tensorflow as tf
    except ImportError:  # pragma: no cover - only reached with a tf.data object in hand
        raise ImportError(
            "profiling tf.data needs TensorFlow: pip install 'pipeprof[tf]'"
        ) from None
    return tf


class ProfiledDataset:
    """Iterates ``dataset`` and records into ``session``: exactly the user's elements.

    The first ``trace_batches`` elements (None: all; at most ``TRACE_SAMPLES`` samples) are
    traced with the TensorFlow profiler, once per session; later elements and epochs time the
    waits only. With ``device`` (``"/GPU:0"``; ``"cuda"`` reads as ``"/GPU:0"``, see
    ``check_device``) each element is copied there, timed as ``transfer/h2d``; with
    ``copies="traced"`` only the copies of traced elements are counted in that stage, so that
    it covers the same elements as the traced ones (``pipeprof.profile``).
    """

    def __init__(
        self,
        dataset: Any,
        session: Session,
        device: Any = None,
        *,
        trace: bool = True,
        trace_batches: int | None = TRACE_BATCHES,
        copies: str = "all",
    ) -> None:
        tf = import_tf()
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(
                f"ProfiledDataset needs a tf.data.Dataset, got {type(dataset).__name__}"
            )
        device = check_device(device)
        self.dataset = dataset
        self.copies = copies
        self._tracing = False  # the elements now taken are in the trace
        self._limited = False  # the trace stopped at its bound, before the data ended
        self._traced_from = (0, 0)  # session batches and samples when the trace began
        self.session = session
        self.device = device
        self.h2d = device  # non-None when batches are moved (Profiler.wrap reads this)
        self.transfer_ns = 0  # time spent copying batches so far
        self.trace = trace
        self.trace_batches = trace_batches
        session.framework = "tf"
        self.pipeline = tf_graph.describe(dataset)
        self.batched = any(op["op"] in tf_graph.BATCH_OPS for op in self.pipeline["ops"])
        desc = describe(dataset, self.pipeline, device)
        session.meta.setdefault("tf", {}).update(desc.pop("tf"))  # keeps an earlier epoch's trace
        session.meta.update(desc)

    def __len__(self) -> int:
        n = int(self.dataset.cardinality())
        if n < 0:
            raise TypeError("this dataset's length is infinite or unknown")
        return n

    def __iter__(self) -> Iterator[Any]:
        s = self.session
        capture = self._start_capture()
        space: Any = None
        t_iter = clock()
        try:
            it = iter(self.dataset)
            while True:
                t0 = clock()
                try:
                    element = next(it)
                except StopIteration:
                    return
                t1 = clock()
                self._record(element, t0, t1, t_iter if s.first_batch_ns is None else None)
                if self.device is not None:
                    element = self._copy(element)
                if capture is not None and capture.running and self._trace_full():
                    # stop now (tens of ms, once); parse when the iteration ends, where no step
                    # of a training loop is timed
                    space = self._stop_capture(capture)
                    self._limited = True
                yield element
        finally:
            if capture is not None:
                if space is None:
                    space = self._stop_capture(capture)
                self._finish_capture(capture, space)

    # ---- the consumer's side -----------------------------------------------------------------

    def _record(self, element: Any, t0: int, t1: int, t_iter: int | None) -> None:
        n = batch_size(element) if self.batched else 1
        self.session.add_batch(t0, t1, n, t_iter, WAIT_SPAN)
        self.session.events += 1

    def _copy(self, element: Any) -> Any:
        tf = import_tf()
        t0 = clock()
        with tf.device(self.device):
            out = tf.nest.map_structure(tf.identity, element)
        ns = clock() - t0
        self.transfer_ns += ns  # every copy is the step's transfer (Profiler._steps)
        if self.copies == "all" or self._tracing or not self.session.meta["tf"].get("traced"):
            self.session.add("main", "transfer/h2d", ns)
            self.session.spans.append(("main", "transfer/h2d", t0, ns))
        return out

    def _trace_full(self) -> bool:
        """The trace holds ``trace_batches`` elements, or ``TRACE_SAMPLES`` samples."""
        s, (batches, samples) = self.session, self._traced_from
        limit = self.trace_batches
        return bool(limit and s.batches - batches >= limit) or (
            s.samples - samples >= TRACE_SAMPLES
        )

    # ---- the profiler trace -----------------------------------------------------------------

    def _start_capture(self) -> Capture | None:
        tf_meta = self.session.meta.setdefault("tf", {})
        if not self.trace or tf_meta.get("traced"):
            return None
        capture = Capture()
        if not capture.start():
            self._fallback(capture.error)
            return None
        tf_meta["traced"] = True
        # the tracks whose stages cover only the traced elements (analysis divides by those)
        tf_meta["traced_tracks"] = [TRACK] + (["main"] if self.copies == "traced" else [])
        self._traced_from = (self.session.batches, self.session.samples)
        self._tracing, self._limited = True, False
        return capture

    def _stop_capture(self, capture: Capture) -> Any:
        """Stop tracing; the elements it covered are what stage times per sample divide by."""
        s, (batches, samples) = self.session, self._traced_from
        s.meta["tf"].update(traced_batches=s.batches - batches, traced_samples=s.samples - samples)
        self._tracing = False
        return capture.stop()

    def _finish_capture(self, capture: Capture, space: Any) -> None:
        known = {op["dataset"] for op in self.pipeline["ops"] if op.get("dataset")}
        trace = tf_trace.parse_capture(capture, space, known)
        if trace is None:
            self._fallback(capture.error)
            return
        merge_trace(self.session, trace, self.pipeline)
        if self._limited:
            tf_meta = self.session.meta["tf"]
            self.session.notes.append(
                f"stage times cover the first {tf_meta['traced_batches']} elements "
                f"({tf_meta['traced_samples']} samples; meta.tf.traced_batches), traced with "
                "the TensorFlow profiler; later elements were timed by their waits only "
                "(the trace is bounded to keep memory flat)"
            )

    def _fallback(self, error: str | None) -> None:
        self.session.meta.setdefault("tf", {})["method"] = "waits only"
        self.session.notes.append(
            "the TensorFlow profiler could not trace this pipeline "
            f"({error or 'no trace written'}): waits are measured; stage times are missing "
            "(pipeprof.profile estimates them with a prefix-by-prefix benchmark instead). Stop "
            "other profiling sessions (TensorBoard's profile_batch) for in-situ stage times."
        )


def merge_trace(session: Session, trace: Trace, pipeline: dict[str, Any]) -> None:
    """Fold a parsed trace into the session: stage stats, spans, the iterator table, and the
    stage that limits throughput by TensorFlow's rule (``meta.tf.bottleneck``)."""
    ops = {op["dataset"]: op for op in pipeline["ops"] if op.get("dataset")}
    stages = session.stages.setdefault(TRACK, {})
    rows: list[dict[str, Any]] = []
    blocking: dict[str, int] = {}
    spans = 0
    for it in _pipeline_order(trace, pipeline):
        path = tf_graph.stage_for(it.kind, it.dataset, ops)
        parts = [(path, it.items), ("collate", it.batch_items)]  # fused map-and-batch: both
        for stage, items in parts:
            if stage is None or not items:
                continue
            stat = Stat.of_many([ns for _, ns, _ in items], [1] * len(items))
            have = stages.get(stage)
            if have is None:
                stages[stage] = stat
            else:
                have.merge(stat)
            for start, ns, line in items[: max(0, SPANS_PER_TRACE - spans)]:
                session.spans.append((line, stage, start, ns))
            spans += len(items)
        if path is not None and it.kind != "Root":
            blocking[path] = blocking.get(path, 0) + it.blocking_ns
        rows.append(_row(it, path))
    # A traced event costs the pipeline about TRACE_EVENT_NS (docs/tfdata.md); ours far less.
    cost = session.events * session.overhead_ns + trace.events * TRACE_EVENT_NS
    session.events += trace.events
    session.overhead_ns = cost / max(1, session.events)
    tf_meta = session.meta.setdefault("tf", {})
    tf_meta["method"] = "profiler"
    tf_meta["iterators"] = rows
    tf_meta["root_calls"] = len(trace.roots)
    tf_meta["startup_ms"] = round(trace.startup_ns / 1e6, 6)
    total = sum(blocking.values())
    if total > 0:
        path = max(blocking, key=lambda p: blocking[p])
        tf_meta["bottleneck"] = {
            "stage": path,
            "blocking_s": round(blocking[path] / 1e9, 9),
            "share": round(blocking[path] / total, 6),
            "rule": "blocking iterator with the largest self time (TensorFlow's)",
            "blocking_s_by_stage": {
                p: round(v / 1e9, 9)
                for p, v in sorted(blocking.items(), key=lambda kv: -kv[1])
                if v
            },
        }
        session.meta["limiting_stage"] = path


def _pipeline_order(trace: Trace, pipeline: dict[str, Any]) -> list[Any]:
    """The trace's iterators source first (the deepest iterator is nearest the source), then
    by the op's place in the graph: the stage table lists stages in the order they first
    appear, so maps show in the order they run."""
    place = {op["dataset"]: i for i, op in enumerate(pipeline["ops"]) if op.get("dataset")}

    def key(it: Any) -> tuple[int, int]:
        at = [place[n] for n in tf_graph.fused_names(it.dataset) if n in place]
        return (-it.long_name.count("::"), min(at, default=len(place)))

    return sorted(trace.iterators.values(), key=key)


def _row(it: Any, path: str | None) -> dict[str, Any]:
    n = len(it.items)
    return {
        "iterator": it.long_name,
        "kind": it.kind,
        "dataset": it.dataset,
        "stage": path,
        "calls": it.calls,
        "elements": n,
        "work_ms": round(it.work_ns / n / 1e6, 6) if n else None,
        "work_s": round(it.work_ns / 1e9, 9),
        "wait_s": round(it.wait_ns / 1e9, 9),
        "blocking_s": round(it.blocking_ns / 1e9, 9),
        "fn_ms": round(it.fn_ns / it.fn_calls / 1e6, 6) if it.fn_calls else None,
        "first_ms": round(it.first_ns / it.first_calls / 1e6, 6) if it.first_calls else None,
        "params": {k: v if isinstance(v, (int, float)) else str(v) for k, v in it.params.items()},
    }


def describe(dataset: Any, pipeline: dict[str, Any], device: Any) -> dict[str, Any]:
    """The pipeline's configuration, for the report and for the findings."""
    tf = import_tf()
    card = int(dataset.cardinality())
    return {
        "loader": "tf.data.Dataset",
        "dataset": type(dataset).__name__,
        "cardinality": card if card >= 0 else ("infinite" if card == -1 else "unknown"),
        "device": str(device) if device is not None else None,
        "tensorflow": tf.__version__,
        "cpu_count": os.cpu_count(),
        "tf": {
            "pipeline": pipeline["ops"],
            **({"graph_error": pipeline["error"]} if pipeline.get("error") else {}),
        },
    }


def profile_dataset(dataset: Any, batches: int | None = None, device: Any = None) -> Session:
    """``pipeprof.profile`` for a tf.data.Dataset: take ``batches`` elements (None: one pass).

    The first ``TRACE_BATCHES`` elements are traced; the rest are timed by their waits only, so
    memory stays flat however many elements are taken.
    """
    tf = import_tf()
    card = int(dataset.cardinality())
    if batches is None and card == tf.data.INFINITE_CARDINALITY:
        raise ValueError("this dataset repeats forever: pass batches=N to profile N elements")
    if batches is None and card == tf.data.UNKNOWN_CARDINALITY and _infinite_input(dataset):
        raise ValueError(
            "this dataset repeats forever (an input of unknown-length ops such as filter is "
            "infinite: repeat() with no count): pass batches=N to profile N elements"
        )
    if card == 0:
        raise ValueError("the dataset has no elements (cardinality 0): give it data")
    session = Session(framework="tf", mode="loader")
    session.overhead_ns = measure_overhead()
    source = ProfiledDataset(dataset, session, device, copies="traced")
    run_alone(source, session, batches)
    if session.batches == 0 and not session.interrupted:
        raise ValueError(
            "the dataset yielded no elements: is it empty, or does a filter or "
            "batch(drop_remainder=True) remove everything?"
        )
    if session.meta["tf"].get("method") == "waits only" and not session.interrupted:
        from pipeprof.collect.tf.prefix import fill_session

        fill_session(session, dataset, elements=min(max(20, session.batches), TRACE_BATCHES))
    return session


def _infinite_input(dataset: Any, limit: int = 256) -> bool:
    """Some input of ``dataset`` (walked through ``_inputs()``) has infinite cardinality."""
    tf = import_tf()
    todo, seen = [dataset], 0
    while todo and seen < limit:
        ds = todo.pop()
        seen += 1
        try:
            inputs = list(ds._inputs())
        except Exception:  # a private API: no answer is "not known to be infinite"
            continue
        for inp in inputs:
            try:
                if int(inp.cardinality()) == tf.data.INFINITE_CARDINALITY:
                    return True
            except Exception:
                continue
            todo.append(inp)
    return False


_CUDA = re.compile(r"cuda(?::(\d+))?", re.IGNORECASE)


def check_device(device: Any) -> str | None:
    """``device`` in TensorFlow's spelling (``"/GPU:0"``), refusing one this machine lacks.

    ``"cuda"``/``"cuda:N"`` and a ``torch.device`` read as ``"/GPU:N"``; ``"cpu"`` as
    ``"/CPU:0"``. A device TensorFlow does not see here is refused rather than copied to the CPU
    by TensorFlow's soft placement and reported as a ``transfer/h2d`` stage.
    """
    if device is None:
        return None
    tf = import_tf()
    given = device
    if hasattr(device, "to_string"):  # tf.DeviceSpec
        device = device.to_string()
    elif not isinstance(device, str) and isinstance(getattr(device, "type", None), str):
        index = getattr(device, "index", None)  # torch.device
        device = device.type if index is None else f"{device.type}:{index}"
    if not isinstance(device, str):
        raise ValueError(
            f"device={given!r} is not a TensorFlow device: pass a string such as '/GPU:0' "
            "or '/CPU:0', or device=None to profile without a copy to a device"
        )
    cuda = _CUDA.fullmatch(device.strip())
    text = f"/GPU:{cuda.group(1) or 0}" if cuda else device.strip()
    try:
        spec = tf.DeviceSpec.from_string(text)
    except ValueError as exc:
        raise ValueError(
            f"device={given!r} is not a TensorFlow device ({exc}): use TensorFlow's spelling, "
            "e.g. '/GPU:0' or '/CPU:0', or device=None to profile without a copy to a device"
        ) from None
    kind, index = spec.device_type, spec.device_index or 0
    if kind is None:
        raise ValueError(
            f"device={given!r} names no device type: use TensorFlow's spelling, e.g. '/GPU:0' "
            "or '/CPU:0'"
        )
    name = f"/{kind}:{index}"
    local = spec.job in (None, "localhost") and spec.task in (None, 0)
    found = tf.config.list_logical_devices(kind) if local else []
    if local and index >= len(found):
        seen = [d.name for d in tf.config.list_logical_devices()]
        spelled = f" (TensorFlow: {name!r})" if name != given else ""
        raise ValueError(
            f"device={given!r}{spelled} but TensorFlow sees no {kind}:{index} here (devices: "
            f"{', '.join(seen) or 'none'}): pass device=None to profile without a copy to a "
            "device"
        )
    return name if local else spec.to_string()
