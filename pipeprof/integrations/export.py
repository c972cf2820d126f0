"""A Report logged to TensorBoard, MLflow or Weights & Biases (``Report.log_to``).

NOTE [ Exported metrics ]
Every tool gets the same names, computed once here from the report's dict (docs/schema.md); the
table of docs/integrations.md lists them:

- one number each (``metrics``): ``pipeprof/wait_fraction``, ``pipeprof/samples_per_s``, ...,
  ``pipeprof/stage/<path>/ms_per_sample`` per pipeline stage; a figure the report holds as n/a
  is left out, never logged as 0;
- per step (``step_rows``), where the tool draws curves: ``pipeprof/step/wait_fraction`` (the
  step's wait over its wait + transfer + compute), ``pipeprof/step/wait_ms``,
  ``pipeprof/step/transfer_ms`` and ``pipeprof/step/compute_ms``, at the loop's step numbers
  (0-based; the report keeps up to 2000 rows of the latest 10,000 steps, evenly spaced);
- params (``params``): the verdict, the limiting stage, the loader's configuration;
- the report itself: its text summary, and the HTML page where the tool stores files.

The tools are imported when a report is logged, never by ``import pipeprof``; a missing one
raises ``MissingExtra`` naming the extra to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import math
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pipeprof.version import __version__

PREFIX = "pipeprof/"

# tool -> (module imported, the tool's name, the pipeprof extra that installs it)
TOOLS = {
    "tensorboard": ("tensorboard", "TensorBoard", "tensorboard"),
    "mlflow": ("mlflow", "MLflow", "mlflow"),
    "wandb": ("wandb", "W&B", "wandb"),
}

# metric name (after PREFIX) -> where the figure is in the report's dict
_FIGURES: dict[str, tuple[str, ...]] = {
    "wait_fraction": ("loop", "wait_fraction"),
    "transfer_fraction": ("loop", "transfer_fraction"),
    "compute_fraction": ("loop", "compute_fraction"),
    "overhead_fraction": ("loop", "overhead_fraction"),
    "comm_fraction": ("loop", "comm_fraction"),
    "starved_fraction": ("loop", "starved_fraction"),
    "handover_fraction": ("loop", "handover_fraction"),
    "step_ms": ("loop", "step_ms", "mean_ms"),
    "speedup_if_data_free": ("loop", "throughput", "speedup_if_data_free"),
    "samples_per_s": ("throughput", "samples_per_s"),
    "batches_per_s": ("throughput", "batches_per_s"),
    "steady_samples_per_s": ("steady", "samples_per_s"),
    "startup_s": ("startup_s",),
    "wait_ms_per_batch": ("latency", "mean_ms"),
    "batches": ("batches",),
    "samples": ("samples",),
    "wall_s": ("wall_s",),
    "gpu_idle_while_waiting_fraction": ("gpu", "idle_while_waiting_fraction"),
    "cpu_util": ("host", "cpu_util_mean"),
    "profiler_overhead_fraction": ("overhead", "estimated_fraction"),
}
_FILES = itertools.count()  # event files this process wrote: each its own name
STEP_COLUMNS = ("wait_ms", "transfer_ms", "compute_ms")  # after t_s in timeline.steps rows


class MissingExtra(ImportError):
    """The tool a report is to be logged to is not installed; the message says what to run."""


class Exportable(Protocol):
    """What logging reads of a report: its dict and its renderings (``Report`` is one)."""

    def to_dict(self) -> dict[str, Any]: ...

    def render(self, fmt: str = "text", **options: Any) -> str: ...


# ---- the metric set ---------------------------------------------------------------------------


def metrics(data: dict[str, Any]) -> dict[str, float]:
    """One number per name (NOTE [ Exported metrics ]); n/a figures are left out."""
    out: dict[str, float] = {}
    for name, path in _FIGURES.items():
        _put(out, name, _dig(data, path))
    devices = (data.get("gpu") or {}).get("devices") or []
    utils = [d["util_mean"] for d in devices if _number(d.get("util_mean")) is not None]
    if utils:
        out[PREFIX + "gpu_util"] = sum(utils) / len(utils)
    for path, stage in (data.get("stages") or {}).items():
        _put(out, f"stage/{_key(path)}/ms_per_sample", stage.get("per_sample_ms"))
    return out


def step_rows(data: dict[str, Any]) -> list[tuple[int, dict[str, float]]]:
    """``(step, {name: value})`` per row of the report's step timeline, for curves."""
    timeline = data.get("timeline") or {}
    first, stride = timeline.get("first_step", 0), timeline.get("stride", 1)
    rows = []
    for i, row in enumerate(timeline.get("steps") or []):
        values = dict(zip(STEP_COLUMNS, row[1:]))
        busy = sum(values.values())
        out = {f"{PREFIX}step/{k}": float(v) for k, v in values.items()}
        if busy > 0:
            out[PREFIX + "step/wait_fraction"] = values["wait_ms"] / busy
        rows.append((first + i * stride, out))
    return rows


