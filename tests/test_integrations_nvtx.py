"""NVTX ranges (collect/ranges.py): off by default at no cost, a no-op that says so once where
nothing would record them, and, forced on, balanced ranges named by stage path in the workers
and by loop part in the main process.

No GPU and no Nsight here: the emitting path is forced (``PIPEPROF_NVTX_FORCE=1``: a real
domain whose calls reach libnvToolsExt's no-op) and seen at the nvtx library's own entry points,
``nvtx.Domain.push_range`` / ``pop_range``, which forked workers inherit. The CUDA check is
pinned at the hardware boundary (``torch.cuda.is_available``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

import pipeprof
from pipeprof.collect import ranges
from pipeprof.collect.torch.loader import WorkerInit
from pipeprof.core import recorder as recmod
from pipeprof.core.recorder import Recorder, stage

nvtx_lib = pytest.importorskip("nvtx._lib.lib")
ROOT = Path(__file__).resolve().parent.parent
ORIGINAL_CODE = (recmod.timed_call1.__code__, recmod.stage_call1.__code__)
ORIGINAL_METHODS = (Recorder.open, Recorder.close, Recorder.discard, stage.__enter__)


class Images(Dataset):
    """Small tensors through a Compose, an ImageFolder-style ``loader`` (``load/fetch``), a user
    stage inside ``__getitem__`` and a decorated one (``load/fill``)."""

    def __init__(self, n: int) -> None:
        self.samples = list(range(n))
        self.loader = fetch
        self.transform = transforms.Compose([transforms.Lambda(_double), _Scale()])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        raw = self.loader(self.samples[i])
        with pipeprof.stage("decode"):
            x = torch.full((4,), raw)
        return self.transform(_fill(x, scale=1.0)), i % 2


def fetch(i: int) -> float:
    return float(i)


@pipeprof.stage("fill")
def _fill(x, scale):  # a decorated stage, called with a keyword: load/fill
    return x * scale


def _double(x):
    return x * 2


class _Scale:
    def __call__(self, x):
        return x / 3


def assert_default_path():
    assert (recmod.timed_call1.__code__, recmod.stage_call1.__code__) == ORIGINAL_CODE
    assert (Recorder.open, Recorder.close, Recorder.discard, stage.__enter__) == ORIGINAL_METHODS
    assert recmod.recorder().ranges is None and not ranges.is_on()


@pytest.fixture
def fresh(monkeypatch):
    """No Ranges or warning left from an earlier test."""
    monkeypatch.setattr(ranges, "_ranges", None)
    monkeypatch.setattr(ranges, "_warned", False)
    yield
    assert ranges._users == 0
    assert_default_path()


@pytest.fixture
def seen(tmp_path, monkeypatch, fresh):
    """Force ranges on and log every push/pop the nvtx library receives, in every process."""
    log = tmp_path / "nvtx.log"
    push, pop = nvtx_lib.Domain.push_range, nvtx_lib.Domain.pop_range

    def spy_push(self, attributes=None, **kwargs):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {threading.get_ident()} push {attributes.message.string}\n")
        return push(self, attributes, **kwargs)

    def spy_pop(self):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {threading.get_ident()} pop -\n")
        return pop(self)

    monkeypatch.setenv(ranges.FORCE_ENV, "1")
    monkeypatch.setattr(nvtx_lib.Domain, "push_range", spy_push)
    monkeypatch.setattr(nvtx_lib.Domain, "pop_range", spy_pop)
    return log


def read(log: Path) -> dict[int, list[str]]:
    """Pushed names per process; asserts each thread's ranges nest and all are closed."""
    per_thread: dict[tuple[str, str], list[str]] = defaultdict(list)
    pushed: dict[int, list[str]] = defaultdict(list)
    for line in log.read_text().splitlines():
        pid, tid, op, name = line.split(" ", 3)
        stack = per_thread[pid, tid]
        if op == "push":
            stack.append(name)
            pushed[int(pid)].append(name)
        else:
            assert stack, f"a pop with no open range in process {pid}"
            stack.pop()
    assert all(not s for s in per_thread.values()), f"ranges left open: {dict(per_thread)}"
    return pushed


def loop(nvtx: bool, workers: int = 2, n: int = 24):
    loader = DataLoader(Images(n), batch_size=4, num_workers=workers)
    with pipeprof.Profiler(sample_hz=0, nvtx=nvtx) as prof:
        for _ in prof.wrap(loader, device="cpu"):
            with prof.region("Forward"):
                pass
    return prof.report()


