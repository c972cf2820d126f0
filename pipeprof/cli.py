"""The ``pipeprof`` command: a thin client of the public API."""

from __future__ import annotations

import argparse
import errno
import io
import json
import math
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeprof.attach import outputs
from pipeprof.attach.outputs import error
from pipeprof.bench.bench import Bench, bench
from pipeprof.core.recorder import STAGE_EVERY
from pipeprof.core.session import check_writable, naming, write_atomic
from pipeprof.render import FORMATS, format_for
from pipeprof.report import Report
from pipeprof.version import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pipeprof", description="Find the bottleneck in deep-learning input pipelines."
    )
    p.add_argument("--version", action="version", version=f"pipeprof {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo",
        help="profile training on a built-in image pipeline (JPEGs it "
        "generates; nothing to download)",
    )
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    d.add_argument("--images", type=_positive, default=256, help="JPEG files to generate (256)")
    d.add_argument("--workers", type=_count, default=2, help="DataLoader workers (2)")
    d.add_argument("--batches", type=_positive, default=None, help="batches to profile (one epoch)")
    d.add_argument("--html", default="pipeprof-demo.html", help="HTML report to write")
    d.add_argument("-o", "--output", default=None, help="also save the report as JSON here")
    r = sub.add_parser("report", help="re-render a saved report, job report, comparison or bench")
    r.add_argument("file", help="a JSON file pipeprof wrote (report.save(), -o, merge, compare)")
    r.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="output format (default: from -o's extension, else text)",
    )
    r.add_argument("-o", "--output", default=None, help="write here instead of standard output")
    c = sub.add_parser("compare", help="before/after: what a change bought, per stage and loop")
    c.add_argument("before", help="the report before the change (JSON from report.save or -o)")
    c.add_argument("after", help="the report after the change")
    c.add_argument(
        "--format",
        choices=("text", "json", "html"),
        default=None,
        help="output format (default: from -o's extension, else text)",
    )
    c.add_argument("-o", "--output", default=None, help="write here instead of standard output")
    c.add_argument("--fail-if", action="append", default=[], metavar="CONDITION",
                   help="a regression gate: exit 1 when METRIC OP VALUE holds, e.g. "
                   "'throughput < -5%%' (a change from BEFORE), 'wait_fraction > 0.3' (AFTER's "
                   "own figure); repeatable (docs/gate.md)")  # fmt: skip
    c.add_argument("--strict", action="store_true",
                   help="with --fail-if: a change within the runs' noise fails too")  # fmt: skip
    k = sub.add_parser("check", help="a regression gate on one report against fixed budgets: "
                       "pipeprof check run.json --max wait_fraction=0.1")  # fmt: skip
    k.add_argument("report", help="the report (JSON from report.save or -o)")
    k.add_argument("--max", action="append", default=[], metavar="METRIC=VALUE",
                   help="exit 1 when METRIC is above VALUE; repeatable")  # fmt: skip
    k.add_argument("--min", action="append", default=[], metavar="METRIC=VALUE",
                   help="exit 1 when METRIC is below VALUE; repeatable")  # fmt: skip
    k.add_argument("--fail-if", action="append", default=[], metavar="CONDITION",
                   help="exit 1 when METRIC OP VALUE holds (VALUE unsigned); "
                   "repeatable")  # fmt: skip
    k.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    m = sub.add_parser("merge", help="one job report from the per-rank reports of a "
                       "distributed run: pipeprof merge run.rank*.json -o job.json")  # fmt: skip
    m.add_argument("files", nargs="+", help="the reports each rank wrote (run.rank0.json ...)")
    m.add_argument("--format", choices=("text", "json", "html", "chrome"), default=None,
                   help="output format (default: from -o's extension, else text); chrome: one "
                   "Perfetto trace of every rank")  # fmt: skip
    m.add_argument("-o", "--output", default=None, help="write here instead of standard output")
    _bench_parser(sub)
    sub.add_parser(
        "run",
        help="profile an unmodified training script: pipeprof run train.py [its arguments]",
        add_help=False,
    )
    sub.add_parser(
        "tune",
        help="try the loader's settings for real and propose the best as an edit: pipeprof "
        "tune train.py [its arguments]",
        add_help=False,
    )
    return p


