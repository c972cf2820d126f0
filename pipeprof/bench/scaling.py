"""Real DataLoader runs with k workers, the batch hand-over's cost, and the machine's free cores.

NOTE [ Measuring throughput at k workers ]
Each run builds a ``DataLoader`` with ``k`` workers over the fixed sample set, cycled so that
every worker makes ``rounds + 1`` batches (the sampler hands batches out round-robin). The clock
starts when the k-th batch arrives, that is after every worker's first batch, which carries the
start-up (fork, imports, first-touch), and stops at the last: worker k-1 made exactly ``rounds``
batches in between, and so, in steady state, did every other worker.
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from pipeprof.bench.isolation import seed_all
from pipeprof.collect.machine import at_once


def _busy(_: int) -> None:
    """A call that only keeps its process busy."""


def _spinners(count: int, seconds: float) -> float:
    """Cores ``count`` busy processes got together; NaN if they could not run."""
    got = at_once(_busy, count, seconds)
    return math.nan if got is None else float(sum(cpu / wall for _, cpu, wall in got))


def cpu_share(cores: int, seconds: float = 0.2) -> tuple[float, float]:
    """(cores this program gets when it keeps them all busy, runnable tasks of other programs).

    Two probes: one busy process, then one per core. Where other programs compete task by task
    (plain fair sharing), a lone task gets ``P/(1 + n)`` of a core when ``n`` other tasks run:
    ``(P, n)``. Where they compete as groups (Linux autogroups, cgroups: one share per session
    or container) a lone task still gets a whole core and all of ours together get a fixed share
    ``A``: ``(A, 0)``. An idle machine gives ``(P, 0)``; a probe that cannot run, ``(P, 0)``.
    """
    one = _spinners(1, seconds)
    if math.isnan(one):
        return float(cores), 0.0
    if one < 0.9:
        return float(cores), max(0.0, cores / max(one, 1e-3) - 1.0)
    every = _spinners(cores, seconds)
    if math.isnan(every) or every >= 0.97 * cores:
        return float(cores), 0.0
    return max(1.0, every), 0.0


def collate_for(
    samples: Sequence[Any],
    collate_fn: Callable[[Any], Any] | None,
) -> tuple[Callable[[Any], Any], str | None]:
    """``collate_fn`` (default: torch's ``default_collate``) if it batches these samples, else
    a list-making collate and a note saying why."""
    if collate_fn is None:
        from torch.utils.data import default_collate

        collate_fn = default_collate
    try:
        collate_fn(list(samples[:2]))
    except Exception as exc:
        return as_list, (
            f"{getattr(collate_fn, '__name__', 'collate_fn')} cannot batch these "
            f"samples ({type(exc).__name__}: {exc}); batches are lists"
        )
    return collate_fn, None


def as_list(samples: list[Any]) -> list[Any]:
    return list(samples)


def batch_costs(
    samples: Sequence[Any], batch_size: int, collate_fn: Callable[[Any], Any], rounds: int = 6
) -> dict[str, float]:
    """Per batch: collate (wall and CPU ms) and a worker's hand-over (pickling for the result
    queue, which moves tensors to shared memory), timed in this process on fresh batches. In a
    worker, torch's collate writes into shared memory directly, so ``main_cost`` measures the
    hand-over there when it can."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the shared-memory tensor reducers)

    batches = [list(samples[i : i + batch_size]) for i in range(0, len(samples), batch_size)]
    batches = [b for b in batches if len(b) == batch_size] or batches[:1]
    walls, cpus, sends = [], [], []
    for r in range(rounds + 1):
        for b in batches:
            t0, c0 = time.perf_counter_ns(), time.process_time_ns()
            out = collate_fn(b)
            c1, t1 = time.process_time_ns(), time.perf_counter_ns()
            ForkingPickler.dumps(out)
            t2 = time.perf_counter_ns()
            if r:  # the first round is warm-up
                walls.append(t1 - t0)
                cpus.append(c1 - c0)
                sends.append(t2 - t1)
            del out
    n = max(1, len(walls))
    return {
        "collate_ms": sum(walls) / n / 1e6,
        "collate_cpu_ms": sum(cpus) / n / 1e6,
        "send_ms": sum(sends) / n / 1e6,
    }


def batch_figures(
    ran: list[tuple[int, Any]], batch_size: int, collate_fn: Any, context: Any
) -> tuple[dict[str, Any], float, list[str]]:
    """Collate and hand-over costs per batch; the main process's cost to receive one."""
    if not ran or ("torch" not in sys.modules and not has_torch()):
        return {}, 0.0, ["torch is not installed: per-batch costs not measured"] if ran else []
    samples = [detached(x) for _, x in ran]
    collate, note = collate_for(samples, collate_fn)
    costs: dict[str, Any] = {"collate": collate, **batch_costs(samples, batch_size, collate)}
    main_ms, worker_ms = main_cost(samples, batch_size, collate, context)
    if worker_ms is not None:  # measured in a real worker: collate into shared memory + send
        costs["send_ms"] = max(0.0, worker_ms - costs["collate_cpu_ms"])
    return costs, main_ms, [note] if note else []


