"""The diagnosis matrix: pipeprof's verdict on pipelines whose bottleneck is known by construction,
and what following its fixes delivers (docs/validation/diagnosis.md, "The diagnosis matrix").

    .venv/bin/python benchmarks/diagnosis_matrix.py                      # every case, ~15 min
    .venv/bin/python benchmarks/diagnosis_matrix.py --only collate --workers 2 --json m.json

Each cause is a real DataLoader (its costs injected: sleeps for storage and accelerator waits,
this thread's CPU time for work) under a training loop whose step is a sleep (an accelerator's
kernels: the training process waits and leaves the cores free), except where the cause is the
step itself. Each is crossed with 1, 2 and 4 workers, fork and spawn, and free or saturated cores
(one busy-looping process per core beside the run). The costs are chosen so that the truth holds
with a margin of at least 2× at every crossing on a 2-core machine: a bottleneck never changes
with the crossing, only how hard it bites. Loading in the training process has no workers: it is
crossed with the cores alone.

Truth, and what counts as right:
  kind    the verdict's kind (input-, overhead-, compute-bound)
  stage   the verdict's limiting stage, alone (a hand-over has none: its ``cause`` is hand-over)

Followed fixes: each finding whose fix is a setting is applied to the plain loop (no pipeprof)
and measured against the plain loop before it and against the finding's own promise:
  workers-needed    DataLoader(num_workers=N): samples/s over the run, start-up included, against
                    ``predicted_run_samples_per_s`` (or the steady prediction where start-up was
                    under 5 % of the run)
  slow-startup      persistent_workers=True: the seconds saved against ``gain_s``
  overhead-regions  the region every N steps: the seconds saved against ``gain_s`` (the steps
                    once every worker has delivered a batch, medians of 3 runs each way; the
                    promise scaled to those steps)
Other fixes (a stage made cheaper, a hand-over made smaller) change the user's code: they are
listed, not followed here.

The tests run a smaller form of this matrix (tests/test_diagnosis.py: each cause at 2 workers,
fork, free cores).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof

BATCH = 8


def cpu(ms: float) -> None:
    """``ms`` of this thread's CPU time in Python (holds the GIL): a fixed amount of work however
    busy the machine is."""
    end = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < end:
        pass


_BUF = bytes(range(256)) * 256  # 64 KiB


def c_work(ms: float) -> None:
    """``ms`` of this thread's CPU time in C that releases the GIL (hashlib, 64 KiB a call)."""
    end = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < end:
        hashlib.sha256(_BUF).digest()


class Samples(Dataset):
    """``n`` small samples; loading one sleeps ``load_ms`` (storage); ``transform`` runs on it."""

    def __init__(self, n: int, load_ms: float = 0.0, transform: Any = None) -> None:
        self.n, self.load_ms, self.transform = n, load_ms, transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.load_ms:
            time.sleep(self.load_ms / 1e3)
        x = torch.full((16,), float(i))
        if self.transform is not None:
            x = self.transform(x)
        return x, i


class CBlur:
    """A transform in C that releases the GIL (as OpenCV's, or a torch op's, do)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        c_work(self.ms)
        return x + 1


class PyAugment:
    """A transform in Python that holds the GIL all along."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: Any) -> Any:
        cpu(self.ms)
        return x + 1


