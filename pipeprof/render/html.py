"""A self-contained HTML bottleneck report: inline CSS and SVG, no scripts, nothing fetched.

The same markup is a whole page (``report.write_html``, ``pipeprof report -o x.html``) or, with
``fragment=True``, the cell output Jupyter shows (``Report._repr_html_``).
"""

from __future__ import annotations

from html import escape
from typing import Any

from pipeprof.render import charts, timelines
from pipeprof.render.base import Profiled, Renderer
from pipeprof.render.figures import (
    FETCH_COLUMNS,
    H5_COLUMNS,
    balance,
    batch_waits,
    comm_line,
    coverage,
    evidence_items,
    fetch_table,
    gpu_devices,
    gpu_util_line,
    h5_epochs,
    h5_table,
    headline,
    limiting_stages,
    loader_phrase,
    loop_view,
    num,
    overhead_line,
    padding_line,
    pct,
    sampling_line,
    tokenizer_line,
    top_total,
    util,
    visible,
    wait_split,
)

CSS = """
.pipeprof{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;color:#212529;
 background:#fff;max-width:760px;padding:.5em 1em;line-height:1.4}
.pipeprof h1{font-size:1.3em;margin:.3em 0}.pipeprof h2{font-size:1.05em;margin:1.4em 0 .4em}
.pipeprof .verdict{padding:.7em 1em;border-radius:6px;background:#e7f5ff;
 border-left:6px solid #1c7ed6;font-size:1.05em}
.pipeprof .verdict.high,.pipeprof .verdict.critical{background:#fff5f5;border-color:#e03131}
.pipeprof .verdict.moderate,.pipeprof .verdict.warning{background:#fff9db;border-color:#f08c00}
.pipeprof .verdict.low{background:#ebfbee;border-color:#2f9e44}
.pipeprof .cards{display:flex;flex-wrap:wrap;gap:.6em;margin:.8em 0}
.pipeprof .card{border:1px solid #dee2e6;border-radius:6px;padding:.4em .8em;min-width:120px}
.pipeprof .card b{display:block;font-size:1.25em}.pipeprof .card span{color:#868e96;font-size:.8em}
.pipeprof table{border-collapse:collapse;font-size:.85em;margin:.4em 0}
.pipeprof td,.pipeprof th{padding:.2em .7em;text-align:right;border-bottom:1px solid #e9ecef}
.pipeprof td:first-child,.pipeprof th:first-child{text-align:left}
.pipeprof tr.limiting td{font-weight:600}
.pipeprof .finding{margin:.5em 0;padding:.4em .8em;border-left:4px solid #1c7ed6;background:#f8f9fa}
.pipeprof .finding.warning{border-color:#f08c00}.pipeprof .finding.critical{border-color:#e03131}
.pipeprof .fix{color:#495057}.pipeprof p.facts{margin:.2em 0;font-size:.9em}
.pipeprof .dim,.pipeprof .evidence{color:#868e96;font-size:.85em}
.pipeprof svg.chart{display:block;margin:.3em 0;font-family:inherit}
.pipeprof svg.chart rect.seg:hover,.pipeprof svg.chart rect.node:hover{opacity:.8}
"""


def _card(value: str, label: str) -> str:
    return f'<div class="card"><b>{escape(value)}</b><span>{escape(label)}</span></div>'


