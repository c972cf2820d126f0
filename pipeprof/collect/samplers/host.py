"""Host sampling: CPU of the main process and its children, cores, RSS, disk, iowait.

NOTE [ Host sampling cost ]
At 10 Hz the sampler must stay well under 0.5 % of a core (benchmarks/sampler_cost.py). Where
its time went: psutil's ``Process.children(recursive=True)`` reads the stat of every process on
the machine (1-3 ms with ~75 processes), and psutil's per-call overhead (``disk_io_counters`` looks
up ``/sys/block`` for every line, ``Process`` objects and ``oneshot``) another ~0.4 ms per sample.
So:

- On Linux the sampler reads ``/proc`` itself, one ``pread`` of a file it keeps open per
  reading: ``/proc/stat`` (per-core times), ``/proc/diskstats`` (sectors read by whole disks, as
  psutil counts them) and ``/proc/<pid>/stat`` of each known process (utime + stime, RSS, start
  time). Elsewhere, or if ``/proc`` cannot be read, psutil gives the same readings.
- Children (DataLoader workers, recursively: forkserver's too) are not looked up every sample,
  only when one may have been created and as often as the look-up's own cost allows:
  * on Linux, when the last pid the kernel handed out in this pid namespace (``/proc/loadavg``;
    threads take pids too) has changed since the previous look-up: if it has not, no process
    has started, and the sampler skips the look-up. Elsewhere there is no such signal and
    every sample may look;
  * and while the look-ups' CPU budget lasts: a token bucket that the sampler thread's CPU
    time for each look-up is taken from, refilled at ``DISCOVERY_SHARE`` (0.2 % of a core) and
    holding at most ``DISCOVERY_BURST_NS`` (2 ms). So look-ups cost at most 0.2 % of a core
    (plus 2 ms once) whatever the machine, yet those at an epoch's start, when workers appear,
    are not held back by one costly look-up before (the first one in a process runs cold). On
    Linux a look-up lists ``/proc/<pid>/task/<tid>/children`` of the main process and its
    children (~20 µs a thread: ~150 µs with 2 DataLoader workers, so a look-up every sample is
    within budget); where that file is missing, and on other platforms, psutil's scan (1-3 ms:
    once the burst is spent, one every 0.5-1.5 s).
  A child is sampled from the first look-up after it starts: it loses at most that delay (its
  CPU and RSS before then are in neither its ``per_process`` entry nor ``children_cpu``), plus its
  priming sample as before. A child that exits is dropped at the first sample that cannot read it.

A sample only takes snapshots: on Linux the bytes of each /proc file, kept as they are. Every
``SETTLE_EVERY`` samples (5 s at 10 Hz), when the sampler stops and whenever its summary is read,
the pending snapshots are made into readings and aggregates at once, in the order taken. Parsing
fifty samples in one loop runs warm; one sample's parsing 100 ms after the last one ran cold, at
two to three times the cost (``benchmarks/sampler_cost.py``).

A source (the open /proc files, psutil's objects, which devices are whole disks, the core
count) is made once per process and kept between samplers (``_take`` and ``_give_back``): making
one costs 1-2 ms where a profile starts, as much as 5 samples, and it does not change. Each
sampler holds its own while it runs, so two at once never share descriptors; a child's are let
go when the sampler stops.

A process's CPU % is the change of its CPU time (user + system) over the monotonic wall time
between two of its readings, as psutil's ``cpu_percent(None)`` computes it; its first reading is
n/a (priming), not 0. Processes are keyed by pid and start time: a pid reused by another process
is a new process.

NOTE [ Private memory ]
RSS counts a forked worker's pages shared with the training process as its own, so it cannot
show a worker copying them (copy-on-write, on a write; copy-on-read, where reading a Python
object writes its reference count). Each process's PSS (shared pages split among the processes
sharing them) and USS (its private pages: ``Private_Clean + Private_Dirty``) come from
``/proc/<pid>/smaps_rollup`` (psutil's ``memory_full_info()`` elsewhere). The kernel walks the
process's page tables for it: 7 ms for a 320 MB process on this project's VM, 4,000 times a
``stat`` read. So memory is read apart from the samples, one process at a time in turn (the
children first), at most once a second each (MEMORY_EVERY_NS), while a budget lasts: a token
bucket as the look-ups' own, refilled at MEMORY_SHARE (0.1 % of a core) and holding
MEMORY_BURST_NS (10 ms). A worker of 300 MB is then read about every 8 s, one of 2 GB about
every 50 s: a run's trend, not its every step (with 2 DataLoader workers,
``benchmarks/sampler_cost.py --loader --seconds 10``, medians of 3 windows, 2 runs each way:
the sampler took 0.27-0.41 % of a core with memory read, 0.26-0.29 % without; at 0.2 % of a
core, 0.42-0.52 %). Each process keeps its last MEMORY_KEPT readings, the older half thinned to
every other one when full, so a long run keeps its whole span. None is read in the sampler's
first MEMORY_FIRST_NS (1 s): the start-up, when the workers start and fill their prefetch and
the cores are busiest, and a fresh fork's USS says little. Read there, a short loop's first
steps paid for it (with psutil's import on the same thread, now made before the script runs
under ``pipeprof run``: ``prepare``): the sampler's start-up took 22-26 ms of CPU in a 60-step
loop with 2 workers (``benchmarks/short_run.py``'s), 2.8-4.0 ms without.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeprof.collect.samplers.base import DEFAULT_CAPACITY, MIB, Clock, Sampler
from pipeprof.core.series import NA, NaType, TimeWeighted, Value, none_if_na

SATURATED_PCT = 90.0  # a core at or above this busy % counts as saturated
MAX_PROCESSES = 1024  # per-process aggregates kept; later children still count in children_cpu
DISCOVERY_SHARE = 0.002  # children look-ups take at most this share of a core: see NOTE above
DISCOVERY_BURST_NS = 2_000_000  # ... beyond which they may spend this much CPU at once
SETTLE_EVERY = 50  # samples whose snapshots are made into readings at once: see NOTE above
SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own
MEMORY_EVERY_NS = 1_000_000_000  # NOTE [ Private memory ]: a process's memory at most this often
MEMORY_SHARE = 0.001  # ... within this share of a core
MEMORY_BURST_NS = 10_000_000  # ... holding at most this much CPU at once
MEMORY_FIRST_NS = 1_000_000_000  # ... and none before this long after the sampler starts
MEMORY_KEPT = 512  # a process's memory readings kept
Role = Literal["main", "child"]
CoreTimes = list[tuple[float, float, float, float]]  # per core: busy, total, iowait, steal
Reading = tuple[float, float, float]  # a process's start time (identity), CPU seconds, RSS bytes


@dataclass
class _Proc:
    """Aggregates of one process. ``cpu`` is % of one core (a busy 4-thread process shows 400)."""

    pid: int
    role: Role
    cpu: TimeWeighted = field(default_factory=TimeWeighted)
    rss_max_mb: float | None = None
    # NOTE [ Private memory ]: (t_ns, rss, pss, uss) in MiB, pss and uss None where not known
    memory: list[tuple[int, float, float | None, float | None]] = field(default_factory=list)
    memory_at: int = 0  # monotonic ns of its last memory reading

    def add_memory(self, t_ns: int, rss: float, pss: float | None, uss: float | None) -> None:
        if len(self.memory) >= MEMORY_KEPT:  # the older half thinned to every other reading
            half = MEMORY_KEPT // 2
            self.memory[:half] = self.memory[:half:2]
        self.memory.append((t_ns, rss, pss, uss))

    def to_dict(self) -> dict[str, Any]:
        mem = self.memory
        uss = [m[3] for m in mem if m[3] is not None]
        pss = [m[2] for m in mem if m[2] is not None]
        return {
            "pid": self.pid,
            "role": self.role,
            "cpu_mean": self.cpu.mean,
            "cpu_max": self.cpu.max,
            "rss_max_mb": self.rss_max_mb,
            "uss_max_mb": max(uss) if uss else None,
            "pss_max_mb": max(pss) if pss else None,
            "memory": {
                "t_ns": [m[0] for m in mem],
                "rss_mb": [m[1] for m in mem],
                "pss_mb": [m[2] for m in mem],
                "uss_mb": [m[3] for m in mem],
            },
        }


@dataclass
class _Last:
    """A process's previous reading: its identity, CPU seconds, and when (monotonic ns)."""

    ident: float
    cpu_s: float
    wall_ns: int