def _tune_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pipeprof tune",
        usage="pipeprof tune [options] (script.py | -m module) [script arguments]",
        description="Profile a training script, then rerun it with the DataLoader settings the "
        "profile points at (num_workers, prefetch_factor, persistent_workers, pin_memory, the "
        "sharing strategy, threads), each applied without editing it and measured in "
        "interleaved rounds; print what each measured and the edit of the DataLoader(...) call "
        "that makes the best one (docs/tune.md).",
    )
    p.add_argument("--batches", type=_positive, default=60,
                   help="batches of the loop each run measures (60; the first 5 are its warm-up "
                   "and not counted); the script is ended after them")  # fmt: skip
    p.add_argument("--budget", type=_duration, default=600.0, metavar="TIME",
                   help="the whole tune's time: 10m, 90s, 600 (10m); what ran by then "
                   "decides")  # fmt: skip
    p.add_argument("--rounds", type=_positive, default=3,
                   help="runs of each setting, interleaved with the others (3)")  # fmt: skip
    p.add_argument("--try", dest="tries", action="append", default=[], type=_try,
                   metavar="KNOB=VALUE[,KNOB=VALUE]", help="also try this setting, e.g. "
                   "num_workers=6,prefetch_factor=8; repeatable")  # fmt: skip
    p.add_argument("--apply", action="store_true",
                   help="write the proposed edit into the script")  # fmt: skip
    p.add_argument("--knobs", type=_knobs, default=None, metavar="KNOB[,KNOB]",
                   help="change only these: num_workers, prefetch_factor, persistent_workers, "
                   "pin_memory, sharing_strategy, torch_threads (all)")  # fmt: skip
    p.add_argument("--no-ladder", action="store_true",
                   help="no ceiling ladder (its three runs at the chosen setting: compute "
                   "alone, no hand-over, a cold page cache)")  # fmt: skip
    p.add_argument("-o", "--out", default=None,
                   help="also write the tune's result here, as JSON")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def _duration(text: str) -> float:
    """Seconds, minutes or hours: ``600``, ``90s``, ``10m``, ``1h``."""
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(text[-1:].lower())
    x = _seconds(text[:-1] if scale else text) * (scale or 1.0)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"expected a time above 0 (e.g. 10m), got {text!r}")
    return x


_TRY_KINDS = {"num_workers": int, "prefetch_factor": int, "persistent_workers": bool,
              "pin_memory": bool, "sharing_strategy": str, "torch_threads": int,
              "worker_threads": int}  # fmt: skip


def _knobs(text: str) -> set[str]:
    """``num_workers,prefetch_factor``: the knobs --knobs lets pipeprof tune change."""
    names = {k.strip() for k in text.split(",") if k.strip()}
    wrong = names - set(_TRY_KINDS) or (set() if names else {text})
    if wrong:
        raise argparse.ArgumentTypeError(
            f"unknown knob {sorted(wrong)[0]!r}: expected one or more of "
            f"{', '.join(k for k in _TRY_KINDS if k != 'worker_threads')}, comma-separated")
    return names


