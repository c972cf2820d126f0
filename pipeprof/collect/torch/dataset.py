"""A dataset's transforms and loader timed, one stage per transform: in place where they are
objects of Python classes (NOTE [ Transforms timed in place ]), by stand-ins elsewhere.

Everything here is a module-level, picklable class so that a dataset copy carrying these wrappers
travels to ``spawn`` and ``forkserver`` workers. The wrappers call exactly what the originals would
call, in the same order, so the samples (and the random numbers drawn) are unchanged.
"""

from __future__ import annotations

import copy
import functools
import io
import types
from collections.abc import Callable, Sequence
from typing import Any

from pipeprof.core.recorder import clock, recorder, stage_call1, timed_call, timed_call1

_REC = recorder()

# A dataset reaches its transforms through these attributes (torchvision's VisionDataset
# convention); ``loader`` is DatasetFolder's path -> sample function.
TRANSFORM_ATTRS = ("transform", "target_transform")


def name_of(fn: Any) -> str:
    """A stage name for a callable: its class name, or a function's own name."""
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and callable(inner):
        fn = inner
    if (
        isinstance(fn, type)
        or hasattr(fn, "__code__")
        or type(fn).__name__ == "builtin_function_or_method"
    ):
        name = getattr(fn, "__name__", type(fn).__name__)
    else:
        name = type(fn).__name__
    return "lambda" if name == "<lambda>" else name


_PARTIAL_ARGS = functools.partial.args.__get__  # a Timed's own (path, fn), under its forwarding


class Timed(functools.partial):  # type: ignore[type-arg]
    """Calls ``fn`` timed as the absolute stage ``path``; other attributes pass through, reads
    and writes (a ``worker_init_fn`` tuning ``dataset.transform`` tunes the user's object), and
    ``isinstance`` sees ``fn``'s class (code that tests ``isinstance(self.transform, Compose)``
    behaves as it does plain).

    A ``functools.partial`` of ``timed_call1``: the call goes from C straight into the timed
    region, a Python frame fewer than a ``__call__`` of its own would take
    (docs/validation/overhead.md).
    ``func``, ``args`` and ``keywords``, partial's own names, read the user's object too."""

    def __new__(cls, fn: Callable[..., Any], path: str) -> Timed:
        return super().__new__(cls, timed_call1, path, fn)

    @property
    def path(self) -> str:
        return _PARTIAL_ARGS(self)[0]  # type: ignore[no-any-return]

    @property
    def fn(self) -> Callable[..., Any]:
        return _PARTIAL_ARGS(self)[1]  # type: ignore[no-any-return]

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.fn, name, value)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self.fn)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Timed, (self.fn, self.path))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.fn, name)

    func = property(lambda self: self.fn.func)  # type: ignore[assignment]
    args = property(lambda self: self.fn.args)  # type: ignore[assignment]
    keywords = property(lambda self: self.fn.keywords)  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Timed({self.fn!r}, {self.path!r})"


class TimedChain:
    """A Compose / nn.Sequential run step by step, each step its own stage.

    ``multi`` follows torchvision.transforms.v2.Compose: with several positional inputs each step
    is called with the previous step's outputs unpacked. The v1 Compose and nn.Sequential take
    exactly one input; any other call goes to the original object so its own error comes out.
    """

    def __init__(self, orig: Any, steps: Sequence[tuple[str, Callable[..., Any]]], multi: bool):
        self.__dict__.update(orig=orig, steps=list(steps), multi=multi)

    def __setattr__(self, name: str, value: Any) -> None:  # to the user's object (see Timed)
        setattr(self.__dict__["orig"], name, value)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance sees the Compose (see Timed)
        return type(self.__dict__["orig"])

    def __reduce__(self) -> tuple[Any, ...]:
        return (TimedChain, (self.orig, self.steps, self.multi))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or (len(args) != 1 and not (self.multi and args)):
            return self.orig(*args, **kwargs)
        if len(args) == 1:
            x = args[0]
            for path, fn in self.steps:
                x = timed_call1(path, fn, x)
            return x
        inputs: Any = args  # v2: each step takes the previous step's outputs unpacked
        for path, fn in self.steps:
            inputs = timed_call(path, fn, *inputs)
        return inputs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "orig" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.orig, name)


