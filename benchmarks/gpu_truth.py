"""pipeprof's GPU paths against the GPU's own truth, in one run (docs/gpu.md says what each
check means; the first session with a GPU machine runs it and records the figures there).

Each check measures a truth with plain CUDA calls (events, ``torch.cuda.synchronize``) and the
same thing through pipeprof, side by side, and writes both; none asserts. A check that raises is
recorded with its traceback and the others go on.

    PYTHONPATH=. python3 benchmarks/gpu_truth.py --out "$OUT"          # every check
    PYTHONPATH=. python3 benchmarks/gpu_truth.py --only timer,nccl      # some

- ``timer``: a region of known GPU duration (``torch.cuda._sleep``, calibrated with events):
  ``Timer(backend="cuda")`` against the truth (expect within 5 %), and the CPU clock's reading of
  the same region (the launch only, far below).
- ``loops``: pipeprof's wait fraction against a plain loop that synchronises the GPU at each
  step's end and times its waits in ``next()`` (``wait_fraction_error``), with NVML's samples
  (20 Hz, GPU 0) and the GPU utilisation while waiting vs computing. Four cases:
  ``gpu_bound`` (ready data, a ~19 ms step: wait < 5 %); ``input_bound`` (1 ms samples, a light
  step: within 0.03 of the truth, utilisation near 0 in both); ``async_overlap`` (one worker,
  300 ms a sample; the step launches 300 ms of kernels and does not synchronise, so the GPU
  runs them while the host waits in the next ``next()``: that wait is GPU compute, pipeprof's
  wait fraction should match the synchronised truth's (low) with the rest in
  ``wait_moved_to_gpu_compute_s``, and NVML reads high both while "waiting" and computing);
  ``alternating`` (one worker, 600 ms a sample, 12 steps; the step runs 300 ms of kernels and
  synchronises, so the GPU is idle ~300 ms of each step while the host waits: wait ≈ 0.5,
  utilisation while waiting low, while computing high, ``idle_while_waiting_fraction`` ≈ the
  wait fraction; ``nvml_util`` lists the 20 Hz samples, to see how NVML's own sample period
  smears the edges).
- ``transfer``: a 38.5 MB batch (64×3×224×224 float32) from a 2-worker loader. The truth is the
  same loader's batches iterated plainly, each copied to the GPU as it arrives (CUDA events
  around the copy, then synchronised; pipeprof times ``transfer/h2d`` the same way) and then
  copied again, for pageable and ``pin_memory=True`` batches, each with ``non_blocking`` False
  and True (``loader_*``: ``first_ms`` vs ``again_ms``). Batches from workers arrive in fresh
  shared memory, so the first read of their pages faults; ``touch_*`` measures that on the CPU
  directly: a single-threaded ``batch.sum()`` first vs again, with the thread's minor page
  faults. ``resident_*``: a long-resident ``torch.randn`` tensor's copy, the copy bandwidth
  the GPU reaches. pipeprof: ``pipeprof.profile(loader, device="cuda")``, which copies with
  ``non_blocking=pin_memory`` itself, so expect ``pipeprof_pageable`` ≈
  ``loader_pageable_blocking.first_ms`` (not the resident copy) and ``pipeprof_pinned`` ≈
  ``loader_pinned_non_blocking.first_ms`` (``vs_truth`` near 1).
- ``overhead``: steps/s plain, under pipeprof and under torch.profiler, 7 interleaved rounds
  (the order rotates each round), medians and each round, timed inside the profiled block
  (start and stop left out), for two loops: ``launch_bound`` (64×2048 @ 2048×2048, 100 matmuls,
  ~3 ms a step, bound by the CPU launching kernels: what a profiler's CPU cost shows in) and
  ``gpu_bound`` (1024 rows, ~19 ms a step on the GPU, the CPU far ahead: expect ~0 slowdown).
  Each loop's plain GPU and host (launch) ms a step say which bound it is. Beside the measured
  ``pipeprof_slowdown``, pipeprof's own estimate of its cost (``pipeprof_estimated``, from the
  report's ``overhead``: ``estimated_fraction`` of the CPU the run used; ``estimated_s`` over
  the timed loop, which also counts start, stop and the sampler thread; and the parts on the
  loop's thread over the timed loop, the one to set against a launch-bound loop's slowdown).
- ``nccl``: DDP on NCCL (one rank) with ``Profiler.time_comm``: the GPU view of the all-reduce
  (``meta.comm.gpu``) is there, one step per step, and training is unchanged
  (``max_weight_difference`` 0).

On an H200 the whole run takes about 2½ minutes (the first run of the earlier checks took 76 s).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof


def sync_ms(fn: Any, *args: Any) -> float:
    """``fn(*args)``'s GPU time by two events on the current stream."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn(*args)
    b.record()
    b.synchronize()
    return float(a.elapsed_time(b))


