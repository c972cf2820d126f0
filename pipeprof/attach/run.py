"""``pipeprof run``: profile an unmodified training script (docs/run.md).

NOTE [ Run ]
The script runs in this process as ``python train.py`` would run it (``runpy``: ``sys.argv``,
``__name__ == "__main__"``, ``sys.path[0]``; spawn workers re-import it as ``__mp_main__``).
Before it starts, an import hook waits for ``torch`` to be imported (a script that never imports
it never pays for it) and then patches public seams of its classes:

- ``DataLoader.__init__`` remembers where each loader was made (file:line and the variable it
  was assigned to), to label it;
- ``DataLoader.__iter__`` makes every pass over a loader a pass of ``Profiler.wrap(loader)``:
  the same profiled twin (stages timed in the workers, the user's objects untouched), one
  ``Profiler`` per loader, so a validation loader is its own report and never adds epochs to the
  training loader's. Iterations pipeprof makes itself (the twin, a loader the script wraps in its
  own ``pipeprof.Profiler``) pass through unpatched;
- the optimizer's step (torch's global step hooks), ``Tensor.backward`` and the outermost
  ``Module`` call (``Module.__call__``) become the ``Optimizer``, ``Backward`` and ``Forward``
  regions of the step of the pass that handed out the last batch. A Module called while a batch
  is fetched in this thread (a torchvision transform with ``num_workers=0``) is the pipeline's,
  timed as its stage, never a ``Forward``.

A new loader made where an earlier one was (a loader per epoch) continues that loader's loop.
When ``tensorflow`` is imported, ``tf.data.Dataset.__iter__`` (eager iteration in a Python loop)
is patched the same way, labelled by the line that iterates it, and Keras' ``Model.fit`` gets
pipeprof's Keras callback added to its callbacks. Lightning's ``Trainer.fit`` and Hugging
Face's ``Trainer.train`` get pipeprof's callback of that framework (attach/lightning.py,
attach/hf.py), which routes the trainer's loaders itself: they never reach the run's own
``DataLoader.__iter__`` patch.

A pass of one loader that runs inside a step of another (validation every N training steps) is
a non-compute region of that step, named after the loader. Two loaders advanced in turn (``zip``)
are each profiled, with a note: each one's compute then holds the other's wait.

The outputs are written when the script ends, raises, exits, on Ctrl-C and on SIGTERM or SIGHUP
(which unwind the script like Ctrl-C, then end the process with that signal as it would have:
``_on_signals``; a signal the script handles or ignores is left to it), or once
``batches`` batches were profiled (then at once); after that the script runs on unprofiled (a
pass under way goes on through its profiled twin, so no batch is repeated or lost).
"""

from __future__ import annotations

import builtins
import functools
import importlib.abc
import importlib.machinery
import io
import itertools
import linecache
import os
import re
import runpy
import signal
import sys
import sysconfig
import threading
import weakref
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from pipeprof.attach.patches import PATCHES, Patches, patch_distributed, weakable
from pipeprof.collect.loop import StepLog
from pipeprof.core.recorder import STAGE_EVERY, clock
from pipeprof.core.regions import STEP_REGIONS
from pipeprof.profiler import Profiler
from pipeprof.report import Report

_PIPEPROF_DIR = str(Path(__file__).resolve().parent.parent)  # the package: attach/ is in it
_ASSIGNED = re.compile(r"^\s*((?:self\.)?[A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")


# NOTE [ Snapshots ] in profiler.py: ``pipeprof run`` saves the main loop's session to its ``-o``
# file every SNAPSHOT_S seconds (the first SNAPSHOT_FIRST_S after the first batch), so that a
# SIGKILL or the OOM killer leaves the last one; the report at the end replaces it.
SNAPSHOT_S = 30.0
SNAPSHOT_FIRST_S = 5.0
SNAPSHOT_NOTE = ("a snapshot of a run still going: pipeprof run saves one every --snapshot-s "
                 "seconds, and the report at the end replaces it. This one was left, so the run "
                 "ended without writing its report (killed: SIGKILL, the OOM killer, a node "
                 "failure), or is still going")  # fmt: skip


