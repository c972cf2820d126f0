"""What timing fsspec's HTTP filesystem costs a loader that fetches through it (issue 44; NOTE
[ fsspec's async filesystems ] in pipeprof/collect/fetch.py; docs/streaming.md).

tests/netdata.py's HTTP server on 127.0.0.1 waits 20 ms before each answer. ``Remote`` with
``client="fsspec"`` fetches each sample's 64 kB body with ``fsspec.filesystem("http")
.cat_file`` (aiohttp on fsspec's IO thread), then works 5 ms; 2 forked workers, batches of 8,
``--samples`` samples. Each round runs a pass plain and a pass profiled (``Profiler.wrap``), in
turn; the loop's samples/s by the medians, and what the profile states its counting cost
(``cost_s`` of the fetch row, a request or body read each).

    .venv/bin/python benchmarks/fsspec_cost.py --rounds 7   # ~1 minute
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader

import pipeprof

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from netdata import Remote, server


def one(dataset, profiled: bool) -> tuple[float, float | None]:  # type: ignore[no-untyped-def]
    """A pass's samples/s and, profiled, the stated µs a count."""
    loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork")
    prof = pipeprof.Profiler(sample_hz=0) if profiled else None
    t0 = time.perf_counter()
    if prof is None:
        for _batch in loader:
            pass
    else:
        with prof:
            for _batch in prof.wrap(loader):
                pass
    rate = len(dataset) / (time.perf_counter() - t0)
    if prof is None:
        return rate, None
    (row,) = prof.report().to_dict()["fetch"]
    return rate, row["cost_s"] * 1e6 / (row["requests"] + row["reads"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--samples", type=int, default=256)
    args = p.parse_args()
    rates: dict[bool, list[float]] = {False: [], True: []}
    each: list[float] = []
    with server() as url:
        dataset = Remote(url, args.samples, "fsspec")
        for k in range(args.rounds):
            for profiled in (False, True) if k % 2 else (True, False):
                rate, cost = one(dataset, profiled)
                rates[profiled].append(rate)
                if cost is not None:
                    each.append(cost)
    plain, prof = (statistics.median(rates[h]) for h in (False, True))
    print(f"samples/s: plain {plain:.1f}, profiled {prof:.1f} ({prof / plain - 1:+.1%}); "
          f"rounds plain {min(rates[False]):.1f}-{max(rates[False]):.1f}, "
          f"profiled {min(rates[True]):.1f}-{max(rates[True]):.1f}")
    print(f"stated: {statistics.median(each):.1f} µs a count (median of {len(each)} profiles)")


if __name__ == "__main__":
    main()
