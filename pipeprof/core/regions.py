"""How a named region counts in a training step (NOTE [ Step attribution ] in collect/loop.py).

Deep500's keys and a few common names: compute keys are compute; ``Transfer``/``H2D``/``IO`` are
the host-to-device copy; ``Epoch`` and ``Batch`` contain steps and count nowhere; any other name
(logging, callbacks, ``Other``) is overhead outside compute.
"""

from __future__ import annotations

from typing import Literal

RegionClass = Literal["compute", "transfer", "container", "overhead"]

COMPUTE_KEYS = frozenset({"Forward", "Backward", "Comm", "Loss", "Optimizer", "Step", "Compute"})
TRANSFER_KEYS = frozenset({"Transfer", "H2D", "IO", "transfer", "h2d"})
CONTAINER_KEYS = frozenset({"Epoch", "Batch"})


def region_class(key: str) -> RegionClass:
    """How a region counts in the step: compute, transfer, container or overhead."""
    if key in COMPUTE_KEYS:
        return "compute"
    if key in TRANSFER_KEYS:
        return "transfer"
    if key in CONTAINER_KEYS:
        return "container"
    return "overhead"
