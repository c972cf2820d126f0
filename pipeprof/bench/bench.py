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

    Each step gets ``warmup`` untimed calls and ``repeat`` timed passes over the fixed samples;
    random steps are reseeded per pass. A tf.data pipeline is benchmarked prefix by prefix
    (each op's marginal cost per sample, see bench/tf.py) and gives a ``TFBench``; of the
    arguments, only ``samples`` (a list counts as its length), ``repeat`` and ``warmup`` apply.

    Args:
        source: a map-style dataset (its ``transform``/``target_transform``/``transforms`` are
            split into steps; ImageFolder-style datasets get ``load/read`` and
            ``load/decode``), a ``DataLoader`` (its dataset, batch size, ``collate_fn`` and
            worker count), or, with ``transforms``, any sequence or iterable of the
            transforms' inputs; or a ``tf.data.Dataset``.
        transforms: the steps to time on each sample of ``source``: a Compose,
            ``nn.Sequential``, list of callables or one callable; None: the dataset's own.
            Not for a tf.data pipeline.
        workers: worker counts (an int or several) to run a real DataLoader at, about
            ``seconds`` each, against the model's prediction (the ``scaling`` rows); 0 is the
            main process alone; None: no runs. Not for a tf.data pipeline (its parallelism is
            ``num_parallel_calls``).
        samples: how many fixed samples, drawn with ``seed`` (all of a dataset that has no
            more; the first ones of an iterable without indexing), or a list of the dataset's
            indices.
        batch_size: samples per batch, for the per-batch costs (collate, hand-over) and the
            DataLoader runs; None: the DataLoader's (1 where it has none), else 16.
        repeat: timed passes per step, at least 1.
        warmup: untimed calls per step before them, 0 or more.
        seed: draws the samples and reseeds the random steps at each pass.
        collate_fn: batches the samples for the per-batch costs and the DataLoader runs; None:
            the DataLoader's, else torch's ``default_collate`` (lists where it cannot batch
            them, with a note).
        seconds: about how long each run of ``workers`` lasts, in seconds.
        probe: measure how busy the cores are with other programs (0.25 s) and what each
            process gets done with all of them busy; False: every usable core counts as
            free.

    Returns:
        The Bench (``print`` it, ``render("html")``, ``predict(...)``, ``to_dict()``); a
        ``TFBench`` for a tf.data pipeline.

    Raises:
        TypeError: ``source`` is neither a dataset nor a sequence or iterable of samples (a
            str or bytes is not one).
        ValueError: ``repeat`` is below 1, ``warmup`` below 0, ``batch_size`` negative, a
            worker count negative, ``samples`` below 1 or an empty list, or ``source`` has no
            samples; for a tf.data pipeline, ``transforms`` or ``workers`` given.
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

    Made by ``pipeprof.bench``, from its measurements:

    Args:
        stages: each stage's timings: the load, its parts and every transform step.
        loaded: the fixed samples: how often each step ran per sample, and the samples that
            made it through every step.
        batch_size: samples per batch.
        cores: the cores this process may use.
        share: from the probe: (cores this program gets with all of them busy, runnable
            tasks of other programs).
        costs: the per-batch costs: ``collate_ms``, ``collate_cpu_ms``, ``send_ms`` (ms per
            batch), and ``collate``, the collate function used.
        main_ms: the main process's ms to receive one batch from a worker.
        notes: what the benchmark noted on the way.
        loader_workers: the DataLoader's worker count; None: ``source`` was not a DataLoader.
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

        Args:
            workers: DataLoader workers; 0: no workers (the main process loads); None:
                ``default_workers``.
            compute_rate: samples/s the training step takes (accelerator-bound); gives the
                training rate, the workers needed to feed it and the ceiling if data were
                free; None: the loader's rate alone.
            speedup: stage paths and how many times faster each is made:
                ``{"transform/Resize": 2}`` (a child's saving comes off its parent too; naming
                a parent speeds up its children with it); None: none.
            cached: stage paths made free, their output coming from a cache in memory:
                ``["load"]``; None: none.
            background: the runnable tasks of other programs on all the cores; None: what the
                probe found; 0 for a machine of your own.

        Returns:
            The predicted samples/s: a float with ``.details`` (the limit, the ceiling and its
            worker count, and with ``compute_rate`` the workers needed; see NOTE [ Worker pool
            model ] in whatif.py). Where ``workers=`` ran worker counts, a prediction at 1 or
            more workers is anchored to the nearest run (NOTE [ Anchored predictions ]).

        Raises:
            ValueError: the pipeline delivered no sample (``delivered`` is 0: every one failed
                in some step), so it has no prediction; or a speed-up is not above 0.
            KeyError: ``speedup`` or ``cached`` names no stage.
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
        workers' costs that makes the model give what it ran.

        Args:
            workers: the worker count of the prediction.

        Returns:
            ``workers`` (the run's), ``factor``, ``cpu_factor`` (None: wall and CPU scaled
            alike), ``main_ms`` and ``measured_samples_per_s``; None: no anchor (``workers``
            below 1, no run with workers measured, or one the model cannot reach).
        """
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
        """The results as ``text``, ``json`` or ``html``.

        Args:
            fmt: ``"text"``, ``"json"`` or ``"html"``.
            **options: ``width`` (columns, default 100) and ``fragment`` (HTML without the
                page around it, default False); ``json`` ignores them.

        Returns:
            The rendered results as a string.

        Raises:
            ValueError: ``fmt`` is none of the three.
            TypeError: an option not named here.
        """
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
