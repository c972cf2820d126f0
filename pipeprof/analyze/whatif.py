"""What-if predictions from measured stage costs: a small model of a worker pool on a shared CPU.

Pure functions over a ``Model`` (plain numbers); nothing here measures, prints or imports a
framework. ``pipeprof.bench`` builds a Model from stand-alone stage timings, and the Report's
``what_if`` list (scenarios.py) builds one from a profile's stage totals.

NOTE [ Worker pool model ]
A loader with ``k`` workers is a closed loop of ``k`` processes. A worker makes a batch of ``B``
samples in ``T`` ms of wall-clock time when it has a core to itself: ``B`` times the per-sample
wall time of every stage plus the per-batch work (collate, handing the batch to the main
process). ``D`` ms of that is CPU time; the rest (``T - D``) is waiting: sleep, storage, network.
The main process spends ``M`` ms of CPU per batch receiving it. ``P`` cores are shared with
``n`` runnable tasks of other programs (measured by a probe).

Linux shares a busy CPU fairly, close to processor sharing: a burst of CPU work that finds
``Y`` tasks wanting the ``P`` cores stretches by ``max(1, Y / P)``. A worker is runnable a share
``q = D s / (T - D + D s)`` of its time, ``s`` being the mean stretch. By the arrival theorem a
worker starting a burst finds each of the other ``k - 1`` runnable with probability ``q``, the
main process with its own share (``X M s``, ``X`` in batches per ms) and the ``n`` background
tasks, so ``s = E[max(1, Y / P)]``, solved by bisection, and ``X = k / (T - D + D s)``. A fluid
model (``s = max(1, E[Y] / P)``) misses the moments when more tasks want the cores than there
are, which costs mixed stages a few percent near saturation. Waiting-bound work keeps ``s = 1``
and scales with ``k``; CPU-bound work saturates at about ``P / (D + M)`` batches per ms (less
with other programs running); the main process caps ``X`` at ``1 / (M s)``. Other programs
that keep ``u`` cores busy during a run correspond to the ``n`` whose long-run fair share is
``u`` (``background_for``). The model ignores memory bandwidth and caches.
When measured scaling falls short of it, that shortfall is the evidence for them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

#: Largest worker count searched when asking how many workers a rate needs.
MAX_WORKERS = 1024


@dataclass(frozen=True, slots=True)
class StageCost:
    """One stage's cost per sample when run alone: ``wall_ms`` of wall-clock time, of which
    ``cpu_ms`` is CPU time of the process (above ``wall_ms`` for a multi-threaded step)."""

    path: str
    wall_ms: float
    cpu_ms: float


@dataclass(frozen=True, slots=True)
class Model:
    """Measured costs of a pipeline, from which throughput at any worker count follows.

    ``stages`` may hold parents and children (``load`` and ``load/decode``); a child's cost is
    part of its parent's, so only stages without an ancestor in the tuple add up. Per batch:
    ``collate_*_ms`` is ``collate_fn``, ``send_ms`` a worker's CPU to hand the batch over
    (moving tensors to shared memory, pickling), ``main_ms`` the main process's CPU to receive
    it, ``handover_ms`` the measured wall time from a batch being ready to its arrival (latency
    more than CPU: it caps the rate at one batch per ``handover_ms``, it does not load a core).
    ``cores`` is the usable cores, ``background`` the runnable tasks of other programs.
    """

    stages: tuple[StageCost, ...]
    batch_size: int = 1
    cores: float = 1.0
    background: float = 0.0
    collate_wall_ms: float = 0.0
    collate_cpu_ms: float = 0.0
    send_ms: float = 0.0
    main_ms: float = 0.0
    handover_ms: float = 0.0  # wall time per batch from ready to received: a serial floor
    shards: int | None = None  # the most workers that get data (an iterable dataset's shards)

    def roots(self) -> list[StageCost]:
        paths = {s.path for s in self.stages}
        return [s for s in self.stages if not any(a in paths for a in _ancestors(s.path))]

    def sample_ms(self) -> tuple[float, float]:
        """(wall, cpu) ms of one sample through every stage."""
        roots = self.roots()
        return sum(s.wall_ms for s in roots), sum(s.cpu_ms for s in roots)

    def batch_ms(self, send: bool = True) -> tuple[float, float]:
        """(wall ``T``, cpu ``D``) ms a worker spends on one batch, with a core to itself;
        without the hand-over when ``send`` is False (loading in the main process)."""
        wall, cpu = self.sample_ms()
        b, extra = self.batch_size, self.send_ms if send else 0.0
        return b * wall + self.collate_wall_ms + extra, b * cpu + self.collate_cpu_ms + extra


def _ancestors(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def solve(model: Model, workers: int) -> dict[str, Any]:
    """Throughput at ``workers`` (0: loading in the main process) and what limits it.

    Returns ``samples_per_s``, ``stretch`` (how much each CPU ms stretches, 1 = a free core) and
    ``limit``: ``"workers"`` (more workers would help), ``"cores"`` (CPU-bound on this machine's
    cores), ``"shared cores"`` (other programs take part of them), ``"main process"``,
    ``"hand-over"`` or ``"shards"`` (more workers than the stream has shards: those get none).
    """
    if workers < 0:
        raise ValueError(f"workers must be 0 or more, got {workers}")
    if model.shards and workers > model.shards:  # the workers past the shards get none
        return {**solve(model, model.shards), "limit": "shards"}
    t, d = model.batch_ms(send=workers > 0)
    m = model.main_ms
    if workers == 0:  # the main process does everything, with no hand-over
        workers, m = 1, 0.0
    t, d = max(t, 1e-9), max(d, 0.0)
    wait = max(0.0, t - d)
    par = max(1.0, d / t)  # a multi-threaded step keeps several cores busy at once

    def workers_rate(s: float) -> float:
        return workers / (wait + d * s / par)

    def rate(s: float) -> float:  # batches per ms: the workers', or the main process's limit
        return min(workers_rate(s), 1.0 / (m * s)) if m > 0 else workers_rate(s)

    def seen(s: float) -> float:  # the stretch a burst of CPU work meets
        cpu = d * s / par
        q = cpu / (wait + cpu) if cpu > 0 else 0.0  # share of time a worker wants a CPU
        qm = min(1.0, rate(s) * m * s)
        return seen_stretch(workers, q, qm, model.background, model.cores)

    def fair(s: float) -> float:  # the long-run share: demand over cores
        return max(1.0, (rate(s) * (d + m) * s + model.background) / model.cores)

    hi = (workers + 1 + model.background) / model.cores + 2.0
    s, s_fair = _fixed_point(seen, hi), _fixed_point(fair, hi)
    x = rate(s)
    shared = "shared cores" if model.background >= 0.25 else "cores"
    limit = "workers" if s <= 1.0001 else shared
    if m > 0 and 1.0 / (m * s) <= workers_rate(s):
        limit = "main process"
    h = model.handover_ms if model.handover_ms > 0 and workers > 0 else 0.0
    if h and 1.0 / h < x:  # the main process takes one batch at a time, each after its hand-over
        x, limit = 1.0 / h, "hand-over"
    return {"samples_per_s": x * model.batch_size * 1e3, "stretch": s, "fair_stretch": s_fair,
            "limit": limit}  # fmt: skip


def _fixed_point(f: Callable[[float], float], hi: float) -> float:
    """The ``s >= 1`` with ``f(s) = s`` (``f`` increasing, bounded by ``hi``), by bisection."""
    if f(1.0) <= 1.0:
        return 1.0
    lo = 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > mid else (lo, mid)
    return hi


def seen_stretch(k: int, q: float, qm: float, n: float, cores: float) -> float:
    """How much a worker's CPU time stretches when it wants a core: ``E[max(1, Y / P)]`` with
    ``Y`` = itself, each of the other ``k - 1`` workers with probability ``q``, the main process
    with ``qm`` and ``n`` background tasks (see NOTE [ Worker pool model ])."""
    y_mean = 1 + (k - 1) * q + qm + n
    below = 0.0  # E[max(1, Y/P)] = E[Y]/P + E[(1 - Y/P)+], and only Y < P adds to the second
    top = min(k - 1, math.ceil(cores))
    for b, pb in zip(range(top + 1), _binom_terms(k - 1, q, top)):
        for extra, pm in ((0, 1.0 - qm), (1, qm)):
            y = 1 + b + extra + n
            if y < cores:
                below += pb * pm * (1.0 - y / cores)
    return y_mean / cores + below


def _binom_terms(n: int, p: float, top: int) -> list[float]:
    """P(X = b) for b = 0..top, X ~ Binomial(n, p): the first by logs, then by recurrence."""
    if p <= 0.0 or p >= 1.0:
        hit = 0 if p <= 0.0 else n
        return [1.0 if b == hit else 0.0 for b in range(top + 1)]
    ratio = p / (1.0 - p)
    term = math.exp(n * math.log1p(-p))
    if term == 0.0:  # underflow at large n: fall back to logs term by term
        return [_binom(n, b, p) for b in range(top + 1)]
    out = [term]
    for b in range(top):
        term *= (n - b) / (b + 1) * ratio
        out.append(term)
    return out


def _binom(n: int, k: int, p: float) -> float:
    log = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    return math.exp(log + k * math.log(p) + (n - k) * math.log1p(-p))


def background_for(model: Model, workers: int, others_cores: float) -> float:
    """The background (runnable tasks of other programs) under which the model has them use
    ``others_cores`` cores while ``workers`` workers run: each such task gets a core, or ``1/s``
    of one when CPU time stretches by ``s``. Lets a measured run be re-predicted for the load
    other programs actually put on the machine during it. Their share follows the long-run
    fair share (``fair_stretch``): Linux gives CPU-hungry tasks what others leave over time."""
    if others_cores <= 0:
        return 0.0

    def used(n: float) -> float:
        s = float(solve(replace(model, background=n), workers)["fair_stretch"])
        return n / s

    lo, hi = 0.0, max(1.0, others_cores)
    while used(hi) < others_cores and hi < 1024:
        hi *= 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if used(mid) < others_cores else (lo, mid)
    return (lo + hi) / 2


def scaled_workers(model: Model, factor: float, cpu_factor: float | None = None) -> Model:
    """``model`` with the wall time of every cost a worker pays (its stages, collate, sending a
    batch) × ``factor`` and their CPU time × ``cpu_factor`` (default ``factor``; the wall time
    stays at least the CPU time); the main process's costs are left as they are."""
    fc = factor if cpu_factor is None else cpu_factor

    def both(wall: float, cpu: float) -> tuple[float, float]:
        return max(wall * factor, cpu * fc), cpu * fc

    stages = []
    for s in model.stages:
        wall, cpu = both(s.wall_ms, s.cpu_ms)
        stages.append(replace(s, wall_ms=wall, cpu_ms=cpu))
    collate_wall, collate_cpu = both(model.collate_wall_ms, model.collate_cpu_ms)
    return replace(model, stages=tuple(stages), collate_wall_ms=collate_wall,
                   collate_cpu_ms=collate_cpu, send_ms=model.send_ms * fc)  # fmt: skip


