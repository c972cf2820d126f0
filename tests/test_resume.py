"""A resumed StatefulDataLoader that repeats or skips samples (NOTE [ Resumes ] in
collect/torch/resume.py): built for real with torchdata, under ``pipeprof run``. The script
counts its own repeats and skips; the report must say the same, and the correct loader (its
``shuffle=True``) nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pipeprof

pytest.importorskip("torchdata.stateful_dataloader")

SCRIPT = """
import sys
import torch
from torch.utils.data import RandomSampler, SequentialSampler
from torchdata.stateful_dataloader import StatefulDataLoader

torch.manual_seed(0)
data = list(range(200))
kind, workers, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume"


def make():
    kw = dict(batch_size=4, num_workers=workers)
    if kind == "shuffle":
        kw["shuffle"] = True
    else:
        kw["sampler"] = RandomSampler(data) if kind == "random" else SequentialSampler(data)
    return StatefulDataLoader(data, **kw)


loader = make()
before = []
for step, batch in enumerate(loader):
    before += batch.tolist()
    if step % 5 == 4:
        state = loader.state_dict()
    if resume and step == 19:
        break
if resume:
    again = make()
    again.load_state_dict(state)
    after = [x for batch in again for x in batch.tolist()]
    print("repeated", len(set(before) & set(after)), "skipped",
          len(data) - len(set(before) | set(after)), "read", before + after)
else:
    print("read", before)
"""


def run(tmp_path: Path, *args: str) -> tuple[str, dict]:
    script = tmp_path / "resume.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                           text=True, check=True)  # fmt: skip
    out = tmp_path / "run.json"
    ran = subprocess.run([sys.executable, "-m", "pipeprof", "run", "-o", str(out), str(script),
                          *args], capture_output=True, text=True, check=True)  # fmt: skip
    assert ran.stdout.splitlines()[0] == plain.stdout.splitlines()[0]  # the same batches
    return plain.stdout, pipeprof.load(out).to_dict()


def resume_finding(report: dict) -> dict | None:
    return next((f for f in report["findings"] if f["id"] == "resume-repeats"), None)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_through_torchs_random_sampler_is_measured_to_repeat(tmp_path, workers):
    """torch's RandomSampler keeps no state: the resumed pass draws a new order and skips the
    20 batches read; the report's repeats and skips are the script's own counts."""
    out, report = run(tmp_path, "random", str(workers), "resume")
    words = out.split()
    repeated, skipped = int(words[1]), int(words[3])
    assert repeated > 0  # the bug, by construction
    got = report["accounting"]["resume"]
    assert got["restores"] == "fast-forward" and got["shuffles"] is True
    assert got["resumes"] == [{"at": 20, "before": 80, "after": 120, "repeated": repeated,
                               "skipped": skipped}]  # fmt: skip
    found = resume_finding(report)
    assert found and f"{repeated} of them already read" in found["message"]
    assert "shuffle=True" in found["fix"]


def test_the_same_resume_with_shuffle_true_is_no_finding(tmp_path):
    """The fix followed: torchdata's own RandomSampler is restored, the resume reads each
    sample once, and the report says so without a finding."""
    out, report = run(tmp_path, "shuffle", "2", "resume")
    assert out.split()[:4] == ["repeated", "0", "skipped", "0"]
    got = report["accounting"]["resume"]
    assert got["restores"] == "state"
    assert got["resumes"][0]["repeated"] == 0 and got["resumes"][0]["skipped"] == 0
    assert resume_finding(report) is None


@pytest.mark.parametrize("kind", ["random", "sequential"])
def test_snapshots_a_resume_would_get_wrong_are_named_before_any_resume(tmp_path, kind):
    """No resume in the run: snapshots of a loader over torch's RandomSampler are named (a
    resume would redraw the order); over a SequentialSampler, whose order a fast-forward
    replays exactly, they are not."""
    _, report = run(tmp_path, kind, "0", "once")
    got = report["accounting"]["resume"]
    assert got["restores"] == "fast-forward" and got["resumes"] == []
    found = resume_finding(report)
    if kind == "random":
        assert found and "no resume was measured" in found["message"]
    else:
        assert got["shuffles"] is False and found is None
