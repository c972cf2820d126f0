"""``PipeprofCallback`` for PyTorch Lightning: the Trainer's loaders and hooks, profiled.

>>> trainer = L.Trainer(callbacks=[PipeprofCallback(save="run.json")])
>>> trainer.fit(model, train_loader, val_loader)
>>> callback.report()

NOTE [ Lightning ]
The train and validation loaders the Trainer iterates are routed through pipeprof's Profilers
while ``fit`` runs (NOTE [ Framework loops ] in attach/loops.py): stages timed in the
workers, the same batches. The Trainer's hooks become regions through Lightning's own seam,
``trainer.profiler``: every hook, ``training_step``, ``backward`` and ``optimizer_step`` is
bracketed by ``trainer.profiler.start/stop(action)``. During ``fit`` pipeprof puts a tee in its
place that passes every call on to the user's profiler (or Lightning's pass-through) and times:

- ``[Strategy]….training_step`` as ``Forward`` (the forward pass and the loss),
  ``[Strategy]….backward`` as ``Backward``, the optimizer's update as ``Optimizer`` (from the end of
  ``on_before_optimizer_step`` to the end of ``optimizer_step``: Lightning runs the closure,
  i.e. ``training_step`` and ``backward``, inside ``optimizer_step``, so the whole call would
  count them twice), ``[Strategy]….batch_to_device`` as ``Transfer``;
- every other callback's hooks as ``Callbacks`` (not compute);
- the validation loop inside ``fit`` as ``Validation`` (not compute): from its first batch request
  or ``on_validation_start`` to ``on_validation_end``.

The rest of the step (Lightning's loop, the module's own hooks, logging to the loggers) is
compute outside these regions (``Other``). Lightning 2.x asks for a batch when its step begins
when the loader has a length, so the loader's cycles are its steps; for a loader without one it
fetches a batch ahead (its ``_PrefetchDataFetcher``): see NOTE [ Framework loops ].
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeprof.attach.loops import FrameworkLoops, Role, missing, show
from pipeprof.report import Report

try:
    from lightning.pytorch import Callback as _Callback
except ImportError as _exc:  # the standalone package, or nothing
    try:
        from pytorch_lightning import Callback as _Callback  # type: ignore[assignment]
    except ImportError:
        raise missing("PyTorch Lightning", "lightning", _exc) from None

__all__ = ["PipeprofCallback"]

_SKIP = object()  # an action that is no region


class _Tee:
    """Stands in for ``trainer.profiler`` during ``fit``: passes every call on to the Trainer's
    profiler and turns the actions pipeprof knows into regions (NOTE [ Lightning ])."""

    def __init__(self, inner: Any, loops: FrameworkLoops, own: str) -> None:
        self._inner = inner
        self._loops = loops
        self._own = own  # pipeprof's callback: its hooks are no one's callbacks
        self._kinds: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _kind(self, action: str) -> Any:
        kind = self._kinds.get(action)
        if kind is None:
            kind = self._kinds[action] = _classify(action, self._own)
        return kind

    def start(self, action: str) -> None:
        self._inner.start(action)
        kind = self._kind(action)
        if kind is not _SKIP and kind[1] == "start" and self._loops.timing_train():
            self._loops.train.timer.start(kind[0])

    def stop(self, action: str) -> None:
        try:
            kind = self._kind(action)
            if kind is not _SKIP and self._loops.train.running:
                key, when = kind
                timer = self._loops.train.timer
                if when != "after":  # closes what its start (or an "after") opened, if it did
                    _end(timer, key)
                elif self._loops.timing_train():  # the optimizer's update starts after this hook
                    timer.start(key)
        finally:
            self._inner.stop(action)

    @contextmanager
    def profile(self, action: str) -> Iterator[None]:
        self.start(action)
        try:
            yield
        finally:
            self.stop(action)


def _end(timer: Any, key: str) -> None:
    try:
        timer.end(key)
    except ValueError:  # opened before the step began (or not at all): nothing to close
        pass


def _classify(action: str, own: str) -> Any:
    """The region an action of Lightning's profiler stands for: (key, how) or ``_SKIP``."""
    if action.startswith("[Callback]"):
        return _SKIP if action.startswith(f"[Callback]{own}") else ("Callbacks", "start")
    if action.startswith("[Strategy]"):
        hook = action.rpartition(".")[2]
        key = {"training_step": "Forward", "backward": "Backward", "batch_to_device": "Transfer"}
        return (key[hook], "start") if hook in key else _SKIP
    if action.startswith("[LightningModule]"):
        hook = action.rpartition(".")[2]
        if hook == "on_before_optimizer_step":
            return ("Optimizer", "after")
        if hook == "optimizer_step":
            return ("Optimizer", "end")
        return _SKIP
    if action == "optimizer_step":  # manual optimization: the step itself
        return ("Optimizer", "start")
    return _SKIP


