"""Cost of one timed region in pipeprof, in nanoseconds, next to this machine's yardsticks.

Measures, in the current process:

  (a) ``Recorder.open`` + ``Recorder.close``: the primitive behind every stage;
  (b) ``pipeprof.core.recorder.timed_call1`` around a no-op, minus calling the no-op directly
      (what a transform, ``collate`` or a ``Timed`` wrapper pays), also with no profile active;
  (c) ``with pipeprof.stage(name):`` around nothing, enabled and disabled, and a no-op decorated
      with ``@pipeprof.stage(name)``, called, minus calling the no-op directly;
  (d) ``Recorder.drain`` (the aggregation into ``Stat``s a worker runs once per batch), amortised
      per event, for a batch-shaped drain and for one bulk drain; plus what the main process does
      per batch with a worker's drain (unpickle + ``Session.merge``);
  (e) yardsticks: an empty Python function call and one ``time.perf_counter_ns()`` call.

Every figure is per iteration, net of the empty ``for`` loop around it (timeit's loop, measured
alone in the same repetition), so ``empty call`` is the cost of calling a function that does
nothing. Cases are interleaved inside each repetition (rep 1 runs every case, then rep 2, ...),
so a noisy neighbour slows all cases alike; the table gives the median over repetitions and the
min-max spread. The garbage collector is off while a case runs (as in ``timeit``).

    python benchmarks/region_cost.py                  # table
    python benchmarks/region_cost.py --reps 11 --json region_cost.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

import pipeprof
from pipeprof.core import recorder as recmod
from pipeprof.core.recorder import _CALIBRATED, Recorder, measure_overhead, timed_call1
from pipeprof.core.session import Session

clock = time.perf_counter_ns


def noop(x: Any = None) -> Any:
    return x


def empty() -> None:
    pass


# ---- hot-path cases: (name, stmt, what it is) -------------------------------------------------

HOT: list[tuple[str, str, str]] = [
    ("loop", "pass", "the empty timeit loop (subtracted from every other row)"),
    ("empty_call", "empty()", "yardstick: call an empty Python function"),
    ("perf_counter_ns", "clock()", "yardstick: one time.perf_counter_ns() call"),
    ("noop_direct", "noop(x)", "call the no-op directly (baseline for timed_call)"),
    ("open_close", "rec.close(rec.open('region'))", "(a) Recorder.open + Recorder.close"),
    ("timed_call", "timed_call1('region', noop, x)", "(b) timed_call1(path, noop, x), enabled"),
    ("timed_wrapper", "wrapped(x)", "(b) Timed(noop, path)(x): a wrapped transform, enabled"),
    ("plain_obj", "plain_obj(x)", "an object whose __call__ is the no-op (baseline for in place)"),
    ("timed_obj", "timed_obj(x)", "(b) Timed(that object, path)(x): its stand-in, enabled"),
    ("in_place", "marked(x)", "(b) that object timed in place, enabled, inside a stage"),
    ("in_place_off", "marked(x)", "(b) that object timed in place, no profile active"),
    ("timed_call_off", "timed_call1('region', noop, x)", "(b) timed_call1, no profile active"),
    ("stage", "with stage('region'):\n    pass", "(c) with pipeprof.stage(name), enabled"),
    ("stage_off", "with stage('region'):\n    pass", "(c) with pipeprof.stage(name), disabled"),
    ("stage_fn", "decorated(x)", "(c) @pipeprof.stage(name) on noop, called, enabled"),
]
ENABLED = {
    "open_close", "timed_call", "timed_wrapper", "timed_obj", "in_place", "stage", "stage_fn"
}


class NoopCall:
    """A transform whose call is the no-op."""

    def __call__(self, x: Any = None) -> Any:
        return x


class NoopMarked(NoopCall):
    """The same, its class's own call timed in place (NOTE [ Transforms timed in place ])."""

    def __call__(self, x: Any = None) -> Any:
        return x


def _hot_namespace() -> dict[str, Any]:
    from pipeprof.collect.torch.dataset import Timed, apply_marks

    marked = NoopMarked()
    apply_marks([(marked, "transform/noop", None)])
    rec = Recorder()
    rec.enabled = True
    return {
        "empty": empty,
        "clock": clock,
        "noop": noop,
        "x": object(),
        "rec": rec,
        "timed_call1": timed_call1,
        "stage": pipeprof.stage,
        "wrapped": Timed(noop, "transform/noop"),
        "plain_obj": NoopCall(),
        "timed_obj": Timed(NoopCall(), "transform/noop"),
        "marked": marked,
        "decorated": pipeprof.stage("region")(noop),
    }


def _run_hot(name: str, stmt: str, ns: dict[str, Any], number: int) -> float:
    """Seconds for ``number`` iterations of ``stmt``; the process recorder on when it must be."""
    glob = recmod.recorder()
    glob.enabled = name in ENABLED
    glob.reset("main")
    ns["rec"].raw.clear()
    frame = glob.open("load") if name == "in_place" else None  # a profiled batch's fetch
    try:
        return timeit.Timer(stmt, globals=ns).timeit(number)  # gc off inside, as timeit does
    finally:
        if frame is not None:
            glob.discard(frame)
        glob.enabled = False
        glob.reset("main")
        ns["rec"].raw.clear()


