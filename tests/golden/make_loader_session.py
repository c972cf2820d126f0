"""Writes tests/golden/loader-session.json: a real, small DataLoader profile (run by hand).

    .venv/bin/python tests/golden/make_loader_session.py

The golden tests re-analyse and re-render this file; analysis is deterministic, so the outputs
only change when pipeprof's analysis or renderers do (then: PIPEPROF_UPDATE_GOLDEN=1 pytest).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof


def spin(ms: float) -> None:
    end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < end:
        pass


class Crop:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        spin(1.5)
        return x[:2]


class Normalize:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        spin(0.3)
        return x / 2


class Images(Dataset):
    """read (sleep) and decode (spin) marked with pipeprof.stage, then a two-step transform."""

    def __init__(self, n: int, transform: object) -> None:
        self.n = n
        self.transform = transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with pipeprof.stage("read"):
            time.sleep(0.0005)
        with pipeprof.stage("decode"):
            spin(1.0)
        return self.transform(torch.full((3,), float(i))), i


if __name__ == "__main__":
    from torchvision import transforms

    ds = Images(24, transforms.Compose([Crop(), Normalize()]))
    report = pipeprof.profile(DataLoader(ds, batch_size=4, num_workers=2), batches=6)
    out = Path(__file__).with_name("loader-session.json")
    report.save(out)
    print(report.render("text"))
    print(f"wrote {out} ({out.stat().st_size} bytes)")
