"""What the samplers cost a profile on the JPEG pipeline: their source kept between profiles, or
made afresh for each (as before the source was kept; docs/validation/overhead.md).

Usage: python benchmarks/sampler_start.py [--root /tmp/jpeg160] [--rounds 20]

Each round profiles one epoch of the ``benchmarks/overhead.py`` pipeline (1,024 JPEGs of 160 px,
batch 32, 2 workers started afresh) with ``pipeprof.Profiler().wrap(loader)`` once per variant,
in an order rotated from round to round, and reads the report's ``overhead.sampler_s``: the CPU
of the samplers' threads (host and NVML), priming included. The variants:

  kept    as pipeprof runs: the host sampler takes the process's kept /proc source, and NVML,
          once found missing, is not tried again
  afresh  each profile makes its source anew and tries NVML again

Prints the medians and the per-round differences (afresh - kept: median, mean ± SE). The first
round warms up and is not counted.
"""

from __future__ import annotations

import argparse
import gc
import statistics
from typing import Any

from _common import jpeg160_images
from overhead import make_loader

import pipeprof
from pipeprof.collect.samplers import host, nvml


def _afresh(psutil: Any) -> Any:
    kind = host._Procfs if host._procfs_available() else host._Psutil
    return kind(psutil)


def epoch(loader: Any, variant: str, kept: Any) -> float:
    host._take = kept if variant == "kept" else _afresh
    if variant == "afresh":
        nvml._MISSING.clear()
    gc.collect()
    prof = pipeprof.Profiler()
    with prof:
        for _ in prof.wrap(loader):
            pass
    return float(prof.report()["overhead"]["sampler_s"]) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/tmp/jpeg160", help="the JPEGs (made there if missing)")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)
    jpeg160_images(args.root, args.images)
    loader = make_loader(args.root, 2, 32)
    kept = host._take
    ms: dict[str, list[float]] = {"kept": [], "afresh": []}
    for r in range(args.rounds + 1):
        for variant in ("kept", "afresh") if r % 2 else ("afresh", "kept"):
            value = epoch(loader, variant, kept)
            if r:
                ms[variant].append(value)
    host._take = kept
    for variant, values in ms.items():
        print(f"{variant:7s} sampler_s, ms a profile: median {statistics.median(values):.3f}")
    diff = [a - k for a, k in zip(ms["afresh"], ms["kept"], strict=True)]
    se = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else float("nan")
    print(
        f"afresh - kept, per round: median {statistics.median(diff):.3f} ms, "
        f"mean {statistics.mean(diff):.3f} ± {se:.3f} ({args.rounds} rounds)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
