"""Every torch finding, verdict and loop what-if fires on a real pipeline built to trigger it, and
stays quiet on a near miss. Costs are injected (sleeps, spins) and timed by the code that pays
them, so the evidence each finding carries is checked against that truth.

The core count is hardware: where a rule compares worker counts with cores, ``cores`` fixes what
``os.cpu_count()`` says (the figure the collector records in ``meta.cpu_count``), so the test means
the same on a 2-core laptop and a 64-core server. Samplers are off (``sample_hz=0``) so no host
sampler's ``psutil.cpu_count()`` overrides it.

Not here: ``pin-memory`` fires only for a CUDA device (``check_device`` refuses ``cuda`` without
one); it belongs with the GPU stand-ins.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import statistics
import time
from typing import Any

import pytest
import torch
from pipelines import (
    AddNoise,
    BigSamples,
    Cost,
    CostCollate,
    CostDataset,
    Scale,
    SkewedIterable,
    SlowInit,
    Sometimes,
    TickDataset,
    TorchWork,
    spin,
    truth,
)
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

import pipeprof
from pipeprof.analyze.rules import MODEL_SLACK, STARTUP_SHARE, rule_handover
from pipeprof.render.text import TextRenderer

clock = time.perf_counter_ns
FRACTION_TOL = 0.03  # a loop fraction vs the one timed here: sleep jitter and pipeprof's own work
# Severities follow the truth's side of each threshold. On a loaded machine sleeps overrun and the
# truth can land near a threshold; within BAND of it either side is within the measurement's error.
BAND = 0.03


def side(share: float, threshold: float) -> bool | None:
    """Whether the true ``share`` is at or above ``threshold``; None within BAND of it."""
    return None if abs(share - threshold) < BAND else share >= threshold


def findings(report: dict) -> dict[str, dict]:
    return {f["id"]: f for f in report["findings"]}


def what_if(report: dict) -> dict[str, dict]:
    return {w["kind"]: w for w in report["what_if"] if w["kind"] != "workers"}


@pytest.fixture
def cores(monkeypatch):
    """Make this machine report ``n`` cores (see the module's docstring)."""

    def set_cores(n: int) -> int:
        monkeypatch.setattr(os, "cpu_count", lambda: n)
        return n

    return set_cores


@pytest.fixture
def threads():
    """Set torch's intra-op threads for one test, then put them back."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def run_loop(loader, regions, warm: int = 1, nvml=None):
    """Iterate ``loader`` under a Profiler; each step runs ``regions`` ((name, ms) sleeps) in turn.

    Returns the report and the truth timed here over the steady steps (the first ``warm`` steps
    are start-up, as pipeprof counts them): seconds per region name, wait and wall, and the
    samples and compute seconds over all steps (for the compute rate). ``nvml``: a stand-in
    GPU (tests/fake_nvml.py), sampled at 20 Hz.
    """
    prof = pipeprof.Profiler(sample_hz=20 if nvml is not None else 0, nvml=nvml)
    steps = []  # (t_request, wait_ns, {region: ns}, samples)
    with prof:
        it = iter(prof.wrap(loader))
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                t_end = t0
                break
            wait = clock() - t0
            spent = {}
            for name, ms in regions:
                with prof.region(name):
                    r0 = clock()
                    time.sleep(ms / 1e3)
                    spent[name] = clock() - r0
            steps.append((t0, wait, spent, len(batch[0])))
    steady = steps[warm:]
    true = {"wall": (t_end - steady[0][0]) / 1e9, "wait": sum(s[1] for s in steady) / 1e9}
    for name, _ in regions:
        true[name] = sum(s[2][name] for s in steady) / 1e9
    true["samples"] = sum(s[3] for s in steps)
    true["forward_all"] = sum(s[2].get("Forward", 0) for s in steps) / 1e9
    return prof.report().to_dict(), true


# ---- loop verdicts and their severities ------------------------------------------------------


@pytest.mark.timing
@pytest.mark.parametrize(
    ("load_ms", "forward_ms", "severity"),
    [(2.0, 18.0, "moderate"), (5.0, 5.0, "high")],  # about 10 % and about 50 % waiting
)
def test_input_bound_severity_follows_the_wait_share(load_ms, forward_ms, severity):
    loader = DataLoader(CostDataset(20, load_ms=load_ms), batch_size=1)
    report, true = run_loop(loader, [("Forward", forward_ms)])
    verdict = report["verdict"]
    share = true["wait"] / true["wall"]
    assert side(share, 0.05) is not False  # the truth: input-bound (a wait of 5 % or more)
    assert verdict["kind"] == "input-bound" and verdict["stage"] == "load"
    assert verdict["fraction"] == pytest.approx(share, abs=FRACTION_TOL)
    high = side(share, 0.20)  # ``severity`` where the machine let the sleeps keep time
    if high is not None:
        assert verdict["severity"] == ("high" if high else "moderate")
    lo, hi = verdict["wait_fraction_interval"]  # steady sleeps: a narrow interval, no doubt
    assert lo <= verdict["fraction"] <= hi and hi - lo < 0.05
    assert not verdict["borderline"] and "borderline" not in verdict["headline"]
    # a moderate wait is called so, with the most that removing it could give
    gain = f"(at most ×{1 / (1 - verdict['fraction']):.2f} faster if it took no time)"
    moderately = verdict["headline"].startswith(f"moderately input-bound {gain}: ")
    assert moderately == (severity == "moderate"), verdict["headline"]


@pytest.mark.timing
def test_ten_identical_runs_near_the_threshold_give_one_answer():
    """A loop that waits about 5 % of the time, unevenly (one sample in 18 costs 10 ms, a
    19 ms step): its runs fall either side of the threshold, 3.5-7 %. Each says so with the
    interval where a rerun lands, and ten runs give the same answer at least nine times."""
    answers, fractions = [], []
    for _ in range(10):
        loader = DataLoader(Sometimes(100, p=0.055, ms=10.0), batch_size=1)
        report, true = run_loop(loader, [("Forward", 19.0)])
        v = report["verdict"]
        lo, hi = v["wait_fraction_interval"]
        view = report["loop"]["steady"]
        assert lo <= view["wait_fraction"] <= hi
        assert view["wait_fraction"] == pytest.approx(true["wait"] / true["wall"], abs=FRACTION_TOL)
        assert v["borderline"] == ("borderline" in v["headline"])
        answers.append("borderline" if v["borderline"] else v["kind"])
        fractions.append(view["wait_fraction"])
    top = max(set(answers), key=answers.count)
    assert answers.count(top) >= 9, (answers, fractions)
    assert not {"input-bound", "compute-bound"} <= set(answers), (answers, fractions)


class EveryThird(Dataset):
    """Sample i costs 8 ms (sleep) when i is a multiple of 3, else nothing."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i % 3 == 0:
            time.sleep(0.008)
        return torch.zeros(3), i


@pytest.mark.timing
def test_a_run_too_short_to_tell_says_so_and_a_longer_one_does_not():
    """Five steady steps, one in three waiting 8 ms beside a 10 ms step: the wait share's 95 %
    interval spans most of 0-100 %, and the verdict says the run is too short to tell and how
    many steps it had, not "borderline" with that interval. The same loop over 40 steps is
    narrow enough to be a verdict."""
    short, _ = run_loop(DataLoader(EveryThird(6), batch_size=1), [("Forward", 10.0)])
    v = short["verdict"]
    lo, hi = v["wait_fraction_interval"]
    assert hi - lo >= 0.5 and v["too_short"] and v["borderline"]
    assert "too short to tell" in v["headline"] and "over 5 steps" in v["headline"]
    assert "profile more steps" in v["headline"] and "either side" not in v["headline"]
    long, _ = run_loop(DataLoader(EveryThird(40), batch_size=1), [("Forward", 10.0)])
    v = long["verdict"]
    assert not v["too_short"] and "too short" not in v["headline"]
    assert v["kind"] == "input-bound"  # a third of the steps wait 8 ms of 18: about 15 %


@pytest.mark.timing
@pytest.mark.parametrize(
    ("h2d_ms", "forward_ms", "severity"),
    [(2.0, 18.0, "moderate"), (6.0, 2.0, "high")],  # about 10 % and about 70 % copying
)
def test_transfer_bound_verdict_and_transfer_finding(h2d_ms, forward_ms, severity):
    loader = DataLoader(CostDataset(20), batch_size=1)
    report, true = run_loop(loader, [("H2D", h2d_ms), ("Forward", forward_ms)])
    share = true["H2D"] / true["wall"]
    verdict = report["verdict"]
    assert verdict["kind"] == "transfer-bound" and verdict["stage"] == "transfer/h2d"
    high = side(share, 0.20)  # ``severity`` where the machine let the sleeps keep time
    if high is not None:
        assert verdict["severity"] == ("high" if high else "moderate")
    assert verdict["fraction"] == pytest.approx(share, abs=FRACTION_TOL)
    f = findings(report)["transfer"]
    assert (f["severity"], f["stage"]) == ("warning", "transfer/h2d")
    assert f["evidence"]["transfer_fraction"] == pytest.approx(share, abs=FRACTION_TOL)
    assert f["evidence"]["pin_memory"] is False and "pin_memory=True" in f["fix"]


@pytest.mark.timing
def test_overhead_bound_verdict_and_overhead_regions_finding():
    loader = DataLoader(CostDataset(20), batch_size=1)
    report, true = run_loop(loader, [("Log", 4.0), ("Forward", 4.0)])
    share = true["Log"] / true["wall"]
    verdict = report["verdict"]
    assert (verdict["kind"], verdict["severity"], verdict["stage"]) == (
        "overhead-bound",
        "high",
        None,
    )
    assert verdict["fraction"] == pytest.approx(share, abs=FRACTION_TOL)
    f = findings(report)["overhead-regions"]
    assert (f["severity"], f["stage"]) == ("warning", None)
    assert f["evidence"]["region"] == "Log" and "'Log' every 10 steps" in f["fix"]
    assert f["evidence"]["overhead_fraction"] == pytest.approx(share, abs=FRACTION_TOL)
    assert f["evidence"]["region_s"] == pytest.approx(true["Log"], rel=0.15)  # steady vs all


def _logging_loop(every: int) -> float:
    """20 steps of 4 ms compute, logging (4 ms) every ``every`` steps: wall seconds, plain."""
    t0 = clock()
    for i, _ in enumerate(DataLoader(CostDataset(20), batch_size=1)):
        if i % every == 0:
            time.sleep(0.004)
        time.sleep(0.004)
    return (clock() - t0) / 1e9


@pytest.mark.timing
def test_the_overhead_regions_fix_saves_what_it_promises():
    """Followed: logging every 10 steps instead of every step saves at least 90 % of the
    seconds the finding promised (plain loops, side by side)."""
    loader = DataLoader(CostDataset(20), batch_size=1)
    report, _ = run_loop(loader, [("Log", 4.0), ("Forward", 4.0)], warm=0)
    f = findings(report)["overhead-regions"]
    promised = f["evidence"]["gain_s"]
    assert f["evidence"]["every"] == 10 and f"{promised:.3g} s" in f["fix"]
    saved = [_logging_loop(1) - _logging_loop(10) for _ in range(3)]
    assert 0.9 * promised <= statistics.median(saved) <= 1.3 * promised, (saved, promised)


@pytest.mark.timing
def test_small_copies_and_logging_leave_a_compute_bound_loop():
    """The near miss of the three above: 1 % each of copying and logging, data ready."""
    loader = DataLoader(CostDataset(8), batch_size=1)
    report, true = run_loop(loader, [("H2D", 0.3), ("Log", 0.3), ("Forward", 60.0)])
    assert max(true["wait"], true["H2D"], true["Log"]) / true["wall"] < 0.05 - BAND
    verdict = report["verdict"]
    assert verdict["kind"] == "compute-bound" and verdict["severity"] == "low"
    assert verdict["stage"] is None
    assert verdict["fraction"] == pytest.approx(true["Forward"] / true["wall"], abs=FRACTION_TOL)
    assert not {"transfer", "overhead-regions", "workers-needed"} & set(findings(report))


# ---- workers: needed, none, saturated, too many ----------------------------------------------


@pytest.mark.timing
def test_workers_needed_and_the_loop_what_ifs():
    """One worker makes 4 ms samples; the loop computes a 4-sample batch in 4 ms (1000/s). 40
    batches: a larger pool's start-up (priced in) is a small part of a run this long."""
    loader = DataLoader(CostDataset(160, load_ms=4.0), batch_size=4, num_workers=1)
    report, true = run_loop(loader, [("Forward", 4.0)], warm=1)
    compute_rate = true["samples"] / true["forward_all"]
    loop_rate = report["loop"]["throughput"]["compute_samples_per_s"]
    # compute is the step outside the wait, a little more than the Forward region
    assert compute_rate * 0.85 <= loop_rate <= compute_rate * 1.01
    assert report["verdict"]["kind"] == "input-bound" and report["verdict"]["severity"] == "high"
    f = findings(report)["workers-needed"]
    ev = f["evidence"]
    assert (f["severity"], f["stage"]) == ("critical", "load")
    assert ev["num_workers"] == 1
    per_worker = ev["samples_per_s_per_worker"]
    assert 1000 / 4.0 * 0.8 <= per_worker <= 1000 / 4.0  # 4 ms of sleep plus the worker's overhead
    # the loop's floor: compute plus the hand-over of a ready batch (2-4 ms a batch on this
    # shared VM, whatever its size), so under the compute rate
    floor = ev["loop_floor_samples_per_s"]
    assert floor <= loop_rate * 1.001
    assert ev["handover_ms_per_step"] >= 0 and ev["compute_ms_per_step"] > 0
    step_ms = ev["compute_ms_per_step"] + ev["handover_ms_per_step"]  # no copy, no other region
    assert floor == pytest.approx(4 * 1e3 / step_ms, rel=0.02)
    assert ev["workers_needed"] >= math.ceil(floor * 0.9 / per_worker)  # about 4 from the truth
    assert ev["predicted_samples_per_s"] <= floor + 0.1
    rows = what_if(report)
    assert rows["data-free"]["samples_per_s"] == pytest.approx(floor, abs=0.1)
    assert rows["workers-for-compute"]["workers"] == ev["workers_needed"]


@pytest.mark.timing
def test_following_workers_needed_delivers_what_it_promised():
    """Storage-bound reads (6 ms per sample, one worker) and a 10 ms GPU-like step: the finding's
    num_workers, applied to the plain loop, runs at >= 90 % of the rate it promised, hand-over
    included (docs/findings.md, workers-needed)."""
    dataset = CostDataset(480, load_ms=6.0)
    loader = DataLoader(dataset, batch_size=8, num_workers=1)
    report, _ = run_loop(loader, [("Forward", 10.0)], warm=1)
    f = findings(report)["workers-needed"]
    need, promised = f["evidence"]["workers_needed"], f["evidence"]["predicted_samples_per_s"]
    assert f["fix"] == f"DataLoader(num_workers={need})"
    fixed = DataLoader(dataset, batch_size=8, num_workers=need)
    rates = []
    for _ in range(3):  # the best of three epochs: a neighbour's burst only ever slows some
        arrivals, samples = [], 0
        for x, _ in fixed:
            arrivals.append(clock())
            samples += len(x)
            time.sleep(0.010)
        arrivals.append(clock())
        steady = arrivals[need:]  # after every worker's first batch, as pipeprof counts
        rates.append(8 * (len(steady) - 1) / ((steady[-1] - steady[0]) / 1e9))
    assert max(rates) >= 0.9 * promised, (rates, promised, f["evidence"])


def _two_epochs_of(loader, step_s: float, profiled: bool) -> tuple[float, Any]:
    """Two epochs of ``loader`` with a ``step_s`` step (a sleep): samples/s over the run as the
    loop's rate counts it (each epoch from its first request to its last step's end; the
    workers' shutdown after the last batch is not the loop's), and the report."""
    prof = pipeprof.Profiler(sample_hz=0)
    spent = samples = 0
    with prof if profiled else contextlib.nullcontext():
        for _ in range(2):
            t0 = clock()
            for x, _ in prof.wrap(loader) if profiled else loader:
                time.sleep(step_s)
                samples += len(x)
                t_end = clock()
            spent += t_end - t0
    return samples / (spent / 1e9), prof.report().to_dict() if profiled else None


def _two_epochs(workers: int, profiled: bool) -> tuple[float, Any]:
    """Storage-bound reads (4 ms a sample, batches of 8), a 10 ms step, workers that take
    150 ms to start, started again each epoch (``_two_epochs_of``)."""
    loader = DataLoader(CostDataset(96, load_ms=4.0), batch_size=8, num_workers=workers,
                        worker_init_fn=InitSleep(150.0))  # fmt: skip
    return _two_epochs_of(loader, 0.010, profiled)


@pytest.mark.timing
def test_workers_needed_prices_in_the_start_up_a_run_like_this_pays():
    """Where start-up is a large part of the run (workers started again each epoch), the finding
    gives the rate over a run like this one besides the steady rate, and the followed run,
    start-up included, delivers at least 90 % of the former (the steady rate alone it would
    miss by far: start-up is about half of this run)."""
    _, report = _two_epochs(1, profiled=True)
    f = findings(report)["workers-needed"]
    ev = f["evidence"]
    need, steady = ev["workers_needed"], ev["predicted_samples_per_s"]
    run = ev["predicted_run_samples_per_s"]
    assert f["fix"] == f"DataLoader(num_workers={need})"
    assert "over a run like this one" in f["message"]
    assert ev["startup_wait_s"] >= 2 * 0.15  # two starts, each at least the init's sleep
    assert run < 0.8 * steady
    rates = sorted(_two_epochs(need, profiled=False)[0] for _ in range(3))
    assert rates[1] >= 0.9 * run, (rates, ev)
    assert rates[1] <= 1.3 * run, (rates, ev)  # not a wild under-promise either


class MatmulSamples(torch.utils.data.Dataset):
    """Samples that cost CPU in torch (about 0.2 ms each): loading that needs a core."""

    def __len__(self):
        return 16 * 30

    def __getitem__(self, i):
        x = torch.ones(64, 64)
        for _ in range(6):
            x = torch.tanh(x @ x.T / 64)
        return x.flatten()[:256], i % 2


def cpu_training(workers: int, profile: bool):
    """A CPU training loop whose step keeps every core busy (torch threads = cores): returns
    its report, or its steady samples/s run plain."""
    cores = os.cpu_count() or 1
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 2))  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(MatmulSamples(), batch_size=16, num_workers=workers)

    def step(x, y):
        for _ in range(4):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    try:
        if profile:
            prof = pipeprof.Profiler(sample_hz=0)
            with prof:
                for x, y in prof.wrap(loader):
                    step(x, y)
            return prof.report().to_dict()
        t0 = n = 0
        for i, (x, y) in enumerate(loader):
            if i == 3:
                t0, n = clock(), 0
            step(x, y)
            n += len(x)
        return n / ((clock() - t0) / 1e9)
    finally:
        torch.set_num_threads(before)


