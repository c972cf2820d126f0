"""CPU cost of pipeprof per batch of the demo pipeline, plain vs profiled, on identical work.

A shared machine makes DataLoader epochs too noisy to resolve a 1 % difference (see
``loader_throughput.py``). This benchmark removes the two largest sources of noise: it runs the
work a DataLoader worker does for one batch (32 x ``dataset[i]``: read, decode, five transforms,
then ``collate_fn``) in this process, plain and profiled *alternately, batch by batch, with the
same random seeds*, so both variants crop, flip and jitter exactly the same way; and it measures
CPU time (``time.process_time_ns``, one torch thread as in a worker), not wall time.

The profiled variant is what pipeprof adds in a worker and in the main process: the timed
dataset, loader and transforms of the twin loader ``pipeprof.profile`` builds, the ``Collate``
wrapper (which drains the recorder into stats), pickling that drain as the worker's result queue
would, and unpickling + ``Session.merge`` as the main process does. The batch tensors themselves
are not pickled in either variant (the same cost in both).

    python benchmarks/batch_cost.py                     # 512 images, 7 rounds
    python benchmarks/batch_cost.py --rounds 9 --json batch_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

clock = time.process_time_ns


def _seed(k: int) -> None:
    import torch

    random.seed(k)
    torch.manual_seed(k)


PHASES = ("samples", "collate", "ship")


def summarise(
    cpu: dict[str, list[list[tuple[int, int, int]]]],
    n: int,
    nb: int,
    args: argparse.Namespace,
    events_per_sample: float,
) -> dict[str, Any]:
    """Per-round medians and the least-CPU estimate, in microseconds per sample."""
    rounds = len(cpu["plain"])

    def per_round(v: str) -> list[float]:
        return [sum(map(sum, cpu[v][r])) / 1e3 / n for r in range(rounds)]

    def least(v: str, phase: int | None = None) -> float:
        # timeit's estimator: a neighbour only ever adds time, so the least CPU each batch took
        # over the rounds is the closest to its undisturbed cost; summed over the batches
        pick = (lambda t: sum(t)) if phase is None else (lambda t: t[phase])
        return sum(min(pick(cpu[v][r][j]) for r in range(rounds)) for j in range(nb)) / 1e3 / n

    rp, rq = per_round("plain"), per_round("profiled")
    ratios = [p / q for p, q in zip(rp, rq)]
    least_phases = {
        ph: {"plain_us": least("plain", i), "profiled_us": least("profiled", i)}
        for i, ph in enumerate(PHASES)
    }
    lp, lq = least("plain"), least("profiled")
    return {
        "benchmark": "batch_cost",
        "settings": {
            "images": n,
            "batch_size": args.batch_size,
            "rounds": rounds,
            "events_per_sample": events_per_sample,
        },
        "rounds": [{"plain_us_per_sample": p, "profiled_us_per_sample": q} for p, q in zip(rp, rq)],
        "summary": {
            "plain_us_per_sample": statistics.median(rp),
            "profiled_us_per_sample": statistics.median(rq),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "extra_us_per_sample_median": statistics.median(q - p for p, q in zip(rp, rq)),
            "least_plain_us_per_sample": lp,
            "least_profiled_us_per_sample": lq,
            "least_ratio": lp / lq,
            "least_extra_us_per_sample": lq - lp,
            "least_by_phase": least_phases,
        },
    }


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    st = result["settings"]
    lines = [
        f"demo pipeline, a worker's work per batch, CPU time, same seeds: {st['rounds']} rounds "
        f"of alternating plain/profiled batches ({st['images']} images, batch {st['batch_size']})",
        f"{'':34s} {'plain':>9s} {'profiled':>9s} {'added':>8s} {'plain/prof':>10s}",
        f"{'us/sample, median of rounds':34s} {s['plain_us_per_sample']:9.1f} "
        f"{s['profiled_us_per_sample']:9.1f} {s['extra_us_per_sample_median']:8.1f} "
        f"{s['ratio_median']:10.4f}   (rounds {s['ratio_min']:.4f}-{s['ratio_max']:.4f})",
        f"{'us/sample, least CPU per batch':34s} {s['least_plain_us_per_sample']:9.1f} "
        f"{s['least_profiled_us_per_sample']:9.1f} {s['least_extra_us_per_sample']:8.1f} "
        f"{s['least_ratio']:10.4f}",
    ]
    for ph, v in s["least_by_phase"].items():
        lines.append(
            f"{'  of which ' + ph:34s} {v['plain_us']:9.1f} {v['profiled_us']:9.1f} "
            f"{v['profiled_us'] - v['plain_us']:8.1f}"
        )
    lines.append(f"timed regions per sample: {st['events_per_sample']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7, help="rounds over all batches (medians)")
    ap.add_argument("--root", help="use (and keep) this image folder instead of a temp dir")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)

    import torch

    from pipeprof.collect.torch.loader import build_loader
    from pipeprof.core.recorder import recorder
    from pipeprof.core.session import Session
    from pipeprof.demo import demo_loader, make_images

    torch.set_num_threads(1)  # as in a DataLoader worker
    tmp = None
    root = args.root
    if root is None:
        tmp = root = tempfile.mkdtemp(prefix="pipeprof-bench-")
    try:
        os.makedirs(root, exist_ok=True)
        if not any(os.scandir(root)):
            make_images(root, count=args.images)
        loader = demo_loader(root, workers=0, batch_size=args.batch_size)
        twin, _ = build_loader(loader)
        plain_ds, prof_ds = loader.dataset, twin.dataset
        plain_collate, prof_collate = loader.collate_fn, twin.collate_fn
        n = len(plain_ds)
        batches = [
            list(range(i, min(i + args.batch_size, n))) for i in range(0, n, args.batch_size)
        ]
        rec = recorder()
        session = Session()
        done = [0]  # samples profiled, for events per sample

        def plain(idx: list[int], k: int) -> tuple[int, int, int]:
            """CPU ns of (the samples, collate, shipping records): nothing to ship here."""
            _seed(k)
            t0 = clock()
            samples = [plain_ds[i] for i in idx]
            t1 = clock()
            plain_collate(samples)
            return t1 - t0, clock() - t1, 0

        def profiled(idx: list[int], k: int) -> tuple[int, int, int]:
            _seed(k)
            rec.enabled = True
            try:
                t0 = clock()
                samples = [prof_ds[i] for i in idx]
                t1 = clock()
                carrier = prof_collate(samples)  # collate, then drain the recorder
                t2 = clock()
                blob = pickle.dumps(carrier.payload, protocol=pickle.HIGHEST_PROTOCOL)
                session.merge(pickle.loads(blob))  # what the main process does with it
                t3 = clock()
            finally:
                rec.enabled = False
            done[0] += len(idx)
            return t1 - t0, t2 - t1, t3 - t2

        def check() -> None:  # both variants must produce the very same batch
            _seed(1)
            a = plain_collate([plain_ds[i] for i in batches[0]])
            _seed(1)
            rec.enabled = True
            try:
                b = prof_collate([prof_ds[i] for i in batches[0]]).batch
            finally:
                rec.enabled = False
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "batches differ"

        check()
        for j, idx in enumerate(batches):  # warm-up: imports, first drain, page cache
            plain(idx, j), profiled(idx, j)
        nb = len(batches)
        # cpu[variant][round][batch] = (samples ns, collate ns, ship ns)
        cpu: dict[str, list[list[tuple[int, int, int]]]] = {"plain": [], "profiled": []}
        for r in range(args.rounds):
            cpu["plain"].append([])
            cpu["profiled"].append([])
            for j, idx in enumerate(batches):  # seed j for batch j in every round: same work
                if (j + r) % 2:  # alternate who goes first
                    cpu["plain"][r].append(plain(idx, j))
                    cpu["profiled"][r].append(profiled(idx, j))
                else:
                    cpu["profiled"][r].append(profiled(idx, j))
                    cpu["plain"][r].append(plain(idx, j))
            tp = sum(map(sum, cpu["plain"][r]))
            tq = sum(map(sum, cpu["profiled"][r]))
            print(
                f"round {r + 1}/{args.rounds}: plain {tp / 1e6 / n:.3f} ms/sample, profiled "
                f"{tq / 1e6 / n:.3f}, plain/profiled {tp / tq:.4f}",
                file=sys.stderr,
                flush=True,
            )
        result = summarise(cpu, n, nb, args, session.events / max(done[0], 1))
        print(table(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
            print(f"wrote {args.json}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
