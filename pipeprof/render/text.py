"""The terminal summary: small rich renderables, never wider than 80 columns.

``summary(data)`` yields the renderables of a report dictionary; ``Report.__rich_console__`` shows
them, so ``print(report)`` in a terminal is in colour and piped output is plain text. Colour
follows rich: none when the output is not a terminal or when ``NO_COLOR`` is set.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.constrain import Constrain
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pipeprof.render.base import Renderer
from pipeprof.render.figures import (
    FETCH_COLUMNS,
    H5_COLUMNS,
    SEVERITY_STYLE,
    STEP_PARTS,
    balance,
    comm_line,
    coverage,
    fetch_table,
    gpu_devices,
    gpu_util_line,
    h5_epochs,
    h5_table,
    headline,
    limiting_stages,
    loader_phrase,
    loop_view,
    num,
    overhead_line,
    padding_line,
    pct,
    sampling_line,
    tokenizer_line,
    top_total,
    util,
    visible,
    wait_split,
)

MAX_WIDTH = 80
BAR_WIDTH = 12
PART_STYLE = {"wait": "red", "transfer": "magenta", "compute": "green", "comm": "cyan",
              "overhead": "blue"}  # fmt: skip


def bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    """A bar of ``width`` cells at most, in half-cell steps."""
    if fraction is None:
        return ""
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    return "█" * full + ("▌" if cells - full >= 0.5 else "")


def table(title: str) -> Table:
    """A titled table in the summary's style."""
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        expand=False,
    )


def verdict_panel(data: dict[str, Any]) -> RenderableType:
    v = data.get("verdict") or {}
    style = SEVERITY_STYLE.get(v.get("severity", "info"), "")
    title = f"pipeprof · {data.get('mode', 'loader')} · {data.get('framework', 'torch')}"
    if data.get("interrupted"):
        title += " · interrupted, partial"
    body = Text(headline(data), style=style)
    if v.get("note"):
        body.append(f"\n{v['note']}", style="dim")
    return Panel(body, title=title, title_align="left", box=box.ROUNDED)


def overview(data: dict[str, Any]) -> RenderableType:
    tp, steady, lat = data["throughput"], data.get("steady") or {}, data.get("latency") or {}
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim", no_wrap=True)
    t.add_column()
    loop = data.get("loop")
    if loop:
        covers = coverage(data)
        t.add_row(
            "steps",
            f"{loop.get('steps', 0)} ({data['samples']} samples) in "
            f"{data['wall_s']:.2f} s, {loop.get('epochs') or 1} epoch(s)"
            + (f"; the report {covers}" if covers else ""),
        )
        lt = loop.get("throughput") or {}
        t.add_row("throughput", f"{num(lt.get('effective_samples_per_s'))} samples/s")
        if lt.get("speedup_if_data_free"):
            src = "replay" if lt.get("replay_compute_samples_per_s") else "measured compute"
            free = lt.get("replay_compute_samples_per_s") or lt.get("compute_samples_per_s")
            t.add_row(
                "data free", f"{num(free)} samples/s ({src}), ×{lt['speedup_if_data_free']:.2f}"
            )
        sm = loop.get("step_ms") or {}
        t.add_row(
            "step",
            f"mean {num(sm.get('mean_ms'))} ms, p50 {num(sm.get('p50_ms'))}, "
            f"p95 {num(sm.get('p95_ms'))}, p99 {num(sm.get('p99_ms'))}",
        )
        t.add_row("start-up", f"{num(loop.get('startup_s'), ' s')} waiting for the first batch")
        if (split := wait_split(data)) is not None:
            t.add_row("the wait", split)
    else:
        t.add_row(
            "batches", f"{data['batches']} ({data['samples']} samples) in {data['wall_s']:.2f} s"
        )
        t.add_row(
            "throughput",
            f"{num(tp.get('samples_per_s'))} samples/s overall, "
            f"{num(steady.get('samples_per_s'))} steady",
        )
        t.add_row("start-up", f"{num(data.get('startup_s'), ' s')} to the first batch")
        t.add_row(
            "wait/batch",
            f"p50 {num(lat.get('p50_ms'))} ms, p95 {num(lat.get('p95_ms'))}"
            f" ms, p99 {num(lat.get('p99_ms'))} ms",
        )
        if (split := wait_split(data)) is not None:
            t.add_row("the wait", split)
    meta = data.get("meta") or {}
    if "num_workers" in meta:
        t.add_row(
            "loader",
            f"{loader_phrase(meta)}, "
            f"pin_memory={meta.get('pin_memory')}",
        )
    return t


