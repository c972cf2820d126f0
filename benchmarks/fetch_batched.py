"""The latency-bound fetch's what-if, followed (issue 44: "shards of size S" and "N in-flight
requests" checked against a real run on the local server, within 15 %; docs/streaming.md).

tests/netdata.py's HTTP server on 127.0.0.1 waits 20 ms before each answer. ``Remote`` fetches
each sample's 64 kB body in a request of its own, then works 5 ms; 2 forked workers, batches
of 8, ``--samples`` samples; one pass profiled (``Profiler.wrap``, the loader alone). Its
``dominant-stage`` finding says what objects of a batch's samples would give (NOTE [ Objects
that hold a batch ] in pipeprof/analyze/fetch.py); ``Batched`` is the fix followed: the same
samples, a batch's in one request (``__getitems__``). With ``--per-request K`` other than a
batch's 8, the promise is the report's ``what_if`` row for objects of K samples, and the fix
followed is ``Objects``: the same samples as objects of K, one request each, each worker
streaming its own (shards of K samples); with ``--in-flight N``, the row for N requests in
flight a worker, and ``Pooled``: a batch's samples fetched by a pool of N threads. Both are run
plain for their steady rate (after the first batch). Medians over ``--rounds``.

    .venv/bin/python benchmarks/fetch_batched.py --rounds 3   # ~1 minute
    .venv/bin/python benchmarks/fetch_batched.py --rounds 3 --per-request 32
    .venv/bin/python benchmarks/fetch_batched.py --rounds 3 --in-flight 4
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
from netdata import Batched, Objects, Pooled, Remote, server


def loader(dataset) -> DataLoader:  # type: ignore[no-untyped-def,type-arg]
    return DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork")


def promised(dataset, k: int, flying: int = 0) -> float:  # type: ignore[no-untyped-def]
    """What one profiled pass promises with objects of ``k`` samples a request: the
    ``dominant-stage`` finding's (a batch's ``k``) and the ``what_if`` row's, which agree; with
    ``flying``, the ``what_if`` row's for that many requests in flight a worker."""
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _batch in prof.wrap(loader(dataset)):
            pass
    data = prof.report().to_dict()
    if flying:
        (row,) = [w for w in data["what_if"] if w.get("requests_in_flight") == flying]
        return row["samples_per_s"]  # type: ignore[no-any-return]
    (found,) = [f for f in data["findings"] if f["id"] == "dominant-stage"]
    (row,) = [w for w in data["what_if"] if w.get("samples_per_request") == k]
    if k == 8:
        assert row["samples_per_s"] == found["evidence"]["samples_per_s_batched"]
    return row["samples_per_s"]  # type: ignore[no-any-return]


def steady(dataset) -> float:  # type: ignore[no-untyped-def]
    """The plain loader's samples/s after its first batch."""
    marks = [time.perf_counter() for _batch in loader(dataset)]
    return (len(dataset) - 8) / (marks[-1] - marks[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--per-request", type=int, default=8, choices=(8, 32, 128),
                   help="samples an object holds in the fix followed (8: a batch's)")
    p.add_argument("--in-flight", type=int, default=0, choices=(0, 4, 8),
                   help="instead: requests in flight a worker in the fix followed (a pool)")
    args = p.parse_args()
    got: dict[str, list[float]] = {"now": [], "promised": [], "followed": []}
    with server() as url:
        for _ in range(args.rounds):
            k, flying = args.per_request, args.in_flight
            got["promised"].append(promised(Remote(url, args.samples), k, flying))
            got["now"].append(steady(Remote(url, args.samples)))
            fix = (Pooled(url, args.samples, flying) if flying else
                   Batched(url, args.samples) if k == 8 else Objects(url, args.samples, k))
            got["followed"].append(steady(fix))
            print({k: round(v[-1], 1) for k, v in got.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    what = (f"{args.in_flight} requests in flight a worker" if args.in_flight
            else f"{args.per_request} samples a request")
    print(f"one request a sample: {med['now']:.1f} samples/s plain; the what-if with "
          f"{what}: {med['promised']:.1f}; followed: "
          f"{med['followed']:.1f} "
          f"(the what-if {med['promised'] / med['followed'] - 1:+.1%})")


if __name__ == "__main__":
    main()
