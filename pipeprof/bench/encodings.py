"""``pipeprof.bench_encodings``: the dataset's samples written in other storage encodings, read
back stage by stage, and the pipeline throughput the what-if model predicts with each.

NOTE [ Encoding what-if ]
The samples are what the dataset's transforms get: ``dataset[i]`` is called on a copy whose
transforms keep their input (the decoded image of an ImageFolder, the array an h5py-backed
dataset returns), or, where the load reads one h5py dataset, the array that read returned. Each
candidate encoding writes those samples to a temporary folder and reads them back into the same
type (a PIL image stays a PIL image), so the transforms downstream are unchanged; only the
read-and-decode differs. Read-and-decode is timed like any stage (NOTE [ Stand-alone stage
timing ]), on the same clocks, from the page cache (warm). The model of the pipeline is the
one ``pipeprof.bench`` fits; for an encoding, ``load`` is ``load - current + candidate``: the
rest of ``__getitem__`` (labels, conversions, a file lookup) stays. Where the current read cannot
be isolated (a dataset of unknown storage), the candidate's read replaces the whole ``load``.
Presized images change what the transforms do too: they are timed again on the presized images.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from pipeprof.analyze import whatif
from pipeprof.bench.bench import Bench, bench
from pipeprof.bench.codecs import (
    Codec,
    Store,
    crop_size,
    psnr_db,
    refuses,
    write,
)
from pipeprof.bench.fetch import Fetched, fetched, label, layouts
from pipeprof.bench.isolation import (
    StageResult,
    _passes,
    gil_share,
    one_thread,
    run_chain,
    time_calls,
)
from pipeprof.bench.scaling import run_loader
from pipeprof.bench.sources import pick
from pipeprof.bench.storage import Captured, Current, as_array, capture
from pipeprof.core.detect import is_torch_loader
from pipeprof.render.result import Result

SCHEMA = "pipeprof-encodings/1"
WORTH = 1.05  # a candidate this much faster than the current encoding is named the best
SHORT_BATCHES = 500  # batches/s above which the hand-over's latency is missing (docs/bench.md)
LOWER_QUALITIES = (90, 75, 50)
KINDS = ("jpeg", "png", "webp", "npy", "hdf5")


def bench_encodings(
    source: Any,
    *,
    samples: int | list[int] = 64,
    seed: int = 0,
    workers: int | None = None,
    batch_size: int | None = None,
    repeat: int = 3,
    warmup: int = 2,
    probe: bool = True,
    kinds: Sequence[str] | None = None,
    seconds: float = 2.0,
) -> Encodings:
    """Benchmark the samples of ``source`` stored in other encodings, stage by stage.

    The fixed samples are written in each candidate encoding to a temporary folder (removed
    after) and read back: per sample, read-and-decode wall and CPU ms, the share of it holding
    the GIL, bytes on disk, the quality lost (PSNR), and the throughput the what-if model
    predicts with it at ``workers``. See NOTE [ Encoding what-if ]. A row that cannot hold the
    samples (float data in JPEG) is not applicable and says why. A real DataLoader then runs
    the samples as stored for about ``seconds`` at ``workers``: the current row's samples/s is
    that measured rate, and every other row's is it times the row's predicted gain (NOTE
    [ Anchored to a real run ]; the run is skipped, with a note, for a dataset holding an open
    h5py file or where it fails).

    Args:
        source: a map-style dataset (an ImageFolder-style one, one backed by h5py, or any
            other whose ``dataset[i]`` gives an image or array before its transforms), a
            ``DataLoader`` over one (its worker count, batch size and start method are used),
            or an ``h5py.Dataset`` (samples along its first axis).
        samples: how many fixed samples, drawn with ``seed`` (all of a dataset that has no
            more), or a list of the dataset's indices.
        seed: draws the samples and reseeds the random steps at each timed pass.
        workers: the worker count the predictions and the real run are at; None: the
            DataLoader's worker count (where above 0), else one per core but one.
        batch_size: samples per batch; None: the DataLoader's, else 16 (as ``pipeprof.bench``).
        repeat: timed passes over the samples per stage and per read, at least 1.
        warmup: untimed calls before them, 0 or more.
        probe: measure how busy the cores are with other programs, as ``pipeprof.bench``
            does; False: every usable core counts as free.
        kinds: limits the candidates to some of ``"jpeg"``, ``"png"``, ``"webp"``, ``"npy"``
            and ``"hdf5"``; None: all.
        seconds: about how long the real DataLoader run lasts, in seconds; 0 keeps the
            model's figures alone.

    Returns:
        The Encodings, one row per encoding with the current first (``print`` it,
        ``render("html")``, ``best``, ``predict(...)``, ``to_dict()``).

    Raises:
        TypeError: ``source`` is not a map-style dataset, a DataLoader or an h5py.Dataset.
        ValueError: ``seconds`` is not a number of seconds of 0 or more, ``kinds`` names an
            unknown encoding, ``source`` has no samples or is a closed h5py dataset, no sample
            made it through the pipeline, or ``samples``, ``repeat``, ``warmup`` or
            ``batch_size`` is out of range (as in ``pipeprof.bench``).
    """
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not (0 <= seconds < math.inf)
    ):
        raise ValueError(f"seconds must be a number of seconds, 0 or more, got {seconds!r}")
    unknown = set(kinds or ()) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown encoding kinds {sorted(unknown)}: use {', '.join(KINDS)}")
    loader_workers = None
    target = source
    if is_torch_loader(source):
        loader_workers, batch_size = source.num_workers, batch_size or source.batch_size
        source = source.dataset
    _check_source(source)
    indices = pick(len(source), samples, seed)
    got = capture(source, indices)
    try:
        b = bench(target, samples=indices, repeat=repeat, warmup=warmup, seed=seed,
                  batch_size=batch_size, probe=probe)  # fmt: skip
        if not b.delivered:
            raise ValueError(
                "no sample made it through the pipeline, so there is nothing to predict: run "
                "pipeprof.bench(...) to see the step that fails"
            )
        k = workers if workers is not None else (loader_workers or b.default_workers)
        with one_thread(), tempfile.TemporaryDirectory(prefix="pipeprof-encodings-") as tmp:
            rows, models = measure(b, got, k, tmp, (repeat, warmup, seed), kinds or KINDS)
        net = fetched(source, indices)
        if net is not None:
            network_rows(rows, models, b, net, k, got.current)
    finally:
        for fn in got.current.closers:
            fn()
    anchor = anchored(rows, source, indices, k, b, seconds, loader_context(target), seed)
    result = Encodings(rows, models, k, b, got.current, anchor, net)
    result.config = {"samples": len(indices), "repeat": repeat, "warmup": warmup, "seed": seed,
                     "workers": k, "batch_size": b.batch_size, "seconds": seconds,
                     "source": type(source).__name__}  # fmt: skip
    return result


def loader_context(target: Any) -> Any:
    return target.multiprocessing_context if is_torch_loader(target) else None


def anchored(
    rows: list[dict[str, Any]],
    source: Any,
    indices: list[int],
    k: int,
    b: Bench,
    seconds: float,
    context: Any,
    seed: int,
) -> dict[str, Any]:
    """The current encoding's rate measured in a real DataLoader run, and every row's
    prediction scaled by it (NOTE [ Anchored to a real run ]); what was done, or why not.

    NOTE [ Anchored to a real run ]
    The model's absolute rate carries how far the stand-alone timings are from what workers
    really spend: on a shared VM the same decode costs 0.84-1.6x as much from one run to the
    next, seconds apart, and the hand-over costs more when the cores are full than when it is
    timed on its own. An encoding's gain over the current one (the model's rate with it / with
    the current) is timed pass by pass in turn with the current read, so both drift alike and
    the gain holds (docs/validation/bench.md). So the current encoding is run for real, over the
    same sample set, with the same workers, batch size, collate_fn and start method, and each row's
    rate is the measured one times the row's gain: the current row is measured, the others are
    predicted. The run is skipped (the model's rates stand, and the note says why) when the
    dataset holds open h5py handles (workers must not inherit them, docs/hdf5.md) or the run
    fails (a dataset that cannot be sent to spawned workers).
    """
    cur = rows[0]
    raw = cur.get("predicted_samples_per_s")
    for r in rows:
        if r.get("applicable"):
            r["model_samples_per_s"] = r["predicted_samples_per_s"]
    out: dict[str, Any] = {"seconds": seconds, "workers": k, "measured_samples_per_s": None,
                           "model_samples_per_s": raw, "factor": None, "others_cores": None,
                           "skipped": None}  # fmt: skip
    from pipeprof.collect import hdf5

    h5py = sys.modules.get("h5py")
    if seconds <= 0:
        out["skipped"] = "seconds=0"
    elif not raw:
        out["skipped"] = "the model predicts no rate for the current encoding"
    elif h5py is not None and (isinstance(source, h5py.Dataset)
                               or hdf5.inherited_handles(source)):  # fmt: skip
        out["skipped"] = ("the dataset holds an open h5py file, which DataLoader workers must not "
                          "inherit (docs/hdf5.md)")  # fmt: skip
    if out["skipped"]:
        return out
    collate: Callable[[Any], Any] = b.costs.get("collate") or list
    try:
        run = run_loader(source, indices, k, b.batch_size, collate, seconds, raw, seed, context)
    except Exception as exc:  # the rates stay the model's; the note says what failed
        out["skipped"] = f"the DataLoader run failed: {type(exc).__name__}: {exc}"
        return out
    measured = run.get("samples_per_s")
    if not measured:
        out["skipped"] = "the DataLoader run delivered no steady rate"
        return out
    factor = measured / raw
    out.update(measured_samples_per_s=measured, factor=round(factor, 4),
               others_cores=run.get("others_cores"), wall_s=run.get("wall_s"))  # fmt: skip
    for r in rows:
        if r.get("applicable") and r.get("model_samples_per_s"):
            r["predicted_samples_per_s"] = _r(r["model_samples_per_s"] * factor, 3)
    cur["measured_samples_per_s"] = measured
    return out


def _check_source(source: Any) -> None:
    h5py = sys.modules.get("h5py")
    if h5py is not None and isinstance(source, h5py.Dataset) and not source.id.valid:
        raise ValueError("the h5py dataset is closed (its file was closed): pass one from an "
                         "open file, h5py.File(path, 'r')[name]")  # fmt: skip
    if isinstance(source, (str, bytes)) or not hasattr(source, "__getitem__"):
        raise TypeError(f"bench_encodings() needs a map-style dataset, a DataLoader or an "
                        f"h5py.Dataset, got {type(source).__name__}")  # fmt: skip
    if not hasattr(source, "__len__") or len(source) == 0:
        raise ValueError(f"the {type(source).__name__} has no samples (no len() or len() is "
                         "0): nothing to encode")  # fmt: skip


def candidates(cur: Current) -> list[Codec]:
    """The encodings to try for samples stored as ``cur``."""
    q = cur.quality if cur.kind == "jpeg" and cur.quality else 90
    lower = [v for v in LOWER_QUALITIES if v < q - 2][:2] if cur.kind == "jpeg" else [90, 75]
    out = [Codec("jpeg", v) for v in lower]
    out += [Codec("jpeg", q, presize=-1), Codec("png"), Codec("webp", 90), Codec("npy")]
    h5 = [None, "gzip", "lzf"]
    out += [Codec("hdf5", compression=c) for c in h5]
    if cur.kind == "hdf5":  # other chunk shapes: many samples per chunk
        out += [Codec("hdf5", compression=c, per_chunk=16) for c in h5]
    return out


def measure(
    b: Bench, got: Captured, k: int, tmp: str, timing: tuple[int, int, int], kinds: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, whatif.Model]]:
    """One row per encoding, the current first, and the model of the pipeline with each."""
    from PIL import features

    cur = got.current
    inputs = list(enumerate(cur.keys))
    base = b.model
    load = next(s for s in base.stages if s.path == "load")
    if cur.reader is not None:
        res = StageResult("read")
        time_calls(res, cur.reader, inputs, *timing)
        now = (res.wall_ms, res.cpu_ms, res.gil)
    else:
        stage = next(r for r in b.stages if r.path == "load")
        now = (load.wall_ms, load.cpu_ms, stage.gil)
    rows = [_row(cur.label, True, base, k, now, cur.bytes_per_sample, None)]
    models = {cur.label: base}
    rows[0].update(quality="as stored", lossy=None, why_bytes=cur.why or None)
    side, how = crop_size(got.steps)
    webp = bool(features.check("webp"))
    for i, codec in enumerate(c for c in candidates(cur) if c.kind in kinds):
        if codec.presize == -1:
            if side is None:
                rows.append(_na(codec.name, how))
                continue
            codec = replace(codec, presize=side)
        why = refuses(codec, got.arrays, webp)
        if why is not None:
            rows.append(_na(codec.name, why))
            continue
        store = write(codec, got.arrays, os.path.join(tmp, str(i)), got.like)
        try:
            row, models[codec.name] = _candidate(b, got, codec, store, k, now, timing, how)
            rows.append(row)
        finally:
            store.close()
    return rows, models


def network_rows(
    rows: list[dict[str, Any]],
    models: dict[str, whatif.Model],
    b: Bench,
    net: Fetched,
    k: int,
    cur: Current,
) -> None:
    """A row for each layout of the fetch (objects that hold more samples, requests in flight:
    NOTE [ Larger objects and requests in flight, benched ] in bench/fetch.py)."""
    for layout, model in layouts(b.model, net, b.batch_size):
        name = label(layout)
        load = next(s for s in model.stages if s.path == "load")
        row = _row(name, False, model, k, (load.wall_ms, load.cpu_ms, None),
                   cur.bytes_per_sample, None)  # fmt: skip
        row.update(quality="lossless: the same bytes", lossy=False, layout=layout)
        rows.append(row)
        models[name] = model


def _candidate(
    b: Bench,
    got: Captured,
    codec: Codec,
    store: Store,
    k: int,
    now: tuple[float, float, float | None],
    timing: tuple[int, int, int],
    how: str,
) -> tuple[dict[str, Any], whatif.Model]:
    """A candidate's row: its read timed, the model with it (see NOTE [ Encoding what-if ])."""
    keys = list(enumerate(store.keys))
    res, then, outs = _paired(got.current, store.reader, keys, timing)
    load = next(s for s in b.model.stages if s.path == "load")
    base = (then.wall_ms, then.cpu_ms) if then is not None else now[:2]
    wall = max(0.0, load.wall_ms - base[0] + res.wall_ms)
    cpu = max(0.0, load.cpu_ms - base[1] + res.cpu_ms)
    stages = [s for s in b.model.stages if not s.path.startswith("load")]
    stages.append(whatif.StageCost("load", wall, cpu))
    if codec.presize and got.steps:  # the transforms get smaller images: time them again
        before, _ = run_chain(got.steps, [(i, got.like(a)) for i, a in enumerate(got.arrays)],
                              *timing)  # fmt: skip
        after, _ = run_chain(got.steps, outs, *timing)
        delta = {a.path: (a.wall_ms - z.wall_ms, a.cpu_ms - z.cpu_ms)
                 for a, z in zip(after, before) if a.stat.count and z.stat.count}  # fmt: skip
        stages = [replace(s, wall_ms=max(0.0, s.wall_ms + delta[s.path][0]),
                          cpu_ms=max(0.0, s.cpu_ms + delta[s.path][1]))
                  if s.path in delta else s for s in stages]  # fmt: skip
    model = replace(b.model, stages=tuple(stages))
    per = store.bytes_total / len(store.keys)
    row = _row(codec.name, False, model, k, (res.wall_ms, res.cpu_ms, res.gil), per, codec)
    row.update(quality=_quality(codec, got.arrays, outs), lossy=codec.lossy)
    if codec.presize:
        row["presize_basis"] = how
    return row, model


def _paired(
    cur: Current, reader: Callable[[Any], Any], keys: list[tuple[int, Any]], timing: tuple[int, ...]
) -> tuple[StageResult, StageResult | None, list[tuple[int, Any]]]:
    """A candidate's read timed pass by pass in turn with the current one (None: no current
    read to time), so that a machine running faster or slower for a few seconds (a shared VM
    drifts by ±25 %) moves both alike; the candidate's outputs of its first pass."""
    repeat, warmup, seed = timing
    new = StageResult("read")
    now = StageResult("read") if cur.reader is not None else None
    pairs = [(new, reader, keys)]
    if now is not None and cur.reader is not None:
        pairs.insert(0, (now, cur.reader, list(enumerate(cur.keys))))
    for _, fn, xs in pairs:
        for _, x in xs[:warmup]:
            with contextlib.suppress(Exception):  # reported by the timed passes
                fn(x)
    outs: list[tuple[int, Any]] = []
    for r in range(repeat):
        for res, fn, xs in pairs:
            _passes(res, fn, xs, 1, seed, outs if r == 0 and res is new else [])
    new.gil = gil_share(reader, [x for _, x in keys])
    return new, now, outs


def _quality(codec: Codec, arrays: list[Any], outs: list[tuple[int, Any]]) -> str:
    if codec.presize:
        return f"lossy: resized to {codec.presize} px, q{codec.quality}"
    scores = [psnr_db(arrays[p], as_array(y)) for p, y in outs]
    if any(s is None for s in scores) or not scores:
        return "lossy" if codec.lossy else "lossless"
    worst = min(s for s in scores if s is not None)
    return "lossless" if math.isinf(worst) else f"lossy: PSNR {worst:.1f} dB"


def _transform_ms(model: whatif.Model) -> float:
    return sum(s.wall_ms for s in model.roots() if s.path.startswith("transform"))


def _row(
    label: str,
    current: bool,
    model: whatif.Model,
    k: int,
    read: tuple[float, float, float | None],
    per: float | None,
    codec: Codec | None,
) -> dict[str, Any]:
    solved = whatif.solve(model, k)
    return {
        "encoding": label,
        "current": current,
        "applicable": True,
        "reason": None,
        "read_ms": _r(read[0]),
        "read_cpu_ms": _r(read[1]),
        "gil_held": _r(read[2], 3),
        "bytes_per_sample": _r(per, 1),
        "transform_ms": _r(_transform_ms(model)),
        "predicted_samples_per_s": _r(solved["samples_per_s"], 3),
        "limit": solved["limit"],
        "presize": codec.presize if codec else None,
        "codec": asdict(codec) if codec else None,  # Codec(**row["codec"]) writes it again
    }


def _na(label: str, why: str) -> dict[str, Any]:
    return {"encoding": label, "current": False, "applicable": False,
            "reason": f"not applicable: {why}", "lossy": None, "quality": None}  # fmt: skip


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else round(x, nd)


class Encodings(Result):
    """Results of ``pipeprof.bench_encodings``: one row per storage encoding, the current first.

    Each row: ``encoding``, ``current``, ``applicable`` (False: ``reason`` says why, and it has no
    figures), ``read_ms`` / ``read_cpu_ms`` (read and decode per sample, wall and CPU ms, warm
    page cache), ``gil_held`` (share of the read holding the GIL; None: too short to tell),
    ``bytes_per_sample`` (None: unknown, ``why_bytes``), ``transform_ms`` (the transforms per
    sample with it), ``predicted_samples_per_s`` at ``workers`` (anchored to the current
    encoding's measured run, ``anchor``; ``model_samples_per_s``: the model's alone; the current
    row's ``measured_samples_per_s``) and its ``limit``, ``quality`` and ``lossy``. ``best``
    names the fastest and its trade-off. n/a is None, never 0.

    Made by ``pipeprof.bench_encodings``, from its measurements:

    Args:
        rows: one dict per encoding, the current first (the fields above); ``speedup`` and
            ``size_vs_current`` are added here.
        models: the pipeline's what-if model with each applicable encoding, by its name.
        workers: the worker count the rows' predictions are at.
        b: the ``pipeprof.bench`` result of the pipeline as it is.
        cur: how the samples are stored now.
        anchor: the real DataLoader run the predictions are scaled to (NOTE [ Anchored to a
            real run ]); None: none.
        fetch: what the samples' network reads took (bench/fetch.py); None: no request.
    """

    def __init__(
        self,
        rows: list[dict[str, Any]],
        models: dict[str, whatif.Model],
        workers: int,
        b: Bench,
        cur: Current,
        anchor: dict[str, Any] | None = None,
        fetch: Fetched | None = None,
    ) -> None:
        self.rows, self.models, self.workers, self.bench = rows, models, workers, b
        self.anchor = anchor or {}
        self.fetch = fetch.to_dict() if fetch is not None else None
        self.config: dict[str, Any] = {}
        self.notes: list[str] = []
        a = self.anchor
        if a.get("measured_samples_per_s"):
            self.notes.append(
                f"samples/s: the current encoding's is measured (a DataLoader with {workers} "
                f"workers over the sample set, {a['wall_s']:.2g} s); each other row's is that "
                f"× its predicted gain over the current (the model alone said "
                f"{a['model_samples_per_s']:.0f} for the current, {1 / a['factor']:.2f}× the "
                "measured)"
            )
        elif a.get("skipped") and a["skipped"] != "seconds=0":
            self.notes.append(f"samples/s: the model's alone, not checked against a real run "
                              f"({a['skipped']})")  # fmt: skip
        base = rows[0]
        for r in rows:
            if r.get("applicable") and base["predicted_samples_per_s"]:
                r["speedup"] = _r(r["predicted_samples_per_s"] / base["predicted_samples_per_s"], 4)
            if r.get("applicable") and base.get("bytes_per_sample") and r["bytes_per_sample"]:
                r["size_vs_current"] = _r(r["bytes_per_sample"] / base["bytes_per_sample"], 4)
        fast = [r["encoding"] for r in rows if r.get("applicable") and workers > 0
                and (r["predicted_samples_per_s"] or 0) / b.batch_size > SHORT_BATCHES]  # fmt: skip
        if fast:
            self.notes.append(
                f"{', '.join(fast)}: predicted at over {SHORT_BATCHES} batches/s, where each "
                "batch's hand-over waits for busy cores and real runs fall short of the model "
                "(+34 % measured at 850 batches/s, docs/bench.md); a larger batch_size avoids it"
            )
        sized = next((r for r in rows if r.get("presize_basis")), None)
        if sized is not None:
            self.notes.append(
                f"presized: shorter side {sized['presize']} px ({sized['presize_basis']}); the "
                "transforms then have less to do, and the detail above that size is gone"
            )
        f = self.fetch
        if f is not None:
            layout = any(r.get("layout") for r in rows)
            self.notes.append(
                f"the load fetches over the network: {f['requests_per_sample']:g} "
                f"request{'' if f['requests_per_sample'] == 1 else 's'} a sample, "
                f"{f['latency_ms']:.1f} ms waiting for the first byte and {f['read_ms']:.1f} ms "
                "reading the body, a sample"
                + ("; 'objects of N samples' (shards of that size) and 'N requests in flight' "
                   "(a worker's pool) share that wait, the bytes and their reading unchanged"
                   if layout else
                   "; the wait for the first byte is under half of it: no layout rows")
            )
        self.notes.append("PSNR: the worst sample's, against the samples as decoded now")
        if cur.reader is None:
            self.notes.append(
                "the current read could not be told apart from the rest of __getitem__: each "
                "encoding's read replaces the whole load"
            )
        self.notes.append("reads are timed from the page cache (warm); HDF5 files written here "
                          "are read without a chunk cache, as random reads over a large file "
                          "are")  # fmt: skip

    @property
    def best(self) -> dict[str, Any]:
        """The fastest encoding by the model and what it costs: ``encoding``, ``text``."""
        ok = [r for r in self.rows if r.get("applicable") and r["predicted_samples_per_s"]]
        top = max(ok, key=lambda r: r["predicted_samples_per_s"])
        cur = self.rows[0]
        if top is cur or top["predicted_samples_per_s"] < WORTH * cur["predicted_samples_per_s"]:
            return {"encoding": cur["encoding"], "text": f"keep {cur['encoding']}: no encoding is "
                    f"predicted {WORTH - 1:.0%} faster at {self.workers} workers "
                    f"(limit: {cur['limit']})"}  # fmt: skip
        size = top.get("size_vs_current")
        disk = f"{size:.2f}× the bytes on disk" if size else "bytes on disk unknown"
        text = (f"{top['encoding']}: {top['predicted_samples_per_s']:.0f} samples/s at "
                f"{self.workers} workers, {top['speedup']:.2f}× the current; {disk}; "
                f"{top['quality']}")  # fmt: skip
        return {"encoding": top["encoding"], "text": text}

    def _data_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "config": self.config,
            "workers": self.workers,
            "rows": self.rows,
            "best": self.best,
            "anchor": self.anchor,
            "fetch": self.fetch,
            "notes": [*self.bench.notes, *self.notes],
        }

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The table as ``text``, ``json`` or ``html``.

        Args:
            fmt: ``"text"``, ``"json"`` or ``"html"``.
            **options: ``width`` (columns, default 120) and ``fragment`` (HTML without the
                page around it, default False); ``json`` ignores them.

        Returns:
            The rendered table as a string.

        Raises:
            ValueError: ``fmt`` is none of the three.
            TypeError: an option not named here.
        """
        from pipeprof.render.encodings import render

        return render(self.to_dict(), fmt, **options)

    def _renderables(self) -> Any:
        from pipeprof.render.encodings import renderables

        return renderables(self.to_dict())

    def predict(self, encoding: str, workers: int | None = None) -> float:
        """Predicted samples/s with ``encoding`` (a row's name) at ``workers``.

        Args:
            encoding: a row's ``encoding`` name, such as the current one or ``best["encoding"]``.
            workers: the worker count; None: the benchmark's (the row's own figure). At another
                count, the model's rate there times the same anchor factor (measured ÷
                modelled at the benchmark's count).

        Returns:
            The predicted samples/s.

        Raises:
            KeyError: ``encoding`` names no row, or a row that is not applicable.
        """
        row = next((r for r in self.rows if r["encoding"] == encoding), None)
        if row is None or not row.get("applicable"):
            names = ", ".join(r["encoding"] for r in self.rows if r.get("applicable"))
            raise KeyError(f"no applicable encoding {encoding!r}; these are: {names}")
        if workers is None or workers == self.workers:
            return float(row["predicted_samples_per_s"])
        factor = self.anchor.get("factor") or 1.0
        return float(whatif.throughput(self.models[encoding], workers)) * factor

    def __repr__(self) -> str:
        return f"<pipeprof.Encodings {len(self.rows)} encodings, best: {self.best['encoding']}>"
