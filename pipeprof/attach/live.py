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
from pipeprof.render.live import panel

REFRESH_S = 1.0


def terminal() -> bool:
    """Whether stdout and stderr are both a terminal: the panel shows only then."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class LiveView:
    """A rich ``Live`` panel over stderr, redrawn by a thread of its own every REFRESH_S while
    it runs; the script's prints go above it (rich's stdout and stderr proxies, while it shows).
    ``start`` does nothing (and returns False) where stdout or stderr is not a terminal."""

    def __init__(self, loaders: Callable[[], list[Any]],
                 gpu: Callable[[], list[tuple[Any, Any]]] | None = None) -> None:  # fmt: skip
        self.figures = LiveFigures(loaders, gpu)
        self._live: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_ns = 0  # the panel's own CPU: its figures and its drawing

    def start(self) -> bool:
        if self._live is not None or not terminal():
            return False
        from rich.console import Console
        from rich.live import Live

        console = Console(file=sys.stderr)
        self._live = Live(panel(self.figures.tick()), console=console, auto_refresh=False,
                          redirect_stdout=True, redirect_stderr=True, transient=True)  # fmt: skip
        self._live.start()
        self._thread = threading.Thread(target=self._run, name="pipeprof-live", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            cpu0 = time.thread_time_ns()
            try:
                self._live.update(panel(self.figures.tick()), refresh=True)
            except Exception:  # the panel never breaks the job: it stops being drawn
                return
            finally:
                self.cpu_ns += time.thread_time_ns() - cpu0

    def stop(self) -> None:
        if self._live is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * REFRESH_S)
        self._live.stop()
        self._live = None
        if os.environ.get("PIPEPROF_LIVE_COST"):  # benchmarks/live_cost.py reads it
            print(f"pipeprof-live-cpu-ns {self.cpu_ns}", file=sys.stderr)
