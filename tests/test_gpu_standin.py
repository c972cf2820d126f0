"""The GPU paths with stand-ins at the torch.cuda boundary (this machine has no GPU).

The Profiler's correction of compute time for asynchronous kernels and the CUDA-event timing of
host-to-device copies run here against ``fake_cuda.FakeGPU``, whose clock the test moves as the
"kernels" run. docs/gpu.md says what this does not prove and how to check it on a real GPU.
"""

from __future__ import annotations

import html
import time

import pytest
import torch
from fake_cuda import FakeGPU

from pipeprof import Profiler
from pipeprof.collect.torch.loader import H2DTimer
from pipeprof.core.recorder import Recorder


def test_this_machine_has_no_gpu():
    """Everything in this file is a stand-in. On a GPU machine this fails on purpose: there the
    real paths are the ones to check (docs/gpu.md), not these."""
    assert not torch.cuda.is_available()
    pynvml = pytest.importorskip("pynvml")  # nvidia-ml-py is a dependency: never skipped here
    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlInit()


class Slow:
    """Batches that each take ``sleep_s`` to arrive (a loader that is slower than the GPU)."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __iter__(self):
        for i in range(self.n):
            time.sleep(self.sleep_s)
            yield torch.full((4, 2), float(i))


@pytest.mark.timing
def test_wait_moves_to_compute_where_cuda_events_saw_the_gpu_busy():
    """Kernels launched asynchronously run on while the CPU waits for the next batch: the CPU
    sees almost no compute, CUDA events see 15 ms per step, and that time is compute, not wait."""
    gpu, steps, kernel_ms, sleep_s = FakeGPU(), 12, 15.0, 0.02
    syncs_in_loop = []
    prof = Profiler(sample_hz=0, timer="cuda", event_factory=gpu.event)
    with prof:
        for _ in prof.wrap(Slow(steps, sleep_s)):
            gpu.now_ms += kernel_ms  # this step's kernels, queued and returning at once
            syncs_in_loop.append(gpu.syncs)
    loop = prof.report()["loop"]
    assert set(syncs_in_loop) == {0}, "the loop was synchronised per step"
    assert loop["gpu_compute_s"] == pytest.approx(steps * kernel_ms / 1e3, abs=1e-9)
    moved = loop["wait_moved_to_gpu_compute_s"]
    cpu_compute = loop["compute_s"] - moved
    assert 0 <= cpu_compute < 0.005  # the CPU side of each step is a few microseconds
    assert moved == pytest.approx(steps * kernel_ms / 1e3 - cpu_compute, abs=1e-6)
    raw_wait = loop["wait_s"] + moved
    assert raw_wait >= steps * sleep_s * 0.99  # the sleeps, as the CPU waited them
    # what is left as wait is the time the GPU had nothing to do: sleep - kernel per step
    assert loop["wait_s"] == pytest.approx(raw_wait - steps * kernel_ms / 1e3 + cpu_compute)
    assert loop["wait_s"] < raw_wait - 0.15


def test_without_cuda_events_the_cpu_view_stands():
    """The same loop on the CPU timer: no events, nothing moved (the correction is CUDA's)."""
    prof = Profiler(sample_hz=0, timer="cpu")
    with prof:
        for _ in prof.wrap(Slow(4, 0.005)):
            pass
    loop = prof.report()["loop"]
    assert loop["gpu_compute_s"] is None
    assert loop["wait_moved_to_gpu_compute_s"] == 0


def test_cuda_copies_are_timed_by_events_read_back_in_groups():
    """transfer/h2d on CUDA: each copy bracketed by two events, read back every FLUSH_EVERY
    copies (one synchronisation per copy then, none per step before)."""
    gpu = FakeGPU()
    copies = []

    def copy(batch, device, non_blocking):
        copies.append((device.type, non_blocking))
        gpu.now_ms += 2.5  # the DMA engine copies for 2.5 ms
        return batch

    h2d = H2DTimer(torch.device("cuda"), event_factory=gpu.event, copy=copy)
    rec = Recorder()
    n = H2DTimer.FLUSH_EVERY
    for i in range(n - 1):
        assert h2d.move(i, True, rec) == i  # the batch the copy returned, unchanged
    assert gpu.syncs == 0 and not rec.raw  # nothing read back yet
    h2d.move(n, True, rec)
    assert gpu.syncs == n and not h2d.pending
    h2d.move(n + 1, True, rec)
    h2d.flush(rec)
    raw = rec.raw["transfer/h2d"]  # (start_ns, ns) per copy
    durations = raw[1::2]
    assert len(durations) == n + 1
    assert set(durations) == {2_500_000}
    assert copies == [("cuda", True)] * (n + 1)


def test_cpu_copies_are_timed_by_the_clock():
    """A device without events (the CPU): the wall clock times the synchronous copy."""

    def copy(batch, device, non_blocking):
        time.sleep(0.004)
        return batch

    h2d = H2DTimer(torch.device("cpu"), copy=copy)
    rec = Recorder()
    h2d.move("batch", False, rec)
    (ns,) = rec.raw["transfer/h2d"][1::2]
    assert ns >= 4_000_000


@pytest.mark.parametrize(
    ("device", "sampled"),
    [("cuda:1", [1]), ("/GPU:2", [2]), ("/device:GPU:3", [3]), ("cuda", None), ("cpu", None)],
)
def test_nvml_samples_the_gpu_the_device_names(device, sampled):
    """torch's and TensorFlow's spellings both pick the GPU to sample (None: the default)."""
    assert Profiler(device=device, sample_hz=0)._gpu_indices() == sampled


class NcclStep:
    """DDP on one GPU with NCCL, scripted on a FakeGPU. Backward computes ``buckets`` buckets of
    ``grad_ms`` each and hands each to the communication hook; the hook's future completes at
    once on the host (NCCL's does when its kernels are queued) while the all-reduces run one
    after another on their own stream, ``reduce_ms`` each; DDP's reducer then makes the compute
    stream wait for the last one. ``register_comm_hook`` is DDP's."""

    def __init__(self, gpu: FakeGPU, buckets: int, grad_ms: float, reduce_ms: float,
                 host_ms: float = 0.0) -> None:  # fmt: skip
        self.gpu, self.buckets, self.grad_ms, self.reduce_ms = gpu, buckets, grad_ms, reduce_ms
        self.host_ms = host_ms  # how long the host waits for each bucket's future
        self.hook = None
        self.comm_free = 0.0  # when the comm stream is next free, GPU ms

    def register_comm_hook(self, state, hook):
        self.hook = (state, hook)

    def nccl_all_reduce(self, state, bucket):
        start = max(self.gpu.now_ms, self.comm_free)
        self.comm_free = start + self.reduce_ms
        return QueuedFuture(self.gpu, self.comm_free, bucket.grads, self.host_ms)

    def backward(self):
        state, hook = self.hook
        results = []
        for i in range(self.buckets):
            self.gpu.now_ms += self.grad_ms
            results.append(hook(state, Bucket(i)).wait())
        self.gpu.now_ms = max(self.gpu.now_ms, self.comm_free)  # the reducer's stream wait
        return results


class Bucket:
    def __init__(self, i: int) -> None:
        self.grads = torch.full((2,), float(i))

    def buffer(self):
        return Cuda()


class Cuda:
    is_cuda = True


class QueuedFuture:
    """A future that is complete on the host at once; ``then``'s callback runs on a stream that
    waits for the all-reduce, so an event it records stands at ``done_ms`` on the GPU."""

    def __init__(self, gpu: FakeGPU, done_ms: float, value, host_ms: float = 0.0) -> None:
        self.gpu, self.done_ms, self._value, self.host_ms = gpu, done_ms, value, host_ms

    def value(self):
        return self._value

    def wait(self):
        return self._value

    def then(self, callback):
        time.sleep(self.host_ms / 1e3)
        now, self.gpu.now_ms = self.gpu.now_ms, self.done_ms
        try:
            return QueuedFuture(self.gpu, self.done_ms, callback(self))
        finally:
            self.gpu.now_ms = now


@pytest.mark.timing
@pytest.mark.parametrize("host_ms", [0.0, 5.0])
def test_nccls_all_reduce_is_comm_as_the_gpu_saw_it_not_compute(host_ms):
    """NCCL's future completes when the kernels are queued: the host sees microseconds of comm,
    the GPU waits 14 ms a step for the last all-reduce (3 buckets handed at 8, 13 and 18 ms,
    8 ms all-reduces one after another: done at 16, 24, 32). CUDA events on the buckets put
    those 14 ms in comm, out of compute, and report the 24 ms in flight, 10 of them overlapped
    with backward; nothing synchronises the loop. Backwards before and after the profiled loop
    are not its comm. Where the host also waits for the futures (``host_ms``, as gloo's
    would), that time is the host's comm and counted once: the GPU's time is set off against
    the CPU's whole step after the hand-over, not its compute alone."""
    gpu, steps = FakeGPU(), 8
    ddp = NcclStep(gpu, buckets=3, grad_ms=5.0, reduce_ms=8.0, host_ms=host_ms)
    prof = Profiler(sample_hz=0, timer="cuda", event_factory=gpu.event)
    assert prof.time_comm(ddp, ddp.nccl_all_reduce, "state") is ddp
    ddp.backward()  # a warm-up step before profiling
    syncs = []
    with prof:
        for _ in prof.wrap(Slow(steps, 0.05)):  # the data is slower than the GPU's 34 ms
            gpu.now_ms += 3.0  # forward
            got = ddp.backward()
            gpu.now_ms += 2.0  # optimizer
            syncs.append(gpu.syncs)
            assert [float(g[0]) for g in got] == [0.0, 1.0, 2.0]  # the hook's results, as DDP's
        gpu.completed = gpu.recorded  # the GPU caught up: read back without synchronising
        early = prof.report()
        assert set(syncs) == {0} and gpu.syncs == 0
    for _ in range(3):
        ddp.backward()  # training goes on after the profile: nothing is kept for it
    assert not prof.comm_clock()._done and not prof.comm_clock()._gpu_done
    report = prof.report()
    comm, loop = report["meta"]["comm"], report["loop"]
    assert comm["buckets"] == 3 * steps  # the host's view: its wait for the last future
    assert comm["exposed_s"] == pytest.approx(host_ms / 1e3 * steps, abs=0.002 * steps)
    g = comm["gpu"]
    assert (g["steps"], g["buckets"]) == (steps, 3 * steps)
    assert g["exposed_s"] == pytest.approx(0.014 * steps, abs=1e-6)
    assert g["first_exposed_s"] == pytest.approx(0.014, abs=1e-6)  # Slow's one start-up step
    host = g["first_host_exposed_s"] + g["steady_host_exposed_s"]
    assert host == pytest.approx(comm["exposed_s"])  # the host's view of the same steps
    assert g["in_flight_s"] == pytest.approx(0.024 * steps, abs=1e-6)
    assert g["overlapped_s"] == pytest.approx(0.010 * steps, abs=1e-6)
    # the GPU was busy 34 ms a step after the hand-over, 14 of them waiting for the all-reduce
    assert loop["gpu_compute_s"] == pytest.approx(0.034 * steps, abs=1e-6)
    assert loop["comm_s"] == pytest.approx(0.014 * steps, abs=1e-6)
    moved = loop["compute_moved_to_comm_s"]
    assert moved == pytest.approx(0.014 * steps - comm["exposed_s"], abs=1e-6)
    # compute is the rest, 20 ms a step, start-up and steady steps alike
    assert loop["compute_s"] == pytest.approx(0.020 * steps, abs=1e-6)
    steady = loop["steady"]
    assert steady["compute_s"] == pytest.approx(0.020 * (steps - 1), abs=1e-6)
    assert steady["comm_s"] == pytest.approx(0.014 * (steps - 1), abs=1e-6)
    parts = sum(loop[f"{k}_s"] for k in ("wait", "transfer", "compute", "comm", "overhead"))
    assert parts == pytest.approx(loop["wall_s"])  # moved, never counted twice
    # a report read during the run, once the GPU caught up, already says so
    for key in ("comm_s", "compute_s", "gpu_compute_s"):
        assert early["loop"][key] == pytest.approx(loop[key], abs=1e-6), key
    line = ("DDP all-reduce (NcclStep.nccl_all_reduce, the GPU's view): 3 buckets/step, 24.0 "
            "ms/step in flight, 10.0 overlapped with backward, 14.0 exposed (comm)")  # fmt: skip
    assert line in " ".join(report.render("text").split())
    assert f'<p class="dim comm">{html.escape(line)}</p>' in report.render("html")


@pytest.mark.timing
def test_a_comm_region_of_the_scripts_own_is_comm_besides_ddps():
    """An explicit collective timed as a ``Comm`` region (4 ms on the host clock here) is comm
    of its own: the GPU's view of DDP's all-reduce is compared with the host's view of DDP's
    all-reduce only, so the region is never set off against it."""
    gpu, steps = FakeGPU(), 6
    ddp = NcclStep(gpu, buckets=3, grad_ms=5.0, reduce_ms=8.0)
    prof = Profiler(sample_hz=0, timer="cpu")
    prof.time_comm(ddp, ddp.nccl_all_reduce, "state")
    prof.comm_clock().events = gpu.event  # DDP's buckets get events, the regions the clock
    gpu.completed = 10**9  # the GPU is always done
    with prof:
        for _ in prof.wrap(range(steps)):
            ddp.backward()
            time.sleep(0.03)  # the step's compute on the host, longer than the GPU's 14 ms
            with prof.region("Comm"):  # e.g. an explicit all_reduce of a metric
                time.sleep(0.004)
    loop = prof.report()["loop"]
    region = loop["regions"]["Comm"]
    assert region["count"] == 2 * steps  # DDP's exposed all-reduce (host view) and the script's
    host = region["count"] * region["mean_ms"] / 1e3
    assert loop["comm_s"] == pytest.approx(0.004 * steps + 0.014 * steps, abs=0.003 * steps)
    assert loop["comm_s"] == pytest.approx(host + loop["compute_moved_to_comm_s"], abs=1e-6)
    assert loop["compute_moved_to_comm_s"] > 0.0135 * steps


def test_cuda_events_that_fail_leave_ddps_training_and_the_hosts_view():
    """An event that cannot be recorded (a CUDA error) ends the GPU's view of the all-reduce
    with a note; DDP gets every bucket's result, and the steps read before it stand."""
    gpu, steps = FakeGPU(), 6
    ddp = NcclStep(gpu, buckets=2, grad_ms=5.0, reduce_ms=8.0)
    prof = Profiler(sample_hz=0, timer="cuda", event_factory=gpu.event)
    prof.time_comm(ddp, ddp.nccl_all_reduce, "state")
    works, made = prof.comm_clock().events, []

    def fails_from_step_3():  # two events a bucket: the 14th is step 3's first all-reduce done
        made.append(1)
        if len(made) >= 14:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return works()

    prof.comm_clock().events = fails_from_step_3
    results = []
    with prof:
        for _ in prof.wrap(range(steps)):
            results.append([float(g[0]) for g in ddp.backward()])
    assert results == [[0.0, 1.0]] * steps
    report = prof.report()
    comm = report["meta"]["comm"]
    assert comm["buckets"] == 2 * steps  # the host's view of every step
    assert comm["gpu"]["steps"] == 3 and len(made) == 14  # none made after the failure
    assert any("its CUDA events failed (RuntimeError: CUDA error" in n for n in report["notes"])


@pytest.mark.timing
def test_cuda_timed_regions_count_in_their_own_step_by_the_cpu_clock():
    """With CUDA events a region's GPU duration is known steps later: it is the regions' figure.
    The step's split counts the region as it closes, by the CPU clock, in its own step (none
    lands in a later step, none is lost at the end of the run), and the rules weigh that CPU
    time (``host_regions``) against the step."""
    gpu, steps = FakeGPU(), 6
    prof = Profiler(sample_hz=0, timer="cuda", event_factory=gpu.event)
    prof.timer._resolve_every = prof.timer._next_resolve = 0  # read back as soon as done
    with prof:
        for _ in prof.wrap(range(steps)):
            with prof.region("Logging"):  # 3 ms on the host, 1 ms of kernels on the GPU
                time.sleep(0.003)
                gpu.now_ms += 1.0
            time.sleep(0.002)
            gpu.completed = gpu.recorded  # the GPU keeps up: each region is read in the next
    report = prof.report()
    loop = report["loop"]
    assert loop["regions"]["Logging"]["mean_ms"] == pytest.approx(1.0)  # the GPU's figure
    assert loop["host_regions"]["Logging"]["mean_ms"] == pytest.approx(3.0, abs=1.0)
    assert loop["overhead_s"] == pytest.approx(0.003 * steps, abs=0.001 * steps)
    assert loop["steady"]["overhead_s"] == pytest.approx(0.003 * (steps - 1), abs=0.001 * steps)
    assert loop["compute_s"] == pytest.approx(0.002 * steps, abs=0.001 * steps)
    spans = [s[3] for s in prof.session.spans if s[1] == "region/Logging"]  # the trace's
    assert len(spans) == steps and min(spans) >= 3_000_000  # CPU spans, on the CPU's timeline
    (found,) = [f for f in report["findings"] if f["id"] == "overhead-regions"]
    assert found["evidence"]["region_s"] == pytest.approx(0.003 * steps, abs=0.001 * steps)
