"""How many samples a batch holds: one rule for every framework and collector."""

from __future__ import annotations

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
