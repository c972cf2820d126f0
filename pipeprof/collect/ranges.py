"""NVTX ranges: pipeprof's stages and the loop's parts on an Nsight Systems timeline.

NOTE [ NVTX ranges ]
With ``Profiler(nvtx=True)``, ``pipeprof.profile(..., nvtx=True)`` or ``pipeprof run --nvtx``,
every stage pipeprof times (``load``, ``load/decode``, ``transform/RandomResizedCrop``,
``collate``, ``pipeprof.stage`` regions; in the DataLoader workers too) is also pushed and
popped as an NVTX range named by its path, in the domain ``pipeprof``; in the main process the
loop's ``wait``, ``transfer`` and ``compute`` and the Timer's regions (``Forward``...) are ranges
too. A range opens before the stage's first clock read and closes after its last, so the
figures pipeprof reports do not include NVTX's cost. The flag travels to the workers the way the
h5py switch does: in the picklable ``WorkerInit`` (collect/torch/loader.py).

Off, this costs nothing: the hot path is not given a branch. While ranges are on in a process
(``install``/``uninstall``, counted like profiles), ``timed_call1`` and ``stage_call1`` run the
code of the variants below (their ``__code__`` is swapped, so every module that imported them by
name calls the variant), and ``stage`` and ``Recorder`` get variant methods; ``uninstall`` of the
last user puts the originals back. A swapped code object keeps core/recorder.py's globals, so the
variants name only globals that this module imports from there (the same objects in both
namespaces): they mean the same in either module (a test checks it). While any profile with
ranges runs in a process, every stage timed in that process emits them.

Nothing is emitted where nothing would record it: no CUDA device (torch is imported and sees
none), or no NVTX tool attached (not run under ``nsys profile``: the nvtx library then hands out
a dummy domain). Then the hot path is left as it is, and the profile says so in its notes and in
a warning, once per process. ``PIPEPROF_NVTX_FORCE=1`` emits anyway, through a real domain with
no tool behind it (each call reaches libnvToolsExt's no-op): how the tests and
benchmarks/nvtx_cost.py exercise the emitting path on a machine without a GPU.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

from pipeprof.collect.timer import Timer
from pipeprof.core import recorder as _rec
from pipeprof.core.recorder import (
    _CHILD,
    _ONE,
    Recorder,
    _child,
    _recorder,
    clock,
    stage,
    timed_call,
)

DOMAIN = "pipeprof"
FORCE_ENV = "PIPEPROF_NVTX_FORCE"
MISSING = "nvtx=True needs the nvtx package: pip install 'pipeprof[nvtx]' (or pip install nvtx)"
# ARGB by a path's first part: the same stage keeps its colour across processes and runs
COLORS = {
    "load": 0xFF4C72B0,
    "transform": 0xFF55A868,
    "collate": 0xFF8172B2,
    "transfer": 0xFFDD8452,
    "wait": 0xFFC44E52,
    "compute": 0xFF937860,
}
REGION_COLOR = 0xFF8C8C8C


class Ranges:
    """NVTX ranges in one domain, with each name's event attributes made once.

    ``open(name)`` opens a range on this thread; ``pop()`` closes this thread's innermost. The
    hot path inlines ``open``: ``push(attrs[name])`` (``register`` on a KeyError), the domain's
    own push on cached attributes, about 45 ns a range less than a method call here
    (benchmarks/nvtx_cost.py).
    """

    __slots__ = ("_domain", "attrs", "pop", "push")

    def __init__(self, domain: Any) -> None:
        self._domain = domain
        self.attrs: dict[str, Any] = {}  # name -> its event attributes
        self.push = domain.push_range  # push(attrs)
        self.pop = domain.pop_range

    def register(self, name: str) -> Any:
        """``name``'s event attributes, made (a registered string, a colour) and kept."""
        attrs = self.attrs[name] = self._domain.get_event_attributes(
            message=name, color=COLORS.get(name.partition("/")[0], REGION_COLOR)
        )
        return attrs

    def open(self, name: str) -> None:
        try:
            attrs = self.attrs[name]
        except KeyError:
            attrs = self.register(name)
        self.push(attrs)


