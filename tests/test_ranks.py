"""Ranks of a distributed job: who this process is, its files, its GPU (pipeprof/collect/ranks.py).

Launchers are told apart by their real environment variables; torch.distributed is a real gloo
process group; NVML is the fake one (no GPU here), driven by the real sampler.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
import torch.distributed as dist
from fake_nvml import FakeGpu, FakeNvml

import pipeprof
from pipeprof.collect import ranks

LAUNCHER_VARS = [v for launcher in ranks.LAUNCHERS for v in launcher[1:] if v] + [
    "CUDA_VISIBLE_DEVICES"
]


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "GROUP_RANK": "1"},
         (3, 1, 8, "torchrun", 1)),
        ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "6", "SLURM_NODEID": "2"},
         (5, 1, 6, "slurm", 2)),
        (
            {
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "4",
            },
            (2, 0, 4, "openmpi", None),
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, (1, None, 2, "pmi", None)),
        ({}, (0, 0, 1, "none", None)),
        ({"RANK": "x", "WORLD_SIZE": "2"}, (0, 0, 1, "none", None)),  # not a number: no launch
    ],
)
def test_each_launcher_is_read_from_its_environment(env, expected):
    r = ranks.from_env(env)
    assert (r.rank, r.local_rank, r.world_size, r.source, r.node) == expected
    assert r.host


def test_torchrun_wins_over_a_slurm_allocation_it_runs_in():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "RANK": "1", "WORLD_SIZE": "2",
           "LOCAL_RANK": "1"}  # fmt: skip
    assert ranks.from_env(env).rank == 1


def test_an_initialised_process_group_is_the_truth(clean_env, tmp_path):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        r = ranks.current()
        assert (r.rank, r.world_size, r.source) == (0, 1, "torch.distributed")
    finally:
        dist.destroy_process_group()
    assert ranks.current().source == "torchrun"


def test_rank_paths_never_collide():
    two = ranks.Rank(3, 1, 8, "h", "torchrun")
    assert str(ranks.rank_path("out/run.json", two)) == "out/run.rank3.json"
    assert str(ranks.rank_path("run", two)) == "run.rank3"
    assert str(ranks.rank_path("run.rank3.json", two)) == "run.rank3.json"  # named already
    assert str(ranks.rank_path("rank03/run.json", two)) == "rank03/run.json"
    assert str(ranks.rank_path("crank3.json", two)) == "crank3.rank3.json"  # not a rank name
    assert str(ranks.rank_path("run.rank1.json", two)) == "run.rank1.rank3.json"
    assert str(ranks.rank_path("run.json", ranks.Rank())) == "run.json"  # a job of one


@pytest.mark.parametrize(
    ("env", "gpu"),
    [
        ({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2"}, 1),
        ({"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": "2,3"}, 3),
        ({"LOCAL_RANK": "3", "RANK": "3", "WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "6"}, 6),
        (
            {"LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2",
             "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
            None,
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, None),  # no local rank: cannot tell
        ({}, None),  # not distributed: every GPU, as before
    ],
)
def test_the_ranks_own_gpu(env, gpu):
    assert ranks.local_gpu(env=env) == gpu


def _loop(prof, steps=6):
    for _ in prof.wrap([torch.zeros(4, 2)] * steps):
        time.sleep(0.01)


def test_a_rank_samples_its_own_gpu_and_saves_its_own_files(clean_env, tmp_path):
    for k, v in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                 "CUDA_VISIBLE_DEVICES": "2,3"}.items():  # fmt: skip
        clean_env.setenv(k, v)
    nvml = FakeNvml([FakeGpu(name=f"gpu{i}", util=(10 * i,), samples=None) for i in range(4)])
    prof = pipeprof.Profiler(sample_hz=50, nvml=nvml, stream=str(tmp_path / "run.json"))
    with prof:
        _loop(prof)
    report = prof.report()
    assert [d["index"] for d in report["gpu"]["devices"]] == [3]  # not every GPU of the node
    assert report["gpu"]["devices"][0]["util_mean"] == pytest.approx(30)
    assert report["meta"]["rank"]["rank"] == 1 and report["meta"]["rank"]["world_size"] == 2
    assert (tmp_path / "run.rank1.json").exists() and not (tmp_path / "run.json").exists()
    saved = report.save(tmp_path / "final.json")
    assert saved.name == "final.rank1.json"
    assert json.loads(saved.read_text())["meta"]["rank"]["local_rank"] == 1


def test_cuda_n_is_the_nth_visible_gpu(clean_env):
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    prof = pipeprof.Profiler(device="cuda:1", sample_hz=0)
    assert prof._gpu_indices() == [7]
    clean_env.delenv("CUDA_VISIBLE_DEVICES")
    assert prof._gpu_indices() == [1]
    assert pipeprof.Profiler(sample_hz=0)._gpu_indices() is None  # one process: every GPU


def test_a_single_process_is_rank_0_of_1(clean_env, tmp_path):
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        _loop(prof, 3)
    report = prof.report()
    assert report["meta"]["rank"]["world_size"] == 1
    assert report.save(tmp_path / "run.json").name == "run.json"