def detached(obj: Any, depth: int = 0) -> Any:
    """``obj`` with its tensors that require grad detached (the same values), through tuples,
    lists and dicts; ``obj`` itself when none does. Autograd cannot cross processes, so a worker
    could not hand such tensors over (a step such as ``nn.Linear`` gives them)."""
    if getattr(obj, "requires_grad", False) and hasattr(obj, "detach"):
        return obj.detach()
    if depth >= 4:
        return obj
    if isinstance(obj, dict):
        out = {k: detached(v, depth + 1) for k, v in obj.items()}
        return obj if all(out[k] is v for k, v in obj.items()) else out
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        items = [detached(v, depth + 1) for v in obj]
        return obj if all(a is b for a, b in zip(items, obj)) else type(obj)(items)
    return obj


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class Cycled:
    """A map-style view of ``source`` (a dataset or a list of samples) through ``steps``."""

    def __init__(self, source: Any, steps: Sequence[Callable[[Any], Any]] = ()) -> None:
        self.source, self.steps = source, list(steps)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> Any:
        x = self.source[i]
        for fn in self.steps:
            x = fn(x)
        return detached(x)  # the steps compute as timed; only the hand-over needs no autograd


def _seed_worker(worker_id: int) -> None:
    import torch

    seed_all(torch.initial_seed() % 2**32)


def run_loader(
    dataset: Any,
    indices: Sequence[int],
    workers: int,
    batch_size: int,
    collate_fn: Callable[[Any], Any],
    seconds: float,
    expected: float | None,
    seed: int = 0,
    context: Any = None,
    rounds: int | None = None,
    consume: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """Steady samples/s of a real DataLoader with ``workers`` processes over ``indices`` (see
    NOTE [ Measuring throughput at k workers ]); over the same window, the CPU per batch of the
    main process and of the workers, and the cores other programs kept busy. ``consume`` is
    called with every batch, as a training step would be."""
    import torch
    from torch.utils.data import DataLoader

    k = max(1, workers)
    per_round = k * batch_size / expected if expected and expected > 0 else 0.05
    if rounds is None:
        rounds = int(min(400, max(3, math.ceil(seconds / max(per_round, 1e-6)))))
    total = k * (rounds + 1)
    flat = [indices[j % len(indices)] for j in range(total * batch_size)]
    batches = [flat[j * batch_size : (j + 1) * batch_size] for j in range(total)]
    extra = {"multiprocessing_context": context} if workers and context is not None else {}
    start = k - 1 if workers else 0
    stamps: list[int] = []
    marks: list[tuple[float, float, float, int, int] | None] = [None, None]
    pids: list[int] = []
    with warnings.catch_warnings():  # more workers than cores is the point of some runs
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        loader = DataLoader(
            dataset,
            batch_sampler=batches,
            num_workers=workers,
            collate_fn=collate_fn,
            worker_init_fn=_seed_worker if workers else None,
            generator=torch.Generator().manual_seed(seed),
            **extra,
        )
        for i, batch in enumerate(loader):
            if consume is not None:
                consume(batch)
            stamps.append(time.perf_counter_ns())
            if i == start or i == total - 1:
                if not pids and workers:
                    pids = _children()
                marks[i != start] = _window_mark(pids)
    n = len(stamps) - 1 - start
    span = stamps[-1] - stamps[start]
    row: dict[str, Any] = {
        "workers": workers,
        "samples_per_s": round(n * batch_size / span * 1e9, 3) if span > 0 else None,
        "batches": len(stamps),
        "wall_s": round(span / 1e9, 6),
    }
    row.update(_window(marks[0], marks[1], n, workers))
    return row


def _children() -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process().children()]
    except Exception:
        return []


def _task_cpu_ns(pid: int) -> int:
    """CPU ns of every thread of ``pid`` (Linux schedstat); 0 where unknown."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return total


def _window_mark(pids: list[int]) -> tuple[float, float, float, int, int] | None:
    """(wall s, machine busy CPU s, stolen s, main process CPU ns, workers' CPU ns) now."""
    busy = _machine_busy_s()
    if busy is None:
        return None
    now = time.perf_counter()
    return now, busy[0], busy[1], time.process_time_ns(), sum(map(_task_cpu_ns, pids))


def _window(a: Any, b: Any, batches: int, workers: int) -> dict[str, Any]:
    """Per batch CPU of the main process and the workers; cores other programs kept busy, the
    hypervisor's steal included (a virtual CPU given to another machine is a core lost)."""
    if a is None or b is None or batches <= 0 or b[0] <= a[0]:
        return {"main_cpu_ms": None, "worker_cpu_ms": None, "others_cores": None}
    wall, main_s, workers_s = b[0] - a[0], (b[3] - a[3]) / 1e9, (b[4] - a[4]) / 1e9
    others = (b[1] - a[1]) - main_s - workers_s + (b[2] - a[2])
    return {
        "main_cpu_ms": round(main_s * 1e3 / batches, 6),
        "worker_cpu_ms": round(workers_s * 1e3 / batches, 6) if workers else None,
        "others_cores": round(max(0.0, others / wall), 3),
        "stolen_cores": round((b[2] - a[2]) / wall, 3),
    }


def stolen_s() -> float | None:
    """CPU seconds the hypervisor has taken from this machine's virtual CPUs (None: unknown)."""
    busy = _machine_busy_s()
    return None if busy is None else busy[1]


def _machine_busy_s() -> tuple[float, float] | None:
    """CPU seconds the whole machine has been busy, and stolen by its hypervisor (/proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def main_cost(
    samples: Sequence[Any], batch_size: int, collate_fn: Callable[[Any], Any], context: Any = None
) -> tuple[float, float | None]:
    """CPU per batch to hand batches like these over, in the main process and in a worker: a
    one-worker DataLoader over the finished samples, so that nothing else costs."""
    n = max(1, len(samples))
    res = run_loader(
        Cycled(list(samples)), list(range(n)), 1, batch_size, collate_fn,
        seconds=0.0, expected=None, context=context, rounds=32,
    )  # fmt: skip
    return float(res["main_cpu_ms"] or 0.0), res["worker_cpu_ms"]
