"""Background samplers: GPU through NVML and host CPU/memory/disk through psutil.

Each sampler is a named daemon thread in the main process. Importing this package imports neither
pynvml nor psutil; they are loaded when a sampler first runs.
"""

from __future__ import annotations

from pipeprof.collect.samplers.base import Sampler
from pipeprof.collect.samplers.host import HostSampler
from pipeprof.collect.samplers.nvml import NvmlSampler, query
from pipeprof.core.series import NA, NaType, json_default, mean_over_spans

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
