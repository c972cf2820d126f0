"""The Session: everything a profile measured, as plain saveable data.

A Session is the only contract between collection (collectors, samplers) and output (analysis,
renderers). It holds aggregates whose size grows with the number of stages and workers, never
with the number of batches, plus bounded rings of raw spans and recent batches for traces.
``save``/``load`` round-trip it as JSON; ``from_dict`` fills defaults for keys an older file lacks.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

from pipeprof.core.stats import Stat

SCHEMA_VERSION = 1
SPAN_LIMIT = 200_000  # raw spans kept for traces (about 10 MB); aggregates are exact regardless
BATCH_LIMIT = 10_000  # recent per-batch records kept
STEP_RING = 10_000  # recent loop steps kept for timelines
# Per-step figures of a training loop (NOTE [ Step attribution ] in collect/loop.py), in ns
STEP_PARTS = ("wait", "transfer", "user_transfer", "compute", "overhead", "step")

Mode = Literal["loader", "loop"]
Framework = Literal["torch", "tf"]


@dataclass
class WorkerRecord:
    """What one worker process (or the main process, when there are no workers) produced."""

    pid: int = 0
    busy_ns: int = 0
    batches: int = 0
    samples: int = 0
    cpu_ns: int = 0  # the process's CPU time for its batches (0: not measured)

    def to_dict(self) -> dict[str, int]:
        return {
            "pid": self.pid,
            "busy_ns": self.busy_ns,
            "batches": self.batches,
            "samples": self.samples,
            "cpu_ns": self.cpu_ns,
        }


def _parts() -> dict[str, Stat]:
    return {k: Stat() for k in STEP_PARTS}


@dataclass
class LoopRecord:
    """A training loop's steps (``Profiler.wrap``, Keras ``fit()``): the first steps of each
    epoch (start-up) and the steady steps kept apart, as Stats per part of ``STEP_PARTS``."""

    steps: int = 0
    epochs: int = 0
    startup_ns: int | None = None  # wait for the first batch of the run
    first: dict[str, Stat] = field(default_factory=_parts)
    steady: dict[str, Stat] = field(default_factory=_parts)
    gpu_compute: Stat = field(default_factory=Stat)  # CUDA-event time of compute phases
    regions: dict[str, Stat] = field(default_factory=dict)
    replay: dict[str, Any] | None = None  # compute-only baseline (Profiler.replay, Keras)
    # recent steps: [t_request_ns, wait_ns, transfer_ns, compute_ns, first_of_epoch]
    step_ring: deque[list[int]] = field(default_factory=lambda: deque(maxlen=STEP_RING))

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "epochs": self.epochs,
            "startup_ns": self.startup_ns,
            "first": {k: v.to_dict() for k, v in self.first.items()},
            "steady": {k: v.to_dict() for k, v in self.steady.items()},
            "gpu_compute": self.gpu_compute.to_dict(),
            "regions": {k: v.to_dict() for k, v in self.regions.items()},
            "replay": self.replay,
            "step_ring": [list(r) for r in self.step_ring],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopRecord:
        """Also reads files from before this class, whose Stats were tagged ``{"__stat__": ..}``."""

        def stat(d: Any) -> Stat:
            return Stat.from_dict(d.get("__stat__", d) if isinstance(d, dict) else {})

        def stats(d: Any) -> dict[str, Stat]:
            return {k: stat(v) for k, v in (d or {}).items()}

        rec = cls(
            steps=data.get("steps", 0),
            epochs=data.get("epochs", 0),
            startup_ns=data.get("startup_ns"),
            first={**_parts(), **stats(data.get("first"))},
            steady={**_parts(), **stats(data.get("steady"))},
            gpu_compute=stat(data.get("gpu_compute") or {}),
            regions=stats(data.get("regions")),
            replay=data.get("replay"),
        )
        rec.step_ring.extend(list(r) for r in data.get("step_ring", []))
        return rec


@dataclass
class Session:
    """Raw measurements of one profile. Times are ``time.perf_counter_ns`` nanoseconds."""

    framework: Framework = "torch"
    mode: Mode = "loader"
    meta: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)  # wall-clock epoch seconds
    start_ns: int = 0
    end_ns: int = 0
    # stage stats per track ("main", "worker0", ...) and path
    stages: dict[str, dict[str, Stat]] = field(default_factory=dict)
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    # the consumer's side: time blocked in next(), batch by batch
    first_batch_ns: int | None = None  # from iter() to the first batch (start-up)
    # the steady window: from the first batch's arrival to the last one's (not to the end of the
    # profile: the last next() of an epoch also shuts the workers down)
    first_ready_ns: int | None = None
    first_samples: int = 0
    last_ready_ns: int = 0
    wait: Stat = field(default_factory=Stat)  # waits after the first batch
    batches: int = 0
    samples: int = 0
    loop: LoopRecord | None = None  # a training loop's steps (loop mode)
    batch_ring: deque[tuple[int, str, int, int, int, int]] = field(
        default_factory=lambda: deque(maxlen=BATCH_LIMIT)
    )  # (index, track, ready_ns, wait_ns, samples, busy_ns)
    spans: deque[tuple[str, str, int, int]] = field(
        default_factory=lambda: deque(maxlen=SPAN_LIMIT)
    )  # (track, path, start_ns, duration_ns)
    events: int = 0  # timed regions recorded, all processes
    overhead_ns: float = 0.0  # measured cost of one timed region in the main process
    gpu: dict[str, Any] | None = None
    host: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False

    # ---- collection ---------------------------------------------------------------------

    def merge(self, payload: dict[str, Any]) -> None:
        """Fold a recorder drain (see ``Recorder.drain``) into the session."""
        track = payload["track"]
        mine = self.stages.setdefault(track, {})
        for path, stat in payload["stats"].items():
            have = mine.get(path)
            if have is None:
                mine[path] = stat
            else:
                have.merge(stat)
        for path, starts, durs in payload["spans"]:
            self.spans.extend(zip(repeat(track), repeat(path), starts, durs))
        self.events += payload["events"]

    def add(self, track: str, path: str, ns: int, n: int = 1) -> None:
        """Record one timing measured outside a recorder (the pin-memory thread, say)."""
        stat = self.stages.setdefault(track, {}).get(path)
        if stat is None:
            stat = self.stages[track][path] = Stat()
        stat.add(ns, n)
        self.events += 1

    def add_batch(
        self,
        t0: int,
        t1: int,
        samples: int,
        t_iter: int | None = None,
        span: str | None = None,
        track: str = "main",
        busy_ns: int = 0,
    ) -> None:
        """The consumer got a batch of ``samples``, blocked in ``next()`` from ``t0`` to ``t1``;
        with ``t_iter`` (when ``iter()`` was called) it is the first batch: start-up, not wait."""
        if t_iter is not None:
            self.first_batch_ns = t1 - t_iter
        else:
            self.wait.add(t1 - t0)
        if span is not None:
            self.spans.append(("main", span, t0, t1 - t0))
        self.batch_ring.append((self.batches, track, t1, t1 - t0, samples, busy_ns))
        if self.first_ready_ns is None:  # ``arrived``, inline: this runs once per batch
            self.first_ready_ns, self.first_samples = t1, samples
        self.last_ready_ns = t1
        self.batches += 1
        self.samples += samples

    def arrived(self, t_ns: int, samples: int) -> None:
        """A batch of ``samples`` reached the consumer at ``t_ns`` (the steady window's ends)."""
        if self.first_ready_ns is None:
            self.first_ready_ns, self.first_samples = t_ns, samples
        self.last_ready_ns = t_ns

    def worker(self, track: str, pid: int) -> WorkerRecord:
        rec = self.workers.get(track)
        if rec is None:
            rec = self.workers[track] = WorkerRecord(pid=pid)
        rec.pid = pid
        return rec

    @property
    def wall_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    # ---- persistence --------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "framework": self.framework,
            "mode": self.mode,
            "meta": self.meta,
            "started_at": self.started_at,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "stages": {t: {p: s.to_dict() for p, s in st.items()} for t, st in self.stages.items()},
            "workers": {t: w.to_dict() for t, w in self.workers.items()},
            "first_batch_ns": self.first_batch_ns,
            "first_ready_ns": self.first_ready_ns,
            "first_samples": self.first_samples,
            "last_ready_ns": self.last_ready_ns,
            "wait": self.wait.to_dict(),
            "batches": self.batches,
            "samples": self.samples,
            "loop": self.loop.to_dict() if self.loop is not None else {},
            "batch_ring": [list(b) for b in self.batch_ring],
            "spans": [list(s) for s in self.spans],
            "events": self.events,
            "overhead_ns": self.overhead_ns,
            "gpu": self.gpu,
            "host": self.host,
            "notes": self.notes,
            "interrupted": self.interrupted,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        version = data.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(
                f"this session has schema version {version!r}; this pipeprof reads up to "
                f"{SCHEMA_VERSION}: upgrade pipeprof (pip install -U pipeprof)"
            )
        s = cls(
            framework=data.get("framework", "torch"),
            mode=data.get("mode", "loader"),
            meta=data.get("meta", {}),
            started_at=data.get("started_at", 0.0),
            start_ns=data.get("start_ns", 0),
            end_ns=data.get("end_ns", 0),
            first_batch_ns=data.get("first_batch_ns"),
            first_ready_ns=data.get("first_ready_ns"),
            first_samples=data.get("first_samples", 0),
            last_ready_ns=data.get("last_ready_ns", 0),
            wait=Stat.from_dict(data.get("wait", {})),
            batches=data.get("batches", 0),
            samples=data.get("samples", 0),
            loop=LoopRecord.from_dict(data["loop"]) if data.get("loop") else None,
            events=data.get("events", 0),
            overhead_ns=data.get("overhead_ns", 0.0),
            gpu=data.get("gpu"),
            host=data.get("host"),
            notes=list(data.get("notes", [])),
            interrupted=bool(data.get("interrupted", False)),
        )
        s.stages = {
            t: {p: Stat.from_dict(d) for p, d in st.items()}
            for t, st in data.get("stages", {}).items()
        }
        s.workers = {t: WorkerRecord(**w) for t, w in data.get("workers", {}).items()}
        s.batch_ring.extend(tuple(b) for b in data.get("batch_ring", []))  # type: ignore[misc]
        s.spans.extend(tuple(x) for x in data.get("spans", []))  # type: ignore[misc]
        return s

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the session as JSON (atomically: a crash never leaves half a file)."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps({"session": self.to_dict()}))
        os.replace(tmp, target)
        return target


def read_file(path: str | os.PathLike[str]) -> Session:
    """Load a session saved by ``Session.save`` or ``Report.save``."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no such pipeprof file: {p}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p} is not a pipeprof JSON file ({exc})") from None
    if isinstance(data, dict) and "session" not in data and "schema" in data:
        raise ValueError(
            f"{p} is a report written as plain JSON, without the raw session a report is "
            "re-rendered from: save one with report.save(path) (or `pipeprof demo -o FILE.json`); "
            "`pipeprof compare` reads this file as it is"
        )
    if not isinstance(data, dict) or "session" not in data:
        raise ValueError(
            f"{p} holds no pipeprof session: pass a file written by report.save() or "
            "`pipeprof demo -o FILE.json`"
        )
    return Session.from_dict(data["session"])
