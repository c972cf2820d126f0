"""Where a benchmark's samples come from, timed as ``load``.

For a dataset, ``load`` is ``dataset[i]`` minus its transforms, as the profiler defines it: a
shallow copy of the dataset (the user's object is never modified) gets stand-ins for its
``transform`` / ``target_transform`` / ``transforms`` that call the originals, time them and keep
their inputs. Those inputs are what the transform steps are then benchmarked on, one by one. An
ImageFolder-style dataset with PIL's loader also gets ``load/read`` (the file's bytes) and
``load/decode`` (bytes to an RGB image) timed apart on the same files.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import io
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from pipeprof.bench.isolation import (
    StageResult,
    Step,
    describe_outputs,
    run_delay_ns,
    steps_of,
    time_calls,
)
from pipeprof.collect.torch.dataset import twin_dataset
from pipeprof.core.detect import is_torch_loader

Inputs = list[tuple[int, Any]]


class _Acc:
    """Time spent in a dataset's transform during one ``__getitem__``, and its last input."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.calls = 0
        self.failed = False
        self.args: tuple[Any, ...] | None = None


#: What ``dataset[i]`` gave when its transform raised: the load worked, the sample did not.
FAILED_IN_TRANSFORM = object()


class Capture:
    """Calls ``fn`` (the user's transform), timed into ``acc``; keeps its input when ``keep``."""

    def __init__(self, fn: Callable[..., Any], acc: _Acc, keep: bool = True) -> None:
        self.fn, self.acc, self.keep = fn, acc, keep

    def __call__(self, *args: Any) -> Any:
        acc = self.acc
        if self.keep:
            acc.args = args
            acc.calls += 1
        d0 = run_delay_ns()
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        try:
            return self.fn(*args)
        except Exception:
            acc.failed = True
            raise
        finally:
            acc.cpu += time.process_time_ns() - c0
            acc.wall += time.perf_counter_ns() - t0 - (run_delay_ns() - d0)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "fn" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.fn, name)


@dataclass
class Chain:
    """One transform of the dataset and the inputs it got (``calls`` per sample, usually 1)."""

    prefix: str
    steps: list[Step]
    multi: bool
    inputs: Inputs = field(default_factory=list)
    calls: float = 1.0
    results: list[StageResult] = field(default_factory=list)


@dataclass
class Loaded:
    """The fixed samples: ``load`` and its parts, the chains to benchmark, and the samples as
    the dataset returns them (``finals``, for collate)."""

    load: StageResult
    parts: list[StageResult] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    finals: Inputs = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    count: int = 0


def pick(total: int, samples: int | list[int], seed: int) -> list[int]:
    """The fixed sample set: given indices, or ``samples`` indices drawn with ``seed`` (sorted)."""
    if not isinstance(samples, int):
        if not samples:
            raise ValueError("samples is an empty list of indices: give at least one")
        return [int(i) for i in samples]
    if samples <= 0:
        raise ValueError(f"samples must be at least 1, got {samples}")
    if total <= samples:
        return list(range(total))
    return sorted(random.Random(seed).sample(range(total), samples))


def _wrap(fn: Any, acc: _Acc) -> Any:
    if isinstance(fn, (list, tuple)):  # a list the dataset iterates itself: time every element
        return [Capture(t, acc, keep=i == 0) for i, t in enumerate(fn)]
    return Capture(fn, acc)


def twin(dataset: Any, accs: dict[str, tuple[_Acc, Any]]) -> tuple[Any, list[str]]:
    """A copy of ``dataset`` with its transforms captured in ``accs`` (one per stage prefix, the
    first found): the same walk as the profiler's (``twin_dataset``), so both split alike."""

    def capture(prefix: str, fn: Any) -> Any:
        if prefix in accs:
            return fn
        accs[prefix] = (_Acc(), fn)
        return _wrap(fn, accs[prefix][0])

    return twin_dataset(dataset, capture)


