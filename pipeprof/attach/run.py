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
import os
import runpy
import signal
import sys
import threading
import weakref
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from pipeprof.attach.labels import PIPEPROF_DIR, Loader, Loaders
from pipeprof.attach.live import LiveView
from pipeprof.attach.passes import Inside
from pipeprof.attach.patches import PATCHES, Patches
from pipeprof.attach.regions import REGIONS_EVERY, REGIONS_FIRST, StepRegions
from pipeprof.collect.live import gpu_readings
from pipeprof.collect.loop import HANG_S, StepLog
from pipeprof.core.recorder import STAGE_EVERY, clock
from pipeprof.profiler import Profiler
from pipeprof.report import Report

# NOTE [ Snapshots ] in profiler.py: ``pipeprof run`` saves the main loop's session to its ``-o``
# file every SNAPSHOT_S seconds (the first SNAPSHOT_FIRST_S after the first batch), so that a
# SIGKILL or the OOM killer leaves the last one; the report at the end replaces it.
SNAPSHOT_S = 30.0
SNAPSHOT_FIRST_S = 5.0
SNAPSHOT_NOTE = ("a snapshot of a run still going: pipeprof run saves one every --snapshot-s "
                 "seconds, and the report at the end replaces it. This one was left, so the run "
                 "ended without writing its report (killed: SIGKILL, the OOM killer, a node "
                 "failure), or is still going")  # fmt: skip


class EndScript(SystemExit):
    """Ends the script from inside its loop, with status 0: ``pipeprof run --end-script`` once
    ``--batches`` are profiled, and each trial of ``pipeprof tune`` (attach/trial.py)."""

    def __init__(self) -> None:
        super().__init__(0)


