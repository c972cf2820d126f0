"""The NVML and host samplers: a fake NVML at the hardware boundary, real psutil and processes."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from fake_nvml import FakeGpu, FakeNvml, NVMLError_Unknown
from torch.utils.data import DataLoader, Dataset

import pipeprof
from pipeprof.collect.samplers import (
    NA,
    HostSampler,
    NaType,
    NvmlSampler,
    Sampler,
    json_default,
    mean_over_spans,
    query,
)
from pipeprof.collect.samplers import base as base_module
from pipeprof.collect.samplers import host as host_module
from pipeprof.collect.samplers import nvml as nvml_module

MS = 1_000_000


class FakeClock:
    """Returns ``now`` (ns), or the next of ``script`` while one is left."""

    def __init__(self, *script: int) -> None:
        self.now = 0
        self.script = list(script)

    def __call__(self) -> int:
        return self.script.pop(0) if self.script else self.now


def drive(sampler: Sampler, clock: FakeClock, times_ms: list[int]) -> dict[str, Any]:
    """Prime at 0, sample at each time, close; return ``to_dict()``."""
    assert sampler.prime(0)
    for t in times_ms:
        clock.now = t * MS
        sampler.sample()
    sampler.close()
    return sampler.to_dict()


def wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def pipeprof_threads() -> list[threading.Thread]:
    """pipeprof's threads but the process's hang watcher (NOTE [ Hangs ]), which lives on."""
    ours = [t for t in threading.enumerate() if t.name.startswith("pipeprof")]
    return [t for t in ours if t.name != "pipeprof-hangs"]


# ---- n/a, query, mean_over_spans ----------------------------------------------------------------


def test_na_is_a_falsy_singleton_that_prints_and_serialises_as_missing() -> None:
    assert NaType() is NA and pickle.loads(pickle.dumps(NA)) is NA
    assert not NA and repr(NA) == str(NA) == f"{NA:.1f}" == "n/a"
    assert json.dumps({"util": NA}, default=json_default) == '{"util": null}'
    with pytest.raises(TypeError):
        json.dumps(object(), default=json_default)


def test_query_returns_na_on_any_error_never_zero() -> None:
    seen: list[BaseException] = []
    assert query(lambda a, b: a + b, 2, 3) == 5
    assert query(lambda: (_ for _ in ()).throw(NVMLError_Unknown()), on_error=seen.append) is NA
    assert query(lambda: 1 / 0, on_error=seen.append) is NA
    assert [type(e).__name__ for e in seen] == ["NVMLError_Unknown", "ZeroDivisionError"]


def test_mean_over_spans_is_time_weighted_and_exact() -> None:
    t, v = [0, 10, 20, 30], [1.0, 2.0, NA, 4.0]
    # forward hold: [0,10)=1, [10,20)=2, [20,30)=n/a
    assert mean_over_spans(t, v, [(5, 15)]) == 1.5
    # overlapping spans merge to (5,18); (25,40) only meets n/a and time after the series
    assert mean_over_spans(t, v, [(12, 18), (5, 15), (25, 40)]) == (1 * 5 + 2 * 8) / 13
    # backward hold: (0,10]=2, (10,20]=n/a, (20,30]=4
    assert mean_over_spans(t, v, [(5, 25)], hold="backward") == (2 * 5 + 4 * 5) / 10
    assert mean_over_spans(t, [None, 3.0, 3.0, 3.0], [(0, 30)]) == 3.0
    assert mean_over_spans(t, v, [(40, 50)]) is None
    assert mean_over_spans(t, v, []) is None
    assert mean_over_spans([], [], [(0, 10)]) is None


# ---- the sampler thread's clockwork -------------------------------------------------------------


class Recording(Sampler):
    thread_name = "pipeprof-test"

    def __init__(self, fail: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail = fail
        self.at: list[int] = []

    def _sample(self, now_ns: int) -> None:
        if self.fail:
            raise RuntimeError("sensor fell off")
        self.at.append(now_ns)

    def to_dict(self) -> dict[str, Any]:
        return {}


def test_tick_sleeps_to_deadlines_records_lateness_and_skips_overruns() -> None:
    clock = FakeClock(105 * MS, 107 * MS, 200 * MS, 450 * MS)
    s = Recording(hz=10, clock=clock)
    assert s.tick(100 * MS) == 200 * MS  # 5 ms late; next deadline is one period on
    assert s.tick(200 * MS) == 500 * MS  # on time, but the sample ran to 450 ms: skip 300, 400
    assert s.at == [105 * MS, 200 * MS]
    assert s.lateness.to_dict() == {"count": 2, "mean_ms": 2.5, "max_ms": 5.0, "missed": 2}


def test_failing_samples_are_counted_and_the_thread_keeps_going() -> None:
    hooked: list[Any] = []
    old_hook, threading.excepthook = threading.excepthook, hooked.append
    try:
        with Recording(fail=True, hz=200) as s:
            wait_for(lambda: s.errors >= 3)
            assert s.is_alive()
    finally:
        threading.excepthook = old_hook
    assert not hooked and not s.is_alive() and s.lateness.count >= 3


def test_stop_is_idempotent_safe_unstarted_and_final() -> None:
    s = Recording(hz=100)
    s.stop()  # never started
    s.start()
    s.start()  # already running: no second thread
    assert len(pipeprof_threads()) == 1
    s.stop()
    s.stop()
    assert not s.is_alive() and not pipeprof_threads()
    with pytest.raises(RuntimeError, match="make a new one"):
        s.start()
    with pytest.raises(ValueError):
        Recording(hz=0)


class MakesACollectionDue(HostSampler):
    """Primes with every generation's threshold at 1, so that its first allocation runs the
    collection the program's heap has made due, on this thread (as torch's import does)."""

    def _prime(self, now_ns: int) -> bool:
        old = gc.get_threshold()
        gc.set_threshold(1, 1, 1)
        try:
            return super()._prime(now_ns)
        finally:
            gc.set_threshold(*old)


def test_the_programs_collections_on_a_sampler_thread_are_not_its_cost() -> None:
    # NOTE [ The program's collections on a sampler thread ]: the README's demo counted a
    # 150 ms full collection of torch's objects as the samplers' CPU
    gc.disable()
    try:
        heap = [[] for _ in range(1_000_000)]  # the program's objects, made since the last full
        gc.collect(1)  # collection: moved to the oldest generation, so a full one is due
    finally:
        gc.enable()
    with MakesACollectionDue(hz=50) as s:
        time.sleep(0.3)
    del heap
    assert s.gc_ns >= 10 * MS, s.gc_ns  # it ran on the sampler's thread ...
    assert s.cpu_ns < 0.5 * s.gc_ns, (s.cpu_ns, s.gc_ns)  # ... and is not its cost
    assert gc.callbacks.count(base_module._on_gc) == 0  # no hook left once no sampler runs


# ---- NVML through the fake module ---------------------------------------------------------------


def test_nvml_driver_samples_give_exact_time_weighted_means() -> None:
    gpu = FakeGpu("A100", samples=[[99, 99], [10, 30], [50]], util=[77], mem_util=[5, 15])
    fake, clock = FakeNvml([gpu]), FakeClock()
    d = drive(NvmlSampler(nvml=fake, clock=clock), clock, [100, 300])
    assert d["available"] and d["note"] is None
    (dev,) = d["devices"]
    # the priming batch (99s) is history; then 20 % for 100 ms and 50 % for 200 ms
    assert dev["util_mean"] == pytest.approx((20 * 100 + 50 * 200) / 300)
    assert (dev["util_p50"], dev["util_max"]) == (50.0, 50.0)
    assert dev["mem_util_mean"] == pytest.approx((5 * 100 + 15 * 200) / 300)
    assert dev == dev | {
        "index": 0,
        "name": "A100",
        "mem_used_max_mb": 1024.0,
        "mem_total_mb": 16384.0,
        "power_mean_w": 100.0,
        "sm_clock_mean_mhz": 1500.0,
    }
    assert gpu.seen_timestamps == [0, 1_002_000, 1_004_000]  # each call asks for newer samples
    assert d["timeline"]["t_ns"] == [100 * MS, 300 * MS]
    assert d["timeline"]["util"] == [[20.0], [50.0]]
    assert fake.inits == fake.shutdowns == 1
    json.dumps(d)


def test_nvml_falls_back_to_utilization_rates() -> None:
    unsupported = FakeGpu("old", samples=None, util=[30, 60])
    quiet = FakeGpu("idle", samples=[[1], [], [70]], util=[40])  # no new samples in interval 1
    fake, clock = FakeNvml([unsupported, quiet]), FakeClock()
    d = drive(NvmlSampler(nvml=fake, clock=clock), clock, [100, 200, 300])
    assert d["timeline"]["util"] == [[30.0, 40.0], [60.0, 70.0], [60.0, 40.0]]
    assert unsupported.calls.get("samples") is None and fake.log.count("nvmlDeviceGetSamples") == 5
    assert [n for n in d["notes"] if "samples" in n] == [
        "utilisation samples not supported on GPU 0: utilisation falls back to "
        "nvmlDeviceGetUtilizationRates, whose 1/6-1 s window blurs short stalls."
    ]


def test_nvml_error_on_one_call_is_na_never_zero() -> None:
    fail: dict[str, list[Exception | None]] = {
        "nvmlDeviceGetPowerUsage": [None, NVMLError_Unknown(), None],
        "nvmlDeviceGetUtilizationRates": [None, NVMLError_Unknown()],
    }
    fake, clock = FakeNvml([FakeGpu(samples=None, util=[10, 99, 40])], fail=fail), FakeClock()
    d = drive(NvmlSampler(nvml=fake, clock=clock), clock, [100, 200, 300])
    assert d["timeline"]["power_w"] == [[100.0], [None], [100.0]]
    assert d["timeline"]["util"] == [[10.0], [None], [99.0]]  # the failed call consumed nothing
    (dev,) = d["devices"]
    assert dev["power_mean_w"] == 100.0
    assert dev["util_mean"] == pytest.approx((10 + 99) / 2)
    assert d["query_errors"] == 3 and '"power_w": [[100.0], [null], [100.0]]' in json.dumps(d)
    assert any("reading power draw on GPU 0 failed (Unknown)" in n for n in d["notes"])


def test_nvml_unsupported_metric_is_noted_once_with_advice() -> None:
    fake, clock = FakeNvml([FakeGpu(power_mw=None)]), FakeClock()
    d = drive(NvmlSampler(nvml=fake, clock=clock), clock, [100, 200, 300])
    assert d["available"] and d["devices"][0]["power_mean_w"] is None
    assert d["timeline"]["power_w"] == [[None], [None], [None]]
    assert d["notes"] == [
        "power draw not supported on GPU 0: power_mean_w is n/a; nothing to fix, "
        "some GPUs do not report power."
    ]
    assert d["note"] == d["notes"][0]


@pytest.mark.parametrize(
    ("fake", "says"),
    [
        (FakeNvml([FakeGpu()], library=False), "No NVIDIA driver library (libnvidia-ml.so)"),
        (FakeNvml([FakeGpu()], driver=False), "The NVIDIA driver is not loaded"),
        (FakeNvml([]), "NVML found no GPU"),
    ],
)
def test_nvml_unavailable_says_why_and_does_not_crash(fake: FakeNvml, says: str) -> None:
    with NvmlSampler(hz=100, nvml=fake) as s:
        wait_for(lambda: not s.is_alive())  # the thread gives up by itself
    d = s.to_dict()
    assert d["available"] is False and d["note"].startswith(says) and d["devices"] == []
    assert fake.shutdowns == fake.inits  # shut down exactly when initialised
    json.dumps(d)


def test_nvml_without_pynvml_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    monkeypatch.setattr(nvml_module, "_MISSING", [])  # what this process found before
    s = NvmlSampler()
    assert not s.prime() and not s.to_dict()["available"]
    assert "pip install nvidia-ml-py" in s.to_dict()["note"]
    # missing for the rest of the process: a later sampler says so without a thread or a try
    later = NvmlSampler().start()
    assert later._thread is None and not later.is_alive()
    assert later.to_dict()["note"] == s.to_dict()["note"]
    fake = FakeNvml([FakeGpu()])  # a module passed in is always tried
    assert NvmlSampler(nvml=fake)._refusal() is None


def test_nvml_gpus_restricts_devices() -> None:
    fake = FakeNvml([FakeGpu("g0"), FakeGpu("g1"), FakeGpu("g2")])
    clock = FakeClock()
    d = drive(NvmlSampler(gpus=[2], nvml=fake, clock=clock), clock, [])
    assert [(x["index"], x["name"]) for x in d["devices"]] == [(2, "g2")]
    s = NvmlSampler(gpus=[5], nvml=FakeNvml([FakeGpu()]))
    assert not s.prime() and "gpus= with indices from 0 to 0" in s.to_dict()["note"]
    s.close()


def test_nvml_thread_is_a_named_daemon_that_inits_lazily_and_shuts_down() -> None:
    fake = FakeNvml([FakeGpu(samples=[[1], [2], [3]])])
    s = NvmlSampler(hz=100, nvml=fake)
    assert fake.inits == 0  # nothing touched NVML before start()
    s.start()
    (thread,) = pipeprof_threads()
    assert thread.name == "pipeprof-nvml" and thread.daemon
    wait_for(lambda: s.lateness.count >= 3)
    s.stop()
    assert fake.init_thread == "pipeprof-nvml" and fake.shutdowns == 1
    assert not s.is_alive() and not pipeprof_threads()
    d = s.to_dict()
    assert len(d["timeline"]["t_ns"]) == d["lateness"]["count"] >= 3


def _nvml_in_child(conn: Any) -> None:
    fake = FakeNvml([FakeGpu()])
    s = NvmlSampler(nvml=fake)
    s.start()
    alive = s.is_alive()
    primed = s.prime()
    s.stop()
    d = s.to_dict()
    conn.send((d["available"], d["note"], fake.inits, alive, primed))


def test_nvml_refuses_inside_a_child_process() -> None:
    parent, child = multiprocessing.Pipe()
    p = multiprocessing.get_context("fork").Process(target=_nvml_in_child, args=(child,))
    p.start()
    available, note, inits, alive, primed = parent.recv()
    p.join(10)
    assert (available, inits, alive, primed) == (False, 0, False, False)
    assert "only used from the main process" in note


def test_importing_samplers_loads_no_hardware_library() -> None:
    code = (
        "import sys, pipeprof; had = 'psutil' in sys.modules\n"
        "import pipeprof.collect.samplers.nvml, pipeprof.collect.samplers.host\n"
        "assert 'pynvml' not in sys.modules, 'pynvml imported'\n"
        "assert ('psutil' in sys.modules) == had, 'psutil imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.getcwd())


# ---- host sampler on real processes -------------------------------------------------------------


def _busy(seconds: float, conn: Any = None) -> None:
    """Spin for ``seconds`` of wall time; send the CPU % actually used down ``conn``."""
    wall, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() < wall + seconds:
        pass
    if conn is not None:
        conn.send(100 * (time.process_time() - cpu) / (time.perf_counter() - wall))


@pytest.fixture(params=["procfs", "psutil"])
def host_run(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[HostSampler, int, float]]:
    """Main busy 0.25 s, then a forked child busy 0.5 s, sampled at 50 Hz: from /proc on Linux,
    and through psutil as on other platforms. Children look-ups unthrottled in both (their budget
    has tests of its own): psutil's scan takes ~2 ms, and /proc's, in a test process that has
    gathered threads under a loaded CI, can too, which spaced them out longer than the child
    lived (the child missed in all three tries of one CI run)."""
    if request.param == "procfs" and not host_module._procfs_available():
        pytest.skip("reads Linux /proc")
    monkeypatch.setattr(host_module, "DISCOVERY_SHARE", 1e12)
    if request.param == "psutil":
        monkeypatch.setattr(host_module, "_procfs_available", lambda: False)
    s = HostSampler(hz=50)
    s.start()
    try:
        _busy(0.25)
        parent, child = multiprocessing.Pipe()
        p = multiprocessing.get_context("fork").Process(target=_busy, args=(0.5, child))
        p.start()
        child_pct = parent.recv()
        p.join(10)
        time.sleep(0.05)
        yield s, p.pid or 0, child_pct
    finally:
        s.stop()


@pytest.mark.timing  # a 0.5 s child on a shared VM: a host's burst can hide it from the sampler
def test_host_sampler_measures_main_and_late_child(
    host_run: tuple[HostSampler, int, float],
) -> None:
    s, child_pid, child_pct = host_run
    (thread,) = pipeprof_threads()
    assert thread.name == "pipeprof-host" and thread.daemon
    s.stop()
    assert not s.is_alive() and not pipeprof_threads()
    d = s.to_dict()
    main, *children = d["per_process"]
    assert main["role"] == "main" and main["pid"] == os.getpid()
    assert main["cpu_max"] > 20 and main["cpu_mean"] > 5 and main["rss_max_mb"] > 10
    # The child started after the sampler and spun all its life: the sampler must see it busy,
    # and agree with the CPU time the child measured itself (it shares 2 cores with other jobs).
    (child,) = [c for c in children if c["pid"] == child_pid]
    assert child["role"] == "child" and child["cpu_mean"] > 15
    assert child["cpu_mean"] == pytest.approx(child_pct, abs=20)
    assert max(c for c in d["timeline"]["children_cpu"] if c is not None) > 15
    assert d["cpu_count"] == psutil.cpu_count() and 0 < d["cpu_util_mean"] <= 100
    assert d["rss_max_mb"] >= main["rss_max_mb"] and d["iowait_mean"] is not None
    assert d["steal_mean"] is not None and 0 <= d["steal_mean"] <= d["cpu_util_mean"]
    assert d["lateness"]["count"] == len(d["timeline"]["t_ns"]) >= 20
    assert d["errors"] == 0
    json.dumps(d)


needs_procfs = pytest.mark.skipif(not host_module._procfs_available(), reason="reads Linux /proc")


def _spin_until(stop: Any) -> None:
    while not stop.is_set():
        pass


def _proc_fds() -> list[str]:
    """Where this process's open descriptors into /proc point."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/proc/"):
            out.append(target)
    return out


