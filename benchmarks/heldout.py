"""The held-out scripts (benchmarks/heldout/): what pipeprof says about each, how stable that is
over identical runs, and what following its worker fix delivers (docs/validation/diagnosis.md).

Each script is a plain training script (no pipeprof in it), run with ``pipeprof run``
``--runs`` times. Reported per script: the verdicts (kind, borderline, limiting stage) and the
findings with a fix. Where ``workers-needed`` names a worker count, the script is run again with
``--workers N`` and its loop's samples/s (start-up included) is compared with the rate the finding
gave for a run like this one (start-up included where it mattered) and with the rate before
(medians). A script that prints its own meters (a ``METERS {json}`` line: samples/s, the share
of its loop spent waiting for data) has them kept beside pipeprof's (``meters``,
``wait_fraction``); ``ddp_files`` runs under torchrun, 2 ranks (rank 0's report, the job's
headline).

    .venv/bin/python benchmarks/heldout.py                 # 3 runs each, ~15 minutes
    .venv/bin/python benchmarks/heldout.py --runs 5 --only resnet_cpu --json heldout.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent / "heldout"
SCRIPTS = {  # script: takes --workers
    "resnet_cpu": True,
    "near_threshold_w0": True,
    "framework_loop": True,
    "keras_images": False,
    "hf_text": True,
    "lightning_images": True,
    "ddp_files": True,
}
TORCHRUN = {"ddp_files"}  # run under torchrun, 2 ranks: rank 0's report, the job's headline


def profile(script: str, out: Path, *args: str) -> dict:
    """``pipeprof run`` on one script: its report, with the script's own meters (its METERS
    line) under ``"meters"`` where it prints them."""
    path = str(HERE / f"{script}.py")
    launch = [sys.executable]
    if script in TORCHRUN:
        launch += ["-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29761"]
    run = [*launch, "-m", "pipeprof", "run", "-q", "-o", str(out), path, *args]
    done = subprocess.run(run, check=True, capture_output=True, text=True)
    if script in TORCHRUN:
        report = json.loads(out.with_suffix(".rank0.json").read_text())
        report["job_headline"] = json.loads(out.with_suffix(".job.json").read_text())["headline"]
    else:
        report = json.loads(out.read_text())
    for line in done.stdout.splitlines():
        if line.startswith("METERS "):
            report["meters"] = json.loads(line[len("METERS "):])
    return report


def rate(report: dict) -> float:
    return float((report["loop"]["throughput"] or {}).get("effective_samples_per_s") or 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--only", default=None, help="one script's name")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for script, has_workers in SCRIPTS.items():
            if args.only and script != args.only:
                continue
            reports = [profile(script, Path(tmp) / f"{script}{i}.json") for i in range(args.runs)]
            verdicts = Counter(
                (r["verdict"]["kind"], bool(r["verdict"].get("borderline")), r["verdict"]["stage"])
                for r in reports
            )
            fixes = Counter((f["id"], f["severity"], f["fix"]) for r in reports
                            for f in r["findings"] if f.get("fix"))  # fmt: skip
            row = {
                "verdicts": [[*k, n] for k, n in verdicts.most_common()],
                "fixes": [[*k, n] for k, n in fixes.most_common()],
                "samples_per_s": statistics.median(rate(r) for r in reports),
                "wait_fraction": statistics.median(
                    r["loop"]["wait_fraction"] or 0.0 for r in reports),
            }
            meters = [r["meters"] for r in reports if "meters" in r]
            if meters:  # the script's own meters, to hold the verdict against (medians)
                row["meters"] = {k: statistics.median(m[k] for m in meters if k in m)
                                 for k in meters[0]}  # fmt: skip
            if script in TORCHRUN:
                row["job_headlines"] = sorted({r["job_headline"] for r in reports})
            needed = [f for r in reports for f in r["findings"] if f["id"] == "workers-needed"
                      and "num_workers=" in (f["fix"] or "")]  # fmt: skip
            if needed and has_workers:
                ev = needed[0]["evidence"]
                k = ev["workers_needed"]
                after = [profile(script, Path(tmp) / f"{script}-w{i}.json", "--workers", str(k))
                         for i in range(args.runs)]  # fmt: skip
                got = statistics.median(rate(r) for r in after)
                same = [f["evidence"] for f in needed if f["evidence"]["workers_needed"] == k]
                # the effective rate is measured (start-up included): compared with the rate the
                # finding gives over a run like this one where it gives one, else the steady rate
                promised = statistics.median(
                    e.get("predicted_run_samples_per_s") or e["predicted_samples_per_s"]
                    for e in same
                )
                steady = statistics.median(e["predicted_samples_per_s"] for e in same)
                row["followed"] = {
                    "workers": k,
                    "severity": needed[0]["severity"],
                    "upper_bound": bool(ev.get("predicted_is_upper_bound")),
                    "promised_samples_per_s": promised,
                    "promised_steady_samples_per_s": steady,
                    "before_samples_per_s": row["samples_per_s"],
                    "after_samples_per_s": got,
                    "delivered_of_promise": round(got / promised, 3) if promised else None,
                    "gain": round(got / row["samples_per_s"], 3) if row["samples_per_s"] else None,
                }
            results[script] = row
            print(script, json.dumps(row, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
