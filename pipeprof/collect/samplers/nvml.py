"""GPU sampling through NVML (package ``nvidia-ml-py``, module ``pynvml``), main process only.

``pynvml`` is imported, and NVML initialised, on the sampler thread's first use, never at import
and never in a DataLoader worker. Every NVML call goes through ``query``, which returns ``NA`` on
any error, never 0. Without a driver, without ``pynvml`` or without GPUs the sampler reports
``available: False`` with a one-sentence ``note`` and everything else keeps working.

Where ``pynvml`` or the driver's library is missing, that is so for the rest of the process:
later samplers say the same note without a thread of their own (trying again costs 0.4 ms a
profile, in the training process, for nothing).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeprof.collect.samplers.base import DEFAULT_CAPACITY, MIB, Clock, Sampler
from pipeprof.core.series import NA, NaType, TimeWeighted, Value, none_if_na

_MISSING: list[str] = []  # the note of a real pynvml found missing, or its library: see above
_NVML_NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND: nvmlDeviceGetSamples has nothing newer
_SAMPLE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by value type
_ADVICE = {
    "utilisation samples": "utilisation falls back to nvmlDeviceGetUtilizationRates, whose "
    "1/6-1 s window blurs short stalls",
    "GPU utilisation": "util and mem_util are n/a (MIG slices and some vGPUs do not report them)",
    "memory": "memory figures are n/a",
    "power draw": "power_mean_w is n/a; nothing to fix, some GPUs do not report power",
    "SM clock": "sm_clock_mean_mhz is n/a; nothing to fix",
}


def _is_nvml_error(exc: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(exc).__mro__)


def query(
    fn: Callable[..., Any], *args: Any, on_error: Callable[[BaseException], None] | None = None
) -> Any:
    """Call an NVML function; on ``NVMLError`` or any other exception return ``NA``, never 0.

    ``on_error`` (if given) sees the exception first, e.g. to note unsupported metrics once.
    """
    try:
        return fn(*args)
    except Exception as exc:
        if on_error is not None:
            on_error(exc)
        return NA


def _scaled(value: Any, factor: float) -> Value:
    return NA if isinstance(value, NaType) else float(value) * factor


Reading = tuple[Value, Value, Value, Value, Value]  # util, mem_util, mem_used_mb, power_w, sm_mhz


@dataclass
class _Device:
    """One sampled GPU and its running aggregates."""

    index: int
    handle: Any
    name: str
    mem_total_mb: Value = NA
    use_samples: bool = True  # False once nvmlDeviceGetSamples proved unsupported
    last_seen_us: int = 0  # newest driver sample timestamp already counted (microseconds)
    util: TimeWeighted = field(default_factory=lambda: TimeWeighted(hist=True))
    mem_util: TimeWeighted = field(default_factory=TimeWeighted)
    mem_used: TimeWeighted = field(default_factory=TimeWeighted)
    power: TimeWeighted = field(default_factory=TimeWeighted)
    clock: TimeWeighted = field(default_factory=TimeWeighted)

    @property
    def aggregates(self) -> tuple[TimeWeighted, ...]:
        """In ``Reading`` order."""
        return self.util, self.mem_util, self.mem_used, self.power, self.clock

    def record(self, t_ns: int, reading: Reading) -> None:
        for agg, value in zip(self.aggregates, reading, strict=True):
            agg.add(t_ns, value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "util_mean": self.util.mean,
            "util_p50": self.util.percentile(50),
            "util_max": self.util.max,
            "mem_util_mean": self.mem_util.mean,
            "mem_used_max_mb": self.mem_used.max,
            "mem_total_mb": none_if_na(self.mem_total_mb),
            "power_mean_w": self.power.mean,
            "sm_clock_mean_mhz": self.clock.mean,
        }


class NvmlSampler(Sampler):
    """Samples each GPU's utilisation %, memory utilisation %, memory used MiB, power W and SM
    clock MHz at ``hz`` on thread ``pipeprof-nvml``.

    ``gpus`` restricts sampling to these NVML indices (default: all). ``nvml`` is the NVML module
    to use (None: import ``pynvml`` lazily; tests pass a fake). Values that could not be read are
    n/a: ``None`` in ``to_dict()``, excluded from means, never counted as 0.
    """

    thread_name = "pipeprof-nvml"

    def __init__(
        self,
        hz: float = 10.0,
        gpus: Sequence[int] | None = None,
        *,
        capacity: int = DEFAULT_CAPACITY,
        clock: Clock | None = None,
        nvml: Any = None,
    ) -> None:
        super().__init__(hz, capacity=capacity, **({"clock": clock} if clock else {}))
        self.gpus = None if gpus is None else list(gpus)
        self._nvml = nvml
        self._real = False  # the nvml module is pynvml itself, not one passed in
        self._initialised = False
        self.available = False
        self.note: str | None = None  # why the sampler is unavailable, in one sentence
        self.notes: list[str] = []  # per-metric notes (unsupported, first error), each once
        self._noted: set[tuple[str, int]] = set()
        self._unsupported: set[tuple[str, int]] = set()  # (metric, GPU index)
        self.query_errors = 0  # NVML calls that failed (unsupported metrics included)
        self.devices: list[_Device] = []
        self._ring: deque[tuple[int, tuple[Reading, ...]]] = deque(maxlen=capacity)

    # ---- opening --------------------------------------------------------------------------

    def _refusal(self) -> str | None:
        if multiprocessing.parent_process() is not None:
            return (
                "GPU sampling was skipped: NVML is only used from the main process, not a "
                "DataLoader worker or other child; start the profiler in the main process."
            )
        if self._nvml is None and _MISSING:  # the real pynvml, found missing before
            return _MISSING[0]
        return None

    def _prime(self, now_ns: int) -> bool:
        self.note = self._refusal()
        if self.note is not None:
            return False
        nvml = self._load()
        if nvml is None or not self._init(nvml):
            return False
        count = query(nvml.nvmlDeviceGetCount)
        if isinstance(count, NaType) or count == 0:
            self.note = (
                "NVML found no GPU, so GPU utilisation is not sampled; check that "
                "`nvidia-smi` lists your GPUs."
            )
            return False
        for index in range(count) if self.gpus is None else dict.fromkeys(self.gpus):
            self._open_device(nvml, index, count)
        if not self.devices:
            self.note = (
                f"None of the requested GPUs {self.gpus} could be opened (NVML sees "
                f"{count}); pass gpus= with indices from 0 to {count - 1}."
            )
            return False
        for dev in self.devices:
            for agg in dev.aggregates:
                agg.begin(now_ns)
        self.available = True
        return True

    def _load(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # imported here: `import pipeprof` must not load NVML
            except ImportError:
                self.note = (
                    "pynvml is not installed, so GPU utilisation is not sampled; run "
                    "`pip install nvidia-ml-py`."
                )
                _MISSING[:] = [self.note]
                return None
            self._nvml = pynvml
            self._real = True
        return self._nvml

    def _init(self, nvml: Any) -> bool:
        try:
            nvml.nvmlInit()
        except Exception as exc:
            if _is_nvml_error(exc, "NVMLError_LibraryNotFound"):
                self.note = (
                    "No NVIDIA driver library (libnvidia-ml.so) was found, so GPU "
                    "utilisation is not sampled; install the NVIDIA driver on GPU "
                    "machines, or ignore this on a CPU-only machine."
                )
                if self._real:
                    _MISSING[:] = [self.note]
            elif _is_nvml_error(exc, "NVMLError_DriverNotLoaded"):
                self.note = (
                    "The NVIDIA driver is not loaded, so GPU utilisation is not sampled; "
                    "check that `nvidia-smi` works."
                )
            else:
                self.note = (
                    f"NVML failed to start ({exc}), so GPU utilisation is not sampled; "
                    "check that `nvidia-smi` works."
                )
            return False
        self._initialised = True
        return True

    def _open_device(self, nvml: Any, index: int, count: int) -> None:
        if not 0 <= index < count:
            self._note("gpus", index, f"GPU {index} does not exist (NVML sees {count}); skipped.")
            return
        handle = self._q("handle", index, nvml.nvmlDeviceGetHandleByIndex, index)
        if isinstance(handle, NaType):
            return
        name = self._q("name", index, nvml.nvmlDeviceGetName, handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        dev = _Device(index, handle, name)
        memory = self._q("memory", index, nvml.nvmlDeviceGetMemoryInfo, handle)
        if not isinstance(memory, NaType):
            dev.mem_total_mb = memory.total / MIB
        # Prime the driver's sample buffer: remember its newest timestamp so the first interval
        # counts only samples taken after sampling started.
        self._driver_samples(nvml, dev)
        self.devices.append(dev)

    def _close(self) -> None:
        if self._initialised and self._nvml is not None:
            self._initialised = False
            query(self._nvml.nvmlShutdown)

    # ---- sampling -------------------------------------------------------------------------

    def _note(self, metric: str, index: int, text: str) -> None:
        if (metric, index) not in self._noted:
            self._noted.add((metric, index))
            self.notes.append(text)

    def _q(self, metric: str, index: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``query`` that notes, once per metric and GPU, why a metric is n/a."""

        def on_error(exc: BaseException) -> None:
            self.query_errors += 1
            if _is_nvml_error(exc, "NVMLError_NotSupported"):
                self._unsupported.add((metric, index))
                advice = _ADVICE.get(metric, "it is n/a")
                self._note(metric, index, f"{metric} not supported on GPU {index}: {advice}.")
            elif metric != "utilisation samples" or not _is_nvml_error(exc, "NVMLError_NotFound"):
                self._note(
                    metric,
                    index,
                    f"reading {metric} on GPU {index} failed ({exc}); such samples are n/a.",
                )

        return query(fn, *args, on_error=on_error)

    def _driver_samples(self, nvml: Any, dev: _Device) -> Value:
        """Mean of the driver's utilisation samples newer than the last seen; NA if none."""
        if not dev.use_samples:
            return NA
        got = self._q(
            "utilisation samples",
            dev.index,
            nvml.nvmlDeviceGetSamples,
            dev.handle,
            nvml.NVML_GPU_UTILIZATION_SAMPLES,
            dev.last_seen_us,
        )
        if isinstance(got, NaType):
            dev.use_samples = ("utilisation samples", dev.index) not in self._unsupported
            return NA
        value_type, samples = got
        fresh = [s for s in samples if s.timeStamp > dev.last_seen_us]
        if not fresh:
            return NA
        dev.last_seen_us = max(s.timeStamp for s in fresh)
        attr = _SAMPLE_FIELDS[value_type] if 0 <= value_type < len(_SAMPLE_FIELDS) else "uiVal"
        return sum(float(getattr(s.sampleValue, attr)) for s in fresh) / len(fresh)

    def _read(self, nvml: Any, dev: _Device) -> Reading:
        i, h = dev.index, dev.handle
        util = self._driver_samples(nvml, dev)
        rates = self._q("GPU utilisation", i, nvml.nvmlDeviceGetUtilizationRates, h)
        if isinstance(util, NaType) and not isinstance(rates, NaType):
            util = float(rates.gpu)
        mem_util: Value = NA if isinstance(rates, NaType) else float(rates.memory)
        memory = self._q("memory", i, nvml.nvmlDeviceGetMemoryInfo, h)
        mem_used: Value = NA if isinstance(memory, NaType) else memory.used / MIB
        power = _scaled(self._q("power draw", i, nvml.nvmlDeviceGetPowerUsage, h), 1e-3)  # mW
        clock = _scaled(
            self._q("SM clock", i, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM), 1.0
        )
        return util, mem_util, mem_used, power, clock

    def _sample(self, now_ns: int) -> None:
        if not self.available:
            return
        readings = tuple(self._read(self._nvml, dev) for dev in self.devices)
        for dev, reading in zip(self.devices, readings, strict=True):
            dev.record(now_ns, reading)
        self._ring.append((now_ns, readings))

    def latest(self) -> list[tuple[Value, Value]]:
        """Each device's last (utilisation %, memory used MB), for the live view; [] before
        the first sample."""
        ring = self._ring
        if not ring:
            return []
        return [(r[0], r[2]) for r in ring[-1][1]]

    # ---- output ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: ``available``, ``note``, ``hz``, ``lateness``, ``devices`` and a
        ``timeline`` whose series hold one list per sample with one value per device (n/a: None).
        """
        with self._lock:
            ring = list(self._ring)
            devices = [dev.to_dict() for dev in self.devices]
        series = ("util", "mem_util", "mem_used_mb", "power_w", "sm_clock_mhz")
        timeline: dict[str, list[Any]] = {"t_ns": [t for t, _ in ring]}
        for k, key in enumerate(series):
            timeline[key] = [[none_if_na(r[k]) for r in readings] for _, readings in ring]
        if self.available:
            note = "; ".join(self.notes) or None
        else:
            note = self.note or self._refusal() or "The GPU sampler has not run yet; start() it."
        return {
            "available": self.available,
            "note": note,
            "notes": list(self.notes),
            "hz": self.hz,
            "lateness": self.lateness.to_dict(),
            "errors": self.errors,
            "query_errors": self.query_errors,
            "devices": devices,
            "timeline": timeline,
        }