def cards(data: dict[str, Any]) -> str:
    loop = data.get("loop")
    out = []
    if loop:
        view, _ = loop_view(loop)
        lt = loop.get("throughput") or {}
        out.append(_card(num(lt.get("effective_samples_per_s")), "samples/s"))
        interval = (data.get("verdict") or {}).get("wait_fraction_interval")
        label = "of step time waiting"
        if interval:
            label += f" (a rerun: {pct(interval[0])}–{pct(interval[1])})"
        out.append(_card(pct(view.get("wait_fraction")), label))
        out.append(_card(num((loop.get("step_ms") or {}).get("mean_ms"), " ms"), "mean step"))
        if lt.get("speedup_if_data_free"):
            out.append(_card(f"×{lt['speedup_if_data_free']:.2f}", "if data were free"))
    else:
        steady = data.get("steady") or {}
        rate = steady.get("samples_per_s") or data["throughput"].get("samples_per_s")
        out.append(_card(num(rate), "samples/s (steady)"))
        out.append(_card(num((data.get("latency") or {}).get("p50_ms"), " ms"), "wait/batch p50"))
    out.append(
        _card(num(data.get("startup_s") if not loop else loop.get("startup_s"), " s"), "start-up")
    )
    for d in gpu_devices(data):
        out.append(_card(util(d.get("util_mean")), f"GPU {d.get('index')} utilisation"))
    host = data.get("host") or {}
    if host.get("cpu_util_mean") is not None:
        out.append(_card(util(host["cpu_util_mean"]), f"CPU of {host.get('cpu_count')} cores"))
    return f'<div class="cards">{"".join(out)}</div>'


def stage_rows(data: dict[str, Any]) -> str:
    stages = data.get("stages") or {}
    total = top_total(stages) or 1.0
    limiting = limiting_stages(data)
    out = []
    for path, r in stages.items():
        cls = ' class="limiting"' if path in limiting else ""
        out.append(
            f"<tr{cls}><td>{'&nbsp;' * 3 * path.count('/')}{escape(path.rsplit('/', 1)[-1])}</td>"
            f"<td>{num(r.get('per_sample_ms'))}</td><td>{num(r.get('per_batch_ms'))}</td>"
            f"<td>{pct(r['total_s'] / total)}</td><td>{num(r.get('p50_ms'))}</td>"
            f"<td>{num(r.get('p95_ms'))}</td><td>{r.get('count')}</td></tr>"
        )
    return (
        '<table class="stages"><tr><th>stage</th><th>ms/sample</th><th>ms/batch</th>'
        f"<th>share</th><th>p50 ms</th><th>p95 ms</th><th>calls</th></tr>{''.join(out)}"
        "</table>"
        + (f'<p class="dim">{escape(line)}</p>' if (line := sampling_line(data)) else "")
        + (f'<p class="dim">{escape(pad)}</p>' if (pad := padding_line(data)) else "")
        + (f'<p class="dim">{escape(tok)}</p>' if (tok := tokenizer_line(data)) else "")
    )


def gpu_lines(data: dict[str, Any]) -> str:
    lines = []
    for d in gpu_devices(data):
        lines.append(
            f"GPU {d.get('index')} {escape(str(d.get('name') or ''))}: "
            f"{util(d.get('util_mean'))} mean, memory max {num(d.get('mem_used_max_mb'))}"
            f" of {num(d.get('mem_total_mb'))} MB"
        )
    gpu, loop = data.get("gpu"), data.get("loop") or {}
    if (split := wait_split(data)) is not None:
        lines.append(f"the wait: {escape(split)}")
    if gpu and not gpu_devices(data):
        lines.append(f"GPU not sampled: {escape(str(gpu.get('note') or 'n/a'))}")
    if loop.get("gpu_util_waiting") is not None:
        lines.append(escape(gpu_util_line(loop, "utilisation") or ""))
    if loop.get("idle_while_waiting_fraction") is not None:
        lines.append(
            f"the GPU sat idle waiting for data {pct(loop['idle_while_waiting_fraction'])}"
            " of the loop's time"
        )
    return "".join(f'<p class="facts">{line}</p>' for line in lines)


