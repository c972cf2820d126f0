"""The live panel (NOTE [ The live view ] in collect/live.py): a few lines, drawn once a second.
A panel of plain text lines: a rich table took 2.3 ms to draw, this 0.5 ms."""

from __future__ import annotations

from html import escape
from typing import Any

from rich.panel import Panel
from rich.text import Text

from pipeprof.core.units import num


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def lines(fig: dict[str, Any]) -> list[tuple[str, str]]:
    """The panel's (label, figures) lines."""
    rate = fig.get("samples_per_s")
    out = [("throughput", f"{num(rate)} samples/s" if rate is not None else "n/a")]
    wait, starved = fig.get("wait_share"), fig.get("starved_share")
    said = _pct(wait)
    if wait is not None and starved is not None:
        said += f" (starved {_pct(starved)}, hand-over {_pct(max(0.0, wait - starved))})"
    out.append(("waiting", said))
    stage = fig.get("stage")
    out.append(("limiting", f"{stage['path']} ({_pct(stage['share'])} of stage time)"
                if stage else "n/a yet"))  # fmt: skip
    workers = fig.get("workers") or []
    if workers:
        out.append(("workers", "  ".join(f"{w['id']}: {_pct(w['cpu'])}" for w in workers)
                    + "  (CPU)"))  # fmt: skip
    for g in fig.get("gpu") or []:
        util = None if g["util"] is None else g["util"] / 100
        mem = "" if g["mem_used_mb"] is None else f", {num(g['mem_used_mb'])} MB"
        out.append((f"GPU {g['index']}", f"{_pct(util)} busy{mem}"))
    host = fig.get("host")
    if host:
        out.append(("host", f"CPU {_pct(host['cpu'])}, memory {num(host['mem_used_mb'] / 1024)}"
                    f" of {num(host['mem_total_mb'] / 1024)} GB"))  # fmt: skip
    return out


def panel(fig: dict[str, Any]) -> Panel:
    """The live figures as a compact panel."""
    body = Text()
    for i, (label, said) in enumerate(lines(fig)):
        if i:
            body.append("\n")
        body.append(label.ljust(12), style="bold")
        body.append(said)
    return Panel(body, title=_title(fig), title_align="left", expand=False)


def _title(fig: dict[str, Any]) -> str:
    return (f"pipeprof · epoch {fig.get('epoch', 0)} · step {fig.get('steps', 0)} · "
            f"{fig.get('elapsed_s', 0):.0f} s")  # fmt: skip


def html(fig: dict[str, Any]) -> str:
    """The live figures as a small HTML table (a Jupyter cell's output, updated in place)."""
    rows = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{escape(label)}</th>"
                   f"<td style='text-align:left'>{escape(said)}</td></tr>"
                   for label, said in lines(fig))  # fmt: skip
    return (f"<div class='pipeprof-live'><b>{escape(_title(fig))}</b>"
            f"<table>{rows}</table></div>")