def steptable(loop: dict[str, Any]) -> RenderableType:
    """Where the loop's time goes: wait, transfer, compute and other regions."""
    view, label = loop_view(loop)
    steps = max(1, view.get("steps") or loop.get("steps") or 1)
    t = table(f"step time ({label})")
    t.add_column("part", no_wrap=True)
    t.add_column("ms/step", justify="right")
    t.add_column("share", justify="right")
    t.add_column("all steps", justify="right")
    t.add_column("", no_wrap=True, width=20)
    for key, name in STEP_PARTS:
        seconds = view.get(f"{key}_s")
        if seconds is None or (key == "comm" and not seconds):
            continue
        frac = view.get(f"{key}_fraction")
        t.add_row(
            Text(name, style=PART_STYLE[key]),
            num(seconds * 1e3 / steps),
            pct(frac),
            pct(loop.get(f"{key}_fraction")),
            Text(bar(frac, 20), style=PART_STYLE[key]),
        )
    return t


def regiontable(loop: dict[str, Any]) -> RenderableType | None:
    regions = loop.get("regions") or {}
    if not regions:
        return None
    t = table("regions")
    t.add_column("region", no_wrap=True, max_width=24)
    for col in ("calls", "total s", "mean ms", "p95 ms", "max ms"):
        t.add_column(col, justify="right")
    for name, r in regions.items():
        t.add_row(
            Text(name),  # a user's name: never read as markup
            str(r.get("count", 0)),
            num(r.get("total_s")),
            num(r.get("mean_ms")),
            num(r.get("p95_ms")),
            num(r.get("max_ms")),
        )
    return t


def stagetable(data: dict[str, Any]) -> RenderableType | None:
    stages = data.get("stages") or {}
    if not stages:
        return None
    t = table("pipeline stages (time summed over workers)")
    t.add_column("stage", no_wrap=True, max_width=28, overflow="ellipsis")
    t.add_column("ms/sample", justify="right")
    t.add_column("ms/batch", justify="right")
    t.add_column("share", justify="right")
    t.add_column("p95 ms", justify="right")
    t.add_column("", no_wrap=True, width=BAR_WIDTH)
    total = top_total(stages) or 1.0
    limiting = limiting_stages(data)
    for path, row in stages.items():
        name = Text("  " * path.count("/") + path.rsplit("/", 1)[-1])
        if path in limiting:
            name.stylize("bold")
        share = row["total_s"] / total
        t.add_row(
            name,
            num(row.get("per_sample_ms")),
            num(row.get("per_batch_ms")),
            pct(share),
            num(row.get("p95_ms")),
            bar(share),
        )
    lines = [x for x in (sampling_line(data), padding_line(data), tokenizer_line(data)) if x]
    return Group(t, Text("\n".join(lines), style="dim")) if lines else t


def h5table(data: dict[str, Any]) -> RenderableType | None:
    rows = h5_table(data)
    if not rows:
        return None
    t = table("HDF5 reads (h5py, all processes)")
    for col in H5_COLUMNS:
        first = col == H5_COLUMNS[0]
        t.add_column(col, justify="left" if first else "right", no_wrap=not first,
                     min_width=10 if first else None, overflow="fold")  # fmt: skip
    for cells in rows:
        t.add_row(*cells)
    epochs = h5_epochs(data)
    return Group(t, Text("\n".join(epochs), style="dim")) if epochs else t


def fetchtable(data: dict[str, Any]) -> RenderableType | None:
    rows = fetch_table(data)
    if not rows:
        return None
    t = table("network reads (HTTP, all processes): load/fetch")
    for col in FETCH_COLUMNS:
        t.add_column(col, justify="left" if col == "host" else "right", no_wrap=True)
    for cells in rows:
        t.add_row(*cells)
    return t


def workertable(data: dict[str, Any]) -> RenderableType | None:
    rows = data.get("workers") or []
    if not rows:
        return None
    ratio = balance(data)
    title = "processes" + (f" (busiest worker {ratio:.2f}× the mean)" if ratio else "")
    t = table(title)
    shards = any(w.get("shards") is not None for w in rows)  # a WebDataset's shards opened
    cols = ("process", "pid", "batches", "samples", *(("shards",) if shards else ()), "busy s",
            "samples/s", "busy", "")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "process" else "right", no_wrap=True)
    total = sum(w.get("samples") or 0 for w in rows) or 1
    for w in rows:
        samples = w.get("samples") or 0
        t.add_row(
            str(w.get("track")),
            str(w.get("pid")),
            str(w.get("batches")),
            f"{samples:,} ({samples / total:.0%})" if len(rows) > 1 else f"{samples:,}",
            *((str(w.get("shards")),) if shards else ()),
            num(w.get("busy_s")),
            num(w.get("samples_per_busy_s")),
            pct(w.get("busy_fraction")),
            bar(w.get("busy_fraction"), 10),
        )
    line = first_shards_line(rows) if shards else None
    return t if line is None else Group(t, Text(line))


