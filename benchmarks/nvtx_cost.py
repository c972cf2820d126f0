"""What an NVTX range adds to a timed region (collect/ranges.py), in nanoseconds.

The emitting path is forced on (``PIPEPROF_NVTX_FORCE=1``: a real ``pipeprof`` domain; with no
Nsight attached each call goes through the nvtx package into libnvToolsExt, whose entry points
are then no-ops). Under ``nsys profile`` the tool's own handling of each range comes on top:
measure that with nsys itself. Cases:

  (a) ``timed_call1`` around a no-op, ranges off (the default) and on: the difference is what
      a stage in a worker pays for its range;
  (b) ``with pipeprof.stage()``, off and on;
  (c) a ``Profiler`` region (``Timer`` vs ``RangeTimer``), off and on;
  (d) the push + pop pair alone: pipeprof's ``Ranges.open`` (cached event attributes per
      name) and the hot path's inlined form of it, the domain's ``push_range(attributes)`` /
      ``pop_range``, ``Domain.push_range(message=...)``, and the module-level
      ``nvtx.push_range(message, domain=...)`` / ``nvtx.pop_range``, which with no tool attached
      finds the library's dummy domain and emits nothing (its cost is that check).

Every figure is per iteration, net of the empty timeit loop measured in the same repetition;
cases are interleaved within each repetition; the garbage collector is off (timeit). Median and
min-max over the repetitions.

    python benchmarks/nvtx_cost.py                   # table
    python benchmarks/nvtx_cost.py --reps 15 --json nvtx_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit
from importlib.metadata import version
from typing import Any

os.environ["PIPEPROF_NVTX_FORCE"] = "1"  # before pipeprof decides anything

import nvtx

import pipeprof
from pipeprof.collect import ranges
from pipeprof.collect.timer import Timer
from pipeprof.core import recorder as recmod


def noop(x: Any = None) -> Any:
    return x


# (name, statement, ranges on?, what it is)
CASES: list[tuple[str, str, bool, str]] = [
    ("loop", "pass", False, "the empty timeit loop (subtracted from every other row)"),
    ("noop", "noop(x)", False, "calling the no-op directly"),
    ("timed_off", "timed_call1('transform/T', noop, x)", False, "(a) timed_call1, ranges off"),
    ("timed_on", "timed_call1('transform/T', noop, x)", True, "(a) timed_call1, ranges on"),
    ("stage_off", "with stage('decode'):\n    pass", False, "(b) pipeprof.stage, ranges off"),
    ("stage_on", "with stage('decode'):\n    pass", True, "(b) pipeprof.stage, ranges on"),
    ("region_off", "with timer.region('Forward'):\n    pass", False, "(c) Timer region"),
    ("region_on", "with rtimer.region('Forward'):\n    pass", True, "(c) RangeTimer region"),
    ("pair_ranges", "r.open('load/decode'); r.pop()", True, "(d) Ranges.open + pop"),
    ("pair_inline", "r.push(r.attrs['load/decode']); r.pop()", True,
     "(d) the hot path's inlined open + pop"),
    ("pair_attrs", "push(attrs); pop()", True, "(d) domain.push_range(attrs) + pop_range"),
    ("pair_message", "dom.push_range(message='load/decode'); dom.pop_range()", True,
     "(d) domain.push_range(message=...) + pop_range"),
    ("pair_module", "nvtx.push_range('load/decode', domain='pipeprof'); nvtx.pop_range("
     "domain='pipeprof')", True, "(d) nvtx.push_range / pop_range, no tool: a no-op"),
]  # fmt: skip


def namespace() -> dict[str, Any]:
    r = ranges.current()
    dom = r._domain
    return {
        "noop": noop,
        "x": object(),
        "timed_call1": recmod.timed_call1,  # the one function object; its code is swapped
        "stage": pipeprof.stage,
        "timer": Timer(),
        "rtimer": ranges.RangeTimer(r),
        "r": r,
        "dom": dom,
        "push": dom.push_range,
        "pop": dom.pop_range,
        "attrs": dom.get_event_attributes(message="load/decode"),
        "nvtx": nvtx,
    }


def run_case(stmt: str, on: bool, ns: dict[str, Any], number: int) -> float:
    """ns per iteration of ``stmt``, with the process's recorder on and ranges as asked."""
    rec = recmod.recorder()
    rec.reset("main")
    rec.enabled = True
    if on:
        ranges.install()
    try:
        return timeit.Timer(stmt, globals=ns).timeit(number) * 1e9 / number
    finally:
        if on:
            ranges.uninstall()
        rec.enabled = False
        rec.reset("main")


def measure(reps: int, number: int) -> dict[str, list[float]]:
    ns = namespace()
    ns["timer"].reset()
    for _, stmt, on, _ in CASES:  # warm up (registers the names, specialises the code)
        run_case(stmt, on, ns, number // 10)
    per: dict[str, list[float]] = {name: [] for name, *_ in CASES}
    for r in range(reps):
        for name, stmt, on, _ in CASES:
            per[name].append(run_case(stmt, on, ns, number))
            ns["timer"].reset()
            ns["rtimer"].reset()
        empty = per["loop"][-1]
        for name, *_ in CASES[1:]:
            per[name][-1] -= empty
        print(f"  rep {r + 1}/{reps}", file=sys.stderr, flush=True)
    # what a range adds, paired within each repetition
    for base in ("timed", "stage", "region"):
        per[f"{base}_added"] = [a - b for a, b in zip(per[f"{base}_on"], per[f"{base}_off"])]
    return per


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="repetitions (median reported)")
    ap.add_argument("--number", type=int, default=100_000, help="iterations per case")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    per = measure(args.reps, args.number)
    rows = {name: summary(v) for name, v in per.items()}
    what = {name: text for name, _, _, text in CASES}
    what.update(
        timed_added="= a stage's range: timed_call1 on - off",
        stage_added="= a pipeprof.stage's range: on - off",
        region_added="= a region's range: RangeTimer - Timer",
    )
    print(f"NVTX range cost, ns (median of {args.reps} reps, net of the loop; forced on, "
          f"no tool attached; nvtx {version('nvtx')})")  # fmt: skip
    print(f"{'case':<52}{'median':>9}{'min':>9}{'max':>9}")
    for name in [n for n, *_ in CASES[1:]] + ["timed_added", "stage_added", "region_added"]:
        s = rows[name]
        print(f"  {what[name]:<50}{s['median']:9.1f}{s['min']:9.1f}{s['max']:9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            out = {"reps": args.reps, "number": args.number, "nvtx": version("nvtx"),
                   "python": sys.version.split()[0], "ns": rows, "raw": per}  # fmt: skip
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
