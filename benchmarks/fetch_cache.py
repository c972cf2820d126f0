"""Follow ``fetch-cache`` once (docs/streaming.md, "A cache for later epochs"): 64 samples
fetched from a local HTTP server (20 ms before each 64 kB answer, ``tests/netdata.py``) with 5
ms of other work a sample, 2 workers, batches of 4. Two profiled passes give the finding and
its promise (the loader with the fetch cached); then the finding's fix, the bodies kept on local
disk once fetched (``netdata.Cached``), run plain for two epochs: the second epoch's rate, from
its first batch to its last (the what-if's steady state) and whole (the workers' start in it).
Rounds in turn, medians.

    .venv/bin/python benchmarks/fetch_cache.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from netdata import Cached, Remote, server
from torch.utils.data import DataLoader

import pipeprof

N, WORKERS, BATCH = 64, 2, 4


def promised(url: str) -> dict:
    prof = pipeprof.Profiler(sample_hz=0)
    wrapped = prof.wrap(DataLoader(Remote(url, N), batch_size=BATCH, num_workers=WORKERS))
    for _ in range(2):
        for _batch in wrapped:
            pass
    found = {f["id"]: f for f in prof.report().to_dict()["findings"]}
    return found["fetch-cache"]["evidence"]


def epochs(url: str) -> tuple[float, float, float]:
    """The fix: (epoch 1's rate, epoch 2's steady rate, epoch 2's whole rate)."""
    folder = tempfile.mkdtemp()
    loader = DataLoader(Cached(url, folder, N), batch_size=BATCH, num_workers=WORKERS)
    rates = []
    for _ in range(2):
        t0 = time.perf_counter()
        marks = [time.perf_counter() for _batch in loader]
        rates.append((N / (marks[-1] - t0), (N - BATCH) / (marks[-1] - marks[0])))
    return rates[0][0], rates[1][1], rates[1][0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    got: dict[str, list[float]] = {"now": [], "cached (promised)": [], "epoch 1": [],
                                   "epoch 2 steady": [], "epoch 2 whole": []}  # fmt: skip
    with server() as url:
        for _ in range(args.rounds):
            ev = promised(url)
            got["now"].append(ev["samples_per_s_now"])
            got["cached (promised)"].append(ev["samples_per_s_cached"])
            for key, rate in zip(("epoch 1", "epoch 2 steady", "epoch 2 whole"), epochs(url)):
                got[key].append(rate)
    for key, values in got.items():
        print(f"{key}: {statistics.median(values):.1f} samples/s "
              f"({min(values):.1f}-{max(values):.1f})")


if __name__ == "__main__":
    main()
