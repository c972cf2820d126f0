"""The patches ``pipeprof run`` installs, and their undoing (NOTE [ Run ] in attach/run.py).

NOTE [ Patches ]
Each patch is a function of the ``Run``, called once the module it patches has been imported
(``PATCHES``: the run's import hook waits for it; a script that never imports a framework pays
nothing for it). A patch replaces public seams of the framework's classes and pushes how to put
them back on the run's ``Patches``, which undoes them all in the reverse order when the script
ends. One function per framework:

1. torch: ``patch_torch`` (``DataLoader``; with the step's regions of attach/regions.py,
   ``Tensor.backward``, the outermost ``Module`` call, the optimizer's step), and
   ``patch_distributed`` (DDP's communication);
2. tf.data: ``patch_tf``, a pass of a dataset iterated in a Python loop;
3. Keras: ``patch_keras``, pipeprof's Keras callback added to ``fit()``;
4. Lightning and Hugging Face: ``patch_lightning`` and ``patch_hf``, pipeprof's callback of that
   framework added to ``Trainer.fit`` / ``Trainer.train`` (attach/lightning.py, attach/hf.py),
   which routes the trainer's loaders itself.
5. Hugging Face ``datasets``: ``patch_datasets``, each ``Dataset.map`` timed and whether its
   result came from the cache (said in the report's notes).

A patch reads the run through the public names of the ``Run`` protocol below (``local``,
``profiled_pass``, ``loaders``, ``samplers``, ``comm_clock``...).

NOTE [ Persistent workers past the profile ]
Once profiling stops (``--batches`` reached) the script runs on unprofiled: a loader's later
passes are its own. A loader with persistent workers is the exception: plain, its later epochs
go on with the workers it started (``_reset``: no new ``_base_seed`` drawn from its generator or
torch's, and the workers' own random state goes on); its own fresh iterator would draw one,
and every order and augmentation after it would differ from plain's. So its later passes go on
with its twin's persistent workers (kept by ``Run.stop_profiling``), their batches taken out of
their carriers and nothing booked (``unwrapped``; its workers still pack their records, a few
µs a batch). Such a pass is a generator, as a profiled pass with persistent workers is. A
dressed loader (NOTE [ A stateful loader, dressed ] in collect/torch/loader.py) goes on with its
own persistent workers, which pack carriers too: its batches are taken out of them the same way.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from pipeprof.core.recorder import clock


class Run(Protocol):
    """What a patch reads and calls of ``pipeprof run``'s Run (attach/run.py)."""

    pid: int  # the script's process: a process it forks is not profiled
    stopped: bool  # profiling is over: the patches call straight through
    sample_hz: float
    hang_s: float  # NOTE [ Hangs ] in collect/torch/hangs.py; 0: not watched
    regions: bool  # Forward / Backward / Optimizer timed in the steps
    notes: list[str]
    maps: list[dict[str, Any]]  # ``Dataset.map`` calls (patch_datasets)
    step: Any  # the step's regions (attach/regions.py): ``step.seen``, those seen
    loaders: Any  # the run's table, and where each loader was made (attach/labels.py)
    patches: Patches
    local: Any  # attach/passes.py's Inside: ``local.inside`` > 0 while pipeprof iterates
    samplers: Any  # the host's and NVML's (attach/run.py's RunSamplers)

    def profiled_pass(self, loader: Any) -> Any: ...
    def kept_workers(self, loader: Any) -> Any: ...
    def comm_clock(self) -> Any: ...
    def comm_timer(self) -> Any: ...
    def end_of_job(self, why: str | None) -> None: ...


