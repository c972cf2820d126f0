"""The wait, measured with and without pipeprof, and a prediction followed
(docs/validation/overhead.md,
docs/validation/diagnosis.md).

Two loops, each a DataLoader and a GPU-like step (a sleep: the CPU is free while it runs):

  ready    batches are ready before the loop asks: 2 workers make 16-sample batches of
           3×96×96 float32 images (1.8 MB a batch) from memory with a light transform, the
           step takes ``--step-ms`` (30). The wait is the hand-over alone. Plain and pipeprof
           (``Profiler(sample_hz=0)`` around ``prof.wrap(loader)``) run interleaved, one epoch
           each per round; the mean wait per ``next()`` is timed the same way in both, around
           the loop's own ``next()``, and pipeprof's own figure (its steady wait per step, and the
           split) is reported beside it.
  storage  reads wait on storage: 6 ms sleep per sample, batches of 8, one worker, a 10 ms
           step. pipeprof profiles it, its ``workers-needed`` finding names a worker count and
           the rate the loop will then run at; the plain loop is run with that count and its
           steady rate measured (after every worker's first batch). Reported: delivered /
           promised, per round.

    .venv/bin/python benchmarks/wait_split.py                       # 12 rounds, ~2 minutes
    .venv/bin/python benchmarks/wait_split.py --rounds 11 --json wait_split.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof

clock = time.perf_counter_ns


class Images(Dataset):  # type: ignore[type-arg]
    """Ready at once: a 3×96×96 float32 image and its label, lightly transformed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.base = torch.rand(3, 96, 96)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.base * (1.0 + i % 7), i % 10


class Storage(Dataset):  # type: ignore[type-arg]
    """Each read waits ``ms`` on storage (a sleep)."""

    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return torch.full((16,), float(i))


def timed_loop(batches: Any, step_s: float, skip: int) -> list[int]:
    """The wait of every ``next()`` after the first ``skip``, timed around the loop's own call."""
    waits, it = [], iter(batches)
    while True:
        t0 = clock()
        try:
            next(it)
        except StopIteration:
            break
        waits.append(clock() - t0)
        time.sleep(step_s)
    return waits[skip:]


def ready_round(loader: DataLoader, step_s: float, order: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in order:
        if variant == "plain":
            waits = timed_loop(loader, step_s, skip=2)
            out["plain_wait_ms"] = statistics.mean(waits) / 1e6
        else:
            prof = pipeprof.Profiler(sample_hz=0)
            with prof:
                waits = timed_loop(prof.wrap(loader), step_s, skip=2)
            loop = prof.report()["loop"]
            steady = loop["steady"]
            out["pipeprof_wait_ms"] = statistics.mean(waits) / 1e6
            out["reported_wait_ms"] = steady["wait_s"] * 1e3 / steady["steps"]
            out["reported_handover_ms"] = steady["handover_s"] * 1e3 / steady["steps"]
            out["reported_starved_ms"] = steady["starved_s"] * 1e3 / steady["steps"]
            out["verdict"] = prof.report()["verdict"]["headline"]
    return out


def storage_round(samples: int, step_s: float) -> dict[str, Any]:
    dataset = Storage(samples, 6.0)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        timed_loop(prof.wrap(DataLoader(dataset, batch_size=8, num_workers=1)), step_s, skip=0)
    found = {f["id"]: f for f in prof.report()["findings"]}
    f = found.get("workers-needed")
    if f is None:
        return {"finding": None, "verdict": prof.report()["verdict"]["headline"]}
    need, promised = f["evidence"]["workers_needed"], f["evidence"]["predicted_samples_per_s"]
    fixed = DataLoader(dataset, batch_size=8, num_workers=need)
    arrivals = []
    for _ in fixed:
        arrivals.append(clock())
        time.sleep(step_s)
    arrivals.append(clock())
    steady = arrivals[need:]
    rate = 8 * (len(steady) - 1) / ((steady[-1] - steady[0]) / 1e9)
    compute_only = 8e3 / f["evidence"]["compute_ms_per_step"]  # a promise without the floors
    return {
        "workers": need,
        "promised": promised,
        "measured": rate,
        "ratio": rate / promised,
        "compute_only_promise": compute_only,
        "ratio_to_compute_only": rate / compute_only,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--step-ms", type=float, default=30.0)
    ap.add_argument("--json", help="write every round's figures here")
    args = ap.parse_args(argv)
    loader = DataLoader(Images(16 * 40), batch_size=16, num_workers=2)
    ready_round(loader, args.step_ms / 1e3, ["plain", "pipeprof"])  # warm-up
    ready, storage = [], []
    for r in range(args.rounds):
        order = ["plain", "pipeprof"] if r % 2 == 0 else ["pipeprof", "plain"]
        ready.append(ready_round(loader, args.step_ms / 1e3, order))
        storage.append(storage_round(480, 0.010))
        print(f"round {r + 1}/{args.rounds}: {ready[-1]} {storage[-1]}", file=sys.stderr)

    def med(rows: list[dict[str, Any]], key: str) -> str:
        vals = [row[key] for row in rows if row.get(key) is not None]
        if not vals:
            return "n/a"
        return f"{statistics.median(vals):.3f} [{min(vals):.3f}-{max(vals):.3f}]"

    diffs = [row["pipeprof_wait_ms"] - row["plain_wait_ms"] for row in ready]
    print(f"ready-batch loop ({args.rounds} rounds; per round the mean wait of its steady steps; "
          "median [min-max] over rounds, ms)")  # fmt: skip
    print(f"  wait per next(), plain                 {med(ready, 'plain_wait_ms')}")
    print(f"  wait per next(), under pipeprof        {med(ready, 'pipeprof_wait_ms')}")
    print(f"  difference, per round                  {statistics.median(diffs):+.3f} "
          f"[{min(diffs):+.3f} to {max(diffs):+.3f}]")  # fmt: skip
    print(f"  pipeprof's reported wait per step      {med(ready, 'reported_wait_ms')}")
    print(f"    of which hand-over                   {med(ready, 'reported_handover_ms')}")
    print(f"    of which starved                     {med(ready, 'reported_starved_ms')}")
    print(f"  verdict (last round): {ready[-1]['verdict']}")
    print("storage-bound loop: workers-needed followed")
    print(f"  workers recommended                    {[s.get('workers') for s in storage]}")
    print(f"  promised samples/s                     {med(storage, 'promised')}")
    print(f"  measured samples/s                     {med(storage, 'measured')}")
    print(f"  measured / promised                    {med(storage, 'ratio')}")
    print(f"  measured / compute-only promise        {med(storage, 'ratio_to_compute_only')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ready": ready, "storage": storage, "args": vars(args)}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
