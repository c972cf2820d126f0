"""Follow idle-workers' WebDataset fix (docs/streaming.md, "Shards a worker opened"): 192
samples as 3 local shards read by 4 workers, against num_workers=3 and against the same samples
as 4 shards; a 5 ms map a sample, batches of 4. An epoch's wall time (the workers' start
included), the cases in turn, medians.

    .venv/bin/python benchmarks/shards_fix.py 9
"""

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import webdataset as wds
from netdata import shard
from torch.utils.data import DataLoader


def write(folder: str, shards: int, per: int) -> list[str]:
    """``shards`` tar shards of ``per`` samples each (``tests/netdata.py``'s), their paths."""
    files = []
    for i in range(shards):
        path = f"{folder}/s{shards}-{i}.tar"
        with open(path, "wb") as f:
            f.write(shard(i, per))
        files.append(path)
    return files


def slow(x):  # type: ignore[no-untyped-def]
    time.sleep(0.005)
    return x


def epoch(files: list[str], workers: int) -> float:
    data = wds.WebDataset(files, shardshuffle=False, empty_check=False).decode()
    data = data.to_tuple("npy", "cls").map_tuple(slow, None)
    t = time.perf_counter()
    n = sum(len(b[0]) for b in DataLoader(data, batch_size=4, num_workers=workers))
    assert n == 192, n
    return time.perf_counter() - t

folder = tempfile.mkdtemp()
three, four = write(folder, 3, 64), write(folder, 4, 48)
cases = {"3 shards, 4 workers": (three, 4), "3 shards, 3 workers": (three, 3),
         "4 shards, 4 workers": (four, 4)}
got: dict[str, list[float]] = {k: [] for k in cases}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 9):
    for k in (list(cases) if r % 2 else list(cases)[::-1]):
        got[k].append(epoch(*cases[k]))
for k, v in got.items():
    print(f"{k}: {statistics.median(v) * 1e3:.1f} ms "
          f"(min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f})")
