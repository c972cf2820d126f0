"""``pipeprof bench --encodings`` on a latency-bound fetch, followed (issue 44: its rows for
"shards of size S" and "N requests in flight", checked against real runs on the local server,
within 15 %; docs/bench.md, docs/streaming.md).

tests/netdata.py's HTTP server on 127.0.0.1 waits 20 ms before each answer. ``Remote`` fetches
each sample's 64 kB body in a request of its own, then works 5 ms. ``bench_encodings`` (32
fixed samples, 2 workers, batches of 8, npy as the one encoding) gives its rows: objects of 8,
32 and 128 samples a request, and 2, 4 and 8 requests in flight a worker (NOTE [ Larger objects
and requests in flight, benched ] in pipeprof/bench/fetch.py). Each is followed for real, as
benchmarks/fetch_batched.py does: ``Batched`` (a batch's 8 in one request), ``Objects`` (32 or
128 a request, each worker streaming its own), ``Pooled`` (a batch's samples fetched by a pool
of 4 or 8 threads in each worker); 2 forked workers, batches of 8, ``--samples`` samples, the
steady rate after the first batch. Medians over ``--rounds``.

    .venv/bin/python benchmarks/encodings_fetch.py --rounds 3   # ~2 minutes
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import pipeprof

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_batched import steady
from netdata import Batched, Objects, Pooled, Remote, server

FIXES = {
    "objects of 8 samples": lambda url, n: Batched(url, n),
    "objects of 32 samples": lambda url, n: Objects(url, n, 32),
    "objects of 128 samples": lambda url, n: Objects(url, n, 128),
    "4 requests in flight": lambda url, n: Pooled(url, n, 4),
    "8 requests in flight": lambda url, n: Pooled(url, n, 8),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=512)
    args = p.parse_args()
    promised: dict[str, list[float]] = {name: [] for name in FIXES}
    followed: dict[str, list[float]] = {name: [] for name in FIXES}
    now: list[float] = []
    with server() as url:
        for _ in range(args.rounds):
            e = pipeprof.bench_encodings(Remote(url, args.samples), samples=32, workers=2,
                                         batch_size=8, kinds=["npy"], seconds=2)
            rows: dict[str, Any] = {r["encoding"]: r for r in e.rows}
            now.append(steady(Remote(url, args.samples)))
            for name, make in FIXES.items():
                promised[name].append(rows[name]["predicted_samples_per_s"])
                followed[name].append(steady(make(url, args.samples)))
            print({"measured now": round(now[-1], 1),
                   **{n: (round(promised[n][-1], 1), round(followed[n][-1], 1)) for n in FIXES}},
                  flush=True)
    print(f"one request a sample, plain: {statistics.median(now):.1f} samples/s")
    for name in FIXES:
        a, b = statistics.median(promised[name]), statistics.median(followed[name])
        print(f"{name}: bench --encodings {a:.1f}, followed {b:.1f} ({a / b - 1:+.1%})")


if __name__ == "__main__":
    main()