@pytest.mark.timing
def test_cpu_training_that_fills_the_cores_is_not_promised_the_loaders_rate():
    """CPU training with torch using every core, loading in the training process (issue 17: the
    report promised x1.21 from one worker; following it gained nothing). The step's share of the
    cores is counted: no worker count is promised as a fix, no loader-only rate reads as the
    loop's, and one worker, tried, is indeed no faster (NOTE [ CPU training shares the cores ])."""
    report = cpu_training(0, profile=True)
    assert report["verdict"]["kind"] in ("input-bound", "compute-bound")
    f = findings(report)
    assert "no-workers" not in f  # its loader-only promise would mislead here
    needed = f.get("workers-needed")
    if report["verdict"]["kind"] == "input-bound":
        assert needed["severity"] == "info" and needed["evidence"]["training_cores"] >= 1
        assert needed["evidence"]["predicted_samples_per_s"] < 1.1 * needed["evidence"][
            "predicted_now_samples_per_s"
        ]
    floor = report["loop"]["throughput"]["compute_samples_per_s"]
    for row in (w for w in report["what_if"] if w["kind"] == "workers"):
        assert row["samples_per_s"] <= floor * 1.01  # the loop's rate, not the loader's
        assert row["loader_samples_per_s"] > row["samples_per_s"]
    plain = [cpu_training(k, profile=False) for k in (0, 1)]
    assert plain[1] < 1.1 * plain[0], plain  # what the report said: no real gain


