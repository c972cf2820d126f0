"""Following the ``uneven-shards`` finding once for real (issue 40;
docs/validation/diagnosis.md).

A stream of 512 samples that take 1 ms each to read (a sleep: storage), in two shards, one to
each of 2 workers, batch 16, read by a loop whose step takes 4 ms (a sleep: an accelerator's
kernels): shards of 384 and 128 samples, and then of 256 each, as the finding's fix says. The
uneven epoch is profiled once for the finding and the gain it promises; then plain epochs of
each, alternating, ``--rounds`` each. Medians.

    .venv/bin/python benchmarks/uneven_shards.py --rounds 7   # ~15 s
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import pipeprof


class Shards(IterableDataset):
    """Shard ``s`` (samples ``bounds[s]`` to ``bounds[s + 1]``) read by worker ``s % workers``."""

    def __init__(self, sizes: list[int]) -> None:
        self.bounds = [0, *itertools.accumulate(sizes)]

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        me, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        shards = range(me, len(self.bounds) - 1, workers)
        for i in (i for s in shards for i in range(self.bounds[s], self.bounds[s + 1])):
            time.sleep(0.001)  # a read from storage
            yield torch.full((8,), float(i)), i % 10


def loader(sizes: list[int]) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(Shards(sizes), batch_size=16, num_workers=2)


def epoch(sizes: list[int]) -> float:
    t0 = time.perf_counter()
    for _ in loader(sizes):
        time.sleep(0.004)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    uneven, even = [384, 128], [256, 256]
    prof = pipeprof.Profiler(sample_hz=0)
    for _ in prof.wrap(loader(uneven)):
        time.sleep(0.004)
    report = prof.report().to_dict()
    found = {f["id"]: f for f in report["findings"]}
    tail = report["accounting"]["tail"]
    promise = found["uneven-shards"]["evidence"]["gain_s"] if "uneven-shards" in found else None
    runs: dict[str, list[float]] = {"uneven": [], "even": []}
    for k in range(args.rounds):
        for name in ("uneven", "even") if k % 2 else ("even", "uneven"):
            runs[name].append(epoch(uneven if name == "uneven" else even))
    a, b = (statistics.median(runs[n]) for n in ("uneven", "even"))
    print(f"profiled, uneven: worker {tail['last']} made the last {tail['batches']} batches "
          f"alone, {max(tail['waited_s'].values()):.3f} s after the other; uneven-shards "
          f"{'said' if promise is not None else 'not said'}, promising {promise} s")
    print(f"plain: uneven {a:.3f} s an epoch, even {b:.3f} s (medians of {args.rounds}): "
          f"saved {a - b:.3f} s" + (f", {(a - b) / promise:.2f} of the promise" if promise else ""))
    prof2 = pipeprof.Profiler(sample_hz=0)
    for _ in prof2.wrap(loader(even)):
        time.sleep(0.004)
    said = "uneven-shards" in {f["id"] for f in prof2.report().to_dict()["findings"]}
    print(f"profiled, even: uneven-shards {'said' if said else 'not said'}")


if __name__ == "__main__":
    main()
