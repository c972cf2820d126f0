"""A stand-in for CUDA events at the hardware boundary (the CI machines have no GPU).

``FakeGPU`` is one in-order stream whose clock (``now_ms``) the test moves as "kernels" run;
``FakeEvent`` records that clock and, like ``torch.cuda.Event``, refuses ``elapsed_time`` until
both events completed (``query``/``synchronize``). It counts synchronisations, so a test can
prove the loop is not synchronised per step.
"""

from __future__ import annotations

import math
import time


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


class WallGPU:
    """One in-order stream on the wall clock, like a real GPU: ``launch(ms)`` queues kernels
    that start when the stream is free (at once when idle) and return to the CPU at once; an
    event completes when the work queued before it is done, or when it is recorded on an idle
    GPU. So an idle GPU's events are as far apart as the CPU's records of them."""

    def __init__(self) -> None:
        self.busy_until_ms = 0.0
        self.created = 0

    @staticmethod
    def wall_ms() -> float:
        return time.perf_counter_ns() / 1e6

    def launch(self, ms: float) -> None:
        self.busy_until_ms = max(self.busy_until_ms, self.wall_ms()) + ms

    def event(self) -> WallEvent:
        self.created += 1
        return WallEvent(self)


class WallEvent:
    def __init__(self, gpu: WallGPU) -> None:
        self.gpu = gpu
        self.t_ms = math.nan

    def record(self) -> None:
        self.t_ms = max(self.gpu.busy_until_ms, self.gpu.wall_ms())

    def query(self) -> bool:
        return self.gpu.wall_ms() >= self.t_ms

    def synchronize(self) -> None:
        while not self.query():
            time.sleep(max(0.0, (self.t_ms - self.gpu.wall_ms()) / 1e3))

    def elapsed_time(self, end: WallEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("event not completed")  # what torch does
        return end.t_ms - self.t_ms
