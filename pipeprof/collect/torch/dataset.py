"""Timed stand-ins for a dataset's transforms and loader, one stage per transform.

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
    region, a Python frame fewer than a ``__call__`` of its own would take (docs/overhead.md).
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


Swap = tuple[Any, str, Any, Any]  # (a dataset copy, attribute, the user's value, its stand-in)


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
            changes[attr], plain[attr] = wrap(PREFIX[attr], fn), fn
    joint = _bound_to(getattr(src, "transforms", None), dataset, src)
    if joint is not None and callable(joint):
        changes["transforms"], plain["transforms"] = _wrap_joint(joint, changes, wrap), joint
    loader = _bound_to(getattr(src, "loader", None), dataset, src)
    if wrap_loader and callable(loader) and isinstance(getattr(src, "samples", None), list):
        changes["loader"], plain["loader"] = wrap_loader(loader), loader
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


def instrument_dataset(dataset: Any, swaps: list[Swap] | None = None) -> tuple[Any, list[str]]:
    """The dataset the profiled loader reads: each transform a stage, the loader split into
    ``load/read`` and ``load/decode`` where it can be (see ``twin_dataset``, and its ``swaps``)."""
    wrap: Wrap = lambda prefix, fn: wrap_transform(fn, prefix)
    return twin_dataset(dataset, wrap, _wrap_loader, swaps=swaps)


def _bound_to(fn: Any, dataset: Any, twin: Any) -> Any:
    """``fn``, but a method of ``dataset`` (``def transform(self, x)``) bound to its copy instead,
    so it sees the state the loader's workers set on the copy."""
    if isinstance(fn, types.MethodType) and fn.__self__ is dataset and twin is not dataset:
        return types.MethodType(fn.__func__, twin)
    return fn


def _wrap_joint(joint: Any, changes: dict[str, Any], wrap: Wrap) -> Any:
    """VisionDataset's ``transforms``: a StandardTransform over the wrapped parts, or a chain."""
    if type(joint).__name__ == "StandardTransform":
        twin = copy.copy(joint)
        for attr in TRANSFORM_ATTRS:
            if attr in changes:
                setattr(twin, attr, changes[attr])
        return twin
    return wrap("transform", joint)


__all__ = ["clock", "instrument_dataset", "name_of", "twin_dataset", "wrap_transform"]
