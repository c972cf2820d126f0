"""How this machine's cores scale: the work ``P`` busy processes do together, against one alone.

NOTE [ Cores are not all equal ]
A logical CPU is not always a core. Cloud vCPUs may be the two hardware threads of one physical
core, which then each do about 0.6-0.7 of a lone thread's work when both are busy, where the
worker-pool model (analyze/whatif.py) counts whole cores.

The probe runs a loop of Python bytecode in one process, then in one process per usable core at
once, and compares the work each did per second of its own CPU time. Per CPU second, not per
wall second, so that other programs taking cores away are not read as slow cores (they are
measured apart: ``bench.scaling.cpu_share``, the host sampler). ``per_process`` is that ratio
(1.0: whole cores), ``effective_cores`` is ``cores × per_process``: the cores the model counts
when every one is busy. Each probe is run five times, interleaved, the median kept, and the
better of two such sets taken; at or above ``WHOLE`` is whole cores. The result is cached per
machine (host name, CPU model, usable cores) in ``$PIPEPROF_CACHE_DIR`` (default
``~/.cache/pipeprof``), so that only the first profile on a machine pays for it (about 2.4 s).

What it does not see: work that waits on memory. On the 2-vCPU VM this project is built on, the
probe reads whole cores (medians 0.97-1.0), two workers making Python samples ran 1.85× one, and
two making numpy FFTs of 256×256 only 1.5× (benchmarks/core_scaling.py). That shortfall is the
pipeline's own; ``pipeprof.bench`` anchors its worker predictions on the runs it measured
(NOTE [ Anchored predictions ] in bench/bench.py), which carry it.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROBE_S = 0.1  # each probe's length, per process
ROUNDS = 5  # probes of each kind, interleaved; the median is kept
# A median at or above this is whole cores: on a shared 2-vCPU VM whose cores each do a lone
# one's work, single readings spread 0.62-1.0 and medians of 5 0.97-1.0, while two threads of
# one physical core read about 0.6-0.7
WHOLE = 0.9
VERSION = 1  # of the cached record: a new probe makes old records stale


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def python_unit(_: int = 0) -> None:
    """One unit of the probe's work: Python bytecode, dict and integer operations."""
    acc: dict[int, int] = {}
    for i in range(200):
        acc[i & 15] = acc.get(i & 15, 0) + i * 3


def _work(fn: Callable[[int], Any], seconds: float, conn: Any) -> None:
    """``fn(0)``, ``fn(1)``... for ``seconds``: (calls made, CPU seconds, wall seconds)."""
    t0 = time.perf_counter()
    c0, units = time.process_time(), 0
    try:
        while time.perf_counter() - t0 < seconds or units == 0:
            fn(units)
            units += 1
        conn.send((units, time.process_time() - c0, time.perf_counter() - t0))
    except BaseException:  # a failing step: the probe has no figure, the parent goes on
        conn.send((0, 0.0, 0.0))
    conn.close()


def at_once(
    fn: Callable[[int], Any], count: int, seconds: float
) -> list[tuple[int, float, float]] | None:
    """``count`` processes calling ``fn`` at once for ``seconds`` each: per process (calls, CPU
    seconds, wall seconds); None where they could not run. Forked where the platform can (``fn``
    need not pickle), else spawned (``fn`` must be a module-level function)."""
    try:
        ctx: Any = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        pipes = [ctx.Pipe(duplex=False) for _ in range(count)]
        procs = [ctx.Process(target=_work, args=(fn, seconds, w), daemon=True) for _, w in pipes]
        for p in procs:
            p.start()
        got = [r.recv() for r, _ in pipes]
        for p in procs:
            p.join()
    except Exception:  # a probe must never break a profile
        return None
    return got if all(units > 0 for units, _, _ in got) else None


def _speed(fn: Callable[[int], Any], count: int, seconds: float) -> float:
    """Calls of ``fn`` per CPU second of one process, the mean over ``count`` run at once."""
    got = at_once(fn, count, seconds)
    if not got or any(cpu <= 0 for _, cpu, _ in got):
        return math.nan
    return sum(units / cpu for units, cpu, _ in got) / count


def work_scaling(
    fn: Callable[[int], Any], cores: int, seconds: float = PROBE_S, rounds: int = ROUNDS
) -> float | None:
    """``per_process``: the work per CPU second each of ``cores`` processes running ``fn`` at
    once does, over one alone's (the median of ``rounds`` interleaved pairs, at most 1); None
    where it could not be measured."""
    if cores < 2:
        return 1.0
    ratios = []
    for _ in range(rounds):
        one, every = _speed(fn, 1, seconds), _speed(fn, cores, seconds)
        if not (one > 0 and every > 0):
            return None
        ratios.append(every / one)
    return min(1.0, statistics.median(ratios))


def probe(cores: int, seconds: float = PROBE_S, rounds: int = ROUNDS) -> dict[str, Any] | None:
    """Measure the scaling now (NOTE [ Cores are not all equal ]); None if it could not run."""
    # the better of two sets: a neighbour's burst can pull one set's median down (0.84 seen on
    # this VM under load), while cores that share a core read low in both
    sets = [work_scaling(python_unit, cores, seconds, rounds) for _ in range(2)]
    if None in sets:
        return None
    per = max(x for x in sets if x is not None)
    per = 1.0 if per >= WHOLE else per
    return {"cores": cores, "per_process": round(per, 3),
            "effective_cores": round(max(1.0, cores * per), 3), "probe": "python",
            "cached": False}  # fmt: skip


def _key(cores: int) -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    return f"v{VERSION}|{platform.node()}|{model}|{cores}"


def _cache_file() -> Path:
    root = os.environ.get("PIPEPROF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pipeprof"
    )
    return Path(root) / "machine.json"


def core_scaling(cores: int | None = None) -> dict[str, Any] | None:
    """This machine's scaling, from the cache or measured once and cached (None: no probe)."""
    cores = usable_cores() if cores is None else cores
    key, path = _key(cores), _cache_file()
    try:
        known = json.loads(path.read_text())
        if isinstance(known, dict) and isinstance(known.get(key), dict):
            return {**known[key], "cached": True}
    except (OSError, ValueError):
        known = {}
    found = probe(cores)
    if found is None:
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        known = known if isinstance(known, dict) else {}
        known[key] = {k: v for k, v in found.items() if k != "cached"}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    except OSError:  # a read-only home: measured again next time
        pass
    return found
