"""pipeprof's overhead on a cheap loader that loads in the training process (``num_workers=0``).

Issue 17's item 7: on an MNIST-style loader, profiled epochs were slower than plain ones (median
×1.12) while the report said 0.1-0.3 %. This measures it on issue 11's terms: CPU seconds per
sample, interleaved rounds (order rotated), medians, plain vs pipeprof vs torch.profiler, and
compares the overhead the report states (``estimated_s``) with the one measured, both as CPU
microseconds per sample.

The pipeline: ``--samples`` 28x28 uint8 images held in memory, each made a PIL image and run
through ``ToTensor`` + ``Normalize`` (what ``torchvision.datasets.MNIST`` does per sample),
``DataLoader(batch_size=64, shuffle=True, num_workers=0)``, no training step. CPU is this
process's (``time.process_time``: every thread, pipeprof's sampler included), from just before
the Profiler (or torch.profiler) is made to just after its ``with`` block ends; the report is
built after the window.

``--jpeg ROOT``: the JPEG pipeline of overhead.py instead (ImageFolder, 160 px files made in
ROOT if it is empty, RandomResizedCrop + flip + ToTensor + Normalize), ``--samples`` files.

    .venv/bin/python benchmarks/inprocess_cost.py --rounds 9 --json inprocess.json   # ~1 min
    .venv/bin/python benchmarks/inprocess_cost.py --how run   # as ``pipeprof run`` profiles it
    .venv/bin/python benchmarks/inprocess_cost.py --samples 20000 --rounds 21 --cheap  # ~1 min
    .venv/bin/python benchmarks/inprocess_cost.py --jpeg /tmp/jpeg160 --samples 2048 \
        --batch-size 16 --rounds 9 --sample-hz 0   # ~4 min
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Any

from _common import jpeg160_dataset, machine


def as_tensor(image: Any) -> Any:
    import torch

    return torch.from_numpy(image)


class MnistLike:
    """``--samples`` 28x28 grey images in memory, made PIL images and transformed per sample;
    ``cheap``: each image only made a tensor (one transform, a few µs a sample), so that what
    pipeprof adds per batch and per sample outside the transforms stands out."""

    def __init__(self, n: int, cheap: bool = False) -> None:
        import torch
        from torchvision import transforms

        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, 28, 28), dtype=torch.uint8, generator=g).numpy()
        self.labels = [i % 10 for i in range(n)]
        self.cheap = cheap
        mnist = [transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))]
        self.transform: Any = as_tensor if cheap else transforms.Compose(mnist)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from PIL import Image

        if self.cheap:
            return self.transform(self.images[i]), self.labels[i]
        return self.transform(Image.fromarray(self.images[i], mode="L")), self.labels[i]


def epoch(
    variant: str, loader: Any, sample_hz: float | None = None, how: str = "profiler"
) -> dict[str, Any]:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    prof: Any = None
    run: Any = None
    n = 0
    if variant == "plain":
        for x, _ in loader:
            n += len(x)
    elif variant == "pipeprof" and how == "run":  # what ``pipeprof run`` installs
        from pipeprof.attach.run import Run

        run = Run() if sample_hz is None else Run(sample_hz=sample_hz)
        run.install()
        try:
            for x, _ in loader:
                n += len(x)
        finally:
            run.uninstall()
            run.stop_profiling()
    elif variant == "pipeprof":
        import pipeprof

        prof = pipeprof.Profiler() if sample_hz is None else pipeprof.Profiler(sample_hz=sample_hz)
        with prof:
            for x, _ in prof.wrap(loader):
                n += len(x)
    elif variant == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            for x, _ in loader:
                n += len(x)
    else:
        raise ValueError(variant)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    out: dict[str, Any] = {"samples": n, "cpu_us_per_sample": cpu * 1e6 / n, "wall_s": wall}
    if prof is not None or run is not None:
        report = prof.report() if prof is not None else run.reports()[0][1]
        over = report["overhead"] or {}
        out["reported_fraction"] = over.get("estimated_fraction")
        out["reported_s"] = over.get("estimated_s")
        out["unprofiled_batches"] = over.get("unprofiled_batches")
    return out


def _ratio(reported: list[float], measured: list[float]) -> float | None:
    """The median per-round ratio of the stated overhead to the measured one (rounds where
    the measured one is positive)."""
    pairs = [rep / mes for rep, mes in zip(reported, measured, strict=True) if mes > 0]
    return round(statistics.median(pairs), 3) if pairs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--cheap", action="store_true", help="samples made tensors only (few µs)")
    ap.add_argument("--jpeg", metavar="ROOT", help="the JPEG pipeline over this folder")
    ap.add_argument("--sample-hz", type=float, help="pipeprof's sampling rate (its default)")
    ap.add_argument("--how", choices=("profiler", "run"), default="profiler",
                    help="pipeprof by hand (Profiler.wrap), or as pipeprof run installs it")
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    from torch.utils.data import DataLoader

    if args.jpeg:
        import os

        from pipeprof.demo import make_images

        os.makedirs(args.jpeg, exist_ok=True)
        if not any(os.scandir(args.jpeg)):
            make_images(args.jpeg, count=args.samples, size=(160, 160))
        dataset: Any = jpeg160_dataset(args.jpeg)
    else:
        dataset = MnistLike(args.samples, args.cheap)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    variants = ["plain", "pipeprof", "torch.profiler"]
    for v in variants:  # warm-up: imports, Kineto; not reported
        epoch(v, loader, args.sample_hz, args.how)
    rounds = []
    for r in range(args.rounds):
        k = r % len(variants)
        res = {v: epoch(v, loader, args.sample_hz, args.how) for v in variants[k:] + variants[:k]}
        rounds.append(res)
        line = "  ".join(f"{v} {res[v]['cpu_us_per_sample']:.1f} us" for v in variants)
        print(f"round {r + 1}/{args.rounds}: {line}", file=sys.stderr)
    med = {v: statistics.median(r[v]["cpu_us_per_sample"] for r in rounds) for v in variants}
    # per round, side by side: the measured extra CPU per sample and what the report said of it
    # (its estimated_s per sample: ``reported_fraction`` is a share of the profiled run's CPU,
    # not of the plain one's, so the two are compared as amounts)
    extra_us = [r["pipeprof"]["cpu_us_per_sample"] - r["plain"]["cpu_us_per_sample"]
                for r in rounds]  # fmt: skip
    stated_us = [(r["pipeprof"]["reported_s"] or 0.0) * 1e6 / r["pipeprof"]["samples"]
                 for r in rounds]  # fmt: skip
    measured = [e / r["plain"]["cpu_us_per_sample"] for e, r in zip(extra_us, rounds)]
    reported = [r["pipeprof"]["reported_fraction"] or 0.0 for r in rounds]
    torch_extra = [r["torch.profiler"]["cpu_us_per_sample"] / r["plain"]["cpu_us_per_sample"] - 1
                   for r in rounds]  # fmt: skip
    summary = {
        "cpu_us_per_sample": {v: round(m, 2) for v, m in med.items()},
        "pipeprof_extra": round(statistics.median(measured), 4),
        "pipeprof_extra_range": [round(min(measured), 4), round(max(measured), 4)],
        "torch_profiler_extra": round(statistics.median(torch_extra), 4),
        "reported_fraction": round(statistics.median(reported), 4),
        "measured_extra_us_per_sample": round(statistics.median(extra_us), 2),
        "stated_us_per_sample": round(statistics.median(stated_us), 2),
        "stated_over_measured": _ratio(stated_us, extra_us),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "settings": vars(args), "summary": summary,
                       "rounds": rounds}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