def _busy_total(times: Any) -> tuple[float, float]:
    """(busy, total) CPU seconds of a psutil ``scputimes``, counted as psutil's cpu_percent does."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class _Psutil:
    """Readings through psutil: any platform psutil supports."""

    def __init__(self, psutil: Any) -> None:
        self.psutil = psutil
        self.pid = os.getpid()  # whose source this is: a forked child makes its own
        self.cpu_count = psutil.cpu_count() or os.cpu_count() or 1
        self._root = psutil.Process()
        self._procs: dict[int, Any] = {self._root.pid: self._root}  # pid -> psutil.Process
        self.has_iowait = hasattr(psutil.cpu_times(), "iowait")  # Linux only

    # A sample takes snapshots (``snap_*``), cheap; the readings are made of them (``*_of``)
    # later, many at once (NOTE [ Host sampling cost ]). Here a snapshot is the reading itself.

    def snap_cores(self) -> Any:
        return self.core_times()

    def cores_of(self, snap: Any) -> CoreTimes:
        return snap  # type: ignore[no-any-return]

    def snap_disk(self) -> Any:
        return self.disk_read_bytes()

    def disk_of(self, snap: Any) -> Value:
        return snap  # type: ignore[no-any-return]

    def snap(self, pid: int) -> Any:
        return self.read(pid)

    def reading_of(self, snap: Any) -> Reading:
        return snap  # type: ignore[no-any-return]

    def core_times(self) -> CoreTimes:
        # From cpu_times deltas rather than psutil.cpu_percent()/cpu_times_percent(): those keep
        # one module-global "last call", which a 10 Hz thread would share with the user's own
        # calls and corrupt both.
        out = []
        for times in self.psutil.cpu_times(percpu=True):
            busy, total = _busy_total(times)
            iowait, steal = getattr(times, "iowait", 0.0), getattr(times, "steal", 0.0)
            out.append((busy, total, float(iowait), float(steal)))
        return out

    def disk_read_bytes(self) -> Value:
        try:
            counters = self.psutil.disk_io_counters()
        except Exception:
            return NA
        return NA if counters is None else float(counters.read_bytes)

    def pid_marker(self) -> int | None:
        """Something that changes whenever a process starts, or None where there is none."""
        return None

    def children(self, pid: int) -> list[int]:
        """Pids of the descendants of ``pid``."""
        root = self._root if pid == self._root.pid else self.psutil.Process(pid)
        found = root.children(recursive=True)
        self._procs = {p.pid: p for p in found} | {root.pid: self._procs.get(root.pid, root)}
        return [p.pid for p in found]

    def forget(self, pid: Any) -> None:
        """Drop what is kept for reading ``pid`` (it exited, or is no longer a child)."""
        if pid != self._root.pid:
            self._procs.pop(pid, None)

    def close(self) -> None:
        return None

    def release(self) -> None:
        """Let go of what is kept for the children (another sampler may take this source)."""
        self._procs = {self._root.pid: self._root}

    def available(self) -> tuple[float, float]:
        """The machine's memory available to new allocations and its total, in bytes."""
        vm = self.psutil.virtual_memory()
        return float(vm.available), float(vm.total)

    def memory(self, pid: int) -> tuple[float, float | None, float | None]:
        """RSS, PSS and USS in bytes (NOTE [ Private memory ]); PSS or USS None where the
        platform has none."""
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = self.psutil.Process(pid)
        full = proc.memory_full_info()
        pss, uss = getattr(full, "pss", None), getattr(full, "uss", None)
        return float(full.rss), None if pss is None else float(pss), (
            None if uss is None else float(uss))  # fmt: skip

    def read(self, pid: int) -> Reading:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = self.psutil.Process(pid)
        with proc.oneshot():
            times = proc.cpu_times()
            rss = proc.memory_info().rss
        return proc.create_time(), times.user + times.system, float(rss)


