"""Reports logged to TensorBoard, MLflow and W&B (pipeprof/integrations/export.py), each read
back with the tool's own reader: TensorBoard's EventAccumulator, MLflow's client, and W&B's
offline run file parsed into W&B's own ``Record`` protobufs. Real libraries, real profiles."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from machine import require
from pipelines import CostDataset, Scale
from torch.utils.data import DataLoader
from torchvision import transforms

import pipeprof
from pipeprof.integrations.export import metrics, params, step_rows

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(Path(__file__).resolve().parent / "scripts" / "train.py")


@pytest.fixture(scope="module")
def report() -> pipeprof.Report:
    """A loop of 256 steps that waits for a sleeping dataset and computes a little (> 1000
    metrics with the per-step ones: MLflow takes them in two calls)."""
    ds = CostDataset(512, load_ms=0.5, transform=transforms.Compose([Scale(0.1)]))
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(DataLoader(ds, batch_size=2)):
            time.sleep(0.0005)
    return prof.report()


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_CONSOLE": "off", "WANDB_DISABLE_CODE": "true",
                       "WANDB_DISABLE_GIT": "true"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    return tmp_path


def wait_curve(data: dict) -> list[tuple[int, float]]:
    """The per-step wait fraction, from the report's own timeline."""
    out = []
    for i, (_, wait, transfer, compute) in enumerate(data["timeline"]["steps"]):
        out.append((i, wait / (wait + transfer + compute)))
    return out


def test_the_metric_set_is_the_reports_figures(report):
    data = report.to_dict()
    m = metrics(data)
    assert m["pipeprof/wait_fraction"] == data["loop"]["wait_fraction"] > 0.3
    assert m["pipeprof/samples_per_s"] == data["throughput"]["samples_per_s"]
    assert m["pipeprof/startup_s"] == data["startup_s"]
    staged = {k.split("/", 2)[2].rsplit("/", 1)[0] for k in m if k.startswith("pipeprof/stage/")}
    assert staged == set(data["stages"]) >= {"load", "transform/Scale", "collate"}
    assert m["pipeprof/stage/load/ms_per_sample"] == data["stages"]["load"]["per_sample_ms"]
    assert "pipeprof/gpu_util" not in m  # not sampled: left out, never 0
    rows = step_rows(data)
    assert len(rows) == data["loop"]["steps"] == 256
    assert [(s, r["pipeprof/step/wait_fraction"]) for s, r in rows] == wait_curve(data)
    waited = sum(r["pipeprof/step/wait_ms"] for _, r in rows) / 1e3
    assert waited == pytest.approx(data["loop"]["wait_s"], rel=1e-3)
    p = params(data)
    assert p["pipeprof/verdict"] == data["verdict"]["kind"]
    assert p["pipeprof/verdict_stage"] == data["verdict"]["stage"]
    assert p["pipeprof/num_workers"] == "0" and p["pipeprof/batch_size"] == "2"