# ---- drain cases ------------------------------------------------------------------------------

# What a DataLoader worker of the demo pipeline records for one batch of 32 samples: eight
# per-sample stages (load, load/read, load/decode, five transforms) and one collate.
DEMO_PATHS = [
    "load",
    "load/read",
    "load/decode",
    "transform/RandomResizedCrop",
    "transform/RandomHorizontalFlip",
    "transform/ColorJitter",
    "transform/ToTensor",
    "transform/Normalize",
]


def batch_raw(batch: int = 32) -> dict[Any, list[int]]:
    """A worker's raw records for one batch (realistic durations, start times increasing), as
    the recorder keeps them."""
    rec = Recorder()
    t = clock()
    for i in range(batch):
        for j, path in enumerate(DEMO_PATHS):
            dur = 200_000 + 37_000 * j + (i * 7919) % 50_000
            rec.add(path, dur, 1, t)
            t += dur
    rec.add("collate", 900_000, 1, t)
    return rec.raw


def bulk_raw(events: int = 20_000) -> dict[Any, list[int]]:
    """One path, many events: what ``measure_overhead`` drains."""
    rec = Recorder()
    t = clock()
    for i in range(events):
        rec.add("overhead", 300 + i % 97, 1, t + i * 1000)
    return rec.raw


def _copy(raw: dict[Any, list[int]]) -> dict[Any, list[int]]:
    return {k: list(v) for k, v in raw.items()}


def _events(raw: dict[Any, list[int]]) -> int:
    return int(recmod.pack(_copy(raw), "main", 0)["events"])


def _time_drains(template: dict[str, list[int]], count: int) -> float:
    """Nanoseconds per event for ``count`` drains of copies of ``template``."""
    rec = Recorder()
    copies = [_copy(template) for _ in range(count)]
    was = gc.isenabled()
    gc.disable()
    try:
        t0 = clock()
        for raw in copies:
            rec.drain(raw)
        dt = clock() - t0
    finally:
        if was:
            gc.enable()
    return dt / (count * _events(template))


def _time_main_side(template: dict[str, list[int]], count: int) -> float:
    """ns per event the main process spends per batch: unpickle a drain and merge it."""
    payload = Recorder().drain(_copy(template))
    blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    session = Session()
    was = gc.isenabled()
    gc.disable()
    try:
        t0 = clock()
        for _ in range(count):
            session.merge(pickle.loads(blob))
        dt = clock() - t0
    finally:
        if was:
            gc.enable()
    return dt / (count * _events(template))


def _time_worker_pickle(template: dict[str, list[int]], count: int) -> tuple[float, int]:
    """ns per event to pickle a drain in the worker (the queue does it), and the bytes."""
    payload = Recorder().drain(_copy(template))
    t0 = clock()
    for _ in range(count):
        blob = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    dt = clock() - t0
    return dt / (count * _events(template)), len(blob)


# ---- driver -----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "pipeprof": pipeprof.__version__,
    }


