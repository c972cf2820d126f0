"""A loop that waited for one batch far longer than for any before it (NOTE [ Hangs ] in
collect/torch/hangs.py): where the batch was, and what to change (docs/findings.md#loop-hang)."""

from __future__ import annotations

from typing import Any

from pipeprof.analyze.finding import Finding, finding
from pipeprof.core.units import stage_words

_FIXES = {
    "load": "a read that does not answer (a network file system, an object store, a URL): give "
    "it a timeout and retries (requests' timeout=, boto3's Config(read_timeout=, retries=), "
    "socket.setdefaulttimeout), and skip or log a sample that keeps failing",
    "collate": "the collate_fn itself: see its stack",
    "worker_init_fn": "the worker_init_fn: a lock or connection taken before fork and not "
    "released in the child deadlocks it; open connections in the worker, or use "
    "multiprocessing_context='spawn' or 'forkserver'",
    "transform": "a transform that does not return: see its stack",
    "starting": "the worker had not finished starting: its imports, or the dataset unpickled "
    "in it (spawn, forkserver), took that long; import less where the script starts, keep "
    "large data out of the dataset object (open files in the worker), and persistent_workers="
    "True to start the workers once",
}


def rule_hang(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """NOTE [ Hangs ]: the first stall the watchdog recorded."""
    hang = (report.get("meta") or {}).get("hang")
    if not hang:
        return None
    resumed = hang.get("resumed_s")
    waited = resumed or hang["waited_s"]
    worker = next((w for w in hang["workers"] if w["waited_for"]), None)
    before = hang["longest_before_s"]
    times = f", {waited / before:.0f}× the longest gap before it" if before else ""
    said = (f"the loop waited {'about ' if resumed else 'at least '}{waited:.0f} s for batch "
            f"{hang['batch']}{times}" + ("" if resumed else ", and was still waiting"))  # fmt: skip
    where = worker or hang.get("main") or {}
    stage = where.get("stage")
    named = stage_words(stage)
    if worker is not None:
        said += f": worker {worker['id']} (pid {worker['pid']}) had it, {named}"
    elif hang.get("main"):
        said += f": the training process read it itself, {named}"
    if where.get("at"):
        said += f" at {where['at']}"
    if where.get("wchan"):
        said += f" (the kernel: {where['wchan']})"
    idle = [w["id"] for w in hang["workers"] if w.get("stage") == "idle"]
    if idle:
        said += f"; worker(s) {', '.join(map(str, idle))} waited for work"
    fix = _FIXES.get(stage or "", "see the stack of the worker the loop waited for")
    return finding(
        "loop-hang",
        "warning" if resumed else "critical",
        None,
        said,
        {"batch": hang["batch"], "worker": hang.get("worker"), "waited_s": waited,
         "resumed": resumed is not None, "stage": stage, "at": where.get("at"),
         "stack": where.get("stack", [])[:12]},
        f"{fix}; DataLoader(timeout=SECONDS) makes torch raise in the loop instead of waiting "
        "for ever; every worker's stack is in the report (meta.hang) (docs/findings.md#loop-hang)",
    )  # fmt: skip


HANG_RULES = [rule_hang]
