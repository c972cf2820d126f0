"""An iterable stream under torchrun, for tests/test_distributed.py: plain torch, no pipeprof.

Each rank reads a stream of ``--samples`` samples through a DataLoader, sharded by worker and,
with ``--rank-shard``, by rank too (the correct way); without it every rank reads the same
stream (the bug of a streaming dataset not split by node).
"""

import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class Stream(IterableDataset):
    def __init__(self, n, by_rank):
        self.n, self.by_rank = n, by_rank

    def __iter__(self):
        info = get_worker_info()
        w, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        r, ranks = (dist.get_rank(), dist.get_world_size()) if self.by_rank else (0, 1)
        for i in range(self.n):
            if i % (workers * ranks) == r * workers + w:
                yield torch.full((4,), float(i)), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--rank-shard", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    loader = DataLoader(Stream(args.samples, args.rank_shard), batch_size=8,
                        num_workers=args.workers)
    seen = 0
    for x, _ in loader:
        seen += len(x)
    dist.barrier()
    print(f"rank {dist.get_rank()} read {seen} samples")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
