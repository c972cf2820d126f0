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
they made by ``element_id``. A map's function runs on the tf.data thread pool: the
``InstantiatedCapturedFunction::Run``/``RunAsync`` event in the GetNext (sequential map) or the
Produce event (parallel map) carries an ``id`` equal to that of the ``ExecutorState::Process``
events that executed the function.

From this, per iterator: *work* per element (sync iterators: self time of each GetNext, or the
function's executor time where it ran one; async ones: self time of each Produce plus the
function's executor time), the consumer's *wait*,
and TensorFlow's own bottleneck rule (tensorflow/profiler ``xplane_to_tf_data_stats``): walking
each root ``GetNext`` through children and Consume→Produce links, an iterator is *blocking* when
its event overlaps its (blocking) parent's; the blocking iterator with the largest total self time
limits the pipeline. See docs/tfdata.md for the precision of each figure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipeprof.collect.tf import capture as cap
from pipeprof.collect.tf.capture import Capture, Event

#: Iterators whose GetNext hands over elements made by their own threads (TensorFlow's list).
ASYNC_KINDS = frozenset(
    {
        "Prefetch",
        "ParallelInterleave",
        "ParallelInterleaveV2",
        "ParallelInterleaveV3",
        "ParallelInterleaveV4",
        "ParallelMap",
        "ParallelMapV2",
        "ParseExample",
        "MapAndBatch",
        "DataService",
        "LegacyParallelInterleave",
        "ParallelBatch",
        "PrefetchToDevice",
    }
)
#: Async iterators whose Produce calls the user's function once per element.
MAPPING_KINDS = frozenset({"ParallelMap", "ParallelMapV2", "MapAndBatch", "LegacyParallelMap"})
_INDEX = re.compile(r"\[\d+\]")


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
    first_ns: int = 0  # self time of each iterator's first GetNext (builds its inputs: start-up)
    first_calls: int = 0
    params: dict[str, Any] = field(default_factory=dict)  # parallelism, buffer_limit, ...
    # one (start_ns, ns, thread) per element of work, in the perf_counter time base
    items: list[tuple[int, int, str]] = field(default_factory=list)
    # a fused map-and-batch: the op's own time outside the function per element (collate)
    batch_items: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass
class Trace:
    """What one profiler capture saw of the tf.data pipelines that ran during it."""

    iterators: dict[tuple[str, str], IteratorStats] = field(default_factory=dict)
    roots: list[tuple[int, int]] = field(default_factory=list)  # root GetNext (start_ns, ns)
    events: int = 0
    startup_ns: int = 0  # the first root GetNext, left out of the blocking totals
    first_root: tuple[int, int] | None = None  # the capture's first root GetNext, even before
    # ``since_ns``: (start_ns, ns)


def _nest(events: list[Event]) -> tuple[list[Event], dict[Any, list[Event]], list[Event]]:
    """Link events on each thread by time: children, async runs, consumers and producers."""
    events.sort(key=lambda e: (e.line, e.start, -e.dur))
    consumes: dict[Any, list[Event]] = {}  # element_id -> iterator events that consumed it
    produces: list[Event] = []
    stack: list[Event] = []
    line = None
    for ev in events:
        if ev.line != line:
            stack, line = [], ev.line
        while stack and stack[-1].end <= ev.start:
            stack.pop()
        anchor = next((a for a in reversed(stack) if a.code in (cap.ITER, cap.PRODUCE)), None)
        if ev.code == cap.ITER and anchor is not None:
            anchor.children.append(ev)
        elif ev.code == cap.CONSUME and anchor is not None and anchor.code == cap.ITER:
            consumes.setdefault(_link(ev), []).append(anchor)
            anchor.consumed.append(_link(ev))
        elif ev.code == cap.RUN and anchor is not None:
            anchor.runs.append(ev)
        if ev.code == cap.PRODUCE:
            produces.append(ev)
        stack.append(ev)
    return produces, consumes, events


def _link(ev: Event) -> tuple[str, Any]:
    """``MapAndBatchProduce``/``MapAndBatchConsume`` of one element share (prefix, element_id)."""
    return ev.name[: -len("Produce" if ev.code == cap.PRODUCE else "Consume")], ev.stats.get(
        "element_id"
    )


def parse(
    space: Any,
    offset_ns: int,
    known: set[str] | frozenset[str] = frozenset(),
    fresh: bool = True,
    until_ns: int | None = None,
    since_ns: int | None = None,
) -> Trace:
    """Per-iterator work, wait and blocking time from an XSpace (see the NOTE above).

    ``known`` holds the dataset names of the user's graph; names outside it (datasets an
    interleave builds at run time, one per file) are merged per position in the pipeline.
    ``fresh``: the capture began before the pipeline's iterator was made, so the first root
    GetNext is start-up and stays out of the blocking totals. Events that start after
    ``until_ns`` are left out (Keras tears an iterator down after the traced steps), and those
    that start before ``since_ns`` (Keras' first steps, traced for the start-up alone).
    """
    evs, process = cap.events(space, offset_ns)
    first = min((e for e in evs if _is_root(e)), key=lambda e: e.start, default=None)
    evs = [
        e
        for e in evs
        if (until_ns is None or e.start <= until_ns) and (since_ns is None or e.start >= since_ns)
    ]
    evs = _rooted(evs)
    produces, consumes, evs = _nest(evs)
    trace = Trace(events=len(evs))
    trace.first_root = (first.start, first.dur) if first is not None else None
    seen: set[Any] = set()
    for ev in sorted((e for e in evs if e.code == cap.ITER), key=lambda e: e.start):
        ev.key = _account_iterator(trace, ev, known, seen, process)
    made: dict[tuple[str, Any], list[Event]] = {}
    owner_of_line: dict[str, tuple[str, str]] = {}
    for ev in produces:
        made.setdefault(_link(ev), []).append(ev)
        _account_produce(trace, ev, consumes, process, owner_of_line)
    roots = sorted((e for e in evs if _is_root(e)), key=lambda e: e.start)
    for i, ev in enumerate(roots):
        trace.roots.append((ev.start, ev.dur))
        if i == 0 and fresh and len(roots) > 1:
            trace.startup_ns = ev.dur
            continue
        _blocking(trace, ev, made, True, 0)
    return trace


def _is_root(ev: Event) -> bool:
    """The consumer's own GetNext (``Iterator::Root``)."""
    return ev.code == cap.ITER and ev.name.count("::") == 1


def _rooted(evs: list[Event]) -> list[Event]:
    """Leave out iterators no root GetNext reached: one an input pipeline builds and tears down
    unused (Keras does at the end of an epoch) still runs its inputs, but delivers nothing."""
    parent = {e.stats.get("id"): e.stats.get("parent_id") for e in evs if e.code == cap.ITER}
    ok = {e.stats.get("id") for e in evs if _is_root(e)}
    if not ok:  # no root in the capture: nothing to judge by
        return evs
    bad: set[Any] = set()
    for start in parent:
        chain: list[Any] = []
        node = start
        while node is not None and node not in ok and node not in bad and len(chain) < 64:
            chain.append(node)
            node = parent.get(node)
        (ok if node in ok else bad).update(chain)
    return [e for e in evs if e.code != cap.ITER or e.stats.get("id") not in bad]


def _fn_ns(ev: Event, process: dict[int, int]) -> int:
    """Executor time of the functions ``ev`` ran (their ``id`` is the executor's step id)."""
    return sum(process.get(int(run.stats.get("id") or 0), 0) for run in ev.runs)


def _account_iterator(
    trace: Trace,
    ev: Event,
    known: set[str] | frozenset[str],
    seen: set[Any],
    process: dict[int, int],
) -> tuple[str, str]:
    long_name = _INDEX.sub("", ev.name)
    dataset = str(ev.stats.get("name") or "")
    key = (long_name, dataset if not known or _known(dataset, known) else "")
    it = trace.iterators.get(key)
    if it is None:
        it = trace.iterators[key] = IteratorStats(long_name, kind_of(long_name), key[1])
    it.params.update((p, v) for p, v in ev.stats.items() if p in cap.PARAMS)
    it.calls += 1
    own = max(0, ev.dur - sum(c.dur for c in ev.children))
    instance = ev.stats.get("id")
    if it.kind in ASYNC_KINDS:
        it.wait_ns += own
    elif instance not in seen:  # the first GetNext makes the input iterators: start-up
        it.first_ns += own
        it.first_calls += 1
    else:
        fn = _fn_ns(ev, process)  # a sync map's function, run while this GetNext waits
        it.work_ns += own
        it.fn_ns += fn
        it.fn_calls += len(ev.runs)
        it.items.append((ev.start, fn if fn else own, ev.line))
    seen.add(instance)
    return key


def _known(dataset: str, known: set[str] | frozenset[str]) -> bool:
    if dataset.startswith("fused(") and dataset.endswith(")"):  # fused(MapDataset:1,...)
        return any(part in known for part in dataset[6:-1].split(","))
    return dataset in known


def _account_produce(
    trace: Trace,
    ev: Event,
    consumes: dict[Any, list[Event]],
    process: dict[int, int],
    owner_of_line: dict[str, tuple[str, str]],
) -> None:
    """An async iterator's work on its own thread: the Produce event and the function it ran."""
    key = _owner(trace, ev, consumes) or owner_of_line.get(ev.line)
    if key is None:
        return
    owner_of_line[ev.line] = key
    it = trace.iterators[key]
    fn = _fn_ns(ev, process)
    own = max(0, ev.dur - sum(c.dur for c in ev.children))
    it.fn_ns += fn
    it.fn_calls += len(ev.runs)
    it.work_ns += own + fn
    if it.kind == "MapAndBatch" and ev.runs:  # the function's time, and the batching around it
        it.items.append((ev.start, fn, ev.line))
        it.batch_items.append((ev.start, own, ev.line))
    elif ev.runs or it.kind not in MAPPING_KINDS:  # a map's Produce without a call made nothing
        it.items.append((ev.start, own + fn, ev.line))


def _owner(trace: Trace, ev: Event, consumes: dict[Any, list[Event]]) -> tuple[str, str] | None:
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


def _by_id(trace: Trace, parents: set[Any], ev: Event) -> tuple[str, str] | None:
    child = ev.children[0].key
    if child is None:
        return None
    parent_long = child[0].rsplit("::", 1)[0]
    for key in trace.iterators:
        if key[0] == parent_long:
            return key
    return None


def _blocking(
    trace: Trace, ev: Event, made: dict[Any, list[Event]], blocking: bool, depth: int
) -> None:
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


def _tree_children(ev: Event, made: dict[Any, list[Event]]) -> list[Event]:
    """Children on the same thread, plus the input calls its producers made for the elements
    this call consumed (an async iterator's)."""
    kids = list(ev.children)
    for link in ev.consumed:
        for prod in made.get(link, ()):
            kids.extend(prod.children)
    return kids


def stop(
    capture: Capture,
    known: set[str] | frozenset[str] = frozenset(),
    fresh: bool = True,
    until_ns: int | None = None,
    since_ns: int | None = None,
) -> Trace | None:
    """Stop ``capture`` and parse its trace (None, with ``capture.error`` set, if nothing)."""
    return parse_capture(capture, capture.stop(), known, fresh, until_ns, since_ns)


def parse_capture(
    capture: Capture,
    space: Any,
    known: set[str] | frozenset[str] = frozenset(),
    fresh: bool = True,
    until_ns: int | None = None,
    since_ns: int | None = None,
) -> Trace | None:
    """Parse the XSpace a stopped ``capture`` returned (None if there is none or it is bad)."""
    if space is None:
        return None
    try:
        return parse(space, capture.offset_ns, known, fresh, until_ns, since_ns)
    except Exception as exc:  # a trace we cannot read must not break the user's loop
        capture.error = f"{type(exc).__name__}: {exc}".strip()
        return None
