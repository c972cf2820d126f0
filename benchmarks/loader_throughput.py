"""Throughput of a plain vs a pipeprof-profiled vs a torch.profiler-profiled DataLoader.

The pipeline is pipeprof's demo (``pipeprof.demo``): JPEG files on disk in ImageFolder layout, PIL
read + decode, RandomResizedCrop(224) / RandomHorizontalFlip / ColorJitter / ToTensor /
Normalize, batches of 32, ``--workers`` worker processes, no accelerator.

Each round runs one epoch of every variant, in an order rotated from round to round (so no
variant always runs first or last on a noisy machine):

  plain           ``for batch in loader``
  pipeprof        ``for batch in ProfiledLoader(loader, Session())``: what ``pipeprof.profile``
                  iterates, the recorder on in the main process and in every worker
  torch.profiler  ``with torch.profiler.profile(activities=[CPU]): for batch in loader`` (the
                  loop only; torch.profiler sees the main process, not the workers)
  profile()       ``pipeprof.profile(loader)``: the whole call, timed from outside (it also
                  measures its own per-region cost and builds the report)

Throughput is "steady": samples after the first batch divided by the time from the first batch's
arrival to the end of the epoch, so the workers' start-up (fork, first batch) is left out of
every variant the same way. The epoch's wall time from ``iter()`` to the end (start-up included)
is reported too. Workers are not persistent: each epoch starts its workers afresh, as the demo
loader does and as ``pipeprof.profile`` does with the twin loader it builds, so every variant pays
the same start-up, and start-up is outside the steady figure anyway.

    python benchmarks/loader_throughput.py                      # 512 images, 2 workers, 5 rounds
    python benchmarks/loader_throughput.py --rounds 7 --json loader.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

from _common import machine

clock = time.perf_counter_ns

VARIANTS = ("plain", "pipeprof", "torch.profiler", "profile()")


def _samples(batch: Any) -> int:
    return len(batch[1]) if isinstance(batch, (list, tuple)) else len(batch)


def timed_epoch(batches: Iterable[Any]) -> dict[str, Any]:
    """Iterate ``batches`` to the end; wall time, steady throughput (after the first batch)."""
    t_iter = clock()
    t_first = None
    first = total = 0
    arrivals = []
    for batch in batches:
        arrivals.append(clock())
        n = _samples(batch)
        if t_first is None:
            t_first, first = clock(), n
        total += n
    t_end = clock()
    if t_first is None:
        raise RuntimeError("the loader yielded no batches")
    steady_s = (t_end - t_first) / 1e9
    return {
        "samples": total,
        "epoch_s": (t_end - t_iter) / 1e9,
        "startup_s": (t_first - t_iter) / 1e9,
        "steady_s": steady_s,
        "samples_per_s": (total - first) / steady_s if steady_s > 0 else float("nan"),
        "arrivals_ms": [round((t - t_iter) / 1e6, 2) for t in arrivals],
    }


def cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its reaped children (the workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def with_cpu(run: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    """``run`` plus the CPU it cost, main process and workers, per sample (start-up included).

    Non-persistent workers are joined at the end of the epoch, so their CPU time is in
    RUSAGE_CHILDREN by the time ``run`` returns.
    """

    def timed(loader: Any) -> dict[str, Any]:
        c0 = cpu_s()
        out = run(loader)
        out["cpu_s"] = cpu_s() - c0
        out["cpu_ms_per_sample"] = out["cpu_s"] * 1e3 / max(out["samples"], 1)
        return out

    return timed


def run_plain(loader: Any) -> dict[str, Any]:
    return timed_epoch(loader)


def run_pipeprof(loader: Any) -> dict[str, Any]:
    from pipeprof.collect.torch.loader import ProfiledLoader
    from pipeprof.core.session import Session

    t0 = clock()
    session = Session(framework="torch", mode="loader")
    profiled = ProfiledLoader(loader, session)
    build_s = (clock() - t0) / 1e9
    out = timed_epoch(profiled)
    out["build_s"] = build_s
    out["events"] = session.events
    return out


def run_torch_profiler(loader: Any) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    t0 = clock()
    prof: Any = profile(activities=[ProfilerActivity.CPU])  # untyped in torch
    prof.__enter__()
    try:
        out = timed_epoch(loader)
    finally:
        t1 = clock()
        prof.__exit__(None, None, None)
        t2 = clock()
    out["enter_to_exit_s"] = (t2 - t0) / 1e9
    out["exit_s"] = (t2 - t1) / 1e9  # stopping the profiler and collecting its events
    out["events"] = len(prof.events())
    return out


def run_profile_call(loader: Any) -> dict[str, Any]:
    import pipeprof

    t0 = clock()
    report = pipeprof.profile(loader)
    wall = (clock() - t0) / 1e9
    steady = report["steady"]
    over = report["overhead"]
    return {
        "samples": report["samples"],
        "call_s": wall,  # the whole pipeprof.profile() call, report included
        "epoch_s": report["wall_s"],  # pipeprof's own wall: from iter() to the end
        "startup_s": report["startup_s"],
        "samples_per_s": steady["samples_per_s"],  # pipeprof's own steady figure
        "overhead_per_event_ns": over["per_event_ns"],
        "overhead_events": over["events"],
        "overhead_estimated_fraction": over["estimated_fraction"],
    }


RUNNERS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "plain": with_cpu(run_plain),
    "pipeprof": with_cpu(run_pipeprof),
    "torch.profiler": with_cpu(run_torch_profiler),
    "profile()": with_cpu(run_profile_call),
}


def _med(vals: list[float]) -> float:
    vals = [v for v in vals if v == v]
    return statistics.median(vals) if vals else float("nan")


def summarise(rounds: list[dict[str, dict[str, Any]]], variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        sps = [r[v]["samples_per_s"] for r in rounds]
        ep = [r[v]["epoch_s"] for r in rounds]
        cpu = [r[v]["cpu_ms_per_sample"] for r in rounds]
        row: dict[str, Any] = {
            "samples_per_s": {"median": _med(sps), "min": min(sps), "max": max(sps)},
            "epoch_s": {"median": _med(ep), "min": min(ep), "max": max(ep)},
            "cpu_ms_per_sample": {"median": _med(cpu), "min": min(cpu), "max": max(cpu)},
        }
        if v != "plain" and "plain" in variants:
            ratios = [r[v]["samples_per_s"] / r["plain"]["samples_per_s"] for r in rounds]
            row["ratio_to_plain"] = {
                "median": _med(ratios),
                "min": min(ratios),
                "max": max(ratios),
                "rounds": ratios,
            }
            eratio = [r["plain"]["epoch_s"] / r[v]["epoch_s"] for r in rounds]
            row["epoch_ratio_to_plain"] = {"median": _med(eratio), "rounds": eratio}
            # best epoch of each: the least disturbed by neighbours on a shared machine
            best = max(r[v]["samples_per_s"] for r in rounds)
            row["best_ratio_to_plain"] = best / max(r["plain"]["samples_per_s"] for r in rounds)
            # CPU efficiency: plain CPU per sample / this variant's (1.0 = costs nothing extra)
            cratio = [r["plain"]["cpu_ms_per_sample"] / r[v]["cpu_ms_per_sample"] for r in rounds]
            row["cpu_ratio_to_plain"] = {
                "median": _med(cratio),
                "min": min(cratio),
                "max": max(cratio),
                "rounds": cratio,
            }
        if v == "profile()":
            calls = [r[v]["call_s"] for r in rounds]
            row["call_s"] = {"median": _med(calls), "min": min(calls), "max": max(calls)}
            if "plain" in variants:  # the whole call against a plain epoch of the same round
                cr = [r["plain"]["epoch_s"] / r[v]["call_s"] for r in rounds]
                row["call_ratio_to_plain_epoch"] = {"median": _med(cr), "rounds": cr}
            row["overhead_per_event_ns"] = _med([r[v]["overhead_per_event_ns"] for r in rounds])
            row["overhead_estimated_fraction"] = _med(
                [r[v]["overhead_estimated_fraction"] or float("nan") for r in rounds]
            )
        if v == "pipeprof":
            row["events_per_epoch"] = _med([r[v]["events"] for r in rounds])
        if v == "torch.profiler":
            row["exit_s"] = _med([r[v]["exit_s"] for r in rounds])
        out[v] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians reported)")
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated subset of {', '.join(VARIANTS)}",
    )
    ap.add_argument("--root", help="use (and keep) this image folder instead of a temp dir")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")

    from pipeprof.demo import demo_loader, make_images

    tmp = None
    root = args.root
    if root is None:
        tmp = root = tempfile.mkdtemp(prefix="pipeprof-bench-")
    try:
        os.makedirs(root, exist_ok=True)
        if not any(os.scandir(root)):
            t0 = clock()
            make_images(root, count=args.images)
            print(
                f"made {args.images} JPEGs (500x375) in {root} in {(clock() - t0) / 1e9:.1f} s",
                file=sys.stderr,
            )
        loader = demo_loader(root, workers=args.workers, batch_size=args.batch_size)
        timed_epoch(loader)  # warm-up epoch: page cache, imports; not reported
        if "torch.profiler" in variants:
            run_torch_profiler(loader)  # the profiler's first start loads Kineto; not reported
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(args.rounds):
            k = r % len(variants)
            order = variants[k:] + variants[:k]
            res = {}
            for v in order:
                res[v] = RUNNERS[v](loader)
            res["order"] = order  # type: ignore[assignment]
            rounds.append(res)
            line = "  ".join(
                f"{v} {res[v]['samples_per_s']:6.1f}/s {res[v]['cpu_ms_per_sample']:.2f} cpu-ms"
                for v in variants
            )
            print(f"round {r + 1}/{args.rounds}: {line}", file=sys.stderr, flush=True)
        summary = summarise(rounds, variants)
        result = {
            "benchmark": "loader_throughput",
            "machine": {**machine(), "loadavg_at_start": os.getloadavg()},
            "settings": {
                "workers": args.workers,
                "images": args.images,
                "batch_size": args.batch_size,
                "rounds": args.rounds,
                "persistent_workers": False,
                "variants": variants,
                "loadavg_at_end": os.getloadavg(),
            },
            "rounds": rounds,
            "summary": summary,
        }
        print(table(result))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
            print(f"wrote {args.json}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def table(result: dict[str, Any]) -> str:
    s = result["settings"]
    summ = result["summary"]
    variants = s["variants"]
    lines = [
        f"DataLoader throughput: {s['images']} JPEGs, batch {s['batch_size']}, {s['workers']} "
        f"workers (not persistent), {s['rounds']} interleaved rounds",
        "steady samples/s = samples after the first batch / time from the first batch to the end",
        "",
        "round  "
        + "  ".join(f"{v:>15s}" for v in variants)
        + "".join(f"  {v + '/plain':>22s}" for v in variants if v != "plain"),
    ]
    for i, r in enumerate(result["rounds"]):
        cells = "  ".join(f"{r[v]['samples_per_s']:15.1f}" for v in variants)
        if "plain" in variants:
            cells += "".join(
                f"  {r[v]['samples_per_s'] / r['plain']['samples_per_s']:22.3f}"
                for v in variants
                if v != "plain"
            )
        lines.append(f"{i + 1:5d}  {cells}")
    lines.append("")
    lines.append(
        f"{'variant':16s} {'median/s':>9s} {'min':>8s} {'max':>8s} {'ratio':>7s} "
        f"{'r.min':>7s} {'r.max':>7s} {'epoch s':>8s} {'cpu ms/smp':>10s} "
        f"{'cpu ratio':>9s} {'c.min':>6s} {'c.max':>6s}"
    )
    for v in variants:
        row = summ[v]
        sp = row["samples_per_s"]
        rat = row.get("ratio_to_plain")
        rtxt = (
            f"{rat['median']:7.3f} {rat['min']:7.3f} {rat['max']:7.3f}"
            if rat
            else f"{'-':>7s} {'-':>7s} {'-':>7s}"
        )
        cr = row.get("cpu_ratio_to_plain")
        ctxt = (
            f"{cr['median']:9.3f} {cr['min']:6.3f} {cr['max']:6.3f}"
            if cr
            else f"{'-':>9s} {'-':>6s} {'-':>6s}"
        )
        lines.append(
            f"{v:16s} {sp['median']:9.1f} {sp['min']:8.1f} {sp['max']:8.1f} {rtxt} "
            f"{row['epoch_s']['median']:8.3f} "
            f"{row['cpu_ms_per_sample']['median']:10.3f} {ctxt}"
        )
    lines.append(
        "ratio = variant/plain steady samples/s per round; cpu ratio = plain CPU per "
        "sample / variant's (main + workers, whole epoch); medians, min, max over rounds"
    )
    best = "  ".join(
        f"{v} {summ[v]['best_ratio_to_plain']:.3f}"
        for v in variants
        if "best_ratio_to_plain" in summ[v]
    )
    if best:
        lines.append(f"best epoch / best plain epoch (least disturbed): {best}")
    if "pipeprof" in summ:
        lines.append(
            f"pipeprof timed regions per epoch: {summ['pipeprof']['events_per_epoch']:.0f}"
        )
    if "profile()" in summ:
        p = summ["profile()"]
        lines.append(
            f"pipeprof.profile(loader): whole call {p['call_s']['median']:.3f} s (median); "
            f"its report: overhead {p['overhead_per_event_ns']:.0f} ns/event, "
            f"estimated fraction {p['overhead_estimated_fraction']:.5f}"
        )
        if "call_ratio_to_plain_epoch" in p:
            lines.append(
                f"plain epoch time / whole profile() call time: "
                f"{p['call_ratio_to_plain_epoch']['median']:.3f} (median, start-up included)"
            )
    if "torch.profiler" in summ:
        lines.append(
            f"torch.profiler: stopping and collecting events took "
            f"{summ['torch.profiler']['exit_s']:.3f} s after the loop (median)"
        )
    m = result["machine"]
    lines.append(
        f"machine: {m['cpu_model']}, {m['cpu_count']} CPUs, Python {m['python']}, "
        f"torch {m['torch']}, torchvision {m['torchvision']}, Pillow {m['pillow']}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
