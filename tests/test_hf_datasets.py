"""Hugging Face ``datasets``, map-style (NOTE [ Hugging Face datasets ] in
collect/torch/dataset.py): a real Arrow-backed ``Dataset`` built here, its ``with_transform`` /
``set_transform`` function timed as a transform stage and the Arrow read as ``load/read``."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, get_worker_info

import pipeprof

datasets = pytest.importorskip("datasets")

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


@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_a_with_transform_function_is_a_stage_and_the_arrow_read_is_load_read(context):
    """192 rows in batches of 16 (12 batches), the transform 3 ms a batch: ``transform/to_tensors``
    once a batch, ``load/read`` apart from it; the batches are the plain loader's."""
    ds = table().with_transform(to_tensors)
    kw = {"num_workers": 2, "multiprocessing_context": context, "worker_init_fn": seen_type}
    loader = DataLoader(ds, batch_size=16, **(kw if context else {}))
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(loader))
    assert len(got) == len(plain) == 12
    for a, b in zip(plain, got):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    stages = _stages(prof.report().to_dict())
    tr, read = stages["transform/to_tensors"], stages["load/read"]
    assert tr["count"] == read["count"] == 12  # one call a batch (``__getitems__``)
    assert TRANSFORM_MS <= tr["mean_ms"] <= 3 * TRANSFORM_MS
    # the read holds the Arrow slice and its formatting, not the transform it calls
    assert read["mean_ms"] < TRANSFORM_MS, read
    assert stages["load"]["count"] == 192
    # the user's dataset keeps its own function
    assert ds._format_kwargs["transform"] is to_tensors


def test_set_transform_in_place_and_the_verdict_names_it():
    """``set_transform`` on the dataset itself; no workers, no step: the transform is the stage
    that limits the loader."""
    ds = table(96)
    ds.set_transform(to_tensors)
    report = pipeprof.profile(DataLoader(ds, batch_size=8)).to_dict()
    assert report["verdict"]["stage"] == "transform/to_tensors", report["verdict"]
    assert _stages(report)["transform/to_tensors"]["count"] == 12


def test_a_dataset_without_a_transform_has_only_its_read():
    """The near miss: a torch-formatted dataset with no transform: ``load/read`` holds the
    Arrow read and the formatting, and no transform stage is made up."""
    ds = table(64).with_format("torch")
    loader = DataLoader(ds, batch_size=16)
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(loader))
    for a, b in zip(plain, got):
        assert all(torch.equal(a[k], b[k]) for k in a)
    stages = _stages(prof.report().to_dict())
    assert stages["load/read"]["count"] == 4
    assert not any(path.startswith("transform") for path in stages), stages
