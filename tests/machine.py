"""What the machine running the tests has, for the tests that depend on it: the command that runs
pipeprof, the optional packages a test drives, the GPUs NVML sees.

CI installs everything (``bash dev/setup.sh test``) and must skip nothing, so nothing here skips
or falls back where a thing is there: only where it is truly missing (a GPU machine with torch,
h5py and pytest, running pipeprof from ``PYTHONPATH``: dev/gpu_check.sh).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import sysconfig
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("pipeprof")  # the console script pip installs


def installed() -> bool:
    """pipeprof is installed in this interpreter's environment (site-packages), not only
    importable from ``PYTHONPATH`` or the working directory (whose ``pipeprof.egg-info`` does
    not count)."""
    paths = sysconfig.get_paths()
    where = sorted({paths["purelib"], paths["platlib"]})
    found = importlib.metadata.distributions(name="pipeprof", path=where)
    return next(iter(found), None) is not None


# The command line that runs pipeprof: the installed console script (what users run; CI tests
# it, and an installation that lost its script fails there), or ``python -m pipeprof`` where
# pipeprof is not installed, only on PYTHONPATH (which must then be absolute: the tests run it
# in other folders).
PIPEPROF = [str(SCRIPT)] if SCRIPT.exists() or installed() else [sys.executable, "-m", "pipeprof"]


def require(*modules: str, extra: str) -> None:
    """Skip the calling test, with the reason, unless every one of ``modules`` is installed.
    Found, not imported: a module that is installed but fails to import fails the test."""
    __tracebackhide__ = True  # the skip is reported at the test's line, not here
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: pip install 'pipeprof[{extra}]'")


def nvml_gpus() -> int:
    """The GPUs NVML sees here: 0 without pynvml, without the driver's library or a GPU."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError: no library, no driver
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0
    finally:
        pynvml.nvmlShutdown()