def test_forced_ranges_in_workers_and_loop_are_balanced(seen):
    report = loop(nvtx=True, workers=2, n=24)
    pushed = read(seen)
    main = Counter(pushed.pop(os.getpid()))
    # seven waits: the last one ends the epoch (StopIteration)
    assert main == {"wait": 7, "transfer": 6, "compute": 6, "Forward": 6}
    assert len(pushed) == 2  # both workers emitted
    every = Counter(name for names in pushed.values() for name in names)
    assert every == {
        "load": 24, "load/fetch": 24, "load/decode": 24, "load/fill": 24, "transform/Lambda": 24,
        "transform/_Scale": 24, "collate": 6,
    }  # fmt: skip
    # the report is what it is without ranges: same stages and counts, worker records intact
    assert {k: report["stages"][k]["count"] for k in every} == every
    assert sorted(w["batches"] for w in report["workers"]) == [3, 3]
    assert not any("NVTX" in n for n in report["notes"])


def test_forced_ranges_in_process_with_no_workers(seen):
    report = pipeprof.profile(DataLoader(Images(8), batch_size=4), nvtx=True)
    pushed = read(seen)
    assert list(pushed) == [os.getpid()]
    names = Counter(pushed[os.getpid()])
    assert names["wait"] == 3  # two batches and the StopIteration
    assert names["load"] == names["load/fetch"] == names["load/decode"] == names["load/fill"] == 8
    assert names["transform/Lambda"] == names["transform/_Scale"] == 8
    assert names["collate"] == 2 and "compute" not in names  # profile(): no training step
    assert report["stages"]["load/decode"]["count"] == 8


def test_ranges_are_off_again_after_the_profile_and_the_default_costs_nothing(seen):
    assert_default_path()
    prof = pipeprof.Profiler(sample_hz=0, nvtx=True)
    with prof:
        assert ranges.is_on()
        assert recmod.timed_call1.__code__ is not ORIGINAL_CODE[0]
        with pipeprof.Profiler(sample_hz=0):  # a second, plain profile meanwhile
            pass
        assert ranges.is_on()  # counted: on until the last profile with ranges ends
    assert_default_path()
    seen.unlink(missing_ok=True)
    loop(nvtx=False, workers=2, n=8)  # plain: not one call reaches nvtx, in any process
    assert not seen.exists()


def test_a_worker_forked_while_ranges_were_on_turns_them_off(fresh, monkeypatch):
    monkeypatch.setenv(ranges.FORCE_ENV, "1")
    ranges.install()
    try:
        WorkerInit(None, nvtx=False)(0)  # what a plain loader's worker runs first
        assert_default_path()
        WorkerInit(None, nvtx=True)(0)
        assert ranges.is_on() and ranges._users == 1
    finally:
        ranges.in_worker(False)
        recmod.recorder().reset("main")
        recmod.recorder().enabled = False


def test_without_cuda_a_note_and_one_warning_and_nothing_emitted(seen, monkeypatch):
    monkeypatch.delenv(ranges.FORCE_ENV)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="no CUDA device here") as first:
        report = loop(nvtx=True, workers=1, n=8)
    assert len(first) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process: no second warning
        again = loop(nvtx=True, workers=1, n=8)
    for r in (report, again):
        notes = [n for n in r["notes"] if "NVTX" in n]
        assert notes == [
            "nvtx=True: no CUDA device here, so pipeprof emits no NVTX ranges (its figures "
            "are the same)"
        ]
    assert not seen.exists()  # nothing emitted, in any process


def test_the_variants_are_made_from_the_originals_source():
    """NOTE [ Variants from the same source ] (collect/ranges.py): each variant runs in
    core/recorder.py's globals, holds every line of its original at the same number, and adds
    statements only at its two ``# NVTX:`` lines; the range goes around the timed call."""
    variants = [(fn, original, variant) for fn, original, variant in ranges._CODES]
    variants += [(ranges._ORIG_METHODS[cls, name], ranges._ORIG_METHODS[cls, name].__code__,
                  variant.__code__) for cls, name, variant in ranges._METHODS[3:]]  # fmt: skip
    assert len(variants) == 4
    source = Path(recmod.__file__).read_text().splitlines()
    for fn, original, variant in variants:
        assert fn.__globals__ is vars(recmod)
        plain = {line for _, _, line in original.co_lines() if line}
        made = {line for _, _, line in variant.co_lines() if line}
        added = made - plain
        assert plain <= made and added, fn
        assert all(source[n - 1].strip().startswith("# NVTX: ") for n in added), fn
    # an edit of the original is an edit of its variant: a function of its own, marked
    calls: list[str] = []

    class Domain:
        def get_event_attributes(self, message, color):
            return message

        def push_range(self, attrs):
            calls.append(f"push {attrs}")

        def pop_range(self):
            calls.append("pop")

    # an annotation that names what exists only for a type checker, as the module's annotations
    # are postponed: the variant is compiled so too
    def timed(path: OnlyForTypeCheckers, fn):  # type: ignore[name-defined]  # noqa: F821
        rec = recmod._recorder  # noqa: F841  (the variant reads it)
        # NVTX: open path rec
        out = fn()
        # NVTX: close
        return out

    variant = ranges._ranged(timed)
    before = recmod._recorder.ranges
    recmod._recorder.ranges = ranges.Ranges(Domain())
    try:
        assert variant("load/x", lambda: calls.append("call") or 7) == 7
    finally:
        recmod._recorder.ranges = before
    assert calls == ["push load/x", "call", "pop"]
    assert timed("load/x", lambda: 8) == 8  # the original: no range, nothing changed


