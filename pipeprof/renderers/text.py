"""The terminal summary: small rich renderables, 80 columns wide at most."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pipeprof.renderers.base import Renderer

if TYPE_CHECKING:
    from pipeprof.report import Report

_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
BAR_WIDTH = 12


def _num(value: Any, fmt: str = ".3g", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{unit}"


def _bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    if fraction is None:
        return ""
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    return "█" * full + ("▌" if cells - full >= 0.5 else "")


def headline(data: dict[str, Any]) -> RenderableType:
    v = data["verdict"]
    text = v.get("headline") or f"{v['kind']}"
    style = _STYLE.get(v.get("severity", "info"), "")
    title = "pipeprof" + (" (interrupted: partial)" if data.get("interrupted") else "")
    return Panel(Text(text, style=style), title=title, title_align="left", expand=True)


def overview(data: dict[str, Any]) -> RenderableType:
    tp, steady, lat = data["throughput"], data["steady"], data["latency"]
    t = Table.grid(padding=(0, 2))
    t.add_column(style="dim")
    t.add_column()
    t.add_row("batches", f"{data['batches']} ({data['samples']} samples) in {data['wall_s']:.2f} s")
    t.add_row("throughput", f"{_num(tp['samples_per_s'], '.1f')} samples/s overall, "
              f"{_num(steady['samples_per_s'], '.1f')} steady")  # fmt: skip
    t.add_row("start-up", f"{_num(data['startup_s'], '.3f', ' s')} to the first batch")
    t.add_row("wait/batch", f"p50 {_num(lat['p50_ms'], '.3g')} ms, p95 {_num(lat['p95_ms'], '.3g')}"
              f" ms, p99 {_num(lat['p99_ms'], '.3g')} ms")  # fmt: skip
    meta = data.get("meta", {})
    if meta:
        t.add_row("loader", f"{meta.get('num_workers', 0)} workers"
                  f" ({meta.get('multiprocessing_context') or 'default'}), batch "
                  f"{meta.get('batch_size')}, pin_memory={meta.get('pin_memory')}")  # fmt: skip
    return t


def stage_table(data: dict[str, Any]) -> RenderableType:
    t = Table(title="stages (time summed over workers)", title_justify="left", expand=False,
              show_edge=False, pad_edge=False)  # fmt: skip
    t.add_column("stage", no_wrap=True, max_width=30)
    t.add_column("ms/sample", justify="right")
    t.add_column("ms/batch", justify="right")
    t.add_column("share", justify="right")
    t.add_column("p95 ms", justify="right")
    t.add_column("", no_wrap=True, width=BAR_WIDTH)
    stages = data["stages"]
    tops = {p: r["total_s"] for p, r in stages.items() if "/" not in p}
    total = sum(tops.values()) or 1.0
    for path, row in stages.items():
        depth = path.count("/")
        name = "  " * depth + path.rsplit("/", 1)[-1]
        share = row["total_s"] / total
        t.add_row(name, _num(row["per_sample_ms"]), _num(row["per_batch_ms"]),
                  f"{share:.0%}", _num(row["p95_ms"]), _bar(share))  # fmt: skip
    return t


def worker_table(data: dict[str, Any]) -> RenderableType | None:
    rows = data["workers"]
    if not rows:
        return None
    t = Table(title="workers", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("process", "pid", "batches", "busy s", "busy", ""):
        t.add_column(col, justify="left" if col == "process" else "right")
    for w in rows:
        t.add_row(w["track"], str(w["pid"]), str(w["batches"]), f"{w['busy_s']:.2f}",
                  _num(w["busy_fraction"], ".0%"), _bar(w["busy_fraction"]))  # fmt: skip
    return t


def utilisation(data: dict[str, Any]) -> RenderableType | None:
    lines = []
    gpu = data.get("gpu")
    if gpu:
        for d in gpu.get("devices") or []:
            lines.append(f"GPU {d.get('index')} {d.get('name', '')}: util mean "
                         f"{_num(d.get('util_mean'), '.0f', '%')}, memory max "
                         f"{_num(d.get('mem_used_max_mb'), '.0f', ' MB')}")  # fmt: skip
        if not gpu.get("devices") and gpu.get("note"):
            lines.append(f"GPU: {gpu['note']}")
    host = data.get("host")
    if host:
        lines.append(f"CPU: {_num(host.get('cpu_util_mean'), '.0f', '%')} mean of "
                     f"{host.get('cpu_count')} cores")  # fmt: skip
    return Text("\n".join(lines)) if lines else None


def findings(data: dict[str, Any]) -> Iterator[RenderableType]:
    for f in data["findings"]:
        style = _STYLE.get(f["severity"], "")
        text = Text()
        text.append(f"● {f['message']}\n", style=style)
        text.append(f"  fix: {f['fix']}")
        yield text


def footer(data: dict[str, Any]) -> RenderableType:
    o = data["overhead"]
    frac = o.get("estimated_fraction")
    parts = [f"pipeprof overhead: {o['per_event_ns']:.0f} ns per timed region, "
             f"{o['events']} regions ≈ {_num(frac, '.2%')} of measured time"]  # fmt: skip
    parts += [f"note: {n}" for n in data.get("notes", [])]
    return Text("\n".join(parts), style="dim")


def summary(data: dict[str, Any]) -> Iterator[RenderableType]:
    """The renderables of the terminal summary, top to bottom."""
    yield headline(data)
    yield overview(data)
    yield Text("")
    yield stage_table(data)
    for part in (worker_table(data), utilisation(data)):
        if part is not None:
            yield Text("")
            yield part
    if data["findings"]:
        yield Text("")
        yield Text("findings", style="bold")
        yield from findings(data)
    yield Text("")
    yield footer(data)


class TextRenderer(Renderer):
    """The rich summary as text: plain unless ``color``, ``width`` columns (default 80)."""

    output_file_extension = ".txt"

    def __init__(self, width: int = 80, color: bool = False) -> None:
        self.width = width
        self.color = color

    def render(self, report: Report) -> str:
        buf = io.StringIO()
        console = Console(file=buf, width=self.width, force_terminal=self.color,
                          no_color=not self.color, color_system="standard" if self.color else None,
                          highlight=False)  # fmt: skip
        console.print(Group(*summary(report.to_dict())))
        return buf.getvalue()