def _storage_epochs(workers: int, profiled: bool) -> tuple[float, Any]:
    """The held-out framework loop's shape: reads that wait 1.5 ms a sample, batches of 32, a
    7 ms step, 2 epochs of 80 batches, workers started again each epoch (``_two_epochs_of``).
    (48 batches an epoch, the held-out loop's, put one worker's start-up past 5 % of the run
    on a loaded machine, where forking takes longer: 0.31 s of 5.8.)"""
    loader = DataLoader(CostDataset(2560, load_ms=1.5), batch_size=32, num_workers=workers)
    return _two_epochs_of(loader, 0.007, profiled)


@pytest.mark.timing
def test_workers_needed_prices_the_start_up_of_the_run_it_promises():
    """One worker's start-up is under 5 % of this run, so it went unpriced; but the run the fix
    makes is 5 times faster and as much start-up is a sixth of it or more, and a larger pool takes
    longer to fork (``meta.worker_start_ms``, each): 5-6 workers were promised the steady
    2,972-3,419 samples/s of the held-out framework loop, which delivered 0.74-0.79 of it. The
    share is judged on the run as it will be, the pool's forks counted: followed, the fix
    delivers at least 90 % of the rate it gives over such a run, and not far more."""
    _, report = _storage_epochs(1, profiled=True)
    assert report["meta"]["worker_start_ms"] > 0
    f = findings(report)["workers-needed"]
    ev = f["evidence"]
    need, run = ev["workers_needed"], ev["predicted_run_samples_per_s"]
    assert f["fix"] == f"DataLoader(num_workers={need})"
    # unpriced before: the old rule judged the start-up's share on the run as it was
    assert ev["startup_wait_s"] < STARTUP_SHARE * report["loop"]["wall_s"]
    assert run is not None and "over a run like this one" in f["message"], ev
    rates = sorted(_storage_epochs(need, profiled=False)[0] for _ in range(3))
    assert rates[1] >= 0.9 * run, (rates, ev)
    # not far more: a pool's forks priced too high would promise too little. 1.3 held until a
    # loaded machine (2026-11-29) delivered 1.36-1.40 of it, the forks measured in the profiled
    # run slower than the plain ones': how to make the bound not depend on load is open
    assert rates[1] <= 1.5 * run, (rates, ev)


def cpu_step(ms: float) -> None:
    """A training step of ``ms`` of this thread's CPU (one core, as a small model's is): under
    contention it takes longer, as real compute does."""
    end = time.thread_time_ns() + int(ms * 1e6)
    while time.thread_time_ns() < end:
        pass


def _one_core_training(workers: int, profile: bool, samples: int = 160):
    """CPU-bound loading (7.5 ms of torch CPU a sample, batches of 4) and a 10 ms CPU step on
    one core: its report, or its steady samples/s run plain, from the batch after the workers'
    first prefetched ones (2 each: made while the loop had not started, they would lift a short
    run's rate past what the cores give)."""
    loader = DataLoader(CostDataset(samples, transform=TorchWork(7.5)), batch_size=4,
                        num_workers=workers)  # fmt: skip
    if profile:
        prof = pipeprof.Profiler(sample_hz=0)
        with prof:
            for _ in prof.wrap(loader):
                with prof.region("Forward"):
                    cpu_step(10.0)
        return prof.report().to_dict()
    arrivals = []
    for _ in loader:
        arrivals.append(clock())
        cpu_step(10.0)
    steady = arrivals[2 * workers :]
    return 4 * (len(steady) - 1) / ((steady[-1] - steady[0]) / 1e9)


