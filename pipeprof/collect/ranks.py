"""Which rank of a distributed job this process is, its files and its GPU (docs/distributed.md).

NOTE [ Ranks ]
The rank, local rank and world size come from ``torch.distributed`` when it is initialised (the
job's own truth), else from the launcher's environment, first match wins: torchrun / torch
elastic (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``), Slurm's ``srun`` (``SLURM_PROCID``,
``SLURM_LOCALID``, ``SLURM_NTASKS``), Open MPI's ``mpirun`` (``OMPI_COMM_WORLD_RANK``,
``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_SIZE``) and PMI (MPICH, Intel MPI: ``PMI_RANK``,
``PMI_SIZE``; no local rank). ``torch`` is read only when the process has already imported it:
asking never imports a framework. A process with none of these is rank 0 of a job of one.

Files: with a world size above 1, ``run.json`` becomes ``run.rank3.json`` (a path that already
names its rank, ``run.rank3.json`` or ``out/rank3.json``, is kept), so ranks never write the same
file. GPU: the rank's own device is ``CUDA_VISIBLE_DEVICES[LOCAL_RANK]`` (NVML counts every GPU
of the node, torch counts the visible ones); a single visible GPU is the rank's whatever its
local rank (Slurm's ``--gpus-per-task=1``).
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (launcher, rank, local rank, world size): the environment variables each launcher sets
LAUNCHERS = (
    ("torchrun", "RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("pmi", "PMI_RANK", None, "PMI_SIZE"),
)


@dataclass(frozen=True, slots=True)
class Rank:
    """This process's place in the job. ``local_rank`` is None where the launcher does not say
    (PMI); ``source`` names where the figures came from (``torch.distributed``, ``torchrun``,
    ``slurm``, ``openmpi``, ``pmi`` or ``none``)."""

    rank: int = 0
    local_rank: int | None = 0
    world_size: int = 1
    host: str = ""
    source: str = "none"
    job: str = ""  # the job's id where the launcher gives one: ranks of one job share it
    node: int | None = None  # the node's index in the job (torchrun, Slurm), where given

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "host": self.host,
            "source": self.source,
            "job": self.job,
            "node_rank": self.node,
        }

NODE_KEYS = {"torchrun": "GROUP_RANK", "slurm": "SLURM_NODEID"}  # the node's index in the job


def _int(env: Mapping[str, str], key: str | None) -> int | None:
    value = env.get(key, "") if key else ""
    return int(value) if value.strip().isdigit() else None


def from_env(env: Mapping[str, str] | None = None) -> Rank:
    """The rank as the launcher's environment gives it (NOTE [ Ranks ])."""
    env = os.environ if env is None else env
    host, job = socket.gethostname(), job_id(env)
    for name, rank_key, local_key, world_key in LAUNCHERS:
        rank, world = _int(env, rank_key), _int(env, world_key)
        if rank is None or world is None or world < 1:
            continue
        local = _int(env, local_key)
        if local is None and local_key is None and world == 1:
            local = 0
        return Rank(rank, local, world, host, name, job, _int(env, NODE_KEYS.get(name)))
    local = _int(env, "LOCAL_RANK")
    return Rank(0, 0 if local is None else local, 1, host, "none", job)


def job_id(env: Mapping[str, str]) -> str:
    """The job's id: Slurm's job id, torchrun's rendezvous id, else where its ranks meet
    (``MASTER_ADDR:MASTER_PORT``); empty when none is set."""
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return f"torchrun:{run_id}"
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return ""


def current(env: Mapping[str, str] | None = None) -> Rank:
    """This process's rank: ``torch.distributed``'s when initialised, else ``from_env``."""
    launched = from_env(env)
    dist = _torch_distributed()
    if dist is None:
        return launched
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return launched
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a process group being torn down: the launcher's figures still hold
        return launched
    local = launched.local_rank if launched.world_size == world else None
    return Rank(rank, local, world, launched.host, "torch.distributed", launched.job,
                launched.node)


def _torch_distributed() -> Any:
    if "torch" not in sys.modules:  # asking never imports torch
        return None
    return sys.modules.get("torch.distributed")


_NAMED = re.compile(r"(?<![A-Za-z])rank0*(\d+)(?!\d)")


def rank_path(path: str | os.PathLike[str], rank: Rank | None = None) -> Path:
    """``path`` for this rank: ``run.json`` becomes ``run.rank3.json`` when the job has more
    than one rank; a path that already names this rank, or a job of one, is kept."""
    rank = current() if rank is None else rank
    p = Path(path)
    if not rank.distributed or any(int(m) == rank.rank for m in _NAMED.findall(str(p))):
        return p
    suffix = "".join(p.suffixes[-1:])
    stem = p.name[: len(p.name) - len(suffix)] if suffix else p.name
    return p.with_name(f"{stem}.rank{rank.rank}{suffix}")


def local_gpu(rank: Rank | None = None, env: Mapping[str, str] | None = None) -> int | None:
    """The NVML index of this rank's own GPU, or None when it cannot be told (not a distributed
    launch, no local rank, ``CUDA_VISIBLE_DEVICES`` naming GPUs by UUID or MIG slice)."""
    env = os.environ if env is None else env
    rank = current(env) if rank is None else rank
    if rank.local_rank is None or (not rank.distributed and "LOCAL_RANK" not in env):
        return None
    return visible_to_nvml(rank.local_rank, env)


def visible_to_nvml(index: int, env: Mapping[str, str] | None = None) -> int | None:
    """The NVML index of the CUDA device ``index`` as torch numbers it (``cuda:index``), through
    ``CUDA_VISIBLE_DEVICES``; None for a UUID or MIG name, which NVML's indices do not give."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return index
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not ids:
        return None
    if index >= len(ids):
        if len(ids) != 1:
            return None
        index = 0  # one GPU given to each rank: it is this rank's
    return int(ids[index]) if ids[index].isdigit() else None
