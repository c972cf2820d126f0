"""The profile as a Chrome Trace Event Format file, for Perfetto (ui.perfetto.dev) and
chrome://tracing.

One process per pipeprof track: ``main`` (the training loop: waits for batches, host-to-device
copies, the loop's steps and regions) and one per DataLoader worker, with a span for every stage
call kept in the session's span ring. GPU and CPU samples become counter tracks of a
``utilisation`` process. Timestamps are microseconds from the start of the profile; all processes
share one clock (``perf_counter_ns``), so worker spans line up with the waits they caused.

NOTE [ Inclusive stage spans ]
The session keeps each stage call's *self* time (see NOTE [ Stage paths and self time ] in
recorder.py): ``load`` excludes the transform its ``__getitem__`` called. A trace needs the
interval the call covered, so a stage span is widened by the spans of the detached stages that
started inside it (``transform/*`` inside ``load``). What still does not nest (a span ring that
dropped a child, regions that overlap) goes to an extra lane of the same process rather than
producing a malformed trace.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pipeprof.render.base import Profiled, Renderer

if TYPE_CHECKING:
    from pipeprof.core.session import Session

Event = dict[str, Any]
UTIL_PID = 999_999  # the process that holds the sampler counters
LANE_STRIDE = 1_000_000  # extra lanes of a process get tid = pid + k * LANE_STRIDE
EPS_US = 0.0005  # µs values carry 1 ns resolution; sums of rounded floats are off by less


def _us(ns: float) -> float:
    return round(ns / 1e3, 3)


def inclusive_durations(spans: list[tuple[int, int, str]]) -> list[int]:
    """Inclusive ns of each ``(start_ns, self_ns, path)`` stage span of one track, sorted by
    start (NOTE [ Inclusive stage spans ])."""
    n = len(spans)
    incl = [0] * n
    for i in range(n - 1, -1, -1):
        start, dur, path = spans[i]
        end = start + dur
        j = i + 1
        while j < n and spans[j][0] < end:
            child_end = spans[j][0] + incl[j]
            if not spans[j][2].startswith(path + "/"):  # detached: not in our self time
                end += incl[j]
            j += 1
            while j < n and spans[j][0] < child_end:  # the child's own contents
                j += 1
        incl[i] = end - start
    return incl


def assign_lanes(events: list[Event]) -> list[list[Event]]:
    """Split complete events into lanes in which every pair is disjoint or nested."""
    lanes: list[tuple[list[float], list[Event]]] = []
    for ev in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        end = ev["ts"] + ev["dur"]
        for stack, lane in lanes:
            while stack and stack[-1] <= ev["ts"] + EPS_US:
                stack.pop()
            if not stack or end <= stack[-1] + EPS_US:
                stack.append(end)
                lane.append(ev)
                break
        else:
            lanes.append(([end], [ev]))
    return [lane for _, lane in lanes]


class _Trace:
    def __init__(self, t0_ns: int, start_ns: int) -> None:
        self.t0 = t0_ns  # the trace's zero; never after the first span
        self.start_ns = start_ns  # the profile's start: the report timeline's zero
        self.meta: list[Event] = []
        self.events: list[Event] = []

    def process(self, pid: int, name: str, order: int) -> None:
        self.meta += [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": name}},
            {
                "name": "process_sort_index",
                "ph": "M",
                "pid": pid,
                "tid": pid,
                "args": {"sort_index": order},
            },
        ]

    def lanes(self, pid: int, first_tid: int, name: str, events: list[Event], order: int) -> int:
        """Put ``events`` on thread ``first_tid`` and, where they do not nest, extra lanes."""
        for k, lane in enumerate(assign_lanes(events)):
            tid = first_tid + k * LANE_STRIDE
            label = name if k == 0 else f"{name} ({k + 1})"
            self.meta += [
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": label}},
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": order + k},
                },
            ]
            for ev in lane:
                self.events.append({**ev, "pid": pid, "tid": tid})
        return order + 100

    def span(self, name: str, cat: str, start_ns: int, dur_ns: int, **args: Any) -> Event:
        ev: Event = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": _us(start_ns - self.t0),
            "dur": _us(max(0, dur_ns)),
        }
        if args:
            ev["args"] = args
        return ev

    def to_dict(self, other: dict[str, Any]) -> dict[str, Any]:
        events = sorted(self.events, key=lambda e: (e["ts"], -e.get("dur", 0)))
        return {"traceEvents": self.meta + events, "displayTimeUnit": "ms", "otherData": other}


def _pids(session: Session, tracks: Iterable[str], data: dict[str, Any]) -> dict[str, int]:
    """A pid per track: the real one where the session knows it, else a made-up one."""
    known = {t: w.pid for t, w in session.workers.items() if w.pid}
    if "main" not in known:
        procs = (data.get("host") or {}).get("per_process") or []
        main = [p["pid"] for p in procs if p.get("role") == "main" and p.get("pid")]
        known["main"] = main[0] if main else 1
    out: dict[str, int] = {}
    for i, track in enumerate(sorted(set(tracks) | {"main"}, key=_track_key)):
        pid = known.get(track)
        out[track] = pid if pid and pid not in out.values() else 900_000 + i
    return out


def _track_key(track: str) -> tuple[int, str]:
    if track == "main":
        return (-1, track)
    return (int(track[6:]), track) if track[6:].isdigit() else (1 << 30, track)


def _stage_spans(tr: _Trace, session: Session, track: str, spans: list[Any]) -> list[Event]:
    """Complete events of one track's raw spans (waits, regions and stages)."""
    stages = session.stages.get(track, {})
    batches = {(b[2], b[3]): b for b in session.batch_ring} if track == "main" else {}
    staged = sorted((s[2], s[3], s[1]) for s in spans if s[1] in stages)
    out = [
        tr.span(path, path.split("/", 1)[0], start, incl, self_ms=round(dur / 1e6, 6))
        for (start, dur, path), incl in zip(staged, inclusive_durations(staged))
    ]
    for _, path, start, dur in spans:
        if path in stages:
            continue
        if path.startswith("region/"):
            out.append(tr.span(path[7:], "region", start, dur))
        else:
            b = batches.get((start + dur, dur))
            args = {"batch": b[0], "from": b[1], "samples": b[4]} if b else {}
            cat = "hand-over" if path == "wait/hand-over" else "wait"  # NOTE [ Wait, split ]
            out.append(tr.span(path, cat, start, dur, **args))
    return out


