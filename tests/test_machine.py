"""How the machine's cores scale (NOTE [ Cores are not all equal ] in collect/machine.py): the
probe, its cache, and what-ifs that count the cores as the probe found them.

No machine here has cores that slow each other down per CPU second (this VM's 2 vCPUs each do a
lone one's work), so the slow-core cases feed a measured record into the cache: the stand-in
is the probe's figure, and everything downstream of it runs for real."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from pipelines import CostDataset, Scale
from torch.utils.data import DataLoader, default_collate, get_worker_info
from torchvision import transforms

import pipeprof
from pipeprof.analyze import whatif
from pipeprof.analyze.scenarios import from_report, scaled_cores
from pipeprof.analyze.whatif import throughput
from pipeprof.bench.scaling import Cycled, run_loader
from pipeprof.collect import machine


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEPROF_CACHE_DIR", str(tmp_path))
    return tmp_path / "machine.json"


def slow_cores(cache, per: float, cores: int = 2) -> None:
    """A cached record of cores that, all busy, each do ``per`` of a lone core's work."""
    key = machine._key(cores)
    record = {"cores": cores, "per_process": per, "effective_cores": cores * per, "probe": "python"}
    cache.write_text(json.dumps({key: record}))


def test_the_probe_measures_once_per_machine_and_caches(cache, monkeypatch):
    first = machine.core_scaling(2)
    assert first is not None and first["cached"] is False and first["cores"] == 2
    assert 0.5 < first["per_process"] <= 1.0  # per CPU second: a busy neighbour is no slow core
    assert first["effective_cores"] == pytest.approx(2 * first["per_process"], abs=0.01)
    assert machine._key(2) in json.loads(cache.read_text())
    calls = []
    monkeypatch.setattr(machine, "probe", lambda *a, **k: calls.append(a))
    again = machine.core_scaling(2)
    assert again["cached"] is True and again["per_process"] == first["per_process"]
    assert calls == []  # from the file, not measured again
    machine.core_scaling(3)  # another core count is another record
    assert calls == [(3,)]