@needs_procfs
def test_host_looks_up_children_only_after_a_process_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The costly look-up for children runs only when the last pid handed out has moved (scripted
    here); known children are read every sample in between, and an exited one is let go."""
    marker = [1]
    monkeypatch.setattr(host_module._Procfs, "pid_marker", lambda self: marker[0])
    monkeypatch.setattr(host_module, "DISCOVERY_SHARE", 1e12)  # no cost budget in the way
    before = sorted(_proc_fds())
    s = HostSampler(hz=10)
    assert s.prime() and s.lookups == 1
    # children from earlier tests (multiprocessing's resource tracker, once spawn has been used)
    # are the sampler's to see, not this test's
    old = {c.pid for c in psutil.Process().children()}

    def ours(per_process):
        return [p for p in per_process if p["pid"] not in old]

    stop = multiprocessing.get_context("fork").Event()
    child = multiprocessing.get_context("fork").Process(target=_spin_until, args=(stop,))
    child.start()
    try:
        for _ in range(3):  # no new pid (as far as the sampler can tell): no look-up, not seen
            time.sleep(0.02)
            s.sample()
        assert s.lookups == 1
        assert [p["pid"] for p in ours(s.to_dict()["per_process"])] == [os.getpid()]
        marker[0] = 2  # a pid was handed out: the next sample looks and primes the child
        s.sample()
        assert s.lookups == 2
        (entry,) = ours(s.to_dict()["per_process"])[1:]
        assert entry["pid"] == child.pid and entry["role"] == "child"
        assert entry["cpu_mean"] is None and entry["rss_max_mb"] > 1  # priming: CPU n/a
        for _ in range(4):  # read every sample, without looking up again
            time.sleep(0.1)
            s.sample()
        assert s.lookups == 2
        (entry,) = ours(s.to_dict()["per_process"])[1:]
        assert entry["cpu_max"] > 20  # it spins
        # some CPU in each sample (/proc counts 10 ms ticks: other tests' processes on the two
        # cores may leave the child one or two of a window's ten)
        assert all(c > 0 for c in s.to_dict()["timeline"]["children_cpu"][-4:])
        assert f"/proc/{child.pid}/stat" in _proc_fds()
    finally:
        stop.set()
        child.join(10)
    s.sample()  # reaped: its reading fails, so it is dropped (and its /proc file closed)
    assert s.lookups == 2 and s.errors == 0
    assert s.to_dict()["timeline"]["children_cpu"][-1] == 0
    assert f"/proc/{child.pid}/stat" not in _proc_fds()
    s.close()
    # what stays open is the source kept for the next sampler: its own files, no child's
    kept = {"/proc/stat", "/proc/loadavg", "/proc/diskstats", f"/proc/{os.getpid()}/stat"}
    assert set(_proc_fds()) - set(before) <= kept


@needs_procfs
def test_host_source_is_kept_for_the_next_sampler_never_shared() -> None:
    """The /proc files and psutil objects are made once per process: a sampler that stops gives
    them back with its children let go, the next one takes them, two at once never share, and
    a forked child makes its own."""
    first = HostSampler(hz=10)
    assert first.prime()
    src = first._src
    first.close()
    assert src in host_module._POOL
    second, third = HostSampler(hz=10), HostSampler(hz=10)
    assert second.prime() and second._src is src
    assert third.prime() and third._src is not src  # while `second` holds it
    assert second.to_dict()["cpu_count"] == psutil.cpu_count()
    second.close()
    third.close()
    assert len(host_module._POOL) <= 2
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_prime_in_child, args=(out,))
    child.start()
    try:
        assert out.get(timeout=30) == (True, True)
    finally:
        child.join(10)


def _prime_in_child(out: Any) -> None:
    s = HostSampler(hz=10)
    ok = s.prime()
    src = s._src
    _, _, rss = src.read(os.getpid())  # its own process, not the parent's
    s.close()
    out.put((ok and src.pid == os.getpid(), rss > 0 and src._root.pid == os.getpid()))


def test_host_children_there_at_start_are_primed_with_the_main() -> None:
    """A child running when the sampler primes has a CPU reading from the first sample on."""
    stop = multiprocessing.get_context("fork").Event()
    child = multiprocessing.get_context("fork").Process(target=_spin_until, args=(stop,))
    child.start()
    try:
        wait_for(lambda: child.pid in [p.pid for p in psutil.Process().children()])
        s = HostSampler(hz=10)
        assert s.prime()
        time.sleep(0.1)
        s.sample()
        (entry,) = [p for p in s.to_dict()["per_process"] if p["pid"] == child.pid]
        assert entry["role"] == "child" and entry["cpu_max"] is not None
        assert entry["cpu_max"] > 0 and s.to_dict()["timeline"]["children_cpu"][0] > 0
        s.close()
        if host_module._procfs_available():  # the source is kept, the running child let go
            assert f"/proc/{child.pid}/stat" not in _proc_fds()
    finally:
        stop.set()
        child.join(10)


def test_host_children_look_ups_keep_to_their_cpu_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where nothing tells when a process started (no /proc: every sample may look), look-ups
    stop once their CPU budget is spent, and go on as it refills."""
    monkeypatch.setattr(host_module, "_procfs_available", lambda: False)
    monkeypatch.setattr(host_module, "DISCOVERY_BURST_NS", 0)  # no credit beyond the refill
    monkeypatch.setattr(host_module, "DISCOVERY_SHARE", 1e-12)  # which is ~nothing
    s = HostSampler(hz=10)
    assert s.prime() and s.lookups == 1  # the first look-up is free, and spends the credit
    for _ in range(3):
        s.sample()
    assert s.lookups == 1
    monkeypatch.setattr(host_module, "DISCOVERY_SHARE", 1e12)  # refilled at once
    for _ in range(3):
        s.sample()
    assert s.lookups == 4 and s.errors == 0
    s.close()


