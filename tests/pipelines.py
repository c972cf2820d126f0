"""Picklable datasets, transforms and collate functions with known injected costs.

Every costly step measures its own true duration and appends it to a per-process log file, so
tests can compare pipeprof's figures with the truth (also from spawn workers).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

import pipeprof
from pipeprof.core.recorder import recorder


def spin(ms: float) -> None:
    end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < end:
        pass


class KnownFetch(Dataset):  # type: ignore[type-arg]
    """1,200 samples of 0.05 ms each, sample ``i`` a row of ``i``'s: the fast paths' tests."""

    def __len__(self) -> int:
        return 1200

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        spin(0.05)
        return torch.full((4,), float(i)), i % 2


class SleepyRows(Dataset):  # type: ignore[type-arg]
    """640 samples that wait ``ms`` each (a sleep: workers that wait leave the cores to the
    loop), sample ``i`` a row of ``i``'s: the workers' fast path's tests."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __len__(self) -> int:
        return 640

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.ms:
            time.sleep(self.ms / 1000)
        return torch.full((4,), float(i)), i % 2


def known_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> None:  # fmt: skip
    """A training step of a small model, and 0.3 ms more of compute: the fast paths' tests."""
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    spin(0.3)


_logs: dict[tuple[int, str], list[str]] = {}


def log(log_dir: str | None, stage: str, ns: int) -> None:
    """Keep one true duration in memory (no I/O inside the timed stage); the process writes its
    log when it exits (a DataLoader worker) or when ``truth`` reads it (the main process)."""
    if not log_dir:
        return
    key = (os.getpid(), log_dir)
    lines = _logs.get(key)
    if lines is None:
        lines = _logs[key] = []
        from multiprocessing import util

        util.Finalize(None, flush, args=(key,), exitpriority=100)
    lines.append(f"{stage} {ns}\n")


def flush(key: tuple[int, str]) -> None:
    lines = _logs.get(key)
    if lines:
        with open(Path(key[1]) / f"{key[0]}.log", "a") as f:
            f.writelines(lines)
        lines.clear()


def truth(log_dir: str) -> dict[str, list[int]]:
    flush((os.getpid(), log_dir))
    out: dict[str, list[int]] = {}
    for p in Path(log_dir).glob("*.log"):
        for line in p.read_text().splitlines():
            stage, ns = line.split()
            out.setdefault(stage, []).append(int(ns))
    return out


class Cost:
    """A transform that costs ``ms`` (busy ``spin`` or ``sleep``) and adds ``add``."""

    def __init__(
        self, ms: float, log_dir: str | None = None, add: float = 1.0, sleep: bool = False
    ) -> None:
        self.ms, self.log_dir, self.add, self.sleep = ms, log_dir, add, sleep

    def __call__(self, x):
        t0 = time.perf_counter_ns()
        time.sleep(self.ms / 1e3) if self.sleep else spin(self.ms)
        out = self.work(x)
        log(self.log_dir, f"transform/{type(self).__name__}", time.perf_counter_ns() - t0)
        return out

    def work(self, x):
        return x + self.add


class AddNoise(Cost):
    """Random: draws from torch's RNG, so seeding matters."""

    def work(self, x):
        return x + self.add + torch.rand(x.shape)


class Scale(Cost):
    pass


class CostDataset(Dataset):
    """Sample i is a small tensor filled with i; loading costs ``load_ms`` (sleep)."""

    def __init__(
        self,
        n: int = 32,
        load_ms: float = 0.0,
        log_dir: str | None = None,
        transform=None,
        fail_at: int | None = None,
    ) -> None:
        self.n, self.load_ms, self.log_dir = n, load_ms, log_dir
        self.transform = transform
        self.fail_at = fail_at
        self.tag = 0.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        t0 = time.perf_counter_ns()
        if i == self.fail_at:
            raise KeyError(f"sample {i} is broken")
        if self.load_ms:
            time.sleep(self.load_ms / 1e3)
        x = torch.full((3,), float(i)) + self.tag
        log(self.log_dir, "load", time.perf_counter_ns() - t0)
        if self.transform is not None:
            x = self.transform(x)
        return x, i


