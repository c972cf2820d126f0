"""Hugging Face ``datasets``, map-style (NOTE [ Hugging Face datasets ] in
collect/torch/dataset.py): a real Arrow-backed ``Dataset`` built here, its ``with_transform`` /
``set_transform`` function timed as a transform stage and the Arrow read as ``load/read``."""

from __future__ import annotations

import time

import pytest
import torch
from lazy import module
from pipelines import plain_and_profiled, same_batches
from torch.utils.data import DataLoader, get_worker_info

import pipeprof

datasets = module("datasets")

TRANSFORM_MS = 3.0


def to_tensors(batch):  # type: ignore[no-untyped-def]
    """The user's ``with_transform`` function: 3 ms a call (one call a batch), then tensors."""
    time.sleep(TRANSFORM_MS / 1e3)
    return {"x": torch.tensor(batch["x"]), "y": torch.tensor(batch["y"])}


def table(n: int = 192):  # type: ignore[no-untyped-def]
    return datasets.Dataset.from_dict(
        {"x": [[float(i)] * 32 for i in range(n)], "y": list(range(n))}
    )


def seen_type(worker_id: int) -> None:
    """A worker_init_fn that looks at its dataset as user code does."""
    ds = get_worker_info().dataset
    assert type(ds) is datasets.Dataset and ds.format["type"] == "custom", ds.format


def _stages(report: dict) -> dict:
    return report["stages"]


@pytest.mark.timing
@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_a_with_transform_function_is_a_stage_and_the_arrow_read_is_load_read(context):
    """192 rows in batches of 16 (12 batches), the transform 3 ms a batch: ``transform/to_tensors``
    once a batch, ``load/read`` apart from it; the batches are the plain loader's."""
    ds = table().with_transform(to_tensors)
    kw = {"num_workers": 2, "multiprocessing_context": context, "worker_init_fn": seen_type}
    plain, got, prof = plain_and_profiled(DataLoader(ds, batch_size=16, **(kw if context else {})))
    assert len(got) == 12 and same_batches(plain, got)
    stages = _stages(prof.report().to_dict())
    tr, read = stages["transform/to_tensors"], stages["load/read"]
    assert tr["count"] == read["count"] == 12  # one call a batch (``__getitems__``)
    assert TRANSFORM_MS <= tr["mean_ms"] <= 3 * TRANSFORM_MS
    # the read holds the Arrow slice and its formatting (0.5-1 ms), not the transform it calls
    assert read["mean_ms"] < tr["mean_ms"], (read, tr)
    assert stages["load"]["count"] == 192
    # the user's dataset keeps its own function
    assert ds._format_kwargs["transform"] is to_tensors


def slow_tensors(batch):  # type: ignore[no-untyped-def]
    """``to_tensors`` after a 15 ms wait: 20 times the Arrow read's CPU a batch, so that another
    test's load on the read cannot make it the larger."""
    time.sleep(0.015)
    return {"x": torch.tensor(batch["x"]), "y": torch.tensor(batch["y"])}


def test_set_transform_in_place_and_the_verdict_names_it():
    """``set_transform`` on the dataset itself; no workers, no step: the transform is the stage
    that limits the loader."""
    ds = table(96)
    ds.set_transform(slow_tensors)
    report = pipeprof.profile(DataLoader(ds, batch_size=8)).to_dict()
    assert report["verdict"]["stage"] == "transform/slow_tensors", report["verdict"]
    assert _stages(report)["transform/slow_tensors"]["count"] == 12


def test_a_dataset_without_a_transform_has_only_its_read():
    """The near miss: a torch-formatted dataset with no transform: ``load/read`` holds the
    Arrow read and the formatting, and no transform stage is made up."""
    ds = table(64).with_format("torch")
    plain, got, prof = plain_and_profiled(DataLoader(ds, batch_size=16))
    assert same_batches(plain, got)
    stages = _stages(prof.report().to_dict())
    assert stages["load/read"]["count"] == 4
    assert not any(path.startswith("transform") for path in stages), stages


MAPS = """
import sys, time
from datasets import Dataset, load_from_disk
from torch.utils.data import DataLoader


def double(batch):
    time.sleep(0.05)  # 50 ms a batch of 64 rows: 0.2 s a map of 256
    return {"x": [[v * 2 for v in row] for row in batch["x"]]}


if __name__ == "__main__":
    kw = {"batched": True, "batch_size": 64}
    Dataset.from_dict({"x": [[float(i)] * 8 for i in range(256)]}).map(double, **kw)
    disk = load_from_disk(sys.argv[1])
    disk.filter(lambda row: True)  # a map inside datasets' own filter: not the script's
    disk.map(double, **kw)  # computed, its result cached beside the dataset
    again = disk.map(double, **kw).with_format("torch")  # the same call: from the cache
    print(sum(float(b["x"].sum()) for b in DataLoader(again, batch_size=32)))
"""


def test_pipeprof_run_says_what_each_map_cost_and_where_its_result_came_from(tmp_path):
    """Under ``pipeprof run``: an in-memory dataset's ``.map`` (not cached: computed in every
    run), one on a saved dataset (computed, cached) and the same call again (loaded), and not
    the map that ``filter`` makes inside ``datasets``; the
    script's output is its plain output (the user's function, and so the cache's fingerprint,
    untouched)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    datasets.Dataset.from_dict({"x": [[float(i)] * 8 for i in range(256)]}).save_to_disk(
        str(tmp_path / "data")
    )
    (tmp_path / "maps.py").write_text(MAPS)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *sys.path[1:]])}

    def script(*pre: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *pre, "maps.py", str(tmp_path / "data")],
                              capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=240)  # fmt: skip

    plain = script()
    for cache in (tmp_path / "data").glob("cache-*.arrow"):
        cache.unlink()  # the profiled run computes the disk map again, as plain did
    ran = script("-m", "pipeprof", "run", "-q", "-o", "run.json")
    assert plain.returncode == ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == plain.stdout == f"{2 * 8 * sum(range(256)):.1f}\n"
    report = json.loads((tmp_path / "run.json").read_text())
    maps = report["meta"]["run"]["maps"]
    assert [(m["function"], m["rows"], m["cache"]) for m in maps] == [
        ("double", 256, "none"), ("double", 256, "written"), ("double", 256, "loaded")]
    assert maps[0]["s"] >= 0.2 and maps[1]["s"] >= 0.2  # four batches of 50 ms each
    assert maps[2]["s"] < 0.5 * maps[1]["s"]
    notes = [n for n in report["notes"] if n.startswith("Dataset.map(double)")]
    assert len(notes) == 3 and "every run computes it again" in notes[0]
    assert "loaded from the datasets cache" in notes[2]
