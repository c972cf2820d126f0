"""pipeprof: find the bottleneck in deep-learning input pipelines.

``import pipeprof`` imports no framework and no hardware library; they are imported when used.
"""

from __future__ import annotations

from pipeprof.bench.bench import Bench, bench
from pipeprof.bench.encodings import Encodings, bench_encodings
from pipeprof.collect.timer import Timer
from pipeprof.core.recorder import stage
from pipeprof.core.session import Session
from pipeprof.profiler import Profiler, profile
from pipeprof.report import Comparison, Job, Report, compare, load, merge
from pipeprof.version import __version__


def __getattr__(name: str) -> object:
    """``pipeprof.keras`` on first use (it imports TensorFlow)."""
    if name == "keras":
        import importlib

        return importlib.import_module("pipeprof.keras")
    raise AttributeError(f"module 'pipeprof' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext pipeprof``: the ``%pipeprof`` and ``%%pipeprof`` magics (pipeprof.magic).

    Args:
        ipython: the running IPython shell (``%load_ext`` passes it).

    Raises:
        ImportError: IPython is not installed (pipeprof.magic imports it).
    """
    from pipeprof.magic import load_ipython_extension as load

    load(ipython)


__all__ = [
    "Bench", "Comparison", "Encodings", "Job", "Profiler", "Report", "Session", "Timer",
    "__version__", "bench", "bench_encodings", "compare", "load", "merge", "profile", "stage",
]  # fmt: skip
