"""Storage encodings a benchmark can write its samples in, and read them back.

Each ``Codec`` writes the fixed samples (numpy arrays, as decoded) to a folder and gives a reader
that turns one stored sample back into what the dataset's loader gave (a PIL image, an array, a
tensor), so the transforms downstream get the same input and only the read and decode change. A
codec that cannot hold the samples (float data in JPEG, an alpha channel in JPEG) says why
(``refuses``) instead of writing them: its row is not applicable, never a wrong number.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

PRESIZE_MARGIN = 256 / 224  # ImageNet's resize-then-crop ratio: stored shorter side / crop size
MANY_PER_CHUNK = 16  # samples per chunk of the "many samples per chunk" HDF5 rows
GZIP_LEVEL = 4  # h5py's default

IMAGE_KINDS = ("jpeg", "png", "webp")
SUFFIX = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "npy": ".npy"}
FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}  # Pillow's format names
NAMES = {"jpeg": "JPEG", "png": "PNG", "webp": "WebP"}


@dataclass(frozen=True)
class Codec:
    """One encoding: ``kind`` (jpeg, png, webp, npy, hdf5), ``quality`` for lossy images,
    ``presize`` (shorter side in px the images are resized to first), ``compression`` (HDF5:
    None, gzip, lzf) and ``per_chunk`` (HDF5 samples per chunk)."""

    kind: str
    quality: int | None = None
    presize: int | None = None
    compression: str | None = None
    per_chunk: int = 1

    @property
    def name(self) -> str:
        if self.kind == "hdf5":
            chunk = "1 sample" if self.per_chunk == 1 else f"{self.per_chunk} samples"
            return f"HDF5 {self.compression or 'uncompressed'}, {chunk}/chunk"
        if self.kind == "npy":
            return "npy (raw)"
        name = NAMES[self.kind]
        if self.quality is not None:
            name += f" q{self.quality}"
        if self.presize:  # -1: presized, the size not known yet
            name += f", presized {self.presize}px" if self.presize > 0 else ", presized"
        return name

    @property
    def lossy(self) -> bool:
        return self.presize is not None or self.kind in ("jpeg", "webp")


@dataclass
class Store:
    """Samples written by a codec: ``keys`` to read them by, a ``reader`` (key -> sample, as the
    dataset's loader gave it), the bytes on disk and what to close afterwards."""

    keys: list[Any]
    reader: Callable[[Any], Any]
    bytes_total: int
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for fn in self.closers:
            fn()


def refuses(codec: Codec, arrays: Sequence[Any], webp: bool) -> str | None:
    """Why ``codec`` cannot store these samples (a sentence), or None when it can."""
    first = arrays[0]
    differ = any(a.shape != first.shape or a.dtype != first.dtype for a in arrays)
    if codec.kind == "hdf5" and codec.per_chunk > 1 and differ:
        return "samples differ in shape or dtype: one sample per chunk only"
    if codec.kind not in IMAGE_KINDS:
        return None
    if codec.kind == "webp" and not webp:
        return "this Pillow has no WebP support (PIL.features.check('webp') is False)"
    if first.dtype.kind != "u" or first.dtype.itemsize != 1:
        return f"{first.dtype} samples: {NAMES[codec.kind]} stores 8-bit images"
    channels = 1 if first.ndim == 2 else first.shape[-1] if first.ndim == 3 else 0
    if channels not in (1, 3, 4) or (first.ndim == 3 and first.shape[-1] == 1):
        shape = "×".join(map(str, first.shape))
        return f"samples of shape {shape} are no image (H×W, H×W×3 or H×W×4)"
    if channels == 4 and codec.kind == "jpeg":
        return "JPEG has no alpha channel (the samples are RGBA)"
    return None


def _image(arr: Any, presize: int | None) -> Any:
    """An array (or a PIL image) as a PIL image, resized to ``presize`` px on its shorter side
    when it is larger."""
    from PIL import Image

    img = arr if hasattr(arr, "getbands") else Image.fromarray(arr)
    if presize and min(img.size) > presize:
        w, h = img.size
        scale = presize / min(w, h)
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        img = img.resize(size, Image.Resampling.BICUBIC)
    return img


def write(codec: Codec, arrays: Sequence[Any], folder: str, like: Callable[[Any], Any]) -> Store:
    """Write ``arrays`` with ``codec`` under ``folder``; ``like`` turns a decoded array into what
    the dataset's loader gives (PIL image, tensor, array)."""
    os.makedirs(folder, exist_ok=True)
    if codec.kind == "hdf5":
        return _write_h5(codec, arrays, os.path.join(folder, "samples.h5"), like)
    paths = [os.path.join(folder, f"{i:05d}{SUFFIX[codec.kind]}") for i in range(len(arrays))]
    if codec.kind == "npy":
        import numpy as np

        for arr, path in zip(arrays, paths):
            np.save(path, arr)
        reader: Callable[[Any], Any] = NpyReader(like)
    else:
        options: dict[str, Any] = {}
        if codec.quality is not None:
            options["quality"] = codec.quality
        if codec.kind == "png":
            options["compress_level"] = 6  # Pillow's default
        for arr, path in zip(arrays, paths):
            _image(arr, codec.presize).save(path, FORMATS[codec.kind], **options)
        reader = ImageReader(like)
    return Store(paths, reader, sum(os.path.getsize(p) for p in paths))


class ImageReader:
    """Opens and decodes an image file as torchvision's ``pil_loader`` does, then ``like``."""

    def __init__(self, like: Callable[[Any], Any]) -> None:
        self.like = like

    def __call__(self, path: str) -> Any:
        from PIL import Image

        with open(path, "rb") as f:
            img = Image.open(f)
            img.load()
        return self.like(img)


class NpyReader:
    def __init__(self, like: Callable[[Any], Any]) -> None:
        self.like = like

    def __call__(self, path: str) -> Any:
        import numpy as np

        return self.like(np.load(path))


class H5Reader:
    """Reads ``name[key]`` from an HDF5 file opened once; without a chunk cache (``cache``
    False) every read decodes the chunks it touches, as random reads over a dataset much larger
    than the cache do."""

    def __init__(self, path: str, like: Callable[[Any], Any], cache: bool = True) -> None:
        import h5py

        options = {} if cache else {"rdcc_nbytes": 0}
        self.file = h5py.File(path, "r", **options)
        self.like = like

    def __call__(self, key: tuple[str, Any]) -> Any:
        name, sel = key
        return self.like(self.file[name][sel])

    def close(self) -> None:
        self.file.close()


def _write_h5(codec: Codec, arrays: Sequence[Any], path: str, like: Callable[[Any], Any]) -> Store:
    import h5py
    import numpy as np

    options: dict[str, Any] = {}
    if codec.compression:
        options["compression"] = codec.compression
        if codec.compression == "gzip":
            options["compression_opts"] = GZIP_LEVEL
    first = arrays[0]
    same = all(a.shape == first.shape and a.dtype == first.dtype for a in arrays)
    with h5py.File(path, "w") as f:
        if same:  # one dataset, samples along the first axis, as datasets are usually stored
            chunks = (min(codec.per_chunk, len(arrays)), *first.shape)
            f.create_dataset("x", data=np.stack(arrays), chunks=chunks, **options)
            keys: list[Any] = [("x", i) for i in range(len(arrays))]
        else:  # samples of different shapes: a dataset each, one chunk each
            for i, arr in enumerate(arrays):
                f.create_dataset(f"s{i}", data=arr, chunks=arr.shape or None, **options)
            keys = [(f"s{i}", ()) for i in range(len(arrays))]
    reader = H5Reader(path, like, cache=False)
    return Store(keys, reader, os.path.getsize(path), [reader.close])


def psnr_db(a: Any, b: Any) -> float | None:
    """Peak signal-to-noise ratio of ``b`` against ``a`` in dB (inf: identical); None when they
    cannot be compared (shapes differ)."""
    import numpy as np

    if a.shape != b.shape:
        return None
    diff = a.astype(np.float64) - b.astype(np.float64)
    mse = float(np.mean(diff * diff))
    if mse == 0:
        return math.inf
    peak = 255.0 if a.dtype.kind == "u" and a.dtype.itemsize == 1 else float(np.max(np.abs(a)))
    return 10 * math.log10(peak * peak / mse) if peak > 0 else None


# The IJG's base luminance quantisation table (JPEG standard, Annex K) in row-major order, as
# Pillow gives ``Image.quantization``; quality q scales it by 5000/q (q < 50) or 200 - 2q.
_LUMA = (16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57,
         69, 56, 14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64,
         81, 104, 113, 92, 49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103,
         99)  # fmt: skip


def jpeg_quality(path: str) -> int | None:
    """The IJG quality (1-100) whose luminance table is closest to the file's; None if the file
    is no JPEG or uses tables of its own."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            table = list(getattr(img, "quantization", {}).get(0, ()))
    except OSError:
        return None
    if len(table) != 64:
        return None

    def scaled(q: int) -> list[int]:
        s = 5000 // q if q < 50 else 200 - 2 * q
        return [min(255, max(1, (v * s + 50) // 100)) for v in _LUMA]

    errs = {q: sum(abs(a - b) for a, b in zip(scaled(q), table)) for q in range(1, 101)}
    best = min(errs, key=lambda q: errs[q])
    return best if errs[best] <= 64 else None  # within 1 per entry on average


def crop_size(steps: Sequence[tuple[str, Any]]) -> tuple[int | None, str]:
    """The shorter side to presize images to, from the transforms, and how it was found: a
    ``Resize`` to an int before any crop gives its size (the transform then has nothing left to
    do); else the last crop's size × 256/224 (ImageNet's margin: crops still have room)."""
    crop: int | None = None
    for path, fn in steps:
        name = type(fn).__name__
        size = getattr(fn, "size", None)
        side = _side(size)
        if side is None:
            continue
        one = isinstance(size, int) or (isinstance(size, list | tuple) and len(size) == 1)
        if name == "Resize" and crop is None and one:
            return side, f"{path}({side}) comes first"
        if "Crop" in name or name == "Resize":
            crop = side
            where = path
    if crop is None:
        return None, "no crop or resize in the transforms: no size to presize to"
    return math.ceil(crop * PRESIZE_MARGIN), f"{where} to {crop} px × 256/224"


def _side(size: Any) -> int | None:
    if isinstance(size, int):
        return size
    if isinstance(size, list | tuple) and size and all(isinstance(v, int) for v in size):
        return int(min(size))
    return None


def convert_folder(src: str | os.PathLike[str], dst: str | os.PathLike[str], codec: Codec) -> int:
    """Write every image under ``src`` (an ImageFolder layout) to the same place under ``dst``
    in ``codec``'s image format (presized when it says so); returns the files written. What a
    ``bench_encodings`` row predicts, for a whole dataset."""
    from PIL import Image

    if codec.kind not in IMAGE_KINDS or (codec.presize or 0) < 0:
        raise ValueError(f"{codec.name}: only JPEG, PNG and WebP folders can be written")
    options = {"quality": codec.quality} if codec.quality is not None else {}
    count = 0
    for folder, _, files in os.walk(src):
        for name in sorted(files):
            try:
                img = Image.open(os.path.join(folder, name))
            except OSError:  # not an image
                continue
            out = os.path.join(dst, os.path.relpath(folder, src))
            os.makedirs(out, exist_ok=True)
            stem = os.path.splitext(name)[0] + SUFFIX[codec.kind]
            with img:
                rgb = img.convert("RGB") if codec.kind == "jpeg" else img.copy()
            _image(rgb, codec.presize).save(os.path.join(out, stem), FORMATS[codec.kind], **options)
            count += 1
    return count
