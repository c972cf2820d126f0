"""Inline SVG charts for the HTML report: no scripts, no fonts, nothing fetched.

The SVG primitives, the step breakdown, regions, the stage icicle and worker bars; the charts
over time are in ``timelines.py``.

Each function takes the report dictionary (or part of it) and returns one ``<svg class="chart
NAME">`` element, or ``""`` when the report has nothing to draw. Hovering a mark shows its
figures (SVG ``<title>``).
"""

from __future__ import annotations

from html import escape
from typing import Any

from pipeprof.render.figures import STEP_PARTS, family, num, pct, top_total

WIDTH = 720
PART_COLOR = {"wait": "#e8590c", "transfer": "#9c36b5", "compute": "#2f9e44", "comm": "#1971c2",
              "overhead": "#868e96"}  # fmt: skip
FAMILY_COLOR = ["#1c7ed6", "#f08c00", "#0ca678", "#9c36b5", "#868e96"]
FAMILY_LIGHT = ["#74c0fc", "#ffc078", "#63e6be", "#da77f2", "#ced4da"]
REGION_COLOR = ["#2b8a3e", "#5c940d", "#1864ab", "#862e9c", "#0b7285", "#e67700", "#a61e4d"]
CONTAINERS = {"Epoch", "Batch"}  # regions that hold whole steps: they do not stack


def svg_chart(name: str, height: float, label: str, inner: list[str]) -> str:
    return (
        f'<svg class="chart {name}" viewBox="0 0 {WIDTH} {height:.0f}" width="100%" '
        f'style="max-width:{WIDTH}px" role="img" aria-label="{escape(label)}">'
        f"{''.join(inner)}</svg>"
    )


def svg_rect(
    x: float, y: float, w: float, h: float, fill: str, title: str, cls: str = "", extra: str = ""
) -> str:
    c = f' class="{cls}"' if cls else ""
    return (
        f'<rect{c} x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" '
        f'fill="{fill}"{extra}><title>{escape(title)}</title></rect>'
    )


def svg_text(
    x: float, y: float, text: str, size: int = 11, anchor: str = "start", fill: str = "#343a40"
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
        f'fill="{fill}">{escape(text)}</text>'
    )


def svg_legend(y: float, items: list[tuple[str, str]], x: float = 110) -> str:
    out = []
    for name, color in items:
        out.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{color}"/>')
        out.append(svg_text(x + 14, y, name))
        x += 24 + 6.5 * len(name)
    return "".join(out)


def fit(label: str, width: float, char_px: float = 6.6) -> str:
    """``label`` cut to what ``width`` pixels hold (``""`` when not even three characters fit)."""
    room = int((width - 6) / char_px)
    if room >= len(label):
        return label
    return label[: room - 1] + "…" if room >= 3 else ""


Segment = tuple[str, str, float, str, str]  # css key, name, fraction, colour, tooltip


def step_breakdown(loop: dict[str, Any]) -> str:
    """100 % stacked bars of the step: wait / transfer / compute / other for all steps and the
    steady state, and a bar with compute and other split into the marked regions."""
    rows = [("all steps", loop)]
    steady = loop.get("steady") or {}
    if steady.get("steps"):
        rows.append(("steady state", steady))
    return stacked_steps(rows, region_segments(loop))


def _part_segments(view: dict[str, Any]) -> list[Segment]:
    steps, out = max(1, view.get("steps") or 1), []
    for key, name in STEP_PARTS:
        frac = view.get(f"{key}_fraction") or 0.0
        if key == "comm" and not frac:
            continue
        title = f"{name}: {pct(frac, 1)} of step time"
        if view.get(f"{key}_s") is not None:
            title += f", {num(view[f'{key}_s'] * 1e3 / steps)} ms/step"
        out.append((key, name, frac, PART_COLOR[key], title))
    return out


def region_segments(loop: dict[str, Any]) -> list[Segment] | None:
    """All steps: wait, transfer, then each region's share, then what no region covered.

    None when regions overlap (nested ``Forward`` inside ``Step``, say): they do not stack."""
    wall = loop.get("wall_s") or 0.0
    regions = {k: r for k, r in (loop.get("regions") or {}).items() if k not in CONTAINERS}
    if not wall or not regions:
        return None
    out = [s for s in _part_segments(loop) if s[0] in ("wait", "transfer")]
    used = sum(s[2] for s in out)
    for i, (name, r) in enumerate(regions.items()):
        frac = (r.get("total_s") or 0.0) / wall
        out.append(
            (
                "region",
                name,
                frac,
                REGION_COLOR[i % len(REGION_COLOR)],
                f"{name}: {pct(frac, 1)} of step time, {num(r.get('mean_ms'))} ms per call",
            )
        )
        used += frac
    if used > 1.02:
        return None
    out.append(
        (
            "unmarked",
            "unmarked",
            max(0.0, 1 - used),
            "#dee2e6",
            f"in no region: {pct(max(0.0, 1 - used), 1)} of step time",
        )
    )
    return out


