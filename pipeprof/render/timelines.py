"""Charts over time for the HTML report: time per step (or per batch) and GPU/CPU utilisation
with the periods spent waiting for data shaded. Inline SVG, like ``charts.py``."""

from __future__ import annotations

from html import escape
from typing import Any

from pipeprof.render.charts import (
    PART_COLOR,
    WIDTH,
    svg_chart,
    svg_legend,
    svg_rect,
    svg_text,
)
from pipeprof.render.figures import num, wait_periods

DEVICE_COLOR = ["#1c7ed6", "#0ca678", "#f08c00", "#c2255c", "#5f3dc4", "#087f5b", "#e67700"]
MAX_COLUMNS = 240  # more steps are averaged into this many columns
MAX_POINTS = 1200  # more samples are averaged into this many points


def _bins(rows: list[list[float]], cols: int) -> list[tuple[int, int, list[float]]]:
    """Rows averaged into at most ``cols`` bins: (first index, last index, mean values)."""
    n = len(rows)
    k = max(1, -(-n // cols))
    out = []
    for i in range(0, n, k):
        chunk = rows[i : i + k]
        means = [sum(r[j] for r in chunk) / len(chunk) for j in range(1, len(chunk[0]))]
        out.append((i, i + len(chunk) - 1, means))
    return out


def step_timeline(data: dict[str, Any]) -> str:
    """Stacked columns of wait / transfer / compute per step (loader mode: wait per batch)."""
    steps = (data.get("timeline") or {}).get("steps") or []
    keys: list[str] = ["wait", "transfer", "compute"] if steps else ["wait"]
    rows = steps or data.get("batch_waits") or []
    if not rows:
        return ""
    unit = "step" if steps else "batch"
    bins = _bins([list(r[: len(keys) + 1]) for r in rows], MAX_COLUMNS)
    totals = sorted(sum(v) for _, _, v in bins)
    ymax = totals[-1] if len(totals) < 10 else totals[int(0.98 * (len(totals) - 1))] * 1.15
    ymax = ymax or 1.0
    x0, h, top = 56.0, 150.0, 10.0
    colw = (WIDTH - x0 - 8) / len(bins)
    inner = [f'<line x1="{x0}" y1="{top + h}" x2="{WIDTH - 8}" y2="{top + h}" stroke="#adb5bd"/>']
    for frac in (0.5, 1.0):
        y = top + h - h * frac
        inner.append(
            f'<line x1="{x0}" y1="{y:.1f}" x2="{WIDTH - 8}" y2="{y:.1f}" stroke="#e9ecef"/>'
        )
        inner.append(svg_text(x0 - 4, y + 4, f"{num(ymax * frac)} ms", 10, "end"))
    for b, (first, last, values) in enumerate(bins):
        x, base = x0 + b * colw, 0.0
        what = f"{unit} {first}" + (f"–{last} (mean)" if last > first else "")
        for key, v in zip(keys, values):
            y1 = min(ymax, base + v)
            hh = h * (y1 - min(ymax, base)) / ymax
            if hh > 0:
                inner.append(
                    svg_rect(
                        x,
                        top + h - h * y1 / ymax,
                        max(colw - 0.5, 0.6),
                        hh,
                        PART_COLOR[key],
                        f"{what}: {key} {num(v)} ms",
                        f"col {key}",
                    )
                )
            base += v
        if base > ymax:
            inner.append(svg_text(x + colw / 2, top + 8, "▲", 8, "middle", "#c92a2a"))
    inner.append(svg_text(x0, top + h + 14, f"{unit} 0", 10))
    inner.append(svg_text(WIDTH - 8, top + h + 14, f"{unit} {bins[-1][1]}", 10, "end"))
    legend = [(k, PART_COLOR[k]) for k in keys]
    inner.append(svg_legend(top + h + 32, legend, x0))
    label = f"time per {unit}: " + ", ".join(keys)
    return svg_chart("step-timeline", top + h + 40, label, inner)


def _downsample(t: list[float], v: list[Any], n: int) -> tuple[list[float], list[Any]]:
    if len(t) <= n:
        return t, v
    k = -(-len(t) // n)
    ts, vs = [], []
    for i in range(0, len(t), k):
        known = [x for x in v[i : i + k] if x is not None]
        ts.append(t[min(i + k, len(t)) - 1])
        vs.append(sum(known) / len(known) if known else None)
    return ts, vs


def _polylines(t: list[float], v: list[Any], sx: Any, sy: Any, color: str, name: str) -> str:
    """One polyline per run of known values (n/a breaks the line; it is not 0)."""
    t, v = _downsample(t, v, MAX_POINTS)
    runs: list[list[str]] = [[]]
    for ti, vi in zip(t, v):
        if vi is None:
            runs.append([])
        else:
            runs[-1].append(f"{sx(ti):.1f},{sy(vi):.1f}")
    return "".join(
        f'<polyline class="series" data-series="{escape(name)}" fill="none" '
        f'stroke="{color}" stroke-width="1.6" points="{" ".join(r)}"/>'
        for r in runs
        if r
    )


def utilisation_timeline(data: dict[str, Any]) -> str:
    """GPU and CPU utilisation over time, with the periods spent waiting for data shaded."""
    tl = data.get("timeline") or {}
    gpu, cpu = tl.get("gpu") or {}, tl.get("cpu") or {}
    if not gpu.get("t_s") and not cpu.get("t_s"):
        return ""
    waits = wait_periods(data)
    t_end = (
        max(
            [
                data.get("wall_s") or 0.0,
                *(gpu.get("t_s") or [0]),
                *(cpu.get("t_s") or [0]),
                *(e for _, e in waits[-1:]),
            ]
        )
        or 1.0
    )
    x0, w, top, h = 40.0, WIDTH - 48.0, 10.0, 160.0

    def sx(t: float) -> float:
        return x0 + w * max(0.0, t) / t_end

    def sy(u: float) -> float:
        return top + h - h * max(0.0, min(100.0, u)) / 100.0

    inner = [
        svg_rect(
            sx(a),
            top,
            max(sx(b) - sx(a), 0.5),
            h,
            "#ffe8cc",
            f"waiting for data {num(a)}–{num(b)} s",
            "waiting",
        )
        for a, b in waits
    ]
    for u in (0, 50, 100):
        inner.append(
            f'<line x1="{x0}" y1="{sy(u):.1f}" x2="{x0 + w}" y2="{sy(u):.1f}" '
            f'stroke="{"#adb5bd" if u == 0 else "#e9ecef"}"/>'
        )
        inner.append(svg_text(x0 - 4, sy(u) + 4, f"{u}%", 10, "end"))
    legend: list[tuple[str, str]] = []
    rows = gpu.get("util") or []
    n_dev = max((len(r) for r in rows if r), default=0)
    for d in range(n_dev):
        series = [r[d] if r and d < len(r) else None for r in rows]
        color = DEVICE_COLOR[d % len(DEVICE_COLOR)]
        inner.append(_polylines(gpu["t_s"], series, sx, sy, color, f"gpu{d}"))
        legend.append((f"GPU {d}", color))
    if cpu.get("t_s"):
        inner.append(_polylines(cpu["t_s"], cpu.get("cpu") or [], sx, sy, "#495057", "cpu"))
        legend.append(("CPU (all cores)", "#495057"))
    if waits:
        legend.append(("waiting for data", "#ffc078"))
    inner.append(svg_text(x0, top + h + 14, "0 s", 10))
    inner.append(svg_text(x0 + w, top + h + 14, f"{num(t_end)} s", 10, "end"))
    inner.append(svg_legend(top + h + 32, legend, x0))
    return svg_chart("utilisation", top + h + 40, "GPU and CPU utilisation over time", inner)


def memory_timeline(data: dict[str, Any]) -> str:
    """Each process's private memory (USS) over time, where it was read (NOTE [ Private memory ]
    in collect/samplers/host.py): a worker copying what it shares with the training process
    climbs; a point for each reading."""
    procs = [p for p in (data.get("timeline") or {}).get("memory") or [] if p["t_s"]]
    known = [u for p in procs for u in p["uss_mb"] if u is not None]
    if not known:
        return ""
    t_end = max([data.get("wall_s") or 0.0, *(t for p in procs for t in p["t_s"])]) or 1.0
    top_mb = max(known) * 1.1 or 1.0
    x0, w, top, h = 48.0, WIDTH - 56.0, 10.0, 140.0

    def sx(t: float) -> float:
        return x0 + w * max(0.0, t) / t_end

    def sy(mb: float) -> float:
        return top + h - h * max(0.0, mb) / top_mb

    inner = []
    for mb in (0.0, top_mb / 2, top_mb):
        inner.append(f'<line x1="{x0}" y1="{sy(mb):.1f}" x2="{x0 + w}" y2="{sy(mb):.1f}" '
                     f'stroke="{"#adb5bd" if mb == 0 else "#e9ecef"}"/>')  # fmt: skip
        inner.append(svg_text(x0 - 4, sy(mb) + 4, f"{num(mb)} MB", 10, "end"))
    legend: list[tuple[str, str]] = []
    kids = 0
    for p in procs:
        main = p["role"] == "main"
        color = "#495057" if main else DEVICE_COLOR[kids % len(DEVICE_COLOR)]
        kids += not main
        name = "main process" if main else f"worker pid {p['pid']}"
        inner.append(_polylines(p["t_s"], p["uss_mb"], sx, sy, color, name))
        for t, u in zip(p["t_s"], p["uss_mb"]):
            if u is not None:
                inner.append(f'<circle cx="{sx(t):.1f}" cy="{sy(u):.1f}" r="2.5" fill="{color}">'
                             f"<title>{escape(name)}: {num(u)} MB at {num(t)} s</title></circle>")
        legend.append((name, color))
    inner.append(svg_text(x0, top + h + 14, "0 s", 10))
    inner.append(svg_text(x0 + w, top + h + 14, f"{num(t_end)} s", 10, "end"))
    inner.append(svg_legend(top + h + 32, legend, x0))
    return svg_chart("memory", top + h + 40, "private memory (USS) of each process over time",
                     inner)  # fmt: skip
