"""Lightning and Hugging Face Trainer callbacks (pipeprof.integrations): real frameworks, real
scripts (tests/scripts/lightning_fit.py, hf_train.py) with injected known costs, each run through
the API (the script adds the callback, in this process) and through ``pipeprof run``."""

from __future__ import annotations

import importlib
import importlib.util
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from stage_sampling import counts
from torch.utils.data import DataLoader

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ROOT = Path(__file__).resolve().parent.parent
LIGHTNING = str(SCRIPTS / "lightning_fit.py")
HF = str(SCRIPTS / "hf_train.py")
# transformers' Trainer needs accelerate (pipeprof[hf] installs both)
needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("accelerate") is None,
    reason="needs transformers and accelerate: pip install 'pipeprof[hf]'",
)


def script(path: str, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Run a test script in this process, as ``python path args`` would; its stdout."""
    argv = sys.argv[:]
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = argv
    return capsys.readouterr().out


def pipeprof_run(tmp: Path, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**__import__("os").environ, "PYTHONPATH": ":".join([str(ROOT), *sys.path[1:]])}
    cmd = [sys.executable, "-m", "pipeprof", "run", "-q", "-o", str(tmp / "run.json"), path, *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=240)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def regions(report: dict) -> dict:
    return report["loop"]["regions"]


# ---- PyTorch Lightning ---------------------------------------------------------------------

LIGHTNING_ARGS = ("--epochs", "2", "--samples", "64", "--load-ms", "2", "--step-ms", "4",
                  "--callback-ms", "3")  # fmt: skip


@pytest.fixture(scope="module")
def lightning_api(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, str, str]:
    """The Lightning script with the callback, and without it (the same batches?)."""
    tmp = tmp_path_factory.mktemp("lightning")
    with pytest.MonkeyPatch.context() as mp:
        capsys = _Capture(mp)
        plain = script(LIGHTNING, *LIGHTNING_ARGS, capsys=capsys)
        out = script(LIGHTNING, *LIGHTNING_ARGS, "--callback", str(tmp / "fit.json"), capsys=capsys)
    assert DataLoader.__iter__.__module__ == "torch.utils.data.dataloader"  # un-routed after fit
    return load(tmp / "fit.json"), load(tmp / "fit.val.json"), out, plain


class _Capture:
    """capsys for a module-scoped fixture: collects what the script prints."""

    def __init__(self, mp: pytest.MonkeyPatch) -> None:
        import io

        self.buf = io.StringIO()
        mp.setattr(sys, "stdout", self.buf)

    def readouterr(self) -> _Capture:
        self.out, self.buf = self.buf.getvalue(), type(self.buf)()
        sys.stdout = self.buf
        return self


def test_lightning_callback_profiles_fit(lightning_api):
    fit, val, out, plain = lightning_api
    assert out == plain  # the same batches, in the same order, as without pipeprof
    loop = fit["loop"]
    assert loop["steps"] == 2 * 64 // 8 and loop["epochs"] == 2  # validation adds no steps
    # the first epoch's 8 batches timed in full, the second's by the rule: the profile's first
    # TIMED_FIRST, then one in STAGE_EVERY (the count goes on from the first epoch's; NOTE
    # [ Unprofiled batches ])
    assert fit["samples"] == 2 * 64 and "collate" in fit["stages"]
    assert fit["stages"]["load"]["count"] == counts([8, 8])["profiled"] * 8
    assert 1.9 <= fit["stages"]["load"]["mean_ms"] <= 4  # the injected 2 ms a sample
    # each step waits for 8 samples of 2 ms (no workers), then computes >= 4 + 3 ms
    assert 15 <= 1000 * loop["wait_s"] / loop["steps"] <= 32
    r = regions(fit)
    assert {"Forward", "Backward", "Optimizer", "Callbacks", "Validation"} <= set(r)
    assert r["Forward"]["count"] == r["Backward"]["count"] == r["Optimizer"]["count"] == 16
    assert 4 <= r["Forward"]["mean_ms"] <= 15  # training_step sleeps 4 ms
    # the user's callback sleeps 3 ms a step (each hook call of every callback is one region)
    assert 3 <= 1000 * r["Callbacks"]["total_s"] / loop["steps"] <= 10
    assert r["Validation"]["count"] == 2  # at each epoch's end, a region of the last step
    # validation's own loop: 32 samples a pass, 2 passes; its wait is its own
    assert val["loop"]["steps"] == 2 * 4 and val["loop"]["epochs"] == 2
    assert val["stages"]["load"]["count"] == 2 * 32
    assert r["Validation"]["total_s"] >= val["loop"]["wait_s"]


def test_lightning_under_pipeprof_run(tmp_path, lightning_api):
    ran = pipeprof_run(tmp_path, LIGHTNING, *LIGHTNING_ARGS)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == lightning_api[2]  # the same batches
    main = load(tmp_path / "run.json")
    assert main["meta"]["run_loader"]["label"].startswith("Trainer.fit@lightning_fit.py:")
    assert main["loop"]["steps"] == 16 and main["loop"]["epochs"] == 2
    assert {"Forward", "Backward", "Optimizer", "Callbacks", "Validation"} <= set(regions(main))
    loaders = main["meta"]["run"]["loaders"]
    assert [e["steps"] for e in loaders] == [16, 8]  # training, then its validation
    assert [e["passes"] for e in loaders] == [2, 2]


def test_lightning_exception_passes_through(tmp_path, capsys):
    with pytest.raises(RuntimeError, match="boom at step 2"):
        script(LIGHTNING, "--raise-at", "2", "--callback", str(tmp_path / "f.json"), capsys=capsys)
    assert DataLoader.__iter__.__module__ == "torch.utils.data.dataloader"
    report = load(tmp_path / "f.json")
    assert report["interrupted"] and report["loop"]["steps"] == 3


DATAMODULE = str(SCRIPTS / "lightning_datamodule.py")


def test_lightning_loaders_are_named_after_the_users_code_and_rare_validation(tmp_path):
    """``trainer.test``/``predict`` on a LightningDataModule: their loaders reach ``pipeprof
    run``'s own patch. Lightning makes them inside its wrapper of ``DataLoader.__init__`` (the
    test loader was labelled ``DataLoader@data.py:325``, the wrapper's line) and re-makes the
    predict loader with its own sampler (``result (data.py:257)``, a variable of Lightning's):
    each is named after the DataModule's hook, at the user's line. And validation that ran once,
    at the epoch's end, is no region to run "every 10 steps instead of every step" (the near
    miss of the next test): it took most of the loop, once."""
    ran = pipeprof_run(tmp_path, DATAMODULE, "--test")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "steps 8\npredicted 24\n"
    main = load(tmp_path / "run.json")
    lines = Path(DATAMODULE).read_text().splitlines()
    loaders = {e["label"]: e for e in main["meta"]["run"]["loaders"]}
    for hook, steps in (("test_dataloader", 2), ("predict_dataloader", 3)):
        assert loaders[hook]["steps"] == steps, loaders
        line = lines.index(f"    def {hook}(self):") + 2  # its ``return DataLoader(...)``
        assert loaders[hook]["site"] == f"lightning_datamodule.py:{line}"
        assert load(tmp_path / f"run.{hook}.json")["meta"]["run_loader"]["label"] == hook
    assert not any("data.py" in e["site"] or "result" in e["label"] for e in loaders.values())
    r = regions(main)
    assert r["Validation"]["count"] == 1 and main["loop"]["steps"] == 8
    assert main["loop"]["overhead_s"] > 0.05 * main["loop"]["wall_s"]  # a large share, once
    assert "overhead-regions" not in {f["id"] for f in main["findings"]}


def test_lightning_validation_every_step_is_told_to_run_less_often(tmp_path):
    """The near miss of the test above: validation after every training step (8 samples of
    2 ms each time) is the region the finding names."""
    ran = pipeprof_run(tmp_path, DATAMODULE, "--val-every", "1", "--val-samples", "8")
    assert ran.returncode == 0, ran.stderr[-3000:]
    main = load(tmp_path / "run.json")
    assert regions(main)["Validation"]["count"] == main["loop"]["steps"] == 8
    (found,) = [f for f in main["findings"] if f["id"] == "overhead-regions"]
    assert found["evidence"]["region"] == "Validation" and found["evidence"]["per_step"] == 1
    assert "'Validation' every 10 steps instead of every step" in found["fix"]


def test_a_missing_framework_names_the_extra(monkeypatch):
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    for module, extra in (("lightning", "lightning"), ("hf", "hf")):
        for where in ("integrations", "attach"):  # the public path, and where it is defined
            monkeypatch.delitem(sys.modules, f"pipeprof.{where}.{module}", raising=False)
        with pytest.raises(ImportError, match=rf"pip install 'pipeprof\[{extra}\]'"):
            importlib.import_module(f"pipeprof.integrations.{module}")


# ---- Hugging Face Trainer --------------------------------------------------------------------

HF_ARGS = ("--samples", "64", "--load-ms", "1", "--collate-ms", "3", "--step-ms", "4",
           "--eval-steps", "4")  # fmt: skip


@pytest.fixture(scope="module")
def hf_api(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, str]:
    tmp = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as mp:
        out = script(HF, *HF_ARGS, "--callback", str(tmp / "train.json"), capsys=_Capture(mp))
    assert DataLoader.__iter__.__module__ == "torch.utils.data.dataloader"
    return load(tmp / "train.json"), load(tmp / "train.val.json"), out


@needs_hf
def test_hf_callback_profiles_train(hf_api):
    train, val, out = hf_api
    assert out.startswith("steps 8 loss ")
    loop = train["loop"]
    assert loop["steps"] == 8 and loop["epochs"] == 1  # evaluation adds no steps
    stages = train["stages"]
    assert stages["load"]["count"] == 64 and stages["collate"]["count"] == 8
    assert 2.9 <= stages["collate"]["mean_ms"] <= 6  # the collator's injected 3 ms
    # each step waits for 8 samples of 1 ms and the collator's 3 ms (no workers)
    assert 10 <= 1000 * loop["wait_s"] / loop["steps"] <= 25
    r = regions(train)
    assert r["Step"]["count"] == r["Optimizer"]["count"] == 8
    # 4 ms injected before the optimizer step; the region lies within the step's compute (the
    # wait, 10-25 ms, is outside it), however slow a loaded machine makes the model's own work
    compute_ms = 1000 * loop["compute_s"] / loop["steps"]
    assert 4 <= r["Step"]["mean_ms"] <= compute_ms, (r["Step"], compute_ms)
    assert r["Evaluate"]["count"] == 2 and r["Log/Save"]["count"] == 8
    assert val["loop"]["steps"] == 2 * 2 and val["loop"]["epochs"] == 2  # 16 samples, twice
    # the wait's share: 0.29 seen, 0.249 on a loaded machine (the Trainer's own CPU per step
    # grows with the load, the injected sleeps do not); the wait per step is bounded above
    assert 0.15 <= loop["wait_fraction"] <= 0.8
    assert loop["wait_fraction"] == pytest.approx(loop["wait_s"] / loop["wall_s"], rel=1e-3)


@needs_hf
def test_hf_under_pipeprof_run(tmp_path, hf_api):
    ran = pipeprof_run(tmp_path, HF, *HF_ARGS)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == hf_api[2]  # the same loss: the same batches
    main = load(tmp_path / "run.json")
    assert main["meta"]["run_loader"]["label"].startswith("Trainer.train@hf_train.py:")
    assert main["loop"]["steps"] == 8 and main["stages"]["collate"]["count"] == 8
    assert {"Step", "Optimizer", "Evaluate", "Log/Save"} <= set(regions(main))
    assert [e["steps"] for e in main["meta"]["run"]["loaders"]] == [8, 4]

    ran = pipeprof_run(tmp_path, HF, "--raise-at", "3")
    assert ran.returncode == 1 and "RuntimeError: boom at step 3" in ran.stderr
    report = load(tmp_path / "run.json")
    # the 4th step raised; accelerate's shard had fetched the 5th batch already (one ahead)
    assert report["interrupted"] and report["loop"]["steps"] == 5