def test_memory_is_first_read_once_the_start_up_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """NOTE [ Private memory ]: no process's memory is read in the sampler's first
    MEMORY_FIRST_NS (a run's start-up, when its cores are busiest: reading a 300 MB process
    walks its page tables for 7 ms), then as before; and ``pipeprof run`` makes the host source
    before the script runs (``host.prepare``), not where its first loop starts."""
    from pipeprof.attach.run import Run

    monkeypatch.setattr(host_module, "MEMORY_SHARE", 1.0)
    monkeypatch.setattr(host_module, "MEMORY_EVERY_NS", 0)
    monkeypatch.setattr(host_module, "MEMORY_FIRST_NS", 300 * MS)
    s = HostSampler(hz=10)
    assert s.prime()
    for _ in range(3):
        s.sample()
        time.sleep(0.02)
    assert all(p.memory == [] for p in s._procs.values())
    time.sleep(0.3)
    s.sample()  # one process a sample: a child of the test process's first, if it has one
    (read,) = [p for p in s._procs.values() if p.memory]
    assert len(read.memory) == 1 and read.memory[0][1] > 0
    s.close()
    host_module._POOL.clear()
    run = Run(sample_hz=10)
    run.install()
    try:
        assert [src.pid for src in host_module._POOL] == [os.getpid()]
    finally:
        run.uninstall()
    host_module._POOL.clear()
    run = Run(sample_hz=0)  # no sampling: no source either
    run.install()
    run.uninstall()
    assert host_module._POOL == []


