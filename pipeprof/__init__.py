"""pipeprof: find the bottleneck in deep-learning input pipelines.

``import pipeprof`` imports no framework and no hardware library; they are imported when used.
"""

from __future__ import annotations

from pipeprof.benchmark import Bench, bench
from pipeprof.loop import Profiler
from pipeprof.profiler import load, profile
from pipeprof.recorder import stage
from pipeprof.report import Report
from pipeprof.session import Session
from pipeprof.timer import Timer

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``pipeprof.keras`` on first use (it imports TensorFlow)."""
    if name == "keras":
        import importlib

        return importlib.import_module("pipeprof.keras")
    raise AttributeError(f"module 'pipeprof' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext pipeprof``: the ``%pipeprof`` and ``%%pipeprof`` magics (pipeprof.magic)."""
    from pipeprof.magic import load_ipython_extension as load

    load(ipython)


__all__ = [
    "Bench", "Profiler", "Report", "Session", "Timer", "__version__", "bench", "load", "profile",
    "stage",
]  # fmt: skip
