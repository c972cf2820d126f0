"""pipeprof's cost on a loader in the training process, counted in instructions, not seconds.

On this project's shared 2-core VM one round's CPU time swings by 10-30 %, so a cost near 1 %
is neither shown nor refuted by timing (docs/validation/run-cost.md). valgrind's callgrind
counts the instructions a process runs instead: the same count for the same program and inputs
whatever else the machine does. Each variant runs as a process of its own under callgrind twice,
over ``--samples`` and over twice as many; the difference of the two counts is what the second
``--samples`` cost, past the imports, the loader's start and the profile's first batches
(``--samples 8000``: batches 125 to 250 of 64, past the 80 after which the stages are timed in
one batch in 32; NOTE [ The short path ] in collect/torch/loader.py). Per sample, against plain:

    .venv/bin/python benchmarks/inprocess_instructions.py                # ~8 min, MNIST-style
    .venv/bin/python benchmarks/inprocess_instructions.py --jpeg /tmp/jpeg160 --samples 1024 \
        --batch-size 16

Variants: ``plain``; ``run`` (the loader as ``pipeprof run`` profiles it: ``Run`` installed,
regions on); ``profiler`` (``Profiler.wrap`` by hand). pipeprof's samplers are off in every
variant (``sample_hz=0``): under callgrind a program runs about 50 times slower, and a thread
that wakes ten times a second would run 50 times as often as it does for real. What the samplers
cost is a rate (their CPU a second), measured apart (docs/cost.md). An instruction is not a
second: pipeprof's code is the interpreter's, about as dense in instructions per second as the
pipeline's own Python around small tensors, and denser than a large image's decode.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

VARIANTS = ("plain", "run", "profiler")


def child(variant: str, samples: int, batch_size: int, jpeg: str | None) -> None:
    """One count's process: ``samples`` through the loader, profiled as ``variant`` says."""
    import torch
    from torch.utils.data import DataLoader

    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same random crops in every process
    if jpeg:
        from _common import jpeg160_dataset

        dataset: Any = jpeg160_dataset(jpeg)
        dataset.samples = (dataset.samples * (samples // len(dataset.samples) + 1))[:samples]
        dataset.targets = [s[1] for s in dataset.samples]
    else:
        from inprocess_cost import MnistLike

        dataset = MnistLike(samples)
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=g)
    if variant == "profiler":
        import pipeprof

        with pipeprof.Profiler(sample_hz=0) as prof:
            n = sum(len(x) for x, _ in prof.wrap(loader))
    else:
        from pipeprof.attach.run import Run

        run = Run(sample_hz=0) if variant == "run" else None
        if run is not None:
            run.install()
        try:
            n = sum(len(x) for x, _ in loader)
        finally:
            if run is not None:
                run.uninstall()
                run.stop_profiling()
    assert n == samples, (n, samples)


def count(variant: str, samples: int, args: argparse.Namespace) -> int:
    """The instructions one process of ``variant`` over ``samples`` ran, by callgrind."""
    out_file = os.path.join(args.keep, f"{variant}-{samples}.out") if args.keep else "/dev/null"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}", sys.executable,
           __file__, "--child", variant, "--samples", str(samples),
           "--batch-size", str(args.batch_size)] + (["--jpeg", args.jpeg] if args.jpeg else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or found is None:
        raise SystemExit(f"{variant} {samples}: valgrind failed\n{out.stderr[-2000:]}")
    print(f"{variant} over {samples}: {int(found.group(1)):,} instructions", file=sys.stderr)
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=8000, help="the window: these, then twice")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--jpeg", metavar="ROOT", help="the JPEG pipeline over this folder")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--keep", metavar="DIR", help="keep callgrind's files here, to compare "
                    "per function (callgrind_annotate)")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.samples, args.batch_size, args.jpeg)
        return 0
    if args.jpeg:
        from _common import jpeg160_images

        jpeg160_images(args.jpeg)
    variants = args.variants.split(",")
    jobs = [(v, n) for v in variants for n in (args.samples, 2 * args.samples)]
    with ThreadPoolExecutor(2) as pool:  # one process a core: a count does not depend on load
        counts = dict(zip(jobs, pool.map(lambda job: count(*job, args), jobs)))
    per = {v: (counts[v, 2 * args.samples] - counts[v, args.samples]) / args.samples
           for v in variants}  # fmt: skip
    summary: dict[str, Any] = {"instructions_per_sample": {v: round(p) for v, p in per.items()}}
    if "plain" in per:
        summary["extra"] = {v: round(per[v] / per["plain"] - 1, 4) for v in variants
                            if v != "plain"}  # fmt: skip
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "counts": {f"{v} {n}": c for (v, n), c
                                                          in counts.items()},
                       "summary": summary}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