class RangeTimer(Timer):
    """A ``Timer`` whose regions (``Forward``, ``Backward``...) are NVTX ranges too: what a
    Profiler with ranges uses, chosen when it is made, so a plain Timer pays nothing."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Ranges, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ranges = ranges

    def start(self, key: str) -> None:
        self.ranges.open(key)  # before the clock: NVTX's cost stays out of the region
        try:
            _START(self, key)
        except BaseException:
            self.ranges.pop()
            raise

    def end(self, key: str) -> None:
        _END(self, key)  # an unmatched end raises here, and pops nothing
        self.ranges.pop()


_START, _END = Timer.start, Timer.end


_lock = threading.Lock()
_users = 0  # profiles with ranges on in this process
_ranges: Ranges | None = None  # this process's, made on first use (a worker makes its own)
_warned = False


def forced() -> bool:
    """``PIPEPROF_NVTX_FORCE=1``: emit even with no CUDA device and no tool attached."""
    return os.environ.get(FORCE_ENV, "") not in ("", "0")


def _domain(force: bool) -> Any:
    """The ``pipeprof`` NVTX domain: the nvtx library's dummy when no tool is attached, unless
    ``force``. Raises ImportError naming the extra when the nvtx package is missing."""
    try:
        import nvtx
    except ImportError as exc:
        raise ImportError(MISSING) from exc
    domain = nvtx.get_domain(DOMAIN)
    if force and not isinstance(domain, nvtx.Domain):
        from nvtx._lib.lib import DomainHandle

        # nvtx.Domain's __new__ hands out the dummy when no tool is attached; build the real one
        domain = object.__new__(nvtx.Domain)
        domain.handle = DomainHandle(DOMAIN)
        domain.__init__(DOMAIN)
    return domain


def why_off() -> str | None:
    """Why ranges would record nothing in this process (None: they would). Imports nvtx;
    ImportError naming ``pipeprof[nvtx]`` when it is missing."""
    force = forced()
    domain = _domain(force)
    if force:
        return None
    torch = sys.modules.get("torch")  # never import torch just to decide
    if torch is not None and not torch.cuda.is_available():
        return "no CUDA device here"
    import nvtx

    if not isinstance(domain, nvtx.Domain):
        return "no NVTX tool is attached (run the script under `nsys profile`)"
    return None


def open_ranges(notes: list[str]) -> Ranges | None:
    """This process's Ranges for a profile that asked for them, or None with a note in
    ``notes`` (and a warning, once per process) saying why nothing is emitted."""
    global _warned
    reason = why_off()
    if reason is not None:
        msg = f"nvtx=True: {reason}, so pipeprof emits no NVTX ranges (its figures are the same)"
        notes.append(msg)
        if not _warned:
            _warned = True
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
        return None
    return current()


def current() -> Ranges:
    """This process's Ranges (made on first use)."""
    global _ranges
    if _ranges is None:
        _ranges = Ranges(_domain(forced()))
    return _ranges


def install() -> None:
    """Ranges on in this process: the hot path runs the variants (NOTE [ NVTX ranges ])."""
    global _users
    with _lock:
        _users += 1
        if _users == 1:
            _swap(current())


def uninstall() -> None:
    """One profile with ranges ended; after the last, the originals are back."""
    global _users
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users == 0:
            _swap(None)


def in_worker(on: bool) -> None:
    """A DataLoader worker starts: ranges on for its life when its profile asked for them; off
    when it only inherited them (forked while another profile had them on)."""
    global _users, _ranges
    with _lock:
        _users = 0
        _swap(None)
        _ranges = None  # the worker's own domain, not one made in its parent
        if on:
            _users = 1
            _swap(current())


def is_on() -> bool:
    """Whether this process's hot path emits ranges now."""
    return _recorder.ranges is not None


def _swap(ranges: Ranges | None) -> None:
    on = ranges is not None
    _recorder.ranges = ranges
    for fn, original, variant in _CODES:
        fn.__code__ = variant if on else original
    for cls, name, variant in _METHODS:
        setattr(cls, name, variant if on else _ORIG_METHODS[cls, name])


# ---- the variants: the originals in core/recorder.py plus a range (keep them in step) --------


