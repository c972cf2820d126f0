"""The live terminal view (docs/live.md): a panel that refreshes once a second while training
runs, the script's own output scrolling above it (NOTE [ The live view ] in collect/live.py)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from pipeprof.collect.live import LiveFigures
from pipeprof.render.live import html, panel

REFRESH_S = 1.0


def terminal() -> bool:
    """Whether stdout and stderr are both a terminal: the panel shows only then."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None  # type: ignore[attr-defined]
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class LiveView:
    """The panel, redrawn by a thread of its own every REFRESH_S while it runs: in a terminal a
    rich ``Live`` over stderr, the script's prints going above it (rich's stdout and stderr
    proxies, while it shows); in a Jupyter kernel an HTML output updated in place (a display
    handle), left with the last figures when profiling stops. ``start`` does nothing (and
    returns False) elsewhere: stdout or stderr not a terminal, and no kernel."""

    def __init__(self, loaders: Callable[[], list[Any]],
                 gpu: Callable[[], list[tuple[Any, Any]]] | None = None) -> None:  # fmt: skip
        self.figures = LiveFigures(loaders, gpu)
        self._live: Any = None  # rich's Live, in a terminal
        self._handle: Any = None  # IPython's display handle, in a kernel
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_ns = 0  # the panel's own CPU: its figures and its drawing
        self.frames = 0  # frames drawn after the first

    def start(self) -> bool:
        if self._live is not None or self._handle is not None:
            return False
        if terminal():
            from rich.console import Console
            from rich.live import Live

            console = Console(file=sys.stderr)
            self._live = Live(panel(self.figures.tick()), console=console, auto_refresh=False,
                              redirect_stdout=True, redirect_stderr=True,
                              transient=True)  # fmt: skip
            self._live.start()
        elif in_kernel():
            from IPython.display import HTML, display

            self._handle = display(HTML(html(self.figures.tick())), display_id=True)  # type: ignore[no-untyped-call]
        else:
            return False
        self._thread = threading.Thread(target=self._run, name="pipeprof-live", daemon=True)
        self._thread.start()
        return True

    def _draw(self) -> None:
        fig = self.figures.tick()
        if self._live is not None:
            self._live.update(panel(fig), refresh=True)
        elif self._handle is not None:
            from IPython.display import HTML

            self._handle.update(HTML(html(fig)))  # type: ignore[no-untyped-call]
        self.frames += 1

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            cpu0 = time.thread_time_ns()
            try:
                self._draw()
            except Exception:  # the panel never breaks the job: it stops being drawn
                return
            finally:
                self.cpu_ns += time.thread_time_ns() - cpu0

    def stop(self) -> None:
        if self._live is None and self._handle is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * REFRESH_S)
        if self._live is not None:
            self._live.stop()
        elif self._handle is not None:  # the last figures stay in the cell
            try:
                self._draw()
            except Exception:
                pass
        self._live = self._handle = None
        if os.environ.get("PIPEPROF_LIVE_COST"):  # docs/live.md, "What it costs"
            print(f"pipeprof-live-cpu-ns {self.cpu_ns} frames {self.frames}", file=sys.stderr)
