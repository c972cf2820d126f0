"""Report contract, save/load round trip and renderers, on a real (small) profile."""

import json
from typing import Any

import pytest
from pipelines import CostDataset, Scale
from torch.utils.data import DataLoader
from torchvision import transforms

import pipeprof


@pytest.fixture(scope="module")
def report():
    ds = CostDataset(32, load_ms=0.0, transform=transforms.Compose([Scale(3.0)]))
    return pipeprof.profile(DataLoader(ds, batch_size=4, num_workers=2))


def test_contract_keys_and_units(report):
    from pipeprof.analyze.analysis import RunReport

    d = report.to_dict()
    # no h5py reads, HTTP requests nor tokens here: the keys every report has, and no other
    assert d.keys() == RunReport.__required_keys__
    assert d["schema"] == "pipeprof/1" and d["mode"] == "loader" and d["framework"] == "torch"
    assert d["batches"] == 8 and d["samples"] == 32
    for row in d["stages"].values():
        assert {"total_s", "count", "mean_ms", "p50_ms", "p95_ms", "p99_ms"} <= row.keys()
    assert d["throughput"]["samples_per_s"] == pytest.approx(32 / d["wall_s"], rel=1e-3)
    assert d["verdict"]["stage"] == "transform/Scale"  # 3 ms of work vs a tiny load
    assert {"id", "pid", "busy_s", "batches"} <= d["workers"][0].keys()
    # a region per load, per transform and per collate: 32 + 32 + 8, nothing else
    assert d["overhead"]["per_event_ns"] > 0 and d["overhead"]["events"] == 32 * 2 + 8
    json.dumps(d)  # plain data


def test_save_and_load_round_trip(report, tmp_path):
    path = report.save(tmp_path / "run.json")
    again = pipeprof.load(path)
    assert again.to_dict() == report.to_dict()
    on_disk = json.loads(path.read_text())
    assert on_disk["schema"] == "pipeprof/1" and "session" in on_disk


def test_load_errors_say_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such pipeprof file"):
        pipeprof.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    with pytest.raises(ValueError, match="holds no pipeprof session"):
        pipeprof.load(bad)
    plain = tmp_path / "plain.json"
    plain.write_text('{"schema": "pipeprof/1", "stages": {}}')  # `--format json`: no session
    with pytest.raises(ValueError, match=r"plain JSON, without the raw session.*report.save"):
        pipeprof.load(plain)
    future = tmp_path / "future.json"
    future.write_text('{"session": {"schema_version": 99}}')
    with pytest.raises(ValueError, match="upgrade pipeprof"):
        pipeprof.load(future)


def test_older_session_files_load_with_defaults(tmp_path):
    old = tmp_path / "old.json"
    old.write_text(
        json.dumps(
            {
                "session": {
                    "schema_version": 1,
                    "batches": 2,
                    "samples": 8,
                    "start_ns": 0,
                    "end_ns": 10**9,
                }
            }
        )
    )
    d = pipeprof.load(old).to_dict()
    assert d["samples"] == 8 and d["stages"] == {} and d["throughput"]["samples_per_s"] == 8.0


def test_text_summary_fits_80_columns_and_names_stages(report):
    text = report.render("text")
    assert max(len(line) for line in text.splitlines()) <= 80
    for word in ("load", "transform", "Scale", "collate", "worker0", "worker1", "own work"):
        assert word in text
    assert "\x1b[" not in text  # plain when not a terminal


def test_html_is_self_contained(report):
    html = report.render("html")
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html
    assert "http://" not in html and "https://" not in html and "<script src" not in html
    assert 'data-stage="transform/Scale"' in html
    assert report._repr_html_().startswith("<style>")
    bundle = report._repr_mimebundle_()
    assert {"text/html", "text/plain"} <= bundle.keys()


def test_the_summary_names_the_worker_count_as_people_say_it():
    alone = pipeprof.profile(DataLoader(CostDataset(8), batch_size=4))
    one = pipeprof.profile(DataLoader(CostDataset(8), batch_size=4, num_workers=1))
    assert "no workers (loading in the main process)" in str(alone)
    assert "1 worker (" in str(one) and "1 workers" not in str(one)
    assert "no workers" in alone._repr_html_() and "1 worker (" in one._repr_html_()


