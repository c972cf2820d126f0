"""A fast loop with workers, plain and under ``pipeprof run`` (issue 38: the training process's
cost with workers, and what the report states of it; docs/validation/run-cost.md).

The loop (written to a temporary folder and run as a script, plain and under ``pipeprof run``,
their order turned each round): ``--batches`` batches of 8 tiny samples from 2 forked workers
(``prefetch_factor=8``: they keep ahead), a 1 ms step of busy compute. Each run gives the
loop's time, the training thread's CPU in ``next()`` (median batch, after the first 50), the
training thread's whole CPU and the workers' (``RUSAGE_CHILDREN`` once they exited), and, for
``pipeprof run``, the cost its report states. Medians over the rounds.

    .venv/bin/python benchmarks/fast_workers.py --rounds 5   # ~1 minute
    .venv/bin/python benchmarks/fast_workers.py --run-args "--sample-hz 0"   # a variant

Each round's plain and profiled figures are printed too: on this VM a round's CPU swings by
±15 %, several times what pipeprof adds, so one run's ratio moves between about 0.4 and 1.1.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import compiled

LOOP = '''
import gc, json, resource, sys, time
import torch
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __len__(self):
        return 8 * int(sys.argv[1])

    def __getitem__(self, i):
        return torch.full((8,), float(i % 7)), i % 2


loader = DataLoader(Rows(), batch_size=8, num_workers=2, prefetch_factor=8,
                    multiprocessing_context="fork")
pc, tt = time.perf_counter, time.thread_time
gcs = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}  # generation -> [collections, seconds]
_gc_t = [0.0]


def _gc(phase, info):
    if phase == "start":
        _gc_t[0] = pc()
    else:
        g = gcs[info["generation"]]
        g[0] += 1
        g[1] += pc() - _gc_t[0]


it = iter(loader)
gc.callbacks.append(_gc)
r0 = resource.getrusage(resource.RUSAGE_THREAD)
t0 = pc()
cpu, k = [], 0
while True:
    a = tt()
    try:
        x, y = next(it)
    except StopIteration:
        break
    k += 1
    if k > 50:
        cpu.append(tt() - a)
    s = pc()
    while pc() - s < 0.001:
        pass
loop = pc() - t0
r1 = resource.getrusage(resource.RUSAGE_THREAD)
gc.callbacks.remove(_gc)
del it
gc.collect()
time.sleep(0.3)  # the workers exit and are reaped
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu.sort()
print("LOOP", json.dumps({
    "loop_s": loop, "next_cpu_us": cpu[len(cpu) // 2] * 1e6,
    "main_cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
    "workers_cpu_s": kids.ru_utime + kids.ru_stime,
    "gc_s": sum(g[1] for g in gcs.values()), "gc2": gcs[2][0], "gc1": gcs[1][0],
}))
'''


def once(script: Path, batches: int, profiled: bool, extra: list[str]) -> dict[str, float]:
    out = script.parent / "run.json"
    run = ["-m", "pipeprof", "run", "-o", str(out), *extra]
    head = [sys.executable, *(run if profiled else [])]
    done = subprocess.run([*head, str(script), str(batches)], capture_output=True, text=True,
                          check=True)  # fmt: skip
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LOOP "))
    got: dict[str, float] = json.loads(line[5:])
    if profiled:
        got["stated_s"] = json.loads(out.read_text())["overhead"]["estimated_s"]
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--run-args", default="", help="more arguments for pipeprof run, quoted")
    args = p.parse_args()
    compiled()
    got: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "fast.py"
        script.write_text(LOOP)
        for k in range(args.rounds):
            for profiled in (False, True) if k % 2 else (True, False):
                got[profiled].append(once(script, args.batches, profiled, args.run_args.split()))

    def med(h: bool, key: str) -> float:
        return statistics.median(r[key] for r in got[h])

    for k in range(args.rounds):
        a, b = got[False][k], got[True][k]
        print(f"round {k}: loop {a['loop_s']:.3f} / {b['loop_s']:.3f} s, next() "
              f"{a['next_cpu_us']:.0f} / {b['next_cpu_us']:.0f} µs, training thread "
              f"{a['main_cpu_s']:.3f} / {b['main_cpu_s']:.3f} s, workers "
              f"{a['workers_cpu_s']:.3f} / {b['workers_cpu_s']:.3f} s (plain / profiled)")
    plain, run = (med(False, "loop_s"), med(True, "loop_s"))
    extra_cpu = sum(med(True, k) - med(False, k) for k in ("main_cpu_s", "workers_cpu_s"))
    print(f"loop: plain {plain:.3f} s, pipeprof run {run:.3f} s ({run / plain - 1:+.1%})")
    print(f"next(): the training thread's CPU {med(False, 'next_cpu_us'):.0f} µs plain, "
          f"{med(True, 'next_cpu_us'):.0f} profiled (median batch)")
    for key, name in (("main_cpu_s", "training thread"), ("workers_cpu_s", "workers")):
        print(f"{name}: CPU {med(False, key):.3f} s plain, {med(True, key):.3f} profiled "
              f"({(med(True, key) - med(False, key)) * 1e6 / args.batches:+.0f} µs a batch)")
    print(f"the training process's collections: {med(False, 'gc_s') * 1e3:.1f} ms plain "
          f"({med(False, 'gc1'):.0f} of gen 1, {med(False, 'gc2'):.0f} full), "
          f"{med(True, 'gc_s') * 1e3:.1f} ms profiled ({med(True, 'gc1'):.0f}, "
          f"{med(True, 'gc2'):.0f})")
    print(f"added CPU {extra_cpu:.3f} s; the report states {med(True, 'stated_s'):.3f} s "
          f"({med(True, 'stated_s') / extra_cpu:.2f} of it)")
    # the same by the rounds' own differences (each round's pair ran back to back)
    pairs = [sum(got[True][k][key] - got[False][k][key] for key in ("main_cpu_s", "workers_cpu_s"))
             for k in range(args.rounds)]  # fmt: skip
    stated = [r["stated_s"] for r in got[True]]
    print(f"by the rounds' differences: added CPU {statistics.median(pairs):.3f} s (rounds "
          f"{min(pairs):+.3f} to {max(pairs):+.3f}); stated {statistics.median(stated):.3f} s "
          f"({statistics.median(stated) / statistics.median(pairs):.2f} of it)")


if __name__ == "__main__":
    main()
