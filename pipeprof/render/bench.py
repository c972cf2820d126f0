"""How a ``Bench`` looks: rich tables for a terminal, HTML for Jupyter (from its dictionary)."""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pipeprof.render.figures import visible

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

BAR_WIDTH = 8


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else round(x, nd)


def _num(x: Any, fmt: str = "") -> str:
    """A figure in at most 5 characters unless ``fmt`` says otherwise; n/a for None."""
    if x is None:
        return "n/a"
    if fmt:
        return f"{x:{fmt}}"
    ax = abs(x)
    return f"{x:.0f}" if ax >= 100 else f"{x:.1f}" if ax >= 10 else f"{x:.2f}" if ax >= 1 else (
        f"{x:.3f}")  # fmt: skip


def _bar(fraction: float | None) -> str:
    if fraction is None:
        return ""
    cells = max(0.0, min(1.0, fraction)) * BAR_WIDTH
    return "█" * int(cells) + ("▌" if cells - int(cells) >= 0.5 else "")


def _size(n: float | None) -> str:
    if n is None:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def headline(data: dict[str, Any]) -> RenderableType:
    from rich.panel import Panel
    from rich.text import Text

    cfg, host = data["config"], data["host"]
    parents = {p.rsplit("/", 1)[0] for p in data["stages"] if "/" in p}
    timed = {p: r for p, r in data["stages"].items() if p not in parents and r["share"]}
    text = Text()
    if timed:
        path = max(timed, key=lambda p: timed[p]["share"] or 0)
        row = timed[path]
        text.append(f"slowest step: {path}, {_num(row['mean_ms'])} ms per sample "
                    f"({_num(row['share'], '.0%')} of the chain)\n", style="bold")  # fmt: skip
    passes = "pass" if cfg.get("repeat") == 1 else "passes"
    text.append(f"{cfg.get('samples')} samples × {cfg.get('repeat')} {passes}, warm-up "
                f"{cfg.get('warmup')}, seed {cfg.get('seed')}, 1 thread; batch "
                f"{cfg.get('batch_size')}; {host['cores']} cores, {_probe(host)}",
                style="dim")  # fmt: skip
    return Panel(text, title="pipeprof bench", title_align="left")


def _probe(host: dict[str, Any]) -> str:
    if host["background_tasks"]:
        return f"other programs running {host['background_tasks']:.2g} tasks (probe)"
    if host["available_cores"] is not None and host["available_cores"] < host["cores"]:
        return f"{host['available_cores']:.2g} of them left by other programs (probe)"
    return "idle (probe)"


def _table(title: str, cols: tuple[str, ...], left: tuple[str, ...]) -> Table:
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in cols:
        t.add_column(col, justify="left" if col in left else "right", no_wrap=col != left[-1])
    return t


