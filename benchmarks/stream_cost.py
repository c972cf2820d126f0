"""What a snapshot of a running loop costs the loop, as the run grows (issue 37, item 7;
NOTE [ Snapshots ] in profiler.py).

A real profiled loop (a DataLoader with no workers, two regions a step, as ``pipeprof run``'s
Forward / Backward) runs ``--steps`` steps. At ``--checkpoints`` points along it, the loop
stops and the session is saved both ways, side by side on the same session:

  full      ``session.save(path)``: every span kept (up to SPAN_LIMIT): what a stream flush
            wrote on the training thread before snapshots were bounded;
  snapshot  ``Profiler.snapshot(path)``: what a stream flush and ``pipeprof run``'s
            ``--snapshot-s`` write now (the latest SNAPSHOT_SPANS spans).

Each is timed ``--rounds`` times (median, ms) with the file's size. Then the loop's own cost:
the same loop of ``--loop-steps`` steps, plain (no stream), and with a snapshot every
``--every`` seconds once its session is full (spans at their limit), rounds interleaved; the
ratio of the medians is what snapshots cost the loop.

    python benchmarks/stream_cost.py                       # ~2 minutes
    python benchmarks/stream_cost.py --steps 200000 --json stream_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

import pipeprof
from pipeprof.core.session import SNAPSHOT_SPANS, SPAN_LIMIT


def loop(prof: Any, loader: Any, steps: int, at: set[int], out: Path, rounds: int) -> list[dict]:
    rows = []
    for i, _ in enumerate(prof.wrap(loader)):
        with prof.region("Forward"):
            pass
        with prof.region("Backward"):
            pass
        if i + 1 in at:
            rows.append(checkpoint(prof, i + 1, out, rounds))
        if i + 1 >= steps:
            break
    return rows


def checkpoint(prof: Any, step: int, out: Path, rounds: int) -> dict[str, Any]:
    s = prof.session
    row: dict[str, Any] = {"steps": step, "spans": len(s.to_dict()["spans"])}
    for name, save in (("full", lambda p: s.save(p)), ("snapshot", lambda p: prof.snapshot(p))):
        ms = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            save(out)
            ms.append((time.perf_counter() - t0) * 1e3)
        row[name] = {
            "ms": round(statistics.median(ms), 1),
            "mb": round(out.stat().st_size / 2**20, 2),
        }
    return row


def loop_time(steps: int, every_s: float | None, out: Path) -> float:
    """Seconds of ``steps`` steps of a loop whose session is full, snapshots every ``every_s``."""
    loader = DataLoader(torch.arange(float(steps + SPAN_LIMIT)), batch_size=1)
    prof = pipeprof.Profiler(sample_hz=10)
    with prof:
        it = iter(prof.wrap(loader))
        for _ in range(SPAN_LIMIT // 4):  # spans at their limit: the worst case for a save
            next(it)
            with prof.region("Forward"):
                pass
        last = t0 = time.perf_counter()
        for _ in range(steps):
            next(it)
            with prof.region("Forward"):
                pass
            if every_s is not None and time.perf_counter() - last >= every_s:
                prof.snapshot(str(out))
                last = time.perf_counter()
        return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=120_000)
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loop-steps", type=int, default=30_000)
    p.add_argument("--every", type=float, default=1.0, help="seconds between snapshots")
    p.add_argument("--loop-rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pipeprof-stream-") as tmp:
        out = Path(tmp) / "run.json"
        at = {args.steps * (k + 1) // args.checkpoints for k in range(args.checkpoints)}
        loader = DataLoader(torch.arange(float(args.steps)), batch_size=1)
        prof = pipeprof.Profiler(sample_hz=10)
        with prof:
            rows = loop(prof, loader, args.steps, at, out, args.rounds)
        print(
            f"a save of the session as the run grows (median of {args.rounds}; "
            f"snapshots keep the latest {SNAPSHOT_SPANS:,} of up to {SPAN_LIMIT:,} spans)"
        )
        print(f"{'steps':>8}{'spans':>9}{'full ms':>10}{'full MB':>9}{'snap ms':>10}{'snap MB':>9}")
        for r in rows:
            print(
                f"{r['steps']:>8}{r['spans']:>9}{r['full']['ms']:>10}{r['full']['mb']:>9}"
                f"{r['snapshot']['ms']:>10}{r['snapshot']['mb']:>9}"
            )
        plain, snap = [], []
        for _ in range(args.loop_rounds):
            plain.append(loop_time(args.loop_steps, None, out))
            snap.append(loop_time(args.loop_steps, args.every, out))
        ratio = statistics.median(snap) / statistics.median(plain)
        print(
            f"loop of {args.loop_steps} steps, session full: "
            f"plain {statistics.median(plain):.2f} s,"
            f" a snapshot every {args.every:g} s {statistics.median(snap):.2f} s: x{ratio:.3f}"
            f" (medians of {args.loop_rounds})"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "checkpoints": rows,
                    "loop": {
                        "plain_s": plain,
                        "snapshot_s": snap,
                        "ratio": ratio,
                        "every_s": args.every,
                    },
                    "pid": os.getpid(),
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