def _step_events(tr: _Trace, session: Session | None, data: dict[str, Any]) -> list[Event]:
    """The loop's steps: a ``step`` span holding its wait, transfer and compute phases."""
    ring = list(session.loop.step_ring) if session is not None and session.loop else []
    if ring:
        rows = [(r[0], r[1], r[2], r[3]) for r in ring]
    else:
        rows = [
            (
                tr.start_ns + round(r[0] * 1e9),
                round(r[1] * 1e6),
                round(r[2] * 1e6),
                round(r[3] * 1e6),
            )
            for r in (data.get("timeline") or {}).get("steps") or []
        ]
    first = max(0, int((data.get("loop") or {}).get("steps") or len(rows)) - len(rows))
    out = []
    for i, (t, wait, transfer, compute) in enumerate(rows):
        out.append(tr.span(f"step {first + i}", "step", t, wait + transfer + compute))
        for name, start, dur in (
            ("wait for data", t, wait),
            ("transfer", t + wait, transfer),
            ("compute", t + wait + transfer, compute),
        ):
            if dur > 0:
                out.append(tr.span(name, name.split()[0], start, dur))
    return out


def _counters(tr: _Trace, data: dict[str, Any]) -> None:
    """GPU and CPU samples (the report's timeline, seconds from the start) as counter tracks."""
    tl = data.get("timeline") or {}
    gpu, cpu = tl.get("gpu") or {}, tl.get("cpu") or {}
    if not gpu.get("t_s") and not cpu.get("t_s"):
        return
    tr.process(UTIL_PID, "utilisation (sampled)", 10_000)
    shift_us = (tr.start_ns - tr.t0) / 1e3  # the timeline counts from the profile's start

    def add(name: str, t_s: float, values: dict[str, Any]) -> None:
        known = {k: v for k, v in values.items() if v is not None}  # n/a is not 0: no sample
        if known:
            tr.events.append(
                {
                    "name": name,
                    "ph": "C",
                    "ts": round(t_s * 1e6 + shift_us, 3),
                    "pid": UTIL_PID,
                    "tid": UTIL_PID,
                    "args": known,
                }
            )

    for t, row in zip(gpu.get("t_s") or [], gpu.get("util") or []):
        for d, value in enumerate(row or []):
            add(f"GPU {d} utilisation %", t, {"util": value})
    host_tl = (data.get("host") or {}).get("timeline") or {}
    cols = (
        [c for c in ("main_cpu", "children_cpu") if len(host_tl.get(c) or []) == len(cpu["cpu"])]
        if cpu.get("t_s")
        else []
    )
    for i, (t, value) in enumerate(zip(cpu.get("t_s") or [], cpu.get("cpu") or [])):
        add("CPU % (all cores)", t, {"cpu": value})
        if cols:
            add("CPU % of a core", t, {c: host_tl[c][i] for c in cols})