@pytest.mark.timing
def test_cpu_training_on_one_core_is_promised_what_the_spare_core_gives():
    """A CPU step on one of 2 cores, starved by CPU-bound workers: the pipeline's CPU that does
    not fit on the spare core delays the step (NOTE [ CPU training shares the cores ]). The
    step's time solves ``s = floor + max(0, cpu - spare * s)``; iterated, that equation swung
    between two values and stopped at its start, the step as if loading cost it nothing: it
    promised 6 workers about 217 samples/s where the cores give at most 200, and 6 workers ran
    at 188 (the README's demo: 386 promised, 300 measured, slower than before). No worker count
    is promised past what the cores can do. Workers that compute beside the step past the
    cores are a regime the model has not measured (on the diagnosis matrix such promises ran
    0.78-0.80 of their figure): a hint, "worth trying, not measured". Followed, its figure
    holds here still (3 workers: 184-187 given, 187 measured over 160 batches)."""
    report = _one_core_training(1, profile=True)
    assert report["verdict"]["kind"] == "input-bound", report["verdict"]
    f = findings(report)["workers-needed"]
    ev = f["evidence"]
    assert ev["training_cores"] == 1, ev
    need, promised = ev["workers_needed"], ev["predicted_samples_per_s"]
    cores = os.cpu_count() or 1
    # the cores' bound: the loading's CPU a batch (7.5 ms x 4) and the step's (10 ms) share them
    assert promised <= 1.02 * 4e3 * cores / (4 * 7.5 + 10.0), ev
    for row in (w for w in report["what_if"] if w["kind"] == "workers"):
        assert row["samples_per_s"] <= 1.02 * 4e3 * cores / (4 * 7.5 + 10.0), row
        assert (row.get("measured_samples_per_s") is not None) == (row["workers"] == 1), row
    assert f["severity"] == "info", f  # no promise: a hint, or no gain seen, or cannot tell
    if f["fix"].startswith("none") or "cannot tell" in f["message"]:
        return
    assert need + 1 > cores and "a regime not measured" in f["message"], f
    assert f["fix"].startswith(f"worth trying, not measured: DataLoader(num_workers={need})"), f
    followed = _one_core_training(need, profile=False, samples=640)
    assert followed >= 0.9 * promised, (followed, ev)


@pytest.mark.timing
def test_a_compute_bound_loop_needs_no_workers_and_a_loader_alone_no_loop_what_ifs():
    # in the main process: a batch from a worker costs about 2 ms to hand over (shared-memory
    # file descriptors), with or without pipeprof, which is a wait of its own
    loader = DataLoader(CostDataset(16, load_ms=0.1), batch_size=4)
    report, true = run_loop(loader, [("Forward", 100.0)])
    assert true["wait"] / true["wall"] < 0.05
    assert report["verdict"]["kind"] == "compute-bound"
    assert "workers-needed" not in findings(report)
    assert {"data-free", "workers-for-compute"} <= set(what_if(report))
    alone = pipeprof.profile(loader).to_dict()  # no loop: no compute rate to feed
    assert alone["what_if"] and not {"data-free", "workers-for-compute"} & set(what_if(alone))


@pytest.mark.timing
def test_no_workers_names_the_loading_rate(tmp_path):
    ds = CostDataset(40, load_ms=2.0, log_dir=str(tmp_path))
    loader = DataLoader(ds, batch_size=4, collate_fn=CostCollate(0.0, str(tmp_path)))
    report = pipeprof.profile(loader).to_dict()
    f = findings(report)["no-workers"]
    assert (f["severity"], f["stage"]) == ("warning", "load")
    true = truth(str(tmp_path))
    true_rate = 40 / ((sum(true["load"]) + sum(true["collate"])) / 1e9)
    assert f["evidence"]["samples_per_s_per_worker"] == pytest.approx(true_rate, rel=0.12)
    assert f["evidence"]["cores"] == os.cpu_count()


@pytest.mark.timing
def test_workers_saturated_when_one_worker_is_always_busy(cores, tmp_path):
    """The worker's busy share counts the whole profile, its start-up (fork: 0.05-0.15 s on a
    loaded machine) included: 1.2 s of loading keeps that under 15 %."""
    n_cores = cores(8)
    ds = CostDataset(480, load_ms=2.5, log_dir=str(tmp_path))
    report = pipeprof.profile(DataLoader(ds, batch_size=12, num_workers=1)).to_dict()
    f = findings(report)["workers-saturated"]
    ev = f["evidence"]
    assert (f["severity"], f["stage"]) == ("info", "load")
    assert (ev["num_workers"], ev["cores"]) == (1, n_cores)
    assert f"num_workers={n_cores - 1}" in f["fix"]
    load_s = sum(truth(str(tmp_path))["load"]) / 1e9
    assert ev["busy_fraction"] >= 0.85
    assert load_s / report["wall_s"] <= ev["busy_fraction"] <= load_s / report["wall_s"] + 0.08
    assert ev["samples_per_s_per_worker"] == pytest.approx(480 / load_s, rel=0.12)
    assert "no-workers" not in findings(report)


@pytest.mark.timing
def test_an_idle_worker_behind_slow_compute_is_not_saturated(cores):
    cores(8)
    loader = DataLoader(CostDataset(40, load_ms=1.0), batch_size=4, num_workers=1)
    report, _ = run_loop(loader, [("Forward", 20.0)])
    assert report["workers"][0]["busy_fraction"] < 0.5  # 4 ms of work per 20 ms step
    assert not {"workers-saturated", "no-workers", "cpu-oversubscribed"} & set(findings(report))


@pytest.mark.serial  # the rule reads the workers' share of a core: another test's load is in it
@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(("workers", "computes"), [(3, True), (2, True), (3, False)])
def test_cpu_oversubscribed_when_computing_workers_outnumber_cores(cores, workers, computes):
    """Workers that compute and outnumber the cores: a hint. Workers that sleep (storage) are
    right to outnumber them: no finding (fewer of them would slow the loader)."""
    n_cores = cores(2)
    # storage-like waits of 20 ms a batch: a worker's own CPU per batch (the queue, pickling,
    # shared memory: 1-5 ms here, more on its first batch) stays well under half of it
    ds = CostDataset(12, transform=Cost(2.0)) if computes else CostDataset(12, load_ms=10.0)
    loader = DataLoader(ds, batch_size=2, num_workers=workers)
    found = findings(pipeprof.profile(loader).to_dict())
    if workers <= n_cores or not computes:
        assert "cpu-oversubscribed" not in found
        return
    f = found["cpu-oversubscribed"]
    assert (f["severity"], f["stage"]) == ("info", None)
    ev = f["evidence"]
    assert (ev["num_workers"], ev["cores"]) == (3, 2) and ev["cpu_share"] >= 0.5
    assert ev["torch_threads"] == torch.get_num_threads()
    assert "num_workers=1" in f["fix"] and "not measured" in f["fix"]


def spin_loop(loader, step_ms: float):
    """A CPU training step: ``step_ms`` of this thread's CPU per batch."""
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(loader):
            with prof.region("Forward"):
                spin(step_ms)
    return prof.report().to_dict()


@pytest.mark.timing
def test_threads_oversubscribed_only_on_evidence_of_contention(threads):
    """More threads than cores is not by itself a problem: a compute-bound CPU loop with idle
    workers gets no finding (following it slowed such a run by 25 %); a starved loop whose
    cores are full gets a hint, not a promise."""
    n_cores = os.cpu_count() or 1
    threads(n_cores)
    idle = DataLoader(CostDataset(24), batch_size=2, num_workers=1)
    report = spin_loop(idle, 50.0)
    assert report["verdict"].get("cause") != "starved"  # compute-bound, or the hand-over alone
    assert "threads-oversubscribed" not in findings(report)
    # starved by reads that wait on storage: the cores sit idle, fewer threads would not help
    waiting = DataLoader(CostDataset(40, load_ms=5.0), batch_size=2, num_workers=1)
    report = spin_loop(waiting, 2.0)
    assert report["verdict"]["kind"] == "input-bound"
    assert "threads-oversubscribed" not in findings(report)
    n = n_cores + 1  # workers computing in torch, and the training step: more than the cores
    busy = DataLoader(CostDataset(40 * n, transform=TorchWork(8.0)), batch_size=2, num_workers=n)
    report = spin_loop(busy, 6.0)
    assert report["verdict"]["kind"] == "input-bound"  # starved, or slow hand-overs: full cores
    used = report["meta"]["main_cpu_ns"] / 1e9 + sum(w["cpu_s"] for w in report["workers"])
    cores_used = used / report["wall_s"]
    if cores_used < 0.85 * n_cores and "threads-oversubscribed" not in findings(report):
        # a shared VM whose host took the CPU (steal): these processes could not fill the cores
        pytest.skip(f"this run's processes got {cores_used:.2f} of {n_cores} cores")
    f = findings(report)["threads-oversubscribed"]
    ev = f["evidence"]
    assert f["severity"] == "info" and f["fix"].startswith("worth trying, not measured")
    assert ev["main_cores"] + ev["worker_cores"] >= 0.85 * n_cores
    assert (ev["num_workers"], ev["torch_threads"], ev["cores"]) == (n, n_cores, n_cores)
    # a loader profiled alone has no training process to oversubscribe
    assert "threads-oversubscribed" not in findings(pipeprof.profile(busy).to_dict())


