"""``pipeprof run``: real scripts, run as subprocesses through the real command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from stage_sampling import counts, cpu_reads

from pipeprof.attach.regions import REGIONS_EVERY, REGIONS_FIRST

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN = str(SCRIPTS / "train.py")
ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["COLUMNS"] = "100"
    return e


def pipeprof_run(
    tmp: Path, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pipeprof", "run", "-o", str(tmp / "run.json"), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, cwd=cwd or tmp, env=env(), timeout=240
    )


def plain(tmp: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          cwd=cwd or tmp, env=env(), timeout=240)  # fmt: skip


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_script_with_train_and_validation_loaders(tmp_path):
    ran = pipeprof_run(tmp_path, TRAIN, "--epochs", "2", "--samples", "96", "--val-every", "3")
    ref = plain(tmp_path, TRAIN, "--epochs", "2", "--samples", "96", "--val-every", "3")
    assert ran.returncode == ref.returncode == 0, ran.stderr
    assert ran.stdout == ref.stdout  # byte-identical; the summary went to stderr
    assert "argv ['--epochs', '2', '--samples', '96', '--val-every', '3']" in ran.stdout
    assert "train_loader (train.py:" in ran.stderr and "main loop" in ran.stderr

    main = load(tmp_path / "run.json")
    assert main["meta"]["run_loader"]["label"] == "train_loader"
    assert main["loop"]["steps"] == 2 * 96 // 16  # validation adds no training steps
    assert main["loop"]["epochs"] == 2
    assert sorted(w["track"] for w in main["workers"]) == ["worker0", "worker1"]
    # the first pass of 6 batches timed in full, the second's by the rule: the profile's first
    # TIMED_FIRST batches, then one in STAGE_EVERY of each worker's (NOTE [ Unprofiled batches ])
    c = counts([6, 6], workers=2)
    assert main["samples"] == 2 * 96 and main["stages"]["load"]["count"] == c["profiled"] * 16
    assert main["meta"]["timed_batches"] == c["profiled"]
    regions = main["loop"]["regions"]
    for key in ("Forward", "Backward", "Optimizer"):
        assert regions[key]["count"] == main["loop"]["steps"], key
    # validation every 3 steps ran 4 passes inside training steps: a region, not compute
    assert regions["val_loader (pass)"]["count"] == 4
    assert any("Other" in n for n in main["notes"])

    val = load(tmp_path / "run.val_loader.json")
    assert val["meta"]["run_loader"]["label"] == "val_loader"
    assert val["loop"]["steps"] == 4 * 2 and val["loop"]["epochs"] == 4
    assert [e["label"] for e in main["meta"]["run"]["loaders"]] == ["train_loader", "val_loader"]


def test_the_same_numbers_as_the_hand_written_profiler(tmp_path):
    """Same script, same injected costs: `pipeprof run` and `Profiler().wrap` agree. Two rounds,
    interleaved: a neighbour's burst on this shared machine moves a sleep's overshoot in one run,
    so the closer pair is compared (the code that measures is the same in both)."""
    common = ("--workers", "0", "--samples", "240", "--load-ms", "4", "--step-ms", "8")
    pairs = []
    for r in range(2):
        ran = pipeprof_run(tmp_path, "-o", str(tmp_path / f"run{r}.json"), TRAIN, *common)
        by_hand = plain(tmp_path, TRAIN, *common, "--profiler", str(tmp_path / f"hand{r}.json"))
        assert ran.returncode == by_hand.returncode == 0, ran.stderr + by_hand.stderr
        pairs.append((load(tmp_path / f"run{r}.json"), load(tmp_path / f"hand{r}.json")))
    # the closer pair within 0.05: 0.032 and 0.040 apart in one run beside two other tests (three
    # at a time on 2 cores); a region counted as wait would move it by the step's share. Loads of
    # 4 ms a sample: of 1.5 ms, a loaded machine's sleeps overshot 8.7 and 9.4 % in the two pairs
    waits = [abs(a["loop"]["wait_fraction"] - b["loop"]["wait_fraction"]) for a, b in pairs]
    assert min(waits) <= 0.05, waits
    for stage in ("load", "collate"):
        # only where both are over 0.5 ms: collate's 0.3 ms, pushed over it by load in one run
        # only, differed by 37 % once
        means = [(a["stages"][stage]["mean_ms"], b["stages"][stage]["mean_ms"]) for a, b in pairs]
        gaps = [abs(x / y - 1) for x, y in means if min(x, y) > 0.5]
        assert not gaps or min(gaps) <= 0.05, (stage, gaps)
    # the injected cost: a sleep never ends early, and overshoots on a loaded machine (5.1 ms
    # of 4 once, three tests at a time on 2 cores), so the lower bound is tight, the upper loose
    loads = [x["stages"]["load"]["mean_ms"] for pair in pairs for x in pair]
    assert 4 * 0.98 <= min(loads) <= 4 * 1.2 and max(loads) <= 4 * 1.5, loads
    a, b = pairs[0]
    # the hand-written loop has no regions; run's are measured, not made up
    assert "Forward" in a["loop"]["regions"] and not b["loop"]["regions"]


def test_an_exception_keeps_its_traceback_and_exit_code(tmp_path):
    ran = pipeprof_run(tmp_path, TRAIN, "--raise-at", "3")
    ref = plain(tmp_path, TRAIN, "--raise-at", "3")
    assert ran.returncode == ref.returncode == 1
    assert ran.stdout == ref.stdout
    assert ran.stderr.endswith(ref.stderr)  # the same traceback, last, after the summary
    # no frame of pipeprof's package (the clone's folder may itself be called pipeprof)
    assert "Traceback" in ref.stderr and str(ROOT / "pipeprof") + os.sep not in ref.stderr
    report = load(tmp_path / "run.json")
    assert report["loop"]["steps"] == 3


def test_exit_code_and_a_script_without_loaders(tmp_path):
    ran = pipeprof_run(tmp_path, str(SCRIPTS / "nodata.py"))
    assert ran.returncode == 3
    assert ran.stdout == "no loaders here\n"
    assert "iterated no torch DataLoader or tf.data dataset" in ran.stderr
    assert not (tmp_path / "run.json").exists()
    ran = pipeprof_run(tmp_path, TRAIN, "--exit", "4", "--samples", "32")
    assert ran.returncode == 4 and (tmp_path / "run.json").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_writes_the_report_and_ends_as_it_would(tmp_path, signum):
    cmd = [sys.executable, "-m", "pipeprof", "run", "-o", str(tmp_path / "run.json"), TRAIN,
           "--forever", "--samples", "64"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env())  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "running":
            break
    workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert workers  # the DataLoader's workers are up
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signum, err  # as the plain script ends on this signal
    report = load(tmp_path / "run.json")
    assert report["interrupted"] and report["loop"]["steps"] >= 3
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in workers):
        assert time.monotonic() < deadline, "workers left running"
        time.sleep(0.1)


def test_a_module_with_relative_imports_and_a_spawn_loader(tmp_path):
    ran = pipeprof_run(tmp_path, "-m", "trainpkg.train", "--", "--config", "c.yaml", cwd=SCRIPTS)
    ref = plain(tmp_path, "-m", "trainpkg.train", "--config", "c.yaml", cwd=SCRIPTS)
    assert ran.returncode == ref.returncode == 0, ran.stderr
    assert ran.stdout == ref.stdout and "args ['--config', 'c.yaml']" in ran.stdout
    report = load(tmp_path / "run.json")
    assert report["meta"]["run_loader"]["label"].startswith("DataLoader@data.py:")
    assert report["stages"]["load"]["count"] == 64

    ran = pipeprof_run(tmp_path, TRAIN, "--context", "spawn", "--samples", "64")
    assert ran.returncode == 0, ran.stderr
    report = load(tmp_path / "run.json")
    assert report["meta"]["multiprocessing_context"] == "spawn"
    assert sorted(w["track"] for w in report["workers"]) == ["worker0", "worker1"]
    assert report["stages"]["load"]["count"] == 64


def test_a_new_loader_every_epoch_is_one_loop(tmp_path):
    ran = pipeprof_run(tmp_path, TRAIN, "--epochs", "3", "--samples", "32", "--new-loader")
    assert ran.returncode == 0, ran.stderr
    report = load(tmp_path / "run.json")
    assert report["meta"]["run_loader"]["label"] == "data"  # where it was made, each time
    assert report["loop"]["epochs"] == 3 and report["loop"]["steps"] == 6
    assert [e["label"] for e in report["meta"]["run"]["loaders"]] == ["data"]


def test_stage_every_reaches_each_loaders_profiler(tmp_path):
    ran = pipeprof_run(tmp_path, "--stage-every", "1", TRAIN, "--epochs", "2", "--samples", "96")
    assert ran.returncode == 0, ran.stderr
    main = load(tmp_path / "run.json")
    assert main["stages"]["load"]["count"] == 2 * 96 and "stage_every" not in main["meta"]


def test_batches_stops_profiling_and_the_script_runs_on(tmp_path):
    ran = pipeprof_run(tmp_path, "--batches", "5", TRAIN, "--epochs", "2", "--samples", "64")
    assert ran.returncode == 0, ran.stderr
    assert "epoch 1 loss" in ran.stdout  # all of it ran
    report = load(tmp_path / "run.json")
    assert report["batches"] == 5
    assert any("--batches 5 reached" in n for n in report["notes"])


def test_a_script_with_its_own_profiler_is_not_counted_twice(tmp_path):
    ran = pipeprof_run(tmp_path, TRAIN, "--samples", "64", "--profiler", str(tmp_path / "own.json"))
    assert ran.returncode == 0, ran.stderr
    own = load(tmp_path / "own.json")
    assert own["loop"]["steps"] == 4
    # the loader the script profiles itself is left to its Profiler: nothing to report here
    assert "iterated no torch DataLoader or tf.data dataset" in ran.stderr
    assert "runs its own pipeprof.Profiler" in ran.stderr


def test_a_process_the_script_forks_is_left_alone(tmp_path):
    ran = pipeprof_run(tmp_path, TRAIN, "--samples", "32", "--fork")
    assert ran.returncode == 0, ran.stderr
    # the child iterates the plain DataLoader's own iterator, as it would without pipeprof
    assert "child saw 32 through _SingleProcessDataLoaderIter\nchild exit 0\n" in ran.stdout
    report = load(tmp_path / "run.json")  # the parent's loop only: 2 batches of 16
    assert report["loop"]["steps"] == 2 and report["samples"] == 32


def test_zipped_loaders_get_a_note(tmp_path):
    ran = pipeprof_run(tmp_path, TRAIN, "--samples", "32", "--zip")
    assert ran.returncode == 0, ran.stderr
    report = load(tmp_path / "run.json")
    assert any("iterated together (zip)" in n for n in report["notes"])
    assert report["loop"]["steps"] == 2


def test_bad_input(tmp_path):
    ran = pipeprof_run(tmp_path, "missing.py")
    assert ran.returncode == 2 and "missing.py: no such script" in ran.stderr
    ran = pipeprof_run(tmp_path, "-m", "no_such_module_here")
    assert ran.returncode == 2 and "no such module" in ran.stderr
    ran = pipeprof_run(tmp_path)
    assert ran.returncode == 2 and "give the training script" in ran.stderr
    ran = pipeprof_run(tmp_path, "--batches", "0", TRAIN)
    assert ran.returncode == 2 and "--batches" in ran.stderr
    ran = pipeprof_run(tmp_path, "--stage-every", "0", TRAIN)
    assert ran.returncode == 2 and "--stage-every" in ran.stderr


@pytest.mark.timing
def test_tf_data_in_a_loop_and_keras_fit(tmp_path):
    ran = pipeprof_run(tmp_path, str(SCRIPTS / "keras_fit.py"), "128")
    ref = plain(tmp_path, str(SCRIPTS / "keras_fit.py"), "128")
    assert ran.returncode == ref.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == ref.stdout == "looped 128\nfitted\n"
    fit = load(tmp_path / "run.json")  # fit() is the training loop
    assert fit["framework"] == "tf" and fit["meta"]["run_loader"]["label"].startswith("fit@")
    assert 0 < fit["loop"]["steps"] <= 16
    assert "transform/slow" in fit["stages"]
    loop = load(tmp_path / "run.tf_data_keras_fit_py_25.json")
    assert loop["loop"]["steps"] == 8 and loop["loop"]["epochs"] == 1
    # the map sleeps 2 ms a sample: at least that, and a loaded VM's sleeps overshoot
    assert 1.9 <= loop["stages"]["transform/slow"]["mean_ms"] <= 3.5
    assert loop["loop"]["wait_fraction"] > 0.9  # the loop does nothing but wait


def test_keras_imported_before_tensorflow(tmp_path):
    """keras imports tensorflow while it is being imported itself: each gets its own hook."""
    ran = pipeprof_run(tmp_path, str(SCRIPTS / "keras_first.py"))
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "fitted\n"
    assert load(tmp_path / "run.json")["meta"]["run_loader"]["label"] == "fit@keras_first.py:11"


@pytest.mark.timing
def test_the_readme_demo_is_promised_no_gain_it_does_not_get(tmp_path):
    """The README's demo script, run longer (2,048 JPEGs, 2 workers): on this machine's 2 cores
    its CPU training step and its decoding fill them, and more workers ran it slower (2: 312-329
    samples/s; 3: 297-299; 4: 299; 5: 300-303), where the report had said "with 5 workers the
    loop would run at about 386 samples/s (now 329)", and then, its model's own rate for 2
    workers being 258, "3 workers: about 304". A worker count is offered only for a gain over
    what the loop measured, and followed it delivers at least 90 % of its promise."""
    demo = str(ROOT / "examples" / "train.py")
    ran = pipeprof_run(tmp_path, demo, "--images", "2048", "--workers", "2")
    assert ran.returncode == 0, ran.stderr
    report = load(tmp_path / "run.json")
    rows = {w["workers"]: w for w in report["what_if"] if w["kind"] == "workers"}
    measured = rows[2]["measured_samples_per_s"]  # beside the model's figure for them
    assert measured and rows[2]["samples_per_s"]
    needed = [f for f in report["findings"] if f["id"] == "workers-needed"]
    if not needed or needed[0]["severity"] != "critical":
        return  # nothing offered (the 2-core case): nothing to follow
    ev = needed[0]["evidence"]
    assert ev["predicted_samples_per_s"] >= 1.1 * measured, ev
    again = pipeprof_run(tmp_path, demo, "--images", "2048", "--workers",
                         str(ev["workers_needed"]))  # fmt: skip
    assert again.returncode == 0, again.stderr
    followed = load(tmp_path / "run.json")
    steady = followed["loop"]["steady"]
    rate = steady["steps"] * report["meta"]["batch_size"] / steady["wall_s"]
    assert rate >= 0.9 * ev["predicted_samples_per_s"], (rate, ev)


def test_transform_modules_in_the_fetch_are_the_pipeline_not_forward(tmp_path):
    """torchvision's transforms are ``nn.Module``s: with ``num_workers=0`` they run inside the
    loader's ``next()`` in the training process. Each of their calls had been a ``Forward``
    region (12,060 for 188 steps on a public script; compute then was less than its regions and
    ``Other`` was clamped to 0). Only the training step's model is Forward."""
    ran = pipeprof_run(tmp_path, "--stage-every", "1", str(SCRIPTS / "transform_modules.py"), "64")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "steps 8\n"
    report = load(tmp_path / "run.json")
    loop = report["loop"]
    assert loop["steps"] == 8
    forward = loop["regions"]["Forward"]
    assert forward["count"] == loop["steps"]  # the model's calls; 8 + 2 * 64 with transforms
    # the transforms' 2 ms a sample are the pipeline's stages, not the model's Forward
    slow = report["stages"]["transform/Slow"]
    assert slow["count"] == 64 and slow["mean_ms"] >= 1.9
    assert "transform/Normalize" in report["stages"]
    assert forward["total_s"] < 0.25 * slow["count"] * slow["mean_ms"] / 1000


