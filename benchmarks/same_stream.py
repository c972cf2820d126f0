"""Following the ``same-samples-in-workers`` finding once for real (issue 40;
docs/validation/diagnosis.md).

An IterableDataset of 512 samples that cost 1 ms each (a busy loop: decoding), 2 workers, batch
16, read by a loop that consumes every batch: unsharded (each worker yields all of it) and then
sharded by ``get_worker_info()`` as the finding's fix says. Per epoch: the batches, the distinct
samples, the wall time; and whether pipeprof's profile of each says the finding. Medians of
``--rounds`` epochs each.

    .venv/bin/python benchmarks/same_stream.py --rounds 5   # ~30 s
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import pipeprof


class Decoded(IterableDataset):
    def __init__(self, n: int, shard: bool) -> None:
        self.n, self.shard = n, shard

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        for i in range(self.n):
            if self.shard and info is not None and i % info.num_workers != info.id:
                continue
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.001:
                pass
            yield torch.full((8,), float(i)), i % 10


def epoch(shard: bool) -> tuple[int, int, float]:
    loader = DataLoader(Decoded(512, shard), batch_size=16, num_workers=2)
    t0 = time.perf_counter()
    batches, seen = 0, set()
    for x, _ in loader:
        batches += 1
        seen.update(int(v) for v in x[:, 0])
    return batches, len(seen), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    for shard in (False, True):
        runs = [epoch(shard) for _ in range(args.rounds)]
        prof = pipeprof.Profiler(sample_hz=0)
        for _ in prof.wrap(DataLoader(Decoded(512, shard), batch_size=16, num_workers=2)):
            pass
        found = [f["id"] for f in prof.report().to_dict()["findings"]]
        print(f"{'sharded' if shard else 'unsharded'}: {runs[0][0]} batches, {runs[0][1]} "
              f"distinct samples, {statistics.median(r[2] for r in runs):.3f} s an epoch "
              f"(median of {args.rounds}); same-samples-in-workers "
              f"{'said' if 'same-samples-in-workers' in found else 'not said'}")


if __name__ == "__main__":
    main()
