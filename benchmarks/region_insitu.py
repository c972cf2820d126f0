"""What a timed region really costs between a sample's transforms, side by side.

The report costs each timed region at ``in_situ_ns``: one empty region timed from outside, once
a batch, where regions run (NOTE [ In-situ region cost ] in core/recorder.py). That is the
region's own work, run with cold caches. It cannot see the other half: the cache lines the
region brings in evict the user's, and the user's next instructions pay to fetch them again.

This measures the whole of it on the path a sample takes with ``num_workers=0`` or in a worker:
``dataset[i]`` on the user's dataset, and on the dataset pipeprof's loader reads (its ``load``
wrapper, the loader split into ``load/read`` + ``load/decode`` where it can be, each ``Compose``
step a stage), profiling on. The two run interleaved in chunks of ``--chunk`` samples, on the
same indices with the same random seed per sample, this thread's CPU clock around each chunk,
order rotated; the difference per sample, divided by the regions a sample opens, is a region's
measured cost. After each profiled chunk one probe runs, as a worker runs one per batch.

It prints, per pipeline, the measured cost of a region, the probe's median (``in_situ_ns``),
the warm probe taken right after it, and what the report states per region,
``in_situ_ns + displaced_ns`` = ``2 * in_situ_ns - warm`` (the region's cold work, and its
excess over the warm region once more, displaced from the user's code: see ``overhead`` in
analyze/stages.py; on these pipelines the user's work between two regions is well over
``COLD_AFTER_NS``, so every region counts as following real work).

    .venv/bin/python benchmarks/region_insitu.py --rounds 1200 --json region_insitu.json  # ~1 min
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import jpeg160_dataset, machine
from inprocess_cost import MnistLike


def regions_per_sample(twin: Any, sample: Any) -> int:
    """The regions one ``twin[sample]`` records (read from the recorder, not assumed)."""
    from pipeprof.core.recorder import recorder

    sink = recorder().sink
    for key in list(sink):
        sink[key] = []
    twin[sample]
    return sum(len(v) // 2 for k, v in sink.items() if isinstance(v, list))


def measure(
    name: str, dataset: Any, rounds: int, chunk: int, seeded: bool = False
) -> dict[str, Any]:
    import torch

    from pipeprof.collect.torch.dataset import instrument_dataset
    from pipeprof.collect.torch.loader import MapDataset
    from pipeprof.core.recorder import measure_overhead, probe, recorder

    rec = recorder()
    twin = MapDataset(instrument_dataset(dataset)[0])
    mine, _ = rec.begin()
    before = rec.enter(mine)
    try:
        per_sample = regions_per_sample(twin, 0)
        per_event = measure_overhead()
        n = len(dataset)
        tt = time.thread_time_ns
        cpu: dict[str, list[float]] = {"plain": [], "profiled": []}
        probes: list[int] = []
        warm: list[int] = []
        order = [("plain", dataset), ("profiled", twin)]
        for r in range(rounds):
            idx = [(r * chunk + j) % n for j in range(chunk)]
            for label, ds in order if r % 2 else order[::-1]:
                t0 = tt()
                for i in idx:
                    if seeded:  # the same crop and flip in both (a cheap reseed: CPU only)
                        torch.default_generator.manual_seed(i)
                    ds[i]
                cpu[label].append((tt() - t0) / chunk)
                if label == "profiled":
                    cold, hot = probe(None)  # the report's two probes, as a worker runs them
                    probes.append(cold)
                    warm.append(hot)
                    for key in list(mine):  # keep the sink small, as a per-batch drain does
                        mine[key] = []
    finally:
        rec.leave(before)
        rec.end()
    diffs = [p - q for p, q in zip(cpu["profiled"], cpu["plain"], strict=True)]
    in_situ = statistics.median(probes)
    measured = statistics.median(diffs) / per_sample
    hot = statistics.median(warm)
    stated = 2 * in_situ - hot
    out = {
        "pipeline": name,
        "regions_per_sample": per_sample,
        "plain_us_per_sample": round(statistics.median(cpu["plain"]) / 1e3, 2),
        "measured_ns_per_region": round(measured),
        "in_situ_ns": round(in_situ),
        "per_event_ns": round(per_event),
        "warm_probe_ns": round(hot),
        "stated_ns_per_region": round(stated),
        "stated_over_measured": round(stated / measured, 3) if measured > 0 else None,
        "in_situ_over_measured": round(in_situ / measured, 3) if measured > 0 else None,
    }
    print(json.dumps(out), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=600)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--json", metavar="OUT")
    args = ap.parse_args(argv)
    from pipeprof.demo import make_images

    results = [measure("mnist-like", MnistLike(4096), args.rounds, args.chunk)]
    with tempfile.TemporaryDirectory() as root:
        make_images(root, count=256, size=(160, 160))
        jpeg = jpeg160_dataset(root)
        results.append(measure("jpeg160", jpeg, args.rounds // 4, args.chunk, seeded=True))
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "settings": vars(args), "results": results}, f,
                      indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
