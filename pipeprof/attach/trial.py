"""One trial of ``pipeprof tune`` (docs/tune.md): the script run as Python runs it, with settings
applied to one DataLoader where the script makes it, that loader's rate measured, and the script
ended once enough batches came.

    python -m pipeprof.attach.trial SPEC.json script.py [its arguments]

SPEC is JSON: ``site`` (the loader's ``file.py:line``, as ``pipeprof run`` labels it),
``settings`` (the knobs below), ``batches``, ``warmup``, ``floor`` (samples/s; None) and
``out``, where the result goes as JSON as soon as it is known.

NOTE [ A trial ]
Nothing else of pipeprof runs: no profile, no sampler, no region. The loader made at ``site``
gets the settings as arguments of its ``DataLoader(...)`` call (bound to torch's signature,
positional ones too), and its passes are counted as the training loop takes their batches: the
rate is the samples of batches ``warmup + 1`` to ``batches`` over the wall time from batch
``warmup`` to the last, so the first workers' start is left out, and every later epoch's start
(what ``persistent_workers`` saves) is in. At the last batch, or halfway when the rate so far is
under ``floor`` (clearly worse than the best trial so far: stopped early), the result is written
and ``EndScript`` (a ``SystemExit`` with status 0) ends the script from inside its loop, so
that its loaders shut their workers down as they do at any exit.

Process-wide knobs are set where the proposed edit sets them (attach/edit.py), just before the
loader is made: ``torch_threads`` (``torch.set_num_threads``) and ``sharing_strategy``
(``torch.multiprocessing.set_sharing_strategy``). ``worker_threads`` sets torch's and OpenCV's
thread counts in each worker (a ``worker_init_fn`` around the script's own).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import time
import weakref
from typing import Any

from pipeprof.analyze.tune import LOADER_KNOBS, WITHOUT_WORKERS
from pipeprof.attach.labels import Loaders
from pipeprof.attach.patches import Patches, each_subclass
from pipeprof.attach.run import EndScript, _AfterImport, _remove_hook, check_target, execute
from pipeprof.core.batch import batch_size


class WorkerInit:
    """A worker's ``worker_init_fn``: torch's and OpenCV's thread counts, the cold page cache,
    then the script's own function (picklable, for spawn)."""

    def __init__(self, threads: int | None, cold: str | None, then: Any) -> None:
        self.threads, self.cold, self.then = threads, cold, then

    def __call__(self, worker_id: int) -> None:
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
            cv2 = sys.modules.get("cv2")
            if cv2 is not None:
                cv2.setNumThreads(self.threads)
        if self.cold:
            cold_reads(self.cold)
        if self.then is not None:
            self.then(worker_id)


class Nothing:
    """A worker's collate that hands over nothing: the batch is made, then dropped, after each
    worker's first ``keep`` (the ladder's hand-over rung; the training process replays those)."""

    def __init__(self, collate: Any, keep: int = 2) -> None:
        self.collate, self.keep, self.made = collate, keep, 0

    def __call__(self, samples: Any) -> Any:
        batch = self.collate(samples)
        self.made += 1
        return batch if self.made <= self.keep else None


# NOTE [ A cold page cache ]
# In a "cold" trial every file opened for reading, outside Python's own installation, is first
# dropped from the page cache (``posix_fadvise(DONTNEED)``: no root needed; pages another
# process maps stay), so each read comes from the disk as on a first epoch over a dataset larger
# than the RAM. Seen through Python's audit hook ("open"): files Python opens (``open``, PIL,
# NumPy, pandas); not those a C library opens itself (h5py, torchvision's ``read_file``).
_COLD: dict[str, Any] = {"on": False, "busy": False, "opens": 0, "dir": None}
_SKIP = ("/proc/", "/sys/", "/dev/", sys.prefix, sys.base_prefix)


def cold_reads(folder: str) -> None:
    """From now on, this process reads cold; the first file it drops leaves a mark in
    ``folder`` (a file named after its pid), so the trial knows whether any process read one."""
    if not _COLD["on"]:
        _COLD["on"], _COLD["dir"] = True, folder
        sys.addaudithook(_cold_open)


def _cold_open(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or _COLD["busy"] or len(args) < 3:
        return
    path, mode, flags = args[:3]
    if not isinstance(path, (str, bytes)):
        return
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return
    if isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR):
        return
    name = os.fsdecode(path)
    if name.startswith(_SKIP) or name.endswith((".py", ".pyc", ".so")):
        return
    _COLD["busy"] = True
    try:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            _COLD["opens"] += 1
            if _COLD["opens"] == 1:
                with open(os.path.join(_COLD["dir"], str(os.getpid())), "w"):
                    pass
        finally:
            os.close(fd)
    except OSError:
        pass
    finally:
        _COLD["busy"] = False


