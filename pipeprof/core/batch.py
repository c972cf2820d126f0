"""How many samples a batch holds: one rule for every framework and collector."""

from __future__ import annotations

import heapq
import zlib
from array import array
from collections.abc import Mapping
from typing import Any


def batch_size(batch: Any) -> int:
    """Samples in a collated batch of unknown structure: the leading dimension of its first array
    (torch, NumPy, tf.Tensor), looking through tuples, lists and dicts; a list of non-arrays counts
    its items; anything else (a scalar, an object) is one sample."""
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0 and shape[0] is not None:
        return int(shape[0])
    if isinstance(batch, dict) and batch:
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        return (
            batch_size(first)
            if hasattr(first, "shape") or isinstance(first, (list, tuple, dict))
            else len(batch)
        )
    return 1


def samples_to_collate(samples: Any) -> int:
    """Samples handed to ``collate_fn``: a list of samples, or one batch of columns (a dict that a
    dataset's ``__getitems__`` returned), counted by its first column."""
    if isinstance(samples, dict):
        first = next(iter(samples.values()), None)
        return samples_to_collate(first) if first is not None else 1
    try:
        return len(samples)
    except TypeError:
        return 1


def batch_nbytes(batch: Any, depth: int = 0) -> int:
    """Bytes of the arrays in a batch (torch, NumPy: ``nbytes``), looking through tuples, lists
    and dicts: what moves from a worker to the training process per batch."""
    n = getattr(batch, "nbytes", None)
    if isinstance(n, int):
        return n
    if depth > 4:
        return 0
    if isinstance(batch, dict):
        return sum(batch_nbytes(v, depth + 1) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v, depth + 1) for v in batch[:64])
    return 0


def sample_kinds(sample: Any, depth: int = 0) -> list[str]:
    """What one sample handed to ``collate_fn`` holds, for the collate finding's fix: the kinds
    of its fields, sorted: ``tensor`` (torch, tf), ``ndarray``, ``list`` (a Python sequence of
    numbers, as tokenizers return), ``number``, ``str``, ``other``. Looks through dicts, tuples
    and lists of fields, 3 levels deep."""
    kinds: set[str] = set()
    if isinstance(sample, (Mapping, list, tuple)) and depth < 3 and sample:
        items = list(sample.values() if isinstance(sample, Mapping) else sample)[:64]
        if all(isinstance(x, (int, float, bool)) for x in items) and depth > 0:
            return ["list"]  # a field that is a sequence of numbers
        for item in items:
            kinds.update(sample_kinds(item, depth + 1))
        return sorted(kinds)
    module = type(sample).__module__.split(".")[0]
    if hasattr(sample, "shape") and module in ("torch", "tensorflow"):
        return ["tensor"]
    if module == "numpy" and hasattr(sample, "shape"):
        return ["ndarray" if sample.shape else "number"]
    if isinstance(sample, (int, float, bool)):
        return ["number"]
    return ["str"] if isinstance(sample, (str, bytes)) else ["other"]


# NOTE [ Sample fingerprints ]
# A sample of an iterable dataset has no index: it is known by its content. ``fingerprint`` is a
# 32-bit CRC of what identifies it cheaply: the shape and up to FINGERPRINT_ELEMENTS elements,
# evenly spaced, of each array in it; strings (their first 1,024 characters), bytes (first 4 KiB)
# and numbers whole; dicts, lists and tuples through their items; any other object by its type
# alone. It is the same in every process (no ``hash()``, whose strings differ between spawned
# workers), and costs 10-15 µs a sample (a 3x224x224 tensor and its label; a dict of 128 token
# ids and a label): it is taken in each worker's first IDS_BATCHES profiled batches only
# (collect/torch/loader.py's ``Collate``). Two samples with the same fingerprint may still
# differ: analyze/accounting.py asks for whole sequences that match, never one sample.
FINGERPRINT_ELEMENTS = 32