@needs_procfs
def test_procfs_readings_agree_with_psutil() -> None:
    """The /proc parsers read what psutil reads: core times, disk reads, a process's CPU and RSS,
    and children recursively (a grandchild too)."""
    src = host_module._Procfs(psutil)
    tree = subprocess.Popen(["sh", "-c", "sleep 30 & wait"], start_new_session=True)
    try:
        # this process may have other children (a spawn resource tracker): wait for the grandchild
        wait_for(lambda: len(psutil.Process(tree.pid).children()) == 1)
        grandchild = psutil.Process(tree.pid).children()[0].pid
        expected = sorted(p.pid for p in psutil.Process().children(recursive=True))
        got = sorted(src.children(os.getpid()))
        assert got == expected and tree.pid in got and grandchild in got
        per_core = psutil.cpu_times(percpu=True)
        cores = src.core_times()
        assert len(cores) == len(per_core) and src.has_iowait
        tick = os.sysconf("SC_CLK_TCK")
        for (busy, total, iowait, steal), times in zip(cores, per_core, strict=True):
            p_busy, p_total = host_module._busy_total(times)
            assert busy / tick == pytest.approx(p_busy, abs=0.2)
            assert total / tick == pytest.approx(p_total, abs=0.5)
            assert iowait / tick == pytest.approx(times.iowait, abs=0.2)
            assert steal / tick == pytest.approx(times.steal, abs=0.2)
        disk = psutil.disk_io_counters()
        read_bytes = src.disk_read_bytes()
        if disk is None:
            assert read_bytes is NA
        else:
            assert read_bytes == pytest.approx(disk.read_bytes, rel=0.01)
        _busy(0.1)
        me = psutil.Process()
        _, cpu_s, rss = src.read(me.pid)
        times = me.cpu_times()
        assert cpu_s == pytest.approx(times.user + times.system, abs=0.05)
        assert rss == pytest.approx(me.memory_info().rss, rel=0.05)
        ident, _, _ = src.read(tree.pid)
        assert ident == src.read(tree.pid)[0] != src.read(me.pid)[0] or tree.pid == me.pid
    finally:
        os.killpg(tree.pid, 9)
        tree.wait(10)
        src.close()