def test_an_unwritable_cache_still_gives_the_measurement(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("PIPEPROF_CACHE_DIR", str(blocked))
    got = machine.core_scaling(2)
    assert got is not None and got["cached"] is False and 0 < got["per_process"] <= 1.0


def test_one_core_needs_no_probe(cache):
    assert machine.core_scaling(1)["effective_cores"] == 1.0
    assert not cache.exists() or machine._key(1) in json.loads(cache.read_text())


def profile_one_busy_worker():
    """One worker, 4 ms of busy CPU a sample: the pipeline's rate is one core's."""
    ds = CostDataset(96, transform=transforms.Compose([Scale(4.0)]))
    return pipeprof.profile(DataLoader(ds, batch_size=4, num_workers=1), batches=24)


def one_busy_worker(per: float, main_cpu_s: float = 0.0) -> dict:
    """The report of one worker busy on CPU (4 ms a sample, its CPU time its busy time) for 1 s,
    beside a training process that used ``main_cpu_s``, on 2 cores that, both busy, each did
    ``per`` of a lone one's work."""
    worker = {"track": "worker0", "pid": 1, "busy_s": 0.96, "cpu_s": 0.96, "batches": 60}
    return {"wall_s": 1.0, "samples": 240, "batches": 60, "workers": [worker],
            "meta": {"num_workers": 1, "main_cpu_ns": int(main_cpu_s * 1e9),
                     "core_scaling": {"per_process": per}},
            "stages": {"load": {"total_s": 0.96, "per_sample_ms": 4.0}}, "wait": {}}  # fmt: skip


def test_whatifs_count_slow_cores_as_the_probe_found_them():
    """A CPU-bound pipeline measured with one worker: two workers on 2 whole cores give twice
    its rate; on cores that each do 69 % of a lone one's work when both are busy (the Python
    work two vCPUs did in issue 36), 1.38 times."""
    whole, slow = one_busy_worker(1.0), one_busy_worker(0.69)
    assert scaled_cores(whole, 2) == (2.0, 1.0)
    assert scaled_cores(slow, 2) == (pytest.approx(1.38), 1.0)  # one busy process: lone speed
    m_whole, m_slow = from_report(whole, 2), from_report(slow, 2)
    assert m_whole is not None and m_slow is not None
    one = throughput(m_whole, 1)
    assert throughput(m_slow, 1) == pytest.approx(one)  # alone, a core is a whole core
    assert throughput(m_whole, 2) / one == pytest.approx(2.0, rel=0.02)
    assert throughput(m_slow, 2) / one == pytest.approx(1.38, rel=0.02)
    # a stage measured with both cores busy ran slower than alone: its cost is taken back
    busy = one_busy_worker(0.69, main_cpu_s=1.04)  # with the worker, 2 cores busy
    assert scaled_cores(busy, 2)[1] == pytest.approx(0.69)
    (stage,) = from_report(busy, 2).stages
    assert stage.cpu_ms == pytest.approx(4.0 * 0.69)


def test_the_report_says_what_scaling_its_what_ifs_assumed(cache):
    slow_cores(cache, 0.69)
    report = profile_one_busy_worker()
    data = report.to_dict()
    assert data["meta"]["core_scaling"]["per_process"] == 0.69
    rows = [r for r in data["what_if"] if r["kind"] == "workers"]
    assert "the 2 cores counted as 1.38" in rows[0]["basis"]
    assert "each does 69% of a lone core's work" in report.render("text")
    slow_cores(cache, 1.0)
    whole = profile_one_busy_worker()
    assert "counted as" not in whole.to_dict()["what_if"][0]["basis"]
    assert "lone core" not in whole.render("text")


def test_bench_predictions_count_slow_cores(cache):
    ds = CostDataset(64, transform=transforms.Compose([Scale(3.0)]))
    slow_cores(cache, 1.0)
    whole = pipeprof.bench(ds, samples=8, repeat=1, warmup=1, batch_size=4)
    slow_cores(cache, 0.6)
    slow = pipeprof.bench(ds, samples=8, repeat=1, warmup=1, batch_size=4)
    assert slow.config["core_scaling"]["per_process"] == 0.6
    assert any("count the cores as 1.2" in n for n in slow.notes)
    assert not any("count the cores as" in n for n in whole.notes)
    # a CPU-bound step at 2 workers: bound by the cores, so by how much work they do (a little
    # over 0.6: the main process's share of 2 whole cores already slowed the workers there)
    whole_2 = throughput(replace(slow.base, cores=2.0), 2)  # the same timings on whole cores
    ratio = float(slow.predict(workers=2, background=0)) / whole_2
    assert 0.55 < ratio < 0.72
    assert slow.base.cores == pytest.approx(1.2)


class SlowerInAWorker:
    """A step that costs 0.2 ms where it is timed alone and 8 ms (a sleep) in a worker: a
    stand-alone model that reads 40× too fast, by construction. The sleep keeps the runs far
    from the 2 cores, so the load others put on them (the hypervisor's steal) moves them little."""

    def __call__(self, x):
        time.sleep(0.0002 if get_worker_info() is None else 0.008)
        return x


@pytest.mark.serial  # re-predicts its runs for cores no other program shares
def test_worker_predictions_are_anchored_to_the_runs_measured():
    """NOTE [ Anchored predictions ] (bench/bench.py)."""
    ds = CostDataset(64, transform=SlowerInAWorker())
    b = pipeprof.bench(ds, samples=16, repeat=1, warmup=1, batch_size=4, workers=[1, 2],
                       seconds=0.6, probe=False)  # fmt: skip
    two = next(r for r in b.scaling if r["workers"] == 2)
    then = lambda k, run: whatif.background_for(b.base, k, run["others_cores"] or 0.0)
    at_2 = b.predict(workers=2)
    assert at_2.details["anchor"]["workers"] == 2
    # its own run, re-predicted under the load other programs put on the cores then, and to none
    ran_2 = b.predict(workers=2, background=then(2, two))
    assert float(ran_2) == pytest.approx(two["samples_per_s"], rel=0.02)
    assert float(at_2) >= 0.99 * float(ran_2)
    factor = b.predict(workers=1).details["anchor"]["factor"]
    assert factor > 10  # far longer in the workers than alone, and still within reach
    # 4 workers: anchored to the 2-worker run, and a real run agrees (the model alone said 40×)
    at_4 = b.predict(workers=4)
    assert at_4.details["anchor"]["workers"] == 2 and "anchored to the run with 2" in str(at_4)
    real_4 = run_loader(Cycled(ds), list(range(16)), 4, 4, default_collate, 0.6, float(at_4))
    ran_4 = b.predict(workers=4, background=then(4, real_4))
    assert float(ran_4) == pytest.approx(real_4["samples_per_s"], rel=0.2)
    assert b.predict(workers=0).details["anchor"] is None  # no workers: nothing to anchor to
    fed = b.predict(workers=2, compute_rate=10 * float(at_2))
    assert fed.details["loader_samples_per_s"] == pytest.approx(float(at_2), rel=0.001)