def first_shards_line(rows: list[dict[str, Any]]) -> str | None:
    """When each worker of a stream opened its first shard and had its first batch ready,
    from the pass's ``iter()`` (NOTE [ Shards a worker opened ] in collect/torch/dataset.py)."""
    said = []
    for w in rows:
        shard, batch = w.get("first_shard_s"), w.get("first_batch_s")
        if shard is None and batch is None:
            continue
        said.append(f"{w.get('track')} {'none' if shard is None else num(shard)} / "
                    f"{'—' if batch is None else num(batch)}")  # fmt: skip
    if not said:
        return None
    return "  first shard opened / first batch ready, s after iter(): " + ", ".join(said)


def private_memory_line(procs: list[dict[str, Any]]) -> str | None:
    """The processes' private memory (USS) at its most, where it was read (NOTE [ Private
    memory ] in collect/samplers/host.py)."""
    said = []
    main = [p for p in procs if p.get("role") == "main" and p.get("uss_max_mb") is not None]
    if main:
        said.append(f"main {num(main[0]['uss_max_mb'])} MB (RSS {num(main[0]['rss_max_mb'])})")
    kids = [p["uss_max_mb"] for p in procs
            if p.get("role") == "child" and p.get("uss_max_mb") is not None]  # fmt: skip
    if kids:
        if len(kids) == 1:
            said.append(f"1 child {num(kids[0])} MB")
        else:
            said.append(f"{len(kids)} children {num(min(kids))}-{num(max(kids))} MB each")
    return f"  private memory (USS) at most: {'; '.join(said)}" if said else None


def utilisation(data: dict[str, Any]) -> RenderableType | None:
    lines: list[str] = []
    gpu, loop = data.get("gpu"), data.get("loop") or {}
    for d in gpu_devices(data):
        mem = f"{num(d.get('mem_used_max_mb'))} of {num(d.get('mem_total_mb'))} MB"
        lines.append(
            f"GPU {d.get('index')} {d.get('name') or ''}: {util(d.get('util_mean'))} "
            f"mean, p50 {util(d.get('util_p50'))}; memory max {mem}"
        )
    if gpu and not gpu_devices(data):
        lines.append(f"GPU: n/a ({gpu.get('note') or 'not sampled'})")
    if (line := gpu_util_line(loop)) is not None:
        lines.append(line)
    idle = loop.get("idle_while_waiting_fraction")
    if idle is not None:
        lines.append(f"GPU idle waiting for data: {pct(idle)} of the loop's time")
    host = data.get("host")
    if host:
        lines.append(
            f"CPU: {util(host.get('cpu_util_mean'))} mean of {host.get('cpu_count')} "
            f"cores, {num(host.get('saturated_cores_mean'))} saturated"
        )
        procs = host.get("per_process") or []
        main = [p for p in procs if p.get("role") == "main"]
        kids = [p["cpu_mean"] for p in procs if p.get("role") == "child" and p.get("cpu_mean")]
        if main:
            text = f"  main process {util(main[0].get('cpu_mean'))} of a core"
            if kids:
                text += f"; {len(kids)} children {util(sum(kids) / len(kids))} each"
            lines.append(text)
        if (line := private_memory_line(procs)) is not None:
            lines.append(line)
    scaling = (data.get("meta") or {}).get("core_scaling") or {}
    if isinstance(scaling.get("per_process"), (int, float)) and scaling["per_process"] < 0.95:
        lines.append(  # NOTE [ Cores are not all equal ]: what the what-ifs assumed
            f"cores: all {scaling.get('cores')} busy, each does {pct(scaling['per_process'])} of "
            f"a lone core's work: the what-ifs count {num(scaling.get('effective_cores'))}"
        )
    if not lines:
        return None
    return Group(Text("utilisation", style="bold"), Text("\n".join(lines)))


def finding_list(data: dict[str, Any]) -> RenderableType | None:
    found = data.get("findings") or []
    if not found:
        return None
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for f in found:
        style = SEVERITY_STYLE.get(f.get("severity", "info"), "")
        text = Text(f.get("message", ""), style=style)
        text.append("\nfix: ", style="bold")
        text.append(str(f.get("fix", "")))
        grid.add_row(Text("●", style=style), text)
    return Group(Text("findings", style="bold"), grid)