def _rows(stages: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """(label, row) in order, with a header row (None) for a parent that has no figures."""
    shown: set[str] = set()
    for path, row in stages.items():
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent not in stages and parent not in shown:
                shown.add(parent)
                yield "  " * (depth - 1) + parts[depth - 1], None
        yield "  " * (len(parts) - 1) + parts[-1], row


def stage_table(data: dict[str, Any]) -> RenderableType:
    from rich.text import Text

    cols = ("stage", "mean", "p50", "p95", "samples/s", "share", "cpu")
    t = _table("each stage on its own: ms per sample", cols, ("stage", "share", "cpu"))
    for label, r in _rows(data["stages"]):
        if r is None:
            t.add_row(Text(label), *[""] * 6)
            continue
        name = label + (f" ×{r['calls_per_sample']:.3g}" if r["calls_per_sample"] != 1.0 else "")
        share = f"{_num(r['share'], '>4.0%')} {_bar(r['share'])}" if r["share"] is not None else ""
        kind = r["kind"] + (" GIL" if (r["gil_held"] or 0) >= 0.5 else "")
        t.add_row(Text(name), _num(r["mean_ms"]), _num(r["p50_ms"]), _num(r["p95_ms"]),
                  _num(r["samples_per_s"], ".0f"), share, kind)  # fmt: skip
    return t


def output_table(data: dict[str, Any]) -> RenderableType:
    """What each stage gives: type, shape, size; failures and skipped stages in colour."""
    from rich.markup import escape
    from rich.text import Text

    t = _table(
        "what each stage gives (one sample)", ("stage", "output", "size"), ("stage", "output")
    )
    for label, r in _rows(data["stages"]):
        if r is None:
            t.add_row(Text(label), "", "")
            continue
        out = escape(r["out"] or "")
        if r["errors"]:
            err = escape(r["errors"]["first"][:60])
            out = f"[red]{r['errors']['count']} failed: {err}[/red]" + (f"; {out}" if out else "")
        if r["skipped"]:
            out = f"[yellow]{r['skipped']}[/yellow]"
        t.add_row(Text(label), out, _size(r["out_bytes"]))
    return t


def batch_line(data: dict[str, Any]) -> RenderableType | None:
    from rich.text import Text

    b = data["batch"]
    if b["collate_ms"] is None:
        return None
    return Text(f"per batch of {b['batch_size']}: collate {_num(b['collate_ms'])} ms, hand-over "
                f"{_num(b['send_ms'])} ms in a worker, {_num(b['main_ms'])} ms in the main "
                "process", style="dim")  # fmt: skip


def scaling_table(data: dict[str, Any]) -> RenderableType | None:
    if not data["scaling"]:
        return None
    cols = ("workers", "samples/s", "model", "error", "others", "efficiency", "why")
    t = _table("worker processes: real DataLoader runs", cols, ("why",))
    for r in data["scaling"]:
        model = r.get("model_samples_per_s") or r["predicted_samples_per_s"]
        t.add_row(str(r["workers"]), _num(r["samples_per_s"], ".1f"), _num(model, ".1f"),
                  _num(r.get("error"), "+.1%"), _num(r.get("others_cores"), ".2f"),
                  _num(r.get("efficiency"), ".0%"), r.get("why", ""))  # fmt: skip
    return t


def predictions(data: dict[str, Any]) -> RenderableType:
    from rich.text import Text

    p = data["predictions"]
    if not p["workers"]:
        return Text("no predictions: no sample made it through the pipeline", style="yellow")
    parts = [f"{w['workers']}: {_num(w['samples_per_s'], '.0f')}" for w in p["workers"]]
    text = Text("predicted samples/s by workers  " + ", ".join(parts) + "\n")
    top = p["ceiling_samples_per_s"]
    if top is not None:
        text.append(f"ceiling {top:.0f} samples/s at {p['ceiling_workers']} workers")
    else:
        text.append("no ceiling: only waiting was measured, which scales with workers")
    text.append("; bench.predict(workers=, compute_rate=, speedup=, cached=) for more")
    return text


def renderables(data: dict[str, Any]) -> Iterator[RenderableType]:
    """The terminal view, top to bottom."""
    data = visible(data)
    from rich.text import Text

    yield headline(data)
    yield stage_table(data)
    yield Text("")
    yield output_table(data)
    line = batch_line(data)
    if line is not None:
        yield line
    table = scaling_table(data)
    if table is not None:
        yield Text("")
        yield table
        yield Text("model: predicted for the cores other programs used during each run "
                   "(others); predict() uses the probe taken before", style="dim")  # fmt: skip
        if data["stops_scaling_at"] is not None:
            yield Text(f"throughput stops scaling at {data['stops_scaling_at']} workers",
                       style="yellow")  # fmt: skip
    yield Text("")
    yield predictions(data)
    for note in data["notes"]:
        yield Text(f"note: {note}", style="dim")


def _console(width: int, record: bool = False) -> Any:
    from rich.console import Console

    return Console(
        file=io.StringIO(),
        width=width,
        record=record,
        no_color=not record,
        color_system="standard" if record else None,
        highlight=False,
    )


def render(
    data: dict[str, Any], fmt: str = "text", width: int = 100, fragment: bool = False
) -> str:
    """``text`` (plain), ``json`` or ``html`` (a self-contained page, or a ``fragment``)."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    if fmt == "html":
        return to_html(data, page=not fragment, width=width)
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r}: use text, json or html")
    from rich.console import Group

    console = _console(width)
    console.print(Group(*renderables(data)))
    return str(console.file.getvalue())


def to_html(data: dict[str, Any], page: bool = False, width: int = 110) -> str:
    """The terminal view as HTML with inline styles: a fragment, or a whole page."""
    from rich.console import Group

    console = _console(width, record=True)
    console.print(Group(*renderables(data)))
    out = str(console.export_html(inline_styles=True))
    if page:
        return out
    start, end = out.find("<pre"), out.rfind("</pre>")
    return out[start : end + 6] if start >= 0 and end >= 0 else out


def with_lines(page: str, title: str, lines: Sequence[str]) -> str:
    """An HTML page from ``render(..., "html")`` with ``lines`` (escaped) in a section of their
    own at the end of its body; the page as it is without lines."""
    if not lines:
        return page
    text = html.escape("\n".join(lines))
    section = f"<section>\n<h3>{html.escape(title)}</h3>\n<pre>{text}</pre>\n</section>\n"
    end = page.rfind("</body>")
    return page[:end] + section + page[end:] if end >= 0 else page + section