def finding_blocks(data: dict[str, Any]) -> str:
    out = []
    for f in data.get("findings") or []:
        items = evidence_items(f.get("evidence"))
        rows = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in items)
        evidence = (
            f'<details class="evidence"><summary>evidence</summary><table>{rows}</table></details>'
            if items
            else ""
        )
        out.append(
            f'<div class="finding {escape(str(f.get("severity")))}" '
            f'data-finding="{escape(str(f.get("id")))}"><b>{escape(str(f.get("message")))}'
            f'</b><br><span class="fix">fix: {escape(str(f.get("fix")))}</span>{evidence}</div>'
        )
    return "".join(out) or "<p>nothing to report</p>"


def what_if_table(data: dict[str, Any]) -> str:
    rows = [w for w in data.get("what_if") or [] if w.get("kind") == "workers"]
    if not rows:
        return ""
    loop = "loader_samples_per_s" in rows[0]  # a training loop: its rate, and the loader's
    body = "".join(
        f"<tr><td>{w['workers']}</td><td>{num(w.get('samples_per_s'))}"
        + (f" (measured {num(w['measured_samples_per_s'])})"
           if w.get("measured_samples_per_s") else "")
        + (f" (does not fit in {escape(w['exceeds'])})" if w.get("exceeds") else "")
        + "</td>"
        + (f"<td>{num(w.get('loader_samples_per_s'))}</td>" if loop else "")
        + f"<td>{escape(str(w.get('basis', '')))}</td></tr>"
        for w in rows
    )
    head = "<th>loop samples/s</th><th>loader alone</th>" if loop else "<th>samples/s</th>"
    return (
        f"<h2>What if (estimated)</h2><table><tr><th>workers</th>{head}"
        f"<th>basis</th></tr>{body}</table>"
    )


def objects_table(data: dict[str, Any]) -> str:
    """The loader with larger objects a request, or more requests in flight (``what_if`` rows of
    kinds ``objects`` and ``in_flight``)."""
    rows = [w for w in data.get("what_if") or [] if w.get("kind") == "objects"]
    if not rows:
        return ""
    now = (f"<tr><td>{rows[0]['now_samples_per_request']:g} (now)</td>"
           f"<td>{num(rows[0]['now_samples_per_s'])}</td><td>measured stage times</td></tr>")
    body = "".join(
        f"<tr><td>{w['samples_per_request']}</td><td>{num(w['samples_per_s'])}</td>"
        f"<td>{escape(str(w.get('basis', '')))}</td></tr>"
        for w in rows
    )
    flying = "".join(
        f"<tr><td>1, {w['requests_in_flight']} in flight a worker</td>"
        f"<td>{num(w['samples_per_s'])}</td><td>{escape(str(w.get('basis', '')))}</td></tr>"
        for w in data.get("what_if") or [] if w.get("kind") == "in_flight"
    )  # fmt: skip
    return (
        f"<h2>What if larger objects (estimated, {rows[0]['workers']} workers)</h2><table><tr>"
        f"<th>samples a request</th><th>loader samples/s</th><th>basis</th></tr>{now}{body}"
        f"{flying}</table>"
    )


def _describe(data: dict[str, Any]) -> str:
    meta = data.get("meta") or {}
    bits = [f"{data.get('mode')} mode", str(data.get("framework"))]
    if meta.get("dataset"):
        bits.append(f"dataset {meta['dataset']}")
    if "num_workers" in meta:
        bits.append(loader_phrase(meta))
    bits.append(
        f"{data.get('batches')} batches, {data.get('samples')} samples in "
        f"{num(data.get('wall_s'))} s"
    )
    covers = coverage(data)
    if covers:
        bits.append(f"the report {covers}")
    if data.get("interrupted"):
        bits.append("interrupted: partial results")
    return escape(" · ".join(bits))