class TellsItsTransform(CostDataset):
    """Sample i comes with 1 where it was fetched unprofiled (the recorder off: its transform
    ran untimed) and 0 where it was timed, from any process."""

    def __getitem__(self, i: int):
        x, _ = super().__getitem__(i)
        return x, int(not recorder().enabled)


class Albumented:
    """A transform called by keyword, albumentations' way: ``t(image=x, mask=m)`` -> a dict."""

    def __call__(self, *, image, mask):
        return {"image": image * 2 + torch.rand(image.shape), "mask": mask + 1}


class KeywordDataset(Dataset):
    """Calls its one transform with keywords only (``Albumented``), as albumentations code does."""

    def __init__(self, n: int = 16) -> None:
        self.n, self.transform = n, Albumented()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        out = self.transform(image=torch.full((3,), float(i)), mask=torch.zeros(2) + i)
        return out["image"], out["mask"]


class ItemsDataset(CostDataset):
    """Has ``__getitems__``: fetches a whole batch in one call."""

    def __getitems__(self, indices):
        return [self[i] for i in indices]


class CostIterable(IterableDataset):
    """Yields ``n`` samples, split across workers; each costs ``load_ms``."""

    def __init__(
        self, n: int = 32, load_ms: float = 0.0, log_dir: str | None = None, transform=None
    ) -> None:
        self.n, self.load_ms, self.log_dir, self.transform = n, load_ms, log_dir, transform

    def __iter__(self):
        info = get_worker_info()
        ids = range(self.n)
        if info is not None:
            ids = ids[info.id :: info.num_workers]
        for i in ids:
            t0 = time.perf_counter_ns()
            if self.load_ms:
                time.sleep(self.load_ms / 1e3)
            x = torch.full((3,), float(i))
            log(self.log_dir, "load", time.perf_counter_ns() - t0)
            yield self.transform(x) if self.transform is not None else x


class CostCollate:
    """``default_collate`` plus ``ms`` of work, logged as ``collate``."""

    def __init__(self, ms: float = 0.0, log_dir: str | None = None) -> None:
        self.ms, self.log_dir = ms, log_dir

    def __call__(self, samples):
        from torch.utils.data import default_collate

        t0 = time.perf_counter_ns()
        spin(self.ms)
        out = default_collate(samples)
        log(self.log_dir, "collate", time.perf_counter_ns() - t0)
        return out


def tag_worker(worker_id: int) -> None:
    """A user worker_init_fn: marks every sample the worker makes."""
    get_worker_info().dataset.tag = 1000.0 * (worker_id + 1)


def own_transform(worker_id: int) -> None:
    """A user worker_init_fn that gives each worker a transform of its own."""
    get_worker_info().dataset.transform = Scale(0.0, add=10.0 * (worker_id + 1))


def tune_transform(worker_id: int) -> None:
    """A user worker_init_fn that sets an attribute on the dataset's transform, in place."""
    get_worker_info().dataset.transform.add = 100.0 * (worker_id + 1)


class EvenFirst(torch.utils.data.Sampler):
    """A custom sampler: even indices, then odd ones."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter([*range(0, self.n, 2), *range(1, self.n, 2)])

    def __len__(self) -> int:
        return self.n


class Pairs(torch.utils.data.Sampler):
    """A custom batch sampler: batches of uneven size."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        i, size = 0, 1
        while i < self.n:
            yield list(range(i, min(self.n, i + size)))
            i += size
            size = size % 3 + 1

    def __len__(self) -> int:
        return sum(1 for _ in self)


class SkewedIterable(CostIterable):
    """``CostIterable`` whose worker ``slow`` pays ``factor`` times ``load_ms`` per sample; each
    worker logs its true load time as ``worker<id>``."""

    def __init__(self, n: int, load_ms: float, log_dir: str, slow: int = 1, factor: float = 3.0):
        super().__init__(n, load_ms, log_dir)
        self.slow, self.factor = slow, factor

    def __iter__(self):
        info = get_worker_info()
        wid = info.id if info is not None else 0
        ms = self.load_ms * (self.factor if wid == self.slow else 1.0)
        for i in range(self.n)[wid :: info.num_workers if info is not None else 1]:
            t0 = time.perf_counter_ns()
            time.sleep(ms / 1e3)
            log(self.log_dir, f"worker{wid}", time.perf_counter_ns() - t0)
            yield torch.full((3,), float(i))


