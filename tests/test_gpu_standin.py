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
from fake_cuda import FakeGPU, WallGPU

from pipeprof import Profiler
from pipeprof.analyze.loop import _gpu_shift
from pipeprof.collect.torch.loader import H2DTimer
from pipeprof.core.recorder import Recorder
from pipeprof.core.stats import Stat
from pipeprof.render.figures import gpu_util_line


def test_this_machine_has_no_gpu():
    """Everything in this file is a stand-in: where there is no GPU, there is no NVIDIA driver
    either. On a GPU machine the real paths are the ones to check (benchmarks/gpu_truth.py,
    docs/gpu.md), and this says so as its skip."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the stand-ins are not the truth (run dev/gpu_check.sh truth)")
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
    sees almost no compute, CUDA events see 15 ms per step, and that time is compute, not wait:
    the wait of the step after, which it overlapped. The first step's wait (start-up) had no
    kernels before it: it stays wait. The last step's kernels, run after the loop's last
    request, count with the steady steps (NOTE [ GPU compute by events ] in profiler.py)."""
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
    # each pair's GPU span less the CPU's microseconds between its two records
    assert moved == pytest.approx(steps * kernel_ms / 1e3, abs=0.002)
    assert loop["compute_s"] - moved < 0.005  # the CPU side of each step is a few microseconds
    raw_wait = loop["wait_s"] + moved
    assert raw_wait >= steps * sleep_s * 0.99  # the sleeps, as the CPU waited them
    assert loop["startup_wait_s"] >= sleep_s * 0.99  # nothing ran on the GPU before step 1
    # what is left of the steady wait is the time the GPU had nothing to do, sleep - kernel a
    # step, less the last step's kernels (at most one step's GPU time, the NOTE says)
    steady = loop["steady"]
    assert steady["wait_s"] == pytest.approx(
        (steps - 1) * (sleep_s - kernel_ms / 1e3) - kernel_ms / 1e3, abs=0.0015 * steps
    )


@pytest.mark.timing
@pytest.mark.parametrize(
    ("kernel_ms", "sleep_ms"), [(4.0, 20.0), (25.0, 5.0)], ids=["input-bound", "gpu-bound"]
)
def test_the_correction_on_a_gpu_that_runs_by_the_wall_clock(kernel_ms, sleep_ms):
    """A stand-in GPU on the wall clock (``WallGPU``: kernels queue and run in order, an idle
    GPU's events are as far apart as the CPU's records). What is left as wait is the time the
    GPU had nothing to do while the loop waited: ``sleep - kernel`` per step when the loader is
    slower, none when the GPU is (then the loop is compute-bound)."""
    gpu, steps = WallGPU(), 14
    prof = Profiler(sample_hz=0, timer="cuda", event_factory=gpu.event)
    with prof:
        for _ in prof.wrap(Slow(steps, sleep_ms / 1e3)):
            gpu.launch(kernel_ms)
    report = prof.report()
    steady = report["loop"]["steady"]
    n = steady["steps"]
    idle_ms = max(0.0, sleep_ms - kernel_ms)  # per steady step, the GPU waiting for data
    assert steady["wait_s"] * 1e3 / n == pytest.approx(idle_ms, abs=1.5)
    if kernel_ms > sleep_ms:
        assert report["verdict"]["kind"] == "compute-bound", report["verdict"]
    else:
        assert report["verdict"]["kind"] == "input-bound", report["verdict"]


def test_copies_held_behind_the_gpu_are_compute_not_transfer():
    """pipeprof's copy of a batch (``device=``) can hold the loop's thread behind kernels
    already queued (a pageable copy waits for them; a full launch queue holds any call). Beyond
    the copy's own GPU time (events), that time is GPU compute: it moves after the wait, as far
    as the GPU's excess reaches, and never below the copy's GPU time."""

    def parts(wait, transfer_cpu, gpu_ns, cpu_ns):
        stats = {k: Stat() for k in ("wait", "transfer", "compute")}
        stats["transfer"].add(int(transfer_cpu * 1e9))
        stats["gpu_compute"], stats["gpu_cpu"] = Stat(), Stat()
        stats["gpu_compute"].add(int(gpu_ns))
        stats["gpu_cpu"].add(int(cpu_ns))
        return stats, {"wait_s": wait, "transfer_s": transfer_cpu, "compute_s": 0.01}

    total = Stat()
    total.add(1)
    # GPU ran 0.5 s past the requests; 0.2 s of it overlapped the wait, 0.25 s the held copies
    stats, p = parts(wait=0.2, transfer_cpu=0.3, gpu_ns=0.51e9, cpu_ns=0.01e9)
    held = 0.3 - 0.05  # the copies' CPU time less their GPU time (0.05 s)
    wait_moved, copy_moved = _gpu_shift(total, (stats, p, held))
    assert wait_moved == pytest.approx(0.2) and copy_moved == pytest.approx(0.25)
    assert p["transfer_s"] == pytest.approx(0.05) and p["wait_s"] == pytest.approx(0.0)
    # a smaller excess comes off the wait first, and leaves the copies as they were
    stats, p = parts(wait=0.2, transfer_cpu=0.3, gpu_ns=0.16e9, cpu_ns=0.01e9)
    wait_moved, copy_moved = _gpu_shift(total, (stats, p, held))
    assert wait_moved == pytest.approx(0.15) and copy_moved == 0.0
    # copies timed by the CPU clock (no events) hold nothing back
    stats, p = parts(wait=0.0, transfer_cpu=0.3, gpu_ns=0.51e9, cpu_ns=0.01e9)
    assert _gpu_shift(total, (stats, p, 0.0)) == (0.0, 0.0)


