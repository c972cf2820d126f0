"""The dataset's large containers of Python objects, which forked workers copy as they read
them (NOTE [ Copy-on-read ]).

NOTE [ Copy-on-read ]
A forked worker shares the training process's memory until either writes a page. Reading a
Python object writes it: its reference count goes up and down. So a worker that reads the items
of a list, dict or tuple of Python objects (strings, numbers, tuples: paths, labels, captions)
copies every page it reads them from, and each of N workers ends up with its own copy: memory
that grows through the epoch, N times over (pytorch/pytorch#13246 is the long thread). Arrays
(numpy, Arrow, torch) hold their items in one buffer with one reference count: reading them
writes nothing. At a loader's first pass the dataset's attributes (and those of a dataset it
wraps: ``dataset.dataset``, as ``Subset`` keeps it) are looked at once: each list, tuple, dict or
set of at least LEAST_ITEMS items is sized from a sample of its items (``sys.getsizeof``), and
those of LEAST_MB or more are kept in ``meta["py_containers"]`` (the largest PY_KEPT). The
workers' private memory (NOTE [ Private memory ] in collect/samplers/host.py) is then held
against their size (analyze/memory.py).
"""

from __future__ import annotations

import sys
from typing import Any

LEAST_ITEMS = 10_000
LEAST_MB = 16.0
PY_KEPT = 5
SAMPLED = 64  # items sized to estimate a container's


def python_containers(dataset: Any) -> list[dict[str, Any]]:
    """``{name, kind, items, mb}`` of the dataset's large containers of Python objects, the
    largest first (NOTE [ Copy-on-read ])."""
    found: list[dict[str, Any]] = []
    inner = getattr(dataset, "dataset", None)
    for prefix, obj in (("dataset", dataset), ("dataset.dataset", inner)):
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            continue
        for name, value in list(attrs.items()):
            got = _sized(value)
            if got is not None:
                kind, items, mb = got
                found.append({"name": f"{prefix}.{name}", "kind": kind, "items": items,
                              "mb": round(mb, 1)})  # fmt: skip
    return sorted(found, key=lambda c: -c["mb"])[:PY_KEPT]


def _sized(value: Any) -> tuple[str, int, float] | None:
    """(kind, items, MB) of a large container of Python objects, else None."""
    if not isinstance(value, (list, tuple, dict, set, frozenset)):
        return None
    n = len(value)
    if n < LEAST_ITEMS:
        return None
    try:
        if isinstance(value, dict):
            keys = [k for _, k in zip(range(SAMPLED), value)]
            sample = [*keys, *(value[k] for k in keys)]
        elif isinstance(value, (set, frozenset)):
            sample = [x for _, x in zip(range(SAMPLED), value)]
        else:
            step = max(1, n // SAMPLED)
            sample = [value[i] for i in range(0, n, step)][:SAMPLED]
    except Exception:  # a container that refuses to be read is not judged
        return None
    each = sum(sys.getsizeof(x) for x in sample) / max(1, len(sample))
    if isinstance(value, dict):
        each *= 2  # a key and a value an item
    mb = (sys.getsizeof(value) + each * n) / 2**20
    if mb < LEAST_MB:
        return None
    items = {type(x).__name__ for x in sample}
    of = next(iter(items)) if len(items) == 1 else "mixed"
    return f"{type(value).__name__} of {of}", n, mb