def build_trace(data: dict[str, Any], session: Session | None = None) -> dict[str, Any]:
    """The Trace Event Format object (``{"traceEvents": [...], ...}``) of a report."""
    spans: list[Any] = []
    if session is not None:
        with session.settled():
            spans = list(session.spans)
    t0 = session.start_ns if session is not None else 0
    if spans:
        t0 = min(t0, min(s[2] for s in spans))
    tr = _Trace(t0, session.start_ns if session is not None else 0)
    by_track: dict[str, list[Any]] = {}
    for s in spans:
        by_track.setdefault(s[0], []).append(s)
    tracks = set(by_track) | (set(session.workers) if session is not None else set())
    pids = _pids(session, tracks, data) if session is not None else {"main": 1}
    for order, track in enumerate(sorted(pids, key=_track_key)):
        pid = pids[track]
        tr.process(pid, "main process" if track == "main" else track, order)
        events = _stage_spans(tr, session, track, by_track.get(track, [])) if session else []
        lane = tr.lanes(pid, pid, "main thread" if track == "main" else track, events, 0)
        if track == "main":
            lane = tr.lanes(pid, pid + 1, "steps", _step_events(tr, session, data), lane)
    _counters(tr, data)
    verdict = data.get("verdict") or {}
    return tr.to_dict(
        {
            "generator": "pipeprof",
            "schema": data.get("schema"),
            "mode": data.get("mode"),
            "verdict": verdict.get("kind"),
            "headline": verdict.get("headline"),
        }
    )


RANK_PID = 10_000_000  # a rank's processes in a job trace: pid + (rank + 1) * RANK_PID


def job_trace(ranks: list[tuple[int, str, dict[str, Any], Session]]) -> dict[str, Any]:
    """One trace of a distributed job from its ranks' ``(rank, host, report dict, session)``:
    each rank's processes (main, workers) under its own pids, named ``rank N · ...``, in rank
    order. Each rank's clock (``perf_counter_ns``, per host) is put on the wall clock its
    session noted at the same moment (``started_at``, next to ``start_ns``), so ranks on one
    host line up to microseconds and across hosts as well as their clocks agree (NTP: about a
    millisecond)."""
    traces = []
    for rank, host, data, session in ranks:
        t = build_trace(data, session)
        t0 = min([session.start_ns] + [s[2] for s in session.spans]) if session.spans else (
            session.start_ns)  # fmt: skip
        wall0 = session.started_at + (t0 - session.start_ns) / 1e9  # the trace's zero, wall
        traces.append((rank, host, t, wall0))
    origin = min(w for *_, w in traces)
    meta: list[Event] = []
    events: list[Event] = []
    for rank, host, t, wall0 in traces:
        shift = round((wall0 - origin) * 1e6, 3)
        base = (rank + 1) * RANK_PID
        for ev in t["traceEvents"]:
            ev = {**ev, "pid": ev["pid"] % RANK_PID + base, "tid": ev["tid"] + base}
            if ev["ph"] == "M":
                if ev["name"] == "process_name":
                    ev["args"] = {"name": f"rank {rank} · {ev['args']['name']} ({host})"}
                elif ev["name"] == "process_sort_index":
                    ev["args"] = {"sort_index": rank * 1000 + ev["args"]["sort_index"]}
                meta.append(ev)
            else:
                ev["ts"] = round(ev["ts"] + shift, 3)
                events.append(ev)
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"generator": "pipeprof", "schema": "pipeprof-job-trace/1",
                          "ranks": [r for r, *_ in traces],
                          "clock": "each rank's monotonic clock on the wall clock"}}  # fmt: skip


class ChromeRenderer(Renderer):
    """Trace Event Format JSON: open it in ui.perfetto.dev or chrome://tracing."""

    output_file_extension = ".trace.json"

    def __init__(self, indent: int | None = None) -> None:
        self.indent = indent

    def render(self, report: Profiled) -> str:
        return json.dumps(build_trace(report.to_dict(), report.session), indent=self.indent)

    def render_dict(self, data: dict[str, Any]) -> str:
        return json.dumps(build_trace(data), indent=self.indent)