def test_step_numbers_of_a_loop_longer_than_the_kept_steps():
    """10,050 steps: the report keeps the latest 10,000 and charts every 5th of them."""
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(DataLoader(list(range(10_050)), batch_size=1)):
            pass
    data = prof.report().to_dict()
    ring = list(prof.session.loop.step_ring)
    rows = step_rows(data)
    first, stride = data["timeline"]["first_step"], data["timeline"]["stride"]
    assert (first, stride) == (10_050 - len(ring), len(ring) // 2000) == (50, 5)
    assert [s for s, _ in rows] == list(range(50, 10_050, 5))
    for step, row in rows[::97]:
        raw = ring[step - first]  # [t_ns, wait_ns, transfer_ns, compute_ns, first]
        assert row["pipeprof/step/wait_ms"] == pytest.approx(raw[1] / 1e6, abs=1e-4)


def test_tensorboard_read_back_by_tensorboard(report, tmp_path):
    require("tensorboard", extra="tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = report.to_dict()
    where = report.log_to("tensorboard", log_dir=tmp_path / "tb")
    assert where == str(tmp_path / "tb")
    acc = EventAccumulator(where, size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(metrics(data)) | {
        f"pipeprof/step/{k}" for k in ("wait_fraction", "wait_ms", "transfer_ms", "compute_ms")
    }
    for name, value in metrics(data).items():
        (point,) = acc.Scalars(name)
        assert point.value == pytest.approx(value, rel=1e-6), name
    curve = [(e.step, e.value) for e in acc.Scalars("pipeprof/step/wait_fraction")]
    assert [s for s, _ in curve] == [s for s, _ in wait_curve(data)]
    assert [v for _, v in curve] == pytest.approx([v for _, v in wait_curve(data)], rel=1e-6)
    (text,) = acc.Tensors("pipeprof/summary")
    summary = text.tensor_proto.string_val[0].decode()
    assert data["verdict"]["headline"][:40] in summary.replace("│", " ").replace("\n", " ")
    assert f"pipeprof/verdict: {data['verdict']['kind']}" in summary
    report.log_to("tensorboard", log_dir=where)  # a second report: its own file, none lost
    assert len(list(Path(where).glob("events.out.tfevents.*"))) == 2


def test_mlflow_read_back_by_mlflows_client(report, tmp_path, monkeypatch):
    require("mlflow", extra="mlflow")
    import mlflow
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # no sqlalchemy: the file store
    uri = (tmp_path / "mlruns").as_uri()
    data = report.to_dict()
    run_id = report.log_to("mlflow", tracking_uri=uri)
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "pipeprof"
    wanted = metrics(data)
    assert run.data.metrics["pipeprof/wait_fraction"] == data["loop"]["wait_fraction"]
    assert {k: run.data.metrics[k] for k in wanted} == wanted
    history = client.get_metric_history(run_id, "pipeprof/step/wait_fraction")
    assert sorted((m.step, m.value) for m in history) == wait_curve(data)
    for name in ("wait_ms", "transfer_ms", "compute_ms"):
        history = client.get_metric_history(run_id, f"pipeprof/step/{name}")
        truth = [(s, r[f"pipeprof/step/{name}"]) for s, r in step_rows(data)]
        assert sorted((m.step, m.value) for m in history) == truth, name
    assert run.data.params == params(data)
    names = {a.path for a in client.list_artifacts(run_id, "pipeprof")}
    assert names == {"pipeprof/report.html", "pipeprof/summary.txt"}
    page = Path(client.download_artifacts(run_id, "pipeprof/report.html", str(tmp_path)))
    assert page.read_text() == report.render("html")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the user's own run gets the report
    with mlflow.start_run() as mine:
        assert report.log_to("mlflow") == mine.info.run_id
        assert client.get_run(mine.info.run_id).info.status == "RUNNING"  # not ended by pipeprof
    assert client.get_run(mine.info.run_id).data.params == params(data)


def wandb_records(run_dir: Path, wait_s: float = 60.0) -> list:
    """W&B's offline ``run-ID.wandb`` file: a LevelDB-style log (32 KiB blocks, 7-byte record
    headers: crc, length, type) after a 7-byte ``:W&B`` header, holding ``Record`` protobufs.
    W&B's own service process writes it, and may still be writing after ``finish()`` returns:
    the file is read again until its ``exit`` record is in (a record cut off at the end is the
    writer's, not yet complete)."""
    deadline = time.monotonic() + wait_s
    while True:
        records = _wandb_file(run_dir)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"no exit record in {run_dir} after {wait_s} s")
        time.sleep(0.2)


def _wandb_file(run_dir: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    raw = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert raw[:4] == b":W&B"
    records, pos, chunk = [], 7, b""
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header: padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if pos + 7 + length > len(raw):  # still being written
            break
        chunk += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def wandb_run(root: Path, run_id: str) -> dict:
    """Config, final summary and history rows of an offline run, from its records."""
    (run_dir,) = (root / "wandb").glob(f"offline-run-*-{run_id}")
    out: dict = {"config": {}, "summary": {}, "history": [], "dir": run_dir}

    def key(item):
        return item.key or "/".join(item.nested_key)

    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            out["config"].update({key(i): json.loads(i.value_json) for i in record.config.update})
        elif kind == "summary":
            out["summary"].update({key(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "history":
            out["history"].append({key(i): json.loads(i.value_json) for i in record.history.item})
    return out


def test_wandb_offline_read_back_from_the_run_file(report, offline_wandb):
    require("wandb", extra="wandb")
    import wandb

    data = report.to_dict()
    run_id = report.log_to("wandb")
    assert wandb.run is None  # its own run, finished
    run = wandb_run(offline_wandb, run_id)
    assert {k: run["config"][k] for k in params(data)} == params(data)
    assert {k: run["summary"][k] for k in metrics(data)} == metrics(data)
    assert run["summary"]["pipeprof/headline"] == data["verdict"]["headline"]
    curve = [(r["pipeprof/step"], r["pipeprof/step/wait_fraction"])
             for r in run["history"] if "pipeprof/step" in r]  # fmt: skip
    assert curve == wait_curve(data)
    (page,) = (run["dir"] / "files" / "media" / "html" / "pipeprof").glob("report_*.html")
    assert data["verdict"]["headline"] in page.read_text()

    mine = wandb.init(project="mine")  # the user's own run gets the report, and stays open
    try:
        assert report.log_to("wandb") == mine.id and wandb.run is mine
    finally:
        mine.finish()
    config = wandb_run(offline_wandb, mine.id)["config"]
    assert config["pipeprof/verdict"] == data["verdict"]["kind"]


@pytest.mark.parametrize("target", ["tensorboard", "mlflow", "wandb"])
def test_a_missing_tool_names_its_extra(report, tmp_path, monkeypatch, target):
    monkeypatch.setitem(sys.modules, target, None)  # as if not installed (module = extra here)
    options = {"log_dir": tmp_path} if target == "tensorboard" else {}
    wanted = rf"needs the {target} package: pip install 'pipeprof\[{target}\]'"
    with pytest.raises(ImportError, match=wanted):
        report.log_to(target, **options)


def test_unknown_tool(report):
    with pytest.raises(ValueError, match="choose one of tensorboard, mlflow, wandb"):
        report.log_to("neptune")


def test_importing_and_tensorboard_logging_import_no_framework(report, tmp_path):
    """``import pipeprof`` imports none of the tools; TensorBoard logging needs neither
    TensorFlow nor torch (tensorboard's own writer would import TensorFlow where installed)."""
    require("tensorboard", extra="tensorboard")
    saved, log_dir = str(report.save(tmp_path / "r.json")), str(tmp_path / "tb")
    code = (
        "import sys, pipeprof\n"
        "before = {m for m in ('tensorboard', 'mlflow', 'wandb') if m in sys.modules}\n"
        f"pipeprof.load({saved!r}).log_to('tensorboard', log_dir={log_dir!r})\n"
        "print(sorted(before), 'tensorflow' in sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(), timeout=120)  # fmt: skip
    assert out.stdout.split("\n")[0] == "[] False False", out.stderr


def _env(**extra: str) -> dict[str, str]:
    import os

    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100", **extra)
    return env


@pytest.mark.slow
def test_pipeprof_run_logs_the_main_loop(tmp_path, monkeypatch):
    """``pipeprof run --log-to`` each tool; a tool that fails leaves the script's exit status."""
    require("tensorboard", "mlflow", "wandb", extra="tensorboard,mlflow,wandb")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    env = _env(MLFLOW_ALLOW_FILE_STORE="true", WANDB_MODE="offline", WANDB_DIR=str(tmp_path),
               WANDB_SILENT="true", WANDB_CONSOLE="off", WANDB_DISABLE_GIT="true")  # fmt: skip
    cmd = [sys.executable, "-m", "pipeprof", "run", "-o", str(tmp_path / "run.json"),
           "--log-to", f"tensorboard:{tmp_path / 'tb'}", "--log-to", f"mlflow:{uri}",
           "--log-to", "wandb", TRAIN, "--samples", "64"]  # fmt: skip
    ran = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert ran.returncode == 0, ran.stderr
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["loop"]["steps"] == 4
    assert f"logged to tensorboard: {tmp_path / 'tb'}" in ran.stderr

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    (point,) = acc.Scalars("pipeprof/wait_fraction")
    assert point.value == pytest.approx(data["loop"]["wait_fraction"], rel=1e-6)
    assert len(acc.Scalars("pipeprof/step/wait_fraction")) == 4

    client = MlflowClient(uri)
    (run,) = client.search_runs(["0"])
    assert run.data.metrics["pipeprof/wait_fraction"] == data["loop"]["wait_fraction"]
    assert run.data.params["pipeprof/loader"] == "train_loader"
    assert f"logged to mlflow: {run.info.run_id}" in ran.stderr

    run_id = ran.stderr.split("logged to wandb: ")[1].split()[0]
    wb = wandb_run(tmp_path, run_id)
    assert wb["summary"]["pipeprof/wait_fraction"] == data["loop"]["wait_fraction"]

    # a tool that cannot log says so; the script's own exit status stands
    blocker = tmp_path / "blocker"
    (blocker / "mlflow").mkdir(parents=True)
    (blocker / "mlflow" / "__init__.py").write_text("raise ImportError('blocked')\n")
    env["PYTHONPATH"] = f"{blocker}:{env['PYTHONPATH']}"
    cmd = [sys.executable, "-m", "pipeprof", "run", "-q", "-o", str(tmp_path / "run2.json"),
           "--log-to", f"mlflow:{uri}", TRAIN, "--samples", "32", "--exit", "4"]  # fmt: skip
    ran = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=240)
    assert ran.returncode == 4
    assert "could not be logged to mlflow" in ran.stderr
    assert "pip install 'pipeprof[mlflow]'" in ran.stderr
    assert (tmp_path / "run2.json").exists()


def test_pipeprof_run_refuses_an_unknown_tool_before_the_script(tmp_path):
    cmd = [sys.executable, "-m", "pipeprof", "run", "--log-to", "neptune", TRAIN]
    ran = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=_env(),
                         timeout=60)  # fmt: skip
    assert ran.returncode == 2 and "tensorboard[:LOG_DIR]" in ran.stderr
    assert "argv" not in ran.stdout  # the script did not run
