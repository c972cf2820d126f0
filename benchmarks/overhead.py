"""pipeprof's total CPU overhead on a JPEG pipeline, per process and per thread, vs torch.profiler.

The pipeline: ``--images`` JPEGs of 160x160 px (``pipeprof.demo.make_images``) in ImageFolder
layout, ``RandomResizedCrop(128)`` / ``RandomHorizontalFlip`` / ``ToTensor`` / ``Normalize``,
``DataLoader(batch_size=32, shuffle=True, num_workers=2)`` (not persistent: every epoch starts its
workers afresh and joins them at its end). ``--step-ms`` sleeps that long per batch in the loop, a
stand-in for a training step (default 0: none).

Each round runs one epoch of every variant (``--epochs N``: N epochs in one window, one Profiler
across them), in an order rotated from round to round, after one warm-up epoch of each (not
reported; it also loads Kineto for torch.profiler):

  plain           ``for batch in loader``
  pipeprof        ``prof = pipeprof.Profiler(); with prof: for batch in prof.wrap(loader)``, a
                  fresh Profiler every epoch; ``prof.report()`` is built after the measured
                  window and its wall and CPU time are recorded apart
  torch.profiler  ``with torch.profiler.profile(activities=[CPU]): for batch in loader``
  every batch     (``--every-batch``) as ``pipeprof`` with ``Profiler(stage_every=1)``: the
                  stages timed in every batch, not in one in 8 (docs/validation/overhead.md)
  unwrapped       (``--unwrapped``) ``with pipeprof.Profiler(): for batch in loader``: the
                  samplers and the profile's start and stop around the plain loader, nothing
                  of pipeprof's in the workers: the part of pipeprof's cost, and of what it does
                  to the workers' CPU (sharing the cores), that is not the loader's wrapping

Every variant of a round draws the same shuffle and the same random crops
(``torch.manual_seed`` before each; ``--fresh-draws``: each its own), so a round compares the
same work.

What is measured, per variant and round (the window runs from just before the Profiler or
torch.profiler is made to just after its ``with`` block ends, workers joined):

  all processes   CPU (user + system) of this process, ``getrusage(RUSAGE_SELF)`` delta, plus the
                  workers', ``getrusage(RUSAGE_CHILDREN)`` delta: exact, because torch's iterator
                  joins (reaps) non-persistent workers when it is exhausted (checked: a worker
                  still alive after the loop is counted in ``workers_alive_after``).
  threads         this process's CPU by thread, from ``/proc/self/task/<tid>/schedstat`` (time on
                  CPU, ns; where the kernel has no schedstat, ``.../stat`` utime + stime in clock
                  ticks) read by a monitor thread ``bench-monitor`` every ``--monitor-ms`` (last
                  reading per tid kept) and at the window's start and end.
                  Python 3.11 does not pass thread names to the OS, so a tid is named after its
                  ``threading`` thread (``native_id``), else its ``comm``. Groups: main thread,
                  pipeprof threads (``pipeprof*``: its host sampler), other threads (queue feeder
                  threads, pin memory, torch's own), the monitor (the same in every variant:
                  subtract it), and "unattributed" = RUSAGE_SELF minus the threads: CPU of a
                  thread that ended since its last reading (at most one period of it), of a
                  thread that lived less than a period (and, with clock ticks, their rounding).
  workers         per worker process from ``/proc/<pid>/stat`` (utime + stime, clock ticks),
                  read by the same monitor; pids from ``psutil.Process().children()``, looked
                  up every ``--discover-ms`` only (a scan of /proc costs ~1 ms). A worker exits at
                  the end of the epoch, so its last reading undercounts it by at most one
                  ``--monitor-ms`` period (and a tick). The RUSAGE_CHILDREN total above is exact.
  throughput      wall time of the window; steady samples/s = samples after the first batch /
                  time from the first batch's arrival to the last's.
  self-reported   for pipeprof, ``report["overhead"]`` (all its keys), and its ``estimated_s``
                  against the measured extra CPU, pipeprof's all-process CPU minus plain's in the
                  same round.
  added CPU       the mean over rounds of each variant's CPU minus plain's, µs per sample, with
                  its standard error and the median (a round the VM stalled moves the mean):
                  all processes, the main process, the workers' user time and their system time
                  apart; and each other variant against pipeprof round by round (the median
                  difference, and in how many rounds it was higher).
  overhead        the median over rounds of each variant's all-process CPU over plain's, with
                  a 95 % confidence interval for that median (order statistics, no assumption on
                  the spread's shape): the per-round ratio has a standard deviation of about
                  4 % on this machine, so the median of 12 rounds has a standard error of about
                  1.4 %, that of 150 rounds about 0.4 %.

The workers' system time is mostly minor page faults, and with glibc's default malloc their count
swings from run to run with the heap's layout (the dynamic mmap and trim thresholds: a freed
block at the top of the heap goes back to the kernel, the next sample faults it in again), by
more than pipeprof's own cost. Fixed thresholds take that out (docs/validation/overhead.md, "Page
faults"):

    MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_MMAP_THRESHOLD_=268435456 \
        python benchmarks/overhead.py --root /tmp/jpeg160 --rounds 12

    python benchmarks/overhead.py                          # 1024 images, 2 workers, 9 rounds
    python benchmarks/overhead.py --rounds 2 --images 256  # a quick check
    python benchmarks/overhead.py --root /tmp/jpegs160 --step-ms 20 --json overhead.json
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any

from _common import jpeg160_dataset, machine

clock = time.perf_counter_ns
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
SCHEDSTAT = os.path.exists("/proc/self/schedstat")  # per-thread time on CPU in ns
VARIANTS = ("plain", "pipeprof", "torch.profiler")
EVERY_BATCH = "every batch"  # pipeprof timing every batch's stages (--every-batch)
UNWRAPPED = "unwrapped"  # a pipeprof profile around the plain loader (--unwrapped)
GROUPS = ("main", "pipeprof", "other", "monitor", "unattributed")
MONITOR = "bench-monitor"


def _stat_ticks(path: str) -> int | None:
    """utime + stime (clock ticks) of a /proc stat file; None when the task is gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 is index 0
    return int(fields[11]) + int(fields[12])  # fields 14 and 15