def _try(text: str) -> dict[str, Any]:
    """``num_workers=6,pin_memory=true``: one setting for --try."""
    out: dict[str, Any] = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        kind = _TRY_KINDS.get(name.strip())
        if not eq or kind is None:
            raise argparse.ArgumentTypeError(
                f"expected KNOB=VALUE with KNOB one of {', '.join(_TRY_KINDS)}, got {part!r}")
        value = value.strip()
        if kind is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise argparse.ArgumentTypeError(f"{name}: expected true or false, got {value!r}")
            out[name.strip()] = value.lower() in ("true", "1")
        elif kind is int:
            out[name.strip()] = _count(value)
        elif value not in ("file_system", "file_descriptor"):
            raise argparse.ArgumentTypeError(
                f"{name}: expected file_system or file_descriptor, got {value!r}")
        else:
            out[name.strip()] = value
    return out


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pipeprof run",
        usage="pipeprof run [options] (script.py | -m module) [script arguments]",
        description="Run a training script unmodified and profile every torch DataLoader it "
        "iterates: stages inside the workers, wait / compute per step, Forward / Backward / "
        "Optimizer. The script's output is untouched; pipeprof's summary goes to stderr.",
    )
    p.add_argument("-o", "--out", default="pipeprof-run.json",
                   help="the report of the main loop, JSON (pipeprof-run.json); other loaders "
                   "go next to it, as OUT-STEM.LABEL.json")  # fmt: skip
    p.add_argument("--html", default=None, help="also write the main loop's HTML report here")
    p.add_argument("--trace", default=None, help="also write a Chrome/Perfetto trace here")
    p.add_argument("--batches", type=_positive, default=None,
                   help="stop profiling after this many batches (all loaders together); the "
                   "script runs on unprofiled")  # fmt: skip
    p.add_argument("--end-script", action="store_true",
                   help="with --batches: end the script (exit status 0) once they are "
                   "profiled, instead of letting it run on unprofiled")  # fmt: skip
    p.add_argument("--sample-hz", type=float, default=10.0,
                   help="GPU and host sampling rate (10; 0 turns sampling off)")  # fmt: skip
    p.add_argument("--stage-every", type=_positive, default=STAGE_EVERY,
                   help=f"time the loaders' stages in one batch in this many ({STAGE_EVERY}; "
                   "1: every batch)")  # fmt: skip
    p.add_argument("--snapshot-s", type=_seconds, default=30.0, metavar="SECONDS",
                   help="save the main loop's report so far to OUT every this many seconds "
                   "(30; the first 5 s after the first batch), so a killed run leaves its last "
                   "snapshot; the report at the end replaces it; 0 turns it off")  # fmt: skip
    p.add_argument("--live", action="store_true",
                   help="a panel in the terminal, refreshed once a second while the script "
                   "trains (stdout and stderr a terminal; docs/live.md)")  # fmt: skip
    p.add_argument("--metrics-port", default=None, metavar="[HOST:]PORT",
                   help="serve the live figures for Prometheus on http://127.0.0.1:PORT/metrics "
                   "(a distributed rank: PORT + its local rank); pip install "
                   "'pipeprof[prometheus]' (docs/live.md)")  # fmt: skip
    p.add_argument("--hang-s", type=_seconds, default=60.0, metavar="SECONDS",
                   help="a wait for one batch this long (and 10x the longest gap before it) is "
                   "recorded as a hang: each worker's stage and stack in the report, a line on "
                   "stderr, a snapshot to OUT; the run goes on (60; 0 turns it off)")  # fmt: skip
    p.add_argument("--no-regions", action="store_true",
                   help="no Forward/Backward/Optimizer regions (no torch hooks)")  # fmt: skip
    p.add_argument("--nvtx", action="store_true",
                   help="also emit stages (in the workers too), wait / transfer / compute and "
                   "the regions as NVTX ranges for Nsight Systems (pip install "
                   "'pipeprof[nvtx]'; run under nsys profile)")  # fmt: skip
    p.add_argument("--log-to", action="append", default=[], type=_log_target,
                   metavar="TOOL[:WHERE]", help="also log the main loop's report to "
                   "tensorboard[:LOG_DIR], mlflow[:TRACKING_URI] or wandb[:PROJECT]; repeatable "
                   "(docs/integrations.md)")  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    p.add_argument("--all-ranks", action="store_true",
                   help="in a distributed job, every rank prints its summary (default: rank 0 "
                   "only; every rank writes its files)")  # fmt: skip
    return p


# options that take a value: the script starts after it
_RUN_VALUED = {
    "-o", "--out", "--html", "--trace", "--batches", "--sample-hz", "--stage-every", "--log-to",
    "--snapshot-s", "--hang-s", "--metrics-port",
}  # fmt: skip
_LOG_OPTION = {"tensorboard": "log_dir", "mlflow": "tracking_uri", "wandb": "project"}


def _log_target(text: str) -> tuple[str, dict[str, str]]:
    """``tool[:where]`` of --log-to, refused now if the tool is unknown or not installed."""
    from pipeprof.integrations.export import MissingExtra, check

    tool, _, where = text.partition(":")
    if tool not in _LOG_OPTION:
        raise argparse.ArgumentTypeError(
            f"expected tensorboard[:LOG_DIR], mlflow[:TRACKING_URI] or wandb[:PROJECT], got "
            f"{text!r}"
        )
    try:
        check(tool)
    except MissingExtra as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return tool, {_LOG_OPTION[tool]: where} if where else {}