def from_dataset(dataset: Any, indices: list[int], repeat: int, warmup: int, seed: int) -> Loaded:
    """Time ``dataset[i]`` minus its transforms; keep each transform's inputs and the samples."""
    accs: dict[str, tuple[_Acc, Any]] = {}
    copy_, failed = twin(dataset, accs)
    if failed:  # a dataset that cannot be copied is timed whole
        copy_, accs = dataset, {}
        note = f"{'; '.join(failed)}: its transforms count as load"
    else:
        if copy_ is dataset:  # nothing to wrap: a copy all the same, so that a file opened
            with contextlib.suppress(Exception):  # lazily in __getitem__ stays out of theirs
                copy_ = copy.copy(dataset)
        note = (
            ""
            if accs
            else (
                f"{type(dataset).__name__} has no transform attribute: "
                "__getitem__ is timed whole as load; pass transforms=[...] to "
                "benchmark steps"
            )
        )
    res = StageResult("load")
    captured: dict[str, Inputs] = {p: [] for p in accs}
    finals: Inputs = []
    calls = dict.fromkeys(accs, 0)

    def get(i: int) -> Any:
        for acc, _ in accs.values():
            acc.wall = acc.cpu = acc.calls = 0
            acc.failed, acc.args = False, None
        d0 = run_delay_ns()
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        try:
            sample = copy_[i]
        except Exception:
            if not any(a.failed for a, _ in accs.values()):
                raise
            sample = FAILED_IN_TRANSFORM  # the transform's step reports it
        c1, t1 = time.process_time_ns(), time.perf_counter_ns()
        waited = run_delay_ns() - d0
        inner_wall = sum(a.wall for a, _ in accs.values())
        inner_cpu = sum(a.cpu for a, _ in accs.values())
        return sample, (t1 - t0 - waited - inner_wall, c1 - c0 - inner_cpu)

    first = True
    for _ in range(max(1, repeat)):
        finals_now: Inputs = []
        for pos, (sample, _cost) in _timed_getitem(res, get, indices, warmup if first else 0, seed):
            if sample is not FAILED_IN_TRANSFORM:
                finals_now.append((pos, sample))
            if first:
                for p, (acc, _) in accs.items():
                    if acc.args is not None:
                        captured[p].append((pos, acc.args))
                        calls[p] += acc.calls
        if first:
            finals = finals_now
        first = False
    loaded = Loaded(res, finals=finals, notes=[note] if note else [], count=len(indices))
    for prefix, (_, fn) in accs.items():
        steps, multi = steps_of(fn, prefix)
        ins = [(p, a[0] if len(a) == 1 else a) for p, a in captured[prefix]]
        per = calls[prefix] / len(ins) if ins else 1.0
        loaded.chains.append(Chain(prefix, steps, multi, ins, per))
        if per > 1.01:
            loaded.notes.append(
                f"{prefix} runs {per:.3g} times per sample: its steps count that "
                "many times in the predictions"
            )
    first_inputs = loaded.chains[0].inputs if loaded.chains else finals
    describe_outputs(res, [x for _, x in first_inputs])  # what the transforms get
    loaded.parts = split_load(dataset, [p for p, _ in finals], repeat, warmup, seed)
    return loaded


def _timed_getitem(
    res: StageResult, get: Callable[[int], Any], indices: list[int], warmup: int, seed: int
) -> list[tuple[int, Any]]:
    """One pass of ``get`` over ``indices`` into ``res`` (load self time = getitem - transforms)."""
    from pipeprof.bench.isolation import seed_all

    for i in indices[:warmup]:
        try:
            get(i)
        except Exception:
            pass
    seed_all(seed)
    out, wall_sum, cpu_sum = [], 0, 0
    failed = set(res.errors.get("samples", []))
    for i in indices:
        if i in failed:
            continue
        try:
            sample, (wall, cpu) = get(i)
        except Exception as exc:
            res.fail(i, exc)
            continue
        res.stat.add(max(0, wall))
        res.cpu_ns += max(0, cpu)
        wall_sum += max(0, wall)
        cpu_sum += max(0, cpu)
        out.append((i, (sample, (wall, cpu))))
    if out:
        res.pass_ms.append(wall_sum / len(out) / 1e6)
        res.pass_cpu_ms.append(cpu_sum / len(out) / 1e6)
    return out