def _schema_keys(row: str) -> tuple[set[str], set[str]]:
    """The keys docs/schema.md lists in the first ``{...}`` of the table row for ``row``:
    (always there, marked ``?``)."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "schema.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{row}` |"))
    cell = line.split("`")[3]  # the row's first code span: the shape
    listed = cell.rsplit("{", 1)[1].split("}", 1)[0]  # the innermost braces (``{path: {...}}``)
    keys = [k.strip() for k in listed.split(",")]
    return {k for k in keys if not k.endswith("?")}, {k[:-1] for k in keys if k.endswith("?")}


def _schema_rows() -> set[str]:
    """The keys named in the first column of docs/schema.md's first table (the run report)."""
    from pathlib import Path

    lines = (Path(__file__).parent.parent / "docs" / "schema.md").read_text().splitlines()
    start = lines.index("| key | meaning |") + 2
    rows = lines[start : lines.index("", start)]
    return {key for row in rows for key in row.split("|")[1].split("`")[1::2]}


def test_the_schema_lists_every_key_of_the_typed_report():
    """The run report's keys in docs/schema.md against ``RunReport`` (analyze/analysis.py), and
    the ``wait``, ``throughput`` and ``steady`` rows against their types; a recorded loop's
    report (tests/golden) has each key ``RunReport`` says it always has."""
    from golden_reports import GOLDEN, LOOP

    from pipeprof.analyze.analysis import Measured, RunReport, WaitSection
    from pipeprof.analyze.stages import Rates, SteadyRates

    assert _schema_rows() == RunReport.__annotations__.keys()
    assert RunReport.__optional_keys__ == {"hdf5", "fetch", "tokens"} == Measured.__optional_keys__
    assert _schema_shape("wait").keys() == WaitSection.__annotations__.keys()
    assert _schema_shape("throughput").keys() == Rates.__annotations__.keys()
    assert _schema_shape("steady").keys() == SteadyRates.__annotations__.keys()
    d = pipeprof.load(GOLDEN / LOOP).to_dict()
    assert RunReport.__required_keys__ <= d.keys() <= RunReport.__annotations__.keys()
    assert d["wait"].keys() == WaitSection.__annotations__.keys()
    assert d["steady"].keys() == SteadyRates.__annotations__.keys()


def test_the_schema_lists_the_typed_verdict_and_finding():
    """docs/schema.md is checked against the report's types (analyze/finding.py): a key added
    to ``Verdict`` or ``Finding`` and not documented, or documented and gone, fails here."""
    from pipeprof.analyze.finding import Finding, Verdict

    always, optional = _schema_keys("verdict")
    assert always == set(Verdict.__required_keys__)
    assert optional == set(Verdict.__optional_keys__)
    always, optional = _schema_keys("findings")
    assert always == set(Finding.__required_keys__) and not optional