class _Keeping(Dataset):  # type: ignore[type-arg]
    """Each sample keeps ``kb`` of new private memory in its worker (0: none)."""

    def __init__(self, kb: int) -> None:
        self.kb = kb
        self.kept: list[bytearray] = []

    def __len__(self) -> int:
        return 480

    def __getitem__(self, i: int) -> Any:
        if self.kb:
            self.kept.append(bytearray(self.kb * 1024))
        time.sleep(0.01)
        return i


@pytest.mark.parametrize("kb", [0, 256])
def test_private_memory_of_each_worker_is_read_over_time(monkeypatch, kb):
    """NOTE [ Private memory ] in collect/samplers/host.py: each process's RSS, PSS and USS over
    the run, from smaps_rollup. Workers that keep 256 kB a sample (240 samples each: 60 MB)
    show their USS grow by about that; workers that keep nothing do not. The budget is widened
    here so that a 2.4 s run gets several readings a process (a slow machine reads fewer)."""
    monkeypatch.setattr(host_module, "MEMORY_SHARE", 1.0)
    monkeypatch.setattr(host_module, "MEMORY_EVERY_NS", 100 * MS)
    monkeypatch.setattr(host_module, "MEMORY_FIRST_NS", 0)
    loader = DataLoader(_Keeping(kb), batch_size=8, num_workers=2, collate_fn=list)
    prof = pipeprof.Profiler(sample_hz=20)
    with prof:
        for _ in prof.wrap(loader):
            time.sleep(0.005)
    report = prof.report()
    procs = report.to_dict()["host"]["per_process"]
    assert procs[0]["role"] == "main" and procs[0]["uss_max_mb"] is not None
    assert "private memory (USS) at most: main " in report.render("text")
    html = report.render("html")  # a line of each process's USS over time, a point a reading
    chart = html[html.index('<svg class="chart memory"'):]
    chart = chart[: chart.index("</svg>")]
    assert chart.count('data-series="main process"') >= 1
    assert chart.count('data-series="worker pid') >= 2
    read = sum(1 for p in procs for u in p["memory"]["uss_mb"] if u is not None)
    assert chart.count("<circle") == read
    # the loader's workers (the test process may have other children: a resource tracker)
    pids = {w["pid"] for w in report.to_dict()["workers"]}
    workers = [p for p in procs if p["pid"] in pids]
    assert len(workers) == 2 and all(p["role"] == "child" for p in workers)
    for p in workers:
        uss = [u for u in p["memory"]["uss_mb"] if u is not None]
        assert len(uss) >= 3 and p["pss_max_mb"] is not None
        assert all(u <= r for u, r in zip(p["memory"]["uss_mb"], p["memory"]["rss_mb"]))
        # a fresh fork's pages are the training process's: in its RSS, not in its USS
        assert uss[0] < 0.5 * p["memory"]["rss_mb"][0]
        grew = uss[-1] - uss[0]
        if kb:
            assert grew > 25  # of about 60 MB kept, most of it read before the worker ended
        else:
            assert grew < 15
