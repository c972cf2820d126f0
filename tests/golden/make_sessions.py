"""Records the real Sessions the renderer, compare and trace tests render (run by hand):

    PYTHONPATH=. .venv/bin/python tests/golden/make_sessions.py

then accept the renderings: ``PIPEPROF_UPDATE_GOLDEN=1 python -m pytest tests/test_render.py
tests/test_compare.py``. Three profiles, each with the real collectors and known injected costs
(sleeps, so that a busy machine stretches them little):

Costs, worker counts and verdicts are ``DESIGN`` in tests/golden_reports.py:

- ``session-loop.json``: a training loop under ``pipeprof.Profiler`` over a DataLoader with 2
  workers. Each sample costs read 2 ms + decode 120 ms + three transforms 5 ms; the step computes
  120 ms (Forward, Backward) and logs 2 ms. The workers deliver a batch every ~254 ms, the step
  needs ~122: input-bound, ``load/decode`` limiting (120 of 127 ms per sample).
- ``session-loop-fixed.json``: the same loop after the fix: decode 2 ms, 4 workers. The workers
  deliver a batch every ~9 ms against a 122 ms step: compute-bound. (A DataLoader's hand-over
  costs 1-6 ms per batch on a busy 2-core machine: the step is long so that this stays under 5 %.)
- ``session-loader.json``: ``pipeprof.profile`` of a loader whose ``Crop`` costs 10 ms a sample,
  ten times any other stage: ``transform/Crop`` limits it.

The GPU is the fake NVML of tests/fake_nvml.py (no GPU here): it reports 95 % utilisation while the
loop computes and 3 % otherwise, and one of its readings fails (n/a). The host sampler is real.
The script checks that each profile came out as designed (``DESIGN`` in tests/golden_reports.py)
and refuses to write it otherwise.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fake NVML, DESIGN

from fake_nvml import FakeGpu, FakeNvml, NVMLError_Unknown
from golden_reports import DESIGN, FIXED, LOADER, LOOP, REGIONS, within

import pipeprof

HERE = Path(__file__).resolve().parent
BATCH = 4
STEPS = 20


class Cost:
    """A transform that sleeps ``ms`` and returns its input plus one."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return x + 1


class Crop(Cost):
    pass


class Flip(Cost):
    pass


class Normalize(Cost):
    pass


class Resize(Cost):
    pass


TRANSFORMS = {t.__name__: t for t in (Crop, Flip, Normalize, Resize)}


class Images(Dataset):
    """Sample i: a read and a decode marked with ``pipeprof.stage``, then ``transform``."""

    def __init__(self, n: int, read_ms: float, decode_ms: float, transform: Any) -> None:
        self.n, self.read_ms, self.decode_ms, self.transform = n, read_ms, decode_ms, transform

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with pipeprof.stage("read"):
            time.sleep(self.read_ms / 1e3)
        with pipeprof.stage("decode"):
            time.sleep(self.decode_ms / 1e3)
            x = torch.full((3, 8, 8), float(i))
        return self.transform(x), i


class Busy(Sequence[float]):
    """The fake GPU's utilisation script: 95 % while the loop computes, 3 % otherwise."""

    computing = False

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: Any) -> float:
        return 95.0 if Busy.computing else 3.0


def fake_nvml() -> FakeNvml:
    gpu = FakeGpu(
        name="NVIDIA H100 80GB HBM3",
        util=Busy(),
        mem_util=(20,),
        samples=None,  # no driver samples: utilisation rates, one reading per sample
        mem_used=21 << 30,
        mem_total=80 << 30,
        power_mw=310_000,
        sm_mhz=1755,
    )
    failing = [None] * 6 + [NVMLError_Unknown()]  # the 7th reading is n/a
    return FakeNvml([gpu], fail={"nvmlDeviceGetUtilizationRates": failing})


def staged(costs: dict[str, float]) -> Images:
    """The dataset of ``costs`` (ms a sample per stage path): its transforms in that order."""
    tf = [TRANSFORMS[p[10:]](ms) for p, ms in costs.items() if p.startswith("transform/")]
    n = STEPS * BATCH
    return Images(n, costs["load/read"], costs["load/decode"], transforms.Compose(tf))


def loader_of(name: str) -> DataLoader:
    design = DESIGN[name]
    return DataLoader(staged(design["costs"]), batch_size=BATCH, num_workers=design["num_workers"])


def record_loop(name: str) -> pipeprof.Report:
    loader = loader_of(name)
    prof = pipeprof.Profiler(device="cpu", sample_hz=20, nvml=fake_nvml())
    with prof:
        for _ in prof.wrap(loader):
            Busy.computing = True
            with prof.region("Forward"):
                time.sleep(REGIONS["Forward"] / 1e3)
            with prof.region("Backward"):
                time.sleep(REGIONS["Backward"] / 1e3)
            Busy.computing = False
            with prof.region("Log"):
                time.sleep(REGIONS["Log"] / 1e3)
    return prof.report()


def record_loader() -> pipeprof.Report:
    return pipeprof.profile(loader_of(LOADER), batches=16)


def check(name: str, report: pipeprof.Report) -> None:
    """Refuse a recording whose verdict is not the one designed (a very busy machine)."""
    want, v = DESIGN[name], report.verdict
    ok = (v["kind"], v["stage"]) == (want["kind"], want["stage"])
    ok = ok and report["meta"]["num_workers"] == want["num_workers"]
    if name == LOOP:
        ok = ok and report["loop"]["steady"]["wait_fraction"] > 0.3
    if name == LOADER:
        stages = report["stages"]
        crop = stages["transform/Crop"]["total_s"]
        others = [r["total_s"] for p, r in stages.items() if not p.endswith(("transform", "Crop"))]
        ok = ok and crop > 3 * max(others)
    for path, ms in want["costs"].items():
        ok = ok and within(report["stages"][path]["per_sample_ms"], ms)
    for region, ms in REGIONS.items() if want["mode"] == "loop" else ():
        ok = ok and within(report["loop"]["regions"][region]["mean_ms"], ms)
    if not ok:
        sys.exit(f"{name} did not come out as designed ({v['headline']}); run again")


def save(name: str, report: pipeprof.Report) -> None:
    path = report.session.save(HERE / name)
    size = path.stat().st_size
    print(f"wrote {path} ({size:,} bytes): {report.verdict['headline']}")
    assert size < 300_000, f"{path} is too big for a golden input"


if __name__ == "__main__":
    reports = {
        LOOP: record_loop(LOOP),
        FIXED: record_loop(FIXED),
        LOADER: record_loader(),
    }
    for name, report in reports.items():
        check(name, report)
    for name, report in reports.items():
        save(name, report)
