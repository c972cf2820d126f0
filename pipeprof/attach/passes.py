"""What pipeprof's two pass routers share: ``pipeprof run``'s (attach/run.py: one Profiler per
loader, nested and zipped passes, the fast path) and the framework callbacks' (attach/loops.py:
one Profiler per role, train and validation, passes held to the framework's epoch end).

Each patches ``DataLoader.__iter__`` so that a pass the user's code (or the framework) begins is
a pass of a Profiler's twin. That Profiler then iterates the twin itself, through the same
patched ``__iter__``: those iterations, and everything run while pipeprof advances a pass on
this thread, must go through unprofiled. ``Inside`` counts them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class Inside(threading.local):
    """How deep, on this thread, pipeprof itself is in advancing a loader (``inside`` > 0): a
    pass begun then is pipeprof's own (its twin's), and a Module called then is the pipeline's
    (a transform in a fetch), not the model's Forward. Read as ``local.inside`` on hot paths."""

    inside = 0

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` as pipeprof's own."""
        self.inside += 1
        try:
            return fn(*args)
        finally:
            self.inside -= 1

    def next(self, it: Iterator[T]) -> T:
        """``next(it)`` as pipeprof's own (StopIteration passes through)."""
        self.inside += 1
        try:
            return next(it)
        finally:
            self.inside -= 1

    def close(self, it: Any) -> None:
        """``it.close()`` as pipeprof's own: a generator's ``finally`` ends its pass."""
        self.inside += 1
        try:
            it.close()
        finally:
            self.inside -= 1
