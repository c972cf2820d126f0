"""How a dataset's samples are stored now, and the samples themselves as arrays, for
``pipeprof.bench_encodings`` (see NOTE [ Encoding what-if ] in encodings.py).

The samples are what the dataset's transforms get: ``dataset[i]`` is called on a copy (the
user's dataset is not modified, nor a lazily opened file left open in it) whose transforms keep
their input, or, where the load reads an h5py dataset, the array the largest read returned. The
current storage is told from the files (ImageFolder-style: format by suffix, JPEG quality from its
tables) or from the h5py dataset's layout; else it is unknown, and says so.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pipeprof.bench.codecs import H5Reader, ImageReader, jpeg_quality
from pipeprof.bench.isolation import steps_of
from pipeprof.bench.sources import _Acc, image_paths, twin


@dataclass
class Current:
    """How the samples are stored now: a ``label``, what to time as its read-and-decode
    (``reader`` over ``keys``, None: the whole load), bytes per sample (None: ``why``)."""

    label: str
    kind: str = "unknown"  # jpeg, png, webp, hdf5, unknown
    quality: int | None = None
    reader: Callable[[Any], Any] | None = None
    keys: list[Any] = field(default_factory=list)
    bytes_per_sample: float | None = None
    why: str = ""
    closers: list[Callable[[], None]] = field(default_factory=list)


@dataclass
class Captured:
    """The samples as arrays, how to turn an array back into what the loader gave, and how
    they are stored now."""

    arrays: list[Any]
    like: Callable[[Any], Any]
    current: Current
    steps: list[tuple[str, Any]]


def capture(dataset: Any, indices: list[int]) -> Captured:
    """The samples the transforms get, as arrays, and how they are stored now."""
    h5py = sys.modules.get("h5py")
    if h5py is not None and isinstance(dataset, h5py.Dataset):
        arrays = [dataset[i] for i in indices]
        cur = _h5_current(dataset, arrays[0])
        reader = H5Reader(str(dataset.file.filename), _same)
        cur.reader, cur.closers = reader, [reader.close]
        cur.keys = [(dataset.name, i) for i in indices]
        return Captured(arrays, _same, cur, [])
    accs: dict[str, tuple[_Acc, Any]] = {}
    copy_, _ = twin(dataset, accs)
    if copy_ is dataset:  # nothing to wrap: still read through a copy (lazily opened files)
        with contextlib.suppress(Exception):
            copy_ = copy.copy(dataset)
    first = accs.get("transform") or accs.get("transforms")
    steps = steps_of(first[1])[0] if first is not None and "transform" in accs else []
    try:
        samples, reads = _read_all(copy_, dataset, indices, first)
        hits = [r for r in reads if r is not None]
        if len(hits) == len(reads) and len({_h5_key(r[0]) for r in hits}) == 1:
            return _h5_captured(hits, steps)  # while the copy's file is open
    finally:
        close_opened(copy_, dataset)
    arrays = [_array(x, i) for x, i in zip(samples, indices)]
    like = _like(samples[0])
    paths = image_paths(dataset, indices)
    if paths:
        return Captured(arrays, like, _file_current(paths, like), steps)
    name = type(dataset).__name__
    h5like = all(hasattr(dataset, a) for a in ("shape", "dtype", "chunks"))
    why = (f"{name} is not an h5py.Dataset: how it stores samples is unknown" if h5like
           else f"{name} reads its samples itself: how it stores them is unknown")  # fmt: skip
    return Captured(arrays, like, Current(f"{name}[i] (storage unknown)", why=why), steps)


def _read_all(
    copy_: Any, dataset: Any, indices: list[int], first: tuple[_Acc, Any] | None
) -> tuple[list[Any], list[tuple[Any, Any, Any] | None]]:
    """Per sample: what the transform got (else what ``dataset[i]`` gave), and the largest h5py
    read made for it (None: none)."""
    samples, reads = [], []
    for i in indices:
        if first is not None:
            first[0].args = None
        with _h5_reads() as seen:
            sample = _get(copy_, dataset, i)
        if first is not None and first[0].args is not None:
            sample = first[0].args[0]
        if isinstance(sample, (tuple, list)) and sample:  # (image, target) pairs
            sample = sample[0]
        samples.append(sample)
        reads.append(max(seen, key=lambda r: r[2].nbytes) if seen else None)
    return samples, reads


def _get(copy_: Any, dataset: Any, i: int) -> Any:
    try:
        return copy_[i]
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"sample {i} of the {type(dataset).__name__}: no such file {exc.filename or exc}"
        ) from exc
    except Exception as exc:
        raise ValueError(
            f"reading sample {i} of the {type(dataset).__name__} failed ({type(exc).__name__}: "
            f"{exc}); every sample must read to be written in other encodings"
        ) from exc


@contextlib.contextmanager
def _h5_reads() -> Iterator[list[tuple[Any, Any, Any]]]:
    """The h5py reads (dataset, selection, array) made inside the block, when h5py is imported:
    ``h5py.Dataset.__getitem__`` is wrapped on the class for the block and put back after."""
    seen: list[tuple[Any, Any, Any]] = []
    h5py = sys.modules.get("h5py")
    if h5py is None:
        yield seen
        return
    cls = h5py.Dataset
    original = cls.__dict__["__getitem__"]

    def spy(self: Any, args: Any, *more: Any, **kw: Any) -> Any:
        out = original(self, args, *more, **kw)
        if hasattr(out, "nbytes"):
            seen.append((self, args, out))
        return out

    cls.__getitem__ = spy
    try:
        yield seen
    finally:
        cls.__getitem__ = original


def _h5_key(dset: Any) -> tuple[str, str]:
    return str(dset.file.filename), str(dset.name)


def _h5_captured(reads: list[Any], steps: list[tuple[str, Any]]) -> Captured:
    dset = reads[0][0]
    cur = _h5_current(dset, reads[0][2])
    reader = H5Reader(str(dset.file.filename), _same)
    cur.reader, cur.closers = reader, [reader.close]
    cur.keys = [(str(d.name), sel) for d, sel, _ in reads]
    return Captured([out for _, _, out in reads], _same, cur, steps)


def _h5_current(dset: Any, sample: Any) -> Current:
    """An h5py dataset's layout as a label, and its stored bytes per sample."""
    where = f"{os.path.basename(str(dset.file.filename))}:{dset.name}"
    if dset.is_virtual:
        return Current(f"HDF5 virtual dataset {where}", "hdf5", why="a virtual dataset: its data "
                       "lives in its source files, which are not followed")  # fmt: skip
    comp = "+".join(f for f in ("shuffle" if dset.shuffle else "", dset.compression or "") if f)
    if dset.chunks:
        label = f"HDF5 {comp or 'uncompressed'}, chunks {'×'.join(map(str, dset.chunks))}"
    else:
        label = "HDF5 contiguous (not chunked)"
    size = int(dset.id.get_storage_size())
    total = max(1, int(dset.size))
    per = size * int(getattr(sample, "size", 1)) / total
    if dset.id.get_create_plist().get_external_count():
        label += ", in external raw files"
    return Current(f"{label} ({where})", "hdf5", bytes_per_sample=per)