class Terminated(BaseException):
    """Raised in the script by SIGTERM or SIGHUP (``signum``) so that it unwinds and the outputs
    get written; the process then ends by that signal."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The signals that end a script by default and unwind it under ``pipeprof run`` (``_on_signals``).
ENDING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@dataclass
class _Pass:
    entry: Loader
    outer: _Pass | None
    start_ns: int
    alive: bool = True
    quiet: bool = False  # its step under way times no regions (NOTE [ Regions in a sample ...])


# NOTE [ The fast path ]
# In the training process, most of a long pass's batches take the short path (NOTE [ The
# short path ] in collect/torch/loader.py). Through the pass they still went through three
# generators (this Run's pass, the Profiler's steps and the loader's pass) and the step log's
# bookkeeping, each step: issue 38's tiny step took 28-30 µs a step longer than plain by the
# median step, 19-24 with this path (docs/validation/run-cost.md).
# Where torch's own iterator asks the pass (NOTE [ The user's own iterator ]), the loader's
# pass says at each batch it yields how many of the next ones take the short path
# (``ShortPass.left``); ``_fast`` is the iterator's ``_next_data`` and fetches those itself
# (``ProfiledLoader.fast_next``), keeping each step as a row (asked, got, region arm, starved
# part) in the StepLog (``fast``), with its count of steps, its regions' sampling and the batch
# counted as the pass would. A worker loader's pass says so too, for its batches past the first
# ``num_workers`` (NOTE [ Workers' batches, past the generators ] in collect/torch/loader.py).
# The Profiler's steps write the rows when the pass is next asked (``StepLog.settle``): each
# step's wait is its fetch (its starved part as the worker said), its compute runs to the next
# one's.
# The pass is asked instead, and so the step is made its way, when anything else is due: the
# current pass changed (a loader nested in the step), a region was counted for a class in the
# last step (the user's own regions; the rows cannot split them), DDP's communication is
# timed, profiling stops, ``--batches`` is reached or a snapshot is due; and at the end of the
# batches. Its own time in each ``next()`` is measured as it runs (``Loader.fast_ns``: from
# the request to the hand-over, less the fetch and the loader's bookkeeping) and stated with
# ``main_ns``; the frames inside each fetch, at their probe (NOTE [ What the wrappers cost ]).


class RunSamplers:
    """The run's samplers, shared by its loaders' reports: the host's from the first pass (or
    framework callback), NVML's after the first batch (DataLoader workers have forked by then).

    Args:
        hz: samples a second; 0: none.
    """

    def __init__(self, hz: float) -> None:
        self.hz = hz
        self.running: list[Any] = []
        self.nvml_started = False

    def prepare(self) -> None:
        """Make the host sampler's source before the script runs (``host.prepare``)."""
        if self.hz:
            from pipeprof.collect.samplers.host import prepare

            prepare()

    def start_host(self) -> None:
        """The host sampler, started once."""
        if self.hz and not self.running:
            from pipeprof.collect.samplers import HostSampler

            self.running.append(HostSampler(hz=self.hz).start())

    def start_nvml(self) -> None:
        """NVML's sampler, once, where torch sees a GPU."""
        if self.nvml_started or not self.hz:
            return
        self.nvml_started = True
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            from pipeprof.collect.ranks import local_gpu
            from pipeprof.collect.samplers import NvmlSampler

            mine = local_gpu()  # a distributed rank samples its own GPU (NOTE [ Ranks ])
            gpus = None if mine is None else [mine]
            self.running.append(NvmlSampler(hz=self.hz, gpus=gpus).start())

    def stop(self) -> None:
        for sampler in self.running:
            sampler.stop()

    def into(self, s: Any, costs: bool) -> None:
        """Their series into the session ``s``, and (``costs``: the main report's) their CPU."""
        from pipeprof.collect.samplers import HostSampler, NvmlSampler

        for sampler in self.running:
            if isinstance(sampler, NvmlSampler):
                s.gpu = sampler.to_dict()
            elif isinstance(sampler, HostSampler):
                s.host = sampler.to_dict()
        if costs:
            s.costs["sampler_ns"] = sum(x.cpu_ns for x in self.running)
            s.costs["sampler_first_ns"] = sum(x.first_ns for x in self.running)


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
        hang_s: float = HANG_S,
        live: bool = False,
        metrics_port: str | None = None,
        end_script: bool = False,
    ) -> None:
        self.batches = batches
        self.end_script = end_script  # --end-script: EndScript once ``batches`` are profiled
        self.metrics_port = metrics_port  # attach/metrics.py: served from the first pass
        self.metrics: Any = None
        self.live: Any = live  # NOTE [ The live view ] in collect/live.py: True, then the view
        self.hang_s = hang_s  # NOTE [ Hangs ] in collect/torch/hangs.py
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
        self.loaders = Loaders()  # what the script made and iterated (attach/labels.py)
        self.current: _Pass | None = None
        # Forward / Backward / Optimizer of the current pass's step (attach/regions.py)
        self.step = StepRegions(self._timer)
        self.profiled = 0  # batches profiled so far
        self.stopped = False  # profiling over (--batches reached, or the script ended)
        # NOTE [ Persistent workers past the profile ] in attach/patches.py: each loader's twin
        # whose persistent workers its later passes go on with once profiling stopped
        self.kept: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.notes: list[str] = []
        self.maps: list[dict[str, Any]] = []  # Hugging Face ``Dataset.map`` calls (patch_datasets)
        self.local = Inside()  # attach/passes.py
        self.patches = Patches()  # NOTE [ Patches ] in attach/patches.py
        self.samplers = RunSamplers(sample_hz)
        self._user_profiler = False
        self.written = False  # the outputs are out (pipeprof run's CLI)
        self.on_stop: Any = None  # called when --batches ends profiling
        self.on_job: Any = None  # called once the ranks' training is over (NOTE [ Job gather ])
        self.job_gathered = False

    # ---- the hooks ----------------------------------------------------------------------

    def install(self) -> None:
        """The import hook (and the patches at once if torch is already imported)."""
        for name, patch in PATCHES:
            if name in sys.modules:
                patch(self)
            else:
                hook = _AfterImport(name, functools.partial(patch, self), self.notes)
                sys.meta_path.insert(0, hook)
                self.patches.add(functools.partial(_remove_hook, hook))
        self._wrap_profiler_start()
        self.samplers.prepare()

    def uninstall(self) -> None:
        self.patches.undo()

    def comm_clock(self) -> Any:
        p = self.current
        if p is None or self.stopped or p.entry.prof is None:
            return None
        return p.entry.prof.comm_target()

    def comm_timer(self) -> Any:
        timer = self._timer()
        if timer is not None:
            self.step.seen.add("Comm")
        return timer

    def _timer(self) -> Any:
        p = self.current
        if p is None or self.stopped or p.entry.prof is None:
            return None
        return p.entry.prof.timer

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

    def _set_current(self, p: _Pass | None) -> None:
        self.current = p
        self.step.quiet = p is not None and p.quiet
        log = None
        prof = p.entry.prof if p is not None and not self.stopped else None
        if prof is not None and prof.plain_timer:
            log = prof.step_log
        self.step.log = log

    # ---- loaders --------------------------------------------------------------------------

    def _snapshot(self) -> None:
        """Save the main loop's session so far (NOTE [ Snapshots ] in profiler.py)."""
        t0 = clock()
        if not self._next_snapshot:  # the first batch: the first one a little later
            self._next_snapshot = t0 + int(min(SNAPSHOT_FIRST_S, self.snapshot_s) * 1e9)
            return
        self._next_snapshot = t0 + int(self.snapshot_s * 1e9)
        main = self._save_snapshot()
        if main is not None:
            self.snapshot_ns += clock() - t0
            main.session.costs["snapshot_ns"] = self.snapshot_ns

    def _hang_snapshot(self) -> None:
        """A loader's hang was recorded (NOTE [ Hangs ] in collect/torch/hangs.py), from the
        watchdog's thread while the loop waits: the main loop's snapshot, now (a loop stuck
        before its first step included)."""
        self._save_snapshot(stepped=False)

    def _save_snapshot(self, stepped: bool = True) -> Loader | None:
        """The main loop's session saved to ``--out`` (``stepped``: of the loops with steps);
        its entry, or None where none was saved."""
        used = [e for e in self.loaders.values() if e.prof is not None
                and (not stepped or (e.session.loop and e.session.loop.steps))]  # fmt: skip
        if not used or os.getpid() != self.pid or self.snapshot_path is None:
            return None
        main = max(used, key=lambda e: (not e.nested_in,
                                        e.session.loop.steps if e.session.loop else 0))  # fmt: skip
        assert main.prof is not None
        try:
            main.prof.snapshot(self.snapshot_path, self.samplers.running, note=SNAPSHOT_NOTE)
        except OSError as exc:  # the run goes on; the report at the end says why
            self.snapshot_path = None
            self.notes.append(f"the snapshots stopped: {exc} (the report at the end is whole)")
        return main

    def _profiler(self, label: str, site: str) -> Profiler:
        """A new loader's own Profiler (NOTE [ Run ])."""
        prof = Profiler(sample_hz=0, nvtx=self.nvtx, stage_every=self.stage_every,
                        hang_s=self.hang_s)  # fmt: skip
        prof.on_hang = self._hang_snapshot
        prof.session.meta["run_loader"] = {"label": label, "site": site}
        return prof

    def profiled_pass(self, loader: Any) -> Any:
        """An iterator over one pass of ``loader``, profiled (NOTE [ Run ]): torch's own where it
        can be (NOTE [ The user's own iterator ] in collect/torch/loader.py), else a generator."""
        self.samplers.start_host()  # from the first pass: the loop's host
        if self.metrics_port is not None and self.metrics is None:
            from pipeprof.attach.metrics import serve

            self.metrics = serve(self.metrics_port, self._live_loaders, self._gpu_latest,
                                 self.notes) or False  # fmt: skip
        if self.live is True:  # the live panel, from the first pass (attach/live.py)
            self.live = LiveView(self._live_loaders, self._gpu_latest)
            self.live = self.live if self.live.start() else None
        entry = self.loaders.entry(loader, self._profiler)
        prof: Any = entry.prof  # NOTE [ The user's own iterator ]
        steps, it, short, source = self.local.call(prof.begin_pass, loader)
        cell: list[_Pass | None] = [None]  # the pass, once it begins
        passing = self._steps(entry, steps, cell)
        if it is None:
            return passing
        # on the instance: torch's __next__ asks the pass, or its short way past it
        it._next_data = passing.__next__
        if short is not None:
            it._next_data = self._fast(entry, source, short, it._next_data, cell)
        return it

    def _fast(self, entry: Loader, source: Any, short: Any, slow: Any, cell: list[Any]) -> Any:
        """The torch iterator's ``_next_data`` for a pass with a short path (NOTE [ The fast
        path ]); ``slow`` asks the pass."""
        prof: Any = entry.prof
        log: StepLog = prof.step_log
        local = self.local
        run = self
        regions = self.step
        cls = log.classified

        def next_data() -> Any:
            nonlocal cls
            t_in = clock()
            if (
                short.left
                and t_in < prof.cpu_read_at  # NOTE [ CPU training shares the cores ]
                and regions.log is log
                and run.current is cell[0]
                and log.classified == cls
                and not prof.comm_timed
                and (run.batches is None or run.profiled + 1 < run.batches)
                and (run.snapshot_path is None or short.t1 < run._next_snapshot)
            ):
                k = entry.steps
                quiet = k >= REGIONS_FIRST and k % REGIONS_EVERY != 0
                pass_: Any = cell[0]
                pass_.quiet = regions.quiet = quiet
                local.inside += 1
                try:
                    batch = source.fast_next(short)
                except StopIteration:  # the pass ends its way
                    pass
                else:
                    arm = None if k < REGIONS_FIRST else not quiet
                    log.fast.append((short.t0, short.t1, arm, short.starved))
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
        regions = self.step
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
                try:
                    batch = local.next(steps)
                except StopIteration:
                    return
                if self.current is not p or regions.log is None:
                    self._set_current(p)
                log = regions.log
                if log is not None:  # NOTE [ Regions in a sample of the steps ]
                    k = entry.steps
                    p.quiet = regions.quiet = k >= REGIONS_FIRST and k % REGIONS_EVERY != 0
                    log.region_arm = None if k < REGIONS_FIRST else not p.quiet
                elif p.quiet:
                    p.quiet = regions.quiet = False
                entry.steps += 1
                entry.region_steps += not p.quiet
                if not self.stopped:
                    self.profiled += 1
                    if not self.samplers.nvml_started:
                        self.samplers.start_nvml()
                    if self.snapshot_path is not None and clock() >= self._next_snapshot:
                        self._snapshot()
                    if self.batches is not None and self.profiled >= self.batches:
                        self.stop_profiling(f"--batches {self.batches} reached")
                        if self.on_stop is not None:
                            self.on_stop()
                        if self.end_script:
                            raise EndScript()
                # NOTE [ A suspended pass holds no batch ] in collect/torch/loader.py
                held, batch = [batch], None
                yield held.pop()
        finally:
            p.alive = False
            entry.open_passes -= 1
            local.close(steps)
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

    def _live_loaders(self) -> list[Any]:
        return [lo for e in list(self.loaders.values()) if e.prof is not None
                for lo in e.prof.loaders]  # fmt: skip

    def _gpu_latest(self) -> list[tuple[Any, Any]]:
        return gpu_readings(self.samplers.running)

    def stop_profiling(self, why: str | None = None) -> None:
        """Stop every Profiler and the samplers: what was measured is final."""
        if self.stopped:
            return
        self.stopped = True
        if self.live not in (None, True, False):  # the panel goes before anything prints
            self.live.stop()
            self.live = None
        if self.metrics:
            self.metrics.stop()
            self.metrics = False
        self.step.log = None
        if why:
            self.notes.append(f"profiling stopped: {why}; the script ran on unprofiled")
        self.samplers.stop()
        for entry in self.loaders.values():
            if entry.prof is not None:
                self._keep_workers(entry.prof.loaders)
                entry.prof.stop()

    def _keep_workers(self, twins: list[Any]) -> None:
        """NOTE [ Persistent workers past the profile ] in attach/patches.py."""
        for twin in twins:
            kept = getattr(twin, "loader", None)
            # ``is not None``: an iterator's truth is its len(), which a stream may not have
            it = getattr(kept, "_iterator", None)
            if getattr(kept, "persistent_workers", False) and it is not None:
                self.kept[twin.user_loader] = kept

    def kept_workers(self, loader: Any) -> Any:
        """The twin DataLoader whose persistent workers ``loader``'s passes go on with now that
        profiling stopped, or None."""
        try:
            return self.kept.get(loader)
        except TypeError:
            return None

    def reports(self, interrupted: bool = False) -> list[tuple[Loader, Report]]:
        """One Report per loader that yielded a batch, the training loader first."""
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
                region_steps = sum(e.region_steps for e in self.loaders.values())
                self.step.step_costs(entry, s, region_steps)
            self.samplers.into(s, costs=i == 0)
            if i == 0:
                s.meta["run"] = {
                    "regions_seen": sorted(self.step.seen),
                    "loaders": [
                        {"label": e.label, "site": e.site, "passes": e.passes,
                         "steps": e.session.loop.steps}
                        for e in used
                    ],
                    "maps": self.maps,
                }  # fmt: skip
                s.notes.extend(self.notes)
                if entry.prof is not None and entry.callback is None and "torch" in sys.modules:
                    s.notes.append(self.step.note(Report(s)))
        return [(e, Report(e.session)) for e in used]

def _remove_hook(hook: Any) -> None:
    if hook in sys.meta_path:
        sys.meta_path.remove(hook)


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
        ours = file.startswith(PIPEPROF_DIR) or file == runpy.__file__ or "<frozen" in file
        if not ours or (kept and not file.startswith(PIPEPROF_DIR)):
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