def calibrated(
    model: Model, workers: int, measured: float, cpu_factor: float | None = None
) -> float | None:
    """The factor on the workers' wall times (``scaled_workers``, CPU × ``cpu_factor``) under
    which ``model`` gives the ``measured`` samples/s at ``workers`` (bisection, 1/100 to 100:
    throughput falls as the workers' costs grow); None where no factor in that range reaches
    it (the main process, or the hand-over, caps the model below what ran)."""
    lo, hi = 0.01, 100.0  # a step that sleeps in a worker can read 20x slower there

    def rate(f: float) -> float:
        return throughput(scaled_workers(model, f, cpu_factor), workers)

    if not rate(hi) <= measured <= rate(lo):
        return None
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if rate(mid) > measured:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def throughput(model: Model, workers: int) -> float:
    """Predicted samples/s with ``workers`` worker processes (0: in the main process)."""
    return float(solve(model, workers)["samples_per_s"])


def ceiling(model: Model) -> tuple[float, int | None]:
    """The most samples/s any worker count gives, and the fewest workers within 0.05 % of it;
    ``(inf, None)`` when nothing but waiting is measured. Throughput rises with workers until the
    cores are full, then extra workers only take CPU from the main process; past a stream's
    shards, not at all."""
    if model.shards:
        best, k = ceiling(replace(model, shards=None))
        if k is None or k > model.shards:  # rising up to the shards: the most there
            return throughput(model, model.shards), model.shards
        return best, k
    t, d = model.batch_ms()
    if d <= 0 and model.main_ms <= 0:
        return math.inf, None
    upto = min(MAX_WORKERS, math.ceil(2 * model.cores * t / max(d, 1e-9) + 2 * model.cores))
    grid = sorted({*range(1, min(upto, 16) + 1), *_geometric(16, upto)})
    rates = {k: throughput(model, k) for k in grid}
    top = max(rates, key=lambda k: rates[k])
    i = grid.index(top)  # refine between the grid's neighbours of the best
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    while hi - lo > 32:  # narrow a wide bracket (many cores) 16 points at a time
        points = sorted({round(lo + j * (hi - lo) / 16) for j in range(17)})
        rates.update({k: throughput(model, k) for k in points if k not in rates})
        j = points.index(max(points, key=lambda k: rates[k]))
        lo, hi = points[max(0, j - 1)], points[min(len(points) - 1, j + 1)]
    rates.update({k: throughput(model, k) for k in range(lo, hi + 1) if k not in rates})
    best = max(rates.values())
    return best, min(k for k, x in rates.items() if x >= best / 1.0005)