def test_torchvisions_transforms_in_a_fetch_skip_the_forward_wrapper():
    """NOTE [ Transforms past the Forward wrapper ] (attach/regions.py): once a torchvision
    transform is called in a fetch, its class calls torch's own ``Module.__call__``, so its calls
    pay no frame of pipeprof's; the model's class keeps the wrapper (an ``nn.Sequential``, here a
    transform too), its outermost call is still each step's Forward, and the run's end undoes
    it."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    from torchvision import transforms

    from pipeprof.attach.run import Run

    module_call = nn.Module.__call__
    normalize = transforms.Normalize(mean=[0.5], std=[0.5])
    chain = nn.Sequential(nn.Identity())  # torch's class: a model's too, never past

    class Images(TensorDataset):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return chain(normalize(x)), y

    data = Images(torch.rand(64, 1, 4, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    plain = [normalize(x) for x, _ in DataLoader(TensorDataset(data.tensors[0], data.tensors[1]),
                                                 batch_size=8)]  # fmt: skip
    run = Run(sample_hz=0)
    run.install()
    try:
        got, steps = [], 0
        for x, _ in loader:
            got.append(x)
            model(x).sum().backward()
            steps += 1
        assert vars(transforms.Normalize)["__call__"] is module_call
        assert "__call__" not in vars(nn.Sequential)
        assert type(normalize) is transforms.Normalize
    finally:
        run.uninstall()
        run.stop_profiling()
    assert "__call__" not in vars(transforms.Normalize)
    assert nn.Module.__call__ is module_call
    assert all(torch.equal(a, b) for a, b in zip(got, plain, strict=True))
    report = run.reports()[0][1]
    assert report["loop"]["regions"]["Forward"]["count"] == steps == 8


def test_the_step_regions_take_the_short_path_and_state_their_cost():
    """NOTE [ Regions on a short path ] (attach/regions.py): on the CPU clock, Forward, Backward and
    Optimizer go to the pass's StepLog directly, each timed as it runs, and the report states
    their cost (``overhead.step_regions_s``: their count times one region's cost)."""
    import torch
    from pipelines import spin
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from pipeprof.attach.regions import step_region_ns
    from pipeprof.attach.run import Run

    class Slow(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(4, 2)

        def forward(self, x):
            spin(2.0)  # the injected Forward
            return self.inner(x)

    model = Slow()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(80, 4), torch.randint(0, 2, (80,)))
    run = Run(sample_hz=0)
    run.install()
    short = []
    try:
        for x, y in DataLoader(data, batch_size=4):
            short.append(run.step.log is not None)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        run.uninstall()
    [(_, report)] = run.reports()
    assert all(short) and len(short) == 20
    loop = report["loop"]
    regions = loop["regions"]
    # one each a timed step (NOTE [ Regions in a sample of the steps ]: the first 16, then 1 in
    # 8): the inner Linear is inside Forward, not a region of its own
    timed = len([k for k in range(20) if k < REGIONS_FIRST or k % REGIONS_EVERY == 0])
    assert [regions[k]["count"] for k in ("Forward", "Backward", "Optimizer")] == [timed] * 3
    assert regions["Forward"]["min_ms"] >= 1.95  # each around the 2 ms it spins (preempted: more)
    assert regions["Forward"]["total_s"] >= 20 * 2.0 / 1e3  # scaled to every step
    assert loop["compute_s"] >= regions["Forward"]["total_s"]  # compute keys: in compute
    each = step_region_ns()
    assert 0 < each < 20_000
    # too few quiet steps to compare: the probe's cost; and in every step the wrappers' call-
    # through (NOTE [ What the wrappers cost ]): Forward and the Linear inside it, the backward,
    # the optimizer's two hooks, at the quiet wrapper's probe, unscaled
    sampled = report["overhead"]["step_regions"]
    assert sampled["used"] is False and sampled["in_situ_factor"] == 1.0
    assert sampled["calls_per_step"] == 5.0
    through = step_region_ns(quiet=True)
    assert 0 < through < each and sampled["call_through_ns"] == pytest.approx(through, abs=0.1)
    assert report["overhead"]["step_regions_s"] == pytest.approx(
        (3 * timed * each + 20 * 5 * through) / 1e9, abs=1e-6
    )
    assert "the step's Forward/Backward/Optimizer regions" in " ".join(
        report.render("text").split()
    )


@pytest.mark.serial  # counts steps against the machine's speed
def test_regions_are_timed_in_a_sample_of_the_steps_and_cost_what_those_steps_took(monkeypatch):
    """NOTE [ Regions in a sample of the steps ] (attach/regions.py): a region's clock made to cost
    100 µs a read (6 reads a timed step), the timed steps' compute against the quiet ones'
    states it, where the probe, measured before, knows nothing of it; the totals are scaled to
    every step."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from pipeprof.attach import regions as runner
    from pipeprof.attach.regions import step_region_ns
    from pipeprof.attach.run import Run

    each = step_region_ns()  # measured once a process, with the real clock
    real = runner.clock

    def slow_clock() -> int:
        t0 = real()
        while real() - t0 < 100_000:
            pass
        return real()

    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(400, 4), torch.randint(0, 2, (400,)))
    run = Run(sample_hz=0)
    run.install()
    try:
        monkeypatch.setattr(runner, "clock", slow_clock)  # the wrappers' clock, not the loop's
        for x, y in DataLoader(data, batch_size=4):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        monkeypatch.setattr(runner, "clock", real)
        run.uninstall()
    [(_, report)] = run.reports()
    timed = [k for k in range(100) if k < REGIONS_FIRST or k % REGIONS_EVERY == 0]
    o = report["overhead"]
    ab = o["step_regions"]
    assert (ab["steps"], ab["timed_steps"]) == (100, len(timed))
    assert ab["ab_steps"] == [len(timed) - REGIONS_FIRST, 100 - len(timed)]
    assert ab["used"] and 550_000 <= ab["per_step_ns"] <= 1_600_000, ab
    # the call-through of every step's wrappers at the probe, scaled by the timed steps' own
    # excess over theirs, at most IN_SITU_MOST (NOTE [ What the wrappers cost ])
    assert ab["in_situ_factor"] == runner.IN_SITU_MOST and ab["calls_per_step"] == 4.0
    through = 100 * 4 * step_region_ns(quiet=True) * runner.IN_SITU_MOST
    assert ab["call_through_s"] == pytest.approx(through / 1e9, abs=1e-6)
    assert o["step_regions_s"] == pytest.approx(
        (ab["per_step_ns"] * len(timed) + through) / 1e9, rel=1e-3
    )
    assert ab["probed_s"] == pytest.approx(3 * len(timed) * each / 1e9, abs=1e-6)
    regions = report["loop"]["regions"]
    for k in ("Forward", "Backward", "Optimizer"):
        r = regions[k]
        assert r["count"] == len(timed) and r["timed_steps"] == len(timed)
        # each call at least the slow read it made; the total scaled to the 100 steps
        assert r["min_ms"] >= 0.1
        scaled = r["mean_ms"] * r["count"] / 1e3 * 100 / len(timed)
        assert r["total_s"] == pytest.approx(scaled, rel=0.01)
    text = " ".join(report.render("text").split())
    assert f"timed in {len(timed)} of 100 steps" in text


def _count_fast_fetches(monkeypatch: pytest.MonkeyPatch, fast: bool) -> list[int]:
    """The batches ``pipeprof run`` fetches the fast way (NOTE [ The fast path ] in
    attach/run.py), counted in the list's one item; with ``fast`` False every batch asks the
    pass."""
    from pipeprof.attach.run import Run
    from pipeprof.collect.torch.loader import ProfiledLoader

    if not fast:
        monkeypatch.setattr(Run, "_fast", lambda self, entry, src, short, slow, cell: slow)
    fetched = [0]
    fast_next = ProfiledLoader.fast_next

    def counted(self: ProfiledLoader, short: object) -> object:
        fetched[0] += 1
        return fast_next(self, short)

    monkeypatch.setattr(ProfiledLoader, "fast_next", counted)
    return fetched


def _fast_path_loop(
    monkeypatch: pytest.MonkeyPatch, fast: bool, fail_at: int | None = None, regions: bool = True
):
    """300 steps of a known fetch (4 samples of 0.05 ms) and compute (0.3 ms), a nested pass of
    another loader every 50 steps; with the fast path (NOTE [ The fast path ] in attach/run.py) or
    with every batch asking the pass. Returns the report, the session and the fast fetches."""
    import torch
    from pipelines import KnownFetch, known_step
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from pipeprof.attach.run import Run

    fetched = _count_fast_fetches(monkeypatch, fast)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    val = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
    seen = []
    run = Run(sample_hz=0, regions=regions)
    run.install()
    try:
        for i, (x, y) in enumerate(DataLoader(KnownFetch(), batch_size=4)):
            seen.append(int(x[0, 0]))
            known_step(model, opt, x, y)
            if i % 50 == 49:
                for (v,) in val:
                    model(v)
            if i == fail_at:
                raise KeyError("the user's own")
    except KeyError:
        pass
    finally:
        run.uninstall()
    assert seen == list(range(0, 4 * len(seen), 4))  # the batches the loader makes, in order
    [(entry, report), _] = run.reports()
    return report.to_dict(), entry.session, fetched[0]


@pytest.mark.serial  # counts steps against the machine's speed
def test_the_fast_path_writes_each_step_as_the_pass_would(monkeypatch):
    """NOTE [ The fast path ] (attach/run.py): a long in-process pass's short-path batches fetched
    past the pass's generators make the same steps, batches, samples, sampled regions and
    unprofiled counts as through it, each step's wait and compute what was injected; a region
    another loader's pass made in a step (the fast path stops for it) in that step's overhead."""
    fast, session, fetched = _fast_path_loop(monkeypatch, fast=True)
    slow, _, none = _fast_path_loop(monkeypatch, fast=False)
    # all but the first 80, 1 in 32 or so after, and a step every 20 ms (it reads the CPU time)
    assert none == 0 and fetched >= 220
    for key in ("steps", "epochs"):
        assert fast["loop"][key] == slow["loop"][key] == (300 if key == "steps" else 1)
    assert fast["batches"] == slow["batches"] == 300 and fast["samples"] == slow["samples"]
    ab = [r["overhead"]["unprofiled_batches"] for r in (fast, slow)]
    for key in ("batches", "unprofiled_samples"):  # the same batches compared and unprofiled
        assert ab[0][key] == ab[1][key], key
    for key in ("steps", "timed_steps", "ab_steps"):
        assert fast["overhead"]["step_regions"][key] == slow["overhead"]["step_regions"][key]
    for k, r in fast["loop"]["regions"].items():
        assert r["count"] == slow["loop"]["regions"][k]["count"], k
    assert fast["loop"]["regions"]["DataLoader (pass)"]["count"] == 6
    # each step as injected: its wait at least its fetch, its compute at least 0.3 ms, and the
    # steps back to back: the next one asked when this one's parts end (a fast step's exactly;
    # one made through the pass leaves pipeprof's bookkeeping out of its parts)
    ring = list(session.loop.step_ring)
    assert len(ring) == 300
    gaps = []
    for k, (t_req, wait, transfer, compute, _) in enumerate(ring):
        assert wait >= 0.2e6 and compute >= 0.3e6 and transfer == 0, (k, wait, compute)
        if k + 1 < len(ring) and k % 50 != 49:  # a nested pass's step holds its overhead too
            gaps.append(ring[k + 1][0] - (t_req + wait + compute))
    assert min(gaps) >= 0, min(gaps)
    # exactly back to back after a fast step, but where the next step goes through the pass (a
    # profiled batch; a CPU-time read every 20 ms, so their count follows the machine's speed):
    # 0.84-0.88 of the fast steps in three quiet runs (194-209 of 231-238; a fixed 200 failed one)
    assert sum(g == 0 for g in gaps) >= 0.75 * fetched and sorted(gaps)[len(gaps) // 2] < 20_000
    # the fast path's own time in next(), measured in each of its steps, is stated with the
    # loader's bookkeeping there
    fast_ns, main_ns = session.costs["fast_ns"], session.costs["main_ns"]
    assert 0 < fast_ns < fetched * 50_000
    assert fast["overhead"]["main_s"] == pytest.approx((fast_ns + main_ns) / 1e9, abs=2e-6)
    loop = fast["loop"]
    # the other loader's passes: that step's overhead, not its compute
    assert loop["overhead_s"] >= fast["loop"]["regions"]["DataLoader (pass)"]["total_s"] * 0.99
    assert loop["compute_s"] >= 300 * 0.3e-3
    assert loop["wait_s"] + loop["compute_s"] + loop["overhead_s"] <= loop["wall_s"] * 1.001


def _worker_fast_loop(monkeypatch: pytest.MonkeyPatch, fast: bool, sample_ms: float,
                      step_ms: float):  # fmt: skip
    """160 batches of 4 samples of ``sample_ms`` each from 2 forked workers, steps of
    ``step_ms`` more compute, under ``pipeprof run``; with the workers' fast path (NOTE
    [ Workers' batches, past the generators ] in collect/torch/loader.py) or with every batch
    asking the pass. Returns the report's dict, the fast path's own ns and its fetches."""
    import torch
    from pipelines import SleepyRows, known_step, spin
    from torch import nn
    from torch.utils.data import DataLoader

    from pipeprof.attach.run import Run

    fetched = _count_fast_fetches(monkeypatch, fast)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    run = Run(sample_hz=0)
    run.install()
    try:
        loader = DataLoader(SleepyRows(sample_ms), batch_size=4, num_workers=2,
                            multiprocessing_context="fork")  # fmt: skip
        for x, y in loader:
            seen.append(int(x[0, 0]))
            known_step(model, opt, x, y)
            spin(step_ms)
    finally:
        run.uninstall()
    assert seen == list(range(0, 640, 4))  # the batches the loader makes, in order
    [(entry, report)] = run.reports()
    return report.to_dict(), entry.session.costs["fast_ns"], fetched[0]


@pytest.mark.serial  # counts steps against the machine's speed
@pytest.mark.parametrize("sample_ms, step_ms, starved", [(0.0, 2.0, False), (8.0, 0.0, True)])
def test_the_workers_fast_path_keeps_each_batchs_wait_split(monkeypatch, sample_ms, step_ms,
                                                            starved):  # fmt: skip
    """NOTE [ Workers' batches, past the generators ]: with workers, the batches past the first
    two take the fast path and make the same steps, batches and workers' counts as through the
    pass; each step's wait keeps its split: hand-over where the workers are ahead (their batches
    ready), starved where they are behind (4 samples of 8 ms a batch against no step); the
    fast path's own time in next() stated."""
    fast, fast_ns, fetched = _worker_fast_loop(monkeypatch, True, sample_ms, step_ms)
    slow, _, none = _worker_fast_loop(monkeypatch, False, sample_ms, step_ms)
    # all but the first two, and a step every 20 ms through the pass (it reads the CPU time)
    assert none == 0 and fetched >= 80, fetched
    for r in (fast, slow):
        assert r["loop"]["steps"] == r["batches"] == 160 and r["samples"] == 640
        assert sum(w["batches"] for w in r["workers"]) == 160
        loop = r["loop"]
        assert loop["starved_s"] + loop["handover_s"] == pytest.approx(loop["wait_s"], rel=1e-6)
        share = loop["starved_s"] / loop["wait_s"]
        assert share > 0.7 if starved else share < 0.3, (share, fetched)
    assert 0 < fast_ns < fetched * 50_000


@pytest.mark.serial  # counts steps against the machine's speed
def test_the_fast_path_states_its_cost_with_no_regions_timed(monkeypatch):
    """``--no-regions``: no in-situ factor is measured, and the fast path's own time and its
    fetch frames are still stated, the frames at their probe unscaled."""
    from pipeprof.collect.torch.loader import short_frames_ns

    report, session, fetched = _fast_path_loop(monkeypatch, fast=True, regions=False)
    assert fetched >= 220 and not report["overhead"].get("step_regions")
    assert session.meta["fast_path"]["in_situ_factor"] == 1.0
    frames = 300 * short_frames_ns()
    assert session.costs["fast_ns"] > frames > 0


def test_a_crash_in_a_fast_step_keeps_its_steps(monkeypatch):
    """The user's exception in a step whose batch came the fast way: the steps up to it are all
    in the report, as through the pass."""
    fast, session, fetched = _fast_path_loop(monkeypatch, fast=True, fail_at=200)
    slow, _, _ = _fast_path_loop(monkeypatch, fast=False, fail_at=200)
    # all but the first 80, 1 in 32 or so after, and a step every CPU_GAP_NS: 151 on a quiet
    # machine, 109 to 144 beside two busy cores (a fixed 100 failed beside another test: 27)
    assert fetched >= 130 - cpu_reads(session), fetched
    assert fast["loop"]["steps"] == slow["loop"]["steps"] == 201
    assert fast["batches"] == slow["batches"] == 201


def test_the_first_pass_loads_no_module_of_pipeprof_or_psutil():
    """The host sampler's modules (psutil) load when torch is patched, at the script's start,
    not in the first ``iter()`` of a loader, where they were the loop's time (issue 38)."""
    import torch
    from torch.utils.data import DataLoader

    from pipeprof.attach.run import Run

    for name in [m for m in sys.modules if m.startswith(("pipeprof.collect.samplers", "psutil"))]:
        del sys.modules[name]  # as in a fresh process (test_run imports psutil itself)
    run = Run(sample_hz=10)
    run.install()
    try:
        before = set(sys.modules)
        it = iter(DataLoader(torch.arange(8.0), batch_size=4))
        loaded = {m for m in set(sys.modules) - before if m.startswith(("pipeprof", "psutil"))}
        assert [b.tolist() for b in it] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    finally:
        run.uninstall()
        run.stop_profiling()
    assert loaded == set(), loaded


def test_the_fast_path_reads_the_computes_cpu_time_as_the_pass_would():
    """NOTE [ CPU training shares the cores ] under ``pipeprof run``: the steps due a reading of
    the process's CPU time are made through the pass, not the fast path, so the readings stay
    spread over the run. The first 10 steps sleep and the last 50 burn a core: about 5/6 quiet,
    less where another program takes part of the core (the steps' own CPU clock says how much:
    a reading of the sleeping steps alone says ~0, of the burning ones alone ~1)."""
    from pipelines import CostDataset, spin
    from torch.utils.data import DataLoader

    from pipeprof.attach.run import Run

    run = Run(sample_hz=0)
    run.install()
    cpu = wall = 0
    try:
        for i, _ in enumerate(DataLoader(CostDataset(60), batch_size=1)):
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            if i < 10:
                time.sleep(0.025)
            else:
                spin(25)
            cpu, wall = cpu + time.process_time_ns() - c0, wall + time.perf_counter_ns() - t0
    finally:
        run.uninstall()
    [(_, report)] = run.reports()
    d = report.to_dict()
    busy, truth = d["meta"]["compute_cpu_ns"] / 1e9 / d["loop"]["compute_s"], cpu / wall
    # 0.40 in one CI run two at a time (and read 0.40): a floor that keeps a reading of the
    # sleeping steps alone (~0) more than the tolerance away
    assert truth > 0.15 and busy == pytest.approx(truth, abs=0.1), (busy, truth)


def test_patches_are_undone_in_reverse_and_put_back_what_the_class_held():
    """NOTE [ Patches ] (attach/patches.py): the last patch is undone first, and a name the
    class only inherited is deleted again, not pinned on it."""
    from pipeprof.attach.patches import Patches

    class Base:
        def hello(self) -> str:
            return "base"

    class Child(Base):
        pass

    undone: list[str] = []
    patches = Patches()
    patches.add(lambda: undone.append("first"))
    patches.replace(Child, "hello", lambda self: "patched")
    patches.add(lambda: undone.append("last"))
    assert Child().hello() == "patched"
    patches.undo()
    assert undone == ["last", "first"]
    assert "hello" not in vars(Child) and Child().hello() == "base"
    patches.undo()  # nothing left to undo
    assert undone == ["last", "first"]


def test_uninstall_puts_back_every_seam_it_patched():
    """After ``pipeprof run``'s patches (torch, DDP's collectives, Profiler.start, the import
    hooks), uninstalling leaves torch's classes, the optimizer's global hooks and
    ``sys.meta_path`` as they were."""
    import torch
    import torch.distributed as dist
    from torch.nn.modules.module import Module
    from torch.optim import optimizer as optim
    from torch.utils.data import DataLoader

    from pipeprof.attach.run import Run
    from pipeprof.profiler import Profiler

    seams = [(DataLoader, "__init__"), (DataLoader, "__iter__"), (torch.Tensor, "backward"),
             (Module, "__call__"), (Profiler, "start"), (dist, "all_reduce"),
             (dist, "destroy_process_group")]  # fmt: skip
    before = [getattr(owner, name) for owner, name in seams]
    own_subclass_hook = "__init_subclass__" in vars(DataLoader)
    hooks = (len(optim._global_optimizer_pre_hooks), len(optim._global_optimizer_post_hooks))
    meta_path = list(sys.meta_path)
    run = Run(sample_hz=0)
    run.install()
    try:
        patched = [getattr(owner, name) for owner, name in seams]
        assert all(a is not b for a, b in zip(before, patched)), patched
        assert len(optim._global_optimizer_pre_hooks) == hooks[0] + 1
        assert len(sys.meta_path) > len(meta_path)  # the hooks for tf, keras, the trainers
    finally:
        run.uninstall()
    assert [getattr(owner, name) for owner, name in seams] == before
    assert ("__init_subclass__" in vars(DataLoader)) == own_subclass_hook
    assert (len(optim._global_optimizer_pre_hooks),
            len(optim._global_optimizer_post_hooks)) == hooks  # fmt: skip
    assert sys.meta_path == meta_path
