"""``pipeprof.bench``: every step of an input pipeline benchmarked on its own, worker scaling, and
what-if predictions.

The module is not called ``bench.py`` so that it cannot shadow the ``pipeprof.bench`` function
(``import pipeprof.bench as m`` would otherwise give one or the other depending on import order),
as ``profiler.py`` holds ``pipeprof.profile``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pipeprof.analyze import whatif
from pipeprof.bench.isolation import StageResult, one_thread, run_chain, steps_of
from pipeprof.bench.scaling import (
    Cycled,
    batch_figures,
    cpu_share,
    run_loader,
    stolen_s,
)
from pipeprof.bench.sources import Chain, Loaded, from_dataset, from_samples, pick
from pipeprof.collect.machine import core_scaling, usable_cores
from pipeprof.core.detect import is_torch_loader
from pipeprof.core.stats import figures
from pipeprof.render.result import Result

SCALES_WELL = 0.9  # measured / linear scaling above this is called scaling
GIL_BOUND = 0.5  # a step holding the GIL this share of its time is called GIL-bound


def bench(
    source: Any,
    transforms: Any = None,
    *,
    workers: int | Iterable[int] | None = None,
    samples: int | list[int] = 64,
    batch_size: int | None = None,
    repeat: int = 3,
    warmup: int = 4,
    seed: int = 0,
    collate_fn: Callable[[Any], Any] | None = None,
    seconds: float = 1.0,
    probe: bool = True,
) -> Bench:
    """Benchmark the load and every transform step of a pipeline on a fixed set of samples.

    ``source`` is a map-style dataset (its ``transform``/``target_transform``/``transforms`` are
    split into steps; ImageFolder-style datasets get ``load/read`` and ``load/decode``), a
    ``DataLoader`` (its dataset, batch size, ``collate_fn`` and worker count), or, with
    ``transforms`` (a Compose, ``nn.Sequential``, list of callables or one callable), any
    sequence or iterable of the transforms' inputs. ``samples`` fixed samples (an int, drawn with
    ``seed``, or a list of indices) get ``warmup`` untimed calls per step and ``repeat`` timed
    passes; random steps are reseeded per pass. ``workers`` (an int or a list) adds real
    DataLoader runs of about ``seconds`` each, with ``batch_size`` (default: the loader's, else
    16). ``probe`` measures how busy the cores are with other programs (0.25 s).

    A tf.data pipeline is benchmarked prefix by prefix (each op's marginal cost per sample, see
    bench/tf.py) and gives a ``TFBench``; ``workers`` does not apply.
    """
    if _is_tf(source):
        if transforms is not None or workers is not None:
            raise ValueError("a tf.data pipeline is benchmarked as it is: pass no transforms "
                             "and no workers (its parallelism is num_parallel_calls)")  # fmt: skip
        from pipeprof.bench.tf import bench_tf

        n = samples if isinstance(samples, int) else len(samples)
        return bench_tf(source, samples=n, repeat=repeat, warmup=warmup)  # type: ignore[return-value]
    repeat, warmup = _positive("repeat", repeat, 1), _positive("warmup", warmup, 0)
    counts = sorted({int(workers)} if isinstance(workers, int) else set(workers or ()))
    if any(k < 0 for k in counts):
        raise ValueError(f"workers must be 0 or more, got {counts}")
    loader_ws, context = None, None
    if is_torch_loader(source):
        loader_ws, context = source.num_workers, source.multiprocessing_context
        batch_size = batch_size or source.batch_size or 1
        collate_fn = collate_fn or source.collate_fn
        source = source.dataset
    batch_size = _positive("batch_size", batch_size or 16, 1)
    steal0, t0 = stolen_s(), time.perf_counter()
    with one_thread():
        loaded, runner = _measure(source, transforms, samples, repeat, warmup, seed)
    steal1, t1 = stolen_s(), time.perf_counter()
    with one_thread():
        ran = [(p, x) for p, x in loaded.finals]
        costs, main_ms, notes = batch_figures(ran, batch_size, collate_fn, context)
    cores = usable_cores()
    share = cpu_share(cores) if probe else (float(cores), 0.0)
    scaling = core_scaling(cores) if probe else None
    if scaling and 0 < scaling["per_process"] < 1:  # NOTE [ Cores are not all equal ]
        share = (max(1.0, share[0] * scaling["per_process"]), share[1])
    stages = [loaded.load, *loaded.parts, *[r for c in loaded.chains for r in c.results]]
    b = Bench(
        stages,
        loaded,
        batch_size,
        cores,
        share,
        costs,
        main_ms,
        [*loaded.notes, *notes],
        loader_ws,
    )
    b.config = {
        "samples": loaded.count,
        "repeat": repeat,
        "warmup": warmup,
        "seed": seed,
        "batch_size": batch_size,
        "threads": 1,
        "source": type(source).__name__,
        "stolen_cores_while_timing": None,
        "core_scaling": scaling,
    }
    if scaling and scaling["per_process"] < 0.95:
        b.notes.append(
            f"on this machine {cores} processes busy at once each do {scaling['per_process']:.0%} "
            f"of the work of one alone (shared cores or caches, measured): predictions count "
            f"the cores as {cores * scaling['per_process']:.3g}"
        )
    if steal0 is not None and steal1 is not None and t1 > t0:
        stolen = round((steal1 - steal0) / (t1 - t0), 3)
        b.config["stolen_cores_while_timing"] = stolen
        if stolen > 0.05:
            b.notes.append(f"the hypervisor took {stolen:.2g} cores from this virtual machine "
                           "during the stand-alone timings: they may read high")  # fmt: skip
    if not ran:
        b.notes.append("no sample made it through the pipeline (see the stages' errors): no "
                       "predictions, worker scaling not measured")  # fmt: skip
    elif counts:
        collate: Callable[[Any], Any] = costs.get("collate") or collate_fn or list
        for k in counts:
            exp = whatif.throughput(b.model, k)
            row = run_loader(
                runner, [p for p, _ in ran], k, batch_size, collate, seconds, exp, seed, context
            )
            b.scaling.append({**row, "predicted_samples_per_s": round(exp, 3)})
        b.explain()
    return b


def _positive(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int of at least {low}, got {value!r}")
    return value


def _is_tf(obj: Any) -> bool:
    return any(c.__module__.startswith(("tensorflow", "keras")) for c in type(obj).__mro__)


def _measure(
    source: Any, transforms: Any, samples: int | list[int], repeat: int, warmup: int, seed: int
) -> tuple[Loaded, Any]:
    """Time load and each step; what a DataLoader run should index (the runner)."""
    indexable = hasattr(source, "__getitem__") and hasattr(source, "__len__")
    if isinstance(source, (str, bytes)) or not (indexable or hasattr(source, "__iter__")):
        raise TypeError(
            f"bench() needs a dataset or a sequence/iterable of samples, got "
            f"{type(source).__name__}"
        )
    count = samples if isinstance(samples, int) else len(samples)
    if indexable and len(source) == 0:
        raise ValueError(f"the {type(source).__name__} has no samples: len() is 0, so there is "
                         "nothing to time")  # fmt: skip
    if transforms is None and indexable:
        loaded = from_dataset(source, pick(len(source), samples, seed), repeat, warmup, seed)
        runner: Any = source
    else:
        steps, _ = steps_of(transforms) if transforms is not None else ([], False)
        idx = pick(len(source), samples, seed) if indexable else None
        loaded, raw = from_samples(source, idx, count, repeat, warmup, seed)
        if not indexable and not raw:
            raise ValueError(f"the {type(source).__name__} has no samples: it stopped before the "
                             "first, so there is nothing to time")  # fmt: skip
        loaded.chains.append(Chain("transform", steps, False, raw))
        loaded.finals = raw
        runner = Cycled(source if indexable else [x for _, x in raw], [fn for _, fn in steps])
    for chain in loaded.chains:
        chain.results, outputs = run_chain(chain.steps, chain.inputs, repeat, warmup, seed)
        if transforms is not None:
            loaded.finals = outputs
    return loaded, runner


SCHEMA = "pipeprof-bench/1"
STOPS = 0.8  # below this, throughput has stopped scaling


class Bench(Result):
    """Results of ``pipeprof.bench``: per-stage figures, worker scaling and a prediction model.

    Shows itself as rich tables in a terminal and as HTML in Jupyter; ``to_dict()`` is plain data
    (schema ``pipeprof-bench/1``); ``predict(...)`` answers what-if questions. Times are ms per
    sample unless named otherwise; n/a is None. ``delivered`` is the number of fixed samples that
    made it through every step (0: every one failed somewhere, and there are no predictions).
    """

    def __init__(
        self,
        stages: list[StageResult],
        loaded: Loaded,
        batch_size: int,
        cores: int,
        share: tuple[float, float],
        costs: dict[str, Any],
        main_ms: float,
        notes: list[str],
        loader_workers: int | None,
    ) -> None:
        self.stages = stages
        self.calls = {r.path: c.calls for c in loaded.chains for r in c.results}
        self.batch_size, self.cores = batch_size, cores
        self.available, self.background = share  # from the probe (scaling.cpu_share)
        self.costs = {k: v for k, v in costs.items() if k != "collate"}
        self.costs["collate"] = costs.get("collate")
        self.main_ms = main_ms
        self.notes = notes
        self.loader_workers = loader_workers
        self.delivered = len(loaded.finals)
        self.scaling: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {}
        self.model = self._model()

    def _model(self) -> whatif.Model:
        costs = [
            whatif.StageCost(
                r.path,
                r.wall_ms * self.calls.get(r.path, 1.0),
                r.cpu_ms * self.calls.get(r.path, 1.0),
            )
            for r in self.stages
            if r.stat.count
        ]
        c = self.costs
        return whatif.Model(
            tuple(costs),
            self.batch_size,
            self.available,
            self.background,
            c.get("collate_ms", 0.0),
            c.get("collate_cpu_ms", 0.0),
            c.get("send_ms", 0.0),
            self.main_ms,
        )

    @property
    def default_workers(self) -> int:
        """The loader's worker count, else one worker per core but one (for the main process)."""
        return self.loader_workers or max(1, self.cores - 1)

    def predict(
        self,
        workers: int | None = None,
        compute_rate: float | None = None,
        speedup: Mapping[str, float] | None = None,
        cached: Sequence[str] | None = None,
        background: float | None = None,
    ) -> whatif.Prediction:
        """Predicted samples/s at ``workers`` (default ``default_workers``; 0: no workers).

        ``speedup={"transform/Resize": 2}`` makes stages N times faster, ``cached=["load"]`` makes
        them free; ``compute_rate`` (samples/s the training step takes, accelerator-bound) gives
        the training rate, the workers needed to feed it and the ceiling if data were free.
        ``background`` is the runnable tasks of other programs on all the cores (default: what the
        probe found; 0 for a machine of your own). The result is a float with ``.details``; see
        NOTE [ Worker pool model ] in whatif.py. A pipeline that delivered no sample (``delivered``
        is 0: every one failed in some step) has no prediction: ``ValueError``.
        """
        if not self.delivered:
            raise ValueError(
                "no sample made it through the pipeline, so there is nothing to predict: fix "
                "the step that fails (see the stages' errors)"
            )
        k = self.default_workers if workers is None else workers
        model = self.model
        if background is not None:
            model = replace(self.base, background=background)
        anchor = self.anchor(k)
        if anchor is not None:
            main = anchor["main_ms"] if anchor["main_ms"] is not None else model.main_ms
            model = whatif.scaled_workers(replace(model, main_ms=main), anchor["factor"],
                                          anchor["cpu_factor"])  # fmt: skip
        return whatif.predict(model, k, compute_rate, speedup, cached, anchored_to=anchor)

    # NOTE [ Anchored predictions ]
    # The stand-alone timings run each step in this process, one sample after another, caches
    # warm; a worker makes the same samples beside the main process and the other workers. On a
    # shared 2-vCPU VM, a Python step (20,000 dict updates a sample) timed alone gave 229-739
    # samples/s of one process, while one worker made 214-277: the model's 2-worker figure read
    # -1 % and +24 % (medians of two sets of 5 rounds), up to +69 % in one round
    # (benchmarks/core_scaling.py; docs/validation/bench.md has the anchored figures). Where
    # worker counts were measured (``workers=``), a prediction at k workers uses the model whose
    # workers' costs (stages, collate, sending; not the main process's) are scaled until it
    # gives what the run nearest k gave (the largest at or below k, else the smallest above),
    # under the load other programs put on the cores in that run. ``details["anchor"]`` says
    # which run and the factor; k = 0 (no workers) is not anchored, nor is a run the model
    # cannot reach.
    def anchor(self, workers: int) -> dict[str, Any] | None:
        """The measured run a prediction at ``workers`` is anchored to, and the factor on the
        workers' costs that makes the model give what it ran."""
        rows = [r for r in self.scaling if r["workers"] >= 1 and r.get("samples_per_s")]
        if workers < 1 or not rows:
            return None
        below = [r for r in rows if r["workers"] <= workers]
        by_workers = lambda r: r["workers"]
        row = max(below, key=by_workers) if below else min(rows, key=by_workers)
        model = self.model
        if row.get("others_cores") is not None:  # the load the run had, as explain() takes it
            bg = whatif.background_for(self.base, row["workers"], row["others_cores"])
            model = replace(self.base, background=bg)
        main = row.get("main_cpu_ms")  # the main process's CPU per batch, as measured in it
        model = replace(model, main_ms=main) if main else model
        alone_cpu, ran_cpu = model.batch_ms()[1], row.get("worker_cpu_ms")
        cpu_factor = ran_cpu / alone_cpu if ran_cpu and alone_cpu > 0 else None
        factor = whatif.calibrated(model, row["workers"], row["samples_per_s"], cpu_factor)
        if factor is None and cpu_factor is not None:  # the CPU read over the run is a little
            cpu_factor = None  # off: wall and CPU scaled alike
            factor = whatif.calibrated(model, row["workers"], row["samples_per_s"])
        if factor is None:
            return None
        return {"workers": row["workers"], "factor": round(factor, 4),
                "cpu_factor": None if cpu_factor is None else round(cpu_factor, 4),
                "main_ms": main or None,
                "measured_samples_per_s": row["samples_per_s"]}  # fmt: skip

    @property
    def base(self) -> whatif.Model:
        """The model on all the cores with nothing else running."""
        per = (self.config.get("core_scaling") or {}).get("per_process") or 1.0
        return replace(self.model, cores=max(1.0, self.cores * min(1.0, per)), background=0.0)

    def explain(self) -> None:
        """Annotate the scaling rows: efficiency, prediction error and why scaling stops."""
        rows = sorted(self.scaling, key=lambda r: r["workers"])
        one = next((r["samples_per_s"] for r in rows if r["workers"] == 1), None)
        base = one or whatif.throughput(self.model, 1)
        for r in rows:
            x, k = r["samples_per_s"], max(1, r["workers"])
            others = r.get("others_cores")
            if others is not None:  # re-predict for the load other programs put on the cores
                bg = whatif.background_for(self.base, r["workers"], others)
                model = replace(self.base, background=bg)
                r["model_samples_per_s"] = round(whatif.throughput(model, r["workers"]), 3)
            pred = r.get("model_samples_per_s") or r["predicted_samples_per_s"]
            alone = self.model.batch_ms()[1]
            if r.get("worker_cpu_ms") and alone > 0:  # > 1: the same work took more CPU
                r["cpu_inflation"] = round(r["worker_cpu_ms"] / alone, 4)
            r["efficiency"] = round(x / (k * base), 4) if x and base else None
            r["error"] = round(pred / x - 1, 4) if x else None
            r["why"] = self._why(r)

    def _why(self, row: dict[str, Any]) -> str:
        eff, k = row["efficiency"], row["workers"]
        inflation = row.get("cpu_inflation") or 1.0
        if inflation > 1.15 and (k <= 1 or (eff or 1.0) < SCALES_WELL):
            return (
                f"memory bandwidth or caches: each batch took {inflation - 1:.0%} more CPU in "
                "the workers than its steps alone"
            )
        if eff is None or eff >= SCALES_WELL or k <= 1:
            return "scales"
        others = row.get("others_cores")
        if others is not None and others >= 0.25:
            model = replace(self.base, background=whatif.background_for(self.base, k, others))
        else:
            model = self.base
        limit = whatif.solve(model, k)["limit"]
        if limit == "cores":
            return f"CPU-bound steps fill the {self.cores} cores"
        if limit == "shared cores":
            return f"other programs kept {others:.2g} of the {self.cores} cores busy"
        if limit == "main process":
            return (
                f"the main process (one thread, one GIL) spends {self.main_ms:.3g} ms "
                "receiving each batch"
            )
        pred, x = (
            row.get("model_samples_per_s") or row["predicted_samples_per_s"],
            row["samples_per_s"],
        )
        held = [r for r in self.stages if (r.gil or 0.0) >= GIL_BOUND]
        if x < 0.85 * pred and held:
            top = max(held, key=lambda r: r.wall_ms)
            return (
                f"a GIL-bound step: {top.path} holds the GIL {top.gil:.0%} of its time, and "
                "each worker's hand-over threads (result queue, tensor sharing) wait for it"
            )
        if x < 0.85 * pred:
            mb = sum((r.out_bytes or 0) for r in self.stages) * x / 1e6
            return (
                f"memory bandwidth or caches: cores are free by the model, and the steps "
                f"write about {mb:.0f} MB/s"
            )
        return "start-up and hand-over overheads"

    def _data_dict(self) -> dict[str, Any]:
        """Plain data: ``stages``, ``batch``, ``host``, ``scaling``, ``predictions``, ``notes``."""
        return as_dict(self)

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The results as ``text``, ``json`` or ``html``; options ``width`` (columns) and
        ``fragment`` (HTML without the page around it)."""
        from pipeprof.render.bench import render

        return render(self.to_dict(), fmt, **options)

    def _renderables(self) -> Any:
        from pipeprof.render.bench import renderables

        return renderables(self.to_dict())

    def __repr__(self) -> str:
        top = max((r for r in self.stages if r.stat.count), key=lambda r: r.wall_ms, default=None)
        what = f"slowest {top.path} {top.wall_ms:.3g} ms/sample" if top else "no stage timed"
        return f"<pipeprof.Bench {len(self.stages)} stages, {what}>"


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else round(x, nd)


def as_dict(b: Bench) -> dict[str, Any]:
    """The benchmark as plain data (schema ``pipeprof-bench/1``); ms are per sample."""
    roots = {s.path for s in b.model.roots()}
    total = sum(s.wall_ms for s in b.model.stages if s.path in roots) or math.nan
    stages = {}
    for r in b.stages:
        calls = b.calls.get(r.path, 1.0)
        st = r.stat
        fig = figures(st)
        mean = fig["mean_ms"] if fig["mean_ms"] is not None else math.nan
        stages[r.path] = {
            "mean_ms": fig["mean_ms"],
            "p50_ms": fig["p50_ms"],
            "p95_ms": fig["p95_ms"],
            "cpu_ms": _r(r.cpu_ms),
            "samples_per_s": _r(1e3 / mean, 3) if mean > 0 else None,
            "share": _r(r.wall_ms * calls / total, 4),
            "kind": r.kind,
            "gil_held": _r(r.gil, 3),
            "calls": st.count,
            "calls_per_sample": calls,
            "out_bytes": _r(r.out_bytes, 1),
            "out": r.out or None,
            "errors": dict(r.errors) or None,
            "skipped": r.skipped,
        }
    c = b.costs
    top, top_k, preds = math.nan, None, []  # nothing delivered: nothing to predict
    if b.delivered:
        top, top_k = whatif.ceiling(b.model)
        ks = sorted({0, 1, 2, 4, 8, b.cores, max(1, b.cores - 1), b.default_workers})
        preds = [{"workers": k, **_solved(b.model, k)} for k in ks]
    stops = next(
        (
            r["workers"]
            for r in sorted(b.scaling, key=lambda r: r["workers"])
            if (r.get("efficiency") or 1.0) < STOPS
        ),
        None,
    )
    return {
        "schema": SCHEMA,
        "config": b.config,
        "stages": stages,
        "batch": {
            "batch_size": b.batch_size,
            "collate_ms": _r(c.get("collate_ms")),
            "collate_cpu_ms": _r(c.get("collate_cpu_ms")),
            "send_ms": _r(c.get("send_ms")),
            "main_ms": _r(b.main_ms),
        },
        "host": {
            "cores": b.cores,
            "available_cores": _r(b.available, 3),
            "background_tasks": _r(b.background, 3),
        },
        "scaling": sorted(b.scaling, key=lambda r: r["workers"]),
        "stops_scaling_at": stops,
        "predictions": {
            "workers": preds,
            "default_workers": b.default_workers,
            "ceiling_samples_per_s": _r(top, 3),
            "ceiling_workers": top_k,
        },
        "notes": list(b.notes),
    }


def _solved(model: whatif.Model, k: int) -> dict[str, Any]:
    res = whatif.solve(model, k)
    return {"samples_per_s": _r(res["samples_per_s"], 3), "limit": res["limit"]}
