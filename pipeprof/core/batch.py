"""How many samples a batch holds: one rule for every framework and collector."""

from __future__ import annotations

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