def _geometric(start: int, stop: int) -> list[int]:
    out, k = [], float(start)
    while k <= stop:
        out.append(int(k))
        k *= 1.25
    return [*out, stop]


def workers_for(model: Model, samples_per_s: float) -> int | None:
    """The fewest workers predicted to deliver ``samples_per_s``; None if no count can."""
    if samples_per_s <= 0:
        return 0
    top, top_k = ceiling(model)
    if top < samples_per_s:
        return None
    if top_k is None:  # only waiting: grows without bound, find an upper end
        top_k = 1
        while throughput(model, top_k) < samples_per_s and top_k < MAX_WORKERS:
            top_k *= 2
        if throughput(model, top_k) < samples_per_s:
            return None
    lo, hi = 1, top_k  # throughput rises with workers up to top_k
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if throughput(model, mid) < samples_per_s else (lo, mid)
    return lo


# The fewest workers whose pipeline gives this much more than the loop's steps take: on the
# diagnosis matrix (benchmarks/diagnosis_matrix.py, storage latency), 6 workers whose model gave
# 1.08x the steps' rate ran the loop at 0.76-0.92 of it; with 1.2x to spare, 0.9 and more.
FEED_HEADROOM = 1.2


def workers_to_feed(model: Model, samples_per_s: float) -> int | None:
    """The workers that keep up with a loop consuming ``samples_per_s``, with FEED_HEADROOM to
    spare where some count gives it (a pool that only just keeps up loses to the spread of its
    batches' times): the ``workers-needed`` finding's and the what-if row's figure alike."""
    return workers_for(model, samples_per_s * FEED_HEADROOM) or workers_for(model, samples_per_s)