def _stacked_row(y: float, label: str, segments: list[Segment], span: float) -> list[str]:
    inner, x = [svg_text(0, y + 15, label, 12)], 110.0
    for key, name, frac, color, title in segments:
        w = span * frac
        inner.append(svg_rect(x, y, w, 22, color, title, f"seg {key}"))
        text = pct(frac) if key in PART_COLOR else fit(f"{name} {pct(frac)}", w)
        if w > 34 and text:
            fill = "#212529" if key == "unmarked" else "#fff"
            inner.append(svg_text(x + w / 2, y + 15, text, 11, "middle", fill))
        x += w
    return inner


def stacked_steps(
    rows: list[tuple[str, dict[str, Any]]], regions: list[Segment] | None = None
) -> str:
    """One 100 % stacked bar per ``(label, view)`` (a view has ``<part>_fraction`` and maybe
    ``<part>_s``), plus a ``by region`` bar when ``regions`` are given."""
    inner, y, span = [], 8.0, 580.0
    for label, view in rows:
        inner += _stacked_row(y, label, _part_segments(view), span)
        y += 30
    if regions:
        inner += _stacked_row(y, "by region", regions, span)
        y += 30
    shown = {key for _, view in rows for key, *_ in _part_segments(view)}
    inner.append(svg_legend(y + 12, [(n, PART_COLOR[k]) for k, n in STEP_PARTS if k in shown]))
    return svg_chart("step-breakdown", y + 22, "step time: wait, transfer, compute, other", inner)


def region_bars(regions: dict[str, dict[str, Any]]) -> str:
    """Mean milliseconds per call of each marked region."""
    if not regions:
        return ""
    top = max((r.get("mean_ms") or 0.0) for r in regions.values()) or 1.0
    inner, y = [], 4
    for name, r in regions.items():
        mean = r.get("mean_ms") or 0.0
        w = 480 * mean / top
        inner.append(svg_text(0, y + 13, fit(name, 105), 12))
        inner.append(
            svg_rect(
                110,
                y,
                w,
                16,
                "#5c7cfa",
                f"{name}: {num(mean)} ms mean, "
                f"p95 {num(r.get('p95_ms'))} ms, {r.get('count')} calls",
                "bar",
            )
        )
        inner.append(svg_text(116 + w, y + 13, f"{num(mean)} ms × {r.get('count')}"))
        y += 22
    return svg_chart("regions", y + 4, "time per region", inner)


def stage_icicle(stages: dict[str, dict[str, Any]]) -> str:
    """The stage tree as an icicle: each stage's width is its share of the pipeline's time."""
    total = top_total(stages)
    if not stages or total <= 0:
        return ""
    x0, span, rh = 0.0, float(WIDTH), 30.0
    inner = [
        svg_rect(
            x0,
            0,
            span - 1,
            rh - 2,
            "#495057",
            f"pipeline: {num(total)} s summed over all processes",
            "node root",
        )
    ]
    inner.append(svg_text(6, 18, f"pipeline · {num(total)} s", 12, fill="#fff"))
    offsets: dict[str | None, float] = {None: x0}
    depth_max = 0
    for path, row in stages.items():
        parent = path.rsplit("/", 1)[0] if "/" in path else None
        depth = path.count("/") + 1
        depth_max = max(depth_max, depth)
        x = offsets.get(parent, x0)
        w = span * row["total_s"] / total
        offsets[parent] = x + w
        offsets[path] = x
        fam = family(path)
        color = FAMILY_COLOR[fam] if depth == 1 else FAMILY_LIGHT[fam]
        share = row["total_s"] / total
        title = (
            f"{path}: {pct(share, 1)} of pipeline time, {num(row.get('per_sample_ms'))} "
            f"ms/sample, p95 {num(row.get('p95_ms'))} ms"
        )
        extra = f' data-stage="{escape(path)}"'
        inner.append(svg_rect(x, depth * rh, w - 1, rh - 2, color, title, "node", extra))
        label = fit(f"{path.rsplit('/', 1)[-1]} {pct(share)}", w)
        if label:
            fill = "#fff" if depth == 1 else "#212529"
            inner.append(svg_text(x + 4, depth * rh + 18, label, 11, fill=fill))
    return svg_chart(
        "stage-icicle", (depth_max + 1) * rh, "stage tree, width = share of time", inner
    )