def _pread_all(fd: int) -> bytes:
    """All of a /proc file through an open descriptor: a read from offset 0 makes it afresh."""
    data = os.pread(fd, 4096, 0)
    while len(data) % 4096 == 0 and data:  # a full buffer: there may be more
        more = os.pread(fd, 65536, len(data))
        if not more:
            break
        data += more
    return data


class _Procfs(_Psutil):
    """Readings straight from Linux ``/proc``, one ``pread`` each of a file kept open (psutil for
    the rare fallbacks). A process's stat stays open while it is sampled: the descriptor names
    that process, not its pid, so reading it after the process is reaped fails (ESRCH)."""

    def __init__(self, psutil: Any) -> None:
        super().__init__(psutil)
        self._clk_tck = float(os.sysconf("SC_CLK_TCK"))
        self._page = float(os.sysconf("SC_PAGE_SIZE"))
        self._whole_disk: dict[bytes, bool] = {}  # diskstats name -> a disk, not a partition
        self._fds: dict[Any, int] = {}  # path or pid -> open descriptor
        me = os.getpid()
        # /proc/<pid>/task/<tid>/children needs CONFIG_PROC_CHILDREN (on in common distros).
        self._task_children = os.path.exists(f"/proc/{me}/task/{me}/children")
        self.has_iowait = any(len(c) > 5 for c in self._cpu_lines())

    def _read(self, key: Any, path: str) -> bytes:
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return _pread_all(fd)
        except OSError:
            self.forget(key)
            raise

    def forget(self, pid: Any) -> None:
        super().forget(pid)
        fd = self._fds.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for key in list(self._fds):
            self.forget(key)

    def release(self) -> None:
        super().release()
        for pid in [k for k in self._fds if isinstance(k, int) and k != self.pid]:
            self.forget(pid)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _cpu_lines(self, data: bytes | None = None) -> list[list[bytes]]:
        if data is None:
            data = self._read("stat", "/proc/stat")
        end = data.find(b"\nintr")  # the per-core lines come first; "intr" is long
        head = data if end < 0 else data[:end]
        return [ln.split() for ln in head.splitlines() if ln[:3] == b"cpu" and ln[3:4].isdigit()]

    def snap_cores(self) -> Any:
        return self._read("stat", "/proc/stat")

    def core_times(self) -> CoreTimes:
        return self.cores_of(self.snap_cores())

    def cores_of(self, snap: Any) -> CoreTimes:
        # user nice system idle iowait irq softirq steal guest guest_nice (clock ticks); guest
        # time is in user time already. Busy and total as _busy_total counts psutil's.
        out = []
        for line in self._cpu_lines(snap):
            v = [int(x) for x in line[1:]]
            total = sum(v) - sum(v[8:10])
            iowait = v[4] if len(v) > 4 else 0
            steal = v[7] if len(v) > 7 else 0
            out.append((float(total - v[3] - iowait), float(total), float(iowait), float(steal)))
        return out

    def snap_disk(self) -> Any:
        try:
            return self._read("diskstats", "/proc/diskstats")
        except OSError:
            return super().disk_read_bytes()  # a reading already (psutil's)

    def disk_read_bytes(self) -> Value:
        return self.disk_of(self.snap_disk())

    def disk_of(self, snap: Any) -> Value:
        if not isinstance(snap, bytes):
            return snap  # type: ignore[no-any-return]
        sectors, seen = 0, False
        for line in snap.splitlines():
            fields = line.split()
            if len(fields) == 14 or len(fields) >= 18:  # a disk: sectors read is the 6th field
                name, n = fields[2], fields[5]
            elif len(fields) == 7:  # a partition (Linux 2.6): the 5th
                name, n = fields[2], fields[4]
            else:
                continue
            whole = self._whole_disk.get(name)
            if whole is None:  # psutil's is_storage_device: virtual devices count, partitions not
                path = b"/sys/block/" + name.replace(b"/", b"!")
                whole = self._whole_disk[name] = os.access(path, os.F_OK)
            if whole:
                sectors += int(n)
                seen = True
        return float(sectors * SECTOR) if seen else NA

    def pid_marker(self) -> int | None:
        try:  # the last pid handed out in this pid namespace (to a process or a thread)
            return int(self._read("loadavg", "/proc/loadavg").split()[-1])
        except (OSError, ValueError, IndexError):
            return None

    def children(self, pid: int) -> list[int]:
        if not self._task_children:
            return super().children(pid)
        found: list[int] = []
        todo = [pid]
        while todo:
            parent = todo.pop()
            try:
                tids = os.listdir(f"/proc/{parent}/task")
            except OSError:  # exited
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                        kids = [int(k) for k in f.read().split()]
                except OSError:
                    continue
                found += kids
                todo += kids
        return found

    def snap(self, pid: int) -> Any:
        return self._read(pid, f"/proc/{pid}/stat")

    def memory(self, pid: int) -> tuple[float, float | None, float | None]:
        fd = os.open(f"/proc/{pid}/smaps_rollup", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = _pread_all(fd)
        finally:
            os.close(fd)
        kb: dict[bytes, int] = {}
        for line in data.splitlines()[1:]:
            name, _, rest = line.partition(b":")
            parts = rest.split()
            if parts:
                kb[name] = int(parts[0])
        if b"Rss" not in kb:  # no such file here (a kernel before 4.14): psutil's way
            return super().memory(pid)
        uss = kb.get(b"Private_Clean", 0) + kb.get(b"Private_Dirty", 0)
        return kb[b"Rss"] * 1024.0, kb.get(b"Pss", 0) * 1024.0, uss * 1024.0

    def read(self, pid: int) -> Reading:
        return self.reading_of(self.snap(pid))

    def reading_of(self, snap: Any) -> Reading:
        fields = snap[snap.rindex(b")") + 2 :].split()  # after "pid (comm) ": state is fields[0]
        # utime, stime (clock ticks), starttime (ticks since boot), rss (pages): fields 14, 15,
        # 22 and 24 of proc(5); psutil's memory_info().rss reads the same count from statm.
        cpu_s = (int(fields[11]) + int(fields[12])) / self._clk_tck
        return float(fields[19]), cpu_s, int(fields[21]) * self._page


def _procfs_available() -> bool:
    return sys.platform.startswith("linux") and all(
        os.access(p, os.R_OK) for p in ("/proc/stat", "/proc/self/stat", "/proc/loadavg")
    )


_POOL: list[_Psutil] = []  # sources no sampler holds now (see NOTE [ Host sampling cost ])


def _take(psutil: Any) -> _Psutil:
    """A source of this process's kind, kept from an earlier sampler or made now."""
    kind = _Procfs if _procfs_available() else _Psutil
    while _POOL:
        try:
            src = _POOL.pop()  # atomic: another thread may have taken the last one meanwhile
        except IndexError:
            break
        if src.pid == os.getpid() and type(src) is kind:
            return src
        src.close()  # a parent's, inherited through fork, or of the other kind
    return kind(psutil)


def prepare() -> None:
    """Import psutil and make this process's source now, on the calling thread (``pipeprof
    run``'s set-up, before the script): else the sampler thread does it where the loop starts,
    contending with the training thread (12 ms of import after torch's, 1-2 ms of source)."""
    try:
        import psutil
    except ImportError:
        return
    _give_back(_take(psutil))


def _give_back(src: _Psutil) -> None:
    src.release()
    if src.pid == os.getpid() and len(_POOL) < 2:
        _POOL.append(src)
    else:
        src.close()


class HostSampler(Sampler):
    """Samples host CPU, memory and disk at ``hz`` on thread ``pipeprof-host``.

    Per sample: system CPU % (0-100, all cores), per-core busy % and how many cores are saturated
    (>= 90 %), CPU % and RSS (MiB) of the main process and of each child process, system-wide disk
    read MiB/s, and iowait % of all CPU time (Linux; n/a elsewhere). n/a readings (a process's
    priming sample, a metric the OS lacks) are ``None`` in ``to_dict()`` and excluded from means.
    Children are looked up only when one may have started, within a CPU budget, so a new child is
    seen a sample or more after it starts: see NOTE [ Host sampling cost ] in this module.
    """

    thread_name = "pipeprof-host"

    def __init__(
        self, hz: float = 10.0, *, capacity: int = DEFAULT_CAPACITY, clock: Clock | None = None
    ) -> None:
        super().__init__(hz, capacity=capacity, **({"clock": clock} if clock else {}))
        self.available = False
        self.note: str | None = None
        self.cpu_count = os.cpu_count() or 1
        self._src: _Psutil | None = None
        self._pid = os.getpid()  # the main process
        self._kids: list[int] = []  # pids of the children found by the last look-up, still alive
        self._last: dict[int, _Last] = {}  # pid -> previous reading, main and children
        self._marker: int | None = None  # the source's pid marker at the last look-up
        self._credit_ns = float(DISCOVERY_BURST_NS)  # CPU the look-ups may spend now ...
        self._credit_t = 0  # ... as of this time (monotonic ns)
        self._mem_credit = float(MEMORY_BURST_NS)  # NOTE [ Private memory ]: its budget ...
        self._mem_credit_t = 0  # ... as of this time (monotonic ns)
        self._mem_from = 0  # ... and no reading before this time (monotonic ns)
        self._mem_next = 0  # the process whose memory is read next, in turn
        self.mem_available_mb: float | None = None  # the machine's, at the last memory reading
        self.mem_total_mb: float | None = None
        self.lookups = 0  # children look-ups so far
        self._procs: dict[int, _Proc] = {}  # pid -> aggregates, main first
        self._last_times: CoreTimes = []
        self._last_disk: Value = NA  # read bytes
        self._last_t = 0
        self._pending: list[tuple[Any, ...]] = []  # snapshots not made into readings yet
        self._has_iowait = False
        self.cpu = TimeWeighted()
        self.saturated = TimeWeighted()
        self.iowait = TimeWeighted()
        self.steal = TimeWeighted()  # % of all CPU time the hypervisor gave to other machines
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
        src = self._src = _take(psutil)
        self._pid = os.getpid()
        self._procs[self._pid] = _Proc(self._pid, "main")
        self.cpu_count = src.cpu_count
        self._last_times = src.core_times()
        self._has_iowait = src.has_iowait
        self._last_disk = src.disk_read_bytes()
        self._last_t = now_ns
        wall = time.monotonic_ns()
        self._reading(self._pid, src.snap(self._pid), wall)  # primes the main process's CPU
        main = self._procs[self._pid].cpu
        for agg in (self.cpu, self.saturated, self.iowait, self.steal, self.disk, main):
            agg.begin(now_ns)
        self._credit_t = self._mem_credit_t = time.monotonic_ns()
        self._mem_from = self._mem_credit_t + MEMORY_FIRST_NS
        self._maybe_look_up(force=True)
        for pid in list(self._kids):  # children there already are primed now, as the main is
            snap = self._snap(pid)
            if snap is None or self._reading(pid, snap, time.monotonic_ns()) is None:
                self._kids.remove(pid)
            else:
                self._begin_child(now_ns, pid)
        self.available = True
        return True

    def _begin_child(self, now_ns: int, pid: int) -> None:
        """A child's first reading: its aggregates (within MAX_PROCESSES) start at ``now_ns``."""
        if pid not in self._procs and len(self._procs) < MAX_PROCESSES:
            self._procs[pid] = _Proc(pid, "child")
        if pid in self._procs:
            self._procs[pid].cpu.begin(now_ns)

    def _maybe_look_up(self, force: bool = False) -> None:
        """Look up the children again if one may have started and the CPU budget allows."""
        assert self._src is not None
        marker = self._src.pid_marker()  # read first: a child started during the look-up counts
        if not force:
            if marker is not None and marker == self._marker:
                return  # no process started since the last look-up
            now = time.monotonic_ns()
            credit = self._credit_ns + (now - self._credit_t) * DISCOVERY_SHARE
            self._credit_ns, self._credit_t = min(float(DISCOVERY_BURST_NS), credit), now
            if self._credit_ns < 0:
                return
        cpu0 = time.thread_time_ns()
        try:
            kids = self._src.children(self._pid)
        except Exception:  # tried again when the budget allows
            kids = None
        if kids is not None:
            self._marker = marker
            self.lookups += 1
            found = set(kids)
            for pid in self._kids:
                if pid not in found:
                    self._src.forget(pid)
            self._kids = list(dict.fromkeys(kids))
        self._credit_ns -= time.thread_time_ns() - cpu0

    def _close(self) -> None:
        if self._src is not None:
            self._settle()  # the source makes the readings: before another sampler takes it
            src, self._src = self._src, None
            _give_back(src)

    def _snap(self, pid: int) -> Any:
        """A snapshot of a process's reading, or None if it is gone (what is kept for reading it
        let go: a child that exited)."""
        assert self._src is not None
        try:
            return self._src.snap(pid)
        except Exception:
            self._src.forget(pid)
            return None

    def _reading(self, pid: int, snap: Any, wall_ns: int) -> tuple[Value, float] | None:
        """(cpu %, rss MiB) of a process from its snapshot taken at ``wall_ns`` (monotonic): CPU
        is NA at its first (priming) reading, and where its pid now names another process (whose
        reading is the first of a new one). None if the snapshot cannot be read."""
        assert self._src is not None
        try:
            ident, cpu_s, rss = self._src.reading_of(snap)
        except Exception:
            self._last.pop(pid, None)
            return None
        last = self._last.get(pid)
        self._last[pid] = _Last(ident, cpu_s, wall_ns)
        cpu: Value = NA
        if last is not None and last.ident == ident and wall_ns > last.wall_ns:
            cpu = 100.0 * (cpu_s - last.cpu_s) * 1e9 / (wall_ns - last.wall_ns)
        return cpu, rss / MIB

    def _record_proc(self, now_ns: int, pid: int, cpu: Value, rss: Value) -> None:
        agg = self._procs.get(pid)
        if agg is None:
            return
        agg.cpu.add(now_ns, cpu)
        if not isinstance(rss, NaType):
            agg.rss_max_mb = rss if agg.rss_max_mb is None else max(agg.rss_max_mb, rss)

    def _sample(self, now_ns: int) -> None:
        # NOTE [ Host sampling cost ]: snapshots only, made into readings SETTLE_EVERY samples
        # at a time (and whenever the summary is read)
        src = self._src
        if not self.available or src is None:
            return
        cores = src.snap_cores()
        main = self._snap(self._pid)
        wall = time.monotonic_ns()
        self._maybe_look_up()
        kids = []
        for pid in self._kids:
            snap = self._snap(pid)
            if snap is not None:
                kids.append((pid, snap))
        if len(kids) != len(self._kids):
            self._kids = [pid for pid, _ in kids]
        self._pending.append((now_ns, wall, cores, main, kids, src.snap_disk()))
        if len(self._pending) >= SETTLE_EVERY:
            self._settle()
        self._maybe_read_memory(now_ns)

    def _maybe_read_memory(self, now_ns: int) -> None:
        """One process's memory, the next in turn that is due, while the budget lasts (NOTE
        [ Private memory ])."""
        assert self._src is not None
        now = time.monotonic_ns()
        if now < self._mem_from:  # the budget fills meanwhile, but no fuller than its burst
            return
        credit = self._mem_credit + (now - self._mem_credit_t) * MEMORY_SHARE
        self._mem_credit, self._mem_credit_t = min(float(MEMORY_BURST_NS), credit), now
        if self._mem_credit < 0:
            return
        pids = [*self._kids, self._pid]  # the workers first: a short run may read only them
        for k in range(len(pids)):
            pid = pids[(self._mem_next + k) % len(pids)]
            agg = self._procs.get(pid)
            if agg is None and len(self._procs) < MAX_PROCESSES:  # a child not settled yet
                agg = self._procs[pid] = _Proc(pid, "child")  # its CPU begins when it is
            if agg is None or now - agg.memory_at < MEMORY_EVERY_NS:
                continue
            self._mem_next = (self._mem_next + k + 1) % len(pids)
            cpu0 = time.thread_time_ns()
            try:
                rss, pss, uss = self._src.memory(pid)
            except Exception:  # gone, or not readable: n/a, never 0
                agg.memory_at = now
            else:
                agg.memory_at = now
                agg.add_memory(now_ns, rss / MIB, None if pss is None else pss / MIB,
                               None if uss is None else uss / MIB)  # fmt: skip
            try:
                free, total = self._src.available()
                self.mem_available_mb, self.mem_total_mb = free / MIB, total / MIB
            except Exception:
                pass
            self._mem_credit -= time.thread_time_ns() - cpu0
            return

    def _settle(self) -> None:
        """Make the pending snapshots into readings and aggregates, in the order taken."""
        pending, self._pending = self._pending, []
        for now_ns, wall, cores, main_snap, kids, disk_snap in pending:
            self._apply(now_ns, wall, cores, main_snap, kids, disk_snap)

    def _apply(
        self, now_ns: int, wall: int, cores: Any, main_snap: Any, kids: Any, disk_snap: Any
    ) -> None:
        assert self._src is not None
        cpu, iowait, saturated, steal = self._cpu(self._src.cores_of(cores))
        main = None if main_snap is None else self._reading(self._pid, main_snap, wall)
        main_cpu, main_rss = main if main is not None else (NA, NA)
        self._record_proc(now_ns, self._pid, main_cpu, main_rss)
        children_cpu, rss = 0.0, 0.0 if isinstance(main_rss, NaType) else main_rss
        alive = {self._pid}
        for pid, snap in kids:
            reading = self._reading(pid, snap, wall)
            if reading is None:
                continue
            alive.add(pid)
            c_cpu, c_rss = reading
            if isinstance(c_cpu, NaType):  # its first reading: its intervals start now
                self._begin_child(now_ns, pid)
            self._record_proc(now_ns, pid, c_cpu, c_rss)
            children_cpu += 0.0 if isinstance(c_cpu, NaType) else c_cpu
            rss += c_rss
        if len(self._last) > len(alive):  # a child no longer there: its next reading primes
            for pid in [p for p in self._last if p not in alive]:
                del self._last[pid]
        disk_bytes, dt_s = self._src.disk_of(disk_snap), (now_ns - self._last_t) / 1e9
        disk: Value = NA
        if not isinstance(disk_bytes, NaType) and not isinstance(self._last_disk, NaType):
            delta = disk_bytes - self._last_disk
            disk = delta / MIB / dt_s if delta >= 0 and dt_s > 0 else NA
        self._last_disk, self._last_t = disk_bytes, now_ns
        for agg, value in (
            (self.cpu, cpu),
            (self.iowait, iowait),
            (self.steal, steal),
            (self.disk, disk),
            (self.saturated, saturated),
        ):
            agg.add(now_ns, value)
        self.rss_max_mb = rss if self.rss_max_mb is None else max(self.rss_max_mb, rss)
        self._ring.append((now_ns, cpu, main_cpu, children_cpu, iowait, disk, saturated, rss))

    def _cpu(self, times: CoreTimes) -> tuple[Value, Value, Value, Value]:
        """System busy %, iowait %, saturated-core count and steal % since the previous sample.
        Stolen time counts as busy (a core the hypervisor gave away is a core this run lost)."""
        busy = total = iowait = steal = 0.0
        saturated = 0
        for new, old in zip(times, self._last_times, strict=False):
            b, t = new[0] - old[0], new[1] - old[1]
            busy += b
            total += t
            iowait += new[2] - old[2]
            steal += new[3] - old[3]
            if t > 0 and 100.0 * b / t >= SATURATED_PCT:
                saturated += 1
        self._last_times = times
        if total <= 0:  # no clock tick since the previous sample
            return NA, NA, NA, NA
        io: Value = 100.0 * iowait / total if self._has_iowait else NA
        return 100.0 * busy / total, io, float(saturated), 100.0 * steal / total

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: system CPU, saturated cores, iowait, disk, RSS, ``per_process``
        (main first, then children by pid) and a ``timeline`` (n/a: None). MB are MiB.
        """
        with self._lock:
            if self._src is not None:
                self._settle()
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
            "steal_mean": self.steal.mean,
            "disk_read_mb_s_mean": self.disk.mean,
            "rss_max_mb": self.rss_max_mb,
            "mem_available_mb": self.mem_available_mb,
            "mem_total_mb": self.mem_total_mb,
            "per_process": procs,
            "timeline": timeline,
        }
