"""A self-contained HTML bottleneck report: inline CSS and SVG, no scripts from anywhere."""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING, Any

from pipeprof.renderers.base import Renderer

if TYPE_CHECKING:
    from pipeprof.report import Report

CSS = """
.pipeprof{font-family:system-ui,-apple-system,Segoe UI,sans-serif;color:#1f2430;max-width:960px}
.pipeprof h2{font-size:1.1em;margin:1.2em 0 .4em}
.pipeprof .verdict{padding:.7em 1em;border-radius:6px;background:#eef3fb;border-left:5px solid #3b6fd8}
.pipeprof .verdict.warning{background:#fff6e5;border-color:#e59500}
.pipeprof .verdict.critical{background:#fdecec;border-color:#d63b3b}
.pipeprof table{border-collapse:collapse;font-size:.9em}
.pipeprof td,.pipeprof th{padding:.2em .7em;text-align:right;border-bottom:1px solid #e5e7eb}
.pipeprof td:first-child,.pipeprof th:first-child{text-align:left}
.pipeprof .finding{margin:.4em 0;padding:.4em .8em;border-left:4px solid #3b6fd8}
.pipeprof .finding.warning{border-color:#e59500}.pipeprof .finding.critical{border-color:#d63b3b}
.pipeprof .fix{color:#4b5563}.pipeprof .dim{color:#6b7280;font-size:.85em}
"""
PALETTE = ["#3b6fd8", "#e59500", "#2f9e6e", "#c2417a", "#7a5cd6", "#d1495b", "#2a9bb7", "#8a8f98"]


def _n(value: Any, fmt: str = ".3g") -> str:
    return "n/a" if value is None else format(value, fmt)


def stage_bars(stages: dict[str, dict[str, Any]]) -> str:
    """Horizontal bars, one per stage, indented by depth; width = share of pipeline time."""
    total = sum(r["total_s"] for p, r in stages.items() if "/" not in p) or 1.0
    rows, y = [], 0
    for i, (path, row) in enumerate(stages.items()):
        depth = path.count("/")
        share = row["total_s"] / total
        width = max(1.0, 520 * share)
        color = PALETTE[i % len(PALETTE)] if depth == 0 else "#9db5e8"
        label = escape(path.rsplit("/", 1)[-1])
        rows.append(
            f'<text x="{8 + 14 * depth}" y="{y + 15}" font-size="12">{label}</text>'
            f'<rect class="bar" data-stage="{escape(path)}" x="200" y="{y + 3}" width="{width:.1f}"'
            f' height="15" fill="{color}"><title>{escape(path)}: {share:.1%}, '
            f'{_n(row["per_sample_ms"])} ms/sample</title></rect>'
            f'<text x="{206 + width:.1f}" y="{y + 15}" font-size="11" fill="#4b5563">'
            f'{share:.0%} · {_n(row["per_sample_ms"])} ms/sample</text>'
        )
        y += 21
    return (f'<svg class="chart stages" width="900" height="{y + 4}" role="img" '
            f'aria-label="time per stage">{"".join(rows)}</svg>')  # fmt: skip


def worker_bars(workers: list[dict[str, Any]]) -> str:
    if not workers:
        return ""
    rows, y = [], 0
    for w in workers:
        frac = w.get("busy_fraction") or 0.0
        rows.append(
            f'<text x="8" y="{y + 15}" font-size="12">{escape(w["track"])}</text>'
            f'<rect x="120" y="{y + 3}" width="400" height="15" fill="#eef0f3"/>'
            f'<rect class="bar" x="120" y="{y + 3}" width="{400 * frac:.1f}" height="15" '
            f'fill="#2f9e6e"><title>busy {frac:.0%}</title></rect>'
            f'<text x="528" y="{y + 15}" font-size="11">{frac:.0%} busy, {w["batches"]} batches'
            f"</text>"
        )
        y += 21
    return f'<svg class="chart workers" width="900" height="{y + 4}">{"".join(rows)}</svg>'


def stage_rows(stages: dict[str, dict[str, Any]]) -> str:
    out = []
    for path, r in stages.items():
        out.append(
            f"<tr><td>{'&nbsp;' * 3 * path.count('/')}{escape(path.rsplit('/', 1)[-1])}</td>"
            f"<td>{_n(r['per_sample_ms'])}</td><td>{_n(r['per_batch_ms'])}</td>"
            f"<td>{_n(r['p50_ms'])}</td><td>{_n(r['p95_ms'])}</td><td>{r['count']}</td></tr>"
        )
    return ("<table><tr><th>stage</th><th>ms/sample</th><th>ms/batch</th><th>p50 ms</th>"
            f"<th>p95 ms</th><th>calls</th></tr>{''.join(out)}</table>")  # fmt: skip


def body(data: dict[str, Any]) -> str:
    v = data["verdict"]
    tp, steady, lat = data["throughput"], data["steady"], data["latency"]
    findings = "".join(
        f'<div class="finding {escape(f["severity"])}"><b>{escape(f["message"])}</b><br>'
        f'<span class="fix">fix: {escape(f["fix"])}</span></div>'
        for f in data["findings"]
    )
    o = data["overhead"]
    return f"""<div class="pipeprof">
<div class="verdict {escape(v.get('severity', 'info'))}"><b>{escape(v['kind'])}</b>:
{escape(v.get('headline') or '')}</div>
<p>{data['batches']} batches ({data['samples']} samples) in {data['wall_s']:.2f} s ·
{_n(tp['samples_per_s'], '.1f')} samples/s overall, {_n(steady['samples_per_s'], '.1f')} steady ·
start-up {_n(data['startup_s'], '.3f')} s · wait per batch p50 {_n(lat['p50_ms'])} ms,
p95 {_n(lat['p95_ms'])} ms</p>
<h2>Where the pipeline's time goes</h2>{stage_bars(data['stages'])}
{stage_rows(data['stages'])}
<h2>Workers</h2>{worker_bars(data['workers'])}
<h2>Findings</h2>{findings or '<p>nothing to report</p>'}
<p class="dim">pipeprof overhead: {o['per_event_ns']:.0f} ns per timed region,
{o['events']} regions ≈ {_n(o.get('estimated_fraction'), '.2%')} of measured time.
{' '.join(escape(n) for n in data.get('notes', []))}</p>
</div>"""


class HTMLRenderer(Renderer):
    """A whole page, or (``fragment=True``) the part Jupyter embeds in a cell's output."""

    output_file_extension = ".html"

    def __init__(self, fragment: bool = False) -> None:
        self.fragment = fragment

    def render(self, report: Report) -> str:
        data = report.to_dict()
        inner = f"<style>{CSS}</style>{body(data)}"
        if self.fragment:
            return inner
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
                f"<title>pipeprof report</title></head><body>{inner}</body></html>")  # fmt: skip