def sleep_cycles(ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` that take about ``ms`` on this GPU."""
    cycles = 1_000_000
    took = statistics.median(sync_ms(torch.cuda._sleep, cycles) for _ in range(5))
    return int(cycles * ms / took)


def p50(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ---- the CUDA-event timer -----------------------------------------------------------------


def check_timer() -> dict[str, Any]:
    cycles = sleep_cycles(20.0)
    truth = [sync_ms(torch.cuda._sleep, cycles) for _ in range(20)]
    out: dict[str, Any] = {"truth_ms": statistics.median(truth)}
    for backend in ("cuda", "cpu"):
        timer = pipeprof.Timer(backend=backend)
        for _ in range(20):
            with timer.region("Forward"):
                torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        timer.flush()
        out[f"{backend}_timer_ms"] = timer.stats()["Forward"]["mean_ms"]
    out["cuda_vs_truth"] = out["cuda_timer_ms"] / out["truth_ms"]
    out["cpu_vs_truth"] = out["cpu_timer_ms"] / out["truth_ms"]
    return out


# ---- loops: GPU-bound, input-bound, asynchronous and alternating ------------------------------


class Slow(Dataset):
    """Samples that each take ``ms`` of CPU (a sleep) to make: an input-bound loader."""

    def __init__(self, n: int, ms: float, shape: tuple[int, ...]) -> None:
        self.n, self.ms, self.shape = n, ms, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return torch.full(self.shape, float(i % 7))


def make_loader(n: int, ms: float, shape: tuple[int, ...], batch: int, workers: int,
           pin: bool = False) -> DataLoader:  # fmt: skip
    """A loader of ``n`` samples of ``ms`` each, in ``workers`` forked workers."""
    return DataLoader(Slow(n, ms, shape), batch_size=batch, num_workers=workers,
                      pin_memory=pin, multiprocessing_context="fork")  # fmt: skip


def model_step(w: torch.Tensor, reps: int) -> Any:
    def step(x: torch.Tensor) -> None:
        y = x
        for _ in range(reps):
            y = torch.tanh(y @ w)

    return step


def plain_wait(loader: DataLoader, step: Any) -> dict[str, float]:
    """The truth: the loop's wait in ``next()``, with the GPU synchronised at each step's end."""
    t0 = time.perf_counter()
    it = iter(loader)  # workers start here: wait, as pipeprof counts it in the first next()
    waited = time.perf_counter() - t0
    while True:
        t = time.perf_counter()
        try:
            x = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - t
        step(x.cuda(non_blocking=True))
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    return {"wait_fraction": waited / total, "loop_s": total}


def profiled(loader: DataLoader, step: Any, series: bool = False) -> dict[str, Any]:
    """The same loop under ``Profiler(device="cuda:0")``; ``series``: NVML's utilisation
    samples too, one figure each ("-": n/a), at 20 Hz from the profiler's start."""
    prof = pipeprof.Profiler(device="cuda:0", sample_hz=20)  # cuda:0 maps to NVML's index
    with prof:
        for x in prof.wrap(loader):
            step(x)
    r = prof.report().to_dict()
    loop, gpu = r["loop"], r.get("gpu") or {}
    tl = gpu.get("timeline") or {}
    t_ns = tl.get("t_ns") or []
    out = {
        "verdict": r["verdict"].get("kind"),
        "wait_fraction": loop["wait_fraction"],
        "steady_wait_fraction": loop["steady"]["wait_fraction"],
        "compute_fraction": loop["compute_fraction"],
        "gpu_compute_s": loop["gpu_compute_s"],
        "wait_moved_to_gpu_compute_s": loop["wait_moved_to_gpu_compute_s"],
        "gpu_util_waiting": loop.get("gpu_util_waiting"),
        "gpu_util_computing": loop.get("gpu_util_computing"),
        "idle_while_waiting_fraction": loop.get("idle_while_waiting_fraction"),
        "nvml_available": gpu.get("available"),
        "nvml_note": gpu.get("note"),
        "nvml_devices": [(d.get("index"), d.get("name")) for d in gpu.get("devices") or []],
        "nvml_samples": len(t_ns),
        "nvml_rate_hz": (len(t_ns) - 1) / ((t_ns[-1] - t_ns[0]) / 1e9) if len(t_ns) > 1 else None,
        "transfer_fraction": loop["transfer_fraction"],
        "wall_s": loop["wall_s"],
    }
    if series:
        util = [row[0] if row else None for row in tl.get("util") or []]
        out["nvml_util"] = " ".join("-" if u is None else f"{u:.0f}" for u in util)
    return out


def check_loops() -> dict[str, Any]:
    w = torch.randn(2048, 2048, device="cuda") / 45
    out: dict[str, Any] = {}
    # GPU-bound: ready data (1024 rows a batch), a heavy step
    fast = make_loader(1024 * 200, 0.0, (2048,), batch=1024, workers=4, pin=True)
    out["gpu_bound"] = {"plain": plain_wait(fast, model_step(w, 100)),
                        "pipeprof": profiled(fast, model_step(w, 100))}  # fmt: skip
    # input-bound: 64 samples of 1 ms each over 2 workers, a light step
    slow = make_loader(64 * 60, 1.0, (2048,), batch=64, workers=2, pin=True)
    out["input_bound"] = {"plain": plain_wait(slow, model_step(w, 5)),
                          "pipeprof": profiled(slow, model_step(w, 5))}  # fmt: skip

    cycles = sleep_cycles(300.0)
    kernel_ms = statistics.median(sync_ms(torch.cuda._sleep, cycles) for _ in range(3))

    def launch(x: torch.Tensor) -> None:  # returns at once: the GPU runs on into next()
        torch.cuda._sleep(cycles)

    def launch_and_sync(x: torch.Tensor) -> None:  # the GPU is idle from here to the next step
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()

    # async_overlap: 300 ms a sample, 300 ms of kernels not waited for: the host's wait in
    # next() is GPU compute (NVML high while "waiting"), the truth's wait fraction is low
    pace = make_loader(20, 300.0, (8,), batch=1, workers=1)
    out["async_overlap"] = {"plain": plain_wait(pace, launch),
                            "pipeprof": profiled(pace, launch, series=True),
                            "sample_ms": 300.0, "kernel_ms": kernel_ms}  # fmt: skip
    # alternating: 600 ms a sample against 300 ms of kernels, synchronised in the step: the
    # GPU is idle ~300 ms of each step while the host waits (NVML low while waiting)
    paced = make_loader(12, 600.0, (8,), batch=1, workers=1)
    out["alternating"] = {"plain": plain_wait(paced, launch_and_sync),
                          "pipeprof": profiled(paced, launch_and_sync, series=True),
                          "sample_ms": 600.0, "kernel_ms": kernel_ms}  # fmt: skip
    for case in out.values():
        case["wait_fraction_error"] = case["pipeprof"]["wait_fraction"] - case["plain"][
            "wait_fraction"]  # fmt: skip
    return out


# ---- host-to-device transfer ------------------------------------------------------------------


TRANSFER_SHAPE = (64, 3, 224, 224)  # 38.5 MB a batch of float32
TRANSFER_BATCHES = 12


def transfer_loader(pinned: bool) -> DataLoader:
    """The transfer check's loader: 12 batches from 2 workers, in fresh shared memory."""
    n = TRANSFER_SHAPE[0] * TRANSFER_BATCHES
    return make_loader(n, 0.0, TRANSFER_SHAPE[1:], batch=TRANSFER_SHAPE[0], workers=2, pin=pinned)


def loader_copies(pinned: bool, non_blocking: bool, nbytes: int) -> dict[str, Any]:
    """The truth for the loader's batches: each batch's first copy as it arrives, then a
    second copy of the same batch (its pages touched by then)."""
    first, again, host = [], [], []
    for batch in transfer_loader(pinned):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        batch.to("cuda", non_blocking=non_blocking)
        b.record()
        host.append((time.perf_counter() - t0) * 1e3)
        b.synchronize()
        first.append(float(a.elapsed_time(b)))
        again.append(sync_ms(functools.partial(batch.to, "cuda", non_blocking=non_blocking)))
    ms = p50(first)
    return {
        "non_blocking": non_blocking,
        "first_ms": ms,
        "first_mean_ms": statistics.fmean(first) if first else None,
        "again_ms": p50(again),
        "first_gb_s": nbytes / ms / 1e6 if ms else None,
        "host_held_ms": p50(host),  # the call's time on the host, before synchronising
        "first_each_ms": [round(x, 2) for x in first],
    }


def touches(pinned: bool) -> dict[str, Any]:
    """A received batch read on the CPU (one thread, as the driver's staging copy is):
    ``batch.sum()`` first and again, with the minor page faults of the reading thread."""
    import resource

    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    threads = torch.get_num_threads()
    first, again, f_first, f_again = [], [], [], []
    torch.set_num_threads(1)
    try:
        for batch in transfer_loader(pinned):
            for times, faults in ((first, f_first), (again, f_again)):
                f0 = resource.getrusage(who).ru_minflt
                t0 = time.perf_counter()
                batch.sum()
                times.append((time.perf_counter() - t0) * 1e3)
                faults.append(resource.getrusage(who).ru_minflt - f0)
    finally:
        torch.set_num_threads(threads)
    return {
        "first_ms": p50(first),
        "again_ms": p50(again),
        "fault_cost_ms": p50([a - b for a, b in zip(first, again)]),
        "first_faults": p50(f_first),
        "again_faults": p50(f_again),
        "rusage": "thread" if who != resource.RUSAGE_SELF else "process",
    }


def check_transfer() -> dict[str, Any]:
    nbytes = 4 * TRANSFER_SHAPE[0] * TRANSFER_SHAPE[1] * TRANSFER_SHAPE[2] * TRANSFER_SHAPE[3]
    out: dict[str, Any] = {"batch_mb": nbytes / 1e6, "batches": TRANSFER_BATCHES}
    kinds = {False: "pageable", True: "pinned"}
    # the copy bandwidth the GPU reaches: a resident tensor, its pages touched long ago
    for pinned, name in kinds.items():
        host = torch.randn(*TRANSFER_SHAPE)
        if pinned:
            host = host.pin_memory()
        copy = functools.partial(host.to, "cuda", non_blocking=pinned)
        ms = statistics.median(sync_ms(copy) for _ in range(10))
        out[f"resident_{name}"] = {"non_blocking": pinned, "ms": ms, "gb_s": nbytes / ms / 1e6}
    # the truth for pipeprof's figures: the same loader's batches, copied as they arrive
    for pinned, name in kinds.items():
        for nb in (False, True):
            mode = "non_blocking" if nb else "blocking"
            out[f"loader_{name}_{mode}"] = loader_copies(pinned, nb, nbytes)
    # the first read of a received batch's pages, on the CPU
    for pinned, name in kinds.items():
        out[f"touch_{name}"] = touches(pinned)
    # pipeprof: profile() copies with non_blocking=pin_memory, so pageable batches blocking and
    # pinned ones non-blocking; its transfer/h2d is compared with that mode's first copies
    for pinned, name in kinds.items():
        stages = pipeprof.profile(transfer_loader(pinned), device="cuda").to_dict()["stages"]
        h2d = stages.get("transfer/h2d") or {}
        pin = stages.get("transfer/pin") or {}
        truth = out[f"loader_{name}_{'non_blocking' if pinned else 'blocking'}"]["first_ms"]
        out[f"pipeprof_{name}"] = {
            "non_blocking": pinned,  # chosen by pipeprof: non_blocking=loader.pin_memory
            "h2d_mean_ms": h2d.get("mean_ms"),
            "h2d_p50_ms": h2d.get("p50_ms"),
            "pin_mean_ms": pin.get("mean_ms"),
            "h2d_gb_s": nbytes / h2d["p50_ms"] / 1e6 if h2d.get("p50_ms") else None,
            "vs_truth": h2d["p50_ms"] / truth if h2d.get("p50_ms") and truth else None,
        }
    return out


# ---- overhead on a launch-bound and a GPU-bound loop -------------------------------------------


OWN_KEYS = ("estimated_fraction", "basis", "estimated_s", "regions_s", "main_s", "loop_s",
            "sampler_s", "control_s", "settle_s", "events")  # fmt: skip


def overhead_loop(rows: int, reps: int, n: int, rounds: int) -> dict[str, Any]:
    """``n`` steps of ``reps`` matmuls (``rows``×2048 @ 2048×2048, float32) a second: plain,
    under pipeprof and under torch.profiler, rounds interleaved (the order rotates), timed
    inside the profiled block (start and stop, e.g. torch.profiler's trace processing at exit,
    are left out of all three); pipeprof's own estimate of its cost beside."""
    w = torch.randn(2048, 2048, device="cuda") / 45
    step = model_step(w, reps)
    data = [torch.randn(rows, 2048).pin_memory() for _ in range(8)]
    own: list[dict[str, Any]] = []

    def steps() -> float:
        t0 = time.perf_counter()
        for i in range(n):
            step(data[i % 8].cuda(non_blocking=True))
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def run(kind: str, keep: bool = True) -> float:
        torch.cuda.synchronize()
        if kind == "plain":
            return n / steps()
        if kind == "pipeprof":
            prof = pipeprof.Profiler(sample_hz=10)
            with prof:
                t0 = time.perf_counter()
                for x in prof.wrap([data[i % 8] for i in range(n)]):
                    step(x.cuda(non_blocking=True))
                torch.cuda.synchronize()
                took = time.perf_counter() - t0
            if keep:  # what pipeprof says it cost, against the timed loop
                o = prof.report().to_dict().get("overhead") or {}
                row = {k: o.get(k) for k in OWN_KEYS}
                est = o.get("estimated_s")
                row["estimated_over_loop"] = est / took if est is not None else None
                # on the loop's own thread (the samplers run beside it, start and stop outside)
                on_thread = [o.get(k) for k in ("regions_s", "main_s", "loop_s")]
                row["on_thread_over_loop"] = (
                    sum(on_thread) / took if None not in on_thread else None
                )
                own.append(row)
            return n / took
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            return n / steps()

    x = data[0].cuda()
    step(x)
    torch.cuda.synchronize()
    gpu_ms = statistics.median(sync_ms(step, x) for _ in range(3))
    host_ms = []
    for _ in range(3):
        t0 = time.perf_counter()
        step(x)
        host_ms.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    kinds = ("plain", "pipeprof", "torch.profiler")
    for kind in kinds:
        run(kind, keep=False)  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds[r % 3 :] + kinds[: r % 3]:
            rates[kind].append(run(kind))
    med = {k: statistics.median(v) for k, v in rates.items()}
    keys = ("estimated_fraction", "estimated_over_loop", "on_thread_over_loop")
    shares = {k: [o[k] for o in own if o[k] is not None] for k in keys}
    return {
        "step": f"{reps} × tanh({rows}×2048 @ 2048×2048), float32",
        "steps": n,
        "gpu_ms_per_step": gpu_ms,  # the step's kernels, by events
        "host_ms_per_step": statistics.median(host_ms),  # launching them; ≈ gpu: launch-bound
        "steps_per_s": med,
        "rounds": rates,
        "pipeprof_slowdown": med["plain"] / med["pipeprof"] - 1,
        "torch_profiler_slowdown": med["plain"] / med["torch.profiler"] - 1,
        # pipeprof's own estimate (the report's "overhead"), medians of the rounds: its
        # estimated_fraction (of the CPU the run used), its estimated_s over the timed loop,
        # and its parts on the loop's thread (regions_s + main_s + loop_s) over the timed loop
        "pipeprof_estimated": {k: p50(v) for k, v in shares.items()},
        "pipeprof_estimated_rounds": shares,
        "pipeprof_overhead_last": own[-1] if own else None,  # the last round's parts
    }


def check_overhead(rounds: int = 7) -> dict[str, Any]:
    return {
        "launch_bound": overhead_loop(rows=64, reps=100, n=200, rounds=rounds),
        "gpu_bound": overhead_loop(rows=1024, reps=100, n=40, rounds=rounds),
    }


# ---- DDP on NCCL ------------------------------------------------------------------------------


LOOP_KEYS = ("steps", "compute_s", "comm_s", "wait_s", "gpu_compute_s", "compute_moved_to_comm_s")


def check_nccl() -> dict[str, Any]:
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl", store=dist.FileStore(f"{tmp}/s", 1), rank=0,
                                world_size=1, timeout=timedelta(seconds=60))  # fmt: skip
        try:
            for timed in (False, True):
                torch.manual_seed(0)
                net = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(12)]).cuda()
                model = DDP(net, bucket_cap_mb=25)
                opt = torch.optim.SGD(model.parameters(), lr=1e-3)
                prof = pipeprof.Profiler(sample_hz=0)
                if timed:
                    prof.time_comm(model)
                x = torch.randn(256, 2048, device="cuda")
                with prof:
                    for _ in prof.wrap(range(40)):
                        opt.zero_grad()
                        model(x).square().mean().backward()
                        opt.step()
                torch.cuda.synchronize()
                r = prof.report().to_dict()
                key = "timed" if timed else "untimed"
                out[key] = {
                    "weights": [p.detach().double().cpu() for p in net.parameters()],
                    "comm": r["meta"].get("comm"),
                    "loop": {k: r["loop"][k] for k in LOOP_KEYS},
                }
        finally:
            dist.destroy_process_group()
    pairs = zip(out["timed"].pop("weights"), out["untimed"].pop("weights"))
    out["max_weight_difference"] = max(float((a - b).abs().max()) for a, b in pairs)
    return out


CHECKS = {"timer": check_timer, "loops": check_loops, "transfer": check_transfer,
          "overhead": check_overhead, "nccl": check_nccl}  # fmt: skip


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                           "python": sys.version.split()[0]}  # fmt: skip
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    env["start_method"] = multiprocessing.get_start_method(allow_none=True)
    # float32 matmuls on tensor cores (TF32) or not: what the loops' step times depend on
    env["matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
    env["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    env["cpu_count"] = os.cpu_count()
    env["cpus_usable"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    env["torch_threads"] = torch.get_num_threads()
    env["nvidia_ml_py"] = package_version("nvidia-ml-py") or package_version("pynvml")
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as e:  # recorded, not fatal
        env["driver"] = f"n/a: {e}"
    return env


def package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-truth")
    ap.add_argument("--only", default=",".join(CHECKS), help="checks, comma-separated")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error(f"unknown check(s) {unknown}; choose from {', '.join(CHECKS)}")
    if not torch.cuda.is_available():
        print("gpu_truth.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"environment": environment()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        t0 = time.perf_counter()
        try:
            results[name] = CHECKS[name]()
        except Exception:  # one broken check must not hide the others
            results[name] = {"error": traceback.format_exc()}
        results[name]["check_s"] = round(time.perf_counter() - t0, 1)
        print(f"== {name}\n{json.dumps(results[name], indent=1, default=str)}", flush=True)
        (out / "gpu_truth.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
