"""Background samplers: GPU through NVML and host CPU/memory/disk through psutil.

Each sampler is a named daemon thread in the main process. Importing this package imports neither
pynvml nor psutil; they are loaded when a sampler first runs.
"""

from __future__ import annotations

from pipeprof.samplers.base import NA, NaType, Sampler, json_default, mean_over_spans
from pipeprof.samplers.host import HostSampler
from pipeprof.samplers.nvml import NvmlSampler, query

__all__ = [
    "NA",
    "HostSampler",
    "NaType",
    "NvmlSampler",
    "Sampler",
    "json_default",
    "mean_over_spans",
    "query",
]