class TimedList(list):  # type: ignore[type-arg]
    """A list of transforms that the dataset iterates itself: each element timed."""


def _children(fn: Any) -> tuple[list[Any], bool] | None:
    """The steps of a Compose-like object and whether it takes several inputs, else None."""
    cls = type(fn)
    mod = cls.__module__
    if (
        cls.__name__ == "Compose"
        and mod.startswith("torchvision.transforms")
        and isinstance(getattr(fn, "transforms", None), (list, tuple))
    ):
        return list(fn.transforms), mod.startswith("torchvision.transforms.v2")
    if (
        cls.__name__ == "Sequential"
        and mod.startswith("torch.nn")
        and type(fn).forward is _seq_forward()
    ):
        return list(fn), False
    return None


def _seq_forward() -> Any:
    from torch import nn

    return nn.Sequential.forward


# NOTE [ Transforms timed in place ]
# A transform that is an instance of a Python class is timed where it is: the method its calls
# reach (``__call__``; a v2 transform's ``forward``) is wrapped once a process on the class
# that defines it (``_hook``), and the wrapper times the instances marked in this process
# (``_MARKED``, by id; each entry holds its object, so the id stays its own), while the recorder
# is on and the thread is inside a stage (``load``: a profiled batch's fetch). Any other call,
# another instance, the user's own code in the training process, an unprofiled batch, goes
# straight to the original (a dict look-up and two attribute reads). So ``self.transform`` in
# ``__getitem__`` is the user's object: ``type()``, identity and ``vars()`` answer as plain. A
# torchvision Compose (v1, v2) is marked as a chain: its wrapper calls its steps, each timed as
# its own stage, functions among them too. A marked call inside its own stage (a subclass's
# ``super().__call__``) is not timed twice. Functions, bound methods, partials and classes whose
# method is not Python's keep a stand-in (``Timed``), and so do ``nn.Module``s but torchvision's
# v2 transforms: a model holds such classes too (``nn.Sequential``, v1's ``Normalize``), and
# ``torch.jit.script`` of it must not meet a wrapper of pipeprof's. The marks are
# made in the training process when the loader is built, and again in a spawned worker
# (``apply_marks`` from ``WorkerInit``), where the dataset and the marks arrive in one pickle.
# A class stays wrapped for the process's life; its instances not marked pay the look-up. In
# the training process, a batch on the short path sets the class back to its own method while
# it is fetched (``class_swaps``; NOTE [ The short path ] in collect/torch/loader.py).
Mark = tuple[Any, str, Any]  # (the user's object, its stage path or chain prefix, chain or not)
_MARKED: dict[int, list[Any]] = {}  # id -> [object, path, bound original | chain steps, multi]
_ORIGINAL: dict[Any, Any] = {}  # wrapper -> the function it wraps


def _hook(fn: Any) -> tuple[type, str] | None:
    """Where ``fn``'s calls can be timed in place: the class in its MRO that defines the method
    they reach, and that method's name; None for a function, a method, a partial or a class
    whose method is not a Python function."""
    cls = type(fn)
    if isinstance(fn, (type, types.FunctionType, types.MethodType, functools.partial)):
        return None
    module = any(k.__name__ == "Module" and k.__module__ == "torch.nn.modules.module"
                 for k in cls.__mro__)  # fmt: skip
    name = "forward" if module else "__call__"
    for k in cls.__mro__:
        if name in k.__dict__:
            method = _ORIGINAL.get(k.__dict__[name], k.__dict__[name])
            if k is object or not isinstance(method, types.FunctionType):
                return None
            if module and not k.__module__.startswith("torchvision.transforms.v2"):
                return None  # a class models use too (TorchScript would meet the wrapper)
            return k, name
    return None