def _timed_call1(path: str, fn: Any, x: Any = _ONE, /, *args: Any, **kwargs: Any) -> Any:
    """``core.recorder.timed_call1`` with an NVTX range around the timed call (its code runs
    as timed_call1's, with core/recorder.py's globals: the names here must be the same)."""
    if args or kwargs or x is _ONE:
        return timed_call(path, fn, *(() if x is _ONE else (x,)), *args, **kwargs)
    rec = _recorder
    if not rec.enabled:
        return fn(x)
    st = rec._local.st
    sink = st.sink
    prev = st.path
    d0 = st.detached
    st.path = path
    ranges = rec.ranges
    try:
        attrs = ranges.attrs[path]
    except KeyError:
        attrs = ranges.register(path)
    ranges.push(attrs)
    start = clock()
    try:
        return fn(x)
    finally:
        d0 += clock() - start
        ranges.pop()
        st.path = prev
        own = d0 - st.detached
        st.detached = d0 if prev is not None else 0
        try:
            raw = sink[path]
        except KeyError:
            raw = sink[path] = []
        raw += (start, own)


def _stage_call1(name: str, fn: Any, x: Any = _ONE, /, *a: Any, **k: Any) -> Any:
    """``core.recorder.stage_call1`` with an NVTX range around the timed call."""
    rec = _recorder
    if not rec.enabled:
        if a or k or x is _ONE:
            return fn(*a, **k) if x is _ONE else fn(x, *a, **k)
        return fn(x)
    st = rec._local.st
    sink = st.sink
    prev = st.path
    key = (prev if prev is not None else rec._main.path, name)
    try:
        path = _CHILD[key]
    except KeyError:
        path = _child(key)
    d0 = st.detached
    st.path = path
    ranges = rec.ranges
    try:
        attrs = ranges.attrs[path]
    except KeyError:
        attrs = ranges.register(path)
    ranges.push(attrs)
    start = clock()
    try:
        if a or k or x is _ONE:
            return fn(*a, **k) if x is _ONE else fn(x, *a, **k)
        return fn(x)
    finally:
        dur = clock() - start
        ranges.pop()
        st.path = prev
        own = dur + d0 - st.detached
        if prev is None:
            st.detached = 0
        try:
            raw = sink[path]
        except KeyError:
            raw = sink[path] = []
        raw += (start, own)


# the module functions whose code is swapped: (function, original code, variant code)
_CODES = [
    (_rec.timed_call1, _rec.timed_call1.__code__, _timed_call1.__code__),
    (_rec.stage_call1, _rec.stage_call1.__code__, _stage_call1.__code__),
]


_OPEN, _CLOSE, _DISCARD = Recorder.open, Recorder.close, Recorder.discard


def _open(self: Recorder, path: str) -> list[Any]:
    self.ranges.open(path)
    return _OPEN(self, path)


def _close(self: Recorder, frame: list[Any], n: int = 1, detach: bool = False) -> int:
    dur = _CLOSE(self, frame, n, detach)
    self.ranges.pop()
    return dur


def _discard(self: Recorder, frame: list[Any]) -> None:
    self.ranges.pop()
    _DISCARD(self, frame)


def _enter(self: stage) -> None:
    """``stage.__enter__`` with a range (inlined as there)."""
    rec = _recorder
    if rec.enabled:
        self.st = st = rec._local.st
        self.prev = prev = st.path
        key = (prev if prev is not None else rec._main.path, self.name)
        try:
            path = _CHILD[key]
        except KeyError:
            path = _child(key)
        self.path = st.path = path
        self.d0 = st.detached
        self.sink = st.sink
        ranges = rec.ranges
        try:
            attrs = ranges.attrs[path]
        except KeyError:
            attrs = ranges.register(path)
        ranges.push(attrs)
        self.start = clock()


def _exit(self: stage, typ: object, exc: object, tb: object) -> None:
    st = self.st
    if st is not None:
        dur = clock() - self.start
        _recorder.ranges.pop()
        self.st = None
        prev = st.path = self.prev
        own = dur + self.d0 - st.detached
        if prev is None:
            st.detached = 0
        sink = self.sink
        try:
            raw = sink[self.path]
        except KeyError:
            raw = sink[self.path] = []
        raw += (self.start, own)


_METHODS: list[tuple[type, str, Any]] = [
    (Recorder, "open", _open),
    (Recorder, "close", _close),
    (Recorder, "discard", _discard),
    (stage, "__enter__", _enter),
    (stage, "__exit__", _exit),
]
_ORIG_METHODS: dict[tuple[type, str], Any] = {(c, n): c.__dict__[n] for c, n, _ in _METHODS}
