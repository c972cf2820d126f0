"""A Hugging Face streaming dataset's steps, each a stage (docs/hfdatasets.md).

NOTE [ A Hugging Face stream's steps ]
A ``datasets.IterableDataset`` is a chain of "examples iterables", each iterating the one
before it: the shards' examples (``ExamplesIterable``: each file opened, its bytes fetched,
parsed into rows), then what the user chained (``.map(fn)``, ``.filter(fn)``,
``.shuffle(buffer_size=)``), then the features' formatting (``with_format``). While the pipeline
runs (``piped``: a worker's batches, a pass in the training process), each step's iterator is
timed as WebDataset's are (NOTE [ WebDataset pipelines ] in dataset.py): every ``next()`` is the
absolute stage ``load/<step>``, detached from the steps it pulls from, so each gets its own
time:

1. ``load/read``: the shards' examples, with the ``fetch`` of their bytes inside it
   (NOTE [ Timing network reads ] in collect/fetch.py): an ``ExamplesIterable``, or the rows a
   ``FormattedExamplesIterable`` makes of the Arrow tables of a JSON, CSV or Parquet stream;
2. ``load/map/<fn>`` and ``load/filter/<fn>``: the user's functions, a row at a time;
3. ``load/shuffle``: the shuffle buffer (filling it at the start is the steps before it);
4. ``load/format``: the features decoded and formatted;
5. ``load/interleave``: datasets reads a process's shards at once, each on a thread of its own,
   and interleaves their rows: this is the wait for the next row. The steps below it (1, 2) run
   on those threads, at the same time: their stages add up to more than the wall time, as
   workers' do.

What the chain does around its steps (the worker's shard split, skipping, taking) stays in
``load``. Patched on the classes (NOTE [ Counted class patches ] in collect/patch.py), where
``datasets`` is imported; the steps stay the user's, and a step's iterator is the same one, in
a timing wrapper, only inside the pipeline. Not timed: the Arrow paths (``_iter_arrow``: a
table at a time, under ``with_format("arrow")`` or a batched map over Arrow files), which stay
in ``load``.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from pipeprof.collect.patch import ClassPatch, piped
from pipeprof.collect.torch.dataset import TimedIter, name_of


def _cls(name: str) -> Any:
    module = sys.modules.get("datasets.iterable_dataset")
    return None if module is None else getattr(module, name, None)


def _fn_step(kind: str) -> Any:
    return lambda self: f"{kind}/{name_of(getattr(self, 'function', None))}"


# (the class, its method that makes the step's iterator, the step's name from the instance)
_STEPS = (
    ("ExamplesIterable", "__iter__", lambda self: "read"),
    ("ArrowExamplesIterable", "__iter__", lambda self: "read"),
    ("MappedExamplesIterable", "_iter", _fn_step("map")),
    ("FilteredExamplesIterable", "_iter", _fn_step("filter")),
    ("BufferShuffledExamplesIterable", "__iter__", lambda self: "shuffle"),
    ("CyclingMultiSourcesExamplesIterable", "__iter__", lambda self: "interleave"),
    ("FormattedExamplesIterable", "__iter__", lambda self: _format_step(self)),
)


def _format_step(self: Any) -> str:
    """Rows made of the Arrow tables below it (a JSON, CSV or Parquet stream's reader, whose
    tables it pulls and turns into rows: its reading), or the rows formatted."""
    below = getattr(self, "ex_iterable", None)
    return "read" if getattr(below, "iter_arrow", None) else "format"


def _timed(holder: list[ClassPatch], method: str, step: Any) -> Any:
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = holder[0].orig[method](self, *args, **kwargs)
        if not piped():
            return out
        return TimedIter(out, f"load/{step(self)}")

    return timed


def _patch(cls: str, method: str, step: Any) -> ClassPatch:
    holder: list[ClassPatch] = []
    find = functools.partial(_cls, cls)
    holder.append(ClassPatch([(find, method, _timed(holder, method, step))]))
    return holder[0]


# one patch a class (a patch keeps its originals by method name); each install is False while
# ``datasets`` is not imported
PATCHES = tuple(_patch(cls, method, step) for cls, method, step in _STEPS)