def _wrap_method(cls: type, name: str) -> bool:
    """Wrap ``cls.name`` (once a process) to time the instances marked; False if it cannot be."""
    current = cls.__dict__[name]
    if current in _ORIGINAL:
        return True
    orig = current

    @functools.wraps(orig)
    def timed(self: Any, x: Any = _NONE, /, *args: Any, **kwargs: Any) -> Any:
        if _REC.enabled:
            mark = _MARKED.get(id(self))
            if mark is not None and mark[0] is self:
                inside = _REC._local.st.path  # ``innermost``, less a property's frame
                if inside is not None and inside != mark[1]:
                    if mark[3] is not None:  # a chain
                        return _run_chain(self, mark, orig, _args(x, args), kwargs)
                    if x is _NONE or args or kwargs:
                        return timed_call(mark[1], mark[2], *_args(x, args), **kwargs)
                    return timed_call1(mark[1], mark[2], x)
        if x is _NONE or args or kwargs:
            return orig(self, *_args(x, args), **kwargs)
        return orig(self, x)

    try:
        setattr(cls, name, timed)
    except (TypeError, AttributeError):
        return False
    _ORIGINAL[timed] = orig
    return True


_NONE: Any = object()  # no positional argument


def _args(x: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return args if x is _NONE else (x, *args)


def _run_chain(obj: Any, mark: list[Any], orig: Any, args: Any, kwargs: Any) -> Any:
    """A marked Compose's call, each step its own stage (see ``TimedChain``); its steps read
    now, so one a ``worker_init_fn`` added is timed too."""
    multi = mark[3]
    if kwargs or (len(args) != 1 and not (multi and args)):
        return orig(obj, *args, **kwargs)
    now = obj.transforms
    steps = mark[2]
    if len(now) != len(steps) or any(a is not b for a, (_, b) in zip(now, steps)):
        steps = mark[2] = [(_unique(mark[1], t, now[:i]), t) for i, t in enumerate(now)]
    if len(args) == 1:
        x = args[0]
        for path, fn in steps:
            x = timed_call1(path, fn, x)
        return x
    inputs: Any = args
    for path, fn in steps:
        inputs = timed_call(path, fn, *inputs)
    return inputs


def apply_marks(marks: Sequence[Mark]) -> None:
    """Time the objects ``marks`` names in place, in this process (NOTE above)."""
    for obj, path, chain in marks:
        hook = _hook(obj)
        if hook is None or not _wrap_method(*hook):
            continue
        cls, name = hook
        bound = types.MethodType(_ORIGINAL[cls.__dict__[name]], obj)
        if chain is None:
            _MARKED[id(obj)] = [obj, path, bound, None]
        else:
            steps = _children(obj)
            if steps is not None:
                _MARKED[id(obj)] = [obj, path, [], steps[1]]


def class_swaps(marks: Sequence[Mark]) -> list[Swap]:
    """The classes ``marks``' objects are timed through, each as a swap (a class, its method's
    name, the method, its wrapper): a batch on the short path in the training process sets them
    back to their own method, so its samples run no frame of pipeprof's (NOTE [ The short path ]
    in collect/torch/loader.py)."""
    out: list[Swap] = []
    for obj, _, _ in marks:
        hook = _hook(obj)
        if hook is None:
            continue
        cls, name = hook
        wrapper = cls.__dict__.get(name)
        orig = _ORIGINAL.get(wrapper)
        if orig is not None and not any(s[0] is cls and s[1] == name for s in out):
            out.append((cls, name, orig, wrapper))
    return out


def mark_transform(fn: Any, prefix: str, marks: list[Mark]) -> Any:
    """``fn`` itself where it can be timed in place (added to ``marks``), else a stand-in
    (``wrap_transform``); a list of them stays the user's own where each element can."""
    if isinstance(fn, (list, tuple)) and all(callable(t) for t in fn):
        each = [mark_transform(t, _unique(prefix, t, fn[:i]), marks) for i, t in enumerate(fn)]
        if all(a is b for a, b in zip(each, fn)):
            return fn
        return TimedList(each)
    hook = _hook(fn)
    if hook is None or not _wrap_method(*hook):
        return wrap_transform(fn, prefix)
    parts = _children(fn)
    if parts is None:
        path = prefix if prefix != "transform" else f"transform/{name_of(fn)}"
        marks.append((fn, path, None))
    else:
        marks.append((fn, prefix, parts[1]))
    return fn


def wrap_transform(fn: Any, prefix: str) -> Any:
    """A timed stand-in for ``fn`` whose stages live under ``prefix``."""
    if isinstance(fn, (list, tuple)) and all(callable(t) for t in fn):
        return TimedList(wrap_transform(t, _unique(prefix, t, fn[:i])) for i, t in enumerate(fn))
    parts = _children(fn)
    if parts is None:
        return Timed(fn, prefix if prefix != "transform" else f"transform/{name_of(fn)}")
    steps, multi = parts
    return TimedChain(fn, [(_unique(prefix, t, steps[:i]), t) for i, t in enumerate(steps)], multi)


def _unique(prefix: str, fn: Any, before: Sequence[Any]) -> str:
    name = name_of(fn)
    n = sum(1 for t in before if name_of(t) == name)
    return f"{prefix}/{name}" + (f"#{n + 1}" if n else "")


class SplitLoader:
    """torchvision's PIL ``pil_loader`` as two stages: ``load/read`` then ``load/decode``."""

    def __call__(self, path: str) -> Any:
        from PIL import Image

        if not recorder().enabled:
            with open(path, "rb") as f:
                return Image.open(f).convert("RGB")
        data = stage_call1("read", _read, path)
        return stage_call1("decode", _decode, data)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _decode(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


class TimedLoader:
    """Any other ``loader(path)``: timed whole, as ``load/<its name>``."""

    def __init__(self, fn: Callable[[str], Any]) -> None:
        self.fn = fn
        self.name = name_of(fn)

    def __call__(self, path: str) -> Any:
        return stage_call1(self.name, self.fn, path)


def _wrap_loader(fn: Any) -> Any:
    try:
        from torchvision import get_image_backend
        from torchvision.datasets import folder
    except ImportError:
        return TimedLoader(fn)
    splittable = fn is folder.pil_loader or (
        fn is folder.default_loader and get_image_backend() == "PIL"
    )
    return SplitLoader() if splittable else TimedLoader(fn)


Wrap = Callable[[str, Any], Any]  # (stage prefix, the user's transform) -> its stand-in
PREFIX = {"transform": "transform", "target_transform": "transform/target_transform"}


Swap = tuple[Any, str, Any, Any]  # (a dataset copy or a class, attribute, the user's, pipeprof's)


def twin_dataset(
    dataset: Any,
    wrap: Wrap,
    wrap_loader: Callable[[Any], Any] | None = None,
    depth: int = 0,
    swaps: list[Swap] | None = None,
) -> tuple[Any, list[str]]:
    """A shallow copy of ``dataset`` whose transforms are ``wrap``'s stand-ins (and, with
    ``wrap_loader``, an ImageFolder-style ``loader`` too); the user's dataset is untouched.

    The one walk over a dataset's transforms that profiling (``instrument_dataset``) and
    benchmarking (bench/sources.py) share, so both split a dataset the same way. Follows
    ``Subset``-style ``.dataset`` and ``ConcatDataset``-style ``.datasets``; a transform that is a
    method of the dataset is bound to the copy. Returns the copy (or the dataset itself when
    there is nothing to wrap or it cannot be copied) and notes on what could not be split.
    ``swaps`` collects every stand-in set on a copy, with the value it stands in for.
    """
    notes: list[str] = []
    if depth > 3:
        return dataset, notes
    try:
        twin = copy.copy(dataset)
    except Exception as exc:  # a dataset that can't be copied is timed as a whole
        twin, failed = None, exc
    src = dataset if twin is None else twin
    changes: dict[str, Any] = {}
    plain: dict[str, Any] = {}  # what each stand-in stands in for
    for attr in TRANSFORM_ATTRS:
        fn = _bound_to(getattr(src, attr, None), dataset, src)
        if fn is not None and (callable(fn) or isinstance(fn, (list, tuple))):
            timed = wrap(PREFIX[attr], fn)
            if timed is not fn:  # else timed in place (NOTE [ Transforms timed in place ])
                changes[attr], plain[attr] = timed, fn
    joint = _bound_to(getattr(src, "transforms", None), dataset, src)
    if joint is not None and callable(joint):
        timed = _wrap_joint(joint, changes, wrap)
        if timed is not joint:
            changes["transforms"], plain["transforms"] = timed, joint
    loader = _bound_to(getattr(src, "loader", None), dataset, src)
    if wrap_loader and callable(loader) and isinstance(getattr(src, "samples", None), list):
        changes["loader"], plain["loader"] = wrap_loader(loader), loader
    if _wds_pipeline(src) and twin is not None:  # NOTE [ WebDataset pipelines ]
        changes["invoke"] = TimedInvoke(twin)
    if _arrow_backed(src):  # NOTE [ Hugging Face datasets ]
        kwargs = src._format_kwargs
        fn = kwargs.get("transform") if isinstance(kwargs, dict) else None
        timed = wrap("transform", fn) if callable(fn) else fn
        if timed is not fn:
            changes["_format_kwargs"] = {**kwargs, "transform": timed}
            plain["_format_kwargs"] = kwargs
        if wrap_loader and twin is not None:
            changes["_getitem"] = ArrowRead(twin)
    inner_swaps: list[Swap] = []
    inner = getattr(src, "dataset", None)
    if inner is not None and hasattr(inner, "__getitem__"):
        changes["dataset"], more = twin_dataset(inner, wrap, wrap_loader, depth + 1, inner_swaps)
        notes += more
    inners = getattr(src, "datasets", None)
    if isinstance(inners, list) and all(hasattr(d, "__getitem__") for d in inners):
        changes["datasets"] = []
        for d in inners:
            copied, more = twin_dataset(d, wrap, wrap_loader, depth + 1, inner_swaps)
            changes["datasets"].append(copied)
            notes += more
    if not changes:
        return dataset, notes
    try:
        if twin is None:
            raise failed
        for attr, value in changes.items():
            setattr(twin, attr, value)
    except Exception as exc:
        notes.append(f"{type(dataset).__name__}: transforms not split ({exc})")
        return dataset, notes
    if swaps is not None:
        swaps += inner_swaps + [(twin, a, plain[a], changes[a]) for a in plain]
    return twin, notes


# NOTE [ WebDataset pipelines ]
# A WebDataset (``webdataset.DataPipeline``) is a list of steps, each turning the previous one's
# iterator into its own: the shard list, the split by worker, opening each shard (``open``), the
# tar's members (``tar_file_expander``), grouped into samples (``group_by_keys``), then what the
# user chained: ``decode``, ``map``, ``to_tuple``, ``shuffle``, ``batched``... The copy the
# profiled loader reads makes each step's iterator through ``TimedInvoke`` (its own ``invoke``;
# the steps stay the user's), so that every ``next()`` on the iterator of a step after the shard
# list is the absolute stage ``load/<step>``, and ``load`` is their sum (the loader's own
# ``load`` is not opened around them). Absolute stages are detached from the ones around them
# (NOTE [ Stage paths and self time ] in core/recorder.py), so each step gets its own time, not
# the time of the steps it pulls from. Shard streams fetched over HTTP are ``fetch`` inside the
# step that reads them (NOTE [ Timing network reads ] in collect/fetch.py). A step's name is its
# function's (``_map_tuple`` is ``map_tuple``; ``.decode()`` is ``decode``; ``.map(fn)`` is
# ``map/fn``), numbered where it repeats (``shuffle#2``).


def _wds_pipeline(dataset: Any) -> bool:
    """A WebDataset pipeline not yet timed (without importing ``webdataset``)."""
    attrs = getattr(dataset, "__dict__", {})
    steps = attrs.get("pipeline")
    ours = type(dataset).__module__.startswith("webdataset.")
    return ours and isinstance(steps, list) and len(steps) > 1 and "invoke" not in attrs


def _step_name(step: Any) -> str:
    """``decode``, ``map/<fn>``, ``shuffle``...: a step's function without its leading ``_``."""
    fn = getattr(step, "f", None)
    name = (getattr(fn, "__name__", None) or name_of(step)).lstrip("_")
    args = getattr(step, "args", None) or ()
    if name == "map" and args:
        return "decode" if type(args[0]).__name__ == "Decoder" else f"map/{name_of(args[0])}"
    return {"StreamingOpen": "open", "url_opener": "open"}.get(name, name)


class TimedInvoke:
    """A WebDataset copy's ``invoke`` (how ``DataPipeline`` makes each step's iterator from the
    one before): the same call, its iterator timed as ``load/<step>``. Set on the copy, so the
    steps themselves, which user code may look at, are the user's."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.paths: dict[int, str] = {}  # id(step) -> its stage, made again in a new process

    def __getstate__(self) -> dict[str, Any]:
        return {"owner": self.owner, "paths": {}}

    def __call__(self, step: Any, *args: Any, **kwargs: Any) -> Any:
        owner = self.owner
        out = type(owner).invoke(owner, step, *args, **kwargs)
        if not args:  # the shard list, the source
            return out
        path = self.paths.get(id(step))
        if path is None:
            self.paths = _step_paths(owner.__dict__.get("pipeline") or [])
            path = self.paths.get(id(step), f"load/{_step_name(step)}")
        return (TimedOpen if path == "load/open" else TimedIter)(out, path)


def _step_paths(steps: list[Any]) -> dict[int, str]:
    paths: dict[int, str] = {}
    seen: dict[str, int] = {}
    for step in steps[1:]:
        name = _step_name(step)
        seen[name] = seen.get(name, 0) + 1
        paths[id(step)] = f"load/{name}" + (f"#{seen[name]}" if seen[name] > 1 else "")
    return paths


def stream_facts(dataset: Any) -> dict[str, Any] | None:
    """A WebDataset pipeline's steps (their stages, in order) and its sample shuffles, each with
    its buffer and how many samples it holds before its first (NOTE [ A shuffle buffer's start ]
    in analyze/streams.py); None for other datasets. A shuffle before ``open`` shuffles the
    shards' names, not samples: left out."""
    steps = getattr(dataset, "__dict__", {}).get("pipeline")
    if type(dataset).__module__.split(".")[0] != "webdataset" or not isinstance(steps, list):
        return None
    paths = _step_paths(steps)
    order = [paths[id(step)] for step in steps[1:]]
    shuffles = []
    opened = False
    for k, step in enumerate(steps[1:]):
        opened = opened or paths[id(step)] == "load/open"
        if not opened or getattr(getattr(step, "f", None), "__name__", "") != "_shuffle":
            continue
        args: tuple[Any, ...] = tuple(getattr(step, "args", None) or ())
        kw: dict[str, Any] = getattr(step, "kw", None) or {}
        size = args[0] if args else kw.get("bufsize", 1000)
        first = args[1] if len(args) > 1 else kw.get("initial", 100)
        if isinstance(size, int) and isinstance(first, int) and size > 0:
            shuffles.append({"stage": order[k], "step": k, "bufsize": size,
                             "initial": min(first, size)})  # fmt: skip
    return {"steps": order, "shuffles": shuffles}


class TimedIter:
    """An iterator whose every ``next()`` is timed as the absolute stage ``path``."""

    def __init__(self, it: Any, path: str) -> None:
        self.it, self.path = iter(it), path

    def __iter__(self) -> TimedIter:
        return self

    def __next__(self) -> Any:
        return timed_call1(self.path, next, self.it)


# NOTE [ Shards a worker opened ]: the shards this process's WebDataset ``open`` steps gave out,
# counted whether or not the batch is timed, shipped with the process's batches (``Collate``) as
# each worker's ``shards`` (a forked worker starts again from 0: ``WorkerInit``; the training
# process, at a profiled loader's first pass without workers: two such loaders profiled at once
# would count each other's). A worker whose split of the shard list was empty opens none and
# delivers no batch (``idle-workers``). With the count goes when its first shard was opened
# (``first_shard_ns``, the clock every process shares), which the report gives from the pass's
# ``iter()``: a worker's start-up before its stream begins, apart from reading its first shard.
SHARDS = [0, 0]  # the shards opened; clock() ns when the first was (0: none yet)


class TimedOpen(TimedIter):
    """The ``open`` step's iterator: each shard it gives out counted in ``SHARDS``."""

    def __next__(self) -> Any:
        got = timed_call1(self.path, next, self.it)
        SHARDS[0] += 1
        if not SHARDS[1]:
            SHARDS[1] = clock()
        return got


def steps_timed(dataset: Any) -> Any:
    """A shallow copy of a WebDataset pipeline whose steps are timed (NOTE [ WebDataset
    pipelines ]): what a loader that reads the user's own dataset iterates (NOTE [ A stateful
    loader, dressed ], case 5 in loader.py); ``dataset`` itself for any other, or one that
    cannot be copied."""
    if not _wds_pipeline(dataset):
        return dataset
    try:
        twin = copy.copy(dataset)
    except Exception:  # timed as a whole, as before
        return dataset
    vars(twin)["invoke"] = TimedInvoke(twin)
    return twin


def timed_pipeline(dataset: Any) -> bool:
    """Whether ``dataset`` is a WebDataset whose steps are timed: its ``load`` is theirs."""
    return type(getattr(dataset, "__dict__", {}).get("invoke")) is TimedInvoke


# NOTE [ Hugging Face datasets ]
# An Arrow-backed ``datasets.Dataset`` reads a batch in one ``__getitems__`` call: ``_getitem``
# slices the Arrow table, turns it into Python (or tensors, under ``with_format``), decodes its
# features (an ``Image`` column's bytes), then calls the function ``with_transform`` or
# ``set_transform`` left in ``_format_kwargs["transform"]``, once for the whole batch. The copy
# the profiled loader reads has that function timed as ``transform/<its name>`` (a new
# ``_format_kwargs`` dict, the user's left as it is), and ``_getitem`` timed as ``load/read``, so
# ``load/read`` is the Arrow read and formatting, the transform apart from it (it is detached:
# NOTE [ Stage paths and self time ] in core/recorder.py). ``.map`` ran before the loader did:
# its output is what the Arrow read reads.


def _arrow_backed(dataset: Any) -> bool:
    """A Hugging Face ``datasets.Dataset`` (map-style, Arrow), without importing ``datasets``."""
    return any(
        c.__name__ == "Dataset" and c.__module__ == "datasets.arrow_dataset"
        for c in type(dataset).__mro__
    ) and isinstance(getattr(dataset, "__dict__", {}).get("_format_kwargs"), (dict, type(None)))


class ArrowRead:
    """A ``datasets.Dataset`` copy's ``_getitem``, timed as the relative stage ``read``: set on
    the copy itself, it is pickled with it to spawn workers (NOTE [ Hugging Face datasets ])."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def __call__(self, key: Any, **kwargs: Any) -> Any:
        owner = self.owner
        return stage_call1("read", type(owner)._getitem, owner, key, **kwargs)


def instrument_dataset(
    dataset: Any, swaps: list[Swap] | None = None, marks: list[Mark] | None = None
) -> tuple[Any, list[str]]:
    """The dataset the profiled loader reads: each transform a stage, the loader split into
    ``load/read`` and ``load/decode`` where it can be (see ``twin_dataset``, and its ``swaps``).
    Transforms timed in place are added to ``marks`` and marked in this process (NOTE
    [ Transforms timed in place ])."""
    made: list[Mark] = [] if marks is None else marks
    wrap: Wrap = lambda prefix, fn: mark_transform(fn, prefix, made)
    out = twin_dataset(dataset, wrap, _wrap_loader, swaps=swaps)
    apply_marks(made)
    return out


def _bound_to(fn: Any, dataset: Any, twin: Any) -> Any:
    """``fn``, but a method of ``dataset`` (``def transform(self, x)``) bound to its copy instead,
    so it sees the state the loader's workers set on the copy."""
    if isinstance(fn, types.MethodType) and fn.__self__ is dataset and twin is not dataset:
        return types.MethodType(fn.__func__, twin)
    return fn


def _wrap_joint(joint: Any, changes: dict[str, Any], wrap: Wrap) -> Any:
    """VisionDataset's ``transforms``: a StandardTransform over the wrapped parts, or a chain."""
    if type(joint).__name__ == "StandardTransform":
        if not any(attr in changes for attr in TRANSFORM_ATTRS):
            return joint  # its parts are timed in place
        twin = copy.copy(joint)
        for attr in TRANSFORM_ATTRS:
            if attr in changes:
                setattr(twin, attr, changes[attr])
        return twin
    return wrap("transform", joint)


__all__ = [
    "apply_marks",
    "clock",
    "instrument_dataset",
    "mark_transform",
    "name_of",
    "twin_dataset",
    "wrap_transform",
]