# ---- the pipeline: dominant stage, imbalance, start-up, pipeprof's own overhead ----------------


def _compose_run(tmp_path, ms: dict[str, float], load_ms: float = 0.0):
    """Transforms that spin (exact wall time even on a loaded machine, unlike a sleep)."""
    steps = [c(ms[c.__name__], str(tmp_path)) for c in (Cost, Scale, AddNoise) if c.__name__ in ms]
    ds = CostDataset(24, load_ms=load_ms, log_dir=str(tmp_path))
    ds.transform = transforms.Compose(steps)
    loader = DataLoader(ds, batch_size=4, collate_fn=CostCollate(0.0, str(tmp_path)))
    report = pipeprof.profile(loader).to_dict()
    true = {k: sum(v) / 1e9 for k, v in truth(str(tmp_path)).items()}
    return report, true


@pytest.mark.timing
@pytest.mark.parametrize(
    ("ms", "severity"),
    [({"Scale": 4.0}, "warning"), ({"Scale": 2.2, "AddNoise": 1.8}, "info")],  # ~95 %, ~55 %
)
def test_dominant_stage_share_and_severity(tmp_path, ms, severity):
    report, true = _compose_run(tmp_path, ms)
    top = max(true, key=lambda k: true[k])  # Scale, unless a loaded machine stretched AddNoise
    share = true[top] / sum(true.values())
    assert side(share, 0.4)
    f = findings(report)["dominant-stage"]
    assert f["stage"] == top
    warning = side(share, 0.6)  # ``severity`` where the machine let the spins keep time
    if warning is not None:
        assert f["severity"] == ("warning" if warning else "info")
    assert f["evidence"]["share"] == pytest.approx(share, abs=0.05)
    assert f["evidence"]["per_sample_ms"] == pytest.approx(true[top] * 1e3 / 24, rel=0.1)
    assert f"{top.split('/')[1]} runs once per sample" in f["fix"]


@pytest.mark.timing
@pytest.mark.parametrize("ms", [{"Scale": 2.0, "AddNoise": 2.0}, {"Scale": 3.0, "AddNoise": 1.5}])
def test_the_limiting_stage_is_named_alone_only_with_a_margin(tmp_path, ms):
    """Two transforms that cost the same trade places between identical runs: both are named,
    with their gap; at 2:1 the larger one is named alone."""
    report, true = _compose_run(tmp_path, ms)
    a, b = sorted(("transform/Scale", "transform/AddNoise"), key=lambda k: true[k], reverse=True)
    gap = 1 - true[b] / true[a]
    v = report["verdict"]
    if 0.05 <= gap <= 0.15:  # a neighbour's burst stretched one spin: either answer may hold,
        # but whichever is given says so (seen in a clean-clone CI run: 7.4 % apart)
        assert v["stage"] in (a, b) and set(v["stages"]) <= {a, b}
        assert (len(v["stages"]) == 2) == (" or " in v["headline"] and "within" in v["headline"])
    elif gap < 0.05:
        assert sorted(v["stages"]) == sorted([a, b]) and v["stage"] in (a, b)
        named = f"{v['stages'][0]} or {v['stages'][1]} (within "
        assert named in v["headline"]
        text = TextRenderer().render_dict(report)  # the panel, its wrapped lines joined
        assert named in " ".join(line.strip("│ ") for line in text.splitlines())
    elif gap > 0.15:
        assert v["stages"] == [a] and v["stage"] == a and " or " not in v["headline"]


@pytest.mark.timing
def test_no_dominant_stage_when_three_stages_share_the_work(tmp_path):
    report, true = _compose_run(tmp_path, {"Cost": 1.5, "Scale": 1.5, "AddNoise": 1.5})
    top = max(true, key=lambda k: true[k])
    dominant = side(true[top] / sum(true.values()), 0.4)  # about 33 % each
    if dominant is False:
        assert "dominant-stage" not in findings(report)
    elif dominant:  # a loaded machine stretched one of them
        assert findings(report)["dominant-stage"]["stage"] == top


@pytest.mark.timing
@pytest.mark.parametrize("factor", [3.0, 1.0])
def test_worker_imbalance_when_one_worker_pays_three_times_more(tmp_path, factor):
    ds = SkewedIterable(40, load_ms=3.0, log_dir=str(tmp_path), slow=1, factor=factor)
    report = pipeprof.profile(DataLoader(ds, batch_size=4, num_workers=2)).to_dict()
    true = truth(str(tmp_path))
    busy = [sum(true[f"worker{i}"]) / 1e9 for i in range(2)]
    true_ratio = max(busy) / (sum(busy) / 2)
    found = findings(report)
    if factor == 1.0:
        assert true_ratio < 1.1 and "worker-imbalance" not in found
        return
    f = found["worker-imbalance"]
    assert (f["severity"], f["stage"]) == ("info", None)
    assert "worker 1 " in f["message"]
    ev = f["evidence"]
    assert ev["ratio"] == pytest.approx(true_ratio, abs=0.12)  # about 1.5
    assert ev["busiest_busy_s"] == pytest.approx(busy[1], rel=0.12)


@pytest.mark.timing
def test_slow_startup_from_a_slow_worker_init_fn(tmp_path):
    loader = DataLoader(
        CostDataset(40, load_ms=2.0),
        batch_size=4,
        num_workers=2,
        worker_init_fn=SlowInit(300.0, str(tmp_path)),
    )
    report = pipeprof.profile(loader).to_dict()
    f = findings(report)["slow-startup"]
    assert (f["severity"], f["stage"]) == ("info", None)
    init_s = max(truth(str(tmp_path))["init"]) / 1e9  # each worker slept once, in parallel
    ev = f["evidence"]
    assert init_s <= ev["startup_s"] <= init_s + 0.25  # + the fork and the first batch (8 ms)
    assert ev["wall_s"] == report["wall_s"] and ev["startup_s"] / ev["wall_s"] >= 0.25
    assert "persistent_workers=True" in f["fix"]


