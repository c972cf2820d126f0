"""The Chrome trace checked against the Trace Event Format: required fields, per-track timestamps
that never go backwards, slices that nest, one process track per worker, counters for GPU/CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

import pytest
from golden_reports import GOLDEN, LOADER, LOOP, golden_report
from machine import PIPEPROF
from pipelines import CostDataset, Scale, spin
from torch.utils.data import DataLoader
from torchvision import transforms

import pipeprof
from pipeprof.render.chrome import EPS_US, assign_lanes, build_trace, inclusive_durations

META = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def check_trace(trace: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Assert the Trace Event Format rules pipeprof relies on; return events per (pid, tid)."""
    json.dumps(trace, allow_nan=False)  # plain JSON: no NaN or Infinity
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] == "ms"
    names: dict[str, set[Any]] = {"process": set(), "thread": set()}
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        assert ev["ph"] in {"M", "X", "C"}, ev
        assert isinstance(ev["name"], str) and ev["name"], ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int), ev
        if ev["ph"] == "M":
            assert ev["name"] in META and isinstance(ev["args"], dict), ev
            if ev["name"] == "process_name":
                names["process"].add(ev["pid"])
            if ev["name"] == "thread_name":
                names["thread"].add((ev["pid"], ev["tid"]))
            continue
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0, ev
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
            assert isinstance(ev["cat"], str), ev
        else:
            assert ev["args"] and all(isinstance(v, (int, float)) for v in ev["args"].values()), ev
        tracks[(ev["pid"], ev["tid"])].append(ev)
    for (pid, tid), events in tracks.items():
        assert pid in names["process"], f"pid {pid} has no process_name"
        stamps = [e["ts"] for e in events]
        assert stamps == sorted(stamps), f"timestamps go backwards on track {pid}/{tid}"
        if events[0]["ph"] == "X":
            assert (pid, tid) in names["thread"], f"thread {pid}/{tid} has no thread_name"
            stack: list[float] = []
            for e in events:  # complete events on one thread must nest
                while stack and stack[-1] <= e["ts"] + EPS_US:
                    stack.pop()
                end = e["ts"] + e["dur"]
                assert not stack or end <= stack[-1] + EPS_US, f"{e} overlaps its parent"
                stack.append(end)
    return tracks


def processes(trace: dict[str, Any]) -> dict[str, int]:
    return {
        e["args"]["name"]: e["pid"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }


def test_loader_trace_has_a_track_per_worker_and_every_span():
    report = golden_report(LOADER)
    trace = json.loads(report.render("chrome"))
    tracks = check_trace(trace)
    procs = processes(trace)
    s = report.session
    assert set(procs) == {"main process", *s.workers} and len(s.workers) == 2
    for w in s.workers:
        assert procs[w] == s.workers[w].pid
        spans = [x for x in s.spans if x[0] == w]
        events = [e for (pid, _), evs in tracks.items() if pid == procs[w] for e in evs]
        assert len(events) == len(spans) > 0
        assert {e["name"] for e in events} == {x[1] for x in s.spans if x[0] == w}
    waits = [e for e in trace["traceEvents"] if e.get("cat") == "wait"]
    assert len(waits) == s.batches and all("batch" in e["args"] for e in waits)
    assert waits[0]["name"].startswith("enumerate(DataLoader)#")


def test_stage_spans_become_inclusive_so_transforms_nest_in_load():
    report = golden_report(LOADER)
    trace = build_trace(report.to_dict(), report.session)
    worker0 = processes(trace)["worker0"]
    events = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == worker0]
    assert {e["tid"] for e in events} == {worker0}  # one lane: everything nests
    loads = [e for e in events if e["name"] == "load"]
    crops = [e for e in events if e["name"] == "transform/Crop"]
    assert len(crops) == len(loads)
    for load, crop in zip(loads, crops):
        assert load["ts"] <= crop["ts"] and crop["ts"] + crop["dur"] <= load["ts"] + load["dur"]
        assert load["args"]["self_ms"] * 1e3 < load["dur"]  # widened by the detached transforms


