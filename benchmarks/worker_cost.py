"""What pipeprof adds to a DataLoader worker's CPU per sample, in situ, on identical work.

A worker's work for one batch (32 x ``dataset[i]``, ``collate_fn``, pickling the result as the
worker's queue would) runs in this process with one torch thread, in three variants, in a random
order per batch and with the same random seeds, so every variant crops and flips alike:

  plain          the user's dataset and ``default_collate``
  profiled       the twin pipeprof builds (timed ``load``, read/decode split, each transform of
                 the ``Compose``) and its ``Collate`` (drain and pack), recorder on
  wrappers off   the same twin with the recorder off: what the wrappers cost by themselves
  unprofiled     a batch as a worker fetches it unprofiled (NOTE [ Unprofiled batches ]): the
                 user's transforms set back in the twin, the recorder off, the batch in its
                 carrier with no records

and, from those, what a worker adds a sample when one batch in 8 is profiled (the default,
``stage_every=8``): (profiled + 7 x unprofiled) / 8.

After a warm-up round, the estimator is the least CPU (``time.thread_time_ns``) each batch took
over the rounds, summed: a neighbour only ever adds time. The pipeline: 160 x 160 px JPEGs
(``pipeprof.demo.make_images``) in ImageFolder layout, ``RandomResizedCrop(128)``, flip,
``ToTensor``, ``Normalize``.

    .venv/bin/python benchmarks/worker_cost.py --root /tmp/jpeg160 --rounds 7
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import shutil
import sys
import tempfile
import time
from typing import Any

import torch
from _common import jpeg160_dataset
from torch.utils.data import default_collate

from pipeprof.collect.torch import loader as loader_mod
from pipeprof.collect.torch.dataset import instrument_dataset
from pipeprof.collect.torch.loader import Collate, MapDataset, set_swaps
from pipeprof.core.recorder import STAGE_EVERY, recorder
from pipeprof.demo import make_images


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", help="image folder (made once and kept) instead of a temp dir")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    tmp = None if args.root else tempfile.mkdtemp(prefix="pipeprof-worker-cost-")
    root = args.root or tmp
    try:
        if not os.path.isdir(os.path.join(root, "class0")):
            make_images(root, count=args.images, size=(160, 160))
        return measure(jpeg160_dataset(root), args)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def measure(dataset: Any, args: argparse.Namespace) -> int:
    torch.set_num_threads(1)  # as in a DataLoader worker
    swaps: list[Any] = []
    twin = MapDataset(instrument_dataset(dataset, swaps)[0])
    collate = Collate(default_collate, per_sample=False)

    def plain(batch: list[int]) -> Any:
        return default_collate([dataset[i] for i in batch])

    def profiled(batch: list[int]) -> Any:
        return collate([twin[i] for i in batch])

    def unprofiled(batch: list[int]) -> Any:
        # as MapDataset._off_batch leaves it; Collate then ends it (stand-ins back, recorder on)
        loader_mod._OFF[0] = (time.perf_counter_ns(), set_swaps(swaps, plain=True))
        return collate(twin.__getitems__(batch))

    variants = {
        "plain": plain, "profiled": profiled, "wrappers off": profiled, "unprofiled": unprofiled,
    }  # fmt: skip
    rec = recorder()
    order = list(range(len(dataset)))
    random.Random(1).shuffle(order)
    batches = [order[b : b + 32] for b in range(0, 32 * args.batches, 32)]
    best = {k: [2**62] * len(batches) for k in variants}
    for r in range(-1, args.rounds):  # round -1 warms caches and imports up: not counted
        for j, batch in enumerate(batches):
            names = list(variants)
            random.Random(r * 1000 + j).shuffle(names)
            for name in names:
                rec.enabled = name == "profiled"
                torch.manual_seed(j)
                random.seed(j)
                t0 = time.thread_time_ns()
                pickle.dumps(variants[name](batch), protocol=pickle.HIGHEST_PROTOCOL)
                if r >= 0:
                    best[name][j] = min(best[name][j], time.thread_time_ns() - t0)
                rec.enabled = False
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    samples = 32 * len(batches)
    base = sum(best["plain"]) / samples / 1e3
    print(f"least CPU per sample over {args.rounds} rounds, {samples} samples, one torch thread")
    for name in variants:
        us = sum(best[name]) / samples / 1e3
        print(f"  {name:13s} {us:8.1f} µs   added {us - base:+6.1f} µs ({us / base - 1:+.2%})")
    per = {k: sum(v) / samples / 1e3 for k, v in best.items()}
    every = STAGE_EVERY
    sampled = (per["profiled"] + (every - 1) * per["unprofiled"]) / every
    print(f"  one batch in {every} profiled (stage_every={every}): added {sampled - base:+.1f} µs "
          f"a sample ({sampled / base - 1:+.2%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
