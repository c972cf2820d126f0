"""The loaders a script under ``pipeprof run`` makes and iterates: where each was made, its label
(the variable it was assigned to, else its file:line), and its entry in the run's table."""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeprof.attach.patches import weakable
from pipeprof.profiler import Profiler

PIPEPROF_DIR = str(Path(__file__).resolve().parent.parent)  # the package: attach/ is in it
_ASSIGNED = re.compile(r"^\s*((?:self\.)?[A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")


@dataclass
class Loader:
    """One DataLoader or tf.data.Dataset the script iterated, and its own Profiler; or one
    Keras ``fit()`` call and its callback (``prof`` None)."""

    label: str
    site: str
    prof: Profiler | None
    loader: Any  # kept alive: its id keys the table
    passes: int = 0
    nested_in: set[str] = field(default_factory=set)
    callback: Any = None  # pipeprof.keras.ProfilerCallback
    open_passes: int = 0
    steps: int = 0  # steps handed out over its passes (NOTE [ Regions in a sample of the steps ])
    region_steps: int = 0  # of them, those whose Forward / Backward / Optimizer were timed
    fast_ns: int = 0  # NOTE [ The fast path ]: its own time in next() (the loader's aside)

    @property
    def session(self) -> Any:
        return self.prof.session if self.prof is not None else self.callback.session


class Loaders(dict[int, Loader]):
    """The run's table: each loader (or framework callback) by its ``id``, and where the script
    made the loaders it made (``sites``: loader -> (variable name, "file.py:line", full
    path:line))."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: weakref.WeakKeyDictionary[Any, tuple[str, str, str]] = (
            weakref.WeakKeyDictionary()
        )
        self._by_site: dict[str, Loader] = {}

    def remember_site(self, loader: Any, name: bool = True) -> None:
        """Where the script made ``loader``: the first frame of the user's own code, past
        pipeprof's, torch's and TensorFlow's and past installed libraries' (Lightning wraps
        ``DataLoader.__init__`` while it calls a DataModule's ``test_dataloader``: its wrapper's
        line is no one's loader). Named after the variable it was assigned to when the user's
        line made it itself, or after the Lightning hook that made it (``test_dataloader``). A
        loader a library re-makes from one of the user's (Lightning re-makes the test and
        predict loaders with its own sampler) takes that one's name and site."""
        frame = sys._getframe(2)
        first = None  # the first frame past pipeprof/torch/tensorflow: a library's, perhaps
        direct = True  # no library frame between the user's line and the loader
        while frame is not None:
            file = frame.f_code.co_filename
            if not (
                file.startswith(PIPEPROF_DIR)
                or "/torch/" in file
                or "/tensorflow/" in file
                or frame.f_locals.get("self") is loader  # a subclass's __init__
            ):
                if not _library_frame(frame):
                    break
                first = first or frame
                held = list(frame.f_locals.values())
                if not any(v is loader for v in held):  # not a wrapper of __init__: a call
                    direct = False
                remade = self._remade_from(loader, held)
                if remade is not None:
                    self.sites[loader] = remade
                    return
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None:  # no code of the user's on the stack: the first frame there is
            frame, direct = first, True
        if frame is None:
            return
        file, line = frame.f_code.co_filename, frame.f_lineno
        site = f"{os.path.basename(file)}:{line}"
        label = ""
        if name and direct:
            match = _ASSIGNED.match(linecache.getline(file, line))
            label = match.group(1) if match else ""
        if name and not label and frame.f_code.co_name in _LIGHTNING_HOOKS:
            label = frame.f_code.co_name
        try:
            self.sites[loader] = (label, site, f"{file}:{line}")
        except TypeError:  # not weak-referenceable: labelled by its site only
            pass

    def _remade_from(self, loader: Any, held: list[Any]) -> tuple[str, str, str] | None:
        """The remembered site of a loader of ``loader``'s type that a library's frame holds
        (``held``: the one it is re-making, Lightning's ``_reinstantiate_wrapped_cls``)."""
        kind = type(loader)
        for value in held:
            if type(value) is kind and value is not loader:
                site = self.sites.get(value)
                if site is not None:
                    return site
        return None

    def entry(self, loader: Any, make: Callable[[str, str], Profiler]) -> Loader:
        """``loader``'s entry: its own, or that of the loader made where it was made whose passes
        are over (a loader per epoch: the same loop), or a new one, labelled, with the Profiler
        ``make(label, site)`` makes."""
        entry = self.get(id(loader))
        if entry is not None and entry.loader is loader:
            return entry
        name, site, key = self.sites.get(loader, ("", "", "")) if weakable(loader) else ("",) * 3
        entry = self._by_site.get(key) if key else None
        if entry is not None and not entry.open_passes and entry.prof is not None:
            # a new loader made where the last one was (a loader per epoch): the same loop
            del self[id(entry.loader)]
            entry.prof.release(entry.loader)  # the old loader's twin goes, with its dataset
            entry.loader = loader
            self[id(loader)] = entry
            return entry
        kind = "DataLoader" if hasattr(loader, "num_workers") else "tf.data"
        label = self.unique(name or (f"{kind}@{site}" if site else kind))
        entry = self.register(id(loader), label, site, make(label, site), loader)
        if key:
            self._by_site[key] = entry
        return entry

    def unique(self, label: str) -> str:
        taken = {e.label for e in self.values()}
        base, n = label, 1
        while label in taken:
            n += 1
            label = f"{base}#{n}"
        return label

    def register(self, key: int, label: str, site: str, prof: Profiler | None, owner: Any,
                 **fields: Any) -> Loader:  # fmt: skip
        """A loader (or a framework's callback, ``prof`` None) in this run's table."""
        entry = self[key] = Loader(label, site, prof, owner, **fields)
        return entry


_LIGHTNING_HOOKS = frozenset(
    {"train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader"}
)
_LIBRARIES = frozenset({"lightning", "pytorch_lightning", "lightning_fabric", "keras", "torch",
                        "tensorflow", "transformers", "accelerate"})  # fmt: skip
_STDLIB = tuple(
    os.path.join(sysconfig.get_paths()[k], "") for k in ("stdlib", "platstdlib")
    if sysconfig.get_paths().get(k)
)  # fmt: skip


def _library_frame(frame: Any) -> bool:
    """A frame of an installed library (site-packages, the standard library, a framework's
    package wherever it lives), not of the user's own code."""
    module = frame.f_globals.get("__name__") or ""
    if module.partition(".")[0] in _LIBRARIES:
        return True
    file = frame.f_code.co_filename
    return (
        "/site-packages/" in file
        or "/dist-packages/" in file
        or file.startswith("<frozen")
        or file.startswith(_STDLIB)
    )