def _split_run(argv: list[str], valued: set[str] | None = None,
               ) -> tuple[list[str], str | None, bool, list[str]]:
    """``pipeprof run``'s own options, the script or module, and the script's arguments (all
    after the script is the script's, as with ``python``)."""
    i, dashes = 0, 0
    while i < len(argv):
        a = argv[i]
        if a == "--":  # what follows is the script, even where it starts with "-"
            i, dashes = i + 1, 1
            break
        if a == "-m":
            if i + 1 >= len(argv):
                break
            rest = argv[i + 2 :]
            return argv[:i], argv[i + 1], True, rest[1:] if rest[:1] == ["--"] else rest
        if not a.startswith("-") or a == "-":
            break
        i += 2 if a in (_RUN_VALUED if valued is None else valued) else 1
    if i >= len(argv):
        return argv[: i - dashes], None, False, []
    rest = argv[i + 1 :]
    return argv[: i - dashes], argv[i], False, rest[1:] if rest[:1] == ["--"] else rest


def _bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("bench", help="benchmark each step of a pipeline on its own, and workers")
    b.add_argument("target", help="module:factory or file.py:factory returning a dataset, a "
                   "DataLoader or (samples, transforms)")  # fmt: skip
    b.add_argument("--workers", type=_counts, default=None, help="worker counts to run, e.g. 1,2,4")
    b.add_argument("--samples", type=_positive, default=64, help="fixed samples to time (64)")
    b.add_argument("--repeat", type=_positive, default=3, help="timed passes per step (3)")
    b.add_argument(
        "--batch-size", type=_positive, default=None, help="batch size (loader's, or 16)"
    )
    b.add_argument("--seed", type=int, default=0, help="seed for the sample set and transforms")
    b.add_argument("--predict", type=_counts, default=[], help="worker counts to predict, e.g. 6,8")
    b.add_argument("--compute-rate", type=_rate, default=None,
                   help="samples/s the training step takes: the workers that feed it")  # fmt: skip
    b.add_argument("--encodings", action="store_true",
                   help="write the samples in other storage encodings (JPEG qualities, presized "
                   "JPEG, PNG, WebP, npy, HDF5) and predict the throughput with each, at the "
                   "first --predict worker count (default: the loader's)")  # fmt: skip
    b.add_argument("--seconds", type=_seconds, default=None,
                   help="seconds of each real DataLoader run: the --workers runs (1), the "
                   "current encoding's run that --encodings anchors its rates to "
                   "(2; 0: no run)")  # fmt: skip
    b.add_argument("--format", choices=("text", "json", "html"), default=None,
                   help="output format (default: from -o's extension, else text)")  # fmt: skip
    b.add_argument("-o", "--output", default=None, help="write here instead of standard output")


def _whole(text: str, low: int) -> int:
    """A whole number of at least ``low``, for argparse (whose error names the flag)."""
    try:
        n = int(text)
    except ValueError:
        n = low - 1
    if n < low:
        raise argparse.ArgumentTypeError(f"expected a whole number of {low} or more, got {text!r}")
    return n


def _count(text: str) -> int:
    return _whole(text, 0)


def _positive(text: str) -> int:
    return _whole(text, 1)


def _counts(text: str) -> list[int]:
    """``1,2,4``: worker counts."""
    try:
        return [_count(v) for v in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected worker counts of 0 or more, separated by commas (e.g. 1,2,4), got {text!r}"
        ) from None


