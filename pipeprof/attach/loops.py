"""What the framework callbacks share: the framework's loaders routed through pipeprof's
Profilers while its loop runs, and the reports at the end (docs/integrations.md).

NOTE [ Framework loops ]
A framework (Lightning, Hugging Face's Trainer) iterates loaders pipeprof cannot hand it:
it makes them, or wraps them (accelerate's ``DataLoaderShard``), inside its own loop. While
``FrameworkLoops`` is installed, ``DataLoader.__iter__`` on a loader that ``choose`` names
``"train"`` or ``"val"`` is a pass of ``Profiler.wrap(loader)`` of that role's Profiler (the
profiled twin: stages timed in the workers, the same batches, the user's objects untouched); any
other loader, and pipeprof's own iteration of its twin, runs as it is. Validation has its own
Profiler, so it never adds steps or epochs to training; inside a training step it is a region
of that step (not compute). The patch is removed when the framework's loop ends.

A step is one cycle of the training loader: from one request for a batch to the next, as for
``Profiler.wrap`` (NOTE [ Step attribution ]). Lightning 2.x asks for each batch when its step
begins, so cycles are its steps. A loop that fetches one batch ahead (accelerate's
``DataLoaderShard``, which Hugging Face's Trainer iterates; Lightning's fetcher for a loader
without a length) asks for batch k+1 while handing over batch k: the cycle of batch k+1 then holds
the framework's step k, and the wait it shows is the wait the loop had before that step could
start. Sums are unchanged; what differs is the epoch's edges: the first cycle is the start-up
(the first batch, no compute), and the last step of an epoch that runs the loader dry computes
after the last cycle ended (one step of the epoch's compute is not in the report). The pass is
closed at the framework's epoch end, so the last step of an epoch never absorbs what follows it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pipeprof.attach.passes import Inside
from pipeprof.profiler import Profiler
from pipeprof.report import Report

Role = Literal["train", "val"]


class FrameworkLoops:
    """The train and validation Profilers of one framework run and the routing of its loaders.

    ``choose(loader)`` says which role a DataLoader that is about to be iterated plays (None:
    not the framework's, left alone). ``region_on_val`` names the region a validation pass opens
    in the training step it runs in (closed by ``end_region``)."""

    def __init__(
        self,
        choose: Callable[[Any], Role | None],
        *,
        sample_hz: float = 10.0,
        stream: str | None = None,
        val_region: str = "Validation",
    ) -> None:
        self.choose = choose
        self.val_region = val_region
        self.train = Profiler(sample_hz=sample_hz, stream=stream)
        self.val = Profiler(sample_hz=0)
        self._local = Inside()  # attach/passes.py
        self._open: dict[Role, list[Iterator[Any]]] = {"train": [], "val": []}
        self._held: dict[Role, list[tuple[Iterator[Any], bool]]] = {"train": [], "val": []}
        self._active = 0  # training passes that have handed out a batch and not ended
        self._regions: list[str] = []  # regions open in the training Profiler, in order
        self._undo: Callable[[], None] | None = None
        self.finished = False

    # ---- the route --------------------------------------------------------------------------

    def install(self) -> None:
        """Route the framework's loaders (``DataLoader.__iter__``) until ``uninstall``."""
        if self._undo is not None:
            return
        from torch.utils.data import DataLoader

        orig = DataLoader.__iter__
        loops = self

        @functools.wraps(orig)
        def __iter__(loader: Any) -> Any:
            role = None if loops._local.inside or loops.finished else loops.choose(loader)
            if role is None:
                return orig(loader)
            return loops._pass(role, loader)

        DataLoader.__iter__ = __iter__  # type: ignore[method-assign,assignment]

        def undo() -> None:
            if DataLoader.__iter__ is __iter__:
                DataLoader.__iter__ = orig  # type: ignore[method-assign]

        self._undo = undo

    def uninstall(self) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None

    def _pass(self, role: Role, loader: Any) -> Iterator[Any]:
        prof = self.train if role == "train" else self.val
        local = self._local
        if role == "val" and self.train_step_open():
            self.open_region(self.val_region)
        steps = local.call(lambda: iter(prof.wrap(loader)))
        gen = self._batches(role, steps, loader)
        self._open[role].append(gen)
        return gen

    def _batches(self, role: Role, steps: Iterator[Any], loader: Any) -> Iterator[Any]:
        local = self._local
        left = _batches_in(loader)
        counted = held = False
        try:
            while True:
                if role == "train" and self._regions:
                    self.end_regions()  # the step is over: what it ran after training ends here
                if left == 0:  # the pass is complete: its last step ends at the epoch's end
                    held = True
                    return
                try:
                    batch = local.next(steps)
                except StopIteration:
                    return
                if left is not None:
                    left -= 1
                if role == "train" and not counted:
                    counted = True
                    self._active += 1
                yield batch
        finally:
            if held:  # still under way: its step is open until the pass is closed
                self._held[role].append((steps, counted))
            else:
                self._active -= counted
                self._close(steps)
            if role == "val" and not getattr(loader, "persistent_workers", False):
                self.val.release(loader)  # a loader per evaluation: its twin goes with the pass

    def _close(self, steps: Iterator[Any]) -> None:
        self._local.close(steps)

    def close_passes(self, role: Role) -> None:
        """End the passes of ``role`` under way (the framework's epoch ended): a suspended pass
        would otherwise end when the framework drops it, and its last step with it."""
        gens, self._open[role] = self._open[role], []
        for gen in gens:
            gen.close()  # type: ignore[attr-defined]
        held, self._held[role] = self._held[role], []
        for steps, counted in held:
            self._active -= counted
            self._close(steps)

    # ---- regions of the training step --------------------------------------------------------

    def train_step_open(self) -> bool:
        """A training step is under way (regions go into it)."""
        return self.train.running and self._active > 0

    def timing_train(self) -> bool:
        """Regions go into the training step: one is under way, and no validation runs in it
        (validation's own hooks are part of the validation region)."""
        return self._active > 0 and self.val_region not in self._regions and self.train.running

    def open_region(self, key: str) -> None:
        if key not in self._regions and self.train.running:
            self._regions.append(key)
            self.train.timer.start(key)

    def end_region(self, key: str) -> None:
        if key in self._regions:
            self._regions.remove(key)
            self.train.timer.end(key)

    def end_regions(self) -> None:
        while self._regions:
            self.train.timer.end(self._regions.pop())

    # ---- the end ----------------------------------------------------------------------------

    def finish(self, interrupted: bool = False) -> None:
        """The framework's loop ended: close what is open, stop both Profilers, un-route."""
        if self.finished:
            return
        self.finished = True
        self.uninstall()
        try:
            self.end_regions()
            self.close_passes("train")
            self.close_passes("val")
        finally:
            self.train.stop(interrupted=interrupted)
            self.val.stop(interrupted=interrupted)

    def report(self, which: Role = "train") -> Report:
        """The training loop's Report (``"val"``: the validation loaders', its own loop)."""
        if which not in ("train", "val"):
            raise ValueError(f"report() takes 'train' or 'val', got {which!r}")
        return (self.train if which == "train" else self.val).report()

    def save(self, path: str | Path) -> list[Path]:
        """Save the training report to ``path`` and, if validation ran, the validation report
        next to it (``run.json`` → ``run.val.json``); returns the paths written."""
        path = Path(path)
        written = [path]
        self.report().save(path)
        if self.val.session.loop is not None and self.val.session.loop.steps:
            val = path.with_name(f"{path.stem}.val{path.suffix or '.json'}")
            self.report("val").save(val)
            written.append(val)
        return written


def missing(framework: str, extra: str, exc: ImportError) -> ImportError:
    """The error for a framework that is not installed: names the extra to install."""
    return ImportError(
        f"pipeprof.integrations.{extra} needs {framework}: pip install 'pipeprof[{extra}]' ({exc})"
    )


def show(report: Report) -> None:
    """Print ``report`` to stderr (the callbacks' ``print_report=True``)."""
    import sys

    from rich.console import Console

    Console(file=sys.stderr).print(report)


def _batches_in(loader: Any) -> int | None:
    """How many batches a pass of ``loader`` yields (None: not known, an iterable dataset)."""
    from torch.utils.data import IterableDataset

    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return None
    try:
        return len(loader)
    except TypeError:
        return None
