"""How a Comparison (``pipeprof compare``, ``report.compare``) looks: text, HTML or JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html import escape
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.constrain import Constrain
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pipeprof.render import charts
from pipeprof.render.figures import num, pct, visible
from pipeprof.render.html import CSS, page
from pipeprof.render.text import table, to_text

STYLE = {True: "green", False: "red", None: "dim"}
FINDING_KINDS = (
    ("resolved", "resolved", "green"),
    ("new", "new", "red"),
    ("remaining", "still there", "dim"),
)
CLASS = {True: "better", False: "worse", None: "same"}


def change(d: dict[str, Any], kind: str = "value") -> str:
    """``d``'s change: points for a fraction, ×ratio for a rate, a signed percentage else; ``~``
    before one within run-to-run noise."""
    mark = "~" if d.get("uncertain") == "noise" else ""
    return mark + _change(d, kind)


def _change(d: dict[str, Any], kind: str) -> str:
    if d.get("change") is None:
        return "n/a" if d.get("before") is None or d.get("after") is None else ""
    if kind == "fraction":
        return f"{d['change'] * 100:+.0f} pt"
    if d.get("ratio") is None:
        return f"{d['change']:+.3g}"
    if kind == "rate":
        return f"×{d['ratio']:.2f}"
    return f"{(d['ratio'] - 1) * 100:+.0f}%"


def _fmt(value: Any, kind: str) -> str:
    return pct(value) if kind == "fraction" else num(value)


def figure_rows(data: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """``(label, delta, kind)`` of the headline figures, loop figures first when both have one."""
    o, loop = data["overview"], data.get("loop")
    rows: list[tuple[str, dict[str, Any], str]] = []
    if loop:
        rows += [
            ("samples/s", loop["samples_per_s"], "rate"),
            ("wait share", loop["wait_fraction"], "fraction"),
            ("transfer share", loop["transfer_fraction"], "fraction"),
            ("compute share", loop["compute_fraction"], "fraction"),
            ("other share", loop["overhead_fraction"], "fraction"),
            ("step mean ms", loop["step_mean_ms"], "value"),
            ("step p95 ms", loop["step_p95_ms"], "value"),
            ("start-up s", loop["startup_s"], "value"),
            ("GPU idle waiting", loop["gpu_idle_while_waiting_fraction"], "fraction"),
        ]
    else:
        rows += [
            ("samples/s overall", o["samples_per_s"], "rate"),
            ("samples/s steady", o["steady_samples_per_s"], "rate"),
            ("start-up s", o["startup_s"], "value"),
            ("wait/batch p50 ms", o["wait_p50_ms"], "value"),
            ("wait/batch p95 ms", o["wait_p95_ms"], "value"),
        ]
    rows += [
        ("GPU util %", o["gpu_util_mean"], "value"),
        ("CPU util %", o["cpu_util_mean"], "value"),
    ]
    return [r for r in rows if r[1].get("before") is not None or r[1].get("after") is not None]


def _delta_table(title: str, rows: list[tuple[str, dict[str, Any], str]], labels: Any) -> Table:
    t = table(title)
    t.add_column("", no_wrap=True, max_width=30, overflow="ellipsis")
    t.add_column(labels["before"][:14], justify="right")
    t.add_column(labels["after"][:14], justify="right")
    t.add_column("change", justify="right")
    for label, d, kind in rows:
        t.add_row(
            Text(label),
            _fmt(d.get("before"), kind),
            _fmt(d.get("after"), kind),
            Text(change(d, kind), style=STYLE[d.get("improved")]),
        )
    return t


def summary(data: dict[str, Any]) -> Iterator[RenderableType]:
    """The comparison's renderables, constrained to 80 columns."""
    data = visible(data)
    labels = data["labels"]
    parts: list[RenderableType] = [
        Panel(
            Text("\n".join(data["summary"])),
            box=box.ROUNDED,
            title=f"pipeprof compare: {labels['before']} → {labels['after']}",
            title_align="left",
        )
    ]
    parts += [_delta_table("figures", figure_rows(data), labels)]
    if data.get("notes"):
        parts += [Text("\n".join(f"note: {n}" for n in data["notes"]), style="dim")]
    stages = [
        ("  " * p.count("/") + p.rsplit("/", 1)[-1], d["per_sample_ms"], "value")
        for p, d in data["stages"].items()
    ]
    if stages:
        parts += [Text(""), _delta_table("stages (ms per sample)", stages, labels)]
    regions = [(r, d, "value") for r, d in ((data.get("loop") or {}).get("regions") or {}).items()]
    if regions:
        parts += [Text(""), _delta_table("regions (mean ms)", regions, labels)]
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for key, word, style in FINDING_KINDS:
        for f in data["findings"][key]:
            grid.add_row(Text(word, style=style), Text(str(f.get("message")), style=style))
    if grid.row_count:
        parts += [Text(""), Text("findings", style="bold"), grid]
    yield Constrain(Group(*parts), width=80)


