"""``PipeprofCallback`` for Hugging Face's ``transformers.Trainer``.

>>> trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[PipeprofCallback()])
>>> trainer.train()
>>> trainer.callback_handler.callbacks[-1].report()   # or keep a reference to the callback

NOTE [ Hugging Face Trainer ]
The Trainer builds its training DataLoader itself (``get_train_dataloader``: the dataset, its
``data_collator`` as ``collate_fn``, its workers) and iterates it through accelerate's
``DataLoaderShard``, which fetches one batch ahead (NOTE [ Framework loops ] in
attach/loops.py). The callback routes that loader (the shard's ``base_dataloader``) through
pipeprof's training Profiler from ``on_train_begin`` to ``on_train_end``, so its collator is
timed as ``collate`` inside the workers; any other loader iterated during ``train()`` is the
evaluation's (``evaluate()`` makes a new one each time) and goes to the validation Profiler,
never adding training steps. Its regions come from the Trainer's callback events:

- ``Step``: ``on_step_begin`` to ``on_pre_optimizer_step`` (``training_step`` of each
  micro-batch: forward, loss, backward; gradient clipping), compute;
- ``Optimizer``: ``on_pre_optimizer_step`` to ``on_optimizer_step``, compute;
- ``Evaluate``: from the evaluation's first batch request to ``on_evaluate``, not compute;
- ``Log/Save``: from ``on_step_end`` to the next request for a batch (``_maybe_log_save_evaluate``:
  logging, checkpoints, the other callbacks' ``on_log``/``on_save``), not compute.

What is left of a step (the learning-rate scheduler, ``zero_grad``, the Trainer's bookkeeping)
is compute outside these regions (``Other``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pipeprof.attach.loops import FrameworkLoops, Role, missing, show
from pipeprof.report import Report

try:
    from transformers import TrainerCallback as _Callback
except ImportError as _exc:
    raise missing("Hugging Face transformers", "hf", _exc) from None

__all__ = ["PipeprofCallback"]


class PipeprofCallback(_Callback):  # type: ignore[misc,valid-type]
    """Profiles ``Trainer.train``: its DataLoader (stages inside the workers, the collator as
    ``collate``), wait vs compute per step, the Trainer's steps as regions; ``report()`` after.

    ``save``: write the training report there when training ends (and the evaluation's next to
    it, ``run.val.json``); ``print_report``: print it to stderr. ``sample_hz``: GPU and host
    sampling rate (0: off); ``stream``: a file the session is saved to while training runs.
    One callback profiles one ``train()``; another ``train()`` starts a new profile.
    """

    def __init__(
        self,
        *,
        save: str | Path | None = None,
        print_report: bool = False,
        sample_hz: float = 10.0,
        stream: str | None = None,
    ) -> None:
        self.save = save
        self.print_report = print_report
        self.sample_hz = sample_hz
        self.stream = stream
        self.loops = self._new_loops()
        self._train_loader: Any = None

    def _new_loops(self) -> FrameworkLoops:
        return FrameworkLoops(
            self._choose, sample_hz=self.sample_hz, stream=self.stream, val_region="Evaluate"
        )

    def _choose(self, loader: Any) -> Role | None:
        if self._train_loader is None:
            return None
        if not _training():  # train() raised (no on_train_end): the profile ends here
            self._finish(interrupted=True)
            return None
        return "train" if loader is self._train_loader else "val"

    # ---- the Trainer's events ---------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loops.train.session.start_ns or self.loops.finished:
            self.loops = self._new_loops()  # a second train(): a new profile
        loader = kwargs.get("train_dataloader")
        self._train_loader = getattr(loader, "base_dataloader", loader)  # accelerate's shard
        self.loops.install()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loops.end_regions()  # Log/Save of the step before: micro-batches were fetched
        if self.loops.timing_train():
            self.loops.open_region("Step")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loops.end_region("Step")
        if self.loops.timing_train():
            self.loops.open_region("Optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loops.end_region("Optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loops.end_region("Step")  # no optimizer step (a custom Trainer): Step ends here
        if self.loops.timing_train():
            self.loops.open_region("Log/Save")

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loops.end_region("Evaluate")
        self.loops.close_passes("val")

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loops.end_regions()
        self.loops.close_passes("train")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._finish(interrupted=False)

    # ---- the report -------------------------------------------------------------------------

    def report(self, which: Role = "train") -> Report:
        """The Report of the training loop (``"val"``: of the evaluation loaders)."""
        return self.loops.report(which)

    @property
    def session(self) -> Any:
        """The training loop's Session (``pipeprof run`` reads it)."""
        return self.loops.train.session

    def finish(self, interrupted: bool = False) -> None:
        """End the profile now (``train()`` raised: ``on_train_end`` never comes)."""
        self._finish(interrupted)

    def _finish(self, interrupted: bool) -> None:
        self._train_loader = None
        if self.loops.finished:
            return
        self.loops.finish(interrupted=interrupted)
        if self.save is not None:
            self.loops.save(self.save)
        if self.print_report:
            show(self.report())


def _training() -> bool:
    """``Trainer.train`` is on this thread's stack (a loader iterated now is the Trainer's)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_inner_training_loop" and "transformers" in code.co_filename:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