def jpeg_bytes(size: tuple[int, int] = (640, 480)) -> bytes:
    """A photo-like JPEG that is slow to decode: noise over a gradient, quality 90."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    h, w = size[1], size[0]
    grad = np.linspace(0, 255, w, dtype=np.float32)[None, :, None]
    img = np.clip(grad + rng.normal(0, 40, (h, w, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(img).save(out, format="JPEG", quality=90)
    return out.getvalue()


class Encoded(Dataset):
    """``n`` encoded JPEGs (bytes in memory, as read from a shard); ``transform`` decodes."""

    def __init__(self, n: int, transform: Any) -> None:
        self.n, self.data, self.transform = n, jpeg_bytes(), transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.transform(self.data), i


class Decode:
    """JPEG bytes to a 64 × 64 float tensor (PIL decode, then a resize)."""

    def __call__(self, data: bytes) -> Any:
        import numpy as np
        from PIL import Image

        img = Image.open(io.BytesIO(data)).convert("RGB").resize((64, 64))
        return torch.from_numpy(np.array(img)).permute(2, 0, 1).float()


class SlowCollate:
    """``default_collate`` after ``ms`` of Python (lists and dicts rebuilt per batch)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, samples: list[Any]) -> Any:
        from torch.utils.data import default_collate

        cpu(self.ms)
        return default_collate(samples)


class Big(Dataset):
    """Samples ready at once but large (512 KiB of float32 each): all hand-over, no stage."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.full((128 * 1024,), float(i)), i


class SlowInit:
    """A ``worker_init_fn`` that takes ``ms`` (opening files, a connection, a model)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, worker_id: int) -> None:
        time.sleep(self.ms / 1e3)


@dataclass
class Case:
    """One cause: how to build its loader, what each step does, and the truth."""

    cause: str
    about: str
    make: Callable[[int], tuple[Dataset, dict[str, Any]]]  # batches -> dataset, loader kwargs
    step: list[tuple[str, str, float, int]]  # (region, "sleep" | "cpu", ms, every N steps)
    kind: str
    stage: str | None = None  # the limiting stage; None: none (compute, overhead, hand-over)
    cause_is: str | None = None  # the verdict's wait cause, where it is the point
    batches: int = 48
    epochs: int = 1
    batch_size: int = BATCH
    workers: tuple[int, ...] = (1, 2, 4)
    # Python in more workers than cores: the cores limit, and the stage with them (measured,
    # 2 cores, 4 workers, fork, free cores, the plain loop: 16 ms of Python collate ran 724
    # samples/s with file_descriptor sharing and 823 with file_system; 2.5 ms of Python a
    # sample, 579 and 616. An earlier construction ran 266-287 against 636-709, and the truth
    # there was the hand-over: NOTE [ Workers past the cores ] in analyze/verdict.py)


def _samples(load_ms: float = 0.0, transform: Any = None) -> Callable[[int], Any]:
    return lambda n: (Samples(n, load_ms, transform), {})


CASES: dict[str, Case] = {
    c.cause: c
    for c in [
        Case("storage", "5 ms of storage latency (sleep) a sample; a 4 ms step",
             _samples(load_ms=5.0), [("Forward", "sleep", 4.0, 1)], "input-bound", "load"),
        Case("c-transform", "2.5 ms of C a sample that releases the GIL; a 3 ms step",
             _samples(transform=CBlur(2.5)), [("Forward", "sleep", 3.0, 1)], "input-bound",
             "transform/CBlur"),
        Case("py-transform", "2.5 ms of Python a sample (holds the GIL); a 3 ms step",
             _samples(transform=PyAugment(2.5)), [("Forward", "sleep", 3.0, 1)], "input-bound",
             "transform/PyAugment"),
        Case("jpeg", "PIL decodes a 640×480 JPEG a sample (about 3 ms); a 2 ms step",
             lambda n: (Encoded(n, Decode()), {}), [("Forward", "sleep", 2.0, 1)],
             "input-bound", "transform/Decode"),
        Case("collate", "16 ms of Python in collate_fn a batch; a 3 ms step",
             lambda n: (Samples(n), {"collate_fn": SlowCollate(16.0)}),
             [("Forward", "sleep", 3.0, 1)], "input-bound", "collate"),
        Case("hand-over", "16 samples of 512 KiB, ready at once; a 20 ms step",
             lambda n: (Big(n), {}), [("Forward", "sleep", 20.0, 1)], "input-bound",
             None, cause_is="hand-over", batch_size=16),
        Case("in-process", "num_workers=0: 3 ms of storage a sample; an 8 ms step",
             _samples(load_ms=3.0), [("Forward", "sleep", 8.0, 1)], "input-bound", "load",
             workers=(0,)),
        Case("compute", "0.2 ms of storage a sample; a 250 ms step",
             _samples(load_ms=0.2), [("Forward", "sleep", 250.0, 1)], "compute-bound",
             batches=12),
        Case("logging", "0.2 ms of storage a sample; a 5 ms step, then 8 ms of logging",
             _samples(load_ms=0.2), [("Forward", "sleep", 5.0, 1), ("Logging", "sleep", 8.0, 1)],
             "overhead-bound"),
        Case("oversubscribed", "CPU training (a 4 ms CPU step) beside 3 ms of Python a sample",
             _samples(transform=PyAugment(3.0)), [("Forward", "cpu", 4.0, 1)], "input-bound",
             "transform/PyAugment"),
        Case("start-up", "workers that take 0.5 s to start, restarted for each of 4 short epochs",
             lambda n: (Samples(n, load_ms=0.5), {"worker_init_fn": SlowInit(500.0)}),
             [("Forward", "sleep", 5.0, 1)], "input-bound", None, cause_is="start-up",
             batches=6, epochs=4),
    ]
}  # fmt: skip