class Patches:
    """The patches installed, each as how to undo it; ``undo`` runs them in reverse order."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def add(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def replace(self, owner: Any, name: str, value: Any) -> None:
        """``owner.name = value``, undone by putting back what ``owner`` held itself."""
        missing = object()
        before = vars(owner).get(name, missing) if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, value)
        if before is missing:
            self.add(lambda: delattr(owner, name))
        else:
            self.add(lambda: setattr(owner, name, before))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def each_subclass(patches: Patches, base: type, then: Callable[[type], None]) -> None:
    """``then(cls)`` for each subclass of ``base`` defined so far, and for each one defined from
    now on (``base.__init_subclass__``, put back by ``patches``)."""

    def subclasses(cls: type) -> Iterator[type]:
        sub: type
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for sub in list(subclasses(base)):
        then(sub)
    orig = base.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if orig is not None:
            orig.__func__(cls, **kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[misc,arg-type]
        then(cls)

    subclassing: Any = classmethod(__init_subclass__)  # type: ignore[arg-type]
    patches.replace(base, "__init_subclass__", subclassing)


def weakable(obj: Any) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


def callback_list(kind: str, trainer: Any) -> tuple[Any, Any]:
    """How to add a callback to ``trainer`` and take it out again."""
    if kind == "hf":
        return trainer.add_callback, trainer.remove_callback
    callbacks = trainer.callbacks

    def remove(callback: Any) -> None:
        if callback in callbacks:
            callbacks.remove(callback)

    return callbacks.append, remove


def patch_torch(run: Run) -> None:
    """``DataLoader``'s ``__init__`` (where each loader was made) and ``__iter__`` (each pass
    profiled: NOTE [ Run ] in attach/run.py), its subclasses' own ``__iter__``, and the step's
    regions (attach/regions.py)."""
    from torch.utils.data import DataLoader

    from pipeprof.collect.torch import hangs, resume
    from pipeprof.collect.torch.epochs import note_snapshot
    from pipeprof.collect.torch.loader import Collate, cache_sources, unwrapped

    if run.sample_hz:  # the host sampler's modules load with torch's, not in the first
        _load_samplers()  # pass's iter() (the loop's time): 5-25 ms
    hangs.ready(run.hang_s)  # NOTE [ Hangs ]: its thread starts here, not in a pass's iter()
    cache_sources(__name__, "pipeprof.attach.passes", "pipeprof.profiler", Collate.__module__)

    orig_init, orig_iter = DataLoader.__init__, DataLoader.__iter__
    resumes = resume.Resumes()  # NOTE [ Resumes ] in collect/torch/resume.py

    def passes(orig: Any, subclass: bool = False, stateful: bool = False) -> Any:
        """``__iter__`` of DataLoader, or of a subclass that has its own, as a profiled
        pass (NOTE [ Run ])."""

        @functools.wraps(orig)
        def __iter__(loader: Any) -> Any:
            if (
                run.local.inside
                or os.getpid() != run.pid  # a process the script forked
                or isinstance(loader.collate_fn, Collate)  # a twin, iterated by a Profiler
            ):
                return orig(loader)
            if run.stopped:  # NOTE [ Persistent workers past the profile ]
                kept = run.kept_workers(loader)
                if kept is None:
                    return orig(loader)
                # a twin's workers, or the loader's own, dressed (NOTE [ A stateful loader,
                # dressed ] in collect/torch/loader.py)
                return unwrapped(orig(loader) if kept is loader else iter(kept))
            if subclass and weakable(loader) and loader not in run.loaders.sites:
                run.loaders.remember_site(loader)  # its __init__ may not be DataLoader's
            if stateful:
                index_patch(type(loader))
                resumes.begin(loader)
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
        state, load = vars(cls).get("state_dict"), vars(cls).get("load_state_dict")
        stateful = state is not None and load is not None
        run.patches.replace(cls, "__iter__", passes(own, subclass=True, stateful=stateful))
        if stateful:
            run.patches.replace(cls, "state_dict", snapshots(state))
            run.patches.replace(cls, "load_state_dict", loads(load))

    def index_patch(cls: type) -> None:
        """torchdata's iterators' ``_next_index``, once, at a stateful loader's first pass (the
        iterator class is defined after the loader's, in its module)."""
        for klass in cls.__mro__:
            base = getattr(sys.modules.get(klass.__module__), "_StatefulBaseDataLoaderIter", None)
            own = vars(base).get("_next_index") if base is not None else None
            if own is not None and not getattr(own, "_pipeprof_indices", False):
                run.patches.replace(base, "_next_index", indices(own))

    def snapshots(orig: Any) -> Any:
        """A stateful loader's ``state_dict``, timed for its profile (NOTE [ An epoch's
        samples ] in collect/torch/epochs.py, case 5)."""

        @functools.wraps(orig)
        def state_dict(loader: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            state = None
            try:
                state = orig(loader, *args, **kwargs)
                return state
            finally:
                entry = run.loaders.get(id(loader))
                if entry is not None and entry.prof is not None and not run.stopped:
                    meta = entry.prof.session.meta
                    note_snapshot(meta, entry.steps, clock() - t0)
                    if "restore" not in meta:  # NOTE [ Resumes ], case 1
                        meta["restore"] = resume.restore_facts(loader)
                    resumes.snapshot(loader, state)

        return state_dict

    def loads(orig: Any) -> Any:
        """A stateful loader's ``load_state_dict``: its next pass resumes (NOTE [ Resumes ])."""

        @functools.wraps(orig)
        def load_state_dict(loader: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
            got = orig(loader, state, *args, **kwargs)
            if not run.stopped:
                resumes.load(loader, state)
            return got

        return load_state_dict

    def indices(orig: Any) -> Any:
        """A stateful loader's iterator's ``_next_index``: the index batches of each pass, and
        the end of a resumed one (NOTE [ Resumes ], case 2)."""

        @functools.wraps(orig)
        def _next_index(it: Any) -> Any:
            try:
                batch = orig(it)
            except StopIteration:
                ended(it)
                raise
            resumes.next_index(it, batch)
            return batch

        _next_index._pipeprof_indices = True  # type: ignore[attr-defined]

        def ended(it: Any) -> None:
            loader = resumes.passes.get(id(it._index_sampler))
            loader = loader.loader() if loader is not None else None
            got = resumes.ended(it)
            entry = run.loaders.get(id(loader)) if loader is not None else None
            if got is None or entry is None or entry.prof is None:
                return
            meta = entry.prof.session.meta
            meta.setdefault("restore", resume.restore_facts(loader))
            kept = meta.setdefault("resumes", [])
            if len(kept) < resume.SNAPSHOTS_KEPT:
                kept.append(got)

        return _next_index

    each_subclass(run.patches, DataLoader, own_iter)

    @functools.wraps(orig_init)  # its signature too: pipeprof's twin reads it
    def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(loader, *args, **kwargs)
        if not isinstance(loader.collate_fn, Collate):  # not pipeprof's own twin
            run.loaders.remember_site(loader)

    __iter__ = passes(orig_iter)

    run.patches.replace(DataLoader, "__init__", __init__)
    run.patches.replace(DataLoader, "__iter__", __iter__)
    if run.regions:
        run.step.install(run, run.patches, run.local)


def _load_samplers() -> None:
    """The host sampler's modules, psutil among them (which it loads itself as it starts)."""
    import pipeprof.collect.samplers  # noqa: F401

    try:
        import psutil  # noqa: F401
    except ImportError:  # the sampler says so when it starts
        pass


def patch_tf(run: Run) -> None:
    """tf.data iterated in a Python loop: a profiled pass; Keras ``fit()``: its callback."""
    import tensorflow as tf

    dataset_cls = tf.data.Dataset
    orig_iter = dataset_cls.__iter__

    @functools.wraps(orig_iter)
    def __iter__(dataset: Any) -> Any:
        if (
            run.stopped
            or run.local.inside
            or os.getpid() != run.pid
            or not tf.executing_eagerly()  # inside a tf.function: TensorFlow's own loop
        ):
            return orig_iter(dataset)
        if weakable(dataset) and dataset not in run.loaders.sites:
            run.loaders.remember_site(dataset, name=False)
        return run.profiled_pass(dataset)

    run.patches.replace(dataset_cls, "__iter__", __iter__)


def patch_keras(run: Run) -> None:
    """Keras ``fit()`` gets pipeprof's callback (keras imports tensorflow: its own hook)."""
    import keras

    model_cls = keras.Model
    orig_fit = model_cls.fit

    @functools.wraps(orig_fit)
    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        if run.stopped or run.local.inside or os.getpid() != run.pid:
            return orig_fit(model, *args, **kwargs)
        callback = _keras_callback(run, args, kwargs)
        try:  # fit's own iteration of the dataset is the callback's
            return run.local.call(functools.partial(orig_fit, model, *args, **kwargs))
        finally:
            if callback is not None:
                callback.session.end_ns = callback.session.end_ns or clock()

    run.patches.replace(model_cls, "fit", fit)


def _keras_callback(run: Run, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Add pipeprof's Keras callback to a ``fit()`` call (in ``kwargs``); None if not."""
    from pipeprof.attach.keras import ProfilerCallback
    from pipeprof.core.detect import is_tf_dataset

    callbacks = list(kwargs.get("callbacks") or [])
    if len(args) > 5:  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
        run.notes.append("fit() got its callbacks by position: pipeprof added none")
        return None
    if any(isinstance(c, ProfilerCallback) for c in callbacks):
        run.notes.append("fit() already has pipeprof's callback: its report is the script's")
        return None
    x = args[0] if args else kwargs.get("x")
    callback = ProfilerCallback(dataset=x if is_tf_dataset(x) else None)
    kwargs["callbacks"] = [*callbacks, callback]
    frame = sys._getframe(2)
    site = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    label = run.loaders.unique(f"fit@{site}")
    callback.session.meta["run_loader"] = {"label": label, "site": site}
    run.loaders.register(id(callback), label, site, None, callback, passes=1, callback=callback)
    run.samplers.start_host()
    return callback


def patch_lightning(run: Run) -> None:
    """Lightning's ``Trainer.fit`` gets pipeprof's callback (NOTE [ Lightning ])."""
    for name in ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer"):
        module = sys.modules.get(name)
        trainer_cls = getattr(module, "Trainer", None)
        if trainer_cls is not None and not hasattr(trainer_cls.fit, "_pipeprof"):
            _patch_trainer(run, trainer_cls, "fit", "lightning")


def patch_hf(run: Run) -> None:
    """Hugging Face's ``Trainer.train`` gets pipeprof's callback (NOTE [ Hugging Face
    Trainer ])."""
    _patch_trainer(run, sys.modules["transformers.trainer"].Trainer, "train", "hf")


def _patch_trainer(run: Run, trainer_cls: Any, method: str, kind: str) -> None:
    """``trainer_cls.method`` runs with pipeprof's callback of ``kind`` among its callbacks;
    its loops are then the callback's, the run's own DataLoader patch never sees them."""
    orig = getattr(trainer_cls, method)

    @functools.wraps(orig)
    def train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        if run.stopped or run.local.inside or os.getpid() != run.pid:
            return orig(trainer, *args, **kwargs)
        callback = _framework_callback(run, kind, trainer, method)
        if callback is None:
            return orig(trainer, *args, **kwargs)
        add, remove = callback_list(kind, trainer)
        add(callback)
        try:
            return orig(trainer, *args, **kwargs)
        except BaseException:
            callback.finish(interrupted=True)  # HF has no exception hook
            raise
        finally:
            remove(callback)
            callback.finish()
            for key, prof in ((id(callback), callback.loops.train),
                              (id(callback.loops), callback.loops.val)):  # fmt: skip
                entry = run.loaders.get(key)
                if entry is not None and prof.session.loop is not None:
                    entry.passes = prof.session.loop.epochs

    train._pipeprof = True  # type: ignore[attr-defined]
    run.patches.replace(trainer_cls, method, train)


def _framework_callback(run: Run, kind: str, trainer: Any, method: str) -> Any:
    """pipeprof's callback for one ``fit()``/``train()``, registered as this run's loops;
    None when the trainer has one already (its report is the script's)."""
    if kind == "lightning":
        from pipeprof.attach import lightning as integration

        existing = list(trainer.callbacks)
        base = next(c for c in type(trainer).__mro__ if c.__name__ == "Trainer")
        package = base.__module__.split(".")[0]
        callback_base = (
            sys.modules["lightning.pytorch"].Callback
            if package == "lightning"
            else sys.modules["pytorch_lightning"].Callback
        )
        make: Any = integration.callback_class(callback_base)
        mine: Any = integration.Hooks
    else:
        from pipeprof.attach import hf as integration  # type: ignore[no-redef]

        existing = list(trainer.callback_handler.callbacks)
        make = mine = integration.PipeprofCallback
    if any(isinstance(c, mine) for c in existing):
        run.notes.append(
            f"{method}() already has pipeprof's callback: its report is the script's"
        )
        return None
    callback = make(sample_hz=0)  # the run samples the host itself
    frame = sys._getframe(2)
    site = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    label = run.loaders.unique(f"Trainer.{method}@{site}")
    loops = callback.loops
    loops.train.session.meta["run_loader"] = {"label": label, "site": site}
    run.loaders.register(id(callback), label, site, loops.train, callback, passes=1,
                         callback=callback)  # fmt: skip
    val = run.loaders.unique(f"{label} validation")
    loops.val.session.meta["run_loader"] = {"label": val, "site": site}
    run.loaders.register(id(loops), val, site, loops.val, loops, nested_in={label})
    run.samplers.start_host()
    return callback


def patch_distributed(run: Run) -> None:
    """DDP's all-reduce and the blocking collectives as the step's comm (NOTE [ Comm ]).

    DDP takes one communication hook per model: pipeprof registers its timed all-reduce at
    the model's first forward, unless the script registered a hook of its own, which is then
    timed instead (a built-in C++ hook cannot be wrapped: a note says so)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from pipeprof.collect.comm import COLLECTIVES, collective, time_ddp, timed_hook

    orig_forward, orig_register = DDP.forward, DDP.register_comm_hook

    @functools.wraps(orig_register)
    def register_comm_hook(model: Any, state: Any, hook: Any) -> Any:
        model._pipeprof_hooked = True
        if getattr(hook, "pipeprof_timed", False) or getattr(hook, "__name__", "") in (
            "bf16_compress_hook", "bf16_compress_wrapper_hook",  # DDP checks these names
        ):  # fmt: skip
            return orig_register(model, state, hook)
        run.step.seen.add("Comm")
        return orig_register(model, state, timed_hook(hook, run.comm_clock))

    @functools.wraps(orig_forward)
    def forward(model: Any, *args: Any, **kwargs: Any) -> Any:
        if not run.stopped and not getattr(model, "_pipeprof_hooked", False):
            model._pipeprof_hooked = True
            try:
                time_ddp(model, run.comm_clock)
                run.step.seen.add("Comm")
            except RuntimeError as exc:  # a built-in hook is registered already
                run.notes.append(f"DDP's all-reduce was not timed ({exc}); it counts as "
                                 "compute")  # fmt: skip
        return orig_forward(model, *args, **kwargs)  # type: ignore[no-untyped-call]

    patches = run.patches
    patches.replace(DDP, "forward", forward)
    patches.replace(DDP, "register_comm_hook", register_comm_hook)
    for name in COLLECTIVES:
        if hasattr(dist, name):
            patches.replace(dist, name, collective(getattr(dist, name), run.comm_timer))
    orig_destroy = dist.destroy_process_group

    @functools.wraps(orig_destroy)
    def destroy_process_group(group: Any = None) -> Any:
        if group is None and os.getpid() == run.pid:  # the job's group: training is over
            run.end_of_job("the script destroyed its process group, where the job report is "
                           "gathered")  # fmt: skip
        return orig_destroy(group)

    patches.replace(dist, "destroy_process_group", destroy_process_group)


def patch_datasets(run: Run) -> None:
    """Hugging Face ``Dataset.map``, timed where the script calls it (the outermost call: a
    ``DatasetDict.map`` is one per split; the maps ``Dataset``'s own methods make, ``filter``
    or ``cast``, are theirs, not counted), with where its result came from. The user's function
    is passed on untouched, so the cache's fingerprint of the call is the same."""
    cls = sys.modules["datasets.arrow_dataset"].Dataset
    orig = cls.map
    depth = [0]

    @functools.wraps(orig)
    def map(self: Any, *args: Any, **kwargs: Any) -> Any:
        own = sys._getframe(1).f_globals.get("__name__") == "datasets.arrow_dataset"
        if run.stopped or depth[0] or own or os.getpid() != run.pid:
            return orig(self, *args, **kwargs)
        depth[0] += 1
        wall, t0 = time.time(), clock()
        try:
            out = orig(self, *args, **kwargs)
        finally:
            depth[0] -= 1
        function = args[0] if args else kwargs.get("function")
        row = map_row(function, len(self), clock() - t0, wall, self, out)
        run.maps.append(row)
        run.notes.append(map_note(row))
        return out

    run.patches.replace(cls, "map", map)


def map_row(
    function: Any, rows: int, ns: int, wall: float, before: Any, out: Any
) -> dict[str, Any]:
    """A ``Dataset.map`` call: its function's name, rows, seconds, and ``cache``: ``"loaded"``
    (its result's cache file is older than the call), ``"written"`` (made by the call) or
    ``"none"`` (an in-memory dataset: not cached, computed in every run)."""
    from pipeprof.collect.torch.dataset import name_of

    files = [f.get("filename") for f in getattr(out, "cache_files", None) or []]
    fresh = [f for f in files if f and f not in [g.get("filename") for g in before.cache_files]]
    if not files:
        cache = "none"
    elif fresh and all(os.path.getmtime(f) < wall for f in fresh if os.path.exists(f)):
        cache = "loaded"
    else:
        cache = "written"
    name = name_of(function) if function is not None else None
    return {"function": name, "rows": rows, "s": round(ns / 1e9, 6), "cache": cache}


def map_note(row: dict[str, Any]) -> str:
    """What a ``Dataset.map`` call cost the run, and what a next run pays for it."""
    said = {
        "loaded": "loaded from the datasets cache",
        "written": "computed and cached: a run with the same function and arguments loads it",
        "none": "computed and not cached (an in-memory dataset): every run computes it again; "
        "save_to_disk() once and load_from_disk(), or pass cache_file_name=, to keep it",
    }[row["cache"]]
    return (
        f"Dataset.map({row['function'] or ''}): {row['s']:.3g} s over "
        f"{row['rows']:,} rows, {said}"
    )


# (the module whose import installs it, the patch), in the order they are installed
PATCHES: tuple[tuple[str, Callable[[Run], None]], ...] = (
    ("torch", patch_torch),
    ("tensorflow", patch_tf),
    ("keras", patch_keras),
    ("lightning.pytorch.trainer.trainer", patch_lightning),
    ("pytorch_lightning.trainer.trainer", patch_lightning),
    ("transformers.trainer", patch_hf),
    ("datasets.arrow_dataset", patch_datasets),
)