def faster(model: Model, speedup: Mapping[str, float]) -> Model:
    """``model`` with each named stage ``N`` times faster (``N`` = inf: free, as if cached).

    A child's saving comes off its parent too; naming a parent speeds up its children with it.
    """
    stages = list(model.stages)
    known = {s.path for s in stages}
    for path, n in speedup.items():
        if path not in known:
            raise KeyError(f"no stage {path!r}; stages: {', '.join(sorted(known))}")
        if not n > 0:
            raise ValueError(f"speed-up for {path!r} must be above 0, got {n!r}")
        target = next(s for s in stages if s.path == path)
        keep = 0.0 if math.isinf(n) else 1.0 / n
        dw, dc = target.wall_ms * (1 - keep), target.cpu_ms * (1 - keep)
        out = []
        for s in stages:
            if s.path == path or s.path.startswith(path + "/"):
                out.append(replace(s, wall_ms=s.wall_ms * keep, cpu_ms=s.cpu_ms * keep))
            elif path.startswith(s.path + "/"):
                out.append(
                    replace(s, wall_ms=max(0.0, s.wall_ms - dw), cpu_ms=max(0.0, s.cpu_ms - dc))
                )
            else:
                out.append(s)
        stages = out
    return replace(model, stages=tuple(stages))


def cached(model: Model, paths: Iterable[str]) -> Model:
    """``model`` with the named stages free: their output comes from a cache in memory."""
    return faster(model, {p: math.inf for p in paths})


