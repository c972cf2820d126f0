"""A stand-in for CUDA events at the hardware boundary (the CI machines have no GPU).

``FakeGPU`` is one in-order stream whose clock (``now_ms``) the test moves as "kernels" run;
``FakeEvent`` records that clock and, like ``torch.cuda.Event``, refuses ``elapsed_time`` until
both events completed (``query``/``synchronize``). It counts synchronisations, so a test can
prove the loop is not synchronised per step.
"""

from __future__ import annotations

import math


class FakeGPU:
    """One in-order stream: events complete in record order up to ``completed``."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.recorded = 0
        self.completed = 0
        self.created = 0
        self.queries = 0
        self.syncs = 0

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGPU) -> None:
        self.gpu = gpu
        self.seq = 0
        self.t_ms = math.nan

    def record(self) -> None:
        self.gpu.recorded += 1
        self.seq = self.gpu.recorded
        self.t_ms = self.gpu.now_ms

    def query(self) -> bool:
        self.gpu.queries += 1
        return self.seq <= self.gpu.completed

    def synchronize(self) -> None:
        self.gpu.syncs += 1
        self.gpu.completed = max(self.gpu.completed, self.seq)

    def elapsed_time(self, end: FakeEvent) -> float:
        if max(self.seq, end.seq) > self.gpu.completed:
            raise RuntimeError("event not completed")  # what torch does
        return end.t_ms - self.t_ms
