"""IPython magics: ``%pipeprof`` profiles a DataLoader, ``%%pipeprof`` a training-loop cell.

Load them with ``%load_ext pipeprof``. This module imports IPython; ``import pipeprof`` does not.

``%pipeprof [-b BATCHES] [-d DEVICE] [-o FILE] LOADER`` iterates the DataLoader that ``LOADER``
names (any expression) with ``pipeprof.profile`` and returns the Report, which Jupyter shows.

``%%pipeprof [-n NAME] [-d DEVICE] [--hz HZ] [-o FILE]`` runs the cell under a
``pipeprof.Profiler`` called ``prof`` (or ``NAME``): iterate ``prof.wrap(loader)`` in the cell and
mark regions with ``prof.region("Forward")``. When the cell ends, or is interrupted, the Report is
shown and kept as ``_pipeprof_report``. ``-o`` also writes it: ``.html`` a page, ``.trace.json``
a Chrome trace, ``.json`` the report and session (``pipeprof.load`` reads it back).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from pipeprof.core.session import write_atomic
from pipeprof.profiler import Profiler, profile
from pipeprof.render import format_for
from pipeprof.report import Report

RESULT = "_pipeprof_report"  # the user-namespace name of the last report


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"%pipeprof: {message}")


def _parser() -> _Parser:
    p = _Parser(prog="%pipeprof", add_help=False)
    p.add_argument("-b", "--batches", type=int, default=None)  # line: batches to profile
    p.add_argument("-d", "--device", default=None)  # move batches there: cuda, cuda:1, cpu
    p.add_argument("-n", "--name", default="prof")  # cell: the Profiler's name
    p.add_argument("--hz", type=float, default=10.0)  # cell: sampling rate, 0: off
    p.add_argument("-o", "--output", default=None)  # also write: .json, .html, .trace.json
    p.add_argument("-q", "--quiet", action="store_true")  # return nothing
    return p


_VALUED = {"-b", "--batches", "-d", "--device", "-n", "--name", "--hz", "-o", "--output"}


def parse(line: str) -> tuple[argparse.Namespace, str]:
    """The options at the start of ``line`` and the rest, kept verbatim (a Python expression)."""
    tokens = list(re.finditer(r"\S+", line))
    k = 0
    while k < len(tokens) and tokens[k].group().startswith("-"):
        k += 2 if tokens[k].group() in _VALUED else 1
    k = min(k, len(tokens))
    options = [t.group() for t in tokens[:k]]
    rest = line[tokens[k].start() :].strip() if k < len(tokens) else ""
    return _parser().parse_args(options), rest


def write(report: Report, path: str) -> Path:
    """Save ``report`` in the format ``path``'s extension asks for (JSON report + session else)."""
    fmt = format_for(path)
    if fmt in (None, "json"):
        return report.save(path)
    return write_atomic(path, report.render(fmt))


@magics_class
class PipeprofMagics(Magics):
    """``%pipeprof`` and ``%%pipeprof`` (see the module docstring)."""

    @property
    def _shell(self) -> Any:
        if self.shell is None:  # pragma: no cover - IPython always sets it
            raise UsageError("%pipeprof needs a running IPython shell")
        return self.shell

    @line_cell_magic
    def pipeprof(self, line: str, cell: str | None = None) -> Report | None:
        """``%pipeprof [-b BATCHES] [-d DEVICE] [-o FILE] [-q] LOADER``: profile a DataLoader.

        ``%%pipeprof [-n NAME] [-d DEVICE] [--hz HZ] [-o FILE] [-q]``: run the cell under a
        ``pipeprof.Profiler`` called ``prof`` (or NAME); iterate ``prof.wrap(loader)`` in it.
        The report is returned (shown) and kept as ``_pipeprof_report``; ``-o`` also writes it.

        Args:
            line: the options, then (``%pipeprof``) the expression that names the DataLoader.
            cell: the cell's code for ``%%pipeprof``; None: the line magic ``%pipeprof``.

        Returns:
            The Report; None with ``-q``.

        Raises:
            UsageError: bad options, ``%pipeprof`` without a DataLoader, ``%%pipeprof`` with an
                expression, a ``-n`` that is not a Python name, or a cell that never iterated
                ``prof.wrap(...)``.
        """
        args, rest = parse(line)
        if cell is None:
            report = self._profile_loader(args, rest)
        else:
            report = self._profile_cell(args, rest, cell)
        self._shell.user_ns[RESULT] = report
        if args.output:
            print(f"pipeprof: wrote {write(report, args.output)}")
        return None if args.quiet else report

    def _profile_loader(self, args: argparse.Namespace, expression: str) -> Report:
        if not expression:
            raise UsageError("%pipeprof needs a DataLoader: %pipeprof [-b BATCHES] loader")
        loader = self._shell.ev(expression)
        return profile(loader, batches=args.batches, device=args.device)

    def _profile_cell(self, args: argparse.Namespace, rest: str, cell: str) -> Report:
        if rest:
            raise UsageError(
                "%%pipeprof takes no expression: iterate prof.wrap(loader) in the cell"
            )
        if not args.name.isidentifier():
            raise UsageError(f"-n {args.name!r} is not a Python name")
        prof = Profiler(device=args.device, sample_hz=args.hz)
        self._shell.user_ns[args.name] = prof
        source = self._shell.transform_cell(cell)
        prof.start()
        interrupted = False
        try:
            self._shell.ex(source)
        except KeyboardInterrupt:
            interrupted = True  # a long loop stopped by hand: report what was measured
        except BaseException:  # the cell's own error goes on as it is; what ran is kept
            prof.stop(interrupted=True)
            if prof.session.loop and prof.session.loop.steps:
                report = self._shell.user_ns[RESULT] = prof.report()
                if args.output:
                    print(f"pipeprof: wrote {write(report, args.output)} (the cell raised)")
            raise
        finally:
            prof.stop(interrupted=interrupted)
        if not (prof.session.loop and prof.session.loop.steps):
            raise UsageError(
                f"the cell never iterated {args.name}.wrap(...): write "
                f"`for batch in {args.name}.wrap(loader):` so pipeprof sees the steps"
            )
        return prof.report()


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics (``%load_ext pipeprof``).

    Args:
        ipython: the running IPython shell (``%load_ext`` passes it).
    """
    ipython.register_magics(PipeprofMagics)