@pytest.fixture
def gpu_not_yet_used(monkeypatch):
    """torch sees a GPU, and CUDA is initialised only when ``state["init"]`` says so (as when
    the script moves its model to the GPU)."""
    state = {"init": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: state["init"])
    return state


def test_auto_never_starts_cuda_for_a_loop_that_does_not_use_it(gpu_not_yet_used):
    """A CPU-only script on a machine with a GPU: pipeprof records no CUDA event (each would
    create a CUDA context the script never asked for) and nothing is moved from the wait."""
    gpu = WallGPU()
    prof = Profiler(sample_hz=0, event_factory=gpu.event)  # timer="auto"
    with prof:
        for _ in prof.wrap(Slow(6, 0.002)):
            with prof.region("Forward"):
                time.sleep(0.001)
    loop = prof.report()["loop"]
    assert gpu.created == 0 and prof.timer.backend == "cpu"
    assert loop["gpu_compute_s"] is None and loop["wait_moved_to_gpu_compute_s"] == 0
    assert loop["regions"]["Forward"]["count"] == 6


@pytest.mark.timing
def test_auto_turns_to_cuda_events_once_the_script_uses_the_gpu(gpu_not_yet_used):
    """The script initialises CUDA at step 4 (its model goes to the GPU): from the next step on
    the regions and the steps are timed by events, a region open across the turn ends on the
    CPU clock, and every region is counted once."""
    gpu, steps = WallGPU(), 10
    prof = Profiler(sample_hz=0, event_factory=gpu.event)
    prof.timer.start("Epoch")
    with prof:
        for i, _ in enumerate(prof.wrap(Slow(steps, 0.01))):
            if i == 3:
                gpu_not_yet_used["init"] = True
            with prof.region("Forward"):
                if gpu_not_yet_used["init"]:
                    gpu.launch(6.0)
        prof.timer.end("Epoch")
    assert prof.timer.backend == "cuda" and gpu.created > 0
    loop = prof.report()["loop"]
    assert loop["regions"]["Forward"]["count"] == steps
    assert loop["host_regions"]["Forward"]["count"] == steps - 3  # events from step 4 on
    assert loop["regions"]["Epoch"]["mean_ms"] >= steps * 10  # opened before: the CPU clock
    # step 4's GPU work is in the region's figures; steps 5-10 are bracketed by events
    assert loop["gpu_compute_s"] == pytest.approx((steps - 4) * 0.006, abs=0.004)
    assert loop["wait_moved_to_gpu_compute_s"] == pytest.approx(
        (steps - 4) * 0.006, abs=0.003
    )


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
    # compute is the rest, 20 ms a step (less pipeprof's own microseconds between a step's two
    # events, in no part); the start-up step's GPU work ran on into the first steady step's
    # wait, so it counts with the steady steps (NOTE [ GPU compute by events ])
    assert loop["compute_s"] == pytest.approx(0.020 * steps, abs=5e-4 * steps)
    steady = loop["steady"]
    assert steady["compute_s"] == pytest.approx(0.020 * steps, abs=5e-4 * steps)
    # the start-up step's exposed all-reduce: from its own compute as far as that holds it
    assert 0.014 * (steps - 1) - 1e-6 <= steady["comm_s"] <= 0.014 * steps + 1e-6
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


def test_the_utilisation_line_says_when_kernels_ran_through_the_wait():
    """The GPU read busy while the loop waited in next(): where events moved that wait to
    compute, the line says so, or it would read as a contradiction; otherwise it is unchanged."""
    loop = {"gpu_util_waiting": 96.6, "gpu_util_computing": 98.7}
    plain = "GPU util while waiting for data 97%, while computing 99%"
    assert gpu_util_line(loop) == plain
    moved = gpu_util_line({**loop, "wait_moved_to_gpu_compute_s": 5.92})
    ran_on = " (its kernels ran on through 5.92 s of the loop's wait, counted as compute)"
    assert moved == plain + ran_on
    assert gpu_util_line({}) is None


def test_step_events_are_reused_once_read():
    """Two events a step, read back in groups: once read they are recorded again, so a long
    run makes a bounded number of them (making one costs a CUDA call and a Python object)."""
    gpu, steps = FakeGPU(), 400
    prof = Profiler(sample_hz=0, timer="cuda", event_factory=gpu.event)
    with prof:
        for _ in prof.wrap(range(steps)):
            gpu.now_ms += 1.0
            gpu.completed = gpu.recorded  # the GPU keeps up
    loop = prof.report()["loop"]
    assert loop["gpu_compute_s"] == pytest.approx(steps * 1e-3, abs=1e-9)
    assert gpu.created <= 2 * 64 + 4 < 2 * steps
