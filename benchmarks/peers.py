"""pipeprof side by side with its peers: what each costs the same loop (issue 38;
docs/validation/cost.md, "Beside other tools: the peers benchmark").

Each round runs every tool on a workload of benchmarks/peer_loops.py, each in a process of its
own, the order turned each round: ``plain``; ``run`` (``pipeprof run`` on the plain script);
``hand`` (``pipeprof.Profiler`` by hand); ``traceml`` (TraceML's ``init()`` + ``trace_step``,
under ``traceml run``, which it needs for its aggregator; skipped where ``traceml_ai`` is not
installed: ``pip install traceml-ai``); ``torchprof`` (torch.profiler over the whole loop);
``collected`` (plain, with ``gc.collect()`` before the loop: a loop with workers runs at a speed
that depends on the collector's state when they fork, which any tool's set-up moves); ``frozen``
(the same, then ``gc.freeze()``).
Per tool: the loop's seconds by the script's own meter against plain's of the same round, the
median over rounds (and their range), and the whole command's wall time, start-up included.

    .venv/bin/python benchmarks/peers.py --work tiny --rounds 5       # ~4 minutes
    .venv/bin/python benchmarks/peers.py --rounds 5 --json peers.json  # tiny, jpeg, hf: ~25 min
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import compiled, machine

HERE = Path(__file__).resolve().parent
TOOLS = ("plain", "run", "hand", "traceml", "torchprof", "collected", "frozen")
WORKS = ("tiny", "jpeg", "hf")


def command(tool: str, work: str, tmp: str) -> list[str]:
    loop = [str(HERE / "peer_loops.py"), "--work", work, "--root", str(Path(tmp) / "data")]
    if tool == "run":
        return [sys.executable, "-m", "pipeprof", "run", "-o", str(Path(tmp) / "run.json"), *loop]
    if tool == "traceml":
        launcher = str(Path(sys.executable).parent / "traceml")
        logs = str(Path(tmp) / f"traceml-{time.monotonic_ns()}")
        return [launcher, "run", "--no-save-training-output", "--logs-dir", logs, loop[0],
                "--args", *loop[1:], "--tool", "traceml"]  # fmt: skip
    return [sys.executable, *loop, "--tool", tool]


def once(tool: str, work: str, tmp: str) -> dict[str, float]:
    """One run: the loop's seconds (for ``hf``, seconds per sample) and the command's wall."""
    t0 = time.perf_counter()
    done = subprocess.run(command(tool, work, tmp), capture_output=True, text=True, cwd=tmp)
    wall = time.perf_counter() - t0
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("METERS ")), None)
    if done.returncode or line is None:
        raise RuntimeError(f"{tool} on {work} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    meters = json.loads(line[7:])
    loop = meters["loop_s"] if "loop_s" in meters else 1.0 / meters["samples_per_s"]
    return {"loop_s": loop, "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", choices=WORKS, action="append", help="default: all three")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--tools", default=",".join(TOOLS), help="plain and which of the others")
    args = p.parse_args()
    compiled()
    asked = ["plain", *(t for t in args.tools.split(",") if t in TOOLS and t != "plain")]
    tools = [t for t in asked if t != "traceml" or importlib.util.find_spec("traceml_ai")]
    if "traceml" in asked and "traceml" not in tools:
        print("traceml_ai is not installed: TraceML is left out (pip install traceml-ai)")
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for work in args.work or WORKS:
            once("plain", work, tmp)  # warm-up: the images made, the files in the page cache
            got: dict[str, list[dict[str, float]]] = {t: [] for t in tools}
            for r in range(args.rounds):
                turn = r % len(tools)
                for tool in tools[turn:] + tools[:turn]:
                    got[tool].append(once(tool, work, tmp))
            results[work] = got
            show(work, got)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "runs": results}, indent=1))


def show(work: str, got: dict[str, list[dict[str, float]]]) -> None:
    plain = got["plain"]
    print(f"\n{work}: {len(plain)} rounds; the loop against plain's of the same round")
    print(f"{'tool':10s} {'loop, median':>13s} {'range':>17s} {'wall s':>8s}")
    for tool, runs in got.items():
        ratio = [r["loop_s"] / p["loop_s"] for r, p in zip(runs, plain)]
        wall = statistics.median(r["wall_s"] for r in runs)
        print(f"{tool:10s} {statistics.median(ratio) - 1:+13.1%} "
              f"{min(ratio) - 1:+8.1%}..{max(ratio) - 1:+.1%} {wall:8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