class InitSleep:
    """A ``worker_init_fn`` that sleeps ``ms``: a worker's start made known."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __call__(self, worker_id: int) -> None:
        time.sleep(self.ms / 1e3)


def _epochs(persistent: bool, profiled: bool, epochs: int = 3) -> tuple[float, Any]:
    """Three epochs of a loop whose workers take 250 ms to start: wall seconds, the report."""
    loader = DataLoader(CostDataset(32, load_ms=2.0), batch_size=4, num_workers=2,
                        worker_init_fn=InitSleep(250.0), persistent_workers=persistent)  # fmt: skip
    prof = pipeprof.Profiler(sample_hz=0)
    t0 = clock()
    if profiled:
        with prof:
            for _ in range(epochs):
                for _ in prof.wrap(loader):
                    time.sleep(0.005)
    else:
        for _ in range(epochs):
            for _ in loader:
                time.sleep(0.005)
    wall = (clock() - t0) / 1e9
    return wall, prof.report().to_dict() if profiled else None


@pytest.mark.timing
def test_restarting_workers_every_epoch_is_found_and_keeping_them_pays_what_was_promised():
    """Workers that take 250 ms to start, started again each of 3 epochs: the finding promises
    what persistent_workers=True saves; followed (plain loops, side by side), it delivers at
    least 90 % of that, and a profile of the followed loop no longer finds it."""
    _, report = _epochs(persistent=False, profiled=True)
    f = findings(report)["slow-startup"]
    ev = f["evidence"]
    assert ev["epochs"] == 3 and "persistent_workers=True" in f["fix"]
    assert ev["later_startups_s"] >= 2 * 0.25  # two restarts, each at least the init's sleep
    promised = ev["gain_s"]
    saved = []
    for _ in range(3):  # interleaved: a neighbour's burst hits both
        restarting, _ = _epochs(persistent=False, profiled=False)
        kept, _ = _epochs(persistent=True, profiled=False)
        saved.append(restarting - kept)
    assert statistics.median(saved) >= 0.9 * promised, (saved, promised)
    assert statistics.median(saved) <= 1.5 * promised, (saved, promised)  # not a wild under-promise
    _, after = _epochs(persistent=True, profiled=True)
    assert "slow-startup" not in findings(after)


@pytest.mark.timing
def test_no_slow_startup_when_the_run_is_long_next_to_the_fork():
    loader = DataLoader(CostDataset(200, load_ms=4.0), batch_size=2, num_workers=2)
    t0 = clock()
    report = pipeprof.profile(loader).to_dict()
    assert (clock() - t0) / 1e9 >= 0.4  # 200 × 4 ms over two workers
    assert report["startup_s"] / report["wall_s"] < 0.25
    assert "slow-startup" not in findings(report)


@pytest.mark.timing
def test_profiler_overhead_from_many_empty_stages(tmp_path):
    ticks = 300
    loader = DataLoader(TickDataset(80, ticks, str(tmp_path)), batch_size=4)
    report = pipeprof.profile(loader, stage_every=1).to_dict()  # every tick a region
    f = findings(report)["profiler-overhead"]
    assert (f["severity"], f["stage"]) == ("warning", None)
    over = report["overhead"]
    assert over["events"] >= 80 * ticks
    # what the empty stages cost, timed around: the median sample's, so that a neighbour's burst
    # (this machine is shared) does not count as pipeprof's time
    ticks = truth(str(tmp_path))["ticks"]
    true_s = statistics.median(ticks) * len(ticks) / 1e9
    # the regions are costed by the in-situ probe (NOTE [ In-situ region cost ]): one empty
    # region after each batch's samples, colder than these back-to-back ticks, so it may state
    # more than they cost (seen 1.06-2.1x on a loaded host; the warm calibration gave 0.3x)
    assert 0.5 * true_s <= over["estimated_s"] <= 3.0 * true_s, (true_s, over)
    # back to back, the ticks leave the caches warm: little counted as displaced (a share of
    # 0.03-0.05 seen; 0.33 with two busy loops beside, a neighbour's time inside the ticks)
    assert over["cold_share"] < 0.5, over
    # the share of the CPU the run used (main process: num_workers=0): the empty stages are most
    # of what it did, so the share is large, and at most all of it
    assert over["basis"] == "cpu"
    # (0.22 seen on a loaded run: the main process's CPU also holds the samplers' start)
    assert 0.1 <= f["evidence"]["estimated_fraction"] <= 1.0, over
    assert f["evidence"]["estimated_fraction"] == over["estimated_fraction"]
    # the regions hold nothing but pipeprof: they are about all of the stage time they add to
    assert f["evidence"]["in_stages_fraction"] >= 0.3 and "coarser stages" in f["fix"]


class Evict:
    """A transform that walks ``mb`` MB of fresh memory: between two regions it leaves the
    caches cold, as image work does."""

    def __init__(self, mb: float) -> None:
        self.n = int(mb * 2**20 / 8)

    def __call__(self, x):
        buf = torch.empty(self.n, dtype=torch.float64)
        buf.fill_(1.0)
        return x + float(buf[-1]) - 1.0


def test_regions_between_real_work_are_costed_with_what_they_displace():
    # NOTE [ In-situ region cost ]: a region between cache-evicting transforms costs its cold
    # work (the probe) and about as much again in the user's code after it, which the report
    # counts as the cold probe's excess over the warm one right after it
    chain = transforms.Compose([Evict(4), Evict(4), Evict(4)])
    loader = DataLoader(CostDataset(256, transform=chain), batch_size=8)
    report = pipeprof.profile(loader, stage_every=1).to_dict()  # the probes, not a comparison
    o = report["overhead"]
    assert o["in_situ_ns"] is not None and o["displaced_ns"] > 0
    assert o["displaced_ns"] < o["in_situ_ns"]  # the excess of the cold over the warm probe
    # ... in the stage times the regions add to, and in the total
    stage_s = sum(v["total_s"] for k, v in report["stages"].items() if "/" not in k)
    regions = o["events"] * (o["in_situ_ns"] + o["displaced_ns"]) / 1e9
    assert o["in_stages_fraction"] == pytest.approx(regions / stage_s, rel=1e-3)
    assert o["regions_s"] >= regions + o["pack_s"] - 1e-6
    text = TextRenderer().render_dict(report)  # the panel, its wrapped lines joined
    text = " ".join(" ".join(line.strip("│ ") for line in text.splitlines()).split())
    assert "ns displaced from the code around them" in text


def test_a_short_run_is_costed_in_situ():
    # 4 batches: the median of their probes (MIN_PROBES = 3), not the warm calibration, which
    # states about a third of what a region costs between real transforms
    # (docs/validation/overhead.md)
    chain = transforms.Compose([Evict(4), Evict(4)])
    loader = DataLoader(CostDataset(16, transform=chain), batch_size=4)
    o = pipeprof.profile(loader).to_dict()["overhead"]
    assert o["in_situ_ns"] is not None and o["region_ns"] > o["per_event_ns"], o


@pytest.mark.timing
def test_no_profiler_overhead_for_a_few_stages_around_real_work(tmp_path):
    work = Cost(5.0)  # 5 ms of CPU per sample: real work, which the CPU basis counts
    loader = DataLoader(TickDataset(40, 3, str(tmp_path), transform=work), batch_size=4)
    report = pipeprof.profile(loader).to_dict()
    assert report["overhead"]["events"] >= 40 * 3
    # the regions costed in situ (3.5-5.5 us each here, cold, after 5 ms of work) and packing:
    # 0.013-0.021 seen; 0.021-0.037 when samples cost 2 ms
    assert report["overhead"]["estimated_fraction"] < 0.03
    assert "profiler-overhead" not in findings(report)


# ---- the wait, split: starved vs hand-over (NOTE [ Wait, split ]) -----------------------------


@pytest.mark.timing
def test_a_starved_loader_waits_for_its_stage_not_the_hand_over():
    """One worker, 4 samples of 5 ms per batch: the loader asks long before a batch is ready."""
    report = pipeprof.profile(DataLoader(CostDataset(48, load_ms=5.0), batch_size=4,
                                         num_workers=1)).to_dict()  # fmt: skip
    wait = report["wait"]
    assert wait["split_known"] and wait["batches"] == 11
    assert 20 * 0.7 <= wait["starved_ms_per_batch"] <= 20 * 1.3  # 4 × 5 ms, less the overlap
    # the hand-over: 3.8-4.1 ms quiet (3 ms from a plain loader, stamped in its collate_fn: the
    # result queue's feeder thread and the training process's wake-up), 5.2 ms once in a loaded
    # CI. A split the wrong way round would put ~20 ms here.
    assert wait["handover_ms_per_batch"] < 0.5 * wait["starved_ms_per_batch"]
    assert wait["starved_s"] + wait["handover_s"] == pytest.approx(wait["total_s"], abs=1e-6)
    assert "handover" not in findings(report)


def test_a_loader_alone_s_hand_over_is_named_only_where_its_workers_had_slack():
    """The starved loader above, recorded on a slow day: 6.8 ms of hand-over a batch, one batch
    each 27 ms. Where its one worker was busy most of that time, each hand-over overlapped the
    making of the next batch (NOTE [ Capacity before hand-over ]): no finding (it fired here, and
    its promise would not have held); with the worker idle half the time, it is named."""

    def report(busy_ms: float) -> dict:
        return {"meta": {"num_workers": 1, "sharing_strategy": "file_system"},
                "wait": {"split_known": True, "handover_ms_per_batch": 6.8},
                "steady": {"batches_per_s": 37.0},
                "workers": [{"track": "worker0", "batches": 12, "busy_s": 12 * busy_ms / 1e3}]}

    facts = {"workers": [], "cores": 2, "n_workers": 1}
    assert rule_handover(report(22.5), facts) is None  # busy 0.83 of the time between batches
    found = rule_handover(report(13.5), facts)  # 0.50
    assert found is not None and found["id"] == "handover"


@pytest.mark.timing
def test_ready_batches_wait_in_the_hand_over_and_the_verdict_names_no_stage():
    """Samples cost nothing but weigh 512 KiB (8 MiB a batch): two workers have every batch
    ready long before a 10 ms step asks, so the wait is the hand-over, and no stage limits."""
    loader = DataLoader(BigSamples(16 * 12), batch_size=16, num_workers=2)
    report, _ = run_loop(loader, [("Forward", 10.0)], warm=2)
    steady = report["loop"]["steady"]
    assert report["loop"]["wait_split_known"]
    assert steady["handover_s"] > 4 * steady["starved_s"]
    assert steady["handover_s"] + steady["starved_s"] == pytest.approx(steady["wait_s"], abs=1e-6)
    assert report["wait"]["batch_mb"] == pytest.approx(16 * 512 * 1024 / 1e6, rel=1e-6)
    verdict = report["verdict"]
    assert verdict["kind"] == "input-bound"  # 2-3 ms of hand-over against a 10 ms step
    assert verdict["cause"] == "hand-over" and verdict["stage"] is None
    assert "workers-needed" not in findings(report)
    f = findings(report)["handover"]
    assert f["evidence"]["batch_mb"] == report["wait"]["batch_mb"]
    assert "uint8" not in f["fix"]  # no GPU: converting in the training process costs more


@pytest.mark.timing
def test_a_busy_workers_slow_collate_limits_the_loop_not_the_hand_over():
    """25 ms of Python in collate, one worker, a 4 ms step. With the default file_descriptor
    sharing, each received tensor waits for the worker's GIL, held while it collates the next
    batch: the split reads most of the wait as hand-over. But the worker was busy all along
    (NOTE [ Capacity before hand-over ] in analyze/verdict.py): collate limits, the hand-over
    finding ("larger batches") is not given, and the workers asked for, set on the plain loader,
    deliver >= 90 % of the rate promised for a run like this one, and never less than now."""
    data = CostDataset(32 * 40)
    loader = DataLoader(data, batch_size=32, num_workers=1, collate_fn=CostCollate(25.0))
    report = spin_loop(loader, 4.0)
    verdict, steady = report["verdict"], report["loop"]["steady"]
    assert steady["handover_s"] > 0.5 * steady["wait_s"]  # what the split alone says
    assert verdict["kind"] == "input-bound" and verdict["cause"] == "starved", verdict
    assert verdict["stage"] == "collate" and verdict["workers_busy"] >= 0.8
    assert "overlapped the making of the next" in verdict["headline"]
    assert "handover" not in findings(report)
    ev = findings(report)["workers-needed"]["evidence"]
    promised = ev.get("predicted_run_samples_per_s") or ev["predicted_samples_per_s"]
    rates = []
    for _ in range(2):  # the better of two: a neighbour's burst only ever slows one
        fixed = DataLoader(data, batch_size=32, num_workers=ev["workers_needed"],
                           collate_fn=CostCollate(25.0))  # fmt: skip
        t0, samples = time.perf_counter(), 0
        for x, _ in fixed:
            spin(4.0)
            samples += len(x)
        rates.append(samples / (time.perf_counter() - t0))
    assert max(rates) >= 0.9 * promised, (rates, ev)
    assert min(rates) > ev["samples_per_s_now"], (rates, ev)


@pytest.mark.timing
def test_the_hand_over_fix_sends_fewer_bytes_only_where_a_gpu_converts_them():
    """The same ready-batch loop with a GPU (a stand-in NVML): uint8 batches, converted and
    normalised on the device, are offered; without one they are not (the test above)."""
    from fake_nvml import FakeGpu, FakeNvml

    loader = DataLoader(BigSamples(16 * 12), batch_size=16, num_workers=2)
    nvml = FakeNvml([FakeGpu(util=(30,), samples=None)])
    report, _ = run_loop(loader, [("Forward", 10.0)], warm=2, nvml=nvml)
    assert report["gpu"]["available"] and report["verdict"]["cause"] == "hand-over"
    f = findings(report)["handover"]
    assert "uint8" in f["fix"] and "MB per batch" in f["fix"]


@pytest.mark.timing
def test_a_busy_sampler_is_named_with_the_rate_that_fits():
    """200 samples a second keep the host sampler's thread busy well past 2 % of a core: the
    finding says so, from the thread's own CPU clock, and names the setting to lower."""
    loader = DataLoader(CostDataset(60, load_ms=2.0), batch_size=4, num_workers=1)
    prof = pipeprof.Profiler(sample_hz=200)
    with prof:
        for _ in prof.wrap(loader):
            time.sleep(0.02)
    report = prof.report().to_dict()
    over = report["overhead"]
    first_s = prof.session.costs["sampler_first_ns"] / 1e9  # the start: once a run
    assert 0 < first_s < over["sampler_s"]
    assert over["sampler_cores"] == pytest.approx(
        (over["sampler_s"] - first_s) / report["wall_s"], rel=0.01
    )
    f = findings(report)["profiler-overhead"]
    assert f["evidence"]["sampler_cores"] >= 0.02 and "sample_hz" in f["fix"]
    assert over["estimated_s"] >= over["sampler_s"] + over["main_s"]