def _seconds(text: str) -> float:
    """Seconds: a finite number, 0 or more."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (x >= 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"expected seconds, 0 or more (e.g. 2), got {text!r}")
    return x


def _rate(text: str) -> float:
    """Samples/s: a finite number above 0."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (x > 0 and math.isfinite(x)):
        raise argparse.ArgumentTypeError(f"expected samples/s above 0 (e.g. 400), got {text!r}")
    return x


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeprof.demo import demo_loader, make_images, train

    console = Console()
    for path in (args.html, args.output):  # before the training, not after it
        if path:
            _check_writable(path)
    device = _device(args.device)
    with tempfile.TemporaryDirectory(prefix="pipeprof-demo-") as tmp:
        console.print(f"[dim]writing {args.images} JPEG images to {tmp} ...[/dim]")
        make_images(tmp, count=args.images)
        loader = demo_loader(tmp, workers=args.workers)
        console.print(
            f"[dim]training a small CNN on {device}, {args.workers} DataLoader "
            "workers, under pipeprof.Profiler ...[/dim]"
        )
        report = train(loader, device, batches=args.batches)
    console.print(report)
    with naming(args.html):
        path = report.write_html(args.html)
    console.print(f"HTML report: {path.resolve()}")
    if args.output:
        with naming(args.output):
            console.print(f"saved: {report.save(args.output)}")
    if report.session.interrupted:
        console.print("[yellow]interrupted: the report covers the batches before Ctrl-C[/yellow]")
        return INTERRUPTED
    return 0


def _device(name: str | None) -> str:
    """``--device``, checked before anything runs; by default cuda where available, else cpu."""
    import torch

    from pipeprof.collect.torch.loader import check_device

    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        check_device(name)
    except ValueError:
        why = "CUDA is not available here" if name.startswith("cuda") else "no such torch device"
        raise ValueError(f"--device {name}: {why}; use --device cpu, or leave it out") from None
    return name


_SUFFIXES = {"text": ".txt", "json": ".json", "html": ".html", "chrome": ".trace.json"}


def _format(args: argparse.Namespace, formats: tuple[str, ...] = FORMATS) -> str:
    """--format, else the output file's extension, else text; one of ``formats``."""
    fmt = args.format or (format_for(args.output) if args.output else "text")
    if fmt in formats:
        return str(fmt)
    if Path(args.output).is_dir():  # the folder is the mistake, not its name
        raise IsADirectoryError(errno.EISDIR, "Is a directory", args.output)
    what = f"names the {fmt} format" if fmt else "has an extension that names no format"
    raise ValueError(
        f"-o {args.output} {what}; `pipeprof {args.command}` writes {', '.join(formats)}: end "
        f"the file name in {', '.join(_SUFFIXES[f] for f in formats)}, or choose with "
        f"--format {'|'.join(formats)}"
    )


def _check_writable(output: str) -> None:
    """Fail now, naming ``output``, if it cannot be written."""
    with naming(output):
        check_writable(output)


def _write(text: str, output: str | None) -> int:
    """``text`` to the file ``output``, or to standard output."""
    if output:
        with naming(output):
            write_atomic(output, text)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pipeprof.report import Job, read

    report = read(args.file)  # a saved report, a job report, a comparison, a benchmark
    fmt = _format(args)
    if fmt == "chrome" and isinstance(report, Job):
        raise ValueError(
            f"{args.file} is a job report, which keeps no rank's timeline: make the job's trace "
            "from the ranks' files, `pipeprof merge run.rank*.json -o job.trace.json`"
        )
    if not isinstance(report, Report):
        fmt = _format(args, ("text", "json", "html"))
    try:  # a file's free-form parts (GPU and CPU samples) are read only here
        if fmt == "text" and not args.output:
            Console().print(report)
            return 0
        text = report.render(fmt)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
        raise ValueError(
            f"{args.file} could not be rendered as {fmt} ({type(exc).__name__}: {exc}): was the "
            "file edited? Save the report again with report.save(path) (if it was not edited, "
            "this is a pipeprof bug: please report it)"
        ) from exc
    return _write(text, args.output)


def cmd_compare(args: argparse.Namespace) -> int:
    from pipeprof.analyze import gate
    from pipeprof.report import compare

    fmt = _format(args, ("text", "json", "html"))
    if args.fail_if:  # NOTE [ The gate ] in analyze/gate.py: read them before the files
        conditions = [gate.parse(c) for c in args.fail_if]
    comparison = compare(args.before, args.after)
    if args.fail_if:
        return _gate(comparison.to_dict(), conditions, args.strict, fmt, args.output)
    if fmt == "text" and not args.output:
        Console().print(comparison)
        return 0
    return _write(comparison.render(fmt), args.output)


