"""How a named region counts in a training step (NOTE [ Step attribution ] in collect/loop.py).

Deep500's keys and a few common names: compute keys are compute; ``Comm`` (collective
communication: DDP's gradient all-reduce, explicit collectives) is its own part of the step, so a
rank waiting for a slower one shows as comm, not compute; ``Transfer``/``H2D``/``IO`` are
the host-to-device copy; ``Epoch`` and ``Batch`` contain steps and count nowhere; any other name
(logging, callbacks, ``Other``) is overhead outside compute.
"""

from __future__ import annotations

from typing import Literal

RegionClass = Literal["compute", "comm", "transfer", "container", "overhead"]

COMPUTE_KEYS = frozenset({"Forward", "Backward", "Loss", "Optimizer", "Step", "Compute"})
COMM_KEYS = frozenset({"Comm"})
TRANSFER_KEYS = frozenset({"Transfer", "H2D", "IO", "transfer", "h2d"})
CONTAINER_KEYS = frozenset({"Epoch", "Batch"})
# What ``pipeprof run`` times in the steps with no code changes (attach/regions.py): timed in a
# sample of the steps, their totals scaled to every step (NOTE [ Regions in a sample of the
# steps ])
STEP_REGIONS = ("Forward", "Backward", "Optimizer")


def region_class(key: str) -> RegionClass:
    """How a region counts in the step: compute, comm, transfer, container or overhead."""
    if key in COMPUTE_KEYS:
        return "compute"
    if key in COMM_KEYS:
        return "comm"
    if key in TRANSFER_KEYS:
        return "transfer"
    if key in CONTAINER_KEYS:
        return "container"
    return "overhead"
