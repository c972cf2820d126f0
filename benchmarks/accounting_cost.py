"""What the sample accounting adds to a batch (issue 40: on by default only at 0.2 % of the CPU
or less on the MNIST-style and JPEG benchmarks; docs/findings.md, "Every sample accounted for").

For a map-style dataset outside a distributed job (the benchmarks' case: no fingerprints, no
sketch) the accounting's per-batch work is: a dict lookup in the dataset reader of every batch
(the sketch, absent), two attribute checks in the collate of a timed batch (sketch, fingerprints)
and, with workers, the batch's arrival noted at the pass's end (``PassEnds.add``). A pass adds
reading its sampler at its start and its tail at its end. Each is timed here on its own
(``timeit``, the best of 7 repeats, as the statements run in pipeprof) and set against the CPU
of one batch of the MNIST-style pipeline (``benchmarks/inprocess_cost.py``'s: 64 28x28 images,
ToTensor + Normalize, in this process): the cheapest batch of the two benchmarks, so the largest
share. A side-by-side run of whole pipelines cannot resolve 0.2 % on this VM (their rounds
spread by several %); those runs are in docs/validation/diagnosis.md.

    .venv/bin/python benchmarks/accounting_cost.py   # ~20 s
"""

from __future__ import annotations

import sys
import time
import timeit
from pathlib import Path

from torch.utils.data import DataLoader

from pipeprof.collect.torch import epochs
from pipeprof.collect.torch.loader import Collate, MapDataset

sys.path.insert(0, str(Path(__file__).parent))
from inprocess_cost import MnistLike


def ns(stmt: str, glob: dict[str, object], number: int = 200_000) -> float:
    return min(timeit.repeat(stmt, globals=glob, number=number, repeat=7)) / number * 1e9


def main() -> None:
    reader = MapDataset(list(range(64)))
    collate = Collate(list, per_sample=False)
    ends = epochs.PassEnds(0)
    per_batch = {
        "reader: the sketch looked up (absent)": ns(
            "s = r.__dict__.get('_sketch')\nif s is not None: pass", {"r": reader}
        ),
        "collate: sketch and fingerprints checked": ns(
            "s = c.sketcher\nif s is not None: pass\nif c.ids_left: pass", {"c": collate}
        ),
        "main: the batch's arrival noted": ns("e.add('worker0', 12345)", {"e": ends}),
    }
    loader = DataLoader(MnistLike(60_000), batch_size=64, shuffle=True, num_workers=2)
    meta: dict[str, object] = {}

    def a_pass() -> None:
        ep = epochs.epoch_of(loader)
        meta["sampler"] = epochs.sampler_facts(loader)
        e = epochs.PassEnds(time.perf_counter_ns())
        for w in range(2):
            for t in range(64):
                e.add(f"worker{w}", t)
        epochs.record_pass(meta, ep, 60_000, e.tail(time.perf_counter_ns()))
        meta.pop("epochs")

    per_pass = min(timeit.repeat(a_pass, number=200, repeat=7)) / 200 * 1e9
    data = MnistLike(64 * 20)
    got = [data[i] for i in range(64)]  # warm
    t0 = time.process_time_ns()
    for b in range(20):
        got = [data[b * 64 + i] for i in range(64)]
    batch_ns = (time.process_time_ns() - t0) / 20
    del got
    added = sum(per_batch.values())
    for name, v in per_batch.items():
        print(f"{name:45s} {v:7.1f} ns a batch")
    print(
        f"{'a pass: sampler, tail, record (938 batches)':45s} {per_pass:7.0f} ns a pass "
        f"({per_pass / 938:.1f} ns a batch)"
    )
    batch = added + per_pass / 938
    print(
        f"MNIST-style batch of 64, its CPU: {batch_ns / 1e3:.0f} µs; the accounting: "
        f"{batch:.0f} ns, {batch / batch_ns:.5%} of it"
    )


if __name__ == "__main__":
    main()