def html_body(data: dict[str, Any]) -> str:
    data = visible(data)
    labels = data["labels"]
    lb, la = escape(labels["before"]), escape(labels["after"])
    head = "".join(f"<li>{escape(line)}</li>" for line in data["summary"])

    def table(rows: list[tuple[str, dict[str, Any], str]]) -> str:
        body = "".join(
            f'<tr class="{CLASS[d.get("improved")]}"><td>{escape(label)}</td>'
            f"<td>{_fmt(d.get('before'), kind)}</td><td>{_fmt(d.get('after'), kind)}"
            f"</td><td>{escape(change(d, kind))}</td></tr>"
            for label, d, kind in rows
        )
        return f"<table><tr><th></th><th>{lb}</th><th>{la}</th><th>change</th></tr>{body}</table>"

    parts = [
        f"<h1>pipeprof compare: {lb} → {la}</h1>",
        f'<div class="verdict"><ul>{head}</ul></div>',
        table(figure_rows(data)),
    ]
    parts += [f'<p class="dim note">note: {escape(n)}</p>' for n in data.get("notes") or []]
    loop = data.get("loop")
    if loop:
        views = [
            (
                labels[side][:16],
                {
                    f"{k}_fraction": loop[f"{k}_fraction"][side]
                    for k in ("wait", "transfer", "compute", "overhead")
                },
            )
            for side in ("before", "after")
        ]
        parts.append("<h2>Step time</h2>" + charts.stacked_steps(views))
    stages = [
        ("\u00a0" * 3 * p.count("/") + p.rsplit("/", 1)[-1], d["per_sample_ms"], "value")
        for p, d in data["stages"].items()
    ]
    if stages:
        parts.append(f"<h2>Stages (ms per sample)</h2>{paired_bars(data)}{table(stages)}")
    items = "".join(
        f'<li class="{key}"><b>{word}</b>: {escape(str(f.get("message")))}</li>'
        for key, word, _ in FINDING_KINDS
        for f in data["findings"][key]
    )
    if items:
        parts.append(f"<h2>Findings</h2><ul>{items}</ul>")
    return f'<div class="pipeprof compare">{"".join(parts)}</div>'


def paired_bars(data: dict[str, Any]) -> str:
    """Before and after bars of each stage's ms per sample."""
    rows = [(p, d["per_sample_ms"]) for p, d in data["stages"].items()]
    top = max([v for _, d in rows for v in (d["before"], d["after"]) if v] or [1.0])
    inner, y = [], 4
    for path, d in rows:
        inner.append(charts.svg_text(0, y + 17, charts.fit(path, 200), 12))
        for k, side in enumerate(("before", "after")):
            v = d[side] or 0.0
            color = "#adb5bd" if side == "before" else "#1c7ed6"
            inner.append(
                charts.svg_rect(
                    210,
                    y + k * 12,
                    420 * v / top,
                    11,
                    color,
                    f"{path} {side}: {num(d[side])} ms/sample",
                    f"bar {side}",
                )
            )
        inner.append(charts.svg_text(636, y + 17, num(d["after"]), 11))
        y += 30
    return charts.svg_chart("compare-stages", y + 4, "ms per sample before and after", inner)


CSS_COMPARE = (
    ".pipeprof tr.better td:last-child{color:#2f9e44}"
    ".pipeprof tr.worse td:last-child{color:#e03131}"
)


def render(
    data: dict[str, Any],
    fmt: str = "text",
    width: int = 80,
    color: bool = False,
    fragment: bool = False,
) -> str:
    """The comparison as ``text``, ``json`` or ``html``."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    if fmt == "html":
        inner = f"<style>{CSS}{CSS_COMPARE}</style>{html_body(data)}"
        return inner if fragment else page(inner, "pipeprof compare")
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r} for a comparison: choose text, json or html")
    return to_text(summary(data), width, color)