@pytest.mark.timing
def test_on_a_compute_bound_loop_stage_findings_are_informational():
    """A transform takes most of the pipeline's time, but the loop computes 80 ms a step while
    two workers make a batch in about 8: the finding stays, as information that says why."""
    loader = DataLoader(CostDataset(48, transform=Cost(2.0, sleep=True)), batch_size=4,
                        num_workers=2)  # fmt: skip
    report, _ = run_loop(loader, [("Forward", 80.0)], warm=2)
    assert report["verdict"]["kind"] == "compute-bound"
    f = findings(report)["dominant-stage"]
    assert f["severity"] == "info" and f["stage"] == "transform/Cost"
    assert "compute-bound: this does not slow training now" in f["message"]
    alone = pipeprof.profile(loader).to_dict()  # no loop: the pipeline's speed is the question
    g = findings(alone)["dominant-stage"]
    assert g["severity"] == "warning" and "compute-bound" not in g["message"]
    assert "on the GPU" not in g["fix"]  # no GPU here: the fix does not send work to one


def two_core_step(ms: float) -> None:
    """A training step of ``ms`` of wall time in torch's intra-op threads: on this machine's 2
    cores it keeps both busy, as a CPU model's larger layers do."""
    a = torch.ones(384, 384)
    end = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < end:
        a = torch.mm(a, a).clamp_(max=1.0)


@pytest.mark.timing
@pytest.mark.parametrize(
    "load_ms,cpu_ms,step_ms",
    [(0.0, 10.0, 40.0), (2.0, 5.0, 20.0)],  # the model reads the run ~1.75x, then ~1.35x, low
)
def test_cpu_training_on_every_core_the_model_reads_low_offers_no_verdict_on_workers(
    load_ms, cpu_ms, step_ms, threads
):
    """A CPU step on all the cores beside CPU-bound loading in 1 worker: the model of the cores
    they share reads the loop 1.35-1.75x under its measured rate. It used to say "more workers
    would not speed this loop up much", yet 2 workers ran these loops 1.19x and 1.5x faster
    (72 -> 86, 103 -> 155 samples/s; and on the README's demo it had said "predicted x0.39").
    Where the model is off by more than the gain it would have to tell (``MODEL_SLACK``), the
    finding says it cannot tell, gives its figures beside the measured one, never their ratio,
    and asks for the run to be measured with more workers."""
    threads(os.cpu_count() or 1)  # the step's ops on every core (a test before may set fewer)
    loader = DataLoader(CostDataset(160, load_ms=load_ms, transform=TorchWork(cpu_ms)),
                        batch_size=4, num_workers=1)  # fmt: skip
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(loader):
            with prof.region("Forward"):
                two_core_step(step_ms)
    report = prof.report().to_dict()
    assert report["verdict"]["kind"] == "input-bound", report["verdict"]
    f = findings(report).get("workers-needed")
    assert f is not None, (report["verdict"].get("cause"), list(findings(report)))
    ev, msg = f["evidence"], f["message"]
    assert ev["training_cores"] == (os.cpu_count() or 1), ev
    assert ev["measured_samples_per_s"] > MODEL_SLACK * ev["predicted_now_samples_per_s"], ev
    assert f["severity"] == "info" and "cannot tell" in msg, f
    assert "would not speed" not in msg and "×" not in msg, msg
    said = [int(n) for n in re.findall(r"\d+", msg)]  # the message rounds what evidence keeps
    for key in ("predicted_samples_per_s", "predicted_now_samples_per_s", "measured_samples_per_s"):
        assert any(abs(n - ev[key]) <= 1 for n in said), (key, msg)
    assert f"DataLoader(num_workers={ev['workers_needed']})" in f["fix"], f


