"""pipeprof's GPU paths against the GPU's own truth, in one run (docs/gpu.md says what each
check means; the first session with a GPU machine runs it and records the figures there).

Each check measures a truth with plain CUDA calls (events, ``torch.cuda.synchronize``) and the
same thing through pipeprof, side by side, and writes both; none asserts. A check that raises is
recorded with its traceback and the others go on.

    PYTHONPATH=. python3 benchmarks/gpu_truth.py --out "$OUT"          # every check
    PYTHONPATH=. python3 benchmarks/gpu_truth.py --only timer,nccl      # some

- ``timer``: a region of known GPU duration (``torch.cuda._sleep``, calibrated with events):
  ``Timer(backend="cuda")`` against the truth, and the CPU clock's reading of the same region.
- ``loops``: a GPU-bound loop (wait should be < 5 %) and an input-bound one, whose wait fraction
  is compared with a plain loop that synchronises around ``next()``; NVML's samples and the GPU
  utilisation while waiting vs computing.
- ``transfer``: ``transfer/h2d`` (and ``transfer/pin``) per batch for pageable and pinned
  loaders, against event-timed copies of the same bytes and the copy bandwidth.
- ``overhead``: a GPU-bound loop's throughput plain, under pipeprof and under torch.profiler,
  rounds interleaved, medians.
- ``nccl``: DDP on NCCL (one rank) with ``Profiler.time_comm``: the GPU view of the all-reduce
  (``meta.comm.gpu``) is there, one step per step, and training is unchanged.
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


# ---- loops: GPU-bound and input-bound --------------------------------------------------------


class Slow(Dataset):
    """Samples that each take ``ms`` of CPU (a sleep) to make: an input-bound loader."""

    def __init__(self, n: int, ms: float, shape: tuple[int, ...]) -> None:
        self.n, self.ms, self.shape = n, ms, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return torch.full(self.shape, float(i % 7))


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


def profiled(loader: DataLoader, step: Any) -> dict[str, Any]:
    prof = pipeprof.Profiler(device="cuda:0", sample_hz=20)  # cuda:0 maps to NVML's index
    with prof:
        for x in prof.wrap(loader):
            step(x)
    r = prof.report().to_dict()
    loop, gpu = r["loop"], r.get("gpu") or {}
    t_ns = (gpu.get("timeline") or {}).get("t_ns") or []
    return {
        "verdict": r["verdict"].get("kind"),
        "wait_fraction": loop["wait_fraction"],
        "steady_wait_fraction": loop["steady"]["wait_fraction"],
        "compute_fraction": loop["compute_fraction"],
        "gpu_compute_s": loop["gpu_compute_s"],
        "wait_moved_to_gpu_compute_s": loop["wait_moved_to_gpu_compute_s"],
        "gpu_util_waiting": loop.get("gpu_util_waiting"),
        "gpu_util_computing": loop.get("gpu_util_computing"),
        "nvml_available": gpu.get("available"),
        "nvml_note": gpu.get("note"),
        "nvml_devices": [(d.get("index"), d.get("name")) for d in gpu.get("devices") or []],
        "nvml_samples": len(t_ns),
        "nvml_rate_hz": (len(t_ns) - 1) / ((t_ns[-1] - t_ns[0]) / 1e9) if len(t_ns) > 1 else None,
        "transfer_fraction": loop["transfer_fraction"],
        "wall_s": loop["wall_s"],
    }


def check_loops() -> dict[str, Any]:
    w = torch.randn(2048, 2048, device="cuda") / 45
    out: dict[str, Any] = {}
    # GPU-bound: ready data (1024 rows a batch), a heavy step
    fast = DataLoader(Slow(1024 * 200, 0.0, (2048,)), batch_size=1024, num_workers=4,
                      pin_memory=True, multiprocessing_context="fork")  # fmt: skip
    out["gpu_bound"] = {"plain": plain_wait(fast, model_step(w, 100)),
                        "pipeprof": profiled(fast, model_step(w, 100))}  # fmt: skip
    # input-bound: 64 samples of 1 ms each over 2 workers, a light step
    slow = DataLoader(Slow(64 * 60, 1.0, (2048,)), batch_size=64, num_workers=2,
                      pin_memory=True, multiprocessing_context="fork")  # fmt: skip
    out["input_bound"] = {"plain": plain_wait(slow, model_step(w, 5)),
                          "pipeprof": profiled(slow, model_step(w, 5))}  # fmt: skip
    # alternating: 300 ms without data, 300 ms of kernels, so NVML's samples can tell them apart
    cycles = sleep_cycles(300.0)
    pace = DataLoader(Slow(20, 300.0, (8,)), batch_size=1, num_workers=1,
                      multiprocessing_context="fork")  # fmt: skip
    def kernels(x: torch.Tensor) -> None:
        torch.cuda._sleep(cycles)

    out["alternating"] = {"plain": plain_wait(pace, kernels),
                          "pipeprof": profiled(pace, kernels)}  # fmt: skip
    for case in out.values():
        case["wait_fraction_error"] = case["pipeprof"]["wait_fraction"] - case["plain"][
            "wait_fraction"]  # fmt: skip
    return out


# ---- host-to-device transfer ------------------------------------------------------------------


def check_transfer() -> dict[str, Any]:
    shape = (64, 3, 224, 224)  # 38.5 MB a batch of float32
    nbytes = 4 * 64 * 3 * 224 * 224
    out: dict[str, Any] = {"batch_mb": nbytes / 1e6}
    for pinned in (False, True):
        host = torch.randn(*shape)
        if pinned:
            host = host.pin_memory()
        copy = functools.partial(host.to, "cuda", non_blocking=pinned)
        copies = [sync_ms(copy) for _ in range(10)]
        ms = statistics.median(copies)
        out[f"plain_{'pinned' if pinned else 'pageable'}"] = {"ms": ms,
                                                             "gb_s": nbytes / ms / 1e6}  # fmt: skip
        loader = DataLoader(Slow(64 * 12, 0.0, shape[1:]), batch_size=64, num_workers=2,
                            pin_memory=pinned, multiprocessing_context="fork")  # fmt: skip
        main = pipeprof.profile(loader, device="cuda").to_dict()["stages"]
        h2d = main.get("transfer/h2d") or {}
        pin = main.get("transfer/pin") or {}
        out[f"pipeprof_{'pinned' if pinned else 'pageable'}"] = {
            "h2d_mean_ms": h2d.get("mean_ms"),
            "h2d_p50_ms": h2d.get("p50_ms"),
            "pin_mean_ms": pin.get("mean_ms"),
            "h2d_gb_s": nbytes / h2d["p50_ms"] / 1e6 if h2d.get("p50_ms") else None,
        }
    return out


# ---- overhead on a GPU-bound loop -------------------------------------------------------------


def check_overhead(rounds: int = 5) -> dict[str, Any]:
    w = torch.randn(2048, 2048, device="cuda") / 45
    step = model_step(w, 100)
    data = [torch.randn(64, 2048).pin_memory() for _ in range(8)]

    def run(kind: str) -> float:
        """Steps a second inside the profiled loop (start and stop, e.g. torch.profiler's trace
        processing at exit, are left out of both)."""
        n = 200
        torch.cuda.synchronize()
        if kind == "plain":
            t0 = time.perf_counter()
            for i in range(n):
                step(data[i % 8].cuda(non_blocking=True))
            torch.cuda.synchronize()
            return n / (time.perf_counter() - t0)
        if kind == "pipeprof":
            prof = pipeprof.Profiler(sample_hz=10)
            with prof:
                t0 = time.perf_counter()
                for x in prof.wrap([data[i % 8] for i in range(n)]):
                    step(x.cuda(non_blocking=True))
                torch.cuda.synchronize()
                return n / (time.perf_counter() - t0)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            t0 = time.perf_counter()
            for i in range(n):
                step(data[i % 8].cuda(non_blocking=True))
            torch.cuda.synchronize()
            return n / (time.perf_counter() - t0)

    kinds = ("plain", "pipeprof", "torch.profiler")
    for kind in kinds:
        run(kind)  # warm-up
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for kind in kinds:
            rates[kind].append(run(kind))
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"steps_per_s": med, "rounds": rates,
            "pipeprof_slowdown": med["plain"] / med["pipeprof"] - 1,
            "torch_profiler_slowdown": med["plain"] / med["torch.profiler"] - 1}  # fmt: skip


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
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as e:  # recorded, not fatal
        env["driver"] = f"n/a: {e}"
    return env


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
