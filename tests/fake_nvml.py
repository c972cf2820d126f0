"""A stand-in for the ``pynvml`` module, for tests on machines without a GPU.

It has the names pipeprof's NVML sampler uses (functions, constants, the ``NVMLError`` hierarchy)
and drives the real sampler code. It can script per-device utilisation, return the driver's
high-rate samples, fail chosen calls, report NotSupported, miss the library or have no GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_CLOCK_SM = 1
NVML_VALUE_TYPE_UNSIGNED_INT = 1


class NVMLError(Exception):
    value = 999

    def __str__(self) -> str:
        return type(self).__name__.removeprefix("NVMLError_")


class NVMLError_NotSupported(NVMLError):  # pynvml's names
    value = 3


class NVMLError_NotFound(NVMLError):
    value = 6


class NVMLError_DriverNotLoaded(NVMLError):
    value = 9


class NVMLError_LibraryNotFound(NVMLError):
    value = 12


class NVMLError_Unknown(NVMLError):
    value = 999


@dataclass
class FakeGpu:
    """One GPU. ``util``/``mem_util`` are consumed one per nvmlDeviceGetUtilizationRates call (the
    last repeats); ``samples`` one batch of driver samples per nvmlDeviceGetSamples call, the first
    batch answering the sampler's priming call; an empty batch, or running out, raises NotFound as
    the driver does when it has nothing newer. None for ``samples`` or ``power_mw`` means
    NotSupported."""

    name: str = "Fake GPU"
    util: Sequence[float] = (0,)
    mem_util: Sequence[float] = (0,)
    samples: Sequence[Sequence[int]] | None = ((),)  # supported, but never any new samples
    mem_used: int = 1 << 30
    mem_total: int = 16 << 30
    power_mw: int | None = 100_000
    sm_mhz: int = 1500
    calls: dict[str, int] = field(default_factory=dict)
    seen_timestamps: list[int] = field(default_factory=list)  # timeStamp args to GetSamples
    _clock_us: int = 1_000_000

    def next_of(self, key: str, script: Sequence[Any]) -> Any:
        n = self.calls.get(key, 0)
        self.calls[key] = n + 1
        return script[min(n, len(script) - 1)]


class FakeNvml:
    """Use as ``NvmlSampler(nvml=FakeNvml([...]))``. ``fail`` maps a function name to the
    exceptions its successive calls raise (None: that call succeeds)."""

    NVML_GPU_UTILIZATION_SAMPLES = NVML_GPU_UTILIZATION_SAMPLES
    NVML_CLOCK_SM = NVML_CLOCK_SM
    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_Unknown = NVMLError_Unknown

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (),
        *,
        library: bool = True,
        driver: bool = True,
        fail: dict[str, list[Exception | None]] | None = None,
    ):
        self.gpus = list(gpus)
        self.library = library
        self.driver = driver
        self.fail = {k: list(v) for k, v in (fail or {}).items()}
        self.inits = 0
        self.shutdowns = 0
        self.init_thread: str | None = None
        self.log: list[str] = []

    def _call(self, name: str) -> None:
        self.log.append(name)
        script = self.fail.get(name)
        if script:
            exc = script.pop(0)
            if exc is not None:
                raise exc

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if not self.library:
            raise NVMLError_LibraryNotFound()
        if not self.driver:
            raise NVMLError_DriverNotLoaded()
        self.inits += 1
        self.init_thread = threading.current_thread().name

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._call("nvmlDeviceGetHandleByIndex")
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._call("nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetSamples(self, handle: FakeGpu, kind: int, timestamp: int) -> Any:
        self._call("nvmlDeviceGetSamples")
        assert kind == NVML_GPU_UTILIZATION_SAMPLES
        if handle.samples is None:
            raise NVMLError_NotSupported()
        handle.seen_timestamps.append(timestamp)
        batch = handle.next_of("samples", [*handle.samples, ()])
        if not batch:
            raise NVMLError_NotFound()
        out = []
        for value in batch:
            handle._clock_us += 1000
            out.append(
                SimpleNamespace(
                    timeStamp=handle._clock_us, sampleValue=SimpleNamespace(uiVal=value)
                )
            )
        return NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(
            gpu=handle.next_of("util", handle.util),
            memory=handle.next_of("mem_util", handle.mem_util),
        )

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        self._call("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(
            used=handle.mem_used, total=handle.mem_total, free=handle.mem_total - handle.mem_used
        )

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self._call("nvmlDeviceGetPowerUsage")
        if handle.power_mw is None:
            raise NVMLError_NotSupported()
        return handle.power_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, kind: int) -> int:
        self._call("nvmlDeviceGetClockInfo")
        assert kind == NVML_CLOCK_SM
        return handle.sm_mhz
