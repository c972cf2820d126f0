"""What a StatefulDataLoader's snapshots cost a batch (issue 40; the ``snapshots-unread`` hint,
docs/findings.md).

torchdata's StatefulDataLoader over 4,096 samples, batch 8, 2 workers, a loop that calls
``state_dict()`` every 100 steps; the dataset keeps a state of ``--state-kb`` (a cache, as a
stateful dataset holds) that every snapshot copies. ``snapshot_every_n_steps`` 1 (the default)
against 100 (the loop's own interval), alternating, ``--rounds`` epochs each. Medians.

    .venv/bin/python benchmarks/snapshot_cost.py --rounds 7   # ~20 s
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader


class Cached(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, state_kb: int) -> None:
        self.n, self.blob = n, bytes(state_kb * 1024)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((16,), float(i))

    def state_dict(self) -> dict[str, bytes]:
        return {"blob": self.blob}

    def load_state_dict(self, state: dict[str, bytes]) -> None:
        self.blob = state["blob"]


def epoch(every: int, state_kb: int) -> float:
    loader = StatefulDataLoader(Cached(4096, state_kb), batch_size=8, num_workers=2,
                                snapshot_every_n_steps=every)  # fmt: skip
    t0 = time.perf_counter()
    for k, _ in enumerate(loader):
        if k % 100 == 99:
            loader.state_dict()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--state-kb", type=int, default=1024)
    args = p.parse_args()
    runs: dict[int, list[float]] = {1: [], 100: []}
    for r in range(args.rounds):
        for every in (1, 100) if r % 2 else (100, 1):
            runs[every].append(epoch(every, args.state_kb))
    a, b = statistics.median(runs[1]), statistics.median(runs[100])
    print(f"state {args.state_kb} kB: snapshot every step {a:.3f} s an epoch (512 batches), "
          f"every 100 steps {b:.3f} s: {(a - b) / 512 * 1e3:.3f} ms a batch "
          f"(medians of {args.rounds})")


if __name__ == "__main__":
    main()
