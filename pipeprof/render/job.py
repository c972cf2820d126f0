"""The job report of a distributed run (analyze/job.py) as text, JSON or HTML."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html import escape
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.constrain import Constrain
from rich.panel import Panel
from rich.text import Text

from pipeprof.render import charts
from pipeprof.render.figures import num, pct, visible
from pipeprof.render.html import CSS, page
from pipeprof.render.text import table, to_text

PARTS = (("wait", "wait"), ("transfer", "transfer"), ("compute", "compute"), ("comm", "comm"),
         ("overhead", "other"))  # fmt: skip


def _efficiency_lines(data: dict[str, Any]) -> list[str]:
    e, w = data["efficiency"], data["what_if"]
    lines = [
        f"POP efficiencies over useful (compute) time: load balance {pct(e['load_balance'])}, "
        f"communication {pct(e['communication'])}, parallel {pct(e['parallel'])}",
        f"job: {num(data['samples_per_s'])} samples/s over {num(data['runtime_s'])} s",
    ]
    if w.get("samples_per_s"):
        lines.append(
            f"if every rank's pipeline kept up: about {num(w['samples_per_s'])} samples/s "
            f"(×{w['speedup']:.2f}, estimated: {w['how']})"
        )
    return lines


def summary(data: dict[str, Any]) -> Iterator[RenderableType]:
    """The job report's renderables, constrained to 100 columns."""
    data = visible(data)
    head = [data["headline"], *(s["message"] for s in data["stragglers"][1:])]
    parts: list[RenderableType] = [
        Panel(Text("\n".join(head)), box=box.ROUNDED, title="pipeprof job", title_align="left")
    ]
    t = table("per rank (share of each rank's loop time)")
    for name in ("rank", "host", "steps", "samples/s", *(n for _, n in PARTS), "stage"):
        t.add_column(name, justify="left" if name in ("host", "stage") else "right")
    for r in data["ranks"]:
        t.add_row(
            str(r["rank"]), r["host"], str(r["steps"]), num(r["samples_per_s"]),
            *(pct(r[f"{k}_fraction"]) for k, _ in PARTS), str(r["stage"] or ""),
        )  # fmt: skip
    parts += [t, Text("\n".join(_efficiency_lines(data)))]
    if data["notes"]:
        parts += [Text("\n".join(f"note: {n}" for n in data["notes"]), style="dim")]
    yield Constrain(Group(*parts), width=100)


def html_body(data: dict[str, Any]) -> str:
    data = visible(data)
    head = "".join(f"<li>{escape(s['message'])}</li>" for s in data["stragglers"])
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
            r["rank"], r["host"], r["steps"], num(r["samples_per_s"]),
            *(pct(r[f"{k}_fraction"]) for k, _ in PARTS), r["stage"] or "",
        )) + "</tr>"
        for r in data["ranks"]
    )  # fmt: skip
    cols = "".join(f"<th>{n}</th>" for n in ("rank", "host", "steps", "samples/s",
                                               *(n for _, n in PARTS), "stage"))  # fmt: skip
    chart = charts.stacked_steps([(f"rank {r['rank']}", r) for r in data["ranks"]])
    lines = "".join(f"<p>{escape(x)}</p>" for x in _efficiency_lines(data))
    notes = "".join(f"<p class='note'>note: {escape(n)}</p>" for n in data["notes"])
    return (
        f"<div class='pipeprof'><h2>{escape(data['headline'])}</h2><ul>{head}</ul>"
        f"<table><tr>{cols}</tr>{rows}</table>{chart}{lines}{notes}</div>"
    )


def render(data: dict[str, Any], fmt: str = "text", width: int = 100, color: bool = False,
           fragment: bool = False) -> str:  # fmt: skip
    """The job report as ``text``, ``json`` or ``html``."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    if fmt == "html":
        inner = f"<style>{CSS}</style>{html_body(data)}"
        return inner if fragment else page(inner, "pipeprof job")
    if fmt != "text":
        raise ValueError(f"unknown format {fmt!r} for a job report: choose text, json or html")
    return to_text(summary(data), width, color)
