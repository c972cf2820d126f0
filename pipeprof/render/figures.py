"""Figures every renderer shows the same way: number formats, severities, derived series.

Renderers read the report dictionary (schema ``pipeprof/1``); these helpers only pick and format
what is there. n/a (``None``) stays "n/a", never 0.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from pipeprof.core.units import num, pct

if TYPE_CHECKING:
    from pipeprof.core.session import Session

__all__ = ["num", "pct"]  # re-exported: renderers import number formats from here

#: rich styles of verdict severities (high/moderate/low) and finding severities.
SEVERITY_STYLE = {
    "critical": "bold red",
    "high": "bold red",
    "warning": "yellow",
    "moderate": "yellow",
    "info": "cyan",
    "low": "green",
}
#: step parts of the loop, in the order they happen, with their display names.
STEP_PARTS = (
    ("wait", "wait"),
    ("transfer", "transfer"),
    ("compute", "compute"),
    ("comm", "comm"),  # shown only where there was some (a distributed job)
    ("overhead", "other"),
)
BATCH_ROWS = 2000  # batches kept for the loader-mode wait chart
_TOP = {"load": 0, "transform": 1, "collate": 2, "transfer": 3}


def comm_line(data: dict[str, Any]) -> str | None:
    """DDP's all-reduce per step, in flight, overlapped with backward and exposed, in the GPU's
    view where there is one (NOTE [ Comm ] in collect/comm.py); None without DDP's hook."""
    comm = (data.get("meta") or {}).get("comm") or {}
    steps = (data.get("loop") or {}).get("steps")
    if not comm.get("buckets") or not steps:
        return None
    view, seen = (comm["gpu"], "the GPU's view") if comm.get("gpu") else (comm, "the host's view")
    per = {k: view[f"{k}_s"] * 1e3 / steps for k in ("in_flight", "overlapped", "exposed")}
    return (
        f"DDP all-reduce ({comm.get('hook') or 'hook'}, {seen}): {comm['buckets'] / steps:.3g} "
        f"buckets/step, {num(per['in_flight'])} ms/step in flight, {num(per['overlapped'])} "
        f"overlapped with backward, {num(per['exposed'])} exposed (comm)"
    )


# C0 controls but tab, DEL and the C1 controls: shown as \x1b, never passed through (a line
# feed in a name would forge a table line). Direction and invisible formatting characters
# (U+202E reverses what follows, in text and HTML) as \u202e.
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0)]}
_CONTROLS.update({c: f"\\u{c:04x}" for c in [*range(0x200B, 0x2010), *range(0x2028, 0x202F),
                                              *range(0x2060, 0x206A), 0xFEFF]})  # fmt: skip
SHOWN_CHARS = 2000  # a string longer than this (a 100 MB note) is cut when drawn


