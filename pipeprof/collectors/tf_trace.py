"""tf.data stage timings from the TensorFlow profiler's trace (an XSpace), measured in situ.

NOTE [ tf.data iterator events ]
While ``tf.profiler.experimental`` traces, every ``GetNext`` of every tf.data iterator is an
event on the host plane named by its position in the pipeline, ``Iterator::Root::Prefetch::
BatchV2::ParallelMapV2::Range`` (``[i]`` marks the i-th nested iterator of an interleave or a
repeat), with the dataset's name (``MapDataset:3``, the ``metadata`` attr of the graph node) as a
stat. Nesting by time on one thread gives the call tree; self time is the duration minus the
children's. Asynchronous iterators (prefetch, parallel map/interleave/batch, map-and-batch) split
in two: the consumer's ``GetNext`` (self time there is *waiting*) and ``XxxProduce`` events on
their own threads (self time there is *work*), joined to the ``XxxConsume`` event of the element
they made by ``element_id``. A parallel map's function runs on the tf.data thread pool: its
``InstantiatedCapturedFunction::RunAsync`` in the Produce event carries a ``FunctionRun`` whose
``id`` equals that of the ``ExecutorState::Process`` events that executed the function.

From this, per iterator: *work* per element (sync iterators: self time of each GetNext;
async ones: self time of each Produce plus the function's executor time), the consumer's *wait*,
and TensorFlow's own bottleneck rule (tensorflow/profiler ``xplane_to_tf_data_stats``): walking
each root ``GetNext`` through children and Consume→Produce links, an iterator is *blocking* when
its event overlaps its (blocking) parent's; the blocking iterator with the largest total self time
limits the pipeline. See docs/tfdata.md for the precision of each figure.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

#: Iterators whose GetNext hands over elements made by their own threads (TensorFlow's list).
ASYNC_KINDS = frozenset({"Prefetch", "ParallelInterleave", "ParallelInterleaveV2",
                         "ParallelInterleaveV3", "ParallelInterleaveV4", "ParallelMap",
                         "ParallelMapV2", "ParseExample", "MapAndBatch", "DataService",
                         "LegacyParallelInterleave", "ParallelBatch", "PrefetchToDevice"})  # fmt: skip
_INDEX = re.compile(r"\[\d+\]")
_ITER, _PRODUCE, _CONSUME, _RUN_ASYNC, _FN_RUN = range(5)


def kind_of(long_name: str) -> str:
    """``Iterator::Root::Prefetch::ParallelMapV2[0]`` -> ``ParallelMapV2``."""
    return _INDEX.sub("", long_name.rsplit("::", 1)[-1])


@dataclass
class IteratorStats:
    """One dataset op of the running pipeline, summed over all its iterators and threads."""

    long_name: str  # Iterator::Root::... with the [i] indices removed
    kind: str
    dataset: str  # the dataset's name, e.g. MapDataset:3 ("" for ops built at run time)
    calls: int = 0
    work_ns: int = 0  # self time of sync GetNext calls, or Produce + function time when async
    wait_ns: int = 0  # self time of an async iterator's consumer GetNext: waiting
    fn_ns: int = 0  # executor time of functions launched asynchronously
    fn_calls: int = 0
    blocking_ns: int = 0  # self time while blocking a root GetNext (TensorFlow's rule)
    params: dict[str, Any] = field(default_factory=dict)  # parallelism, buffer_limit, ...
    # one (start_ns, ns) per element of work, in the perf_counter time base
    items: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass
class Trace:
    """What one profiler capture saw of the tf.data pipelines that ran during it."""

    iterators: dict[tuple[str, str], IteratorStats] = field(default_factory=dict)
    roots: list[tuple[int, int]] = field(default_factory=list)  # root GetNext (start_ns, ns)
    events: int = 0


class Capture:
    """Runs the TensorFlow profiler (host tracer only) into a temporary folder.

    ``start`` returns False with ``error`` set when the profiler cannot run here (another
    profiling session is active, say); callers then fall back and say so.
    """

    def __init__(self) -> None:
        self.logdir = ""
        self.offset_ns = 0  # epoch ns - perf_counter ns
        self.running = False
        self.error: str | None = None

    def start(self) -> bool:
        import tensorflow as tf

        self.logdir = tempfile.mkdtemp(prefix="pipeprof-tf-")
        opts = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=2, python_tracer_level=0, device_tracer_level=0)
        try:
            tf.profiler.experimental.start(self.logdir, options=opts)
        except Exception as exc:  # AlreadyExistsError, UnavailableError, ...
            self.error = f"{type(exc).__name__}: {exc}".strip()
            shutil.rmtree(self.logdir, ignore_errors=True)
            return False
        self.offset_ns = time.time_ns() - time.perf_counter_ns()
        self.running = True
        return True

    def stop(self, known: set[str] | frozenset[str] = frozenset()) -> Trace | None:
        """Stop the profiler and parse what it wrote (None, with ``error``, if nothing)."""
        if not self.running:
            return None
        import tensorflow as tf

        self.running = False
        try:
            tf.profiler.experimental.stop()
            space = read_space(self.logdir)
            return parse(space, self.offset_ns, known) if space is not None else None
        except Exception as exc:  # a trace we cannot read must not break the user's loop
            self.error = f"{type(exc).__name__}: {exc}".strip()
            return None
        finally:
            shutil.rmtree(self.logdir, ignore_errors=True)


def _xplane_pb2() -> Any:
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:  # older layouts
        from tsl.profiler.protobuf import xplane_pb2  # type: ignore[no-redef]
    return xplane_pb2


def read_space(logdir: str) -> Any:
    """The XSpace the profiler wrote under ``logdir/plugins/profile/<run>/``, or None."""
    files = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
    if not files:
        return None
    space = _xplane_pb2().XSpace()
    with open(files[-1], "rb") as fh:
        space.ParseFromString(fh.read())
    return space


class _Ev:
    __slots__ = ("children", "code", "consumed", "dur", "end", "key", "line", "name", "runs",
                 "start", "stats")

    def __init__(self, code: int, name: str, start: int, dur: int, line: str) -> None:
        self.code = code
        self.name = name
        self.start = start
        self.dur = dur
        self.end = start + dur
        self.line = line
        self.stats: dict[str, Any] = {}
        self.children: list[_Ev] = []  # iterator events directly inside
        self.runs: list[_Ev] = []  # RunAsync directly inside; for RunAsync: its FunctionRun
        self.consumed: list[tuple[str, Any]] = []  # elements an iterator event took over
        self.key: tuple[str, str] | None = None


_WANTED = {"id", "parent_id", "name", "element_id", "parallelism", "buffer_limit", "autotune",
           "batch_size", "cycle_length", "deterministic", "buffer_size"}  # fmt: skip


def _code(name: str) -> int | None:
    if name.startswith("Iterator::"):
        return _ITER
    if name.endswith("Produce"):
        return _PRODUCE
    if name.endswith("Consume"):
        return _CONSUME
    if name == "InstantiatedCapturedFunction::RunAsync":
        return _RUN_ASYNC
    if name == "FunctionRun":
        return _FN_RUN
    return None


def _host_plane(space: Any) -> tuple[Any, int]:
    plane, start = None, 0
    for p in space.planes:
        if p.name == "/host:CPU":
            plane = p
        for s in p.stats:
            if p.stat_metadata[s.metadata_id].name == "profile_start_time":
                start = int(s.uint64_value or s.int64_value)
    return plane, start


def _stat_value(plane: Any, s: Any) -> Any:
    kind = s.WhichOneof("value")
    if kind == "ref_value":
        return plane.stat_metadata[s.ref_value].name
    return getattr(s, kind) if kind else None


def _events(space: Any, offset_ns: int) -> tuple[list[_Ev], dict[int, int]]:
    """Relevant events (perf_counter ns) and executor time per function step id."""
    plane, t0 = _host_plane(space)
    if plane is None:
        return [], {}
    names = {k: m.name for k, m in plane.event_metadata.items()}
    codes = {k: _code(n) for k, n in names.items()}
    process_ids = {k for k, n in names.items() if n == "ExecutorState::Process"}
    stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
    out: list[_Ev] = []
    process: dict[int, int] = {}
    for line in plane.lines:
        base = t0 + line.timestamp_ns - offset_ns
        label = line.display_name or line.name
        for e in line.events:
            mid = e.metadata_id
            if mid in process_ids:
                for s in e.stats:
                    if stat_names.get(s.metadata_id) == "id":
                        step = s.int64_value or s.uint64_value
                        process[step] = process.get(step, 0) + e.duration_ps // 1000
                continue
            code = codes.get(mid)
            if code is None:
                continue
            ev = _Ev(code, names[mid], base + e.offset_ps // 1000, e.duration_ps // 1000, label)
            for s in e.stats:
                sname = stat_names.get(s.metadata_id)
                if sname in _WANTED:
                    ev.stats[sname] = _stat_value(plane, s)
            out.append(ev)
    return out, process


def _nest(events: list[_Ev]) -> tuple[list[_Ev], dict[Any, list[_Ev]], list[_Ev]]:
    """Link events on each thread by time: children, async runs, consumers and producers."""
    events.sort(key=lambda e: (e.line, e.start, -e.dur))
    consumes: dict[Any, list[_Ev]] = {}  # element_id -> iterator events that consumed it
    produces: list[_Ev] = []
    stack: list[_Ev] = []
    line = None
    for ev in events:
        if ev.line != line:
            stack, line = [], ev.line
        while stack and stack[-1].end <= ev.start:
            stack.pop()
        anchor = next((a for a in reversed(stack) if a.code in (_ITER, _PRODUCE)), None)
        if ev.code == _ITER and anchor is not None:
            anchor.children.append(ev)
        elif ev.code == _CONSUME and anchor is not None and anchor.code == _ITER:
            consumes.setdefault(_link(ev), []).append(anchor)
            anchor.consumed.append(_link(ev))
        elif ev.code == _RUN_ASYNC and anchor is not None:
            anchor.runs.append(ev)
        elif ev.code == _FN_RUN and stack and stack[-1].code == _RUN_ASYNC:
            stack[-1].runs.append(ev)
        if ev.code == _PRODUCE:
            produces.append(ev)
        if ev.code != _FN_RUN:
            stack.append(ev)
    return produces, consumes, events


def _link(ev: _Ev) -> tuple[str, Any]:
    """``MapAndBatchProduce``/``MapAndBatchConsume`` of one element share (prefix, element_id)."""
    return ev.name[: -len("Produce" if ev.code == _PRODUCE else "Consume")], ev.stats.get(
        "element_id")


def parse(space: Any, offset_ns: int, known: set[str] | frozenset[str] = frozenset()) -> Trace:
    """Per-iterator work, wait and blocking time from an XSpace (see the NOTE above).

    ``known`` holds the dataset names of the user's graph; names outside it (datasets an
    interleave builds at run time, one per file) are merged per position in the pipeline.
    """
    events, process = _events(space, offset_ns)
    produces, consumes, events = _nest(events)
    trace = Trace(events=len(events))
    for ev in events:
        if ev.code == _ITER:
            ev.key = _account_iterator(trace, ev, known)
    made: dict[tuple[str, Any], list[_Ev]] = {}
    owner_of_line: dict[str, tuple[str, str]] = {}
    for ev in produces:
        made.setdefault(_link(ev), []).append(ev)
        _account_produce(trace, ev, consumes, process, owner_of_line)
    for ev in events:
        if ev.code == _ITER and ev.name.count("::") == 1:  # a root GetNext
            trace.roots.append((ev.start, ev.dur))
            _blocking(trace, ev, made, True, 0)
    trace.roots.sort()
    return trace


def _account_iterator(trace: Trace, ev: _Ev, known: set[str] | frozenset[str]) -> tuple[str, str]:
    long_name = _INDEX.sub("", ev.name)
    dataset = str(ev.stats.get("name") or "")
    key = (long_name, dataset if dataset in known or not known else "")
    it = trace.iterators.get(key)
    if it is None:
        it = trace.iterators[key] = IteratorStats(long_name, kind_of(long_name), key[1])
    for p in ("parallelism", "buffer_limit", "autotune", "batch_size", "cycle_length",
              "deterministic", "buffer_size"):  # fmt: skip
        if p in ev.stats:
            it.params[p] = ev.stats[p]
    it.calls += 1
    own = ev.dur - sum(c.dur for c in ev.children)
    if it.kind in ASYNC_KINDS:
        it.wait_ns += max(0, own)
    else:
        it.work_ns += max(0, own)
        it.items.append((ev.start, max(0, own), ev.line))
    return key


def _account_produce(trace: Trace, ev: _Ev, consumes: dict[Any, list[_Ev]],
                     process: dict[int, int], owner_of_line: dict[str, tuple[str, str]]) -> None:  # fmt: skip
    """An async iterator's work on its own thread: the Produce event and the function it ran."""
    key = _owner(trace, ev, consumes)
    if key is None:
        key = owner_of_line.get(ev.line)
    if key is None:
        return
    owner_of_line[ev.line] = key
    it = trace.iterators[key]
    fn = 0
    for run in ev.runs:
        for fr in run.runs:
            fn += process.get(fr.stats.get("id"), 0)  # type: ignore[arg-type]
        it.fn_calls += 1
    own = max(0, ev.dur - sum(c.dur for c in ev.children))
    it.fn_ns += fn
    it.work_ns += own + fn
    it.items.append((ev.start, own + fn, ev.line))


