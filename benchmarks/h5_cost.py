"""What pipeprof adds to one h5py read, in microseconds (NOTE [ Timing h5py reads ] in
pipeprof/collect/hdf5.py).

For each kind of read, in the current process, against a file written to a temporary folder:

  plain     h5py's own ``Dataset.__getitem__`` / ``read_direct`` (nothing installed);
  off       pipeprof's methods installed, no profile running (the recorder is off);
  on        installed and profiling: the read timed as a stage and counted (bytes, chunks, the
            stored size of each chunk, remembered per dataset after its first lookup).

Cases are interleaved inside each repetition, so a noisy neighbour slows all alike; the table
gives the median over repetitions of the per-read time, the added cost ``on - plain`` and
``off - plain``, and ``on - plain`` between the fastest runs (the least noisy estimate on a shared
machine). The garbage collector is off while a case runs.

    python benchmarks/h5_cost.py                 # table
    python benchmarks/h5_cost.py --reps 9 --json h5_cost.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from pipeprof.collect import hdf5
from pipeprof.core.recorder import recorder

clock = time.perf_counter_ns


def make_file(path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 32, 32)).astype("f4")
    with h5py.File(path, "w") as f:
        f.create_dataset("raw", data=x, chunks=(1, 32, 32))
        f.create_dataset("gzip", data=x, chunks=(1, 32, 32), compression="gzip")
        f.create_dataset("small", data=x, chunks=(1, 8, 8))  # 16 chunks a step
        f.create_dataset("contiguous", data=x)


def cases(f: h5py.File) -> dict[str, Any]:
    """name -> a function reading ``n`` samples, the way a dataset's __getitem__ would."""
    raw, gz, small, contig = f["raw"], f["gzip"], f["small"], f["contiguous"]
    out = np.empty((32, 32), "f4")

    def rd(n: int) -> None:
        for i in range(n):
            raw.read_direct(out, np.s_[i % 512])

    return {
        "raw d[i] (1 chunk)": lambda n: [raw[i % 512] for i in range(n)],
        "gzip d[i] (1 chunk)": lambda n: [gz[i % 512] for i in range(n)],
        "raw d[[i,i+3,i+9]] (fancy)": lambda n: [
            raw[[i % 500, i % 500 + 3, i % 500 + 9]] for i in range(n)
        ],
        "raw d[i] (16 chunks)": lambda n: [small[i % 512] for i in range(n)],
        "contiguous d[i]": lambda n: [contig[i % 512] for i in range(n)],
        "raw read_direct": rd,
        'f["raw"][i] (opened per read)': lambda n: [f["raw"][i % 512] for i in range(n)],
    }


def timed(fn: Any, n: int) -> float:
    gc.disable()
    try:
        t0 = clock()
        fn(n)
        return (clock() - t0) / n / 1e3
    finally:
        gc.enable()


def run(reps: int, n: int) -> dict[str, dict[str, list[float]]]:
    rec = recorder()
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.h5"
        make_file(path)
        with h5py.File(path, "r") as f:
            work = cases(f)
            for fn in work.values():  # warm the page cache and pipeprof's layout memo
                hdf5.install()
                fn(64)
                hdf5.uninstall()
            for _ in range(reps):
                for name, fn in work.items():
                    row = results.setdefault(name, {"plain": [], "off": [], "on": []})
                    row["plain"].append(timed(fn, n))
                    hdf5.install()
                    try:
                        row["off"].append(timed(fn, n))
                        rec.enabled = True
                        before = rec.enter({})
                        try:
                            row["on"].append(timed(fn, n))
                        finally:
                            rec.leave(before)
                            rec.enabled = False
                    finally:
                        hdf5.uninstall()
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    results = run(args.reps, args.reads)
    print(f"h5py {h5py.__version__}, HDF5 {h5py.version.hdf5_version}; median of {args.reps} "
          f"repetitions of {args.reads} reads, µs per read")  # fmt: skip
    print(f"{'read':32} {'plain':>8} {'off':>8} {'on':>8} {'+on':>7} {'+off':>7}  fastest")
    table = {}
    for name, row in results.items():
        med = {k: statistics.median(v) for k, v in row.items()}
        table[name] = {**med, "added_on_us": med["on"] - med["plain"],
                       "added_off_us": med["off"] - med["plain"]}  # fmt: skip
        print(f"{name:32} {med['plain']:8.2f} {med['off']:8.2f} {med['on']:8.2f} "
              f"{med['on'] - med['plain']:7.2f} {med['off'] - med['plain']:7.2f}  "
              f"{min(row['on']) - min(row['plain']):.2f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"reads": args.reads, "reps": args.reps,
                                         "table": table}, indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
