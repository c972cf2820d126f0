"""Hand-made loop-mode reports (and their Sessions) for the renderer tests, plus golden files.

``loop_case()`` builds a training loop on one GPU by hand: steps with known wait, transfer and
compute, regions, two workers whose spans nest (``load`` holding ``load/decode`` and detached
``transform/*`` calls), NVML and host samples with one n/a. It returns the report dictionary a
renderer sees (schema ``pipeprof/1``, loop mode) and the Session the Chrome trace reads, both
deterministic. ``assert_golden`` compares a rendering with ``tests/golden/NAME`` and rewrites the
file instead when ``PIPEPROF_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from pipeprof.core.session import Session, WorkerRecord
from pipeprof.core.stats import Stat

GOLDEN = Path(__file__).parent / "golden"
START = 5_000_000_000_000  # ns: the profile's start on the shared perf_counter clock
MS = 1_000_000
BATCH = 4


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("PIPEPROF_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}: run PIPEPROF_UPDATE_GOLDEN=1 pytest {path.name}"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (
        f"{name} differs from its golden file; if the change is intended, accept it with "
        "PIPEPROF_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py tests/test_compare.py"
    )


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def _row(durs_ms: list[float], samples: int, batches: int, tracks: list[str]) -> dict[str, Any]:
    total = sum(durs_ms)
    return {
        "total_s": round(total / 1e3, 9),
        "count": len(durs_ms),
        "mean_ms": round(total / len(durs_ms), 6),
        "p50_ms": _pct(durs_ms, 50),
        "p95_ms": _pct(durs_ms, 95),
        "p99_ms": _pct(durs_ms, 99),
        "max_ms": max(durs_ms),
        "per_sample_ms": round(total / samples, 6),
        "per_batch_ms": round(total / batches, 6),
        "share": None,
        "tracks": tracks,
    }


def _steps(n: int, wait_ms: float, compute_ms: float) -> list[tuple[int, float, float, float]]:
    """(t_req_ns, wait_ms, transfer_ms, compute_ms) per step; the first waits for start-up."""
    t, rows = START + 20 * MS, []
    for i in range(n):
        wait = 400.0 if i == 0 else (wait_ms * 2 if i % 3 == 0 else wait_ms)
        rows.append((t, wait, 1.5, compute_ms))
        t += round((wait + 1.5 + compute_ms + 0.5) * MS)
    return rows


def _worker_spans(n_batches: int, crop_ms: float, workers: int) -> list[tuple[str, str, int, int]]:
    spans = []
    for i in range(n_batches):
        w, k = i % workers, i // workers
        t = START + 30 * MS + k * 60 * MS * 2 // workers
        for j in range(BATCH):
            s0 = t + round(j * (3.5 + crop_ms) * MS)
            spans += [
                (f"worker{w}", "load", s0, 3 * MS),  # self time: the transforms are detached
                (f"worker{w}", "load/decode", s0 + MS // 2, MS),
                (f"worker{w}", "transform/RandomResizedCrop", s0 + 2 * MS, round(crop_ms * MS)),
                (f"worker{w}", "transform/ToTensor", s0 + round((2 + crop_ms) * MS), MS // 2),
            ]
        spans.append((f"worker{w}", "collate", t + round(BATCH * (3.5 + crop_ms) * MS), MS))
    return spans


def _gpu_util(steps: list[tuple[int, float, float, float]], t0: int, t1: int) -> float:
    busy = 0
    for t, wait, transfer, compute in steps:
        c0 = t + round((wait + transfer) * MS)
        busy += max(0, min(t1, c0 + round(compute * MS)) - max(t0, c0))
    return round(5 + 90 * busy / (t1 - t0), 1)


def loop_case(after: bool = False) -> tuple[dict[str, Any], Session]:
    """An input-bound loop (``after=True``: the same loop once the pipeline was fixed)."""
    workers, wait_ms, crop_ms = (4, 0.4, 0.6) if after else (2, 14.0, 2.0)
    n, compute_ms = 24, 9.0
    steps = _steps(n, wait_ms, compute_ms)
    end = steps[-1][0] + round((sum(steps[-1][1:]) + 0.5) * MS) + 5 * MS
    wall_s = (end - START) / 1e9
    spans = _worker_spans(n, crop_ms, workers)
    main: list[tuple[str, str, int, int]] = []
    for t, wait, transfer, _ in steps:
        main.append(
            (
                "main",
                "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                t,
                round(wait * MS),
            )
        )
        main.append(("main", "transfer/h2d", t + round(wait * MS), round(transfer * MS)))
        c0 = t + round((wait + transfer) * MS)
        main += [
            ("main", "region/Forward", c0, 6 * MS),
            ("main", "region/Backward", c0 + 6 * MS, 3 * MS),
            ("main", "region/Log", c0 + 9 * MS, MS // 2),
        ]
    session = Session(mode="loop", start_ns=START, end_ns=end, batches=n, samples=n * BATCH)
    session.spans.extend(sorted(spans + main, key=lambda s: s[2]))
    for track, path, _, _ in spans + main:
        if not path.startswith(("region/", "enumerate")):
            session.stages.setdefault(track, {}).setdefault(path, Stat())
    for w in range(workers):
        session.workers[f"worker{w}"] = WorkerRecord(
            pid=4242 + w, batches=n // workers, samples=n * BATCH // workers
        )
    session.loop = {
        "steps": n,
        "step_ring": [[t, round(a * MS), round(b * MS), round(c * MS), 0] for t, a, b, c in steps],
    }
    gt = [START + k * 50 * MS for k in range(1, int(wall_s * 20) + 1)]
    util = [[None] if k == 3 else [_gpu_util(steps, t - 50 * MS, t)] for k, t in enumerate(gt)]
    cpu = [70.0 + 20 * (k % 2) for k in range(len(gt))]
    session.gpu = {
        "available": True,
        "note": None,
        "hz": 20.0,
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "util_mean": 41.5,
                "util_p50": 38.0,
                "util_max": 95.0,
                "mem_util_mean": 20.0,
                "mem_used_max_mb": 21504.0,
                "mem_total_mb": 81559.0,
                "power_mean_w": 310.0,
                "sm_clock_mean_mhz": 1755.0,
            }
        ],
        "timeline": {"t_ns": gt, "util": util},
    }
    session.host = {
        "available": True,
        "note": None,
        "hz": 20.0,
        "cpu_count": 8,
        "cpu_util_mean": 78.0,
        "cpu_util_max": 90.0,
        "saturated_cores_mean": 2.5,
        "per_process": [
            {"pid": 4200, "role": "main", "cpu_mean": 98.0},
            {"pid": 4242, "role": "child", "cpu_mean": 71.0},
            {"pid": 4243, "role": "child", "cpu_mean": 69.0},
        ],
        "timeline": {
            "t_ns": gt,
            "cpu": cpu,
            "main_cpu": [98.0] * len(gt),
            "children_cpu": [140.0] * len(gt),
        },
    }
    return _report(session, steps, spans + main, workers, wall_s, after), session


def _report(
    session: Session,
    steps: list[tuple[int, float, float, float]],
    spans: list[Any],
    workers: int,
    wall_s: float,
    after: bool,
) -> dict[str, Any]:
    n, samples = len(steps), len(steps) * BATCH
    by_path: dict[str, list[float]] = {}
    for _, path, _, dur in spans:
        if not path.startswith(("region/", "enumerate")):
            by_path.setdefault(path, []).append(dur / MS)
    stages = {
        p: _row(d, samples, n, sorted({s[0] for s in spans if s[1] == p}))
        for p, d in sorted(by_path.items())
    }
    for parent in ("transform", "transfer"):
        kids = [r for p, r in stages.items() if p.startswith(parent + "/")]
        total = sum(r["total_s"] for r in kids)
        stages[parent] = {
            "total_s": round(total, 9),
            "count": max(r["count"] for r in kids),
            "mean_ms": None,
            "p50_ms": None,
            "p95_ms": None,
            "p99_ms": None,
            "max_ms": None,
            "derived": True,
            "tracks": [],
            "per_sample_ms": round(total * 1e3 / samples, 6),
            "per_batch_ms": round(total * 1e3 / n, 6),
            "share": None,
        }
    order = [
        "load",
        "load/decode",
        "transform",
        "transform/RandomResizedCrop",
        "transform/ToTensor",
        "collate",
        "transfer",
        "transfer/h2d",
    ]
    stages = {p: stages[p] for p in order}
    top = sum(r["total_s"] for p, r in stages.items() if "/" not in p)
    for p, r in stages.items():
        r["share"] = round(r["total_s"] / top, 6) if "/" not in p else None
    parts = {
        k: sum(s[i] for s in steps) / 1e3 for i, k in ((1, "wait"), (2, "transfer"), (3, "compute"))
    }
    parts["overhead"] = 0.5 * n / 1e3

    def view(p: dict[str, float], steps_n: int) -> dict[str, Any]:
        wall = sum(p.values())
        out: dict[str, Any] = {"steps": steps_n, "wall_s": round(wall, 9)}
        for k, v in p.items():
            out[f"{k}_s"] = round(v, 9)
            out[f"{k}_fraction"] = round(v / wall, 6)
        return out

    steady = {k: v - (steps[0][1] / 1e3 if k == "wait" else 0) for k, v in parts.items()}
    steady = {
        k: v - ({"transfer": 1.5, "compute": 9.0, "overhead": 0.5}.get(k, 0) / 1e3)
        for k, v in steady.items()
    }
    step_ms = [s[1] + s[2] + s[3] + 0.5 for s in steps[1:]]
    loop = {
        **view(parts, n),
        "epochs": 1,
        "startup_s": 0.4,
        "steady": view(steady, n - 1),
        "step_ms": {
            "mean_ms": round(sum(step_ms) / len(step_ms), 6),
            "p50_ms": _pct(step_ms, 50),
            "p95_ms": _pct(step_ms, 95),
            "p99_ms": _pct(step_ms, 99),
            "max_ms": max(step_ms),
        },
        "regions": {
            name: {
                "total_s": round(ms * n / 1e3, 9),
                "count": n,
                "mean_ms": ms,
                "p50_ms": ms,
                "p95_ms": ms,
                "p99_ms": ms,
                "max_ms": ms,
            }
            for name, ms in (("Forward", 6.0), ("Backward", 3.0), ("Log", 0.5))
        },
        "throughput": {
            "effective_samples_per_s": round(samples / sum(parts.values()), 3),
            "compute_samples_per_s": round(samples / parts["compute"], 3),
            "replay_compute_samples_per_s": None,
            "speedup_if_data_free": round(sum(parts.values()) / parts["compute"], 3),
        },
        "replay": None,
        "gpu_util_waiting": 6.0 if not after else 40.0,
        "gpu_util_computing": 93.0,
        "idle_while_waiting_fraction": 0.52 if not after else 0.02,
    }
    rel = [[round((s[0] - START) / 1e9, 6), s[1], s[2], s[3]] for s in steps]
    gtl, htl = session.gpu["timeline"], session.host["timeline"]  # type: ignore[index]
    timeline = {
        "steps": rel,
        "gpu": {"t_s": [round((t - START) / 1e9, 4) for t in gtl["t_ns"]], "util": gtl["util"]},
        "cpu": {"t_s": [round((t - START) / 1e9, 4) for t in htl["t_ns"]], "cpu": htl["cpu"]},
    }
    frac = loop["steady"]["wait_fraction"]
    if after:
        verdict = {
            "kind": "compute-bound",
            "severity": "low",
            "stage": None,
            "fraction": round(loop["steady"]["compute_fraction"], 4),
            "headline": f"compute-bound: the GPU spent "
            f"{loop['steady']['compute_fraction']:.0%} of step time computing; data was "
            "ready",
        }
        found: list[dict[str, Any]] = []
    else:
        verdict = {
            "kind": "input-bound",
            "severity": "high",
            "stage": "transform/RandomResizedCrop",
            "fraction": round(frac, 4),
            "headline": f"input-bound: the GPU waited for data {frac:.0%} of the time; "
            "transform/RandomResizedCrop limits the pipeline",
        }
        found = [
            {
                "id": "workers-needed",
                "severity": "critical",
                "stage": "transform/RandomResizedCrop",
                "message": "4 workers would feed the measured 444 samples/s of compute (176 "
                "samples/s per worker); you have 2",
                "evidence": {
                    "compute_samples_per_s": 444.4,
                    "samples_per_s_per_worker": 176.0,
                    "workers_needed": 4,
                    "num_workers": 2,
                    "cores": 8,
                },
                "fix": "DataLoader(num_workers=4)",
            },
            {
                "id": "dominant-stage",
                "severity": "info",
                "stage": "transform/RandomResizedCrop",
                "message": "transform/RandomResizedCrop takes 36% of the pipeline's time (2 ms per "
                "sample)",
                "evidence": {"share": 0.36},
                "fix": "apply it to whole batches on the "
                "GPU (torchvision.transforms.v2 works on batched tensors)",
            },
        ]
    worker_rows = [
        {
            "id": w,
            "track": f"worker{w}",
            "pid": 4242 + w,
            "busy_s": round(n // workers * (BATCH * 5.5 + 1) / 1e3 * (1 + 0.1 * w), 6),
            "batches": n // workers,
            "samples": n * BATCH // workers,
            "busy_fraction": round(min(1.0, n // workers * 0.023 / wall_s), 6),
            "samples_per_busy_s": 174.0 - 9 * w,
        }
        for w in range(workers)
    ]
    return {
        "schema": "pipeprof/1",
        "mode": "loop",
        "framework": "torch",
        "batches": n,
        "samples": samples,
        "wall_s": round(wall_s, 9),
        "throughput": {
            "samples_per_s": round(samples / wall_s, 3),
            "batches_per_s": round(n / wall_s, 3),
        },
        "startup_s": 0.4,
        "steady": {"samples_per_s": None, "batches_per_s": None, "wall_s": None},
        "latency": {
            "count": n - 1,
            "mean_ms": None,
            "p50_ms": None,
            "p95_ms": None,
            "p99_ms": None,
            "max_ms": None,
        },
        "stages": stages,
        "loop": loop,
        "workers": worker_rows,
        "gpu": session.gpu,
        "host": session.host,
        "meta": {
            "loader": "DataLoader",
            "dataset": "ImageFolder",
            "num_workers": workers,
            "batch_size": BATCH,
            "pin_memory": True,
            "multiprocessing_context": "fork",
            "device": "cuda:0",
            "cpu_count": 8,
        },
        "notes": [],
        "interrupted": False,
        "overhead": {
            "per_event_ns": 850.0,
            "events": len(spans),
            "estimated_s": 0.000418,
            "estimated_fraction": 0.0009,
        },
        "timeline": timeline,
        "verdict": verdict,
        "findings": found,
        "what_if": [
            {
                "kind": "workers",
                "workers": k,
                "samples_per_s": 176.0 * min(k, 8),
                "basis": f"176.0 samples/s per worker × {min(k, 8)} usable cores",
            }
            for k in (1, 2, 4, 8)
        ],
    }
