"""The ``pipeprof`` command: a thin client of the public API."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from rich.console import Console

import pipeprof
from pipeprof.renderers import FORMATS, format_for


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pipeprof", description="Find the bottleneck in deep-learning input pipelines."
    )
    p.add_argument("--version", action="version", version=f"pipeprof {pipeprof.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo",
        help="profile training on a built-in image pipeline (JPEGs it "
        "generates; nothing to download)",
    )
    d.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    d.add_argument("--images", type=int, default=256, help="JPEG files to generate (256)")
    d.add_argument("--workers", type=int, default=2, help="DataLoader workers (2)")
    d.add_argument("--batches", type=int, default=None, help="batches to profile (one epoch)")
    d.add_argument("--html", default="pipeprof-demo.html", help="HTML report to write")
    d.add_argument("-o", "--output", default=None, help="also save the report as JSON here")
    r = sub.add_parser("report", help="re-render a saved report")
    r.add_argument("file", help="a JSON file written by report.save() or -o")
    r.add_argument(
        "--format",
        choices=FORMATS,
        default=None,
        help="output format (default: from -o's extension, else text)",
    )
    r.add_argument("-o", "--output", default=None, help="write here instead of standard output")
    return p


def cmd_demo(args: argparse.Namespace) -> int:
    from pipeprof.demo import demo_loader, make_images, train

    console = Console()
    with tempfile.TemporaryDirectory(prefix="pipeprof-demo-") as tmp:
        console.print(f"[dim]writing {args.images} JPEG images to {tmp} ...[/dim]")
        make_images(tmp, count=args.images)
        loader = demo_loader(tmp, workers=args.workers)
        device = args.device or _default_device()
        console.print(
            f"[dim]training a small CNN on {device}, {args.workers} DataLoader "
            "workers, under pipeprof.Profiler ...[/dim]"
        )
        report = train(loader, device, batches=args.batches)
    console.print(report)
    path = report.write_html(args.html)
    console.print(f"HTML report: {path.resolve()}")
    if args.output:
        console.print(f"saved: {report.save(args.output)}")
    return 0


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cmd_report(args: argparse.Namespace) -> int:
    fmt = args.format or (format_for(args.output) if args.output else None) or "text"
    report = pipeprof.load(args.file)
    if fmt == "text" and not args.output:
        Console().print(report)
        return 0
    text = report.render(fmt)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return cmd_demo(args)
        return cmd_report(args)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        Console(stderr=True).print(f"[red]pipeprof: {exc}[/red]")
        return 2
