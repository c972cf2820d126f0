"""Host sampling with psutil: CPU of the main process and its children, cores, RSS, disk, iowait.

DataLoader workers are children of the main process, so ``Process().children(recursive=True)`` is
re-read every sample: workers that start late or are restarted each epoch are picked up, keyed by
pid. psutil's ``Process.cpu_percent(interval=None)`` measures since the previous call on the same
object, so Process objects are cached by pid and a process's first reading is n/a (priming), not 0.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeprof.collect.samplers.base import DEFAULT_CAPACITY, MIB, Clock, Sampler
from pipeprof.core.series import NA, NaType, TimeWeighted, Value, none_if_na

SATURATED_PCT = 90.0  # a core at or above this busy % counts as saturated
MAX_PROCESSES = 1024  # per-process aggregates kept; later children still count in children_cpu
Role = Literal["main", "child"]


@dataclass
class _Proc:
    """Aggregates of one process. ``cpu`` is % of one core (a busy 4-thread process shows 400)."""

    pid: int
    role: Role
    cpu: TimeWeighted = field(default_factory=TimeWeighted)
    rss_max_mb: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "role": self.role,
            "cpu_mean": self.cpu.mean,
            "cpu_max": self.cpu.max,
            "rss_max_mb": self.rss_max_mb,
        }


def _busy_total(times: Any) -> tuple[float, float]:
    """(busy, total) CPU seconds of a psutil ``scputimes``, counted as psutil's cpu_percent does."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class HostSampler(Sampler):
    """Samples host CPU, memory and disk at ``hz`` on thread ``pipeprof-host``.

    Per sample: system CPU % (0-100, all cores), per-core busy % and how many cores are saturated
    (>= 90 %), CPU % and RSS (MiB) of the main process and of each child process, system-wide disk
    read MiB/s, and iowait % of all CPU time (Linux; n/a elsewhere). n/a readings (a process's
    priming sample, a metric the OS lacks) are ``None`` in ``to_dict()`` and excluded from means.
    """

    thread_name = "pipeprof-host"

    def __init__(
        self, hz: float = 10.0, *, capacity: int = DEFAULT_CAPACITY, clock: Clock | None = None
    ) -> None:
        super().__init__(hz, capacity=capacity, **({"clock": clock} if clock else {}))
        self.available = False
        self.note: str | None = None
        self.cpu_count = os.cpu_count() or 1
        self._psutil: Any = None
        self._root: Any = None  # psutil.Process of this (the main) process
        self._live: dict[int, Any] = {}  # pid -> primed psutil.Process of a live child
        self._procs: dict[int, _Proc] = {}  # pid -> aggregates, main first
        self._last_times: list[tuple[float, float, float]] = []  # per core: busy, total, iowait
        self._last_disk: Value = NA  # read bytes
        self._last_t = 0
        self._has_iowait = False
        self.cpu = TimeWeighted()
        self.saturated = TimeWeighted()
        self.iowait = TimeWeighted()
        self.disk = TimeWeighted()
        self.rss_max_mb: float | None = None
        self._ring: deque[tuple[int, Value, Value, float, Value, Value, Value, float]] = deque(
            maxlen=capacity
        )  # t_ns, cpu, main_cpu, children_cpu, iowait, disk_read_mb_s, saturated, rss_mb

    def _prime(self, now_ns: int) -> bool:
        try:
            import psutil  # imported here: `import pipeprof.collect.samplers` stays light
        except ImportError:
            self.note = "psutil is not installed, so host CPU is not sampled; pip install psutil."
            return False
        self._psutil = psutil
        self._root = psutil.Process()
        self._root.cpu_percent(None)
        self._procs[self._root.pid] = _Proc(self._root.pid, "main")
        self.cpu_count = psutil.cpu_count() or self.cpu_count
        self._last_times = self._core_times()
        self._has_iowait = hasattr(psutil.cpu_times(), "iowait")  # Linux only
        self._last_disk = self._disk_read_bytes()
        self._last_t = now_ns
        main = self._procs[self._root.pid]
        for agg in (self.cpu, self.saturated, self.iowait, self.disk, main.cpu):
            agg.begin(now_ns)
        self._children(now_ns)
        self.available = True
        return True

    def _core_times(self) -> list[tuple[float, float, float]]:
        # Computed from cpu_times deltas rather than psutil.cpu_percent()/cpu_times_percent():
        # those keep one module-global "last call", which a 10 Hz thread would share with the
        # user's own calls and corrupt both.
        out = []
        for times in self._psutil.cpu_times(percpu=True):
            busy, total = _busy_total(times)
            out.append((busy, total, float(getattr(times, "iowait", 0.0))))
        return out

    def _disk_read_bytes(self) -> Value:
        try:
            counters = self._psutil.disk_io_counters()
        except Exception:
            return NA
        return NA if counters is None else float(counters.read_bytes)

    def _children(self, now_ns: int) -> dict[int, tuple[Any, bool]]:
        """Live children by pid, with True for those first seen (and primed) now."""
        current = {}
        for proc in self._root.children(recursive=True):
            cached = self._live.get(proc.pid)
            if cached is not None and cached == proc:  # same pid and create_time: already primed
                current[proc.pid] = (cached, False)
                continue
            try:
                proc.cpu_percent(None)
            except Exception:
                continue
            current[proc.pid] = (proc, True)
            if proc.pid not in self._procs and len(self._procs) < MAX_PROCESSES:
                self._procs[proc.pid] = _Proc(proc.pid, "child")
            if proc.pid in self._procs:
                self._procs[proc.pid].cpu.begin(now_ns)
        self._live = {pid: proc for pid, (proc, _) in current.items()}
        return current

    def _proc_reading(self, proc: Any, fresh: bool = False) -> tuple[Value, Value]:
        """(cpu %, rss MiB) of one process; CPU is NA when ``fresh`` (just primed); NA if the
        process vanished or is not readable."""
        try:
            with proc.oneshot():
                cpu: Value = NA if fresh else float(proc.cpu_percent(None))
                return cpu, proc.memory_info().rss / MIB
        except Exception:
            return NA, NA

    def _record_proc(self, now_ns: int, pid: int, cpu: Value, rss: Value) -> None:
        agg = self._procs.get(pid)
        if agg is None:
            return
        agg.cpu.add(now_ns, cpu)
        if not isinstance(rss, NaType):
            agg.rss_max_mb = rss if agg.rss_max_mb is None else max(agg.rss_max_mb, rss)

    def _sample(self, now_ns: int) -> None:
        if not self.available:
            return
        cpu, iowait, saturated = self._cpu()
        main_cpu, main_rss = self._proc_reading(self._root)
        self._record_proc(now_ns, self._root.pid, main_cpu, main_rss)
        children_cpu, rss = 0.0, 0.0 if isinstance(main_rss, NaType) else main_rss
        for pid, (proc, fresh) in self._children(now_ns).items():
            c_cpu, c_rss = self._proc_reading(proc, fresh)
            self._record_proc(now_ns, pid, c_cpu, c_rss)
            children_cpu += 0.0 if isinstance(c_cpu, NaType) else c_cpu
            rss += 0.0 if isinstance(c_rss, NaType) else c_rss
        disk_bytes, dt_s = self._disk_read_bytes(), (now_ns - self._last_t) / 1e9
        disk: Value = NA
        if not isinstance(disk_bytes, NaType) and not isinstance(self._last_disk, NaType):
            delta = disk_bytes - self._last_disk
            disk = delta / MIB / dt_s if delta >= 0 and dt_s > 0 else NA
        self._last_disk, self._last_t = disk_bytes, now_ns
        for agg, value in (
            (self.cpu, cpu),
            (self.iowait, iowait),
            (self.disk, disk),
            (self.saturated, saturated),
        ):
            agg.add(now_ns, value)
        self.rss_max_mb = rss if self.rss_max_mb is None else max(self.rss_max_mb, rss)
        self._ring.append((now_ns, cpu, main_cpu, children_cpu, iowait, disk, saturated, rss))

    def _cpu(self) -> tuple[Value, Value, Value]:
        """System busy %, iowait % and saturated-core count since the previous sample."""
        times = self._core_times()
        deltas = [
            tuple(n - o for n, o in zip(new, old, strict=True))
            for new, old in zip(times, self._last_times, strict=False)
        ]
        self._last_times = times
        busy = sum(d[0] for d in deltas)
        total = sum(d[1] for d in deltas)
        if total <= 0:  # no clock tick since the previous sample
            return NA, NA, NA
        saturated = sum(1 for d in deltas if d[1] > 0 and 100.0 * d[0] / d[1] >= SATURATED_PCT)
        iowait: Value = 100.0 * sum(d[2] for d in deltas) / total if self._has_iowait else NA
        return 100.0 * busy / total, iowait, float(saturated)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: system CPU, saturated cores, iowait, disk, RSS, ``per_process``
        (main first, then children by pid) and a ``timeline`` (n/a: None). MB are MiB.
        """
        with self._lock:
            ring = list(self._ring)
            procs = [p.to_dict() for p in self._procs.values()]
        procs[1:] = sorted(procs[1:], key=lambda p: int(p["pid"]))
        columns = (
            "t_ns",
            "cpu",
            "main_cpu",
            "children_cpu",
            "iowait",
            "disk_read_mb_s",
            "saturated_cores",
            "rss_mb",
        )
        timeline = {
            key: [r[k] if k == 0 else none_if_na(r[k]) for r in ring]
            for k, key in enumerate(columns)
        }
        return {
            "available": self.available,
            "note": self.note or (None if self.available else "The host sampler has not run yet."),
            "hz": self.hz,
            "lateness": self.lateness.to_dict(),
            "errors": self.errors,
            "cpu_count": self.cpu_count,
            "cpu_util_mean": self.cpu.mean,
            "cpu_util_max": self.cpu.max,
            "saturated_cores_mean": self.saturated.mean,
            "iowait_mean": self.iowait.mean,
            "disk_read_mb_s_mean": self.disk.mean,
            "rss_max_mb": self.rss_max_mb,
            "per_process": procs,
            "timeline": timeline,
        }