def loader_for(case: Case, workers: int, start: str, **changes: Any) -> DataLoader:
    dataset, kw = case.make(case.batches * case.batch_size)
    kw = {**kw, **changes}
    if workers:
        kw["multiprocessing_context"] = start
    return DataLoader(dataset, batch_size=case.batch_size, num_workers=workers, **kw)


def train(loader: Any, case: Any, prof: Any = None, every: dict[str, int] | None = None,
          warm: int = 1) -> tuple[int, float, float]:  # fmt: skip
    """The training loop: each step runs the case's regions (under ``prof``'s regions when
    profiled); returns the samples, the seconds of the whole run, start-up included, and the
    seconds until its ``warm``-th batch came (its first, by default)."""
    every = every or {}
    data = prof.wrap(loader) if prof is not None else loader
    t0, samples, k, first_s = time.perf_counter(), 0, 0, 0.0
    for _ in range(case.epochs):
        for x, _ in data:
            if k == warm - 1:
                first_s = time.perf_counter() - t0
            for name, how, ms, n in case.step:
                if k % every.get(name, n):
                    continue
                with prof.region(name) if prof is not None else nullcontext():
                    cpu(ms) if how == "cpu" else time.sleep(ms / 1e3)
            samples += len(x)
            k += 1
    return samples, time.perf_counter() - t0, first_s


@contextmanager
def saturated(on: bool) -> Iterator[None]:
    """One busy-looping process per core beside the run, when ``on``."""
    procs = []
    if on:
        for _ in range(os.cpu_count() or 1):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(0.2)
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def judge(case: Case, report: dict[str, Any], workers: int = 0) -> dict[str, Any]:
    """The verdict against the truth."""
    v = report["verdict"]
    ok = v["kind"] == case.kind
    if case.cause_is == "hand-over":
        ok = ok and v.get("cause") == "hand-over" and not v.get("stages")
    elif case.cause_is == "start-up":
        ok = ok and (v.get("cause") == "start-up")
    elif case.kind == "input-bound":
        ok = ok and v.get("stages") == [case.stage]
    gil = next((f["evidence"].get("waits_for_workers_gil") for f in report["findings"]
                if f["id"] == "handover"), None)  # fmt: skip
    return {"right": ok, "kind": v["kind"], "stage": v.get("stage"), "stages": v.get("stages"),
            "handover_gil": gil,
            "wait_cause": v.get("cause"), "headline": v["headline"]}  # fmt: skip