class Prediction(float):
    """A predicted rate in samples/s (the float value) with how it was reached.

    ``details`` holds ``workers``, ``limit``, ``ceiling_samples_per_s`` at ``ceiling_workers``
    (the best worker count; None and n/a when only waiting was measured),
    and, when a compute rate was given, ``compute_samples_per_s`` (the ceiling if data were
    free), ``loader_samples_per_s``, ``workers_needed`` (None: no worker count is enough) and
    ``input_bound``.
    """

    details: dict[str, Any]

    def __new__(cls, value: float, details: dict[str, Any]) -> Prediction:
        obj = super().__new__(cls, value)
        obj.details = details
        return obj

    def to_dict(self) -> dict[str, Any]:
        return {"samples_per_s": _round(float(self)), **self.details}

    def __str__(self) -> str:
        """The prediction as a sentence: what ``pipeprof bench --predict`` prints."""
        d = self.details
        k = d["workers"]
        text = f"{float(self):.1f} samples/s at {k} worker{'s' if k != 1 else ''}"
        text += f" (limit: {d['limit']})"
        a = d.get("anchor")
        if a:
            w = a["workers"]
            text += (f", anchored to the run with {w} worker{'s' if w != 1 else ''} (the "
                     f"workers' costs ×{a['factor']:.2f} their stand-alone timings)")  # fmt: skip
        if "compute_samples_per_s" in d:
            need = d["workers_needed"]
            text += f"; {need if need is not None else 'no number of'} workers feed the compute"
        return text

    def __repr__(self) -> str:
        return f"<Prediction {self}>"


def predict(
    model: Model,
    workers: int,
    compute_rate: float | None = None,
    speedup: Mapping[str, float] | None = None,
    cached_stages: Iterable[str] | None = None,
    anchored_to: dict[str, Any] | None = None,
) -> Prediction:
    """The rate a consumer gets at ``workers``: the loader's, or with ``compute_rate`` (samples/s
    a training step consumes when never waiting) the smaller of the two. ``anchored_to`` says
    which measured run the model was calibrated on (``calibrated``), if any."""
    if speedup:
        model = faster(model, speedup)
    if cached_stages:
        model = cached(model, cached_stages)
    res = solve(model, workers)
    x = res["samples_per_s"]
    top, top_k = ceiling(model)
    details: dict[str, Any] = {
        "workers": workers,
        "limit": res["limit"],
        "stretch": round(res["stretch"], 4),
        "ceiling_samples_per_s": _round(top),
        "ceiling_workers": top_k,
        "speedup": dict(speedup or {}),
        "cached": list(cached_stages or []),
        "anchor": anchored_to,
    }
    if compute_rate is None:
        return Prediction(x, details)
    if not compute_rate > 0:
        raise ValueError(f"compute_rate must be samples/s above 0, got {compute_rate!r}")
    details.update(
        {
            "compute_samples_per_s": _round(compute_rate),
            "loader_samples_per_s": _round(x),
            "workers_needed": workers_for(model, compute_rate),
            "input_bound": x < compute_rate,
        }
    )
    if x < compute_rate:
        details["limit"] = f"input ({res['limit']})"
    else:
        details["limit"] = "compute"
    return Prediction(min(x, compute_rate), details)


def _round(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else round(x, 3)
