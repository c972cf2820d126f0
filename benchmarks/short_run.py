"""A short run with workers under ``pipeprof run`` against plain (issue 38: at least 0.99 of
plain's throughput, the loader's rebuild and the workers' start included;
docs/validation/run-cost.md).

The loop (written to a temporary folder and run as a script, plain and under ``pipeprof run``,
alternating, ``--pairs`` pairs): 60 steps of a small MLP over a DataLoader with 2 workers, 16
samples a batch that wait 0.2 ms each, a 10 ms step; the script's own time from ``iter()`` to
the end of the loop (so the workers' start is in it) and of ``iter()`` alone. Medians.

    .venv/bin/python benchmarks/short_run.py --pairs 8   # ~40 s
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import compiled

LOOP = '''
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sleepy(Dataset):
    def __len__(self):
        return 960

    def __getitem__(self, i):
        time.sleep(0.0002)
        return torch.full((8,), float(i % 7)), i % 2


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(Sleepy(), batch_size=16, num_workers=2)
t0 = time.perf_counter()
it = iter(loader)
t1 = time.perf_counter()
for x, y in it:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.010)
print("LOOP", t1 - t0, time.perf_counter() - t0)
'''


def once(script: Path, profiled: bool) -> tuple[float, float]:
    """``iter()``'s seconds and the loop's, from one run."""
    out = script.parent / "run.json"
    head = [sys.executable, *(["-m", "pipeprof", "run", "-o", str(out)] if profiled else [])]
    done = subprocess.run([*head, str(script)], capture_output=True, text=True, check=True)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LOOP "))
    first, loop = map(float, line.split()[1:])
    return first, loop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=8)
    args = p.parse_args()
    compiled()
    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "short.py"
        script.write_text(LOOP)
        for k in range(args.pairs):
            for profiled in (False, True) if k % 2 else (True, False):
                got[profiled].append(once(script, profiled))
    med = {h: [statistics.median(x[i] for x in got[h]) for i in (0, 1)] for h in got}
    ratios = sorted(a[1] / b[1] for a, b in zip(got[False], got[True]))
    print(f"iter(): plain {med[False][0] * 1e3:.1f} ms, pipeprof run {med[True][0] * 1e3:.1f} ms")
    share = med[False][1] / med[True][1]
    print(f"loop: plain {med[False][1]:.3f} s, pipeprof run {med[True][1]:.3f} s: throughput "
          f"{share:.3f} of plain (pairs {ratios[0]:.3f} to {ratios[-1]:.3f})")


if __name__ == "__main__":
    main()