def followed(case: Case, workers: int, start: str, report: dict[str, Any], before: float,
             before_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """Each finding whose fix is a setting, applied to the plain loop and measured."""
    out = []
    for f in report["findings"]:
        ev, fix = f["evidence"], f.get("fix") or ""
        hint = fix.startswith("worth trying")
        if f["id"] == "workers-needed" and "num_workers=" in fix:
            k = ev["workers_needed"]
            samples, secs, _ = train(loader_for(case, k, start), case)
            promised = ev.get("predicted_run_samples_per_s") or ev["predicted_samples_per_s"]
            got = samples / secs
            out.append({"id": f["id"], "hint": hint, "fix": f"num_workers={k}",
                        "promised": promised, "before": round(before, 1), "after": round(got, 1),
                        "delivered": round(got / promised, 3), "gain": got > before})  # fmt: skip
        elif f["id"] == "slow-startup" and "persistent_workers=True" in fix and ev.get("gain_s"):
            _, secs, _ = train(loader_for(case, workers, start, persistent_workers=True), case)
            saved = before_s - secs
            out.append({"id": f["id"], "hint": hint, "fix": "persistent_workers=True",
                        "promised": ev["gain_s"], "before": round(before_s, 3),
                        "after": round(secs, 3), "delivered": round(saved / ev["gain_s"], 3),
                        "gain": saved > 0})  # fmt: skip
        elif f["id"] == "overhead-regions" and ev.get("gain_s"):
            # the steady steps' time, from the batch by which every worker has delivered one,
            # medians of 3 runs each way taken in turn: spawn's start-up varies by seconds, and
            # under busy cores its tail reaches past the first batches. The promise, for every
            # step of the run, is scaled to the steps timed
            region, n = ev["region"], ev["every"]
            warm = max(1, workers)
            steps = case.batches * case.epochs
            promised = ev["gain_s"] * (steps - warm + 1) / steps
            befores, afters = [], []
            for _ in range(3):
                for every, into in (({}, befores), ({region: n}, afters)):
                    loader = loader_for(case, workers, start)
                    _, secs, warm_s = train(loader, case, every=every, warm=warm)
                    into.append(secs - warm_s)
            before_s, secs = statistics.median(befores), statistics.median(afters)
            saved = before_s - secs
            out.append({"id": f["id"], "hint": hint, "fix": f"{region} every {n} steps",
                        "promised": round(promised, 4), "before": round(before_s, 3),
                        "after": round(secs, 3), "delivered": round(saved / promised, 3),
                        "gain": saved > 0})  # fmt: skip
    return out


def run_case(case: Case, workers: int, start: str, busy: bool, follow: bool = True,
             keep: str | None = None) -> dict[str, Any]:  # fmt: skip
    """One crossing: the plain loop, the profiled one, the verdict judged, the fixes followed;
    ``keep``: a folder the profiled run's report is saved in."""
    with saturated(busy):
        samples, secs, _ = train(loader_for(case, workers, start), case)
        prof = pipeprof.Profiler()  # as a user runs it: the host sampled
        with prof:
            train(loader_for(case, workers, start), case, prof)
        report = prof.report().to_dict()
        if keep:
            cores = "saturated" if busy else "free"
            prof.report().save(os.path.join(keep, f"{case.cause}-w{workers}-{start}-{cores}.json"))
        row = {"cause": case.cause, "workers": workers, "start": start if workers else "-",
               "cores": "saturated" if busy else "free", **judge(case, report, workers),
               "top": [f["id"] for f in report["findings"][:2]]}  # fmt: skip
        before = samples / secs
        row["fixes"] = followed(case, workers, start, report, before, secs) if follow else []
    return row


def crossings(case: Case, workers: list[int] | None, starts: list[str], cores: list[str]
              ) -> Iterator[tuple[int, str, bool]]:  # fmt: skip
    for w in case.workers:
        if workers is not None and w not in workers and w:
            continue
        for s in starts if w else starts[:1]:
            for c in cores:
                yield w, s, c == "saturated"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    fixes = [f for r in rows for f in r["fixes"] if not f["hint"]]
    hints = [f for r in rows for f in r["fixes"] if f["hint"]]
    return {
        "cases": len(rows),
        "right": sum(r["right"] for r in rows),
        "right_share": round(sum(r["right"] for r in rows) / max(1, len(rows)), 3),
        "fixes_followed": len(fixes),
        "fixes_delivering_90": sum(f["delivered"] >= 0.9 for f in fixes),
        "fixes_with_loss": sum(not f["gain"] for f in fixes),
        "median_delivered": statistics.median(f["delivered"] for f in fixes) if fixes else None,
        "hints_followed": len(hints),
        "hints_with_loss": sum(not f["gain"] for f in hints),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of docs/validation/diagnosis.md: one line per cause, its crossings
    right."""
    lines = ["| cause | truth | right | wrong (as) | fixes followed: delivered (median, min) |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for cause, case in CASES.items():
        mine = [r for r in rows if r["cause"] == cause]
        if not mine:
            continue
        truth = case.kind + (f", {case.stage}" if case.stage else "")
        truth += f" ({case.cause_is})" if case.cause_is else ""
        wrong = sorted(
            {f"{r['kind']}/{r['stage'] or r['wait_cause']}" for r in mine if not r["right"]}
        )
        fx = [f["delivered"] for r in mine for f in r["fixes"] if not f["hint"]]
        ids = sorted({f["id"] for r in mine for f in r["fixes"] if not f["hint"]})
        fixes = (f"{', '.join(ids)}: {statistics.median(fx):.2f}, {min(fx):.2f} ({len(fx)})"
                 if fx else "none")  # fmt: skip
        hints = [f for r in mine for f in r["fixes"] if f["hint"]]
        if hints:
            gains = sorted(f["after"] / f["before"] for f in hints)
            fixes += f"; hints ×{gains[0]:.2f}–{gains[-1]:.2f} ({len(hints)})"
        lines.append(f"| {cause} | {truth} | {sum(r['right'] for r in mine)}/{len(mine)} | "
                     f"{'; '.join(wrong) or '-'} | {fixes} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=None, help="causes, comma-separated")
    p.add_argument("--workers", default=None, help="worker counts, comma-separated")
    p.add_argument("--start", default="fork,spawn")
    p.add_argument("--cores", default="free,saturated")
    p.add_argument("--no-follow", action="store_true", help="judge verdicts only")
    p.add_argument("--json", default=None)
    p.add_argument("--reports", default=None, help="a folder: each profiled run's report")
    args = p.parse_args()
    only = args.only.split(",") if args.only else list(CASES)
    workers = [int(w) for w in args.workers.split(",")] if args.workers else None
    rows = []
    for cause in only:
        case = CASES[cause]
        for w, s, busy in crossings(case, workers, args.start.split(","), args.cores.split(",")):
            row = run_case(case, w, s, busy, follow=not args.no_follow, keep=args.reports)
            rows.append(row)
            fx = " ".join(f"{f['id']}:{f['delivered']:.2f}" for f in row["fixes"])
            print(f"{'ok ' if row['right'] else 'BAD'} {cause:14} w={w} {row['start']:5} "
                  f"{row['cores']:9} {row['kind']}/{row['stage'] or row['wait_cause']} {fx}",
                  flush=True)  # fmt: skip
            if not row["right"]:
                print(f"    {row['headline']}", flush=True)
            for f in row["fixes"]:
                what = ("hint " if f["hint"] else "") + f["fix"]
                print(f"    {what}: promised {f['promised']:.4g}, before {f['before']:.4g}, "
                      f"after {f['after']:.4g}", flush=True)  # fmt: skip
    out = {"summary": summary(rows), "rows": rows}
    from _common import machine

    out["machine"] = machine()
    print(json.dumps(out["summary"], indent=1))
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", message="This DataLoader will create")
    multiprocessing.set_start_method("fork", force=True)
    main()
