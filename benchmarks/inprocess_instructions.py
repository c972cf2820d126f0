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
regions on); ``profiler`` (``Profiler.wrap`` by hand). Under callgrind a program runs about 50
times slower, so what pipeprof does by the clock happens 50 times as often a sample there:

1. The samplers are off in every variant (``sample_hz=0``): a thread that wakes ten times a
   second. What they cost is a rate (their CPU a second), measured apart (docs/cost.md).
2. So is the hang watchdog's thread (``hang_s=0``), which wakes twice a second. callgrind runs
   one thread at a time: a woken thread waits for the GIL until the main thread's time slice
   ends, and each of the main thread's GIL releases (about 40 a sample here, around torch's calls)
   signals it meanwhile. With it on, the count a sample rose by 1,500-3,900 (+0.4-1.0 %), in
   ``pthread_cond_signal`` and in the interpreter, and moved by 0.6 % from one run to the next.
3. A step's CPU time is read once in CPU_GAP_NS (20 ms; NOTE [ CPU training shares the cores ]
   in profiler.py), and such a step goes through the pass's generators, not the fast path. At
   full speed, 65-82 % of this loop's batches take the fast path; under callgrind, where a
   batch takes half a second, every other one. ``--real`` counts the batches on the fast path
   at full speed; ``--cpu-gap-ms`` sets the gap, so that the count of a step read and of one
   not read are each known, and the real mix of the two is their weighted sum
   (docs/validation/run-cost.md).

An instruction is not a second: pipeprof's code is the interpreter's, about as dense in
instructions per second as the pipeline's own Python around small tensors, and denser than a
large image's decode.
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


def child(variant: str, samples: int, batch_size: int, jpeg: str | None,
          cpu_gap_ms: float | None = None, fast: list[int] | None = None) -> None:
    """One count's process: ``samples`` through the loader, profiled as ``variant`` says;
    ``cpu_gap_ms``: the gap between the steps whose CPU is read (``CPU_GAP_NS``); ``fast``:
    gets the count of batches fetched on the fast path (NOTE [ The fast path ])."""
    import torch
    from torch.utils.data import DataLoader

    import pipeprof.profiler
    from pipeprof.collect.torch.loader import ProfiledLoader

    if cpu_gap_ms is not None:
        pipeprof.profiler.CPU_GAP_NS = int(cpu_gap_ms * 1e6)
    if fast is not None:
        own = ProfiledLoader.fast_next

        def counted(self: Any, short: Any) -> Any:
            fast[0] += 1
            return own(self, short)

        ProfiledLoader.fast_next = counted  # type: ignore[method-assign]

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

        with pipeprof.Profiler(sample_hz=0, hang_s=0) as prof:
            n = sum(len(x) for x, _ in prof.wrap(loader))
    else:
        from pipeprof.attach.run import Run

        run = Run(sample_hz=0, hang_s=0) if variant == "run" else None
        if run is not None:
            run.install()
        try:
            n = sum(len(x) for x, _ in loader)
        finally:
            if run is not None:
                run.uninstall()
                run.stop_profiling()
    assert n == samples, (n, samples)


def count(variant: str, samples: int, args: argparse.Namespace, real: bool = False
          ) -> tuple[int, int]:  # fmt: skip
    """The instructions one process of ``variant`` over ``samples`` ran, by callgrind, and its
    batches fetched on the fast path; ``real``: at full speed, no callgrind (instructions 0)."""
    out_file = os.path.join(args.keep, f"{variant}-{samples}.out") if args.keep else "/dev/null"
    cmd = [sys.executable, __file__, "--child", variant, "--samples", str(samples),
           "--batch-size", str(args.batch_size)] + (["--jpeg", args.jpeg] if args.jpeg else [])
    if args.cpu_gap_ms is not None:
        cmd += ["--cpu-gap-ms", str(args.cpu_gap_ms)]
    if not real:
        cmd[:0] = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    fast = re.search(r"fast path: (\d+)", out.stderr)
    if out.returncode or fast is None or (found is None and not real):
        raise SystemExit(f"{variant} {samples}: the child failed\n{out.stderr[-2000:]}")
    n = int(found.group(1)) if found else 0
    print(f"{variant} over {samples}: {n:,} instructions, {fast.group(1)} batches on the fast "
          "path", file=sys.stderr)  # fmt: skip
    return n, int(fast.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=8000, help="the window: these, then twice")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--jpeg", metavar="ROOT", help="the JPEG pipeline over this folder")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--keep", metavar="DIR", help="keep callgrind's files here, to compare "
                    "per function (callgrind_annotate)")
    ap.add_argument("--cpu-gap-ms", type=float, help="read the CPU time of a step this often "
                    "(CPU_GAP_NS; default pipeprof's 20 ms)")
    ap.add_argument("--real", action="store_true", help="no callgrind: count the batches on the "
                    "fast path at full speed")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        fast = [0]
        child(args.child, args.samples, args.batch_size, args.jpeg, args.cpu_gap_ms, fast)
        print(f"fast path: {fast[0]}", file=sys.stderr)
        return 0
    if args.jpeg:
        from _common import jpeg160_images

        jpeg160_images(args.jpeg)
    variants = args.variants.split(",")
    jobs = [(v, n) for v in variants for n in (args.samples, 2 * args.samples)]
    with ThreadPoolExecutor(1 if args.real else 2) as pool:  # one process a core
        found = dict(zip(jobs, pool.map(lambda job: count(*job, args, args.real), jobs)))
    counts = {job: c for job, (c, _) in found.items()}
    fast = {v: found[v, 2 * args.samples][1] - found[v, args.samples][1] for v in variants}
    per = {v: (counts[v, 2 * args.samples] - counts[v, args.samples]) / args.samples
           for v in variants}  # fmt: skip
    summary: dict[str, Any] = {"instructions_per_sample": {v: round(p) for v, p in per.items()},
                               "window_batches": args.samples // args.batch_size,
                               "window_fast_batches": fast}  # fmt: skip
    if per.get("plain"):
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
