"""The regression gate's table (NOTE [ The gate ] in analyze/gate.py): each condition, the two
figures, the change and its noise, and whether it failed."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipeprof.core.units import num

_STYLE = {"fail": "bold red", "not measured": "bold red", "within noise": "yellow", "pass": "green"}


def _change(row: dict[str, Any]) -> str:
    if row["change"] is None:
        return ""
    rel = row["relative_change"]
    return f"{row['change']:+.4g}" + (f" ({rel:+.1%})" if rel is not None else "")


def table(data: dict[str, Any]) -> RenderableType:
    """The gate as a terminal table with its verdict line."""
    one = data.get("one_report")
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    columns = [("condition", "left"), ("before", "right"), ("after", "right"),
               ("change", "right"), ("noise ±", "right"), ("result", "left")]  # fmt: skip
    if one:  # one report: its figure and the result
        columns = [("condition", "left"), ("figure", "right"), ("result", "left")]
    for name, justify in columns:
        t.add_column(name, justify=justify, no_wrap=name == "condition")  # type: ignore[arg-type]
    for row in data["conditions"]:
        result = Text(row["result"], style=_STYLE[row["result"]])
        if one:
            t.add_row(row["text"], num(row["after"]), result)
            continue
        t.add_row(
            row["text"], num(row["before"]), num(row["after"]), _change(row),
            num(row["noise"]) if row["noise"] is not None else "", result,
        )  # fmt: skip
    n, bad = len(data["conditions"]), len(data["failed"])
    head = (Text(f"gate passed: none of the {n} condition(s) holds", style="bold green")
            if data["passed"] else
            Text(f"gate FAILED: {bad} of {n} condition(s) hold", style="bold red"))  # fmt: skip
    parts: list[RenderableType] = [head, t]
    if any(r["result"] == "within noise" for r in data["conditions"]):
        parts.append(Text("within noise: the condition holds, but the change is inside the "
                          "two runs' noise (±, 95 %); --strict fails on it",
                          style="dim"))  # fmt: skip
    if data.get("machine"):
        parts.append(Text(f"note: {data['machine']}", style="dim"))
    return Group(*parts)


def as_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"