def fingerprint(sample: Any, crc: int = 0) -> int:
    """A content fingerprint of one sample (NOTE [ Sample fingerprints ]), chained on ``crc``."""
    if isinstance(sample, (bytes, bytearray)):
        return zlib.crc32(bytes(sample[:4096]), crc)
    if isinstance(sample, str):
        return zlib.crc32(sample[:1024].encode("utf-8", "surrogatepass"), crc)
    if sample is None or isinstance(sample, (bool, int, float, complex)):
        return zlib.crc32(repr(sample).encode(), crc)
    if isinstance(sample, Mapping):
        for key in sorted(sample, key=str):
            crc = fingerprint(sample[key], fingerprint(key, crc))
        return crc
    if isinstance(sample, (list, tuple)):
        for item in sample[:64]:
            crc = fingerprint(item, crc)
        return crc
    shape = getattr(sample, "shape", None)
    if shape is not None and hasattr(sample, "reshape"):
        try:
            flat = sample.reshape(-1)
            step = max(1, len(flat) // FINGERPRINT_ELEMENTS)
            part = flat[: step * FINGERPRINT_ELEMENTS : step]
            try:
                data = (part.numpy() if hasattr(part, "numpy") else part).tobytes()
            except (TypeError, RuntimeError, AttributeError):  # bfloat16, on a device
                data = repr(part.tolist()).encode()
            return zlib.crc32(data, zlib.crc32(str(shape).encode(), crc))
        except Exception:  # an array type of its own: known by its shape
            return zlib.crc32(str(shape).encode(), crc)
    return zlib.crc32(type(sample).__name__.encode(), crc)


FINGERPRINT_PARTS = 4


def fingerprints(samples: Any, per_sample: bool) -> bytes:
    """The fingerprints of the samples handed to ``collate_fn`` (one sample where
    ``per_sample``): FINGERPRINT_PARTS a sample, one per part (the items of a tuple or list, the
    values of a dict by sorted key, else the sample whole; 0 where it has no such part), packed
    as unsigned 32-bit integers. A part alone can match across workers where the whole does not
    (a label, where each worker draws its own random crop of the same image)."""
    items = [samples] if per_sample or not isinstance(samples, (list, tuple)) else samples
    out = array("I")
    for sample in items:
        if isinstance(sample, Mapping):
            parts = [sample[k] for k in sorted(sample, key=str)[:FINGERPRINT_PARTS]]
        elif isinstance(sample, (list, tuple)):
            parts = list(sample[:FINGERPRINT_PARTS])
        else:
            parts = [sample]
        got = [fingerprint(part) or 1 for part in parts]  # 0: no such part
        out.extend(got + [0] * (FINGERPRINT_PARTS - len(got)))
    return out.tobytes()


# NOTE [ Index sketches ]
# Which samples a rank's first pass read, in a few kilobytes (distributed jobs only: ranks are
# what the sketches are compared between): the SKETCH_K smallest hashes of
# the integer indices its map-style dataset was read at (a bottom-k sketch; each process keeps
# its own, and they merge: the k smallest of their union). Two ranks' sketches estimate the
# share of samples they have in common (the Jaccard index; exact below k distinct samples, else
# within a few percent): about 1 for ranks that each read the whole dataset (no
# DistributedSampler), 0 for a sampler that splits it. The hash is Knuth's multiplicative one
# on 32 bits, the same in every process, and costs about 0.15 µs an index (1.2 µs a batch of 8,
# in the process that reads them); indices that are not integers are not sketched.
SKETCH_K = 256
_GOLDEN = 0x9E3779B1
_M32 = 0xFFFFFFFF


class Sketch:
    """A bottom-k sketch of integer indices (NOTE [ Index sketches ])."""

    __slots__ = ("_heap", "_members", "_thr", "version")

    def __init__(self) -> None:
        self._heap: list[int] = []  # negated: the largest kept on top
        self._members: set[int] = set()
        self._thr = 1 << 32
        self.version = 0  # changes when the kept hashes do

    def add(self, indices: Any) -> None:
        """Sketch the integer ones of ``indices``."""
        thr, members = self._thr, self._members
        for i in indices:
            if type(i) is int:
                h = (i * _GOLDEN) & _M32
                if h < thr and h not in members:
                    self._keep(h)
                    thr = self._thr

    def _keep(self, h: int) -> None:
        if len(self._heap) < SKETCH_K:
            heapq.heappush(self._heap, -h)
        else:
            self._members.discard(-heapq.heapreplace(self._heap, -h))
        self._members.add(h)
        if len(self._heap) == SKETCH_K:
            self._thr = -self._heap[0]
        self.version += 1

    def values(self) -> list[int]:
        return sorted(self._members)

    def packed(self) -> bytes:
        """The kept hashes, unsorted, as unsigned 32-bit integers (what a worker ships)."""
        return array("I", self._members).tobytes()


def merged(sketches: list[list[int]]) -> list[int]:
    """The sketch of the union of the sets these sketches are of."""
    return sorted(set().union(*sketches))[:SKETCH_K]


def overlap(a: list[int], b: list[int]) -> float | None:
    """The estimated share of the two sets' samples they have in common (Jaccard); None for an
    empty sketch."""
    if not a or not b:
        return None
    union = merged([a, b])
    both = set(a) & set(b)
    return sum(h in both for h in union) / len(union)