def _owner(trace: Trace, ev: _Ev, consumes: dict[Any, list[_Ev]]) -> tuple[str, str] | None:
    """The async iterator a Produce event worked for: its children's parent, or its consumer."""
    parents = {c.stats.get("parent_id") for c in ev.children}
    if parents:
        for it_ev in consumes.get(_link(ev), []):
            if it_ev.stats.get("id") in parents:
                return it_ev.key
        # the consumer fell outside the capture: find the parent among the iterators seen
        return _by_id(trace, parents, ev)
    consumers = consumes.get(_link(ev))
    return consumers[0].key if consumers else None


def _by_id(trace: Trace, parents: set[Any], ev: _Ev) -> tuple[str, str] | None:
    child = ev.children[0].key
    if child is None:
        return None
    parent_long = child[0].rsplit("::", 1)[0]
    for key in trace.iterators:
        if key[0] == parent_long:
            return key
    return None


def _blocking(trace: Trace, ev: _Ev, made: dict[Any, list[_Ev]], blocking: bool,
              depth: int) -> None:  # fmt: skip
    """TensorFlow's rule: subtract children's overlap; a child blocks if it overlaps."""
    if depth > 100 or ev.key is None:
        return
    own = ev.dur
    for child in _tree_children(ev, made):
        overlap = max(0, min(ev.end, child.end) - max(ev.start, child.start))
        _blocking(trace, child, made, blocking and overlap > 0, depth + 1)
        own -= overlap
    if blocking:
        trace.iterators[ev.key].blocking_ns += max(0, own)


def _tree_children(ev: _Ev, made: dict[Any, list[_Ev]]) -> list[_Ev]:
    """Children on the same thread, plus the input calls its producers made for the elements
    this call consumed (an async iterator's)."""
    kids = list(ev.children)
    for link in ev.consumed:
        for prod in made.get(link, ()):
            kids.extend(prod.children)
    return kids