def worker_bars(workers: list[dict[str, Any]]) -> str:
    """Each process's busy share of the profile, with its batches and rate."""
    if not workers:
        return ""
    inner, y = [], 4
    for wk in workers:
        frac = wk.get("busy_fraction") or 0.0
        inner.append(svg_text(0, y + 13, str(wk.get("track")), 12))
        inner.append(f'<rect x="110" y="{y}" width="360" height="16" fill="#f1f3f5"/>')
        inner.append(
            svg_rect(
                110,
                y,
                360 * frac,
                16,
                "#0ca678",
                f"{wk.get('track')} (pid {wk.get('pid')}): busy {pct(frac, 1)}",
                "bar worker",
            )
        )
        inner.append(
            svg_text(
                478,
                y + 13,
                f"{pct(wk.get('busy_fraction'))} busy · "
                f"{wk.get('batches')} batches · {num(wk.get('samples_per_busy_s'))}/s"
                + (f" · {wk['shards']} shards" if wk.get("shards") is not None else "")
                + (
                    f" · first shard at {num(wk['first_shard_s'])} s"
                    if wk.get("first_shard_s") is not None
                    else ""
                ),
            )
        )
        y += 22
    return svg_chart("workers", y + 4, "busy share of each worker process", inner)


def sample_shares(acc: dict[str, Any] | None) -> str:
    """Each worker's share of the samples delivered (the report's ``accounting``): a worker
    that delivered none, or far too few, in red; workers that yielded the same stream said."""
    if not acc or not acc.get("workers"):
        return ""
    delivered = acc.get("delivered") or {}
    flagged = set(acc.get("silent") or []) | set(acc.get("low") or [])
    same = {i: g for g in acc.get("same_stream") or [] for i in g}
    bars = []
    for i in range(acc["workers"]):
        said = ""
        if i in same:
            others = [str(j) for j in same[i] if j != i]
            said = f" · the same samples as worker{'s' * (len(others) > 1)} {', '.join(others)}"
        colour = "#e03131" if i in flagged else ("#f08c00" if i in same else "#1c7ed6")
        bars.append((f"worker{i}", delivered.get(str(i), 0), colour, said))
    return _share_bars("shares", "samples delivered by each worker", bars)


def rank_shares(job: dict[str, Any]) -> str:
    """Each rank's share of the job's samples (the job report): ranks that read the same
    samples in orange, the rank whose data ran out first in red, each said."""
    same = {r: p for p in job.get("same_samples") or [] for r in p["ranks"]}
    out = job.get("ran_out") or {}
    bars = []
    for row in job["ranks"]:
        r, said, colour = row["rank"], "", "#1c7ed6"
        if r in same:
            other = [str(x) for x in same[r]["ranks"] if x != r]
            said, colour = f" · the same samples as rank {', '.join(other)}", "#f08c00"
        if out and r == out.get("first"):
            said, colour = said + f" · ran out first ({row['steps']} steps)", "#e03131"
        bars.append((f"rank {r}", int(row.get("samples") or 0), colour, said))
    return _share_bars("shares", "samples read by each rank", bars)


def _share_bars(kind: str, title: str, bars: list[tuple[str, int, str, str]]) -> str:
    """Horizontal bars of each part's share of a count: ``(label, count, colour, said)``."""
    total = sum(n for _, n, _, _ in bars) or 1
    inner, y = [], 4
    for label, n, colour, said in bars:
        frac = n / total
        inner.append(svg_text(0, y + 13, label, 12))
        inner.append(f'<rect x="110" y="{y}" width="360" height="16" fill="#f1f3f5"/>')
        inner.append(svg_rect(110, y, 360 * frac, 16, colour, f"{label}: {n:,} samples, "
                              f"{pct(frac, 1)}", "bar share"))  # fmt: skip
        inner.append(svg_text(478, y + 13, f"{n:,} samples · {pct(frac)}{said}"))
        y += 22
    return svg_chart(kind, y + 4, title, inner)
