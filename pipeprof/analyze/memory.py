"""Worker memory (docs/findings.md#copy-on-read): forked workers that copy the dataset's Python
objects as they read them (NOTE [ Copy-on-read ] in collect/torch/memory.py)."""

from __future__ import annotations

import statistics
from typing import Any

from pipeprof.analyze.finding import Finding, finding

COPIED_MB = 64.0  # containers of Python objects this large, or more, are judged
COPIED_SHARE = 0.3  # a worker's private memory at this share of their size, or more: copied


def rule_copy_on_read(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ Copy-on-read ]: forked workers whose private memory (USS) reached a good share of
    the dataset's containers of Python objects."""
    meta = report.get("meta") or {}
    held = meta.get("py_containers") or []
    n = meta.get("num_workers") or 0
    if not held or not n or meta.get("multiprocessing_context") != "fork":
        return None
    size = sum(c["mb"] for c in held)
    procs = (report.get("host") or {}).get("per_process") or []
    private = [p["uss_max_mb"] for p in procs
               if p.get("role") == "child" and p.get("uss_max_mb") is not None]  # fmt: skip
    if size < COPIED_MB or not private:
        return None
    each = statistics.median(private)
    if each < COPIED_SHARE * size:
        return None
    top = held[0]
    named = f"{top['name']} ({top['kind']}, {top['items']:,} items, about {top['mb']:,.0f} MB)"
    more = f" and {len(held) - 1} more" if len(held) > 1 else ""
    return finding(
        "copy-on-read",
        "warning",
        None,
        f"each worker's private memory reached {each:,.0f} MB (USS, the median of "
        f"{len(private)}) while the dataset holds {named}{more}: reading a Python object writes "
        "its reference count, so each forked worker copies the pages it reads, and "
        f"{n} workers hold {n} copies",
        {"uss_mb": round(each, 1), "workers_read": len(private), "containers": held,
         "containers_mb": round(size, 1)},
        f"store {top['name']} as an array: numpy (fixed-width strings, or offsets into one "
        "bytes buffer), Arrow, or a memory-mapped file; reading an array's items writes "
        "nothing, so the workers share one copy. persistent_workers=True makes the copy once "
        "rather than every epoch (docs/findings.md#copy-on-read)",
    )  # fmt: skip


MEMORY_RULES = [rule_copy_on_read]