def body(data: dict[str, Any]) -> str:
    """The report's ``<div class="pipeprof">``."""
    data = visible(data)
    v = data.get("verdict") or {}
    loop = data.get("loop")
    parts = [
        f'<h1>pipeprof report</h1><p class="dim">{_describe(data)}</p>',
        f'<div class="verdict {escape(str(v.get("severity", "info")))}" '
        f'data-kind="{escape(str(v.get("kind")))}" '
        f'data-borderline="{str(bool(v.get("borderline"))).lower()}">'
        f"<b>{escape(headline(data))}</b>"
        + (f'<br><span class="dim">{escape(str(v["note"]))}</span>' if v.get("note") else "")
        + f"</div>{cards(data)}",
    ]
    if loop:
        comm = comm_line(data)
        parts.append(
            "<h2>Where each step's time goes</h2>" + charts.step_breakdown(loop)
            + (f'<p class="dim comm">{escape(comm)}</p>' if comm else "")
        )  # fmt: skip
        timeline = timelines.step_timeline(data)
        if timeline:
            parts.append("<h2>Time per step</h2>" + timeline)
        if loop.get("regions"):
            parts.append("<h2>Regions (mean per call)</h2>" + charts.region_bars(loop["regions"]))
    elif data.get("batch_waits"):
        parts.append("<h2>Wait for each batch</h2>" + timelines.step_timeline(data))
    util_chart = timelines.utilisation_timeline(data)
    gpu_text = gpu_lines(data)
    if util_chart or gpu_text:
        parts.append(f"<h2>Utilisation</h2>{util_chart}{gpu_text}")
    memory_chart = timelines.memory_timeline(data)
    if memory_chart:
        parts.append(f"<h2>Private memory</h2>{memory_chart}")
    if data.get("stages"):
        parts.append(
            "<h2>Pipeline stages (time summed over workers)</h2>"
            f"{charts.stage_icicle(data['stages'])}{stage_rows(data)}"
        )
    h5 = h5_table(data)
    if h5:
        head = "".join(f"<th>{escape(c)}</th>" for c in H5_COLUMNS)
        body_rows = "".join(
            "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>" for cells in h5
        )
        epochs = "".join(f'<p class="dim">{escape(line)}</p>' for line in h5_epochs(data))
        parts.append(
            f'<h2>HDF5 reads</h2><table class="hdf5"><tr>{head}</tr>{body_rows}</table>{epochs}'
        )
    net = fetch_table(data)
    if net:
        head = "".join(f"<th>{escape(c)}</th>" for c in FETCH_COLUMNS)
        body_rows = "".join(
            "<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>" for cells in net
        )
        parts.append(
            "<h2>Network reads (load/fetch)</h2>"
            f'<table class="fetch"><tr>{head}</tr>{body_rows}</table>'
        )
    if data.get("workers"):
        ratio = balance(data)
        note = f'<p class="dim">busiest worker {ratio:.2f}× the mean</p>' if ratio else ""
        shares = charts.sample_shares(data.get("accounting"))
        parts.append(f"<h2>Workers</h2>{charts.worker_bars(data['workers'])}{note}{shares}")
    parts.append(f"<h2>Findings</h2>{finding_blocks(data)}{what_if_table(data)}"
                 f"{objects_table(data)}")
    notes = " ".join(escape(str(n)) for n in data.get("notes") or [])
    parts.append(f'<p class="dim overhead">{escape(overhead_line(data))}. {notes}</p>')
    return f'<div class="pipeprof">{"".join(parts)}</div>'


def page(inner: str, title: str = "pipeprof report") -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title></head><body>{inner}</body></html>\n"
    )


class HTMLRenderer(Renderer):
    """A whole page, or (``fragment=True``) the part Jupyter embeds in a cell's output."""

    output_file_extension = ".html"

    def __init__(self, fragment: bool = False) -> None:
        self.fragment = fragment

    def render(self, report: Profiled) -> str:
        data = report.to_dict()
        if not data.get("loop"):
            data["batch_waits"] = batch_waits(report.session)
        return self.render_dict(data)

    def render_dict(self, data: dict[str, Any]) -> str:
        inner = f"<style>{CSS}</style>{body(data)}"
        return inner if self.fragment else page(inner)
