"""The diagnosis matrix, in a smaller form: each cause of benchmarks/diagnosis_matrix.py, whose
truth is known by construction, at 2 workers (the training process's loading: none), fork, free
cores. The verdict's kind, and its limiting stage (or its wait's cause) must be the truth.

The benchmark runs every crossing (1, 2 and 4 workers; fork and spawn; free and saturated
cores) and follows the fixes; docs/validation/diagnosis.md has its tables. Here, each cause is
also a near miss for the others: a compute-bound loop must not be called input-bound, a slow
stage must not be called a hand-over, a hand-over must not be given a stage.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import diagnosis_matrix as matrix


@pytest.mark.timing
@pytest.mark.parametrize("cause", list(matrix.CASES))
def test_the_verdict_names_the_cause_built_in(cause):
    case = matrix.CASES[cause]
    workers = 2 if 2 in case.workers else case.workers[0]
    row = matrix.run_case(case, workers, "fork", busy=False, follow=False)
    assert row["right"], (cause, row)
    assert row["kind"] == case.kind
    if case.stage is not None:
        assert row["stages"] == [case.stage] and row["stage"] == case.stage
    if case.cause_is is not None:
        assert row["wait_cause"] == case.cause_is and row["stages"] == []
    if cause == "hand-over":  # workers with slack: no GIL to wait for, no file_system first
        assert row["handover_gil"] is False, row


def test_the_judge_refuses_a_wrong_stage_and_a_wrong_cause():
    """The matrix's judge itself: a verdict that names a stage for a hand-over, or another
    stage, or another kind, is wrong."""
    v = {"kind": "input-bound", "stage": "load", "stages": ["load"], "cause": "starved",
         "headline": ""}  # fmt: skip
    r = {"verdict": v, "findings": []}
    assert matrix.judge(matrix.CASES["storage"], r)["right"]
    assert not matrix.judge(matrix.CASES["collate"], r)["right"]
    assert not matrix.judge(matrix.CASES["hand-over"], r)["right"]
    assert not matrix.judge(matrix.CASES["compute"], r)["right"]
    assert not matrix.judge(
        matrix.CASES["storage"], {**r, "verdict": {**v, "stages": ["load", "collate"]}}
    )["right"]


@pytest.mark.timing
def test_kept_workers_start_once_so_start_up_is_no_verdict():
    """The near miss of NOTE [ Start-up every epoch ] (analyze/verdict.py): the same short
    epochs and slow worker start, with persistent_workers=True. The workers start once, so
    the later epochs do not wait for them: the verdict reads the steady steps, not start-up."""
    import pipeprof

    case = matrix.CASES["start-up"]
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        matrix.train(matrix.loader_for(case, 2, "fork", persistent_workers=True), case, prof)
    report = prof.report().to_dict()
    assert report["loop"]["epochs"] == case.epochs
    assert report["verdict"].get("cause") != "start-up", report["verdict"]
    assert "slow-startup" not in {f["id"] for f in report["findings"] if f.get("fix") and
                                  "persistent_workers=True keeps" in f["fix"]}  # fmt: skip


def test_full_cores_are_not_waiting():
    """NOTE [ Full cores are not waiting ] (analyze/scenarios.py): workers busy twice their CPU
    time are waiting where the job left cores free, and waiting for a core where it filled
    them: the model then costs each stage its CPU time alone."""
    from pipeprof.analyze.scenarios import cores_full, from_report

    def report(worker_cpu_s: float) -> dict:
        workers = [{"track": f"worker{i}", "pid": i, "busy_s": 2 * worker_cpu_s,
                    "cpu_s": worker_cpu_s, "batches": 10} for i in range(2)]  # fmt: skip
        return {"wall_s": 1.0, "samples": 80, "batches": 10, "workers": workers,
                "meta": {"num_workers": 2, "main_cpu_ns": 100_000_000},
                "stages": {"load": {"total_s": 4 * worker_cpu_s, "per_sample_ms": 10.0}},
                "wait": {}}  # fmt: skip

    busy, idle = report(0.9), report(0.4)  # (0.1 + 1.8) / 2 cores full; (0.1 + 0.8) / 2 not
    assert cores_full(busy, 2) and not cores_full(idle, 2)
    assert not cores_full(busy, 4)  # the same job on 4 cores left them free
    (stage,) = from_report(busy, 2).stages
    assert stage.wall_ms == pytest.approx(stage.cpu_ms) == pytest.approx(5.0)
    (stage,) = from_report(idle, 2).stages
    assert stage.wall_ms == pytest.approx(10.0) and stage.cpu_ms == pytest.approx(5.0)


def test_past_the_cores_python_workers_are_judged_by_their_stage():
    """Python in more workers than cores: the cores bound the pipeline (724 samples/s against
    823 with file_system sharing, for 1,000 of CPU), so the stage limits there as within them,
    and a hand-over verdict is wrong (NOTE [ Workers past the cores ])."""
    import os

    past = (os.cpu_count() or 1) + 1
    case = matrix.CASES["collate"]
    verdict = {"kind": "input-bound", "stage": None, "stages": [], "cause": "hand-over",
               "headline": ""}  # fmt: skip
    handed = {"verdict": verdict, "findings": []}
    staged = {"verdict": {"kind": "input-bound", "stage": "collate", "stages": ["collate"],
                          "cause": "starved", "headline": ""}, "findings": []}  # fmt: skip
    for workers in (1, past):
        assert matrix.judge(case, staged, workers)["right"]
        assert not matrix.judge(case, handed, workers)["right"]


def test_workers_past_the_cores_that_fill_them_limit_not_their_hand_over():
    """4 workers on 2 cores whose CPU at the loop's rate fills the cores this job gets: the
    stage limits though the wait split says hand-over; near misses: idle workers, workers
    within the cores, and a busy neighbour process that takes its turns (fair share)."""
    from pipeprof.analyze.verdict import workers_fill_cores

    def report(cpu_s: float, n: int = 4, children: int = 0) -> dict:
        workers = [{"track": f"worker{i}", "pid": 10 + i, "batches": 12, "cpu_s": cpu_s / n}
                   for i in range(n)]  # fmt: skip
        hogs = [{"pid": 90 + i, "role": "child", "cpu_mean": 60.0} for i in range(children)]
        host = {"per_process": hogs, "cpu_util_mean": None, "cpu_count": 2}
        return {"meta": {"num_workers": n}, "workers": workers, "host": host}

    view = {"steps": 44, "wall_s": 0.44}  # 10 ms a step; 44 batches timed for CPU
    assert workers_fill_cores(report(0.88), view, 2) == pytest.approx(1.0)  # 2 cores' worth
    assert workers_fill_cores(report(0.5), view, 2) is None  # 1.1 cores: slack
    assert workers_fill_cores(report(0.88, n=2), view, 2) is None  # within the cores
    # two busy neighbours: this job gets 2 x 5/7 cores, which 1.3 cores' worth fills
    assert workers_fill_cores(report(0.57, children=2), view, 2) == pytest.approx(0.91, abs=0.01)
    assert workers_fill_cores(report(0.57), view, 2) is None