class Hooks:
    """Profiles ``Trainer.fit``: its train and validation loaders (stages inside the workers,
    wait vs compute per step) and its hooks as regions; ``report()`` after ``fit``.

    ``save``: write the training report there at the end of ``fit`` (and the validation report
    next to it, ``run.val.json``); ``print_report``: print it to stderr. ``sample_hz``: GPU and
    host sampling rate (0: off); ``stream``: a file the session is saved to while training runs
    (see ``pipeprof.Profiler``). One callback profiles one ``fit``; a second ``fit`` starts a new
    profile. Validation never adds training steps: ``report("val")`` is its own loop.
    """

    def __init__(
        self,
        *,
        save: str | Path | None = None,
        print_report: bool = False,
        sample_hz: float = 10.0,
        stream: str | None = None,
    ) -> None:
        super().__init__()
        self.save = save
        self.print_report = print_report
        self.sample_hz = sample_hz
        self.stream = stream
        self.loops = self._new_loops()
        self._trainer: Any = None
        self._saved_profiler: Any = None

    def _new_loops(self) -> FrameworkLoops:
        return FrameworkLoops(self._choose, sample_hz=self.sample_hz, stream=self.stream)

    # ---- what the Trainer iterates --------------------------------------------------------

    def _choose(self, loader: Any) -> Role | None:
        trainer = self._trainer
        if trainer is None:
            return None
        if any(loader is dl for dl in _loaders(trainer.train_dataloader)):
            return "train"
        if any(loader is dl for dl in _loaders(trainer.val_dataloaders)):
            return "val"
        return None

    # ---- Lightning's hooks ------------------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if self.loops.train.session.start_ns or self.loops.finished:
            self.loops = self._new_loops()  # a second fit(): a new profile
        self._trainer = trainer
        self.loops.install()
        self._saved_profiler = trainer.profiler
        trainer.profiler = _Tee(trainer.profiler, self.loops, type(self).__qualname__)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.loops.close_passes("train")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if self.loops.train_step_open():
            self.loops.open_region(self.loops.val_region)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.loops.end_region(self.loops.val_region)
        self.loops.close_passes("val")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer, interrupted=False)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._finish(trainer, interrupted=True)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._finish(trainer, interrupted=False)

    # ---- the report -------------------------------------------------------------------------

    def report(self, which: Role = "train") -> Report:
        """The Report of the training loop (``"val"``: of the validation loaders)."""
        return self.loops.report(which)

    @property
    def session(self) -> Any:
        """The training loop's Session (``pipeprof run`` reads it)."""
        return self.loops.train.session

    def finish(self, interrupted: bool = False) -> None:
        """End the profile now (``fit()`` ends it itself, also when it raises)."""
        self._finish(self._trainer, interrupted)

    def _finish(self, trainer: Any, interrupted: bool) -> None:
        if trainer is not None and isinstance(trainer.profiler, _Tee):
            trainer.profiler = self._saved_profiler
        self._trainer = None
        if self.loops.finished:
            return
        self.loops.finish(interrupted=interrupted)
        if self.save is not None:
            self.loops.save(self.save)
        if self.print_report:
            show(self.report())


class PipeprofCallback(Hooks, _Callback):  # type: ignore[misc,valid-type]
    __doc__ = Hooks.__doc__


def callback_class(base: type) -> type:
    """pipeprof's callback on ``base``, the ``Callback`` of the Lightning package a Trainer
    comes from (``lightning.pytorch`` or the standalone ``pytorch_lightning``)."""
    if issubclass(PipeprofCallback, base):
        return PipeprofCallback
    return type("PipeprofCallback", (Hooks, base), {"__doc__": Hooks.__doc__})


def _loaders(data: Any) -> list[Any]:
    """The loaders in what the Trainer's ``train_dataloader``/``val_dataloaders`` return (a
    loader, or a list, tuple or dict of them, nested)."""
    if data is None:
        return []
    if isinstance(data, dict):
        return [dl for v in data.values() for dl in _loaders(v)]
    if isinstance(data, (list, tuple)):
        return [dl for v in data for dl in _loaders(v)]
    return [data]