def run(reps: int, number: int, drains: int, verbose: bool = True) -> dict[str, Any]:
    ns = _hot_namespace()
    for name, stmt, _ in HOT:  # warm up every case once
        _run_hot(name, stmt, ns, number // 10)
    per_rep: dict[str, list[float]] = {name: [] for name, _, _ in HOT}
    drain_cases: dict[str, Callable[[], float]] = {
        "drain_batch": lambda: _time_drains(batch_raw(), drains),
        "drain_bulk": lambda: _time_drains(bulk_raw(), max(1, drains // 50)),
        "main_merge_batch": lambda: _time_main_side(batch_raw(), drains),
        "worker_pickle_batch": lambda: _time_worker_pickle(batch_raw(), drains)[0],
        "open_close_plus_drain": lambda: _measure_overhead_ns(),
    }
    for name, fn in drain_cases.items():  # warm up (the first drain imports NumPy)
        fn()
        per_rep[name] = []
    for r in range(reps):
        for name, stmt, _ in HOT:
            secs = _run_hot(name, stmt, ns, number)
            per_rep[name].append(secs * 1e9 / number)
        loop = per_rep["loop"][-1]
        for name, _, _ in HOT[1:]:
            per_rep[name][-1] -= loop  # net of the loop, same repetition
        for name, fn in drain_cases.items():
            per_rep[name].append(fn())
        if verbose:
            print(
                f"  rep {r + 1}/{reps}: empty call {per_rep['empty_call'][-1]:.0f} ns, "
                f"open/close {per_rep['open_close'][-1]:.0f} ns",
                file=sys.stderr,
                flush=True,
            )
    # per-rep differences, so the timed_call cost is paired with its own baseline
    per_rep["timed_call_added"] = [
        a - b for a, b in zip(per_rep["timed_call"], per_rep["noop_direct"])
    ]
    per_rep["timed_wrapper_added"] = [
        a - b for a, b in zip(per_rep["timed_wrapper"], per_rep["noop_direct"])
    ]
    for case in ("timed_obj", "in_place", "in_place_off"):
        per_rep[f"{case}_added"] = [
            a - b for a, b in zip(per_rep[case], per_rep["plain_obj"])
        ]
    per_rep["timed_call_off_added"] = [
        a - b for a, b in zip(per_rep["timed_call_off"], per_rep["noop_direct"])
    ]
    # a region's full cost: its hot path plus its share of the batch-shaped drain
    per_rep["timed_call_total"] = [
        a + b for a, b in zip(per_rep["timed_call_added"], per_rep["drain_batch"])
    ]
    per_rep["open_close_total"] = [
        a + b for a, b in zip(per_rep["open_close"], per_rep["drain_batch"])
    ]
    per_rep["stage_total"] = [a + b for a, b in zip(per_rep["stage"], per_rep["drain_batch"])]
    per_rep["stage_fn_added"] = [
        a - b for a, b in zip(per_rep["stage_fn"], per_rep["noop_direct"])
    ]
    per_rep["stage_fn_total"] = [
        a + b for a, b in zip(per_rep["stage_fn_added"], per_rep["drain_batch"])
    ]
    _, payload_bytes = _time_worker_pickle(batch_raw(), 1)
    summary: dict[str, dict[str, Any]] = {}
    for name, vals in per_rep.items():
        summary[name] = {
            "median_ns": statistics.median(vals),
            "min_ns": min(vals),
            "max_ns": max(vals),
            "reps": [round(v, 1) for v in vals],
        }
    empty_ns = summary["empty_call"]["median_ns"]
    for row in summary.values():
        row["x_empty_call"] = row["median_ns"] / empty_ns if empty_ns > 0 else None
    return {
        "benchmark": "region_cost",
        "machine": machine(),
        "settings": {
            "reps": reps,
            "number": number,
            "drains": drains,
            "batch_events": _events(batch_raw()),
            "bulk_events": _events(bulk_raw()),
            "batch_payload_bytes": payload_bytes,
        },
        "results": summary,
    }


def _measure_overhead_ns() -> float:
    """pipeprof's own figure, as ``pipeprof.profile`` takes it (``report["overhead"]``), measured
    afresh (pipeprof keeps the first measurement of a process)."""
    _CALIBRATED.clear()
    return measure_overhead()


ROWS = [
    ("yardsticks", None),
    ("empty_call", "empty Python function call"),
    ("perf_counter_ns", "time.perf_counter_ns()"),
    ("noop_direct", "noop(x) called directly"),
    ("(a) Recorder", None),
    ("open_close", "open + close (hot path)"),
    ("open_close_total", "open + close + drain share"),
    ("(b) timed_call1, added over noop(x)", None),
    ("timed_call_added", "timed_call1 (hot path)"),
    ("timed_call_total", "timed_call1 + drain share"),
    ("timed_wrapper_added", "Timed wrapper (a transform)"),
    ("timed_obj_added", "Timed stand-in of an object"),
    ("in_place_added", "in place (a transform object)"),
    ("in_place_off_added", "in place, profile off"),
    ("timed_call_off_added", "timed_call1, profile off"),
    ("(c) pipeprof.stage", None),
    ("stage", "with stage(): (hot path)"),
    ("stage_total", "with stage(): + drain share"),
    ("stage_off", "with stage():, profile off"),
    ("stage_fn_added", "@stage() function, over noop(x)"),
    ("stage_fn_total", "@stage() function + drain share"),
    ("(d) aggregation, per event", None),
    ("drain_batch", "drain, batch-shaped"),
    ("drain_bulk", "drain, 20 000 events, 1 path"),
    ("worker_pickle_batch", "pickle drain (worker, queue)"),
    ("main_merge_batch", "unpickle + Session.merge"),
    ("open_close_plus_drain", "measure_overhead() (reported)"),
]


def table(result: dict[str, Any]) -> str:
    res = result["results"]
    st = result["settings"]
    lines = [
        f"pipeprof region cost, ns per region (median of {st['reps']} reps, net of the loop); "
        f"batch-shaped drain = {st['batch_events']} events in 9 paths, "
        f"{st['batch_payload_bytes']} B pickled",
        f"{'case':34s} {'median':>9s} {'min':>9s} {'max':>9s} {'x empty call':>13s}",
    ]
    for key, label in ROWS:
        if label is None:
            lines.append(f"-- {key}")
            continue
        row = res[key]
        lines.append(
            f"  {label:32s} {row['median_ns']:9.1f} {row['min_ns']:9.1f} "
            f"{row['max_ns']:9.1f} {row['x_empty_call']:13.2f}"
        )
    m = result["machine"]
    lines.append(
        f"machine: {m['cpu_model']}, {m['cpu_count']} CPUs, "
        f"{m['implementation']} {m['python']}, {m['platform']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9, help="repetitions (median reported; >= 7)")
    ap.add_argument("--number", type=int, default=100_000, help="iterations per hot-path case")
    ap.add_argument("--drains", type=int, default=200, help="batch-shaped drains per repetition")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.number < 1 or args.drains < 1:
        ap.error("--reps, --number and --drains must be positive")
    result = run(args.reps, args.number, args.drains)
    print(table(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