class Terminated(BaseException):
    """Raised in the script by SIGTERM or SIGHUP (``signum``) so that it unwinds and the outputs
    get written; the process then ends by that signal."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The signals that end a script by default and unwind it under ``pipeprof run`` (``_on_signals``).
ENDING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@dataclass
class Loader:
    """One DataLoader or tf.data.Dataset the script iterated, and its own Profiler; or one
    Keras ``fit()`` call and its callback (``prof`` None)."""

    label: str
    site: str
    prof: Profiler | None
    loader: Any  # kept alive: its id keys the table
    passes: int = 0
    nested_in: set[str] = field(default_factory=set)
    callback: Any = None  # pipeprof.keras.ProfilerCallback
    open_passes: int = 0
    steps: int = 0  # steps handed out over its passes (NOTE [ Regions in a sample of the steps ])
    region_steps: int = 0  # of them, those whose Forward / Backward / Optimizer were timed
    fast_ns: int = 0  # NOTE [ The fast path ]: its own time in next() (the loader's aside)

    @property
    def session(self) -> Any:
        return self.prof.session if self.prof is not None else self.callback.session


@dataclass
class _Pass:
    entry: Loader
    outer: _Pass | None
    start_ns: int
    alive: bool = True
    quiet: bool = False  # its step under way times no regions (NOTE [ Regions in a sample ...])


class _Local(threading.local):
    inside = 0  # > 0 while pipeprof itself advances a loader (its twin's own iteration)


class Run:
    """Profiles every DataLoader pass of the script it executes; see NOTE [ Run ]."""

    def __init__(
        self,
        *,
        batches: int | None = None,
        sample_hz: float = 10.0,
        regions: bool = True,
        nvtx: bool = False,
        stage_every: int = STAGE_EVERY,
        snapshot: str | None = None,
        snapshot_s: float = SNAPSHOT_S,
    ) -> None:
        self.batches = batches
        self.nvtx = nvtx  # NVTX ranges (collect/ranges.py)
        # NOTE [ Snapshots ] in profiler.py: the main loop's session saved there every
        # ``snapshot_s`` seconds while it runs (the first SNAPSHOT_FIRST_S after its first batch)
        self.snapshot_path = snapshot if snapshot_s > 0 else None
        self.snapshot_s = snapshot_s
        self._next_snapshot = 0  # clock() ns of the next one; 0: at the first batch, set then
        self.snapshot_ns = 0  # the training thread's time spent writing them
        self.stage_every = stage_every  # a sample of each loader's batches timed
        self.regions = regions
        self.sample_hz = sample_hz
        self.pid = os.getpid()
        self.loaders: dict[int, Loader] = {}
        # loader -> (variable name, "file.py:line", full path:line)
        self.sites: weakref.WeakKeyDictionary[Any, tuple[str, str, str]] = (
            weakref.WeakKeyDictionary()
        )
        self._by_site: dict[str, Loader] = {}
        self.current: _Pass | None = None
        # NOTE [ Regions on a short path ]: the current pass's StepLog while its regions can go
        # there directly; None: through its Profiler's timer (or not at all)
        self._log: StepLog | None = None
        # NOTE [ Regions in a sample of the steps ]: the step under way times no regions
        self._quiet = False
        # Optimizer regions open: when (None: the timer's; 0: a quiet step's, not timed)
        self._opt_starts: list[int | None] = []
        self.profiled = 0  # batches profiled so far
        self.stopped = False  # profiling over (--batches reached, or the script ended)
        self.notes: list[str] = []
        self.seen: set[str] = set()  # regions seen
        self.local = _Local()
        self.patches = Patches()  # NOTE [ Patches ] in attach/patches.py
        self._samplers: list[Any] = []
        self._nvml_started = False
        self._depth = 0  # 1 while the outermost Module call runs (the Forward region)
        self._inner = 0  # Module calls inside Forward, in the steps that timed it
        self._user_profiler = False
        self.written = False  # the outputs are out (pipeprof run's CLI)
        self.on_stop: Any = None  # called when --batches ends profiling
        self.on_job: Any = None  # called once the ranks' training is over (NOTE [ Job gather ])
        self.job_gathered = False

    # ---- the hooks ----------------------------------------------------------------------

    def install(self) -> None:
        """The import hook (and the patches at once if torch is already imported)."""
        patches: list[tuple[str, Any]] = [("torch", self._patch_torch)]
        patches += [(name, functools.partial(patch, self)) for name, patch in PATCHES]
        for name, patch in patches:
            if name in sys.modules:
                patch()
            else:
                hook = _AfterImport(name, patch, self.notes)
                sys.meta_path.insert(0, hook)
                self.patches.add(functools.partial(_remove_hook, hook))
        self._wrap_profiler_start()

    def uninstall(self) -> None:
        self.patches.undo()

    def _patch_torch(self) -> None:
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim
        from torch.utils.data import DataLoader

        from pipeprof.collect.torch.loader import Collate

        if self.sample_hz:  # the host sampler's modules load with torch's, not in the first
            _load_samplers()  # pass's iter() (the loop's time): 5-25 ms

        run = self
        orig_init, orig_iter = DataLoader.__init__, DataLoader.__iter__

        def passes(orig: Any, subclass: bool = False) -> Any:
            """``__iter__`` of DataLoader, or of a subclass that has its own, as a profiled
            pass (NOTE [ Run ])."""

            @functools.wraps(orig)
            def __iter__(loader: Any) -> Any:
                if (
                    run.stopped
                    or run.local.inside
                    or os.getpid() != run.pid  # a process the script forked
                    or isinstance(loader.collate_fn, Collate)  # a twin, iterated by a Profiler
                ):
                    return orig(loader)
                if subclass and weakable(loader) and loader not in run.sites:
                    run.remember_site(loader)  # its __init__ may not be DataLoader's
                return run.profiled_pass(loader)

            __iter__._pipeprof_passes = True  # type: ignore[attr-defined]
            return __iter__

        def own_iter(cls: type) -> None:
            """A subclass with its own ``__iter__`` (torchdata's StatefulDataLoader, whose
            ``__init__`` is not DataLoader's either): that one is patched too, once, as each
            subclass is defined (or found at install); the loader is profiled as it is (its
            wait per batch)."""
            own = vars(cls).get("__iter__")
            if own is None or getattr(own, "_pipeprof_passes", False):
                return
            self.patches.replace(cls, "__iter__", passes(own, subclass=True))

        orig_subclass = DataLoader.__dict__.get("__init_subclass__")

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if orig_subclass is not None:
                orig_subclass.__func__(cls, **kwargs)
            else:
                super(DataLoader, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            own_iter(cls)

        def subclasses(cls: type) -> Iterator[type]:
            sub: type
            for sub in cls.__subclasses__():
                yield sub
                yield from subclasses(sub)

        for sub in list(subclasses(DataLoader)):
            own_iter(sub)
        subclassing: Any = classmethod(__init_subclass__)  # type: ignore[arg-type]
        self.patches.replace(DataLoader, "__init_subclass__", subclassing)

        @functools.wraps(orig_init)  # its signature too: pipeprof's twin reads it
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(loader, *args, **kwargs)
            if not isinstance(loader.collate_fn, Collate):  # not pipeprof's own twin
                run.remember_site(loader)

        __iter__ = passes(orig_iter)

        backward: Any = torch.Tensor.backward

        @functools.wraps(backward)
        def tensor_backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if run._quiet:  # NOTE [ Regions in a sample of the steps ]
                return backward(tensor, *args, **kwargs)
            log = run._log
            if log is not None:
                run.seen.add("Backward")
                t0 = clock()
                try:
                    return backward(tensor, *args, **kwargs)
                finally:
                    log.compute_region("Backward", t0, clock() - t0)
            timer = run._timer()
            if timer is None:
                return backward(tensor, *args, **kwargs)
            run.seen.add("Backward")
            timer.start("Backward")
            try:
                return backward(tensor, *args, **kwargs)
            finally:
                timer.end("Backward")

        self.patches.replace(DataLoader, "__init__", __init__)
        self.patches.replace(DataLoader, "__iter__", __iter__)
        module_call = nn_module.Module.__call__
        compiling = torch.compiler.is_compiling
        local = self.local

        # Forward: the outermost Module call of the training step (``_forward``)
        __call__ = functools.wraps(module_call)(_forward(run, local, module_call, compiling))

        if self.regions:
            self.patches.replace(torch.Tensor, "backward", tensor_backward)
            self.patches.replace(nn_module.Module, "__call__", __call__)
            for hook in (
                optim.register_optimizer_step_pre_hook(self._optimizer_starts),
                optim.register_optimizer_step_post_hook(self._optimizer_ends),
            ):
                self.patches.add(hook.remove)
            if torch.distributed.is_available():
                patch_distributed(self)

    def comm_clock(self) -> Any:
        p = self.current
        if p is None or self.stopped or p.entry.prof is None:
            return None
        return p.entry.prof.comm_target()

    def comm_timer(self) -> Any:
        timer = self._timer()
        if timer is not None:
            self.seen.add("Comm")
        return timer

    def _wrap_profiler_start(self) -> None:
        start = Profiler.start

        def wrapped(prof: Profiler) -> Profiler:
            if not any(prof is e.prof for e in self.loaders.values()) and not self._user_profiler:
                self._user_profiler = True
                self.notes.append(
                    "the script runs its own pipeprof.Profiler: the loaders it wraps are "
                    "profiled by it (in its own report), not counted here a second time"
                )
            return start(prof)

        self.patches.replace(Profiler, "start", wrapped)

    # NOTE [ Regions on a short path ]
    # ``pipeprof run`` times Forward, Backward and Optimizer in every step. Through the
    # Profiler's timer each one took a timer's start and end, its stack, its own statistics and
    # the StepLog's classification: a few microseconds a region, three regions a step. While a
    # pass runs on the CPU clock with no NVTX ranges (a plain ``Timer`` that has not turned to
    # CUDA events), the regions go to the pass's StepLog directly (``StepLog.compute_region``):
    # two clock reads and three appends. ``_log`` is that StepLog, set with ``current`` at each
    # batch and cleared when profiling stops; else (CUDA events, NVTX) the timer's way.
    #
    # NOTE [ What the wrappers cost ]
    # Every step goes through the wrappers, timed or quiet: the outermost Module call and each one
    # inside it (counted in the timed steps, ``_inner``), ``Tensor.backward``, the optimizer's two
    # hooks. Their call-through is in neither arm of the timed steps' comparison (both arms pay it),
    # so it is stated from a probe: the quiet Forward wrapper around a no-op against the no-op
    # (``step_region_ns(quiet=True)``), for each of those calls in every step. Back to back, a probe
    # runs warm; right after the user's torch code the same frames run colder: the timed steps'
    # measured excess over their own probe, where the comparison is used, is that loop's factor (1
    # to IN_SITU_MOST), and the call-through is scaled by it (``overhead.step_regions``:
    # ``calls_per_step``, ``call_through_ns``, ``in_situ_factor``). So are the short path's frames
    # inside each fetch of the fast path (``short_frames_ns`` in collect/torch/loader.py;
    # ``meta["fast_path"]``). On issue 38's tiny step this states about 0.7 of what the step
    # measures (docs/validation/run-cost.md): what pipeprof's frames slow in the user's own torch
    # code beside them is larger than this factor says.
    #
    # NOTE [ Regions in a sample of the steps ]
    # On that short path a loader's first REGIONS_FIRST steps time their regions, then one step in
    # REGIONS_EVERY: the other steps are quiet (``_quiet``, kept on their ``_Pass`` for a pass
    # nested in them): the wrappers call straight through. In situ, right after the user's own torch
    # code, the three regions cost a tiny CPU step about 14 µs, not the 2.5 µs they cost back to
    # back (docs/validation/run-cost.md), and the user's code beside them slows too. Two things
    # follow:
    # - the regions' figures are of the timed steps; their totals are scaled to every step
    #   (``meta["step_regions"]``, analyze/loop.py), as the loader's stages are;
    # - the report states what they cost from the steps themselves: the compute of the timed
    #   steps after the first against that of the quiet ones (``StepLog.region_arm``, arms True
    #   and False), used from REGIONS_AB_MIN steps each when the difference is larger than its
    #   standard error, else their count times one region's cost measured warm.

    def _set_current(self, p: _Pass | None) -> None:
        self.current = p
        self._quiet = p is not None and p.quiet
        log = None
        prof = p.entry.prof if p is not None and not self.stopped else None
        if prof is not None and prof.plain_timer:
            log = prof.step_log
        self._log = log

    def _optimizer_starts(self, *args: Any) -> None:
        if self._quiet:  # NOTE [ Regions in a sample of the steps ]
            self._opt_starts.append(0)
        elif self._log is not None:
            self.seen.add("Optimizer")
            self._opt_starts.append(clock())
        else:
            self._opt_starts.append(None)
            self._open("Optimizer")

    def _optimizer_ends(self, *args: Any) -> None:
        t0 = self._opt_starts.pop() if self._opt_starts else None
        if t0 is None:
            self._close("Optimizer")
            return
        log = self._log
        if log is not None and t0:
            log.compute_region("Optimizer", t0, clock() - t0)

    def _timer(self) -> Any:
        p = self.current
        if p is None or self.stopped or p.entry.prof is None:
            return None
        return p.entry.prof.timer

    def _open(self, key: str) -> None:
        timer = self._timer()
        if timer is not None:
            timer.start(key)
            self.seen.add(key)

    def _close(self, key: str) -> None:
        timer = self._timer()
        if timer is not None:
            try:
                timer.end(key)
            except ValueError:  # opened before the pass began: nothing to close
                pass

    # ---- loaders --------------------------------------------------------------------------

    def remember_site(self, loader: Any, name: bool = True) -> None:
        """Where the script made ``loader``: the first frame of the user's own code, past
        pipeprof's, torch's and TensorFlow's and past installed libraries' (Lightning wraps
        ``DataLoader.__init__`` while it calls a DataModule's ``test_dataloader``: its wrapper's
        line is no one's loader). Named after the variable it was assigned to when the user's
        line made it itself, or after the Lightning hook that made it (``test_dataloader``). A
        loader a library re-makes from one of the user's (Lightning re-makes the test and
        predict loaders with its own sampler) takes that one's name and site."""
        frame = sys._getframe(2)
        first = None  # the first frame past pipeprof/torch/tensorflow: a library's, perhaps
        direct = True  # no library frame between the user's line and the loader
        while frame is not None:
            file = frame.f_code.co_filename
            if not (
                file.startswith(_PIPEPROF_DIR)
                or "/torch/" in file
                or "/tensorflow/" in file
                or frame.f_locals.get("self") is loader  # a subclass's __init__
            ):
                if not _library_frame(frame):
                    break
                first = first or frame
                held = list(frame.f_locals.values())
                if not any(v is loader for v in held):  # not a wrapper of __init__: a call
                    direct = False
                remade = self._remade_from(loader, held)
                if remade is not None:
                    self.sites[loader] = remade
                    return
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None:  # no code of the user's on the stack: the first frame there is
            frame, direct = first, True
        if frame is None:
            return
        file, line = frame.f_code.co_filename, frame.f_lineno
        site = f"{os.path.basename(file)}:{line}"
        label = ""
        if name and direct:
            match = _ASSIGNED.match(linecache.getline(file, line))
            label = match.group(1) if match else ""
        if name and not label and frame.f_code.co_name in _LIGHTNING_HOOKS:
            label = frame.f_code.co_name
        try:
            self.sites[loader] = (label, site, f"{file}:{line}")
        except TypeError:  # not weak-referenceable: labelled by its site only
            pass

    def _remade_from(self, loader: Any, held: list[Any]) -> tuple[str, str, str] | None:
        """The remembered site of a loader of ``loader``'s type that a library's frame holds
        (``held``: the one it is re-making, Lightning's ``_reinstantiate_wrapped_cls``)."""
        kind = type(loader)
        for value in held:
            if type(value) is kind and value is not loader:
                site = self.sites.get(value)
                if site is not None:
                    return site
        return None

    def _entry(self, loader: Any) -> Loader:
        entry = self.loaders.get(id(loader))
        if entry is not None and entry.loader is loader:
            return entry
        name, site, key = self.sites.get(loader, ("", "", "")) if weakable(loader) else ("",) * 3
        entry = self._by_site.get(key) if key else None
        if entry is not None and not entry.open_passes and entry.prof is not None:
            # a new loader made where the last one was (a loader per epoch): the same loop
            del self.loaders[id(entry.loader)]
            entry.prof.release(entry.loader)  # the old loader's twin goes, with its dataset
            entry.loader = loader
            self.loaders[id(loader)] = entry
            return entry
        kind = "DataLoader" if hasattr(loader, "num_workers") else "tf.data"
        label = self.unique(name or (f"{kind}@{site}" if site else kind))
        prof = Profiler(sample_hz=0, nvtx=self.nvtx, stage_every=self.stage_every)
        prof.session.meta["run_loader"] = {"label": label, "site": site}
        entry = self.register(id(loader), label, site, prof, loader)
        if key:
            self._by_site[key] = entry
        return entry

    def _snapshot(self) -> None:
        """Save the main loop's session so far (NOTE [ Snapshots ] in profiler.py)."""
        t0 = clock()
        if not self._next_snapshot:  # the first batch: the first one a little later
            self._next_snapshot = t0 + int(min(SNAPSHOT_FIRST_S, self.snapshot_s) * 1e9)
            return
        self._next_snapshot = t0 + int(self.snapshot_s * 1e9)
        used = [e for e in self.loaders.values()
                if e.prof is not None and e.session.loop and e.session.loop.steps]  # fmt: skip
        if not used or os.getpid() != self.pid or self.snapshot_path is None:
            return
        main = max(used, key=lambda e: (not e.nested_in, e.session.loop.steps))
        assert main.prof is not None
        try:
            main.prof.snapshot(self.snapshot_path, self._samplers, note=SNAPSHOT_NOTE)
        except OSError as exc:  # the run goes on; the report at the end says why
            self.snapshot_path = None
            self.notes.append(f"the snapshots stopped: {exc} (the report at the end is whole)")
        self.snapshot_ns += clock() - t0
        main.session.costs["snapshot_ns"] = self.snapshot_ns

    def unique(self, label: str) -> str:
        taken = {e.label for e in self.loaders.values()}
        base, n = label, 1
        while label in taken:
            n += 1
            label = f"{base}#{n}"
        return label

    def register(self, key: int, label: str, site: str, prof: Profiler | None, owner: Any,
                 **fields: Any) -> Loader:  # fmt: skip
        """A loader (or a framework's callback, ``prof`` None) in this run's table."""
        entry = self.loaders[key] = Loader(label, site, prof, owner, **fields)
        return entry

    def start_host_sampler(self) -> None:
        """The host sampler, started once: at the first pass or framework callback."""
        if self.sample_hz and not self._samplers:
            from pipeprof.collect.samplers import HostSampler

            self._samplers.append(HostSampler(hz=self.sample_hz).start())

    def profiled_pass(self, loader: Any) -> Any:
        """An iterator over one pass of ``loader``, profiled (NOTE [ Run ]): torch's own where it
        can be (NOTE [ The user's own iterator ] in collect/torch/loader.py), else a generator."""
        self.start_host_sampler()  # from the first pass: the loop's host
        entry = self._entry(loader)
        local = self.local
        local.inside += 1
        try:  # NOTE [ The user's own iterator ]
            steps, it, short, source = entry.prof.begin_pass(loader)  # type: ignore[union-attr]
        finally:
            local.inside -= 1
        cell: list[_Pass | None] = [None]  # the pass, once it begins
        passing = self._steps(entry, steps, cell)
        if it is None:
            return passing
        # on the instance: torch's __next__ asks the pass, or its short way past it
        it._next_data = passing.__next__
        if short is not None:
            it._next_data = self._fast(entry, source, short, it._next_data, cell)
        return it

    # NOTE [ The fast path ]
    # In the training process, most of a long pass's batches take the short path (NOTE [ The
    # short path ] in collect/torch/loader.py). Through the pass they still went through three
    # generators (this Run's pass, the Profiler's steps and the loader's pass) and the step log's
    # bookkeeping, each step: issue 38's tiny step took 28-30 µs a step longer than plain by the
    # median step, 19-24 with this path (docs/validation/run-cost.md).
    # Where torch's own iterator asks the pass (NOTE [ The user's own iterator ]), the loader's
    # pass says at each batch it yields how many of the next ones take the short path
    # (``ShortPass.left``); ``_fast`` is the iterator's ``_next_data`` and fetches those itself
    # (``ProfiledLoader.fast_next``), keeping each step as a row (asked, got, region arm) in the
    # StepLog (``fast``), with its count of steps, its regions' sampling and the batch counted as
    # the pass would. The Profiler's steps write the rows when the pass is next asked
    # (``StepLog.settle``): each step's wait is its fetch, its compute runs to the next one's.
    # The pass is asked instead, and so the step is made its way, when anything else is due: the
    # current pass changed (a loader nested in the step), a region was counted for a class in the
    # last step (the user's own regions; the rows cannot split them), DDP's communication is
    # timed, profiling stops, ``--batches`` is reached or a snapshot is due; and at the end of the
    # batches. Its own time in each ``next()`` is measured as it runs (``Loader.fast_ns``: from
    # the request to the hand-over, less the fetch and the loader's bookkeeping) and stated with
    # ``main_ns``; the frames inside each fetch, at their probe (NOTE [ What the wrappers cost ]).

    def _fast(self, entry: Loader, source: Any, short: Any, slow: Any, cell: list[Any]) -> Any:
        """The torch iterator's ``_next_data`` for a pass with a short path (NOTE [ The fast
        path ]); ``slow`` asks the pass."""
        prof: Any = entry.prof
        log: StepLog = prof.step_log
        local = self.local
        run = self
        cls = log.classified

        def next_data() -> Any:
            nonlocal cls
            t_in = clock()
            if (
                short.left
                and t_in < prof.cpu_read_at  # NOTE [ CPU training shares the cores ]
                and run._log is log
                and run.current is cell[0]
                and log.classified == cls
                and not prof.comm_timed
                and (run.batches is None or run.profiled + 1 < run.batches)
                and (run.snapshot_path is None or short.t1 < run._next_snapshot)
            ):
                k = entry.steps
                quiet = k >= REGIONS_FIRST and k % REGIONS_EVERY != 0
                pass_: Any = cell[0]
                pass_.quiet = run._quiet = quiet
                local.inside += 1
                try:
                    batch = source.fast_next(short)
                except StopIteration:  # the pass ends its way
                    pass
                else:
                    log.fast.append((short.t0, short.t1, None if k < REGIONS_FIRST else not quiet))
                    entry.steps = k + 1
                    entry.region_steps += not quiet
                    run.profiled += 1
                    # its own time in next(), but for the fetch and the loader's bookkeeping
                    entry.fast_ns += clock() - t_in - (short.t1 - short.t0) - short.own
                    return batch
                finally:
                    local.inside -= 1
            batch = slow()
            cls = log.classified
            return batch

        return next_data

    def _steps(self, entry: Loader, steps: Any, cell: list[Any] | None = None) -> Any:
        local = self.local
        p = _Pass(entry, self.current if self.current is not None else None, clock())
        if cell is not None:
            cell[0] = p
        if p.outer is not None:
            entry.nested_in.add(p.outer.entry.label)
        entry.passes += 1
        entry.open_passes += 1
        try:
            while True:
                if p.outer is not None and not p.outer.alive:
                    p.outer = None
                c = self.current
                if c is not None and c is not p and c.outer is p:
                    self._interleaved(c, p)
                local.inside += 1
                try:
                    batch = next(steps)
                except StopIteration:
                    return
                finally:
                    local.inside -= 1
                if self.current is not p or self._log is None:
                    self._set_current(p)
                log = self._log
                if log is not None:  # NOTE [ Regions in a sample of the steps ]
                    k = entry.steps
                    p.quiet = self._quiet = k >= REGIONS_FIRST and k % REGIONS_EVERY != 0
                    log.region_arm = None if k < REGIONS_FIRST else not p.quiet
                elif p.quiet:
                    p.quiet = self._quiet = False
                entry.steps += 1
                entry.region_steps += not p.quiet
                if not self.stopped:
                    self.profiled += 1
                    if not self._nvml_started:
                        self._maybe_start_nvml()
                    if self.snapshot_path is not None and clock() >= self._next_snapshot:
                        self._snapshot()
                    if self.batches is not None and self.profiled >= self.batches:
                        self.stop_profiling(f"--batches {self.batches} reached")
                        if self.on_stop is not None:
                            self.on_stop()
                yield batch
        finally:
            p.alive = False
            entry.open_passes -= 1
            local.inside += 1
            try:
                steps.close()
            finally:
                local.inside -= 1
            outer = p.outer
            if self.current is p:
                self._set_current(outer if outer is not None and outer.alive else None)
            if outer is not None and outer.alive and not self.stopped:
                # a pass inside a step of another loader: that step's time, not its compute
                outer.entry.prof.step_log.region(  # type: ignore[union-attr]
                    f"{entry.label} (pass)", p.start_ns, clock() - p.start_ns
                )

    def _interleaved(self, c: _Pass, p: _Pass) -> None:
        """Asking ``p`` for a batch while ``c``, a pass nested in it, is still running: ``zip``."""
        c.outer = None  # not nested after all: no region for it in ``p``'s steps
        note = (
            f"{c.entry.label} and {p.entry.label} were iterated together (zip): each one's "
            "compute holds the other's wait; the loop waited for both"
        )
        if note not in self.notes:
            self.notes.append(note)

    def _maybe_start_nvml(self) -> None:
        # NVML starts after the first batch: DataLoader workers have forked by then
        if self._nvml_started or not self.sample_hz:
            return
        self._nvml_started = True
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            from pipeprof.collect.ranks import local_gpu
            from pipeprof.collect.samplers import NvmlSampler

            mine = local_gpu()  # a distributed rank samples its own GPU (NOTE [ Ranks ])
            gpus = None if mine is None else [mine]
            self._samplers.append(NvmlSampler(hz=self.sample_hz, gpus=gpus).start())

    # ---- the end ----------------------------------------------------------------------------

    def end_of_job(self, why: str | None) -> None:
        """NOTE [ Job gather ]
        The ranks' reports are gathered to rank 0 over the job's own process group, once, at a
        point every rank reaches after its training collectives and before the group is gone:
        when the script destroys its default process group (profiling stops there, with a note),
        or, where it never does, when the script ends without an exception. Never at
        ``--batches`` (a rank there may still owe the others a collective: a gather would pair
        with it) nor after an exception or a signal (the other ranks may never come: torchrun
        stops them). Each rank writes its own files first, so a gather that fails loses nothing.
        ``on_job`` (the CLI's) does the writing and the gathering."""
        if self.job_gathered or self.on_job is None:
            return
        self.job_gathered = True
        if not self.stopped and why:
            self.stop_profiling(why)
        try:
            self.on_job()
        except Exception as exc:  # never into the script (it may be inside its own call)
            print(f"pipeprof: the job report could not be made ({type(exc).__name__}: {exc}); "
                  "each rank's file was written: pipeprof merge them", file=sys.stderr)

    def stop_profiling(self, why: str | None = None) -> None:
        """Stop every Profiler and the samplers: what was measured is final."""
        if self.stopped:
            return
        self.stopped = True
        self._log = None
        if why:
            self.notes.append(f"profiling stopped: {why}; the script ran on unprofiled")
        for sampler in self._samplers:
            sampler.stop()
        for entry in self.loaders.values():
            if entry.prof is not None:
                entry.prof.stop()

    def reports(self, interrupted: bool = False) -> list[tuple[Loader, Report]]:
        """One Report per loader that yielded a batch, the training loader first."""
        from pipeprof.collect.samplers import HostSampler, NvmlSampler

        self.stop_profiling()
        used = [e for e in self.loaders.values() if e.session.loop and e.session.loop.steps]
        # the training loop: not nested in another loader's steps, Keras fit(), the most steps
        used.sort(
            key=lambda e: (not e.nested_in, e.callback is not None, e.session.loop.steps),
            reverse=True,
        )
        for i, entry in enumerate(used):
            s = entry.session
            s.interrupted = s.interrupted or interrupted
            if s.loop is not None:
                self._step_costs(entry, s)
            for sampler in self._samplers:
                if isinstance(sampler, NvmlSampler):
                    s.gpu = sampler.to_dict()
                elif isinstance(sampler, HostSampler):
                    s.host = sampler.to_dict()
            if i == 0:
                s.costs["sampler_ns"] = sum(x.cpu_ns for x in self._samplers)
                s.costs["sampler_first_ns"] = sum(x.first_ns for x in self._samplers)
                s.meta["run"] = {
                    "regions_seen": sorted(self.seen),
                    "loaders": [
                        {"label": e.label, "site": e.site, "passes": e.passes,
                         "steps": e.session.loop.steps}
                        for e in used
                    ],
                }  # fmt: skip
                s.notes.extend(self.notes)
                if entry.prof is not None and entry.callback is None and "torch" in sys.modules:
                    s.notes.append(self.regions_note(Report(s)))
        return [(e, Report(e.session)) for e in used]

    def _step_costs(self, entry: Loader, s: Any) -> None:
        """What the Forward / Backward / Optimizer regions cost the steps, in how many of them
        they were timed (NOTE [ Regions in a sample of the steps ]), and what the fast path
        cost (NOTE [ The fast path ]; NOTE [ What the wrappers cost ])."""
        factor = self._step_regions(entry, s)
        fast_ns = entry.fast_ns
        if fast_ns:  # and the frames inside each fetch, as the wrappers' call-through
            from pipeprof.collect.torch.loader import short_frames_ns

            frames = short_frames_ns()
            fast_ns += int(entry.steps * frames * factor)
            s.meta["fast_path"] = {"frames_ns": round(frames, 1), "in_situ_factor": factor}
        s.costs["fast_ns"] = fast_ns

    def _step_regions(self, entry: Loader, s: Any) -> float:
        """What the Forward / Backward / Optimizer regions cost the steps, and in how many of
        them they were timed (NOTE [ Regions in a sample of the steps ]); returns the in-situ
        factor (NOTE [ What the wrappers cost ]; 1 where not measured)."""
        regions = s.loop.regions
        timed = sum(regions[k].count for k in STEP_REGIONS if k in regions)
        if not timed:
            return 1.0
        probed = timed * step_region_ns()
        on, off = entry.prof.step_log.region_ab if entry.prof is not None else ([0] * 3,) * 2
        meta: dict[str, Any] = {"steps": entry.steps, "timed_steps": entry.region_steps,
                                "first": REGIONS_FIRST, "every": REGIONS_EVERY,
                                "ab_steps": [on[0], off[0]], "probed_s": round(probed / 1e9, 6),
                                "used": False}  # fmt: skip
        timed_ns = probed
        factor = 1.0  # NOTE [ What the wrappers cost ]
        if min(on[0], off[0]) >= REGIONS_AB_MIN:
            means = [a[1] / a[0] for a in (on, off)]
            var = [max(0.0, a[2] / a[0] - m * m) / (a[0] - 1) for a, m in zip((on, off), means)]
            diff, se = means[0] - means[1], (var[0] + var[1]) ** 0.5
            meta.update({"per_step_ns": round(diff, 1), "se_ns": round(se, 1)})
            if diff > se:  # the timed steps' own excess, all in: the regions and what they displace
                timed_ns = diff * entry.region_steps
                meta["used"] = True
                factor = min(IN_SITU_MOST, max(1.0, timed_ns / probed)) if probed else 1.0
        # every step's wrappers call through, timed or quiet: the outermost Module call and
        # those inside it, the backward, the optimizer's two hooks
        seen = self.seen
        per_timed = self._inner / max(1, sum(e.region_steps for e in self.loaders.values()))
        calls = ("Forward" in seen) * (1 + per_timed) + ("Backward" in seen)
        calls += 2 * ("Optimizer" in seen)
        through = step_region_ns(quiet=True)
        through_ns = entry.steps * calls * through * factor
        meta.update({"calls_per_step": round(calls, 2), "call_through_ns": round(through, 1),
                     "in_situ_factor": round(factor, 2),
                     "call_through_s": round(through_ns / 1e9, 6)})  # fmt: skip
        s.costs["step_regions_ns"] = int(timed_ns + through_ns)
        s.meta["step_regions"] = meta
        return factor

    def regions_note(self, report: Report) -> str:
        """Which parts of compute were seen, and what the rest is."""
        seen = [k for k in ("Forward", "Backward", "Optimizer") if k in self.seen]
        missing = [k for k in ("Forward", "Backward", "Optimizer") if k not in self.seen]
        text = (
            f"regions seen without code changes: {', '.join(seen)}" if seen
            else "no Forward/Backward/Optimizer regions seen (no torch model or optimizer ran "
            "inside the loop)"
        )  # fmt: skip
        data = report.to_dict()
        sampled = (data.get("meta") or {}).get("step_regions") or {}
        steps, timed = sampled.get("steps") or 0, sampled.get("timed_steps") or 0
        if seen and 0 < timed < steps:  # NOTE [ Regions in a sample of the steps ]
            text += (
                f" (timed in {timed:,} of {steps:,} steps: the first {sampled['first']}, then 1 "
                f"in {sampled['every']}; their totals scaled to every step)"
            )
        if missing and seen:
            text += f"; not seen: {', '.join(missing)}"
        loop = data.get("loop") or {}
        compute = loop.get("compute_s") or 0.0
        regions = loop.get("regions") or {}
        inside = sum(regions[k]["total_s"] for k in seen if k in regions)
        inside -= loop.get("comm_s") or 0.0  # DDP's all-reduce waits inside Backward
        if seen and compute > 0:
            rest = max(0.0, compute - inside)
            text += (
                f". The rest of compute, {rest:.3g} s of {compute:.3g} s, is the script's own "
                "code between them: moving the batch to the device, the loss, logging, metrics "
                "(Other)"
            )
        return text


REGIONS_FIRST = 16  # NOTE [ Regions in a sample of the steps ]
REGIONS_EVERY = 8
REGIONS_AB_MIN = 8
_STEP_REGION_NS: list[float] = []
_QUIET_CALL_NS: list[float] = []
IN_SITU_MOST = 4.0  # NOTE [ What the wrappers cost ]: the in-situ factor at most


def _load_samplers() -> None:
    """The host sampler's modules, psutil among them (which it loads itself as it starts)."""
    import pipeprof.collect.samplers  # noqa: F401

    try:
        import psutil  # noqa: F401
    except ImportError:  # the sampler says so when it starts
        pass


def _forward(run: Any, local: _Local, module_call: Any, compiling: Any) -> Any:
    """``Module.__call__`` with the Forward region: the outermost Module call of the training
    step. A wrapper on Module.__call__ costs an inner call about half a microsecond; torch's
    global forward hooks cost 7 (they take every call off torch's fast path) and about 11 with
    the work a hook does (benchmarks/run_cost.py). A Module called while this thread fetches a
    batch (``local.inside``: the loader's ``next()``, so the dataset's ``__getitem__``, its
    transforms and collate with ``num_workers=0``) is the pipeline's, not the model: a
    torchvision transform is a Module, and each of its calls was a Forward of its own. ``run``
    is the Run (or, in ``step_region_ns``, what it reads of one)."""

    def __call__(module: Any, *args: Any, **kwargs: Any) -> Any:
        # a step that times no regions (NOTE [ Regions in a sample of the steps ]), inside
        # another Module, or traced by torch.compile
        if run._quiet:
            return module_call(module, *args, **kwargs)
        if run._depth:  # inside Forward: counted, for what their call-through costs
            run._inner += 1
            return module_call(module, *args, **kwargs)
        if compiling():
            return module_call(module, *args, **kwargs)
        if local.inside:  # a batch being fetched: a transform, timed as a stage
            return module_call(module, *args, **kwargs)
        log = run._log
        if log is not None:  # NOTE [ Regions on a short path ]
            run.seen.add("Forward")
            run._depth = 1
            t0 = clock()
            try:
                return module_call(module, *args, **kwargs)
            finally:
                run._depth = 0
                log.compute_region("Forward", t0, clock() - t0)
        timer = run._timer()
        if timer is None:
            return module_call(module, *args, **kwargs)
        run.seen.add("Forward")
        run._depth = 1
        timer.start("Forward")
        try:
            return module_call(module, *args, **kwargs)
        finally:
            run._depth = 0
            timer.end("Forward")

    return __call__


def step_region_ns(calls: int = 2000, quiet: bool = False) -> float:
    """Nanoseconds one Forward / Backward / Optimizer region costs a step on the short path
    (NOTE [ Regions on a short path ]): the Forward wrapper itself around a no-op, into a
    StepLog of its own, against the bare no-op calls; the median of three runs, measured once a
    process and kept (a few ms). ``quiet``: the wrapper calling straight through, as in a step
    that times none (NOTE [ Regions in a sample of the steps ])."""
    cached = _QUIET_CALL_NS if quiet else _STEP_REGION_NS
    if cached:
        return cached[0]
    from pipeprof.core.session import Session

    def noop(module: Any) -> None:
        return None

    class Host:  # what the wrapper reads of a Run
        _depth = 0
        _inner = 0
        _quiet = quiet
        _log: StepLog | None = StepLog(Session())
        seen: set[str] = set()

    def never() -> bool:
        return False

    wrapped = _forward(Host(), _Local(), noop, never)  # the Forward wrapper itself
    results = []
    for _ in range(3):
        t0 = clock()
        for _ in range(calls):
            wrapped(None)
        t1 = clock()
        for _ in range(calls):
            noop(None)
        results.append((2 * t1 - t0 - clock()) / calls)
    cached.append(max(0.0, sorted(results)[1]))
    return cached[0]


def _remove_hook(hook: Any) -> None:
    if hook in sys.meta_path:
        sys.meta_path.remove(hook)


_LIGHTNING_HOOKS = frozenset(
    {"train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"}
)
_LIBRARIES = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "keras", "torch",
                        "tensorflow", "transformers", "accelerate"})  # fmt: skip
