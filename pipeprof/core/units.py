"""Numbers as people read them: about three significant digits, percentages, n/a for None;
where a hung worker was, as the stderr line and the finding both say it; and the buckets of a
request latency histogram (collect/fetch.py counts into them, analyze/fetch.py reads them).

Shared by the renderers and by analysis, whose findings and comparisons are sentences.
"""

from __future__ import annotations

from typing import Any

# the upper bounds (ms) of a request latency histogram's buckets, as collect/fetch.py counts
# them and analyze/fetch.py reads them; the last bucket holds everything above
LATENCY_BOUNDS_MS = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def num(value: Any, unit: str = "") -> str:
    """A measurement with about three significant digits, ``n/a`` for None."""
    if value is None:
        return "n/a"
    v = float(value)
    a = abs(v)
    if a >= 1000:
        text = f"{v:,.0f}"
    elif a >= 100:
        text = f"{v:.0f}"
    elif a >= 10:
        text = f"{v:.1f}"
    elif a >= 1:
        text = f"{v:.2f}"
    elif a == 0:
        text = "0"
    elif a >= 0.001:
        text = f"{v:#.3g}"
    else:
        text = f"{v:.1e}"
    return text + unit


def pct(fraction: Any, digits: int = 0) -> str:
    """A 0-1 fraction as a percentage, ``n/a`` for None."""
    return "n/a" if fraction is None else f"{float(fraction) * 100:.{digits}f}%"


def stage_words(stage: str | None) -> str:
    """Where a hung worker was (NOTE [ Hangs ] in collect/torch/hangs.py): ``starting`` (it had
    not reached pipeprof's worker init), a stage, or not known."""
    if stage == "starting":
        return "still starting (importing, or unpickling the dataset)"
    return f"in {stage or 'an unknown stage'}"