def _file_current(paths: list[str], like: Callable[[Any], Any]) -> Current:
    """Image files (ImageFolder-style): their format from the suffix, JPEG quality estimated."""
    suffix = os.path.splitext(paths[0])[1].lower()
    kind = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".webp": "webp"}.get(suffix, "unknown")
    quality = jpeg_quality(paths[0]) if kind == "jpeg" else None
    label = {"jpeg": "JPEG", "png": "PNG", "webp": "WebP"}.get(kind, f"{suffix or 'no suffix'}")
    if quality is not None:
        label += f" q≈{quality}"
    size = sum(os.path.getsize(p) for p in paths) / len(paths)
    return Current(f"{label} files", kind, quality, ImageReader(like), list(paths), size)


def close_opened(copy_: Any, dataset: Any) -> None:
    """Close h5py files that reading through the copy opened (a lazily opened ``self.f``)."""
    h5py = sys.modules.get("h5py")
    if h5py is None or copy_ is dataset:
        return
    mine, theirs = getattr(copy_, "__dict__", {}), getattr(dataset, "__dict__", {})
    for key, value in mine.items():
        if isinstance(value, h5py.File) and value is not theirs.get(key):
            with contextlib.suppress(Exception):
                value.close()


def _same(x: Any) -> Any:
    return x


def _array(x: Any, i: int) -> Any:
    """A sample as a numpy array (PIL image, tensor, array)."""
    import numpy as np

    if hasattr(x, "getbands"):
        return np.asarray(x)
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"sample {i} is a {type(x).__name__}: only images, arrays and tensors can "
                    "be written in other encodings")  # fmt: skip


class AsImage:
    """A stored sample back as a PIL image of ``mode``, as torchvision's ``pil_loader`` gives."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __call__(self, x: Any) -> Any:
        from PIL import Image

        return (x if hasattr(x, "getbands") else Image.fromarray(x)).convert(self.mode)


def as_array(x: Any) -> Any:
    import numpy as np

    return np.asarray(x)


def as_tensor(x: Any) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(np.asarray(x))


def _like(x: Any) -> Callable[[Any], Any]:
    if hasattr(x, "getbands"):
        return AsImage(x.mode)
    if hasattr(x, "detach"):
        return as_tensor
    return as_array
