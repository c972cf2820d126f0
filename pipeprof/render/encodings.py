"""How an ``Encodings`` result looks: one rich table for a terminal, HTML for Jupyter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pipeprof.render.bench import _console, _num, _size, _table

if TYPE_CHECKING:
    from rich.console import RenderableType


def headline(data: dict[str, Any]) -> RenderableType:
    from rich.panel import Panel
    from rich.text import Text

    cfg = data["config"]
    text = Text(f"best: {data['best']['text']}\n", style="bold")
    text.append(f"{cfg.get('samples')} samples × {cfg.get('repeat')} passes, seed "
                f"{cfg.get('seed')}; predicted for {data['workers']} workers, batch "
                f"{cfg.get('batch_size')}", style="dim")  # fmt: skip
    return Panel(text, title="pipeprof bench --encodings", title_align="left")


def _ratio(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}×"


def table(data: dict[str, Any]) -> RenderableType:
    from rich.text import Text

    cols = ("encoding", "bytes", "size", "read ms", "cpu", "GIL", "transf.", "samples/s",
            "speed", "quality")  # fmt: skip
    t = _table(f"storage encodings: read + decode per sample, predicted samples/s at "
               f"{data['workers']} workers", cols, ("encoding", "quality"))  # fmt: skip
    for r in data["rows"]:
        name = r["encoding"] + (" ◀ current" if r["current"] else "")
        if not r["applicable"]:
            t.add_row(Text(name), *[""] * 8, Text(r["reason"], style="yellow"))
            continue
        size = _size(r["bytes_per_sample"]) or "n/a"
        quality = r["quality"] or ""
        if r.get("why_bytes"):
            quality += f"; bytes n/a: {r['why_bytes']}"
        gil = r["gil_held"]
        t.add_row(Text(name), size, _ratio(r.get("size_vs_current")), _num(r["read_ms"]),
                  _num(r["read_cpu_ms"]), _num(gil, ".0%") if gil is not None else "n/a",
                  _num(r["transform_ms"]), _num(r["predicted_samples_per_s"], ".0f"),
                  _ratio(r.get("speedup")), Text(quality))  # fmt: skip
    return t


def renderables(data: dict[str, Any]) -> Iterator[RenderableType]:
    from rich.text import Text

    yield headline(data)
    yield table(data)
    yield Text("bytes: on disk per sample; read ms, cpu: read and decode, wall and CPU; GIL: its "
               "share holding the GIL; transf.: the transforms' ms per sample; speed: predicted "
               "samples/s ÷ the current's", style="dim")  # fmt: skip
    for note in data["notes"]:
        yield Text(f"note: {note}", style="dim")


def render(
    data: dict[str, Any], fmt: str = "text", width: int = 120, fragment: bool = False
) -> str:
    """``text`` (plain), ``json`` or ``html`` (a self-contained page, or a ``fragment``)."""
    from rich.console import Group

    if fmt == "json":
        return json.dumps(data, indent=2)
    if fmt not in ("text", "html"):
        raise ValueError(f"unknown format {fmt!r}: use text, json or html")
    console = _console(width, record=fmt == "html")
    console.print(Group(*renderables(data)))
    if fmt == "text":
        return str(console.file.getvalue())
    out = str(console.export_html(inline_styles=True))
    if not fragment:
        return out
    start, end = out.find("<pre"), out.rfind("</pre>")
    return out[start : end + 6] if start >= 0 and end >= 0 else out
