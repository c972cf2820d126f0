"""``pipeprof tune``'s table (docs/tune.md): each setting tried, its measured rate, the rate the
baseline's profile promised, its gain over the script's own settings; then the choice, and the
edit of the script that makes it."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from pipeprof.core.units import num
from pipeprof.render.figures import visible


def _gain(g: dict[str, Any] | None) -> str:
    if not g:
        return ""
    chained = "*" if g.get("via") else ""
    return f"×{g['ratio']:.2f} ({g['low']:.2f}–{g['high']:.2f}){chained}"


def _state(trial: dict[str, Any], chosen: bool) -> Text:
    if trial.get("error"):
        return Text(f"failed: {trial['error']}"[:70], style="red")
    if chosen:
        return Text("chosen", style="bold green")
    if trial.get("dropped"):
        return Text("dropped", style="dim")
    return Text("")


def table(data: dict[str, Any]) -> RenderableType:
    """The tune's table, its verdict and the proposed edit, for a terminal. What came from the
    script (its errors, its lines) cannot drive the terminal (``visible``)."""
    diff = "\n".join(visible(line) for line in (data.get("diff") or "").split("\n"))
    data = visible({k: v for k, v in data.items() if k not in ("diff", "new_source")})
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for name, justify in (("setting", "left"), ("runs", "right"), ("samples/s", "right"),
                          ("promised", "right"), ("gain (range)", "right"),
                          ("", "left")):  # fmt: skip
        t.add_column(name, justify=justify, no_wrap=bool(name))  # type: ignore[arg-type]
    chosen = data["chosen_setting"]
    for trial in sorted(data["trials"], key=lambda r: -(r["samples_per_s"] or 0)):
        promised = trial.get("promised_samples_per_s")
        t.add_row(
            trial["setting"], str(trial["runs"]), num(trial["samples_per_s"]) if
            trial["samples_per_s"] else "–", num(promised) if promised else "–",
            _gain(trial.get("vs_baseline")), _state(trial, trial["setting"] == chosen),
        )  # fmt: skip
    loader = data.get("loader") or {}
    parts: list[RenderableType] = [
        Text(f"pipeprof tune: {loader.get('label', 'the loader')} ({loader.get('site', '?')}), "
             f"{data['spent_s']:.0f} s of a {data['budget_s']:.0f} s budget", style="bold"),
        t,
    ]  # fmt: skip
    g = data.get("gain")
    if data["changed"] and g:
        interval = g.get("interval")
        within = (f", 95 % interval ×{interval[0]:.2f}–×{interval[1]:.2f}"
                  if interval else "")  # fmt: skip
        how = f"chained through {g['via']}, " if g.get("via") else "median of "
        parts.append(Text(f"chosen: {chosen}: ×{g['ratio']:.2f} the script's rate ({how}"
                          f"{g['rounds']} paired rounds{within})", style="bold green"))  # fmt: skip
    else:
        parts.append(Text("keep the script as it is: no setting tried beat it in every round "
                          "by 3 % or more", style="bold"))  # fmt: skip
    steps = data.get("ladder")
    if steps:
        parts.append(_ladder(steps))
    if any(r.get("dropped") for r in data["trials"]):
        parts.append(Text("dropped: clearly slower than the leader after a round (its best "
                          "under 80 % of the leader's median), or stopped halfway",
                          style="dim"))  # fmt: skip
    if any((r.get("vs_baseline") or {}).get("via") for r in data["trials"]):
        parts.append(Text("*: chained: the gain over the best setting so far, which it ran "
                          "beside, times that one's gain over the script", style="dim"))
    for note in data.get("notes") or []:
        parts.append(Text(f"note: {note}", style="dim"))
    if diff:
        parts.append(Text("the change (pipeprof tune --apply writes it):", style="bold"))
        parts.append(Syntax(diff, "diff", theme="ansi_dark", background_color="default"))
    elif data.get("edit_error"):
        parts.append(Text(f"set {chosen} where the loader is made ({data['edit_error']})"))
    return Group(*parts)


def _ladder(steps: dict[str, Any]) -> RenderableType:
    """The ceiling ladder (NOTE [ The ceiling ladder ] in analyze/tune.py), slowest first."""
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold", title_justify="left",
              title="the ceiling ladder: how fast the loop could go")  # fmt: skip
    for name, justify in (("rung", "left"), ("samples/s", "right"), ("of the step", "right"),
                          ("what limits it, what climbs it", "left")):  # fmt: skip
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in steps["rungs"]:
        nxt = r["rung"] == steps.get("next")
        label = r["rung"] + ("" if r["measured"] else " (model)") + ("  ← next" if nxt else "")
        share = "" if r["rung"] == "as it is" else f"{r['recovered']:+.0%}"
        t.add_row(Text(label, style="bold" if nxt else ""), num(r["samples_per_s"]), share,
                  r["what"])  # fmt: skip
    return t


def as_json(data: dict[str, Any]) -> str:
    shown = {k: v for k, v in data.items() if k != "new_source"}
    return json.dumps(shown, indent=2) + "\n"
