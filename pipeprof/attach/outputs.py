"""``pipeprof run``'s outputs: each rank's report files and summary, and the job report
gathered to rank 0 (NOTE [ Job gather ] in attach/run.py); ``cli.py`` parses the command line
and calls these."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from pipeprof.core.session import naming, write_atomic
from pipeprof.report import Report


def shown_path(path: str, cwd: str) -> str:
    """An output's path as the user would type it where they ran pipeprof: relative to that
    folder when the file lies under it, else absolute."""
    rel = os.path.relpath(path, cwd)
    return path if rel.startswith("..") else rel


def job_path(path: str) -> str:
    """Where rank 0 writes the job report: ``run.json`` -> ``run.job.json``."""
    p = Path(path)
    suffix = "".join(p.suffixes[-1:])
    stem = p.name[: len(p.name) - len(suffix)] if suffix else p.name
    return str(p.with_name(f"{stem}.job{suffix}"))


def job_outputs(run: Any, opts: argparse.Namespace) -> None:
    """This rank's files, then the job report gathered to rank 0 over the job's process group
    (NOTE [ Job gather ] in attach/run.py), written by rank 0 next to its own."""
    if os.getpid() != opts.pid:  # a forked child's copy of the run: not this rank's
        return
    if not run.written:
        run_outputs(run, opts, interrupted=False, gather=True)
    rank = opts.rank
    dist = sys.modules.get("torch.distributed")
    if not rank.distributed or dist is None or not dist.is_initialized():
        return
    from pipeprof.analyze.job import job_dict
    from pipeprof.report import Job

    t0 = time.perf_counter()
    mine = getattr(run, "job_entry", None)
    got: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, got, dst=0)
    if got is None:
        return
    gather_s = time.perf_counter() - t0
    err = Console(stderr=True, soft_wrap=True)
    entries = [e for e in got if e is not None]
    if not entries:
        return
    data = job_dict(entries)
    data["gather_s"] = round(gather_s, 6)
    job = Job(data)
    with naming(opts.job_out):
        write_atomic(opts.job_out, job.render("json"))
    if opts.job_html:
        with naming(opts.job_html):
            write_atomic(opts.job_html, job.render("html"))
    if opts.quiet:
        return
    Console(stderr=True).print(job)
    err.print(f"job report gathered from {len(entries)} of {len(got)} ranks over the process "
              f"group in {gather_s * 1e3:.0f} ms: {Path(opts.job_out).resolve()}",
              markup=False, highlight=False)  # fmt: skip


def run_outputs(run: Any, opts: argparse.Namespace, interrupted: bool, gather: bool) -> None:
    """Write the reports of ``pipeprof run`` and print the summary on stderr; ``gather``: the
    job report is gathered next (else a distributed rank 0 says how to merge the files)."""
    from pipeprof.attach import run as runner

    if os.getpid() != opts.pid:  # a process the script forked ends its copy of the run: the
        return  # report is the parent's to write (the child's would be the parent's, stale)
    run.written = True
    reports = run.reports(interrupted)
    err = Console(stderr=True, soft_wrap=True)
    if not reports:
        started = [e.label for e in run.loaders.values()]
        said = (
            f"the script started {', '.join(started[:3])} but no batch came before it ended"
            if started
            else "the script iterated no torch DataLoader or tf.data dataset and ran no Keras "
            "fit()"
        )
        err.print(f"pipeprof: {said}, so there is nothing to report (what pipeprof run sees: "
                  "docs/run.md)", markup=False, highlight=False)  # fmt: skip
        for note in run.notes:
            if not note.endswith("the report covers what ran until then"):  # there is none
                err.print(f"note: {note}", markup=False, highlight=False)
        return
    paths: dict[str, str] = {}
    out = Path(opts.out)
    for i, (entry, report) in enumerate(reports):
        path = out if i == 0 else out.with_name(f"{out.stem}.{_slug(entry.label)}{out.suffix}")
        with naming(str(path)):
            report.save(path)
        paths[entry.label] = str(path)
    main = reports[0][1]
    data = main.to_dict()
    for part in (data, data.get("host") or {}, data.get("gpu") or {}):
        part.pop("timeline", None)  # the job report reads none of them: the gather stays small
    run.job_entry = (shown_path(paths[reports[0][0].label], opts.cwd), {**data, "started_at":
                                                       main.session.started_at})  # fmt: skip
    if opts.html:
        with naming(opts.html):
            main.write_html(opts.html)
    if opts.trace:
        with naming(opts.trace):
            write_atomic(opts.trace, main.render("chrome"))
    rank = opts.rank
    logged = _log_report(main, opts.log_to) if rank.rank == 0 else []
    if opts.quiet or (rank.rank != 0 and not opts.all_ranks):
        return
    if rank.distributed:
        err.print(f"pipeprof: rank {rank.rank} of {rank.world_size} ({rank.host})",
                  markup=False, highlight=False)  # fmt: skip
    Console(stderr=True).print(main)
    shown = {label: shown_path(path, opts.cwd) for label, path in paths.items()}
    for line in runner.summary_lines(reports, shown):
        err.print(line, markup=False, highlight=False)
    for path in (opts.html, opts.trace):
        if path:
            err.print(f"written: {Path(path).resolve()}", markup=False, highlight=False)
    for line in logged:
        err.print(line, markup=False, highlight=False)
    if rank.distributed and rank.rank == 0 and not gather:
        every = Path(opts.out).name.replace(".rank0", ".rank*")
        err.print(
            f"every rank wrote its own report; one job report: pipeprof merge "
            f"{Path(opts.out).parent / every} -o job.json (docs/distributed.md)",
            markup=False, highlight=False,
        )  # fmt: skip


def _log_report(report: Report, targets: list[tuple[str, dict[str, str]]]) -> list[str]:
    """Log ``report`` to each --log-to tool; one line per tool logged to. A tool that fails
    says why, and the script's exit status stays its own."""
    lines = []
    for tool, options in targets:
        try:
            where = report.log_to(tool, **options)
        except Exception as exc:
            error(f"the report could not be logged to {tool} ({type(exc).__name__}: {exc})")
        else:
            lines.append(f"logged to {tool}: {where}")
    return lines


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in label).strip("_") or "loader"


def error(message: str) -> None:
    """A pipeprof error on stderr, as the CLI prints every one of its own."""
    # the message as it is: no markup read from it, no line breaks added inside a path
    Console(stderr=True, soft_wrap=True).print(
        f"pipeprof: {message}", style="red", markup=False, highlight=False
    )
