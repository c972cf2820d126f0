"""Distributed jobs: the real torchrun, gloo on the CPU, DDP, a DistributedSampler and one rank
with a known slower input pipeline (tests/scripts/ddp_train.py); and `merge` of real per-rank
profiles, good and bad."""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fake_cuda import FakeGPU
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pipeprof

SCRIPTS = Path(__file__).resolve().parent / "scripts"
DDP_TRAIN = str(SCRIPTS / "ddp_train.py")
ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
          "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID")  # fmt: skip


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in LAUNCH}
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["COLUMNS"] = "120"
    return e


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, the system's pick: fixed ports collided
    when tests ran at once (EADDRINUSE)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={free_port()}", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env(), timeout=240)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.slow
@pytest.mark.timing
def test_torchrun_job_names_the_slow_rank_and_its_stage(tmp_path):
    common = (DDP_TRAIN, "--slow-rank", "1", "--slow-ms", "4", "--collective")
    plain = torchrun(tmp_path, *common, "--truth", "plain")
    assert plain.returncode == 0, plain.stderr
    ran = torchrun(tmp_path, "-m", "pipeprof", "run", "-o", "run.json", *common,
                   "--truth", "truth")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    # every rank wrote its own file; only rank 0 printed its summary
    assert (tmp_path / "run.rank0.json").exists() and (tmp_path / "run.rank1.json").exists()
    assert not (tmp_path / "run.json").exists()
    assert "rank 0 of 2" in ran.stderr and "rank 1 of 2" not in ran.stderr
    assert "DDP all-reduce (allreduce_hook, the host's view)" in " ".join(ran.stderr.split())
    # ... and rank 0 wrote the job report, gathered over the job's process group when the script
    # destroyed it (NOTE [ Job gather ]): no merge needed
    assert "job report gathered from 2 of 2 ranks" in ran.stderr, ran.stderr
    gathered = load(tmp_path / "run.job.json")
    assert gathered["gather_s"] < 5
    truth = {r: load(tmp_path / f"truth.rank{r}.json") for r in (0, 1)}
    # timing DDP's all-reduce through a hook leaves training exactly as it was
    for r in (0, 1):
        assert truth[r]["weight_sum"] == load(tmp_path / f"plain.rank{r}.json")["weight_sum"]

    merged = subprocess.run(
        [sys.executable, "-m", "pipeprof", "merge", "run.rank0.json", "run.rank1.json",
         "-o", "job.json"], capture_output=True, text=True, cwd=tmp_path, env=env(), timeout=60,
    )  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    job = load(tmp_path / "job.json")
    # the gathered job report is the merge of the files, figure for figure
    assert job.pop("gather_s") is None  # merge gathered nothing
    assert {k: v for k, v in gathered.items() if k != "gather_s"} == job
    assert [s["rank"] for s in job["stragglers"]] == [1]
    assert job["stragglers"][0]["stage"] == "load"
    assert "rank 1 waits" in job["headline"] and "wait on it in all-reduce" in job["headline"]
    rank = {r["rank"]: r for r in job["ranks"]}
    for r in (0, 1):  # the wait each rank's own loop measured around next(), plain code
        seen = truth[r]["waited_s"] / truth[r]["loop_s"]
        # two clocks around one wait; a neighbour's burst on this shared VM moves one more
        assert rank[r]["wait_fraction"] == pytest.approx(seen, abs=0.04), r
    # rank 1's extra wait is the injected sleep (both ranks share the rest of the pipeline)
    injected = truth[1]["injected_s"] / truth[1]["loop_s"]
    extra = rank[1]["wait_fraction"] - rank[0]["wait_fraction"]
    # 0.02 apart on a quiet machine; 0.033 on a loaded CI host (both clocks see its bursts)
    assert extra == pytest.approx(injected, abs=0.05)
    # ... and rank 0 spent it waiting in the all-reduce: comm, not compute. Its comm is that
    # wait and the all-reduce's own cost, which rank 1 pays too (0.703 against 0.640 + 0.06
    # seen once when rank 0's own comm alone was compared)
    assert rank[1]["comm_fraction"] < 0.1
    own = rank[1]["comm_fraction"]
    assert rank[0]["comm_fraction"] - own == pytest.approx(extra, abs=0.06), (rank, extra)
    assert 0 < job["efficiency"]["parallel"] < 0.5 and job["what_if"]["speedup"] > 1.5
    # one Perfetto trace of the job: each rank's processes, clocks aligned. A DDP all-reduce
    # ends on both ranks at once, so the ranks' Comm spans end together on the trace's clock
    traced = subprocess.run(
        [sys.executable, "-m", "pipeprof", "merge", "run.rank0.json", "run.rank1.json",
         "-o", "job.trace.json"], capture_output=True, text=True, cwd=tmp_path, env=env(),
        timeout=60,
    )  # fmt: skip
    assert traced.returncode == 0, traced.stderr
    trace = load(tmp_path / "job.trace.json")
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert any(n.startswith("rank 0 · main process") for n in names)
    assert any(n.startswith("rank 1 · main process") for n in names)
    ends: dict[int, list[float]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["name"] == "Comm":
            ends.setdefault(e["pid"] // 10_000_000, []).append(e["ts"] + e["dur"])
    assert len(ends[1]) == len(ends[2]) == 2 * rank[0]["steps"]
    apart = [abs(a - b) for a, b in zip(sorted(ends[1]), sorted(ends[2]))]
    assert statistics.median(apart) < 2000, apart  # µs: 0.1 ms seen
    for r in (0, 1):
        report = load(tmp_path / f"run.rank{r}.json")
        assert report["meta"]["rank"]["rank"] == r and report["meta"]["rank"]["world_size"] == 2
        assert report["meta"]["comm"]["hook"] == "allreduce_hook"
        # each step: one DDP all-reduce and the script's explicit all_reduce, both Comm
        assert report["loop"]["regions"]["Comm"]["count"] == 2 * report["loop"]["steps"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_ranks_without_a_distributed_sampler_are_named(tmp_path, workers):
    """Issue 40: two ranks that each read the whole dataset (no DistributedSampler; shuffled,
    so each in its own order) are named in the job report, from their indices' sketches (NOTE [
    Index sketches ] in core/batch.py); the same job with a DistributedSampler is not."""
    common = (DDP_TRAIN, "--samples", "400", "--batch", "8", "--slow-ms", "0", "--step-ms", "0",
              "--shuffle", "--workers", str(workers))  # fmt: skip
    for sampled in (False, True):
        out = tmp_path / ("split" if sampled else "whole")
        out.mkdir()
        ran = torchrun(out, "-m", "pipeprof", "run", "-q", "-o", "run.json", *common,
                       *(() if sampled else ("--no-sampler",)))  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        job = load(out / "run.job.json")
        if sampled:
            assert job["same_samples"] == []
            assert "same samples" not in job["headline"]
        else:
            assert job["same_samples"][0]["ranks"] == [0, 1]
            assert job["same_samples"][0]["overlap"] >= 0.8
            assert "ranks 0 and 1 read the same samples" in job["headline"]
            assert "DistributedSampler" in job["headline"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_ranks_that_read_the_same_stream_are_named(tmp_path, workers):
    """Issue 40: an IterableDataset sharded by worker but not by rank (a streaming dataset not
    split by node) gives every rank the same stream; the job report compares the ranks' first
    samples' fingerprints (NOTE [ The same stream ]) and names them, with the stream's fix. The
    stream sharded by rank as well is not named."""
    for by_rank in (False, True):
        out = tmp_path / ("split" if by_rank else "whole")
        out.mkdir()
        ran = torchrun(out, "-m", "pipeprof", "run", "-q", "-o", "run.json",
                       str(SCRIPTS / "ddp_stream.py"), "--workers", str(workers),
                       *(("--rank-shard",) if by_rank else ()))  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        read = sorted(re.findall(r"rank (\d) read (\d+) samples", ran.stdout))  # lines interleave
        assert read == [(str(r), "256" if by_rank else "512") for r in (0, 1)]
        job = load(out / "run.job.json")
        if by_rank:
            assert job["same_samples"] == []
        else:
            assert job["same_samples"][0]["ranks"] == [0, 1]
            assert job["same_samples"][0]["by"] == "stream"
            assert "ranks 0 and 1 read the same samples" in job["headline"]
            assert "split_dataset_by_node" in job["headline"]


def test_a_crashing_rank_leaves_every_rank_s_file_and_merge_names_what_is_there(tmp_path):
    """Rank 1 raises after 5 steps: torchrun stops rank 0 (SIGTERM). No job report is gathered
    (rank 1 never comes), but both ranks wrote their files on the way out, and they merge."""
    ran = torchrun(tmp_path, "-m", "pipeprof", "run", "-o", "run.json", DDP_TRAIN,
                   "--crash-rank", "1", "--step-ms", "20")  # fmt: skip
    assert ran.returncode != 0
    assert "RuntimeError: rank 1 crashed" in ran.stderr
    assert not (tmp_path / "run.job.json").exists()
    r1 = load(tmp_path / "run.rank1.json")
    assert r1["loop"]["steps"] == 5  # its steps up to the crash
    files = [tmp_path / "run.rank0.json", tmp_path / "run.rank1.json"]
    if not files[0].exists():  # rank 0 killed before it could write: merge names it missing
        job = pipeprof.merge(files[1:])
        assert job["missing_ranks"] == [0]
        return
    # rank 0 ended with gloo's error in the all-reduce rank 1 never joined, or torchrun's SIGTERM
    r0 = load(files[0])
    assert r0["interrupted"] or any("the script ended with" in n for n in r0["notes"]), r0["notes"]
    assert any("the script ended with RuntimeError: rank 1 crashed" in n for n in r1["notes"])
    job = pipeprof.merge(files)
    assert job["missing_ranks"] == [] and job["world_size"] == 2


@pytest.mark.slow
def test_two_nodes_on_one_host_gather_one_job_report(tmp_path):
    """``--nnodes=2``: two torchrun agents (one per "node", each with 2 ranks) meeting at a c10d
    rendezvous on localhost; rank 0 gathers all four ranks' reports."""
    common = ["--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
              f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_id=pp-two-nodes", "-m",
              "pipeprof", "run", "-o", "run.json", DDP_TRAIN, "--samples", "256", "--slow-rank",
              "3", "--slow-ms", "4"]  # fmt: skip
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *common],
                              cwd=tmp_path, env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [n.communicate(timeout=240) for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], [o[1][-2000:] for o in outs]
    job = load(tmp_path / "run.job.json")
    assert job["world_size"] == 4 and job["ranks_present"] == [0, 1, 2, 3]
    # 4 ranks on 2 cores: a rank beside the slow one may wait past the margin too, but less
    assert job["stragglers"] and job["stragglers"][0]["rank"] == 3
    nodes_seen = {r["meta"]["rank"]["node_rank"] for r in
                  (load(tmp_path / f"run.rank{i}.json") for i in range(4))}  # fmt: skip
    assert len(nodes_seen) == 2


# ---- merge, from real profiles written in this process --------------------------------------


def _rank_file(tmp: Path, monkeypatch, rank: int, world: int, wait_ms: float = 0.0,
               port: str = "29500", name: str | None = None, steps: int = 8) -> Path:  # fmt: skip
    for k in LAUNCH:
        monkeypatch.delenv(k, raising=False)
    for k, v in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world,
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}.items():  # fmt: skip
        monkeypatch.setenv(k, str(v))

    def batches():
        for _ in range(steps):
            time.sleep(wait_ms / 1000)
            yield torch.zeros(4, 2)

    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(batches()):
            with prof.region("Comm"):
                time.sleep(0.002)
            time.sleep(0.003)
    return prof.report().save(tmp / (name or "run.json"))


def test_merge_of_real_rank_files_and_a_missing_rank(tmp_path, monkeypatch):
    files = [_rank_file(tmp_path, monkeypatch, r, 3, wait_ms=12.0 if r == 2 else 0.0)
             for r in (0, 2)]  # fmt: skip
    assert [f.name for f in files] == ["run.rank0.json", "run.rank2.json"]
    job = pipeprof.merge(files)
    assert job["missing_ranks"] == [1] and "rank 1 of 3 missing" in job["notes"][0]
    assert [s["rank"] for s in job.stragglers] == [2]
    # the Comm region is comm, not compute: POP's useful time leaves it out
    r0 = job["ranks"][0]
    assert r0["comm_fraction"] == pytest.approx(0.4, abs=0.15)
    assert r0["compute_s"] < r0["wall_s"] * 0.75
    eff = job["efficiency"]
    assert eff["parallel"] == pytest.approx(eff["load_balance"] * eff["communication"], abs=1e-3)
    assert "rank 2 waits" in job.render("text") and "<svg" in job.render("html")


def test_the_rank_whose_data_ran_out_first_is_named(tmp_path, monkeypatch):
    """Issue 40: ranks whose shards differ run different numbers of steps; the job names the rank
    whose data ran out first and the one whose ran out last. Ranks of one length: none."""
    files = [_rank_file(tmp_path, monkeypatch, r, 3, steps=n) for r, n in ((0, 8), (1, 5), (2, 7))]
    job = pipeprof.merge(files)
    assert job["ran_out"] == {"first": 1, "last": 0, "steps": {"0": 8, "1": 5, "2": 7}}
    said = "rank 1's data ran out first (5 steps), rank 0's last (8)"
    assert any(said in n for n in job["notes"])
    html = job.render("html")  # each rank's samples, the one that ran out first in red
    chart = html[html.index('<svg class="chart shares"'):]
    chart = chart[: chart.index("</svg>")]
    assert "rank 0: 32 samples, 40.0%" in chart and "rank 1: 20 samples, 25.0%" in chart
    assert chart.count('fill="#e03131"') == 1 and "ran out first (5 steps)" in chart
    even = tmp_path / "even"
    even.mkdir()
    same = pipeprof.merge([_rank_file(even, monkeypatch, r, 2) for r in (0, 1)])
    assert same["ran_out"] is None and not any("ran out" in n for n in same["notes"])


def test_pipeprof_report_renders_job_and_comparison_files(tmp_path, monkeypatch, capsys):
    """``pipeprof report`` reads back what ``merge`` and ``compare`` write (as it does what
    ``pipeprof run`` writes under torchrun: the gathered job report is the merge's, figure for
    figure: ``test_torchrun_job_names_the_slow_rank_and_its_stage``), in every format."""
    from pipeprof.cli import main

    a = _rank_file(tmp_path, monkeypatch, 0, 2)
    b = _rank_file(tmp_path, monkeypatch, 1, 2, wait_ms=12.0)
    job, cmp = tmp_path / "job.json", tmp_path / "cmp.json"
    assert main(["merge", str(a), str(b), "-o", str(job)]) == 0
    assert main(["compare", str(a), str(b), "-o", str(cmp)]) == 0
    said = {job: "rank 1 waits", cmp: "run.rank0.json"}
    for f, words in said.items():
        capsys.readouterr()
        assert main(["report", str(f)]) == 0
        assert words in " ".join(capsys.readouterr().out.split())
        assert main(["report", str(f), "-o", str(tmp_path / "page.html")]) == 0
        page = (tmp_path / "page.html").read_text()
        assert page.startswith("<!DOCTYPE html>") and words in page
        capsys.readouterr()
        assert main(["report", str(f), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out) == json.loads(f.read_text())
    # a job report keeps no timelines: its trace comes from the ranks' files, and says so
    for out in ("job.trace.json", "job.trace"):  # both name the chrome format
        assert main(["report", str(job), "-o", str(tmp_path / out)]) == 2
        assert "pipeprof merge run.rank*.json -o job.trace.json" in capsys.readouterr().err


def test_the_job_trace_puts_each_rank_on_the_wall_clock(tmp_path, monkeypatch):
    """Rank 1 profiled after rank 0 (one after the other, here): on the job trace's clock its
    spans come after rank 0's, by the time between the two runs."""
    a = _rank_file(tmp_path, monkeypatch, 0, 2)
    time.sleep(0.2)
    b = _rank_file(tmp_path, monkeypatch, 1, 2)
    trace = json.loads(pipeprof.merge([a, b]).render("chrome"))
    spans: dict[int, list[tuple[float, float]]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            spans.setdefault(e["pid"] // 10_000_000, []).append((e["ts"], e["ts"] + e["dur"]))
    end0 = max(t1 for _, t1 in spans[1])
    start1 = min(t0 for t0, _ in spans[2])
    gap_s = (pipeprof.load(b).session.started_at - pipeprof.load(a).session.started_at)
    assert start1 > end0 + 0.19e6  # µs: the 0.2 s sleep between them
    assert min(t0 for t0, _ in spans[1]) >= 0
    assert start1 == pytest.approx(gap_s * 1e6, abs=0.05e6)
    with pytest.raises(ValueError, match="needs the ranks' reports"):
        pipeprof.report.Job(pipeprof.merge([a, b]).to_dict()).render("chrome")


def test_merge_refuses_files_that_are_not_one_job(tmp_path, monkeypatch):
    a = _rank_file(tmp_path, monkeypatch, 0, 2)
    b = _rank_file(tmp_path, monkeypatch, 1, 2)
    with pytest.raises(ValueError, match=r"rank 0 appears twice .*run.rank0.json"):
        pipeprof.merge([a, a])
    c = _rank_file(tmp_path, monkeypatch, 1, 4, name="big.json")
    with pytest.raises(ValueError, match="different sizes"):
        pipeprof.merge([a, c])
    d = _rank_file(tmp_path, monkeypatch, 1, 2, port="29999", name="other.json")
    with pytest.raises(ValueError, match="different jobs"):
        pipeprof.merge([a, d])
    late = pipeprof.load(b)
    late.session.started_at += 3600  # the same job's command, run again an hour later
    with pytest.raises(ValueError, match="different runs"):
        pipeprof.merge([a, late])
    for k in LAUNCH:
        monkeypatch.delenv(k, raising=False)
    out = subprocess.run([sys.executable, "-m", "pipeprof", "merge", str(a), str(a)],
                         capture_output=True, text=True, env=env(), timeout=60)  # fmt: skip
    assert out.returncode == 2 and "rank 0 appears twice" in out.stderr
    assert "Traceback" not in out.stderr
    assert pipeprof.merge([a, b])["missing_ranks"] == []


@pytest.mark.parametrize("timer", ["cpu", "cuda"])
def test_profiler_time_comm_times_ddp_all_reduce(tmp_path, monkeypatch, timer):
    """With CUDA events (a stand-in GPU), buckets on the CPU still get none: gloo's future
    completes when the all-reduce does, so the host's view is the truth there."""
    for k in LAUNCH:
        monkeypatch.delenv(k, raising=False)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0,
                            world_size=1)  # fmt: skip
    gpu = FakeGPU()
    try:
        torch.manual_seed(0)
        model = DDP(nn.Linear(8, 2))
        prof = pipeprof.Profiler(sample_hz=0, timer=timer, event_factory=gpu.event)
        assert prof.time_comm(model) is model
        with prof:
            for x in prof.wrap([torch.ones(4, 8)] * 6):
                model(x).sum().backward()
        comm = prof.report()["meta"]["comm"]
    finally:
        dist.destroy_process_group()
    assert comm["hook"] == "allreduce_hook" and comm["buckets"] == 6
    assert "gpu" not in comm
    assert gpu.created == (12 if timer == "cuda" else 0)  # compute's two a step, none for comm
    assert model.module.weight.grad is not None
