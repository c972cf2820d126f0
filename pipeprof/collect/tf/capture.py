"""Running the TensorFlow profiler around a pipeline and reading the events it recorded.

``Capture`` starts and stops ``tf.profiler.experimental`` into a temporary folder; ``events``
reads the host plane of the XSpace it wrote (``logdir/plugins/profile/<run>/*.xplane.pb``, parsed
with the protobuf classes TensorFlow ships) into the few event kinds trace.py analyses, with
times converted to ``time.perf_counter_ns``: an event's wall-clock time is the capture's
``profile_start_time`` plus its line's ``timestamp_ns`` plus its ``offset_ps``.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
import time
from typing import Any

ITER, PRODUCE, CONSUME, RUN = range(4)  # iterator GetNext, XxxProduce, XxxConsume, function run


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
        try:
            # Default options: TF 2.21 ignores ProfilerOptions ("host_tracer_level expects an i
            # value"); its default host tracing has every event parse() needs.
            tf.profiler.experimental.start(self.logdir)
        except Exception as exc:  # AlreadyExistsError, UnavailableError, ...
            self.error = f"{type(exc).__name__}: {exc}".strip()
            shutil.rmtree(self.logdir, ignore_errors=True)
            return False
        self.offset_ns = time.time_ns() - time.perf_counter_ns()
        self.running = True
        return True

    def stop(self) -> Any:
        """Stop the profiler; the XSpace it wrote (None, with ``error`` set, if nothing)."""
        if not self.running:
            return None
        import tensorflow as tf

        self.running = False
        try:
            tf.profiler.experimental.stop()
            space = read_space(self.logdir)
            if space is None:
                self.error = "the profiler wrote no trace"
            return space
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


class Event:
    """One traced event: times in perf_counter ns, the stats trace.py needs, and its links."""

    __slots__ = (
        "children",
        "code",
        "consumed",
        "dur",
        "end",
        "key",
        "line",
        "name",
        "runs",
        "start",
        "stats",
    )

    def __init__(self, code: int, name: str, start: int, dur: int, line: str) -> None:
        self.code = code
        self.name = name
        self.start = start
        self.dur = dur
        self.end = start + dur
        self.line = line
        self.stats: dict[str, Any] = {}
        self.children: list[Event] = []  # iterator events directly inside
        self.runs: list[Event] = []  # function runs directly inside (their id is the step id)
        self.consumed: list[tuple[str, Any]] = []  # elements an iterator event took over
        self.key: tuple[str, str] | None = None


PARAMS = frozenset(
    {
        "parallelism",
        "buffer_limit",
        "autotune",
        "batch_size",
        "cycle_length",
        "deterministic",
        "buffer_size",
    }
)
WANTED = PARAMS | {"id", "parent_id", "name", "element_id"}


def code_of(name: str) -> int | None:
    if name.startswith("Iterator::"):
        return ITER
    if name.endswith("Produce"):
        return PRODUCE
    if name.endswith("Consume"):
        return CONSUME
    if name.startswith("InstantiatedCapturedFunction::Run"):  # Run, RunAsync, RunWithBorrowedArgs
        return RUN
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


def events(space: Any, offset_ns: int) -> tuple[list[Event], dict[int, int]]:
    """Relevant events (perf_counter ns) and executor time per function step id."""
    plane, t0 = _host_plane(space)
    if plane is None:
        return [], {}
    names = {k: m.name for k, m in plane.event_metadata.items()}
    codes = {k: code_of(n) for k, n in names.items()}
    process_ids = {k for k, n in names.items() if n == "ExecutorState::Process"}
    stat_names = {k: m.name for k, m in plane.stat_metadata.items()}
    out: list[Event] = []
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
            ev = Event(code, names[mid], base + e.offset_ps // 1000, e.duration_ps // 1000, label)
            for s in e.stats:
                sname = stat_names.get(s.metadata_id)
                if sname in WANTED:
                    ev.stats[sname] = _stat_value(plane, s)
            out.append(ev)
    return out, process