def loader_arguments(bound: dict[str, Any], settings: dict[str, Any],
                     mode: str | None = None, cold: str | None = None) -> dict[str, Any]:
    """The DataLoader call's arguments with ``settings`` applied, kept valid for torch (no
    workers: WITHOUT_WORKERS). ``mode``: a rung of the ceiling ladder (NOTE [ The ceiling
    ladder ] in analyze/tune.py)."""
    out = dict(bound)
    for knob in LOADER_KNOBS:
        if knob in settings:
            out[knob] = settings[knob]
    if not out.get("num_workers"):
        out.update({k: v for k, v in WITHOUT_WORKERS.items() if k in out})
    threads = settings.get("worker_threads")
    if out.get("num_workers") and (threads is not None or mode == "cold"):
        folder = cold if mode == "cold" else None
        out["worker_init_fn"] = WorkerInit(threads, folder, out.get("worker_init_fn"))
    if mode == "nothing" and out.get("num_workers"):
        from torch.utils.data import default_collate

        out["collate_fn"] = Nothing(out.get("collate_fn") or default_collate)
    return out


class Meter:
    """The target loader's batches, counted as the loop takes them (NOTE [ A trial ])."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.batches = int(spec["batches"])
        self.warmup = min(int(spec.get("warmup", 5)), self.batches - 1)
        self.floor = spec.get("floor")
        self.out = spec["out"]
        self.seen = 0
        self.samples = 0
        self.passes = 0
        self.t_begin = time.perf_counter()
        self.t_warm: float | None = None
        self.t_last: float | None = None  # the last batch's arrival
        self.first_batch_s: float | None = None
        self.written = False
        self.mode = spec.get("mode")  # None, or a rung of the ladder: replay, nothing, cold
        self.cold = spec["out"] + ".cold"  # the processes that read cold mark themselves here
        if self.mode == "cold":
            os.makedirs(self.cold, exist_ok=True)
            for mark in os.listdir(self.cold):  # an earlier trial's
                os.remove(os.path.join(self.cold, mark))
        self.cache: list[Any] = []  # the warm-up's batches, replayed by "replay" and "nothing"
        self.replayed = 0  # batches the loop got from the cache

    def rate(self, now: float) -> float | None:
        if self.t_warm is None or now <= self.t_warm or not self.samples:
            return None
        return self.samples / (now - self.t_warm)

    def tick(self, batch: Any) -> None:
        now = self.t_last = time.perf_counter()
        self.seen += 1
        if self.first_batch_s is None:
            self.first_batch_s = now - self.t_begin
        if self.seen == self.warmup or (self.warmup == 0 and self.t_warm is None):
            self.t_warm = now
        elif self.seen > self.warmup:
            self.samples += batch_size(batch)
        if self.seen >= self.batches:
            self.finish("done", now)
        halfway = self.warmup + max(1, (self.batches - self.warmup) // 2)
        if self.floor and self.seen == halfway:
            rate = self.rate(now)
            if rate is not None and rate < self.floor:
                self.finish("stopped early", now)

    def finish(self, ended: str, now: float | None = None, error: str | None = None) -> None:
        if not self.written:
            now = now or self.t_last or time.perf_counter()  # the script's end: its last batch
            rate = self.rate(now)
            result = {"ended": ended, "samples_per_s": rate, "batches": self.seen,
                      "samples": self.samples, "passes": self.passes,
                      "wall_s": now - self.t_warm if self.t_warm else None,
                      "first_batch_s": self.first_batch_s, "error": error, "mode": self.mode,
                      "replayed": self.replayed,
                      "cold_processes": len(os.listdir(self.cold))
                      if self.mode == "cold" else None}  # fmt: skip
            with open(self.out, "w", encoding="utf-8") as f:
                json.dump(result, f)
            self.written = True
        if ended in ("done", "stopped early"):
            raise EndScript()


class Metered:
    """A pass over the target loader: its iterator, each batch counted."""

    def __init__(self, it: Any, meter: Meter) -> None:
        self._it, self._meter = it, meter

    def __iter__(self) -> Metered:
        return self

    def __next__(self) -> Any:
        meter = self._meter
        mode = meter.mode
        if mode == "replay" and meter.cache and meter.seen >= meter.warmup:
            batch = meter.cache[meter.seen % len(meter.cache)]  # compute alone: no loading
            meter.replayed += 1
        else:
            batch = next(self._it)
            if batch is None and mode == "nothing" and meter.cache:  # the workers sent nothing
                batch = meter.cache[meter.seen % len(meter.cache)]
                meter.replayed += 1
            elif mode in ("replay", "nothing") and len(meter.cache) < max(1, meter.warmup):
                meter.cache.append(batch)
        meter.tick(batch)
        return batch

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


class Trial:
    """What ``execute`` installs around the script for one trial."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.settings: dict[str, Any] = spec.get("settings") or {}
        self.site = spec["site"]
        self.meter = Meter(spec)
        self.patches = Patches()
        self.loaders = Loaders()
        self.targets: weakref.WeakSet[Any] = weakref.WeakSet()  # the loaders made at the site
        self.iterating = False  # inside a metered __iter__ (a subclass's calling torch's)
        self.notes: list[str] = []

    def install(self) -> None:
        if self.meter.mode == "cold":  # this process's reads (workers: WorkerInit, or forked)
            cold_reads(self.meter.cold)
        if "torch" in sys.modules:
            self.patch_torch()
        else:
            hook = _AfterImport("torch", self.patch_torch, self.notes)
            sys.meta_path.insert(0, hook)
            self.patches.add(functools.partial(_remove_hook, hook))

    def uninstall(self) -> None:
        self.patches.undo()

    def patch_torch(self) -> None:
        """``__init__`` and ``__iter__`` of DataLoader and of each subclass with its own (as
        torchdata's StatefulDataLoader, whose own do not call torch's): found now, and as each
        is defined."""
        from torch.utils.data import DataLoader

        self.patch_class(DataLoader)
        each_subclass(self.patches, DataLoader, self.patch_class)

    def patch_class(self, cls: type) -> None:
        own_init, own_iter = vars(cls).get("__init__"), vars(cls).get("__iter__")
        if own_init is not None and not getattr(own_init, "_pipeprof_trial", False):
            self.patches.replace(cls, "__init__", self.made(own_init))
        if own_iter is not None and not getattr(own_iter, "_pipeprof_trial", False):
            self.patches.replace(cls, "__iter__", self.passes(own_iter))

    def made(self, orig: Any) -> Any:
        """An ``__init__`` that applies the settings to the loader made at the trial's site."""
        import torch

        signature = inspect.signature(orig)
        takes = {n for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD}
        open_ended = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        trial = self

        @functools.wraps(orig)
        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            trial.loaders.remember_site(loader, name=False)
            where = trial.loaders.sites.get(loader)
            if where is None or where[1] != trial.site:
                orig(loader, *args, **kwargs)
                return
            settings = trial.settings  # where the proposed edit puts them (attach/edit.py)
            if "sharing_strategy" in settings:
                mp = torch.multiprocessing
                mp.set_sharing_strategy(settings["sharing_strategy"])  # type: ignore[no-untyped-call]
            if "torch_threads" in settings:
                torch.set_num_threads(int(settings["torch_threads"]))
            bound = signature.bind(loader, *args, **kwargs)
            bound.apply_defaults()
            given = {k: v for k, v in bound.arguments.items() if k in takes}
            meter = trial.meter
            wanted = loader_arguments(given, settings, meter.mode, meter.cold)
            for name, value in wanted.items():
                if name in takes:
                    bound.arguments[name] = value
                elif open_ended:  # a subclass's **kwargs, passed on to torch's
                    bound.arguments.setdefault(next(n for n, p in signature.parameters.items()
                                                    if p.kind is p.VAR_KEYWORD), {})[name] = value
            orig(*bound.args, **bound.kwargs)
            trial.targets.add(loader)

        __init__._pipeprof_trial = True  # type: ignore[attr-defined]
        return __init__

    def passes(self, orig: Any) -> Any:
        """An ``__iter__`` whose passes over the trial's loader are metered (once: a subclass's
        own calling torch's is one pass)."""
        trial = self

        @functools.wraps(orig)
        def __iter__(loader: Any) -> Any:
            if loader not in trial.targets or trial.iterating:
                return orig(loader)
            trial.iterating = True
            try:
                it = orig(loader)
            finally:
                trial.iterating = False
            trial.meter.passes += 1
            return Metered(it, trial.meter)

        __iter__._pipeprof_trial = True  # type: ignore[attr-defined]
        return __iter__


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m pipeprof.attach.trial SPEC.json script.py [args]", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    target, args = argv[1], argv[2:]
    module = target == "-m"
    if module:
        target, args = args[0], args[1:]
    check_target(target, module)
    trial = Trial(spec)
    ended = execute(trial, target, module, args)  # type: ignore[arg-type]
    meter = trial.meter
    if meter.written:
        return 0
    if not trial.targets:
        why = f"the script made no DataLoader at {trial.site}"
        meter.finish("no loader", error=why)
        return 3
    if ended is None or (isinstance(ended, SystemExit) and ended.code in (None, 0)):
        meter.finish("script ended")  # a script shorter than the trial: what it ran
        return 0
    meter.finish("failed", error=f"{type(ended).__name__}: {ended}")
    if not isinstance(ended, SystemExit):
        import traceback

        traceback.print_exception(type(ended), ended, ended.__traceback__)
    return 1


if __name__ == "__main__":  # run as pipeprof.attach.trial, so that spawn workers can unpickle
    from pipeprof.attach import trial  # its worker_init_fn and collate (not from __main__)

    sys.exit(trial.main(sys.argv[1:]))