def test_loop_trace_has_steps_regions_and_counters():
    report = golden_report(LOOP)
    data, session = report.to_dict(), report.session
    trace = build_trace(data, session)
    check_trace(trace)
    procs = processes(trace)
    assert set(procs) == {"main process", "utilisation (sampled)", *session.workers}
    main_pid = [p["pid"] for p in data["host"]["per_process"] if p["role"] == "main"]
    assert [procs["main process"]] == main_pid  # the host sampler's main pid
    assert all(procs[w] == rec.pid for w, rec in session.workers.items())
    events = trace["traceEvents"]
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"main thread", "steps", *session.workers} <= threads
    steps = [e for e in events if e.get("cat") == "step"]
    assert [e["name"] for e in steps] == [f"step {i}" for i in range(data["loop"]["steps"])]
    regions = [e for e in events if e.get("cat") == "region"]
    assert {e["name"] for e in regions} == set(data["loop"]["regions"])
    for name, r in data["loop"]["regions"].items():
        durs = [e["dur"] for e in regions if e["name"] == name]
        assert len(durs) == r["count"]
        assert max(durs) == pytest.approx(r["max_ms"] * 1e3, abs=0.01)
    gpu = [e for e in events if e["name"] == "GPU 0 utilisation %"]
    known = [u for row in data["timeline"]["gpu"]["util"] for u in row if u is not None]
    assert len(known) < sum(len(row) for row in data["timeline"]["gpu"]["util"])  # an n/a
    assert [e["args"]["util"] for e in gpu] == known  # the n/a sample is left out, not 0
    cpu = [e for e in events if e["name"] == "CPU % (all cores)"]
    assert [e["args"]["cpu"] for e in cpu] == [
        c for c in data["timeline"]["cpu"]["cpu"] if c is not None
    ]
    waits = [e for e in events if e["name"] == "wait for data"]
    t0 = min(session.start_ns, *(x[2] for x in session.spans))  # the trace's zero
    first = session.loop.step_ring[0]
    assert waits[0]["ts"] == pytest.approx((first[0] - t0) / 1e3, abs=0.002)  # µs, one clock
    assert waits[0]["dur"] == pytest.approx(first[1] / 1e3, abs=0.002)
    assert len(waits) == sum(1 for row in session.loop.step_ring if row[1] > 0)
    assert trace["otherData"]["verdict"] == data["verdict"]["kind"] == "input-bound"


def test_trace_from_a_report_dict_alone():
    data = golden_report(LOOP).to_dict()
    trace = build_trace(data)
    check_trace(trace)
    assert set(processes(trace)) == {"main process", "utilisation (sampled)"}
    steps = sum(e.get("cat") == "step" for e in trace["traceEvents"])
    assert steps == data["loop"]["steps"] == len(data["timeline"]["steps"])


def test_inclusive_durations_and_lanes():
    spans = [
        (0, 30, "load"),
        (5, 10, "load/decode"),
        (20, 20, "transform/Crop"),
        (40, 5, "transform/Flip"),
        (100, 10, "collate"),
    ]
    assert inclusive_durations(spans) == [55, 10, 20, 5, 10]
    evs = [
        {"ts": 0.0, "dur": 10.0},
        {"ts": 5.0, "dur": 10.0},
        {"ts": 6.0, "dur": 1.0},
        {"ts": 20.0, "dur": 1.0},
    ]
    lanes = assign_lanes(evs)
    assert [[e["ts"] for e in lane] for lane in lanes] == [[0.0, 6.0, 20.0], [5.0]]


def test_real_training_loop_trace(tmp_path):
    ds = CostDataset(24, load_ms=0.5, transform=transforms.Compose([Scale(1.0)]))
    prof = pipeprof.Profiler(sample_hz=50)
    with prof:
        for _ in prof.wrap(DataLoader(ds, batch_size=4, num_workers=2)):
            with prof.region("Forward"):
                spin(1.0)
            time.sleep(0.001)
    report = prof.report()
    trace = json.loads(report.render("chrome"))
    check_trace(trace)
    procs = processes(trace)
    assert {"main process", "worker0", "worker1"} <= set(procs)
    assert procs["worker0"] != procs["worker1"]
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"load", "transform/Scale", "collate", "Forward", "step 0"} <= names


def test_cli_writes_a_trace_by_flag_and_by_extension(tmp_path):
    src = str(GOLDEN / LOADER)
    out = tmp_path / "run.trace.json"
    res = subprocess.run(
        [*PIPEPROF, "report", src, "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    check_trace(json.loads(out.read_text()))
    res = subprocess.run(
        [sys.executable, "-m", "pipeprof", "report", src, "--format", "chrome"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == json.loads(out.read_text())