def from_samples(
    source: Any, indices: list[int] | None, count: int, repeat: int, warmup: int, seed: int
) -> tuple[Loaded, Inputs]:
    """``load`` as ``source[i]`` (or ``next()`` on an iterable, one pass); the samples got."""
    res = StageResult("load")
    if indices is not None:
        got = time_calls(res, source.__getitem__, [(i, i) for i in indices], repeat, warmup, seed)
        return Loaded(res, count=len(indices)), got
    it, got, wall_sum = iter(source), [], 0
    for pos in range(count):
        d0 = run_delay_ns()
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        try:
            x = next(it)
        except StopIteration:
            break
        c1, t1 = time.process_time_ns(), time.perf_counter_ns()
        wall = max(0, t1 - t0 - (run_delay_ns() - d0))
        res.stat.add(wall)
        res.cpu_ns += c1 - c0
        wall_sum += wall
        got.append((pos, x))
    if got:
        res.pass_ms.append(wall_sum / len(got) / 1e6)
    note = (
        "samples come from an iterator: load is timed on one pass without warm-up, and "
        "worker runs replay the samples from memory"
    )
    return Loaded(res, notes=[note], count=len(got)), got


def image_paths(dataset: Any, indices: list[int], depth: int = 0) -> list[str] | None:
    """The files behind ``indices`` when the dataset (or one it wraps with ``Subset``) is
    ImageFolder-style with torchvision's PIL loader; else None."""
    loader, samples = getattr(dataset, "loader", None), getattr(dataset, "samples", None)
    if callable(loader) and isinstance(samples, list):
        from pipeprof.collect.torch.dataset import SplitLoader, _wrap_loader

        if not isinstance(_wrap_loader(loader), SplitLoader):
            return None
        return [str(samples[i][0]) for i in indices]
    inner, mapping = getattr(dataset, "dataset", None), getattr(dataset, "indices", None)
    if depth < 3 and inner is not None and mapping is not None:
        return image_paths(inner, [int(mapping[i]) for i in indices], depth + 1)
    return None


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _decode(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def split_load(
    dataset: Any, indices: list[int], repeat: int, warmup: int, seed: int
) -> list[StageResult]:
    """``load/read`` and ``load/decode`` for an ImageFolder-style dataset; else nothing."""
    paths = image_paths(dataset, indices) if indices else None
    if not paths:
        return []
    read, decode = StageResult("load/read"), StageResult("load/decode")
    data = time_calls(read, _read, list(zip(indices, paths)), repeat, warmup, seed)
    time_calls(decode, _decode, data, repeat, warmup, seed)
    return [read, decode]


def resolve(spec: str) -> tuple[Any, Any]:
    """``module:attr`` or ``path/to/file.py:attr`` to ``(source, transforms)`` for ``bench``.

    A class or a factory function is called with no arguments; what it gives may be a dataset, a
    DataLoader, or a ``(samples, transforms)`` pair.
    """
    mod_name, sep, attr = spec.rpartition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"expected module:factory or file.py:factory, got {spec!r}")
    if mod_name.endswith(".py") or os.sep in mod_name:
        module = import_file(mod_name)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # as ``python -m`` does
        module = importlib.import_module(mod_name)
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{mod_name} has no attribute {attr!r}") from None
    is_factory = callable(obj) and not hasattr(obj, "__getitem__") and not is_torch_loader(obj)
    if isinstance(obj, type) or is_factory:
        obj = _call(obj, spec)
    if isinstance(obj, tuple) and len(obj) == 2:
        return obj[0], obj[1]
    return obj, None


def import_file(path: str) -> ModuleType:
    """The module in ``path``, imported as ``python path`` sees it: under its own name with its
    folder first on ``sys.path``, so that the modules beside it import, and so that spawned
    DataLoader workers (which start with this ``sys.path``) find it to unpickle its objects."""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder: give a .py file, or package.module:factory")
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")
    full = os.path.realpath(path)
    folder, name = os.path.dirname(full), os.path.splitext(os.path.basename(full))[0]
    if folder in sys.path:
        sys.path.remove(folder)
    sys.path.insert(0, folder)
    module = sys.modules.get(name) or importlib.import_module(name)
    where = getattr(module, "__file__", None)
    if where is None or os.path.realpath(where) != full:
        taken = where or "a built-in module"
        raise ValueError(f"{path} would be module {name!r}, but that name is taken by {taken}: "
                         "rename the file")  # fmt: skip
    return module


def _call(factory: Callable[..., Any], spec: str) -> Any:
    """``factory()``, refused with advice when it needs arguments."""
    try:
        inspect.signature(factory).bind()
    except TypeError as exc:
        raise ValueError(
            f"{spec} cannot be called without arguments ({exc}): pipeprof bench calls it with "
            "none; point it at a function that takes none and returns the dataset"
        ) from None
    except ValueError:  # no signature to read (some built-ins): try the call
        pass
    return factory()