_STDLIB = tuple(
    os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib")
    if sysconfig.get_paths().get(k)
)  # fmt: skip


def _library_frame(frame: Any) -> bool:
    """A frame of an installed library (site-packages, the standard library, a framework's
    package wherever it lives), not of the user's own code."""
    module = frame.f_globals.get("__name__") or ""
    if module.partition(".")[0] in _LIBRARIES:
        return True
    file = frame.f_code.co_filename
    return (
        "/site-packages/" in file
        or "/dist-packages/" in file
        or file.startswith("<frozen")
        or file.startswith(_STDLIB)
    )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then()`` once the module ``name`` has been imported (an import hook)."""

    def __init__(self, name: str, then: Any, notes: list[str]) -> None:
        self.name = name
        self.then = then
        self.notes = notes  # where a patch that failed is said
        self._busy = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        exec_module, hook = spec.loader.exec_module, self

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            try:
                hook.then()
            except Exception as exc:  # never the script's problem: it runs on, unprofiled there
                hook.notes.append(
                    f"pipeprof could not hook into {hook.name} ({type(exc).__name__}: {exc}): "
                    "what it runs was not profiled"
                )

        spec.loader.exec_module = exec_then  # type: ignore[method-assign,assignment]
        return spec


# ---- running the script ---------------------------------------------------------------------


def check_target(target: str, module: bool) -> None:
    """Refuse a script that does not exist or a module that cannot be found, before anything."""
    if module:
        import importlib.util

        sys.path.insert(0, os.getcwd())  # where ``python -m`` looks first (not the console
        try:  # script's own folder, which the interpreter put first)
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError) as exc:
            raise ValueError(f"-m {target}: cannot find that module ({exc})") from None
        finally:
            sys.path.remove(os.getcwd())
        if found is None:
            raise ValueError(
                f"-m {target}: no such module on sys.path (run from the folder that holds the "
                "package, or install it)"
            )
        return
    path = Path(target)
    if path.is_dir() and not (path / "__main__.py").exists():
        raise ValueError(f"{target} is a folder: give the training script (e.g. train.py)")
    if not path.exists():
        raise ValueError(f"{target}: no such script; check the path")


def execute(run: Run, target: str, module: bool, args: list[str],
            then: Callable[[BaseException | None], None] | None = None) -> BaseException | None:
    """Run the script as Python would, under ``run``; returns how it ended (None: normally;
    else its SystemExit, KeyboardInterrupt, Terminated or exception, traceback trimmed to the
    script's own frames). ``then(ended)`` runs once the script is over and pipeprof's patches
    are undone (the reports are written there), with SIGCHLD quiet (``_children_quiet``)."""
    argv, path0 = sys.argv[:], sys.path[0] if sys.path else None
    if module:
        sys.argv = [target, *args]
        sys.path[0] = os.getcwd()  # as ``python -m`` has it
    else:
        sys.argv = [target, *args]
        sys.path[0] = str(Path(target).resolve().parent)
    previous = _on_signals()
    run.install()
    ended: BaseException | None = None
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif os.path.isfile(target) and not zipfile.is_zipfile(target):
            _run_file(target)
        else:  # a folder or a zip file with a __main__.py
            runpy.run_path(os.path.abspath(target), run_name="__main__")
    except BaseException as exc:  # every ending is handed back, unchanged
        ended, seen = exc, set()
        link: BaseException | None = exc
        while link is not None and id(link) not in seen:  # its causes' tracebacks too
            seen.add(id(link))
            link.with_traceback(_script_frames(link.__traceback__))
            link = link.__cause__ or link.__context__
    finally:
        chld = _children_quiet()
        try:
            run.uninstall()
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            sys.argv = argv
            if path0 is not None:
                sys.path[0] = path0
            if then is not None:
                then(ended)
        finally:
            if chld is not None:
                signal.signal(signal.SIGCHLD, chld)
    return ended


def _children_quiet() -> Any:
    """SIGCHLD's handler, set to the default (ignored) from the script's end until the reports
    are written; None where there is none to set (not the main thread, no SIGCHLD).

    Torch's SIGCHLD handler raises in whatever runs when a worker of a loader still alive dies
    (the loader held by the ending's traceback): a worker's ``sys.exit`` (its siblings then
    stop), or SIGTERM sent to the whole process group (scancel, ``kill -TERM -PGID``). It
    raised in the undoing of the patches and in the report's writing, and no report was left
    (1 run in 12 beside two busy loops). The script is over: nothing of it needs the signal."""
    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _run_file(target: str) -> None:
    """Run a script file as ``python train.py`` does: ``__main__`` with an absolute ``__file__``
    and ``sys.argv[0]`` as typed (``runpy.run_path`` sets it to the path it is given)."""
    path = os.path.abspath(target)
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec")
    module = ModuleType("__main__")
    module.__dict__.update({"__file__": path, "__cached__": None, "__loader__": None,
                            "__package__": None, "__spec__": None,
                            "__builtins__": builtins})  # fmt: skip
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _on_signals() -> dict[int, Any]:
    """SIGTERM and SIGHUP unwind the script (outputs written on the way out), each where it has
    its default action (one the script's parent ignored, as under ``nohup``, stays ignored);
    returns the handlers replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    owner = os.getpid()

    def raise_terminated(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)  # a second one ends it at once
        if os.getpid() != owner:  # a process the script forked (a Pool's, a DataLoader's
            os.kill(os.getpid(), signum)  # worker): ends as it would without us,
            signal.pause()  # pragma: no cover  (no flush: its buffers are the parent's too)
        raise Terminated(signum)

    return {signum: signal.signal(signum, raise_terminated) for signum in ENDING_SIGNALS
            if signal.getsignal(signum) is signal.SIG_DFL}  # fmt: skip


def _script_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without pipeprof's frames and runpy's: from the script's first frame on,
    and without the frames of pipeprof's wrappers the script's call went through (a loader's
    ``__next__``), as without pipeprof. A failure before the script ran keeps them all."""
    kept: list[TracebackType] = []
    t = tb
    while t is not None:
        file = t.tb_frame.f_code.co_filename
        ours = file.startswith(_PIPEPROF_DIR) or file == runpy.__file__ or "<frozen" in file
        if not ours or (kept and not file.startswith(_PIPEPROF_DIR)):
            kept.append(t)
        t = t.tb_next
    if not kept:
        return tb
    for a, b in itertools.pairwise(kept):
        a.tb_next = b
    kept[-1].tb_next = None
    return kept[0]


def end_like(ended: BaseException | None) -> int:
    """End as the script would have: its exit status, its traceback, its signal."""
    if ended is None:
        return 0
    if isinstance(ended, SystemExit):
        raise SystemExit(ended.code)  # Python prints a message for a non-int code, as ever
    if isinstance(ended, Terminated):
        _die_by(ended.signum)
    sys.excepthook(type(ended), ended, ended.__traceback__)
    if isinstance(ended, KeyboardInterrupt):
        _die_by(signal.SIGINT)
    return 1


def _die_by(signum: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    signal.pause()  # pragma: no cover - the signal ends the process


def summary_lines(reports: list[tuple[Loader, Report]], paths: dict[str, str]) -> list[str]:
    """One line per loader, for the summary after the main report."""
    lines = []
    for i, (entry, report) in enumerate(reports):
        d = report.to_dict()
        loop = d.get("loop") or {}
        role = "main loop" if i == 0 else (
            f"inside {', '.join(sorted(entry.nested_in))}" if entry.nested_in else "another loop"
        )  # fmt: skip
        where = f" ({entry.site})" if entry.site and entry.site not in entry.label else ""
        saved = f"; saved to {paths[entry.label]}" if entry.label in paths else ""
        lines.append(
            f"{entry.label}{where}, {role}: {entry.passes} pass(es), {loop.get('steps', 0)} "
            f"steps, waited {100 * (loop.get('wait_fraction') or 0):.1f}% of its loop's time"
            f"{saved}"
        )
    return lines