class SlowInit:
    """A ``worker_init_fn`` that sleeps ``ms`` and logs its true duration as ``init``."""

    def __init__(self, ms: float, log_dir: str) -> None:
        self.ms, self.log_dir = ms, log_dir

    def __call__(self, worker_id: int) -> None:
        t0 = time.perf_counter_ns()
        time.sleep(self.ms / 1e3)
        log(self.log_dir, "init", time.perf_counter_ns() - t0)


class TickDataset(CostDataset):
    """Each sample opens ``ticks`` empty ``pipeprof.stage("tick")`` regions and logs what the
    whole run of them cost (``ticks``): pipeprof's own time, since the stages hold no work."""

    def __init__(
        self, n: int, ticks: int, log_dir: str, load_ms: float = 0.0, transform=None
    ) -> None:
        super().__init__(n, load_ms=load_ms, transform=transform)
        self.ticks, self.tick_log = ticks, log_dir

    def __getitem__(self, i: int):
        import pipeprof

        t0 = time.perf_counter_ns()
        for _ in range(self.ticks):
            with pipeprof.stage("tick"):
                pass
        log(self.tick_log, "ticks", time.perf_counter_ns() - t0)
        return super().__getitem__(i)


class BigSamples(Dataset):
    """Samples ready at once (no cost) but large: ``kb`` KiB of float32 each, so a batch is all
    hand-over (shared memory, unpickling in the training process) and no stage."""

    def __init__(self, n: int, kb: int = 512) -> None:
        self.n, self.numel = n, kb * 256

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((self.numel,), float(i))


class TorchWork:
    """A transform that computes ``ms`` of this thread's CPU in torch (matrix products, which
    release the GIL as real tensor transforms do), then returns its input unchanged."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, x):
        a = torch.ones(128, 128)
        end = time.thread_time_ns() + int(self.ms * 1e6)
        while time.thread_time_ns() < end:
            a = torch.mm(a, a).clamp_(max=1.0)
        return x


class SlowCopy:
    """A batch whose ``.to(device)`` takes ``ms`` (a sleep): a host-to-device copy of known cost."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def to(self, device, non_blocking: bool = False):
        time.sleep(self.ms / 1e3)
        return self


def slow_copy_collate(samples):
    return SlowCopy(10.0)


class Sometimes(Dataset):
    """Loading a sample costs ``ms`` (sleep) with probability ``p``, else nothing: a wait that
    varies from step to step, so identical runs differ (an unseeded RNG, as in real loaders)."""

    def __init__(self, n: int, p: float, ms: float) -> None:
        import random

        self.n, self.p, self.ms, self.rng = n, p, ms, random.Random()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.rng.random() < self.p:
            time.sleep(self.ms / 1e3)
        return torch.zeros(3), i


class SaysItsProbeBase(Dataset):
    """Each sample is the probe base its worker holds when it fetches (NOTE [ In-situ region
    cost ]): the training process's, handed over by the profiled loader's worker init."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        from pipeprof.core import recorder

        return torch.tensor(list(recorder._PROBE_BASE) or [-1])


@pipeprof.stage("decode")
def decode(x: int) -> torch.Tensor:
    """A module-level function decorated as a stage: spawned workers find it by name."""
    spin(1.0)
    return torch.full((2,), float(x))


class DecoratedStages(Dataset):
    """Its stages are decorated: a module-level function, a method, and one called with
    several arguments (``@pipeprof.stage``)."""

    def __len__(self) -> int:
        return 12

    @pipeprof.stage("augment")
    def augment(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x * scale

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.augment(decode(i), scale=2.0)


def plain_and_profiled(loader: Any) -> tuple[list[Any], list[Any], pipeprof.Profiler]:
    """One pass of ``loader`` plain, then one profiled (no host sampler): both passes' batches,
    and the profiler, whose report holds the second."""
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(loader))
    return plain, got, prof


def same_batches(plain: list[Any], got: list[Any]) -> bool:
    """Whether two passes gave the same batches: the same types and keys, tensors equal."""

    def same(a: Any, b: Any) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        if isinstance(a, dict) or hasattr(a, "keys"):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return bool(a == b)

    return len(plain) == len(got) and all(same(a, b) for a, b in zip(plain, got))
