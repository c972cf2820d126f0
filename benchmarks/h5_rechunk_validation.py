"""Validate ``pipeprof.bench_encodings`` on an HDF5 source: the rate predicted for the file
rechunked as the ``h5-read-amplification`` finding says, against a real DataLoader over it.

    .venv/bin/python benchmarks/h5_rechunk_validation.py                   # batches of 32 and 4
    .venv/bin/python benchmarks/h5_rechunk_validation.py --rounds 6 --batch-sizes 32

A climate-style field (288 time steps of 32 × 32 float32) stored gzip, chunked 288 steps deep
(1.12 MiB a chunk, over a 1 MiB chunk cache: the file is opened with one under any HDF5), read
one step per sample by a lazily opening dataset (``tests/h5data.py``'s LazyH5) with 2 workers:
each read decodes 288× what it returns.
``bench_encodings`` over that loader predicts the rate with ``HDF5 gzip, 1 sample/chunk``; the
same field written with chunks of one step is then run for real (steady samples/s, as in worker
scaling). Error = predicted / measured - 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from torch.utils.data import DataLoader, default_collate

import pipeprof
from pipeprof.bench.scaling import run_loader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from h5data import LazyH5, field, write

TARGET = "HDF5 gzip, 1 sample/chunk"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--batch-sizes", default="32,4")
    p.add_argument("--samples", type=int, default=64)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = field(288, 32, 32)
        bad, good = os.path.join(tmp, "bad.h5"), os.path.join(tmp, "good.h5")
        write(bad, "x", data, chunks=(288, 32, 32), compression="gzip")
        write(good, "x", data, chunks=(1, 32, 32), compression="gzip")
        for bs in (int(v) for v in args.batch_sizes.split(",")):
            errors = []
            for _ in range(args.rounds):
                loader = DataLoader(LazyH5(bad, n=288, rdcc_nbytes=2**20), batch_size=bs,
                                    num_workers=2)  # fmt: skip
                e = pipeprof.bench_encodings(loader, samples=args.samples, kinds=["hdf5"])
                row = next(r for r in e["rows"] if r["encoding"] == TARGET)
                run = run_loader(LazyH5(good, n=288), list(range(288)), 2, bs, default_collate,
                                 2.0, row["predicted_samples_per_s"])  # fmt: skip
                x = run["samples_per_s"]
                errors.append(row["predicted_samples_per_s"] / x - 1)
                print(f"batch {bs:3d}: current {e['rows'][0]['predicted_samples_per_s']:7.0f} "
                      f"measured; rechunked predicted {row['predicted_samples_per_s']:7.0f} "
                      f"(model alone {row['model_samples_per_s']:7.0f}), measured {x:7.0f}: "
                      f"{errors[-1]:+.1%}; workers' CPU {run['worker_cpu_ms']:.3g} ms, main "
                      f"{run['main_cpu_ms']:.3g} ms a batch")  # fmt: skip
            med, lo, hi = statistics.median(errors), min(errors), max(errors)
            print(f"batch {bs:3d}: median error {med:+.1%} [{lo:+.1%}, {hi:+.1%}] over "
                  f"{len(errors)} rounds")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