def params(data: dict[str, Any]) -> dict[str, str]:
    """What the run was and what pipeprof concluded, as strings; n/a is left out."""
    verdict, meta = data.get("verdict") or {}, data.get("meta") or {}
    found = {
        "verdict": verdict.get("kind"),
        "verdict_stage": verdict.get("stage"),
        "severity": verdict.get("severity"),
        "mode": data.get("mode"),
        "framework": data.get("framework"),
        "loader": (meta.get("run_loader") or {}).get("label"),
        "num_workers": meta.get("num_workers"),
        "batch_size": meta.get("batch_size"),
        "version": __version__,
    }
    return {PREFIX + k: str(v) for k, v in found.items() if v is not None}


def headline(data: dict[str, Any]) -> str:
    return str((data.get("verdict") or {}).get("headline") or "")


def _dig(data: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def _put(out: dict[str, float], name: str, value: Any) -> None:
    number = _number(value)
    if number is not None:
        out[PREFIX + name] = number


def _key(path: str) -> str:
    """A stage path as a metric name every tool takes (MLflow allows ``[\\w./ -]``)."""
    return re.sub(r"[^A-Za-z0-9_./ -]", "_", path)


def check(tool: str) -> None:
    """Raise ``MissingExtra`` now if ``tool`` is not installed (nothing is imported)."""
    if importlib.util.find_spec(TOOLS[tool][0]) is None:
        raise MissingExtra(_missing(tool))


def _need(tool: str) -> ModuleType:
    """The tool's module, or ``MissingExtra`` naming the extra to install."""
    try:
        return importlib.import_module(TOOLS[tool][0])
    except ImportError as exc:
        raise MissingExtra(_missing(tool)) from exc


def _missing(tool: str) -> str:
    module, name, extra = TOOLS[tool]
    return f"{name} logging needs the {module} package: pip install 'pipeprof[{extra}]'"


# ---- the tools --------------------------------------------------------------------------------


def log_to(report: Exportable, target: str, **options: Any) -> str:
    """Log ``report`` to ``target`` (``"tensorboard"``, ``"mlflow"`` or ``"wandb"``); the
    options are those of ``to_tensorboard``, ``to_mlflow`` and ``to_wandb``."""
    writers: dict[str, Callable[..., str]] = {
        "tensorboard": to_tensorboard,
        "mlflow": to_mlflow,
        "wandb": to_wandb,
    }
    if target not in writers:
        raise ValueError(f"cannot log to {target!r}: choose one of {', '.join(writers)}")
    return writers[target](report, **options)


def to_tensorboard(report: Exportable, log_dir: str | os.PathLike[str] | None = None) -> str:
    """Scalars, per-step curves and the text summary as a TensorBoard event file in the local
    folder ``log_dir`` (default ``runs/pipeprof-<date>-<time>``); returns the folder.
    One-number scalars are at step 0."""
    _need("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.plugins.text import metadata as text_metadata
    from tensorboard.summary.writer.record_writer import RecordWriter

    data, now = report.to_dict(), time.time()
    Value, Summary = summary_pb2.Summary.Value, summary_pb2.Summary

    def event(step: int, values: list[Any]) -> Any:
        return event_pb2.Event(wall_time=now, step=step, summary=Summary(value=values))

    events = [event_pb2.Event(wall_time=now, file_version="brain.Event:2")]
    events.append(event(0, [Value(tag=k, simple_value=v) for k, v in metrics(data).items()]))
    for step, row in step_rows(data):
        events.append(event(step, [Value(tag=k, simple_value=v) for k, v in row.items()]))
    text = "\n".join(f"- {k}: {v}" for k, v in params(data).items())
    text += f"\n\n```\n{report.render('text')}\n```\n"
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()])
    meta = text_metadata.create_summary_metadata(display_name=headline(data), description="")
    events.append(event(0, [Value(tag=PREFIX + "summary", metadata=meta, tensor=tensor)]))
    # NOTE: tensorboard's own EventFileWriter writes through tf.io.gfile, which imports all of
    # TensorFlow (seconds) wherever it is installed; the same records, written here, need none
    folder = Path(log_dir or f"runs/pipeprof-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}"
    with open(folder / f"{name}.{next(_FILES)}.pipeprof", "xb") as file:
        writer = RecordWriter(file)
        for e in events:
            writer.write(e.SerializeToString())
    return str(folder)


def to_mlflow(
    report: Exportable,
    tracking_uri: str | None = None,
    run_id: str | None = None,
    experiment: str | None = None,
) -> str:
    """Metrics (per-step ones with their steps), params, and the HTML report and text summary
    as artifacts under ``pipeprof/``; returns the run's id. Logs to ``run_id``, else to the
    active run (``mlflow.start_run()``) when no ``tracking_uri`` is given, else to a new run
    named ``pipeprof`` in ``experiment`` (default: MLflow's own choice), which it ends."""
    mlflow = _need("mlflow")
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    data = report.to_dict()
    client = MlflowClient(tracking_uri)
    active = mlflow.active_run()
    if run_id is None and active is not None and tracking_uri is None:
        run_id = active.info.run_id
    own = run_id is None
    if run_id is None:
        made = client.create_run(_experiment_id(client, experiment), run_name="pipeprof")
        run_id = made.info.run_id
    ms = int(time.time() * 1000)
    found = [Metric(k, v, ms, 0) for k, v in metrics(data).items()]
    found += [Metric(k, v, ms, s) for s, row in step_rows(data) for k, v in row.items()]
    status = "FAILED"
    try:
        for i in range(0, len(found), 1000):  # MLflow takes at most 1000 metrics a call
            client.log_batch(run_id, metrics=found[i : i + 1000])
        client.log_batch(run_id, params=[Param(k, v) for k, v in params(data).items()])
        client.log_text(run_id, report.render("html"), PREFIX + "report.html")
        client.log_text(run_id, report.render("text"), PREFIX + "summary.txt")
        status = "FINISHED"
    finally:
        if own:
            client.set_terminated(run_id, status)
    return str(run_id)


def _experiment_id(client: Any, name: str | None) -> str:
    """``name``'s id (made if new), else MLflow's environment variables', else Default's."""
    name = name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if not name:
        return os.environ.get("MLFLOW_EXPERIMENT_ID", "0")
    found = client.get_experiment_by_name(name)
    return str(found.experiment_id if found else client.create_experiment(name))


def to_wandb(report: Exportable, run: Any = None, **init: Any) -> str:
    """Summary metrics, per-step curves (against ``pipeprof/step``), config and the HTML report
    (``pipeprof/report``) in ``run``, else the active run (``wandb.run``), else a new run made
    by ``wandb.init(**init)`` (project: ``WANDB_PROJECT``, else ``pipeprof``), which it
    finishes; returns the run's id.
    W&B's own settings apply (``WANDB_MODE=offline``, or ``mode="offline"`` here)."""
    wandb = _need("wandb")
    data = report.to_dict()
    own = run is None and wandb.run is None
    if run is None:
        project = os.environ.get("WANDB_PROJECT") or "pipeprof"
        run = wandb.run or wandb.init(**{"project": project, "job_type": "pipeprof", **init})
    failed = True
    try:
        run.config.update(params(data), allow_val_change=True)
        run.define_metric(PREFIX + "step", hidden=True)
        run.define_metric(PREFIX + "step/*", step_metric=PREFIX + "step")
        for step, row in step_rows(data):
            run.log({PREFIX + "step": step, **row})
        run.log({PREFIX + "report": wandb.Html(report.render("html"))})
        run.summary.update({**metrics(data), PREFIX + "headline": headline(data)})
        failed = False
    finally:
        if own:
            run.finish(exit_code=1 if failed else 0)
    return str(run.id)
