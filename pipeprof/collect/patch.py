"""Methods of a library's classes replaced with pipeprof's while profiles need them: h5py's reads
(collect/hdf5.py), ``http.client``'s (collect/fetch.py), a tokenizer's call (collect/tokenizer.py).

NOTE [ Counted class patches ]
A collector installs its patch where reads are profiled: in a DataLoader worker for its whole
life, in the training process for a pass (``num_workers=0``). Profiles can overlap (two loaders'
passes, a nested ``profile()``), so installs are counted under a lock: the first replaces the
methods, the last ``uninstall`` puts the originals back, and only where pipeprof's are still in
place (a library patched again by someone else after pipeprof is left as it is). The originals
stay in ``orig`` by method name, where the replacements call them.

A replacement times only the pipeline's calls (``piped``): a call the training loop makes between
batches (a logger's upload, a prompt tokenized for a log line) is not. Each opens its relative
stage (``fetch``, ``tokenize``) with ``open_stage``, unless the thread is inside one of that
name already (the user's own ``pipeprof.stage("fetch")``, or an inner call of the same library).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pipeprof.core.recorder import clock, recorder

_rec = recorder()
Target = tuple[Callable[[], Any], str, Callable[..., Any]]  # (the class, or None; name; ours)


class ClassPatch:
    """``targets``: for each method, a function that finds its class (None: the library is not
    imported, nothing to patch), the method's name, and pipeprof's replacement."""

    def __init__(self, targets: list[Target]) -> None:
        self.targets = targets
        self.orig: dict[str, Any] = {}
        self._count = 0
        self._lock = threading.Lock()

    def install(self) -> bool:
        """The replacements in place (counted); False, with nothing counted, where a class is
        not there to patch. Pair each True with ``uninstall``."""
        classes = [find() for find, _, _ in self.targets]
        if any(cls is None for cls in classes):
            return False
        with self._lock:
            for cls, (_, name, mine) in zip(classes, self.targets):
                if cls.__dict__.get(name) is not mine:
                    self.orig[name] = cls.__dict__[name]
                    setattr(cls, name, mine)
            self._count += 1
        return True

    def uninstall(self) -> None:
        """Undo one ``install``; the last puts the originals back where ours are still there."""
        with self._lock:
            self._count = max(0, self._count - 1)
            if self._count or not self.orig:
                return
            for find, name, mine in self.targets:
                cls = find()
                if cls is not None and cls.__dict__.get(name) is mine:
                    setattr(cls, name, self.orig[name])

    def installed(self) -> bool:
        """Whether pipeprof's methods are in place in this process now."""
        find, name, mine = self.targets[0]
        cls = find()
        return cls is not None and cls.__dict__.get(name) is mine


def piped() -> bool:
    """Whether this call is the pipeline's: profiling on, and a stage open on this thread or,
    for a helper thread with none, on the pipeline thread (a pool fetching in
    ``__getitems__``)."""
    rec = _rec
    return rec.enabled and (rec._local.st.path is not None or rec._main.path is not None)


def open_stage(name: str) -> tuple[Any, int]:
    """The relative stage ``name`` opened (None where the thread is inside one already), and
    the clock; ``close_stage`` gives the call's ns either way."""
    rec = _rec
    inside = rec.innermost
    frame = None
    if inside is None or not (inside == name or inside.endswith("/" + name)):
        frame = rec.open(rec.child_path(name))
    return frame, clock()


def close_stage(frame: Any, t0: int) -> int:
    ns: int = _rec.close(frame) if frame is not None else clock() - t0
    return ns