def cmd_check(args: argparse.Namespace) -> int:
    """One report against fixed budgets (NOTE [ The gate ] in analyze/gate.py)."""
    from pipeprof.analyze import gate
    from pipeprof.report import compare

    conditions = [gate.budget(t, "max") for t in args.max]
    conditions += [gate.budget(t, "min") for t in args.min]
    for text in args.fail_if:
        cond = gate.parse(text)
        if cond["change"]:
            raise gate.GateError(f"{text!r}: check reads one report, so no change (+/-): "
                                 "compare two with pipeprof compare --fail-if")  # fmt: skip
        conditions.append(cond)
    if not conditions:
        raise gate.GateError("nothing to check: give --max METRIC=VALUE, --min METRIC=VALUE or "
                             "--fail-if CONDITION (docs/gate.md)")  # fmt: skip
    comparison = compare(args.report, args.report)  # each figure's "after" is the report's
    return _gate(comparison.to_dict(), conditions, False, args.format, None, one=True)


def _gate(comparison: dict[str, Any], conditions: list[dict[str, Any]], strict: bool,
          fmt: str, output: str | None, one: bool = False) -> int:  # fmt: skip
    """The gate's table or JSON, and its exit code: 0 passed, 1 failed (docs/gate.md)."""
    from pipeprof.analyze import gate
    from pipeprof.render import gate as shown

    result = gate.evaluate(comparison, conditions, strict, one)
    if fmt == "json":
        _write(shown.as_json(result), output)
    elif output:
        console = Console(record=True, width=100, file=io.StringIO())
        console.print(shown.table(result))
        _write(console.export_text(), output)
    else:
        Console().print(shown.table(result))
    return 0 if result["passed"] else 1


def cmd_merge(args: argparse.Namespace) -> int:
    from pipeprof.report import merge

    fmt = _format(args, ("text", "json", "html", "chrome"))
    if args.output:
        _check_writable(args.output)
    job = merge(args.files)
    if fmt == "text" and not args.output:
        Console().print(job)
        return 0
    return _write(job.render(fmt), args.output)


def cmd_bench(args: argparse.Namespace) -> int:
    from pipeprof.bench.sources import resolve
    from pipeprof.render.bench import with_lines

    fmt = _format(args, ("text", "json", "html"))
    if args.output:  # before the benchmark, not after it
        _check_writable(args.output)
    source, transforms = resolve(args.target)
    if args.encodings:
        return _bench_encodings(args, fmt, source, transforms)
    try:
        b = bench(
            source, transforms, workers=args.workers, samples=args.samples,
            repeat=args.repeat, batch_size=args.batch_size, seed=args.seed,
            seconds=1.0 if args.seconds is None else args.seconds,
        )  # fmt: skip
        asked = []
        if not isinstance(b, Bench) or b.delivered:  # else a note says: no predictions
            asked = [b.predict(workers=k, compute_rate=args.compute_rate) for k in args.predict]
            if args.compute_rate is not None and not asked:
                asked = [b.predict(compute_rate=args.compute_rate)]
    except (TypeError, NotImplementedError) as exc:  # what the target gave is not benchmarkable
        raise ValueError(str(exc)) from exc
    if fmt == "text" and not args.output:
        Console().print(b, *(f"predicted: {p}" for p in asked))
        return 0
    if fmt == "json":
        text = json.dumps({**b.to_dict(), "asked": [p.to_dict() for p in asked]}, indent=2)
    elif fmt == "html":
        text = with_lines(b.render(fmt), "predictions asked for", [str(p) for p in asked])
    else:
        text = b.render(fmt) + "".join(f"predicted: {p}\n" for p in asked)
    return _write(text, args.output)


