"""``pipeprof.keras.ProfilerCallback``: waiting vs computing inside Keras ``fit()``.

NOTE [ Waits inside fit() ]
In ``fit()`` the ``next()`` on the tf.data iterator runs inside the compiled train function, so
no Python seam sees it. The callback times each step from ``on_train_batch_begin`` to
``on_train_batch_end`` and, for a window of ``trace_steps`` steps, runs the TensorFlow
profiler: the root iterator's ``GetNext`` events (``Iterator::Root``) that fall inside a step
are the time that step waited for data, and the rest of the step is compute. The same trace
gives the pipeline's stage breakdown (collect/tf/trace.py). The window stays inside one epoch's
training steps (it ends at validation), and the report covers the traced steps only; it says
how many of all the steps that is (``meta.steps_total``).

Start-up (the time to the first batch) happens before the window: the profiler starts at
``on_train_begin`` already, and the trace of the first steps gives the first root ``GetNext``
alone (their events stay out of the stage figures, as though the capture began with the
window). Start-up is the time from the first epoch's begin to that batch: making the iterator
(Keras does it before the first step's hook) plus the first ``GetNext`` inside the first step;
compiling the train function is not part of it.

Where the profiler cannot run, or with ``differential=True``, a differential run measures
compute alone after training: ``train_on_batch`` on ``replay_batches`` batches cached in memory,
with the model's weights and the optimizer's state restored afterwards; a step's wait is then
its duration minus that compute time. See docs/tfdata.md for the precision of both methods.
"""

from __future__ import annotations

import os
from typing import Any

from pipeprof.collect.loop import StepLog
from pipeprof.collect.tf import graph as tf_graph
from pipeprof.collect.tf import trace as tf_trace
from pipeprof.collect.tf.capture import Capture
from pipeprof.collect.tf.dataset import import_tf, merge_trace
from pipeprof.core.batch import batch_size
from pipeprof.core.recorder import clock, measure_overhead
from pipeprof.core.session import Session
from pipeprof.report import Report

try:
    import keras as _keras
except ImportError:  # pragma: no cover - tf.keras with Keras 2
    _keras = import_tf().keras

__all__ = ["ProfilerCallback"]


