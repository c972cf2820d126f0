"""``pipeprof.profile``: iterate a data pipeline on its own and report where its time goes."""

from __future__ import annotations

import sys
from typing import Any

from pipeprof.recorder import clock, measure_overhead
from pipeprof.report import Report
from pipeprof.session import Session


def _check_batches(batches: int | None) -> None:
    if batches is None:
        return
    if isinstance(batches, bool) or not isinstance(batches, int):
        raise TypeError(f"batches must be a positive int or None, got {batches!r}")
    if batches <= 0:
        raise ValueError(f"batches must be at least 1, got {batches}; use None for a whole epoch")


def _is_torch_loader(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.utils.data.DataLoader)


def _is_tf_dataset(obj: Any) -> bool:
    tf = sys.modules.get("tensorflow")  # never imported here: only a tf.data object brings it
    return tf is not None and isinstance(obj, tf.data.Dataset)


def profile(loader: Any, batches: int | None = None, device: Any = None) -> Report:
    """Iterate ``loader`` for ``batches`` batches (None: one epoch) and report its stages.

    ``loader`` is a ``torch.utils.data.DataLoader`` or a ``tf.data.Dataset`` (one batch is one
    element; see docs/tfdata.md). With ``device`` (``"cuda"``, a
    ``torch.device``) each batch is moved there as a training loop would and ``transfer/h2d`` is
    timed. The user's loader, dataset and transforms are not modified. Exceptions raised by the
    dataset, transforms or ``collate_fn`` propagate unchanged; Ctrl-C stops early and returns a
    report of what was measured (``report["interrupted"]`` is True).
    """
    _check_batches(batches)
    if _is_tf_dataset(loader):  # a tf.data.Dataset: traced with TensorFlow's profiler
        from pipeprof.collectors.tfdata import profile_dataset

        return profile_dataset(loader, batches, device)
    if not _is_torch_loader(loader):
        raise TypeError(
            f"pipeprof.profile() needs a torch.utils.data.DataLoader (or a tf.data.Dataset), got "
            f"{type(loader).__name__}; "
            "wrap a dataset first: DataLoader(dataset, batch_size=..., num_workers=...)"
        )
    _check_not_empty(loader)
    from pipeprof.collectors.torch import ProfiledLoader

    session = Session(framework="torch", mode="loader")
    session.overhead_ns = measure_overhead()
    profiled = ProfiledLoader(loader, session, device)
    session.start_ns = clock()
    batches_iter = iter(profiled)
    try:
        for i, _ in enumerate(batches_iter):
            if batches is not None and i + 1 >= batches:
                break
    except KeyboardInterrupt:
        session.interrupted = True
    finally:
        batches_iter.close()  # type: ignore[attr-defined]
        session.end_ns = clock()
    if session.batches == 0 and not session.interrupted:
        raise ValueError(
            "the loader yielded no batches: is its dataset empty, or is drop_last=True "
            "with fewer samples than batch_size?"
        )
    return Report(session)


def _check_not_empty(loader: Any) -> None:
    try:
        n = len(loader)
    except TypeError:  # an IterableDataset without __len__: find out by iterating
        return
    if n == 0:
        raise ValueError(
            f"the DataLoader has no batches (len(dataset)={_len(loader.dataset)}, "
            f"batch_size={loader.batch_size}, drop_last={loader.drop_last}): give it data"
        )


def _len(dataset: Any) -> str:
    try:
        return str(len(dataset))
    except TypeError:
        return "unknown"


def load(path: Any) -> Report:
    """Load a report saved with ``Report.save`` (or a raw session file)."""
    return Report.load(path)