def _schema_shape(row: str) -> dict[str, Any]:
    """The shape docs/schema.md gives in the first code span of the row for ``row``: each
    top-level key (``?`` dropped) to the keys of its own ``{...}``, or None; a ``...`` entry and
    a ``name:`` map's level are left out (``regions: {name: {...}}`` is ``{name: ...}``)."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "schema.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{row}` |"))
    cell = line.split("`")[3]

    def parse(body: str) -> dict[str, Any]:
        parts, depth, start = [], 0, 0
        for i, ch in enumerate(body):
            depth += ch == "{"
            depth -= ch == "}"
            if ch == "," and depth == 0:
                parts.append(body[start:i])
                start = i + 1
        parts.append(body[start:])
        out: dict[str, Any] = {}
        for part in (p.strip() for p in parts):
            if not part or part.startswith("..."):
                continue
            key, _, rest = part.partition(":")
            rest = rest.strip()
            out[key.strip().rstrip("?")] = parse(rest[1:-1]) if rest.startswith("{") else None
        return out

    return parse(cell[cell.index("{") + 1 : cell.rindex("}")])


def test_the_schema_lists_the_typed_loop_and_overhead():
    """The ``loop`` and ``overhead`` rows of docs/schema.md against ``LoopSection``
    (analyze/loop.py) and ``Overhead`` (analyze/stages.py), and what a recorded training loop
    (tests/golden) writes against both."""
    from golden_reports import GOLDEN, LOOP

    from pipeprof.analyze.loop import LoopSection, Spread, Steady, Throughput
    from pipeprof.analyze.stages import Overhead
    from pipeprof.core.stats import Figures

    shape = _schema_shape("loop")
    assert shape.keys() == LoopSection.__annotations__.keys()
    assert shape["steady"].keys() == {"steps"}  # "...the same": Split's keys
    assert shape["throughput"].keys() == Throughput.__annotations__.keys()
    assert shape["spread"].keys() == Spread.__annotations__.keys()
    assert shape["regions"]["name"].keys() == Figures.__annotations__.keys() | {"timed_steps"}
    assert _schema_shape("overhead").keys() == Overhead.__annotations__.keys()
    d = pipeprof.load(GOLDEN / LOOP).to_dict()
    assert d["loop"].keys() == LoopSection.__annotations__.keys()
    assert d["loop"]["steady"].keys() == Steady.__annotations__.keys()
    assert d["loop"]["spread"].keys() == Spread.__annotations__.keys()
    assert d["loop"]["throughput"].keys() == Throughput.__annotations__.keys()
    assert d["loop"]["regions"] and all(
        r.keys() <= Figures.__annotations__.keys() | {"timed_steps"}
        for r in d["loop"]["regions"].values()
    )
    assert d["overhead"].keys() == Overhead.__annotations__.keys()


def test_the_schema_lists_the_typed_job_report():
    """The job report's rows of docs/schema.md against ``Job`` and its parts (analyze/job.py),
    and a job made of two ranks of a recorded loop (tests/golden) against both."""
    from golden_reports import GOLDEN, LOOP

    from pipeprof.analyze import job as job_types
    from pipeprof.analyze.job import job_dict

    rows = {"job": "Job", "job.ranks": "RankRow", "job.efficiency": "Efficiency",
            "job.stragglers": "Straggler", "job.what_if": "KeptUp", "job.same_samples": "SamePair",
            "job.ran_out": "RanOut", "job.stopped_first": "StoppedFirst"}  # fmt: skip
    for row, name in rows.items():
        assert _schema_shape(row).keys() == getattr(job_types, name).__annotations__.keys(), row
    ranks = []
    for rank, wait in ((0, 1.0), (1, 3.0)):  # rank 1 waits for data: a straggler
        d = pipeprof.load(GOLDEN / LOOP).to_dict()
        d["meta"]["rank"] = {"rank": rank, "world_size": 2, "local_rank": rank, "host": "h"}
        d["loop"]["wait_fraction"] = d["loop"]["wait_fraction"] * wait
        d["meta"]["hang"] = {"workers": [], "main": {"at": "f (x.py:1)"}, "waited_s": 9.0,
                             "last_batch_unix": 1.0 + rank} if rank else None  # fmt: skip
        ranks.append((f"run.rank{rank}.json", d))
    job = job_dict(ranks)
    assert job.keys() == job_types.Job.__annotations__.keys()
    assert job["ranks"][0].keys() == job_types.RankRow.__annotations__.keys()
    assert job["stragglers"][0].keys() == job_types.Straggler.__annotations__.keys()
    assert job["what_if"].keys() == job_types.KeptUp.__annotations__.keys()
    assert job["stopped_first"] is not None
    assert job["stopped_first"].keys() == job_types.StoppedFirst.__annotations__.keys()
    name, d = ranks[0]
    stepless = [(name, {**d, "loop": {**d["loop"], "steps": 0}})]  # no rate to tell
    assert job_dict(stepless)["what_if"].keys() == job_types.KeptUp.__annotations__.keys()


def test_the_schema_lists_the_typed_stage_and_worker_rows(report):
    """The ``stages`` and ``workers`` rows of docs/schema.md against ``StageRow`` and
    ``WorkerRow`` (analyze/stages.py), and the rows a real profile writes against both."""
    from pipeprof.analyze.stages import StageRow, WorkerRow

    always, optional = _schema_keys("stages")
    assert always == set(StageRow.__required_keys__)
    assert optional == set(StageRow.__optional_keys__)
    always, optional = _schema_keys("workers")
    assert always == set(WorkerRow.__required_keys__) and not optional
    d = report.to_dict()
    for row in d["stages"].values():
        assert set(StageRow.__required_keys__) <= row.keys() <= set(StageRow.__annotations__)
    for row in d["workers"]:
        assert row.keys() == set(WorkerRow.__annotations__)


def test_the_verdicts_made_hold_only_typed_keys(report):
    """Every verdict a profile makes has the typed keys only (mypy checks the builders; this
    checks what reaches the report, through the loader's verdict here)."""
    from pipeprof.analyze.finding import Finding, Verdict

    verdict = report.to_dict()["verdict"]
    assert set(Verdict.__required_keys__) <= verdict.keys() <= set(Verdict.__annotations__)
    for f in report.to_dict()["findings"]:
        assert f.keys() == set(Finding.__annotations__)