def _bench_encodings(args: argparse.Namespace, fmt: str, source: Any, transforms: Any) -> int:
    """``pipeprof bench TARGET --encodings``."""
    from pipeprof.bench.encodings import bench_encodings

    if transforms is not None:
        raise ValueError("--encodings needs a dataset or a DataLoader (the samples as stored), "
                         "not (samples, transforms)")  # fmt: skip
    if args.workers or args.compute_rate is not None or len(args.predict) > 1:
        raise ValueError("with --encodings, give the worker count to predict for as --predict K "
                         "(one count); --workers and --compute-rate do not apply")  # fmt: skip
    try:
        e = bench_encodings(
            source, samples=args.samples, seed=args.seed, repeat=args.repeat,
            batch_size=args.batch_size, workers=args.predict[0] if args.predict else None,
            seconds=2.0 if args.seconds is None else args.seconds,
        )  # fmt: skip
    except (TypeError, NotImplementedError) as exc:  # what the target gave is not benchmarkable
        raise ValueError(str(exc)) from exc
    if fmt == "text" and not args.output:
        Console().print(e)
        return 0
    return _write(e.render(fmt), args.output)


INTERRUPTED = 130  # the exit status of a program stopped by Ctrl-C (128 + SIGINT)


def cmd_run(argv: list[str]) -> int:
    from pipeprof.attach import run as runner

    opts_argv, target, module, script_args = _split_run(argv)
    parser = _run_parser()
    opts = parser.parse_args(opts_argv)
    if target is None:
        parser.error("give the training script to run (pipeprof run train.py) or -m module")
    if not opts.sample_hz >= 0:
        parser.error("--sample-hz must be 0 or more")
    if opts.end_script and opts.batches is None:
        parser.error("--end-script ends the script once --batches N are profiled: give --batches")
    runner.check_target(target, module)
    if opts.nvtx:  # before the script runs, not at its first batch
        try:
            import nvtx  # noqa: F401
        except ImportError:
            from pipeprof.collect.ranges import MISSING

            parser.error(MISSING.replace("nvtx=True", "--nvtx"))
    from pipeprof.collect.ranks import from_env, rank_path

    opts.rank = from_env()  # torchrun, srun, mpirun: a file per rank (NOTE [ Ranks ])
    opts.job_out = outputs.job_path(opts.out) if opts.rank.distributed else None
    opts.job_html = outputs.job_path(opts.html) if opts.rank.distributed and opts.html else None
    opts.cwd = os.getcwd()  # where the user is, whatever folder the script moves to
    opts.pid = os.getpid()  # the process that writes the reports (not a child it forks)
    for name in ("out", "html", "trace", "job_out", "job_html"):
        path = getattr(opts, name)
        if path:  # absolute: a script that changes folder writes them where they were asked
            path = rank_path(path, opts.rank) if name in ("out", "html", "trace") else path
            setattr(opts, name, os.path.abspath(path))
    if opts.metrics_port is not None:  # a bad address is refused before the script runs
        from pipeprof.attach.metrics import parse_address

        parse_address(opts.metrics_port)
    for path in (opts.out, opts.html, opts.trace):  # before the script runs, not after it
        if path:
            _check_writable(path)
    run = runner.Run(
        batches=opts.batches, sample_hz=opts.sample_hz, regions=not opts.no_regions,
        nvtx=opts.nvtx, stage_every=opts.stage_every, snapshot=opts.out,
        snapshot_s=opts.snapshot_s, hang_s=opts.hang_s, live=opts.live,
        metrics_port=opts.metrics_port, end_script=opts.end_script,
    )  # fmt: skip
    run.on_stop = lambda: outputs.run_outputs(run, opts, interrupted=False, gather=False)
    run.on_job = lambda: outputs.job_outputs(run, opts)

    def ending(ended: BaseException | None) -> None:
        clean = ended is None or (isinstance(ended, SystemExit) and ended.code in (None, 0))
        try:
            if clean:
                run.end_of_job(None)  # NOTE [ Job gather ] in attach/run.py: a job up gathers
            if not run.written:
                interrupted = isinstance(ended, (KeyboardInterrupt, runner.Terminated))
                if not clean and not interrupted and ended is not None:
                    run.notes.append(f"the script ended with {type(ended).__name__}: {ended}; "
                                     "the report covers what ran until then")  # fmt: skip
                outputs.run_outputs(run, opts, interrupted, gather=False)
        except Exception as exc:  # the script's own ending comes first
            error(f"the report could not be written ({type(exc).__name__}: {exc})")

    ended = runner.execute(run, target, module, script_args, then=ending)
    return runner.end_like(ended)


_TUNE_VALUED = {"--batches", "--budget", "--rounds", "--try", "--knobs", "-o", "--out"}