def test_workers_are_saturated_from_their_busy_time_per_batch_over_the_steps():
    """NOTE [ Capacity before hand-over ]: busy time per batch, over the workers, against the
    loop's time per step; 0.8 of it is the line (a near miss at 0.75 is slack)."""
    from pipeprof.analyze.verdict import workers_saturated

    def report(busy_s: float, workers: int = 2) -> dict:
        rows = [{"track": f"worker{i}", "busy_s": busy_s / workers, "batches": 20 // workers}
                for i in range(workers)]  # fmt: skip
        return {"meta": {"num_workers": workers}, "workers": rows}

    view = {"steps": 20, "wall_s": 1.0}  # 50 ms a step
    assert workers_saturated(report(1.7), view) == pytest.approx(0.85)  # 85 ms a batch / 2
    assert workers_saturated(report(1.5), view) is None  # 75 ms a batch over 2: slack
    assert workers_saturated(report(0.9, workers=1), view) == pytest.approx(0.9)
    assert workers_saturated({"meta": {"num_workers": 0}, "workers": []}, view) is None


class ManyCheapTransforms(Dataset):
    """32 transforms of a few microseconds each, no stage of the user's: the timed regions
    are a large share of such stages."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.transform = transforms.Compose([transforms.Lambda(lambda x: x + 1)] * 32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.transform(torch.zeros(2)), i


def test_pipeprofs_own_cost_on_its_own_stages_is_a_note_after_the_real_findings():
    """Where pipeprof timed only its own stages (each transform), their inflation is nothing
    the user can act on: an info note, after every finding about the pipeline, saying how
    high the stage times read. With the user's own stages (the empty ticks test above), it
    stays a warning with the fix to coarsen them."""
    loader = DataLoader(ManyCheapTransforms(96), batch_size=4)
    report = pipeprof.profile(loader, stage_every=1).to_dict()
    f = findings(report)["profiler-overhead"]
    assert f["severity"] == "info" and f["fix"].startswith("none needed: read the stage times")
    assert "the loop's figures are not affected" in f["message"]
    ids = [x["id"] for x in report["findings"]]
    infos = [x["id"] for x in report["findings"] if x["severity"] == "info"]
    assert infos[-1] == "profiler-overhead" and ids[-1] == "profiler-overhead"
    # a compute-bound loop over it: the pipeline's own findings are informational too, and
    # pipeprof's note still comes after them (steps of 100 ms: a fetch of ~0.6 ms stays under
    # the 5 % of an input-bound loop with another test's load on the cores)
    prof = pipeprof.Profiler(sample_hz=0, stage_every=1)
    with prof:
        for _ in prof.wrap(DataLoader(ManyCheapTransforms(48), batch_size=4)):
            time.sleep(0.1)
    found = prof.report().to_dict()["findings"]
    infos = [x["id"] for x in found if x["severity"] == "info"]
    assert len(infos) >= 2 and infos[-1] == "profiler-overhead", infos


@pytest.mark.timing
def test_a_step_mostly_in_all_reduce_is_comm_bound_not_input_bound():
    """A DDP-like step: 3 ms of compute, then 12 ms in a Comm region (the all-reduce exposed),
    and loading that makes the loop wait about 10 % of the time. The step's largest part that
    is not compute is comm: the verdict is comm-bound and the pipeline's findings are
    informational. The near miss: the same wait beside a short Comm stays input-bound."""
    loader = DataLoader(CostDataset(40, load_ms=2.0), batch_size=1)
    report, true = run_loop(loader, [("Forward", 3.0), ("Comm", 12.0)])
    v = report["verdict"]
    assert true["Comm"] / true["wall"] > 0.5  # the truth: mostly all-reduce
    assert v["kind"] == "comm-bound" and "gradient all-reduce" in v["headline"]
    assert v["fraction"] == pytest.approx(true["Comm"] / true["wall"], abs=FRACTION_TOL)
    for f in report["findings"]:
        if f["id"] in ("workers-needed", "dominant-stage"):
            assert f["severity"] == "info" and "comm-bound" in f["message"]
    loader = DataLoader(CostDataset(40, load_ms=6.0), batch_size=1)
    report, true = run_loop(loader, [("Forward", 3.0), ("Comm", 1.0)])
    assert report["verdict"]["kind"] == "input-bound"


def test_the_collate_fix_fits_what_the_samples_hold():
    """Return tensors is said to a dataset of Python lists only; a user's collate_fn is named;
    samples that are arrays already are told where collate's copy time goes. None is promised
    (moving work into the dataset moved its cost to load in an HF script: 23 % more)."""
    from collections import UserDict

    import numpy as np

    from pipeprof.analyze.rules import collate_fix
    from pipeprof.core.batch import sample_kinds

    hf = UserDict({"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "labels": 0})
    assert sample_kinds(hf) == ["list", "number"]
    assert sample_kinds((torch.zeros(3), 1)) == ["number", "tensor"]
    assert sample_kinds({"x": np.zeros(3), "y": np.int64(2), "name": "a"}) == [
        "ndarray", "number", "str"]  # fmt: skip
    lists = collate_fix({"collate_fn": "default_collate", "sample_kinds": ["list", "number"]})
    arrays = collate_fix({"collate_fn": "default_collate", "sample_kinds": ["number", "tensor"]})
    mine = collate_fix({"collate_fn": "DataCollatorWithPadding", "sample_kinds": ["list"]})
    assert "Python lists" in lists and "return NumPy arrays or tensors" in lists
    assert "already arrays" in arrays and "return" not in arrays
    assert "DataCollatorWithPadding" in mine and "return" not in mine
    assert all(f.startswith("worth trying, not measured") for f in (lists, arrays, mine))


class FullCollections(Dataset):
    """Spins 1 ms a sample and runs a full garbage collection every 32 samples, as a worker's
    own surviving objects (a cache) would set off: each one over the heap the worker inherited
    from the training process (NOTE [ A full collection after fork ] in
    collect/torch/loader.py)."""

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        if i % 32 == 31:
            gc.collect()
        t = time.perf_counter()
        while time.perf_counter() - t < 0.001:
            pass
        return torch.zeros(4)


@pytest.mark.parametrize("frozen", [False, True])
def test_full_collections_over_the_inherited_heap_are_named(frozen):
    # the training process's own objects (and pytest's, torch's): each full collection in a
    # forked worker writes to all of them, copying the pages; frozen before the fork (the fix),
    # the workers' full collections skip them, and there is nothing to name (a near miss)
    heap = [[i] for i in range(300_000)]
    if frozen:
        gc.collect()
        gc.freeze()
    try:
        loader = DataLoader(FullCollections(), batch_size=8, num_workers=2,
                            multiprocessing_context="fork")  # fmt: skip
        report = pipeprof.profile(loader)
    finally:
        gc.unfreeze()
    workers = report["workers"]
    # 4 a worker, each shipped with the next batch whose stages are timed (the last may not be)
    assert sum(w["gc_full"] for w in workers) >= 4
    found = [f for f in report["findings"] if f["id"] == "full-gc-after-fork"]
    if frozen:
        assert not found, found
        return
    assert len(heap) and sum(w["gc_faults"] for w in workers) > 5_000  # 20 MB and more copied
    (f,) = found
    assert f["evidence"]["gc_s"] > 0.1 * f["evidence"]["busy_s"]
    assert "gc.freeze()" in f["fix"] and "full garbage collections" in f["message"]