def evidence_items(evidence: dict[str, Any] | None) -> list[tuple[str, str]]:
    """A finding's evidence as people read it: the key in words (``ms_per_step`` →
    ``ms per step``), numbers to about three significant digits (``num``), lists and mappings
    flattened, booleans as yes/no, None as n/a."""

    def text(v: Any) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, int):
            return f"{v:,}"
        if isinstance(v, float) or v is None:
            return num(v)
        if isinstance(v, dict):
            return ", ".join(f"{k}: {text(x)}" for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return ", ".join(text(x) for x in v)
        return str(v)

    return [(str(k).replace("_", " "), text(v)) for k, v in (evidence or {}).items()]


def visible(value: Any) -> Any:
    """``value`` with control, direction and invisible characters in every string (keys too)
    shown as escapes (``\\x1b``, ``\\x0a``, ``\\u202e``) and strings cut at ``SHOWN_CHARS``:
    names from user code or a report file cannot drive the terminal (a title, the clipboard,
    hidden text), forge a line, reverse the page's text or take minutes to draw. Renderers
    call it on the data they are given."""
    if isinstance(value, str):
        if len(value) > SHOWN_CHARS:
            value = f"{value[:SHOWN_CHARS]}… ({len(value) - SHOWN_CHARS:,} characters more)"
        return value.translate(_CONTROLS)
    if isinstance(value, dict):
        return {visible(k): visible(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [visible(v) for v in value]
    return value


def util(value: Any) -> str:
    """A utilisation that is already in percent."""
    return "n/a" if value is None else f"{float(value):.0f}%"


def gpu_util_line(loop: dict[str, Any], utilisation: str = "util") -> str | None:
    """The GPU's utilisation while the loop waited in ``next()`` and while it computed; where
    CUDA events moved some of that wait to compute, the line says the kernels ran on through it
    (a high figure while "waiting" is then no contradiction)."""
    if loop.get("gpu_util_waiting") is None and loop.get("gpu_util_computing") is None:
        return None
    line = (
        f"GPU {utilisation} while waiting for data {util(loop.get('gpu_util_waiting'))}, "
        f"while computing {util(loop.get('gpu_util_computing'))}"
    )
    moved = loop.get("wait_moved_to_gpu_compute_s") or 0.0
    if moved > 0:
        line += (
            f" (its kernels ran on through {num(moved)} s of the loop's wait, counted as "
            "compute)"
        )
    return line


def is_loop(data: dict[str, Any]) -> bool:
    return bool(data.get("loop"))


def loop_view(loop: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The figures the verdict read (the report's ``loop["view"]``) and how to label them."""
    steady = loop.get("steady") or {}
    if loop.get("view") == "steady":
        return steady, f"steady state, {steady['steps']} steps"
    return loop, f"all {loop.get('steps', 0)} steps"


def wait_split(data: dict[str, Any]) -> str | None:
    """The wait explained in one line: starved (the batch was not ready) vs hand-over (it was,
    and was being moved to the training process), per step or batch; None when not known."""
    loop, wait = data.get("loop"), data.get("wait") or {}
    mb = wait.get("batch_mb")
    size = f", {_size(mb)} per batch" if mb else ""
    if loop:
        if not loop.get("wait_split_known"):
            return None
        view, _ = loop_view(loop)
        steps = max(1, view.get("steps") or loop.get("steps") or 1)
        starved, handover = view.get("starved_s"), view.get("handover_s")
        if starved is None or handover is None or not (starved or handover):
            return None
        return (
            f"starved {num(starved * 1e3 / steps)} ms/step (batch not ready), hand-over "
            f"{num(handover * 1e3 / steps)} ms/step (ready, being moved){size}"
        )
    if not wait.get("split_known") or not wait.get("batches"):
        return None
    return (
        f"starved {num(wait.get('starved_ms_per_batch'))} ms/batch (batch not ready), hand-over "
        f"{num(wait.get('handover_ms_per_batch'))} ms/batch (ready, being moved){size}"
    )


def coverage(data: dict[str, Any]) -> str | None:
    """ "covers 6 of 16 steps" when the loop report covers fewer steps than the loop ran (Keras'
    trace window), else None."""
    loop = data.get("loop") or {}
    total, steps = loop.get("steps_total"), loop.get("steps")
    if not total or steps is None or steps >= total:
        return None
    return f"covers {steps} of {total} steps"


def workers_phrase(meta: dict[str, Any]) -> str:
    """``2 workers (fork)``, ``1 worker (spawn)``, or ``no workers (loading in the main
    process)``."""
    n = int(meta.get("num_workers") or 0)
    if not n:
        return "no workers (loading in the main process)"
    how = meta.get("multiprocessing_context") or "default"
    return f"{n} worker{'s' if n != 1 else ''} ({how})"


def loader_phrase(meta: dict[str, Any]) -> str:
    """``2 workers (fork), batch 16``; the batch size left out where the loader has none it
    knows (``batch_size=None``: a batch sampler, or batches made by the dataset)."""
    size = meta.get("batch_size")
    return workers_phrase(meta) + (f", batch {size}" if size is not None else "")


def _size(mb: float) -> str:
    return f"{num(mb)} MB" if mb >= 1 else f"{num(mb * 1e3)} kB"


def sampling_line(data: dict[str, Any]) -> str | None:
    """How many samples the loader's stages were timed on, when a sample of the batches was
    (NOTE [ Unprofiled batches ] in collect/torch/loader.py), else None."""
    meta = data.get("meta") or {}
    every = meta.get("stage_every")
    ab = (data.get("overhead") or {}).get("unprofiled_batches") or {}
    off, samples = ab.get("unprofiled_samples") or 0, data.get("samples") or 0
    if not every or not off or not samples:
        return None
    timed, first = meta.get("timed_batches"), meta.get("timed_first")
    rule = f"the first {first}, then 1 in {every}" if first else f"1 in {every}"
    if (data.get("batches") or 0) > meta.get("stage_every_from", 1e18):  # in-process, later
        rule += f" to batch {meta['stage_every_from']}, then 1 in {meta['stage_every_later']}"
    where = f"{timed:,} of {data.get('batches') or 0:,} batches ({rule})" if timed else ""
    where = where or f"1 batch in {every}"  # a report from before the count
    return (
        f"stages timed in {where}: {samples - off:,} of {samples:,} samples; the "
        "other batches ran unprofiled, and each stage's total and share are scaled to every "
        "sample (stage_every=1 times every batch)"
    )


def overhead_line(data: dict[str, Any]) -> str:
    """pipeprof's own cost as the report states it (``overhead``; docs/validation/overhead.md)."""
    o = data.get("overhead") or {}
    of = "of the CPU the run used" if o.get("basis") == "cpu" else "of measured time"
    ab = o.get("unprofiled_batches") or {}
    off = ab.get("batches", [0, 0])[1]
    where = " in the workers" if ab.get("in") == "workers" else ""
    if ab.get("used"):  # measured against batches fetched unprofiled: packing and probes in it
        parts = [
            f"{o.get('events', 0):,} timed regions at {num(ab['per_sample_ns'] / 1e3)} µs a sample"
            f" ± {num(ab['stderr_ns'] / 1e3)}, against {off} batches fetched unprofiled{where}"
        ]
    elif o.get("in_situ_ns") is not None:  # packing is counted apart, as measured
        each = o.get("region_ns") or o["in_situ_ns"]
        parts = [f"{o.get('events', 0):,} timed regions at {num(each)} ns in situ"]
        if o.get("displaced_ns"):
            parts[0] += f" + {num(o['displaced_ns'])} ns displaced from the code around them"
        if o.get("pack_s"):
            parts.append(f"packing records {num(o['pack_s'] * 1e3)} ms")
    else:  # the calibrated cost holds the packing
        parts = [f"{o.get('events', 0):,} timed regions at {num(o.get('per_event_ns'))} ns"]
    if off and not ab.get("used"):  # why the stages count fewer samples than the run had
        if ab.get("per_sample_ns") is None:
            on = ab.get("batches", [0, 0])[0]
            parts.append(
                f"{off} batches fetched unprofiled{where} against {on} profiled, too few to compare"
            )
        else:
            parts.append(
                f"{off} batches fetched unprofiled{where}: "
                f"{num(ab['per_sample_ns'] / 1e3)} ± {num(ab['stderr_ns'] / 1e3)} µs a sample "
                "against them, not above its error"
            )
    for key, what in (("main_s", "bookkeeping in next()"), ("loop_s", "between steps"),
                      ("step_regions_s", "the step's Forward/Backward/Optimizer regions"),
                      ("control_s", "start and stop"),
                      ("settle_s", "folding records"),
                      ("sampler_s", "samplers"), ("setup_s", "set-up"),
                      ("snapshot_s", "snapshots")):  # fmt: skip
        if o.get(key):
            parts.append(f"{what} {num(o[key] * 1e3)} ms")
    return f"pipeprof's own work ≈ {pct(o.get('estimated_fraction'), 2)} {of} ({', '.join(parts)})"


H5_COLUMNS = ("dataset", "reads", "ms each", "chunk", "read", "chunks", "decoded")


def h5_table(data: dict[str, Any]) -> list[list[str]]:
    """The rows of the HDF5 section, one per h5py dataset read (``report["hdf5"]``), as text
    cells in ``H5_COLUMNS`` order; n/a where a figure cannot be known (the row's ``note``).
    "chunk" is the chunk shape and filter, "read" a read's mean shape, "chunks" the chunks a read
    touches, "decoded" the bytes decompressed per byte returned (docs/hdf5.md)."""

    def shape(v: Any) -> str:
        return "×".join(str(x) for x in v) if v else "n/a"

    rows = []
    for r in data.get("hdf5") or []:
        name = f"{os.path.basename(str(r.get('file') or ''))}:{r.get('dataset')}"
        amp = r.get("decoded_amplification")
        rows.append([
            name,
            f"{r.get('reads', 0):,}",
            num(r.get("read_ms_mean")),
            f"{shape(r.get('chunks'))} {r.get('filter') or 'none'}"
            if r.get("kind") == "chunked"
            else str(r.get("kind")),
            shape(r.get("read_shape")),
            num(r.get("chunks_per_read")),
            "n/a" if amp is None else f"×{num(amp)}",
        ])  # fmt: skip
    return rows


FETCH_COLUMNS = ("host", "requests", "latency ms", "p50 ≤", "p95 ≤", "MB", "MB/s a read")


def fetch_table(data: dict[str, Any]) -> list[list[str]]:
    """The rows of the network section, one per host (``report["fetch"]``), as text cells in
    ``FETCH_COLUMNS`` order: the mean latency (request to headers), the histogram bucket that
    holds its median and 95th percentile, the bodies' MB and the rate a body came at."""
    return [
        [
            str(r.get("host")),
            f"{r.get('requests', 0):,}",
            num(r.get("latency_ms_mean")),
            num(r.get("latency_ms_p50")),
            num(r.get("latency_ms_p95")),
            num((r.get("bytes") or 0) / 1e6),
            num(r.get("read_mb_s")),
        ]
        for r in data.get("fetch") or []
    ]


def padding_line(data: dict[str, Any]) -> str | None:
    """The token batches' padding (NOTE [ Padding ] in analyze/tokens.py), or None."""
    t = data.get("tokens")
    if not t or t.get("padding_share") is None:
        return None
    return (
        f"padding: {pct(t['padding_share'])} of the tokens are pad tokens "
        f"({t['pad_tokens']:,} of {t['tokens']:,}, attention masks of {t['batches']:,} batches)"
    )


def tokenizer_line(data: dict[str, Any]) -> str | None:
    """The tokenizer's calls in the pipeline (NOTE [ Tokenizer calls ] in
    collect/tokenizer.py), or None."""
    tok = (data.get("tokens") or {}).get("tokenizer")
    if not tok:
        return None
    gil = {
        True: "a fast tokenizer: it encodes with the GIL released",
        False: "a Python tokenizer: it holds the GIL, so only worker processes run it in parallel",
        None: "fast and Python tokenizers both",
    }[tok["releases_gil"]]
    return (
        f"tokenizer: {tok['calls']:,} calls, {tok['texts'] / tok['calls']:.3g} texts and "
        f"{tok['ms_per_call']:.3g} ms a call ({tok['ms_per_text']:.3g} ms a text); {gil}"
    )


def h5_epochs(data: dict[str, Any]) -> list[str]:
    """A line per h5py dataset read in several epochs: the first epoch's ms per read against
    later epochs' (a cold cache shows as a slower first epoch)."""
    return [
        f"{os.path.basename(str(r.get('file') or ''))}:{r.get('dataset')}: "
        f"first epoch {num(r['first_epoch_read_ms'])} ms a read, later epochs "
        f"{num(r['later_read_ms'])} ms"
        for r in data.get("hdf5") or []
        if r.get("first_epoch_read_ms") is not None
    ]


def top_total(stages: dict[str, dict[str, Any]]) -> float:
    """Seconds of all top-level stages together: the pipeline's time."""
    return sum(r["total_s"] for p, r in stages.items() if "/" not in p) or 0.0


def family(path: str) -> int:
    """The index of a stage's top-level family (load, transform, collate, transfer, other)."""
    return _TOP.get(path.split("/", 1)[0], 4)


def headline(data: dict[str, Any]) -> str:
    v = data.get("verdict") or {}
    return str(v.get("headline") or v.get("kind") or "no verdict")


def limiting_stages(data: dict[str, Any]) -> list[str]:
    """The stages the verdict names: ``verdict.stages``, or its ``stage`` in older files."""
    v = data.get("verdict") or {}
    return list(v.get("stages") or ([v["stage"]] if v.get("stage") else []))


def gpu_devices(data: dict[str, Any]) -> list[dict[str, Any]]:
    return list((data.get("gpu") or {}).get("devices") or [])


def workers_only(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [w for w in data.get("workers") or [] if str(w.get("track", "")).startswith("worker")]


def balance(data: dict[str, Any]) -> float | None:
    """Busiest worker's busy time over the mean worker's (1.0: perfectly even)."""
    ws = [float(w["busy_s"]) for w in workers_only(data) if w.get("busy_s")]
    if len(ws) < 2:
        return None
    return max(ws) / (sum(ws) / len(ws))


def batch_waits(session: Session | None) -> list[list[float]] | None:
    """Loader mode: ``[start_s, wait_ms]`` per recent batch, seconds from the profile start."""
    if session is None or not session.batch_ring:
        return None
    ring = list(session.batch_ring)
    stride = max(1, -(-len(ring) // BATCH_ROWS))
    t0 = session.start_ns
    return [[round((r[2] - r[3] - t0) / 1e9, 6), round(r[3] / 1e6, 4)] for r in ring[::stride]]


def wait_periods(data: dict[str, Any]) -> list[tuple[float, float]]:
    """``(start_s, end_s)`` of the times the loop waited for data, merged where they touch."""
    tl = data.get("timeline") or {}
    rows = [(r[0], r[0] + r[1] / 1e3) for r in tl.get("steps") or [] if r[1]]
    if not rows:
        rows = [(r[0], r[0] + r[1] / 1e3) for r in data.get("batch_waits") or [] if r[1]]
    merged: list[tuple[float, float]] = []
    for start, end in sorted(rows):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