def cmd_tune(argv: list[str]) -> int:
    """``pipeprof tune`` (pipeprof/tune.py): the table on stdout, progress on stderr."""
    from pipeprof import tune
    from pipeprof.attach import run as runner
    from pipeprof.render import tune as shown

    opts_argv, target, module, script_args = _split_run(argv, _TUNE_VALUED)
    parser = _tune_parser()
    opts = parser.parse_args(opts_argv)
    if target is None:
        parser.error("give the training script to tune (pipeprof tune train.py) or -m module")
    runner.check_target(target, module)
    if opts.out:
        _check_writable(opts.out)
    if opts.apply and module:
        parser.error("--apply edits a script file: give the script's path, not -m")
    console = Console(stderr=True)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # as Ctrl-C: the trial under way ends too
        signal.signal(signum, signal.default_int_handler)
    with _progress(console, opts.quiet) as show:
        tuner = tune.Tuner(target, script_args, module=module, batches=opts.batches,
                           rounds=opts.rounds, budget_s=opts.budget, tries=opts.tries,
                           progress=show, ladder=not opts.no_ladder,
                           knobs=opts.knobs)  # fmt: skip
        try:
            result = tuner.tune()
        except tune.TuneError as exc:
            error(str(exc))
            return 2
        finally:
            tuner.close()
    out = Console()
    if not out.is_terminal:  # a log or a pipe: wide enough for the table's rows
        out = Console(width=120)
    out.print(shown.table(result))
    if opts.out:
        _write(shown.as_json(result), opts.out)
    if result["interrupted"]:
        return INTERRUPTED  # what ran is shown; nothing is applied
    if opts.apply and result["changed"]:
        if not result.get("new_source"):
            error(f"nothing applied: {result.get('edit_error')}; set {result['chosen_setting']} "
                  "where the loader is made")  # fmt: skip
            return 1
        path = tune.apply(result, target)
        error(f"applied: {path} now makes the loader with {result['chosen_setting']}")
    return 0


def _progress(console: Console, quiet: bool) -> Any:
    """A rich progress bar on stderr; its ``show(what, done, total)``."""
    import contextlib

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if quiet:
        return contextlib.nullcontext(lambda what, done, total: None)

    @contextlib.contextmanager
    def shown() -> Any:
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=console, transient=True)  # fmt: skip
        task = bar.add_task("pipeprof tune", total=None)
        with bar:
            def show(what: str, done: int, total: int) -> None:
                bar.update(task, description=f"pipeprof tune: {what}", completed=done,
                           total=total or None)  # fmt: skip
                if not console.is_terminal:
                    console.print(f"pipeprof tune: {what}", highlight=False)

            yield show

    return shown()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tune"]:
        try:
            return cmd_tune(argv[1:])
        except (OSError, ValueError) as exc:
            error(_os_message(exc) if isinstance(exc, OSError) else str(exc))
            return 2
        except KeyboardInterrupt:
            error("interrupted")
            return INTERRUPTED
    if argv[:1] == ["run"]:
        try:
            return cmd_run(argv[1:])
        except OSError as exc:
            error(_os_message(exc))
            return 2
        except ValueError as exc:
            error(str(exc))
            return 2
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return cmd_demo(args)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "merge":
            return cmd_merge(args)
        if args.command == "check":
            return cmd_check(args)
        return cmd_report(args)
    except KeyboardInterrupt:
        error("interrupted")
        return INTERRUPTED
    except OSError as exc:  # FileNotFoundError too: a path that cannot be read or written
        error(_os_message(exc))
        return 2
    except (ValueError, ImportError) as exc:
        error(str(exc))
        return 2


def _os_message(exc: OSError) -> str:
    """What went wrong with which path, and what to do about it."""
    if exc.filename is None:  # raised with a message of our own (e.g. "no such pipeprof file")
        return str(exc)
    where = exc.filename
    if isinstance(exc, IsADirectoryError):
        return f"{where} is a folder: give the path of a file"
    if isinstance(exc, PermissionError):
        return f"{where}: permission denied; choose a path you may read or write"
    if isinstance(exc, FileNotFoundError):
        return f"{where}: no such file or folder; check the path"
    return f"{where}: {exc.strerror or exc}"
