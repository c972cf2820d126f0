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
code of their variants (their ``__code__`` is swapped, so every module that imported them by
name calls the variant), and ``stage`` and ``Recorder`` get variant methods; ``uninstall`` of the
last user puts the originals back. The variants are compiled from the originals' own source
(NOTE [ Variants from the same source ]). While any profile with ranges runs in a process,
every stage timed in that process emits them.

Nothing is emitted where nothing would record it: no CUDA device (torch is imported and sees
none), or no NVTX tool attached (not run under ``nsys profile``: the nvtx library then hands out
a dummy domain). Then the hot path is left as it is, and the profile says so in its notes and in
a warning, once per process. ``PIPEPROF_NVTX_FORCE=1`` emits anyway, through a real domain with
no tool behind it (each call reaches libnvToolsExt's no-op): how the tests and
benchmarks/nvtx_cost.py exercise the emitting path on a machine without a GPU.
"""

from __future__ import annotations
import __future__

import ast
import inspect
import os
import sys
import textwrap
import threading
import warnings
from typing import Any

from pipeprof.collect.timer import Timer
from pipeprof.core import recorder as _rec
from pipeprof.core.recorder import (
    Recorder,
    _recorder,
    stage,
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


# ---- the variants: the originals in core/recorder.py plus a range -------------------------
#
# NOTE [ Variants from the same source ]
# The hot functions of core/recorder.py (``timed_call1``, ``stage_call1``, ``stage.__enter__``
# and ``__exit__``) carry two comment lines: ``# NVTX: open path rec`` before the first clock
# read and ``# NVTX: close`` after the last. Their variants are compiled from their own source,
# each such comment replaced by the statements that push the range of the local ``path``
# through the recorder ``rec`` (registering its name the first time) or pop it, in
# core/recorder.py's globals; they take the comment's line number, so every other line keeps
# its own (tracebacks read as the original). An edit of the original is an edit of its variant,
# and the plain code pays nothing for the markers. This needs the package's source files, as pip
# installs them.

# what each marker becomes: the hand-written form it replaced, statement for statement
_OPEN_RANGE = """
ranges = {rec}.ranges
try:
    attrs = ranges.attrs[{path}]
except KeyError:
    attrs = ranges.register({path})
ranges.push(attrs)
"""
_POP_HERE, _POP = "ranges.pop()", "_recorder.ranges.pop()"


def _ranged(fn: Any) -> Any:
    """``fn`` made again from its source with its ``# NVTX:`` lines as range calls (NOTE
    [ Variants from the same source ])."""
    lines, first = inspect.getsourcelines(fn)
    source = "\n" * (first - 1) + textwrap.dedent("".join(lines))
    tree = ast.parse(source)
    opened = False
    for number, line in enumerate(source.splitlines(), 1):
        words = line.split()
        if words[:2] != ["#", "NVTX:"]:
            continue
        if words[2] == "open":  # open PATH RECORDER: the local names of both
            added = _OPEN_RANGE.format(path=words[3], rec=words[4])
            opened = True
        else:
            added = _POP_HERE if opened else _POP
        _insert(tree, number, ast.parse(added).body)
    # compiled as its module was: with postponed annotations where it has them, so an annotation
    # that names what exists only for type checkers does not break the variant alone
    flags = fn.__code__.co_flags & __future__.annotations.compiler_flag
    code = compile(tree, fn.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    made: dict[str, Any] = {}
    exec(code, fn.__globals__, made)
    return made[fn.__name__]


def _insert(tree: ast.Module, line: int, stmts: list[ast.stmt]) -> None:
    """``stmts`` into the block of ``tree`` whose two statements ``line`` lies between, every
    one of them at ``line``: the statements after it keep their own line numbers."""
    for stmt in stmts:
        for part in ast.walk(stmt):
            if "lineno" in part._attributes:
                part.lineno = part.end_lineno = line  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for k in range(1, len(block)):
                if block[k - 1].end_lineno < line < block[k].lineno:  # type: ignore[operator]
                    block[k:k] = stmts
                    return
    raise RuntimeError(f"no place for the NVTX range of line {line}")


# the module functions whose code is swapped: (function, original code, variant code)
_CODES = [(fn, fn.__code__, _ranged(fn).__code__) for fn in (_rec.timed_call1, _rec.stage_call1)]


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


_METHODS: list[tuple[type, str, Any]] = [
    (Recorder, "open", _open),
    (Recorder, "close", _close),
    (Recorder, "discard", _discard),
    (stage, "__enter__", _ranged(stage.__enter__)),
    (stage, "__exit__", _ranged(stage.__exit__)),
]
_ORIG_METHODS: dict[tuple[type, str], Any] = {(c, n): c.__dict__[n] for c, n, _ in _METHODS}