class ProfilerCallback(_keras.callbacks.Callback):  # type: ignore[misc,name-defined]
    """Attributes ``fit()``'s step time to waiting for data and computing; ``report()`` after.

    Args:
        dataset: the tf.data.Dataset given to ``fit``: names stages after your map functions
            and gives the batch size; the differential run takes its batches from it. None:
            no differential run (so where the TensorFlow profiler cannot run, no step's wait
            is measured).
        skip_steps: steps left out first (the first step compiles the train function); 0 or
            more.
        trace_steps: steps traced after them, at least 1; the window ends sooner at the
            epoch's end or at validation, and the report covers the traced steps only.
        differential: add a compute-only run on cached batches after training (weights and
            optimizer restored); it runs anyway where the TensorFlow profiler could not.
        replay_batches: how many of ``dataset``'s batches the differential run caches and
            replays with ``train_on_batch``.

    Raises:
        ValueError: ``trace_steps`` is below 1 or ``skip_steps`` below 0.
    """

    def __init__(
        self,
        dataset: Any = None,
        *,
        skip_steps: int = 2,
        trace_steps: int = 50,
        differential: bool = False,
        replay_batches: int = 8,
    ) -> None:
        super().__init__()
        if trace_steps < 1 or skip_steps < 0:
            raise ValueError("trace_steps must be >= 1 and skip_steps >= 0")
        self.dataset = dataset
        self.skip_steps = skip_steps
        self.trace_steps = trace_steps
        self.differential = differential
        self.replay_batches = replay_batches
        self.session = Session(framework="tf", mode="loop")
        self._pipeline: dict[str, Any] = {"ops": []}
        self._capture: Capture | None = None
        self._window = False  # steps are being traced (or, without the profiler, recorded)
        self._steps: list[list[int]] = []  # [begin_ns, end_ns, first_of_epoch, next_begin_ns]
        self._global = 0
        self._epoch_step = 0
        self._done = False
        self._untraced = [0, 0]  # steps outside the window and their ns: counted, not kept
        self._epoch0: int | None = None  # when the first epoch began
        self._first_step: tuple[int, int] | None = None  # the first step's hooks (begin, end)
        self._startup_ns: int | None = None  # epoch begin to the first batch (from the trace)
        self._capture_error: str | None = None

    # ---- Keras hooks ------------------------------------------------------------------------

    def on_train_begin(self, logs: Any = None) -> None:
        s = self.session
        s.overhead_ns = measure_overhead()
        self._log = StepLog(s)
        if self.dataset is not None:
            self._pipeline = tf_graph.describe(self.dataset)
        s.meta.update(self._describe())
        capture = Capture()  # from here, for the start-up (see the NOTE above)
        if capture.start():
            self._capture = capture
        else:
            self._capture_error = capture.error

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._epoch_step = 0
        if self._epoch0 is None:
            self._epoch0 = clock()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self._global >= self.skip_steps and not self._done and not self._window:
            self._start()
        if self._window and self._steps and self._steps[-1][3] == 0:
            self._steps[-1][3] = clock()  # the gap since the last step: Keras' own overhead
        self._begin = clock()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        end = clock()
        if self._global == 0:
            self._first_step = (self._begin, end)
        if self._window:
            self._steps.append([self._begin, end, int(self._epoch_step == 0), 0])
            if len(self._steps) >= self.trace_steps:
                self._stop()
        else:
            self._untraced[0] += 1
            self._untraced[1] += end - self._begin
        self._global += 1
        self._epoch_step += 1

    def on_test_begin(self, logs: Any = None) -> None:
        if self._window:  # validation runs another pipeline: end the window here
            self._stop()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if self._window:
            self._stop()

    def on_train_end(self, logs: Any = None) -> None:
        if self._window or self._capture is not None:  # no window: too few steps
            self._stop()
        if self.differential or (self._steps and not self._traced()):
            self._differential()
        self._finish()

    def report(self) -> Report:
        """The Report of the traced steps (loop mode, framework ``tf``)."""
        return Report(self.session)

    # ---- the trace window -------------------------------------------------------------------

    def _start(self) -> None:
        self._window = True
        if self._capture is not None:
            return
        self.session.notes.append(
            f"the TensorFlow profiler could not run ({self._capture_error}): a differential run "
            "on cached batches estimates compute instead (pass dataset= to allow it)"
        )

    def _stop(self) -> None:
        capture, self._capture = self._capture, None
        self._window = False
        self._done = True
        if self._steps and self._steps[-1][3] == 0:
            self._steps[-1][3] = self._steps[-1][1]  # the gap after the window is not measured
        if capture is None:
            return
        if not self._steps:  # the run ended before the window: nothing to report
            capture.stop()
            return
        known = {op["dataset"] for op in self._pipeline["ops"] if op.get("dataset")}
        since, until = self._steps[0][0], self._steps[-1][1]
        trace = tf_trace.stop(capture, known, fresh=False, until_ns=until, since_ns=since)
        if trace is None:
            self.session.notes.append(f"the profiler trace could not be read ({capture.error})")
            return
        merge_trace(self.session, trace, self._pipeline)
        self._assign_waits(trace.roots)
        self._startup_ns = self._startup(trace.first_root)

    def _startup(self, root: tuple[int, int] | None) -> int | None:
        """From the first epoch's begin to the first batch: making the iterator, then the first
        root GetNext if it ran inside the first step (else it is not known)."""
        if root is None or self._first_step is None or self._epoch0 is None:
            return None
        begin, end = self._first_step
        if not begin <= root[0] <= end:
            return None
        return max(0, begin - self._epoch0) + min(root[1], end - root[0])

    def _traced(self) -> bool:
        return bool(self.session.meta.get("tf", {}).get("method") == "profiler")

    def _assign_waits(self, roots: list[tuple[int, int]]) -> None:
        """Each step's wait: the root GetNext calls that started inside it."""
        j = 0
        for step in self._steps:
            begin, end = step[0], step[1]
            wait = 0
            while j < len(roots) and roots[j][0] < begin:
                j += 1
            k = j
            while k < len(roots) and roots[k][0] <= end:
                wait += min(roots[k][1], end - roots[k][0])
                k += 1
            j = k
            step.append(wait)

    # ---- compute alone: the differential run ------------------------------------------------

    def _differential(self) -> None:
        if self.dataset is None or self.model is None:
            self.session.notes.append(
                "no differential run: pass the dataset to "
                "ProfilerCallback(dataset) to measure compute alone"
            )
            return
        batches = [b for _, b in zip(range(self.replay_batches), self.dataset)]
        if not batches:
            return
        saved = self._snapshot()
        try:
            self._replay(batches[0])  # warm-up: builds the train_on_batch function
            times = []
            for _ in range(3):
                for b in batches:
                    t0 = clock()
                    self._replay(b)
                    times.append(clock() - t0)
        finally:
            self._restore(saved)
        times.sort()
        compute = times[len(times) // 2]
        samples = sum(batch_size(b) for b in batches) / len(batches)
        self._log.record.replay = {
            "batches": len(batches),
            "repeats": 3,
            "compute_ms": round(compute / 1e6, 6),
            "compute_samples_per_s": round(samples / (compute / 1e9), 3),
            "method": "train_on_batch on cached batches, weights and optimizer restored",
        }
        self._replay_ns = compute

    def _replay(self, batch: Any) -> None:
        if isinstance(batch, (tuple, list)) and 1 <= len(batch) <= 3:
            self.model.train_on_batch(*batch)
        else:
            self.model.train_on_batch(batch)

    def _snapshot(self) -> tuple[Any, Any]:
        opt = getattr(self.model, "optimizer", None)
        opt_vars = [v.numpy() for v in getattr(opt, "variables", [])] if opt is not None else []
        return self.model.get_weights(), opt_vars

    def _restore(self, saved: tuple[Any, Any]) -> None:
        weights, opt_vars = saved
        self.model.set_weights(weights)
        opt = getattr(self.model, "optimizer", None)
        if opt is not None:
            for v, value in zip(opt.variables, opt_vars):
                v.assign(value)

    # ---- the session ------------------------------------------------------------------------

    def _finish(self) -> None:
        s, log = self.session, self._log
        steps = self._steps
        if not steps:
            s.notes.append(
                "no training step was traced: train for more than skip_steps="
                f"{self.skip_steps} steps"
            )
            return
        replay = getattr(self, "_replay_ns", None)
        # Keras calls the batch hooks once per execution of steps_per_execution batches
        execution = int(s.meta.get("steps_per_execution") or 1)
        per = self._samples_per_step() * execution
        for begin, end, first, after, *measured in steps:
            step = end - begin
            if measured:
                wait = measured[0]
            elif replay is not None:
                wait = max(0, step - replay)
            else:
                continue
            overhead = max(0, after - end) if after else 0
            compute = max(0, step - wait)
            self._add_step(begin, wait, compute, overhead, bool(first), per, execution)
        log.fold()
        # the first traced step's wait is not the start-up unless it is the run's first step
        log.record.startup_ns = s.first_batch_ns = self._startup_ns
        s.start_ns = steps[0][0]
        s.end_ns = max(steps[-1][1], steps[-1][3])
        log.record.epochs = max(1, len({i for i, st in enumerate(steps) if st[2]}))
        s.meta["steps_total"] = self._global
        s.meta.setdefault("keras", {}).update(
            {
                "traced_steps": len(steps),
                "skipped_steps": self.skip_steps,
                "untraced_steps": self._untraced[0],
                "untraced_step_ms": round(self._untraced[1] / self._untraced[0] / 1e6, 6)
                if self._untraced[0]
                else None,
                "wait_method": "profiler"
                if self._traced()
                else ("differential" if replay is not None else None),
            }
        )

    def _add_step(
        self, begin: int, wait: int, compute: int, overhead: int, first: bool, per: int, n: int
    ) -> None:
        """One step as Keras' hooks see it: ``n`` batches (``steps_per_execution``), ``per``
        samples."""
        s = self.session
        self._log.add(begin, wait, compute, overhead, first)
        if first and s.first_batch_ns is None:
            s.first_batch_ns = wait
        elif not first:
            s.wait.add(wait)
        s.batch_ring.append((s.batches, "main", begin + wait, wait, per, 0))
        s.arrived(begin + wait, per)
        s.spans.append(("main", "keras.train_step/wait", begin, wait))
        s.batches += n
        s.samples += per
        s.events += 2

    def _samples_per_step(self) -> int:
        for op in reversed(self._pipeline["ops"]):
            if op.get("batch_size"):
                return int(op["batch_size"])
        if self.dataset is not None:
            spec = import_tf().nest.flatten(self.dataset.element_spec)
            if spec and spec[0].shape.rank and spec[0].shape[0] is not None:
                return int(spec[0].shape[0])
        return 1

    def _describe(self) -> dict[str, Any]:
        tf = import_tf()
        model = self.model
        return {
            "loader": "keras.Model.fit",
            "model": type(model).__name__ if model is not None else None,
            "steps_per_execution": _int(getattr(model, "steps_per_execution", None)),
            "tensorflow": tf.__version__,
            "keras_version": getattr(_keras, "__version__", None),
            "cpu_count": os.cpu_count(),
            "tf": {"pipeline": self._pipeline["ops"]},
        }


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