def test_forced_records_equal_the_plain_ones(fresh, monkeypatch):
    """Same stages, nesting and self-time rule with ranges on as off."""
    monkeypatch.setenv(ranges.FORCE_ENV, "1")

    def work(rec: Recorder) -> dict:
        rec.enabled = True
        sink = rec.enter({})
        try:
            with stage("outer"):
                recmod.timed_call1("transform/T", lambda x: recmod.stage_call1("in", len, x), "ab")
                frame = rec.open("load")
                rec.close(frame, 3, detach=True)
                rec.discard(rec.open("gone"))
            return {k: len(v) // 2 for k, v in rec._local.st.sink.items()}
        finally:
            rec.leave(sink)
            rec.enabled = False

    rec = recmod.recorder()
    plain = work(rec)
    ranges.install()
    try:
        forced = work(rec)
    finally:
        ranges.uninstall()
    assert forced == plain == {"transform/T/in": 1, "transform/T": 1, ("load", 3): 1, "outer": 1}


def test_range_timer_pops_only_what_it_pushed(fresh, monkeypatch):
    calls = []

    class Spy:
        def open(self, name):
            calls.append(name)

        def pop(self):
            calls.append("pop")

    timer = ranges.RangeTimer(Spy())
    with timer.region("Forward"):
        pass
    with pytest.raises(ValueError):
        timer.end("Backward")  # unmatched: raises, pops nothing
    with pytest.raises(TypeError):
        timer.start(3)  # a bad key: its push is taken back
    assert calls == ["Forward", "pop", 3, "pop"]
    assert timer.stats()["Forward"]["count"] == 1


def test_missing_nvtx_names_the_extra(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "nvtx", None)
    with pytest.raises(ImportError, match=r"pip install 'pipeprof\[nvtx\]'"):
        pipeprof.Profiler(nvtx=True)


def _cli(tmp: Path, *args: str, extra_path: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop(ranges.FORCE_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, str(ROOT)) if p)
    return subprocess.run(
        [sys.executable, "-m", "pipeprof", "run", "-q", "-o", str(tmp / "run.json"), *args],
        capture_output=True, text=True, cwd=tmp, env=env, timeout=120,
    )  # fmt: skip


def test_pipeprof_run_nvtx(tmp_path):
    script = ROOT / "tests" / "scripts" / "train.py"
    args = (str(script), "--samples", "32", "--load-ms", "0", "--step-ms", "0", "--workers", "1")
    if torch.cuda.is_available():
        pytest.skip("checks the no-CUDA note")
    ran = _cli(tmp_path, "--nvtx", *args)
    assert ran.returncode == 0, ran.stderr
    assert ran.stderr.count("so pipeprof emits no NVTX ranges") == 1  # one warning
    notes = json.loads((tmp_path / "run.json").read_text())["notes"]
    assert sum("emits no NVTX ranges" in n for n in notes) == 1

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "nvtx.py").write_text("raise ImportError('no nvtx here')\n")
    missing = _cli(tmp_path, "--nvtx", *args, extra_path=str(shim))
    assert missing.returncode == 2
    assert "--nvtx needs the nvtx package: pip install 'pipeprof[nvtx]'" in missing.stderr
    assert "argv" not in missing.stdout  # refused before the script ran


def test_import_pipeprof_does_not_import_nvtx():
    code = (
        "import sys, pipeprof\n"
        "print(*(m in sys.modules for m in ('nvtx', 'pipeprof.collect.ranges')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)  # fmt: skip
    assert out.stdout.split() == ["False", "False"]
