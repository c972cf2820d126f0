"""Golden inputs and outputs of the renderer tests.

The inputs are real Sessions recorded by ``tests/golden/make_sessions.py`` (a training loop before
and after a fix, and a loader profiled alone, with known injected costs); the tests re-analyse
them with ``pipeprof.load`` and render the Reports. ``DESIGN`` is what the recording injected:
the cost of each stage and region, the verdict each profile must get and the stage that must
limit it. ``assert_golden`` compares a
rendering with ``tests/golden/NAME`` and rewrites the file instead when
``PIPEPROF_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pipeprof

GOLDEN = Path(__file__).parent / "golden"
LOOP = "session-loop.json"  # input-bound: decode 120 ms a sample, 2 workers, 122 ms steps
FIXED = "session-loop-fixed.json"  # the same loop with decode 2 ms and 4 workers
LOADER = "session-loader.json"  # pipeprof.profile; Crop costs 10 ms, ten times any other stage

LOOP_COSTS = {  # ms a sample, injected (sleeps) by make_sessions.py
    "load/read": 2.0,
    "load/decode": 120.0,
    "transform/Crop": 3.0,
    "transform/Flip": 1.0,
    "transform/Normalize": 1.0,
}
REGIONS = {"Forward": 80.0, "Backward": 40.0, "Log": 2.0}  # ms a step, in both loops
DESIGN: dict[str, dict[str, Any]] = {
    LOOP: {
        "mode": "loop",
        "kind": "input-bound",
        "stage": "load/decode",
        "num_workers": 2,
        "costs": LOOP_COSTS,
    },
    FIXED: {
        "mode": "loop",
        "kind": "compute-bound",
        "stage": None,
        "num_workers": 4,
        "costs": {**LOOP_COSTS, "load/decode": 2.0},
    },
    LOADER: {
        "mode": "loader",
        "kind": "balanced",
        "stage": "transform/Crop",
        "num_workers": 2,
        "costs": {
            "load/read": 0.5,
            "load/decode": 1.0,
            "transform/Crop": 10.0,
            "transform/Resize": 0.5,
        },
    },
}


def within(measured_ms: float, injected_ms: float) -> bool:
    """A sleep of ``injected_ms`` as measured: never shorter, and at most 1.5× + 0.5 ms longer
    (a sleep overshoots, more on a busy machine)."""
    return injected_ms <= measured_ms <= 1.5 * injected_ms + 0.5


@functools.cache
def golden_report(name: str) -> pipeprof.Report:
    """The Report of a recorded session: real analysis, real findings (loaded once per run; a
    Report hands out copies, so tests cannot change it for the next)."""
    return pipeprof.load(GOLDEN / name)


def assert_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("PIPEPROF_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}: run PIPEPROF_UPDATE_GOLDEN=1 pytest {path.name}"
    expected = path.read_text(encoding="utf-8")
    assert text == expected, (
        f"{name} differs from its golden file; if the change is intended, accept it with "
        "PIPEPROF_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py tests/test_compare.py"
    )