def _thread_s(tid: str) -> float | None:
    """CPU seconds of thread ``tid`` of this process; None when it is gone."""
    if SCHEDSTAT:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                return int(f.read().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            return None
    ticks = _stat_ticks(f"/proc/self/task/{tid}/stat")
    return None if ticks is None else ticks * TICK_S


def _comm(tid: str) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


class Monitor(threading.Thread):
    """Reads every thread of this process and every child process each ``period_s``; keeps the
    last reading per tid and pid since ``begin()``; looks for new children every ``discover_s``."""

    def __init__(self, period_s: float, discover_s: float) -> None:
        super().__init__(name=MONITOR, daemon=True)
        import psutil

        self.period_s = period_s
        self.discover_s = discover_s
        self._discovered = 0.0
        self._pids: set[int] = set()
        self._me = psutil.Process()
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._names: dict[int, str] = {}
        self.threads: dict[int, float] = {}  # tid -> last CPU seconds
        self.workers: dict[int, int] = {}  # pid -> last ticks
        self._base_threads: dict[int, float] = {}
        self._base_workers: dict[int, int] = {}

    def _poll(self, discover: bool = False) -> None:
        """Children first, this process's threads last (see ``begin`` and ``end``)."""
        now = time.monotonic()
        if discover or now - self._discovered >= self.discover_s:
            self._discovered = now
            try:
                self._pids = {c.pid for c in self._me.children()}
            except Exception:  # a child vanishing mid-scan: the next look finds the rest
                pass
        for pid in list(self._pids):
            ticks = _stat_ticks(f"/proc/{pid}/stat")
            if ticks is None:
                self._pids.discard(pid)
            else:
                self.workers[pid] = ticks
        py = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        for entry in os.listdir("/proc/self/task"):
            tid = int(entry)
            cpu = _thread_s(entry)
            if cpu is None:
                continue
            self.threads[tid] = cpu
            if tid in py:
                self._names[tid] = py[tid]
            elif tid not in self._names:
                self._names[tid] = _comm(entry)

    def run(self) -> None:
        while not self._stop_event.wait(self.period_s):
            with self._lock:
                self._poll()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def begin(self) -> tuple[float, float]:
        """Start a window; RUSAGE_SELF and RUSAGE_CHILDREN CPU seconds, read right after the
        threads so that the two agree."""
        with self._lock:
            self.threads, self.workers = {}, {}
            self._poll(discover=True)
            usage = _rusage_s(resource.RUSAGE_SELF), _rusage_s(resource.RUSAGE_CHILDREN)
            self._base_threads, self._base_workers = dict(self.threads), dict(self.workers)
        return usage

    def end(self) -> tuple[list[dict[str, Any]], dict[int, float], tuple[float, float]]:
        """CPU seconds per thread and per worker since ``begin()``, and the rusage as there."""
        with self._lock:
            self._poll(discover=True)
            usage = _rusage_s(resource.RUSAGE_SELF), _rusage_s(resource.RUSAGE_CHILDREN)
            main = threading.main_thread().native_id
            threads = []
            for tid, cpu_s in sorted(self.threads.items()):
                name = self._names.get(tid, "?")
                if tid == main:
                    group = "main"
                elif name == MONITOR:
                    group = "monitor"
                elif name.startswith("pipeprof"):
                    group = "pipeprof"
                else:
                    group = "other"
                cpu = cpu_s - self._base_threads.get(tid, 0.0)
                threads.append({"tid": tid, "name": name, "group": group, "cpu_s": round(cpu, 6)})
            workers = {
                pid: round((t - self._base_workers.get(pid, 0)) * TICK_S, 3)
                for pid, t in self.workers.items()
            }
        return threads, workers, usage


def _samples(batch: Any) -> int:
    return len(batch[1]) if isinstance(batch, (list, tuple)) else len(batch)


def consume(batches: Iterable[Any], step_s: float) -> dict[str, Any]:
    """Iterate to the end, sleeping ``step_s`` per batch; sample count and arrival times."""
    arrivals = []
    first = total = 0
    for batch in batches:
        arrivals.append(clock())
        n = _samples(batch)
        if not first:
            first = n
        total += n
        if step_s:
            time.sleep(step_s)
    if not arrivals:
        raise RuntimeError("the loader yielded no batches")
    steady_s = (arrivals[-1] - arrivals[0]) / 1e9
    return {
        "samples": total,
        "batches": len(arrivals),
        "steady_s": steady_s,
        "samples_per_s": (total - first) / steady_s if steady_s > 0 else float("nan"),
        "t_first": arrivals[0],
        "t_last": arrivals[-1],
    }


def _rusage_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _rusage_parts(who: int) -> tuple[float, float, int]:
    """User seconds, system seconds and minor page faults."""
    r = resource.getrusage(who)
    return r.ru_utime, r.ru_stime, r.ru_minflt


def _alive_children() -> int:
    import psutil

    return sum(1 for c in psutil.Process().children() if c.status() != psutil.STATUS_ZOMBIE)


def passes(loader: Any, n: int) -> Iterable[Any]:
    """``n`` epochs of ``loader`` back to back (each ``iter()`` is a new pass)."""
    return itertools.chain.from_iterable(loader for _ in range(n))


def epoch(
    variant: str,
    loader: Any,
    step_s: float,
    monitor: Monitor,
    epochs: int = 1,
    seed: int | None = None,
) -> dict[str, Any]:
    """One epoch of ``variant`` with its CPU per process and thread (see the module docstring)."""
    gc.collect()  # outside the window, the same for every variant
    if seed is not None:  # the same shuffle and the same random crops in every variant of a round
        import torch

        torch.manual_seed(seed)
    extra: dict[str, Any] = {}
    self0, kids0 = monitor.begin()
    parts0 = _rusage_parts(resource.RUSAGE_CHILDREN)
    t0 = clock()
    prof: Any = None
    if variant == "plain":
        out = consume(passes(loader, epochs), step_s)
        t_loop = clock()
    elif variant in ("pipeprof", EVERY_BATCH):
        import pipeprof

        prof = pipeprof.Profiler(stage_every=1) if variant == EVERY_BATCH else pipeprof.Profiler()
        with prof:
            out = consume(passes(prof.wrap(loader), epochs), step_s)
            t_loop = clock()
    elif variant == UNWRAPPED:
        import pipeprof

        with pipeprof.Profiler():
            out = consume(passes(loader, epochs), step_s)
            t_loop = clock()
    elif variant == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            out = consume(passes(loader, epochs), step_s)
            t_loop = clock()
    else:
        raise ValueError(variant)
    t_end = clock()
    alive = _alive_children()
    if alive:  # not joined yet: give torch's iterator finaliser a chance, then look again
        gc.collect()
        alive = _alive_children()
    threads, workers, (self1, kids1) = monitor.end()
    parts1 = _rusage_parts(resource.RUSAGE_CHILDREN)
    self_s, kids_s = self1 - self0, kids1 - kids0
    groups = {g: 0.0 for g in GROUPS}
    for t in threads:
        groups[t["group"]] += t["cpu_s"]
    groups["unattributed"] = self_s - sum(groups.values())
    n = out["samples"]
    res: dict[str, Any] = {
        "samples": n,
        "batches": out["batches"],
        "wall_s": (t_end - t0) / 1e9,
        "startup_s": (out["t_first"] - t0) / 1e9,
        "stop_s": (t_end - t_loop) / 1e9,  # leaving the profiler's `with` (0 for plain)
        "steady_s": out["steady_s"],
        "samples_per_s": out["samples_per_s"],
        "cpu_s": self_s + kids_s,
        "main_process_s": self_s,
        "workers_s": kids_s,
        "workers_user_s": parts1[0] - parts0[0],
        "workers_sys_s": parts1[1] - parts0[1],
        "workers_minflt": parts1[2] - parts0[2],
        "workers_proc_s": sum(workers.values()),
        "workers_proc": {str(k): v for k, v in workers.items()},
        "workers_alive_after": alive,
        "groups_s": {k: round(v, 4) for k, v in groups.items()},
        "threads": threads,
    }
    res["cpu_ms_per_sample"] = res["cpu_s"] * 1e3 / n
    if prof is not None:
        c0, w0 = time.process_time(), clock()
        rep = prof.report()
        extra["report_wall_s"] = (clock() - w0) / 1e9
        extra["report_cpu_s"] = time.process_time() - c0
        extra["overhead"] = dict(rep["overhead"] or {})
        del rep
    res.update(extra)
    return res


def make_loader(root: str, workers: int, batch_size: int) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(
        jpeg160_dataset(root), batch_size=batch_size, shuffle=True, num_workers=workers
    )


# ---- summary ---------------------------------------------------------------------------------


def _stats(vals: list[float]) -> dict[str, float]:
    vals = [v for v in vals if v == v]
    if not vals:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


ROWS: list[tuple[str, str, Any]] = [  # (JSON key, table label, figure of a round's variant)
    ("cpu_ms_per_sample", "CPU ms/sample, all processes", lambda r, p: r["cpu_ms_per_sample"]),
    ("cpu_ratio_to_plain", "  ratio to plain (per round)", lambda r, p: r["cpu_s"] / p["cpu_s"]),
    ("main_process_ms", "  main process", lambda r, p: r["main_process_s"] * 1e3 / r["samples"]),
    ("main_thread_ms", "    main thread", lambda r, p: _group(r, "main")),
    ("pipeprof_threads_ms", "    pipeprof threads", lambda r, p: _group(r, "pipeprof")),
    ("other_threads_ms", "    other threads", lambda r, p: _group(r, "other")),
    ("monitor_ms", "    bench-monitor", lambda r, p: _group(r, "monitor")),
    ("unattributed_ms", "    unattributed", lambda r, p: _group(r, "unattributed")),
    ("workers_ms", "  workers (RUSAGE_CHILDREN)", lambda r, p: r["workers_s"] * 1e3 / r["samples"]),
    ("workers_user_ms", "    user", lambda r, p: r["workers_user_s"] * 1e3 / r["samples"]),
    ("workers_sys_ms", "    system", lambda r, p: r["workers_sys_s"] * 1e3 / r["samples"]),
    ("workers_minflt", "    minor page faults", lambda r, p: r["workers_minflt"]),
    (
        "workers_proc_ms",
        "    workers (/proc, last reading)",
        lambda r, p: r["workers_proc_s"] * 1e3 / r["samples"],
    ),
    ("samples_per_s", "steady samples/s", lambda r, p: r["samples_per_s"]),
    (
        "samples_per_s_ratio_to_plain",
        "  ratio to plain (per round)",
        lambda r, p: r["samples_per_s"] / p["samples_per_s"],
    ),
    ("wall_s", "wall s (window)", lambda r, p: r["wall_s"]),
    ("stop_s", "  of which leaving `with`", lambda r, p: r["stop_s"]),
]


def _group(r: dict[str, Any], group: str) -> float:
    """CPU ms per sample of a thread group."""
    return float(r["groups_s"][group]) * 1e3 / int(r["samples"])


def summarise(rounds: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        out[v] = {
            key: _stats([fn(r[v], r["plain"]) for r in rounds])
            for key, _, fn in ROWS
            if v != "plain" or "ratio" not in key
        }
        if v != "plain":
            ratios = [r[v]["cpu_s"] / r["plain"]["cpu_s"] for r in rounds]
            out[v]["cpu_overhead_pct"] = (statistics.median(ratios) - 1) * 100
            ci = _median_ci(ratios)
            if ci is not None:
                out[v]["cpu_overhead_pct_ci95"] = [(x - 1) * 100 for x in ci]
            out[v]["added_us_per_sample"] = {
                label: _mean_se(
                    [(r[v][key] - r["plain"][key]) * 1e6 / r[v]["samples"] for r in rounds]
                )
                for key, label in DIFFS
            }
    if "pipeprof" in variants:
        pp = [r["pipeprof"] for r in rounds]
        measured = [r["pipeprof"]["cpu_s"] - r["plain"]["cpu_s"] for r in rounds]
        est = [p["overhead"].get("estimated_s") for p in pp]
        ratio = [e / m if e is not None and m > 0 else float("nan") for e, m in zip(est, measured)]
        keys = sorted({k for p in pp for k in p["overhead"]})
        out["self_reported"] = {
            "overhead": {k: [p["overhead"].get(k) for p in pp] for k in keys},
            "estimated_s": _stats([e for e in est if e is not None]),
            "measured_extra_cpu_s": _stats(measured),
            "estimated_over_measured": _stats(ratio),
            "report_wall_s": _stats([p["report_wall_s"] for p in pp]),
            "report_cpu_s": _stats([p["report_cpu_s"] for p in pp]),
        }
    return out


# Per-round differences from plain, averaged: the mean and its standard error say how well the
# rounds pin the added CPU down (a median of ratios hides that). The workers' user and system
# time apart: what pipeprof runs in a worker is user time; their system time is mostly page
# faults, and a fresh worker's count of those moves with what it touches of its parent's heap
# (a full garbage collection after fork touches all of it, docs/validation/overhead.md).
DIFFS = (
    ("cpu_s", "all processes"),
    ("main_process_s", "main process"),
    ("workers_user_s", "workers, user"),
    ("workers_sys_s", "workers, system"),
)


def _median_ci(vals: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of ``vals``: the order statistics
    x_(k) and x_(n-k+1), k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2. None
    with too few values (fewer than 6 for 95 %). The per-round ratios spread by several per cent
    on this machine, so a run's median moves by about 1.25 sd / sqrt(n): this says how far."""
    n = len(vals)
    tail, k = 0.0, 0
    while k < n:
        p_k = math.comb(n, k) / 2**n  # P(Binomial(n, 1/2) == k)
        if tail + p_k > (1 - level) / 2:
            break
        tail += p_k
        k += 1
    if k == 0:
        return None
    xs = sorted(vals)
    return xs[k - 1], xs[n - k]


def _mean_se(vals: list[float]) -> dict[str, float]:
    """Mean and its standard error, and the median (a round the VM stalled moves the mean)."""
    n = len(vals)
    mean = statistics.fmean(vals)
    se = statistics.stdev(vals) / n**0.5 if n > 1 else float("nan")
    return {"mean": mean, "se": se, "median": statistics.median(vals)}


def _cell(s: dict[str, float], fmt: str) -> str:
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def table(result: dict[str, Any]) -> str:
    st = result["settings"]
    rounds = result["rounds"]
    variants = st["variants"]
    lines = [
        f"CPU overhead: {st['images']} JPEGs 160x160, batch {st['batch_size']}, {st['workers']} "
        f"workers (not persistent), step {st['step_ms']} ms, {st['rounds']} interleaved rounds of "
        f"{st['epochs']} epoch{'s' * (st['epochs'] != 1)}"
        + "".join(f", {k}={v}" for k, v in st["malloc_env"].items()),
        "cells: median [min-max] over rounds; ms/sample are CPU ms per sample of the epoch",
        "",
        f"{'':34s}" + "".join(f"{v:>26s}" for v in variants),
    ]
    for key, label, _ in ROWS:
        fmt = ".1f" if "samples/s" in label else ".0f" if "faults" in label else ".3f"
        cells = []
        for v in variants:
            if "ratio" in key and v == "plain":
                cells.append(f"{'-':>26s}")
                continue
            cells.append(f"{_cell(result['summary'][v][key], fmt):>26s}")
        lines.append(f"{label:34s}" + "".join(cells))
    alive = sum(r[v]["workers_alive_after"] for r in rounds for v in variants)
    lines.append(
        f"workers still alive after an epoch's loop (RUSAGE_CHILDREN would miss them): {alive}"
    )
    summ = result["summary"]
    lines.append("")
    lines.append(
        "added CPU, µs per sample: mean of the per-round differences from plain ± its SE "
        "(their median)"
    )
    for v in variants:
        if v != "plain":
            cells = [
                f"{label} {d['mean']:+.1f} ± {d['se']:.1f} ({d['median']:+.1f})"
                for label, d in summ[v]["added_us_per_sample"].items()
            ]
            lines.append(f"  {v:15s} " + "; ".join(cells))
    others = [v for v in variants if v not in ("plain", "pipeprof")]
    if "pipeprof" in variants and others:  # variants against pipeprof itself, round by round
        lines.append("  against pipeprof, round by round (µs a sample): median, rounds above")
        for v in others:
            d = [
                (r[v]["cpu_s"] - r["pipeprof"]["cpu_s"]) * 1e6 / r[v]["samples"]
                for r in rounds
            ]
            above = sum(x > 0 for x in d)
            lines.append(
                f"    {v:13s} {statistics.median(d):+.1f}, higher in {above} of {len(d)} rounds"
            )
    if "self_reported" in summ:
        sr = summ["self_reported"]
        lines.append("")
        lines.append("pipeprof's self-reported overhead (report['overhead']), per round:")
        for k, vals in sr["overhead"].items():
            lines.append(f"  {k:22s} {vals}")
        lines.append(
            f"  estimated_s {_cell(sr['estimated_s'], '.4f')} s vs measured extra CPU "
            f"(pipeprof - plain, all processes) {_cell(sr['measured_extra_cpu_s'], '.4f')} s"
        )
        lines.append(
            f"  self-reported / measured overhead: {_cell(sr['estimated_over_measured'], '.3f')}"
        )
        pp = summ["pipeprof"]["added_us_per_sample"]["all processes"]
        n = rounds[0]["pipeprof"]["samples"]
        est_us = sr["estimated_s"]["median"] * 1e6 / n
        lines.append(
            f"  self-reported {est_us:.1f} µs a sample vs measured {pp['mean']:+.1f} ± "
            f"{pp['se']:.1f} (mean of the rounds)"
        )
        lines.append(
            f"  prof.report() (outside the window): wall {_cell(sr['report_wall_s'], '.3f')} s, "
            f"CPU {_cell(sr['report_cpu_s'], '.3f')} s"
        )
    lines.append("")
    for v in variants:
        if v != "plain":
            ci = summ[v].get("cpu_overhead_pct_ci95")
            within = f", 95 % CI of the median [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else ""
            lines.append(
                f"{v} CPU overhead, all processes: {summ[v]['cpu_overhead_pct']:+.1f} % "
                f"(median of {st['rounds']} round{'s' * (st['rounds'] != 1)}{within}; "
                f"plain vs {v} interleaved)"
            )
    m = result["machine"]
    lines.append(
        f"machine: {m['cpu_model']}, {m['cpu_count']} CPUs, Python {m['python']}, torch "
        f"{m['torch']}, load average {m['loadavg_at_start'][0]:.2f} at start, "
        f"{st['loadavg_at_end'][0]:.2f} at end"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (medians reported)")
    ap.add_argument(
        "--epochs", type=int, default=1, help="epochs per window (one Profiler across them)"
    )
    ap.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch")
    ap.add_argument("--monitor-ms", type=float, default=50.0, help="thread/worker polling period")
    ap.add_argument("--discover-ms", type=float, default=200.0, help="new-worker lookup period")
    ap.add_argument("--root", help="use (and keep) this image folder instead of a temp dir")
    ap.add_argument(
        "--every-batch",
        action="store_true",
        help=f"also run pipeprof timing every batch's stages (stage_every=1) as {EVERY_BATCH!r}",
    )
    ap.add_argument(
        "--unwrapped",
        action="store_true",
        help=f"also run a profile around the plain loader, nothing wrapped, as {UNWRAPPED!r}: "
        "the samplers and the profile's start and stop alone, and what they do to the workers",
    )
    ap.add_argument(
        "--fresh-draws",
        action="store_true",
        help="let each variant draw its own shuffle and crops (default: the same in a round)",
    )
    ap.add_argument("--json", metavar="OUT", help="also write every round's raw figures as JSON")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.images < 1 or args.workers < 1 or args.epochs < 1:
        ap.error("--rounds, --images and --workers must be >= 1 (workers: their CPU is measured)")
    variants = list(VARIANTS) + [
        v for v, on in ((EVERY_BATCH, args.every_batch), (UNWRAPPED, args.unwrapped)) if on
    ]
    load_start = os.getloadavg()

    from pipeprof.demo import make_images

    tmp = None
    root = args.root
    if root is None:
        tmp = root = tempfile.mkdtemp(prefix="pipeprof-bench-")
    monitor = Monitor(args.monitor_ms / 1e3, args.discover_ms / 1e3)
    try:
        os.makedirs(root, exist_ok=True)
        if not any(os.scandir(root)):
            t0 = clock()
            make_images(root, count=args.images, size=(160, 160))
            print(
                f"made {args.images} JPEGs (160x160) in {root} in {(clock() - t0) / 1e9:.1f} s",
                file=sys.stderr,
            )
        loader = make_loader(root, args.workers, args.batch_size)
        if len(loader.dataset) != args.images:
            print(
                f"note: {root} holds {len(loader.dataset)} images, not --images {args.images}",
                file=sys.stderr,
            )
        step_s = args.step_ms / 1e3
        monitor.start()
        for v in variants:  # warm-up: page cache, imports, Kineto; not reported
            epoch(v, loader, step_s, monitor, args.epochs)
        print("warm-up done", file=sys.stderr, flush=True)
        rounds: list[dict[str, Any]] = []
        for r in range(args.rounds):
            k = r % len(variants)
            order = variants[k:] + variants[:k]
            seed = None if args.fresh_draws else 1000 + r
            res: dict[str, Any] = {
                v: epoch(v, loader, step_s, monitor, args.epochs, seed) for v in order
            }
            res["order"] = order
            rounds.append(res)
            line = "  ".join(
                f"{v} {res[v]['cpu_ms_per_sample']:.3f} cpu-ms {res[v]['samples_per_s']:.0f}/s"
                for v in variants
            )
            print(f"round {r + 1}/{args.rounds}: {line}", file=sys.stderr, flush=True)
        result = {
            "benchmark": "overhead",
            "machine": {
                **machine(),
                "clock_ticks_per_s": round(1 / TICK_S),
                "loadavg_at_start": load_start,
            },
            "settings": {
                "workers": args.workers,
                "images": len(loader.dataset),
                "image_size": [160, 160],
                "batch_size": args.batch_size,
                "rounds": args.rounds,
                "epochs": args.epochs,
                "step_ms": args.step_ms,
                "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
                "monitor_ms": args.monitor_ms,
                "discover_ms": args.discover_ms,
                "thread_clock": "schedstat ns" if SCHEDSTAT else "stat clock ticks",
                "persistent_workers": False,
                "variants": variants,
                "loadavg_at_end": os.getloadavg(),
            },
            "rounds": rounds,
            "summary": summarise(rounds, variants),
        }
        print(table(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
            print(f"wrote {args.json}")
    finally:
        if monitor.is_alive():
            monitor.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