def what_if_line(data: dict[str, Any]) -> RenderableType | None:
    rows = [w for w in data.get("what_if") or [] if w.get("kind") == "workers"]
    if not rows:
        return None
    parts = ", ".join(
        f"{w['workers']} → {num(w.get('samples_per_s'))}"
        + (f" (measured {num(w['measured_samples_per_s'])})" if w.get("measured_samples_per_s")
           else "")  # a training loop's row for the workers it ran with
        + (f" (not in {w['exceeds']})" if w.get("exceeds") else "")
        + (" (idle past the shards)" if w.get("limit") == "shards" else "")
        for w in rows
    )  # fmt: skip
    measured = "CPU share" in (rows[0].get("basis") or "")
    basis = "estimated" if measured else "estimated as if every stage were CPU-bound"
    if "loader_samples_per_s" not in rows[0]:
        return Text(f"what if (workers → samples/s, {basis}): {parts}", style="dim")
    alone = ", ".join(f"{w['workers']} → {num(w.get('loader_samples_per_s'))}" for w in rows)
    return Text(
        f"what if (workers → the loop's samples/s, {basis}): {parts}; the loader alone: {alone}",
        style="dim",
    )


def objects_line(data: dict[str, Any]) -> RenderableType | None:
    """The loader with larger objects a request, or more requests in flight, where its fetch is
    latency-bound (``what_if`` rows of kinds ``objects`` and ``in_flight``: docs/streaming.md)."""
    rows = [w for w in data.get("what_if") or [] if w.get("kind") == "objects"]
    if not rows:
        return None
    first = rows[0]
    parts = ", ".join(f"{w['samples_per_request']} → {num(w['samples_per_s'])}" for w in rows)
    said = (
        f"what if (samples a request → the loader's samples/s, {first['workers']} workers, "
        f"estimated): now {first['now_samples_per_request']:g} → "
        f"{num(first['now_samples_per_s'])}, {parts}"
    )
    flying = [w for w in data.get("what_if") or [] if w.get("kind") == "in_flight"]
    if flying:
        said += "; requests in flight a worker (a thread pool in __getitems__): " + ", ".join(
            f"{w['requests_in_flight']} → {num(w['samples_per_s'])}" for w in flying
        )
    return Text(said, style="dim")


def footer(data: dict[str, Any]) -> RenderableType:
    lines = [overhead_line(data)]
    lines += [f"note: {n}" for n in data.get("notes") or []]
    return Text("\n".join(lines), style="dim")


def parts(data: dict[str, Any]) -> Iterator[RenderableType]:
    """The sections of the summary, top to bottom."""
    data = visible(data)
    yield verdict_panel(data)
    yield overview(data)
    loop = data.get("loop")
    sections: list[RenderableType | None] = []
    if loop:
        comm = comm_line(data)
        sections += [steptable(loop), Text(comm, style="dim") if comm else None, regiontable(loop)]
    sections += [
        stagetable(data),
        h5table(data),
        fetchtable(data),
        workertable(data),
        utilisation(data),
        finding_list(data),
        what_if_line(data),
        objects_line(data),
    ]
    for section in sections:
        if section is not None:
            yield Text("")
            yield section
    yield Text("")
    yield footer(data)


def summary(data: dict[str, Any]) -> Iterator[RenderableType]:
    """The terminal summary of a report dictionary, constrained to 80 columns."""
    yield Constrain(Group(*parts(data)), width=MAX_WIDTH)


def to_text(
    renderables: Iterable[RenderableType], width: int = MAX_WIDTH, color: bool = False
) -> str:
    """Renderables as a string, lines right-stripped: plain unless ``color`` (and ``NO_COLOR``
    unset). Never displays anything itself, not even inside Jupyter."""
    color = color and not os.environ.get("NO_COLOR")
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=color,
        force_jupyter=False,
        no_color=not color,
        color_system="standard" if color else None,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )
    console.print(*renderables)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


class TextRenderer(Renderer):
    """The rich summary as text, ``width`` columns (default 80).

    Plain text unless ``color``; ``NO_COLOR`` in the environment turns colour off regardless.
    """

    output_file_extension = ".txt"

    def __init__(self, width: int = MAX_WIDTH, color: bool = False) -> None:
        self.width = width
        self.color = color

    def render_dict(self, data: dict[str, Any]) -> str:
        return to_text([Group(*parts(data))], self.width, self.color)
