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
    """The job report's renderables, constrained to 100 columns; at 80 the rank table still fits
    (the host is said once where every rank ran on one, a long stage folds)."""
    data = visible(data)
    head = [data["headline"], *(s["message"] for s in data["stragglers"][1:])]
    parts: list[RenderableType] = [
        Panel(Text("\n".join(head)), box=box.ROUNDED, title="pipeprof job", title_align="left")
    ]
    hosts = sorted({str(r["host"]) for r in data["ranks"]})
    one_host = len(hosts) == 1
    where = f" on {hosts[0]}" if one_host else ""
    t = table(f"per rank{where} (share of each rank's loop time)")
    t.collapse_padding = True
    slow = {s["rank"] for s in data["stragglers"]}
    names = ("rank", *(() if one_host else ("host",)), "steps", "samples/s",
             *(n for _, n in PARTS), "stage")  # fmt: skip
    for name in names:
        left = name in ("host", "stage")
        t.add_column(name, justify="left" if left else "right",
                     overflow="fold" if left else "ellipsis", no_wrap=not left)  # fmt: skip
    for r in data["ranks"]:
        mark = r["rank"] in slow
        t.add_row(
            f"{r['rank']}*" if mark else str(r["rank"]), *(() if one_host else (r["host"],)),
            str(r["steps"]), num(r["samples_per_s"]),
            *(pct(r[f"{k}_fraction"]) for k, _ in PARTS), str(r["stage"] or ""),
            style="bold" if mark else None,
        )  # fmt: skip
    if slow:
        t.caption, t.caption_justify = "* holds the other ranks up (a straggler)", "left"
    parts += [t, Text("\n".join(_efficiency_lines(data)))]
    if data["notes"]:
        parts += [Text("\n".join(f"note: {n}" for n in data["notes"]), style="dim")]
    yield Constrain(Group(*parts), width=100)


STRAGGLER_ROW = "font-weight:bold;background:#fff4e6"


def html_body(data: dict[str, Any]) -> str:
    data = visible(data)
    head = "".join(f"<li>{escape(s['message'])}</li>" for s in data["stragglers"])
    slow = {s["rank"] for s in data["stragglers"]}

    def label(r: dict[str, Any]) -> str:
        return f"rank {r['rank']}" + (" · straggler" if r["rank"] in slow else "")

    rows = "".join(
        (f"<tr class='straggler' style='{STRAGGLER_ROW}'>" if r["rank"] in slow else "<tr>")
        + "".join(f"<td>{escape(str(v))}</td>" for v in (
            label(r), r["host"], r["steps"], num(r["samples_per_s"]),
            *(pct(r[f"{k}_fraction"]) for k, _ in PARTS), r["stage"] or "",
        )) + "</tr>"
        for r in data["ranks"]
    )  # fmt: skip
    cols = "".join(f"<th>{n}</th>" for n in ("rank", "host", "steps", "samples/s",
                                               *(n for _, n in PARTS), "stage"))  # fmt: skip
    chart = charts.stacked_steps([(label(r), r) for r in data["ranks"]])
    chart += charts.rank_shares(data)  # issue 40: each rank's samples
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
