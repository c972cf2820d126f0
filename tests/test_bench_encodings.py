"""pipeprof.bench_encodings: the samples in other storage encodings, read back, predicted; bad
input; the CLI; and the prediction for a switched encoding against a real DataLoader run."""

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import h5py
import numpy as np
import pytest
from h5data import EagerH5, LazyH5, field, write
from PIL import features
from torch.utils.data import DataLoader, default_collate, get_worker_info
from torchvision import datasets, transforms

import pipeprof
from pipeprof.analyze import whatif
from pipeprof.bench.codecs import Codec, convert_folder
from pipeprof.bench.scaling import run_loader
from pipeprof.bench.sources import pick
from pipeprof.cli import main
from pipeprof.demo import make_images

FAST = {"repeat": 1, "warmup": 1, "probe": False, "seconds": 0}  # no real run: the model's rates


def chain(crop=64):
    return transforms.Compose([transforms.RandomResizedCrop(crop), transforms.ToTensor()])


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("jpegs"), count=24, size=(160, 120))


def rows_of(e):
    return {r["encoding"]: r for r in e["rows"]}


def test_an_image_folder_gets_every_encoding_with_its_costs_and_the_current_marked(jpegs):
    ds = datasets.ImageFolder(str(jpegs), transform=chain())
    e = pipeprof.bench_encodings(DataLoader(ds, batch_size=4, num_workers=2), samples=12, **FAST)
    assert e.workers == 2 and e["config"]["batch_size"] == 4  # the loader's
    rows = rows_of(e)
    cur = e["rows"][0]
    assert cur["current"] and cur["encoding"] == "JPEG q≈90 files"  # make_images writes q90
    files = [p for p, _ in ds.samples]
    picked = [files[i] for i in pick(len(files), 12, 0)]
    mean_size = np.mean([os.path.getsize(p) for p in picked])
    assert cur["bytes_per_sample"] == pytest.approx(mean_size, abs=0.051)  # rounded to 0.1 B
    assert cur["predicted_samples_per_s"] == pytest.approx(float(e.bench.predict(2)), rel=1e-4)
    assert cur["model_samples_per_s"] == cur["predicted_samples_per_s"]  # seconds=0: no run
    assert e["anchor"]["skipped"] == "seconds=0" and "measured_samples_per_s" not in cur
    presized = "JPEG q90, presized 74px"  # RandomResizedCrop(64) × 256/224, rounded up
    expected = ["JPEG q75", "JPEG q50", presized, "PNG", "WebP q90", "npy (raw)",
                "HDF5 uncompressed, 1 sample/chunk", "HDF5 gzip, 1 sample/chunk",
                "HDF5 lzf, 1 sample/chunk"]  # fmt: skip
    assert list(rows)[1:] == expected
    if not features.check("webp"):
        assert "no WebP support" in rows["WebP q90"]["reason"]
        expected.remove("WebP q90")
    for name in expected:
        r = rows[name]
        assert r["applicable"] and r["read_ms"] > 0 and r["bytes_per_sample"] > 0, r
        assert r["predicted_samples_per_s"] > 0 and r["speedup"] > 0
        assert r["lossy"] == (name.startswith(("JPEG", "WebP"))), name
    assert rows["PNG"]["quality"] == rows["npy (raw)"]["quality"] == "lossless"
    assert rows["HDF5 gzip, 1 sample/chunk"]["quality"] == "lossless"
    assert rows["JPEG q50"]["quality"].startswith("lossy: PSNR")
    assert rows["npy (raw)"]["bytes_per_sample"] == pytest.approx(160 * 120 * 3 + 128)
    small = rows[presized]
    assert small["presize"] == 74 and small["quality"] == "lossy: resized to 74 px, q90"
    assert small["bytes_per_sample"] < 0.8 * cur["bytes_per_sample"]  # headers: ~600 B
    assert rows["npy (raw)"]["transform_ms"] == cur["transform_ms"]  # same images: not re-timed
    # how fast gzip reads against npy is a benchmark's question (benchmarks/
    # encodings_validation.py), not this test's: under CI's load even their CPU times came
    # within 1.1x of each other (2.3x idle)
    assert e.predict(presized) == small["predicted_samples_per_s"]
    assert e.predict(presized, workers=1) < e.predict(presized, workers=2)
    with pytest.raises(KeyError, match="no applicable encoding 'GIF'"):
        e.predict("GIF")
    text = str(e)
    assert "◀ current" in text and "best:" in text and presized in text
    assert "<pre" in e._repr_html_() and json.loads(e.render("json"))["schema"].endswith("/1")
    assert ds.transform.__class__ is transforms.Compose  # the user's dataset is untouched


def test_presizing_follows_a_resize_before_the_crop_and_needs_a_size(jpegs):
    resize = transforms.Compose([transforms.Resize(80), transforms.CenterCrop(64)])
    ds = datasets.ImageFolder(str(jpegs), transform=resize)
    e = pipeprof.bench_encodings(ds, samples=4, kinds=["jpeg"], **FAST)
    sized = [r for r in e["rows"] if r.get("presize")]
    assert [r["presize"] for r in sized] == [80]  # Resize(80) comes first: store them at 80
    assert "transform/Resize(80) comes first" in " ".join(e["notes"])
    plain = datasets.ImageFolder(str(jpegs), transform=transforms.ToTensor())
    rows = rows_of(pipeprof.bench_encodings(plain, samples=4, kinds=["jpeg"], **FAST))
    assert rows["JPEG q90, presized"]["reason"] == (
        "not applicable: no crop or resize in the transforms: no size to presize to"
    )


class InWorkersOnly:
    """4 ms more per sample, but only in a DataLoader worker: what the stand-alone timings (in
    the main process) cannot see and a real run does."""

    def __call__(self, x):
        if get_worker_info() is not None:
            time.sleep(0.004)
        return x


def test_the_rates_are_anchored_to_a_real_run_of_the_current_encoding(jpegs):
    ds = datasets.ImageFolder(str(jpegs), transform=transforms.Compose(
        [transforms.CenterCrop(64), InWorkersOnly(), transforms.ToTensor()]))  # fmt: skip
    e = pipeprof.bench_encodings(DataLoader(ds, batch_size=4, num_workers=2), samples=12,
                                 kinds=["jpeg", "npy"], repeat=1, warmup=1, probe=False,
                                 seconds=1.0)  # fmt: skip
    a, cur = e["anchor"], e["rows"][0]
    assert a["skipped"] is None and a["workers"] == 2
    # 2 workers sleeping 4 ms a sample deliver at most 500 samples/s (the decode's CPU on top
    # lowers it, more so when other programs share the cores); the model, which never saw the
    # sleep, says several times that
    assert 150 < a["measured_samples_per_s"] < 500, a
    assert cur["model_samples_per_s"] > 1.5 * a["measured_samples_per_s"]
    assert cur["predicted_samples_per_s"] == pytest.approx(a["measured_samples_per_s"], abs=1e-3)
    assert cur["measured_samples_per_s"] == a["measured_samples_per_s"]
    for r in e["rows"]:  # every rate scaled alike: the gains are the model's
        assert r["predicted_samples_per_s"] == pytest.approx(
            r["model_samples_per_s"] * a["factor"], rel=1e-3)  # fmt: skip
        model = r["model_samples_per_s"] / cur["model_samples_per_s"]
        assert r["speedup"] == pytest.approx(model, abs=1e-3)
    assert e.predict("npy (raw)", workers=1) == pytest.approx(
        whatif.throughput(e.models["npy (raw)"], 1) * a["factor"])  # another count: the same factor
    assert "the current encoding's is measured" in str(e)
    assert not any("hand-over waits" in n for n in e["notes"])  # < 500 batches/s: no warning
    for bad in (-1, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match="seconds must be"):
            pipeprof.bench_encodings(ds, seconds=bad)


def test_no_real_run_over_a_dataset_holding_an_open_h5py_file(tmp_path, monkeypatch):
    path = tmp_path / "e.h5"
    write(path, "x", field(32, 8, 8), chunks=(4, 8, 8))
    eager = EagerH5(path)
    try:
        e = pipeprof.bench_encodings(eager, samples=8, kinds=["npy"], repeat=1, warmup=1,
                                     probe=False, workers=1, seconds=0.5)  # fmt: skip
    finally:
        eager.f.close()
    assert "open h5py file" in e["anchor"]["skipped"]
    assert e["rows"][0]["predicted_samples_per_s"] == e["rows"][0]["model_samples_per_s"]
    assert any("not checked against a real run" in n for n in e["notes"])
    lazy = LazyH5(path)  # opens its file in the process that reads: the run is safe
    # 8×8 floats in batches of 2 run at 500–800 batches/s here, around the real threshold: the
    # note is checked against thresholds the rows are surely above, and surely below
    from pipeprof.bench import encodings

    for threshold, said in ((20, True), (10**6, False)):
        monkeypatch.setattr(encodings, "SHORT_BATCHES", threshold)
        e = pipeprof.bench_encodings(lazy, samples=8, kinds=["npy"], repeat=1, warmup=1,
                                     probe=False, workers=1, seconds=0.5, batch_size=2)  # fmt: skip
        assert e["anchor"]["measured_samples_per_s"] > 0 and lazy.f is None
        noted = [n for n in e["notes"] if "batches/s, where each batch's hand-over" in n]
        assert bool(noted) is said, e["notes"]


def test_float_hdf5_samples_get_hdf5_rows_and_no_image_rows(tmp_path):
    path = tmp_path / "f.h5"
    # samples of 16 kB: a 16-sample chunk's decode outweighs a read's fixed cost (4-6× the
    # 1-sample chunk's read here; with 1 kB samples, 1.1-1.5×, which a busy machine reversed)
    write(path, "x", field(64, 64, 64), chunks=(8, 64, 64), compression="gzip")
    ds = LazyH5(path)
    e = pipeprof.bench_encodings(ds, samples=16, **FAST)
    rows = rows_of(e)
    cur = e["rows"][0]
    assert cur["encoding"] == "HDF5 gzip, chunks 8×64×64 (f.h5:/x)"
    with h5py.File(path) as f:
        stored = f["x"].id.get_storage_size()
    assert cur["bytes_per_sample"] == pytest.approx(stored / 64, abs=0.05)
    for name in ("JPEG q75", "PNG", "WebP q90"):
        if name != "WebP q90" or features.check("webp"):
            assert rows[name]["reason"].startswith("not applicable: float32 samples"), name
        assert "predicted_samples_per_s" not in rows[name]  # no figures, not wrong ones
    assert rows["JPEG q90, presized"]["applicable"] is False
    for c in ("uncompressed", "gzip", "lzf"):
        for n in ("1 sample", "16 samples"):
            r = rows[f"HDF5 {c}, {n}/chunk"]
            assert r["applicable"] and r["quality"] == "lossless" and r["read_ms"] > 0
    # one sample per chunk decodes 16× less than 16 per chunk (read without a chunk cache)
    assert rows["HDF5 gzip, 1 sample/chunk"]["read_ms"] < rows["HDF5 gzip, 16 samples/chunk"][
        "read_ms"
    ]
    assert ds.f is None  # reading went through a copy, whose file was closed
    assert e.rows[0]["gil_held"] is None or 0 <= e.rows[0]["gil_held"] <= 1


def test_an_h5py_dataset_itself_and_its_layouts(tmp_path):
    path = tmp_path / "c.h5"
    write(path, "x", (np.arange(32 * 8 * 8) % 251).astype("u1").reshape(32, 8, 8))
    with h5py.File(path) as f:
        e = pipeprof.bench_encodings(f["x"], samples=8, kinds=["png", "hdf5"], **FAST)
    rows = rows_of(e)
    assert e["rows"][0]["encoding"] == "HDF5 contiguous (not chunked) (c.h5:/x)"
    assert e["rows"][0]["bytes_per_sample"] == 64
    assert rows["PNG"]["quality"] == "lossless"  # uint8 H×W: an image
    # a virtual dataset keeps its bytes in its sources: n/a, not 0
    with h5py.File(tmp_path / "v.h5", "w") as f:
        layout = h5py.VirtualLayout(shape=(32, 8, 8), dtype="u1")
        layout[:] = h5py.VirtualSource(str(path), "x", shape=(32, 8, 8))
        f.create_virtual_dataset("v", layout)
    with h5py.File(tmp_path / "v.h5") as f:
        e = pipeprof.bench_encodings(f["v"], samples=4, kinds=["npy"], **FAST)
    cur = e["rows"][0]
    assert cur["encoding"].startswith("HDF5 virtual dataset") and cur["bytes_per_sample"] is None
    assert "virtual dataset" in cur["why_bytes"] and "bytes n/a" in str(e)
    # an external link: the data and its bytes are in the file it points to
    with h5py.File(tmp_path / "link.h5", "w") as f:
        f["y"] = h5py.ExternalLink(str(path), "x")
    with h5py.File(tmp_path / "link.h5") as f:
        e = pipeprof.bench_encodings(f["y"], samples=4, kinds=["npy"], **FAST)
    assert e["rows"][0]["encoding"] == "HDF5 contiguous (not chunked) (c.h5:/x)"
    assert e["rows"][0]["bytes_per_sample"] == 64


class H5Like:
    """Looks like an h5py dataset (shape, dtype, chunks) but is not one."""

    shape, dtype, chunks = (8, 4, 4), np.dtype("f4"), (1, 4, 4)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full((4, 4), i, "f4")


def test_bad_input_gets_a_clear_message_or_a_row_marked_not_applicable(tmp_path, jpegs):
    write(tmp_path / "a.h5", "x", field(8, 4, 4))
    f = h5py.File(tmp_path / "a.h5")
    closed = f["x"]
    f.close()
    with pytest.raises(ValueError, match="the h5py dataset is closed"):
        pipeprof.bench_encodings(closed)
    e = pipeprof.bench_encodings(H5Like(), samples=4, kinds=["jpeg", "npy"], **FAST)
    cur = e["rows"][0]
    assert cur["encoding"] == "H5Like[i] (storage unknown)" and cur["bytes_per_sample"] is None
    assert "H5Like is not an h5py.Dataset" in cur["why_bytes"]
    assert rows_of(e)["npy (raw)"]["applicable"]
    assert any("replaces the whole load" in n for n in e["notes"])
    gone = make_images(tmp_path / "imgs", count=4, size=(32, 32))
    ds = datasets.ImageFolder(str(gone), transform=chain(16))
    os.remove(ds.samples[2][0])
    with pytest.raises(FileNotFoundError, match=f"no such file {ds.samples[2][0]}"):
        pipeprof.bench_encodings(ds, **FAST)
    with pytest.raises(ValueError, match="unknown encoding kinds"):
        pipeprof.bench_encodings(ds, kinds=["gif"])
    with pytest.raises(TypeError, match="needs a map-style dataset"):
        pipeprof.bench_encodings("data/*.jpg")
    with pytest.raises(ValueError, match="has no samples"):
        pipeprof.bench_encodings([])
    with pytest.raises(TypeError, match="sample 0 is a str"):
        pipeprof.bench_encodings(["a", "b"], **FAST)


def test_cli_bench_encodings(tmp_path, jpegs):
    factory = tmp_path / "encdata.py"
    factory.write_text(
        "from torchvision import datasets, transforms\n"
        "def make():\n"
        f"    return datasets.ImageFolder({str(jpegs)!r}, transform=transforms.Compose(\n"
        "        [transforms.CenterCrop(48), transforms.ToTensor()]))\n"
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "pipeprof", "bench", f"{factory}:make", "--encodings",
         "--samples", "4", "--repeat", "1", "--predict", "3", "--seconds", "0.5",
         "--format", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == "pipeprof-encodings/1" and data["workers"] == 3
    assert data["rows"][0]["current"] and data["best"]["text"]
    assert data["anchor"]["workers"] == 3 and data["anchor"]["measured_samples_per_s"] > 0
    saved = tmp_path / "enc.json"
    saved.write_text(out.stdout)
    shown = subprocess.run([sys.executable, "-m", "pipeprof", "report", str(saved)],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0 and data["best"]["text"].split()[0] in shown.stdout, shown.stderr
    html = tmp_path / "enc.html"
    argv = ["bench", f"{factory}:make", "--encodings", "--samples", "4", "--repeat", "1",
            "--seconds", "0"]  # fmt: skip
    assert main([*argv, "-o", str(html)]) == 0
    assert "◀ current" in html.read_text()
    assert main([*argv, "--workers", "2"]) == 2  # --workers means real runs: refused
    bad = subprocess.run([sys.executable, "-m", "pipeprof", *argv[:-1], "-1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--seconds: expected seconds, 0 or more" in bad.stderr


# The prediction for a switched encoding against a real run with it; see docs/validation/bench.md
# ("a switched encoding against a real run") for the spread on the 2-core development VM and why.
# Anchored to the measured current rate, the prediction's error is the predicted gain's: medians
# of -6 to +3 % over 6-9 rounds, single runs -14 to +24 %; the model alone (not anchored) drifted
# by +6 to +51 % (medians) as the stand-alone CPU moved 0.84-1.6x from the workers' on this VM.
ANCHORED_BOUND = 0.30  # median of 3 runs against one prediction
RUN_CPU_BOUND = 0.10  # the model fed the CPU the workers really used (the model alone)


@pytest.mark.timing
def test_presized_jpeg_prediction_against_a_real_loader(tmp_path):
    root = make_images(tmp_path / "big", count=96, size=(320, 320))
    ds = datasets.ImageFolder(str(root), transform=chain(128))
    e = pipeprof.bench_encodings(ds, samples=48, workers=2, batch_size=16, kinds=["jpeg"])
    assert e["anchor"]["measured_samples_per_s"] > 0
    row = next(r for r in e["rows"] if r.get("presize"))
    assert row["presize"] == 147
    assert row["transform_ms"] < 0.9 * e["rows"][0]["transform_ms"]  # the crop has less to do
    assert row["codec"] == {"kind": "jpeg", "quality": 90, "presize": 147, "compression": None,
                            "per_chunk": 1}  # fmt: skip
    convert_folder(root, tmp_path / "small", Codec(**row["codec"]))
    small = datasets.ImageFolder(str(tmp_path / "small"), transform=chain(128))
    model = replace(e.models[row["encoding"]], cores=float(e.bench.cores), background=0.0)
    errors, run_cpu = [], []
    for _ in range(3):
        run = run_loader(small, list(range(96)), 2, 16, default_collate, 1.0, row[
            "predicted_samples_per_s"])  # fmt: skip
        bg = whatif.background_for(model, 2, run["others_cores"] or 0.0)
        m = replace(model, background=bg)
        x = run["samples_per_s"]
        errors.append(row["predicted_samples_per_s"] / x - 1)
        f = run["worker_cpu_ms"] / m.batch_ms()[1]
        run_cpu.append(whatif.throughput(with_cpu(m, f), 2) / x - 1)
    assert abs(statistics.median(run_cpu)) < RUN_CPU_BOUND, run_cpu
    assert abs(statistics.median(errors)) < ANCHORED_BOUND, errors


def with_cpu(model, factor):
    """``model`` with every CPU ms ``factor`` times longer (benchmarks/whatif_validation.py)."""
    stages = tuple(replace(s, wall_ms=s.wall_ms + s.cpu_ms * (factor - 1),
                           cpu_ms=s.cpu_ms * factor) for s in model.stages)  # fmt: skip
    extra = model.collate_cpu_ms * (factor - 1)
    return replace(model, stages=stages, send_ms=model.send_ms * factor,
                   collate_cpu_ms=model.collate_cpu_ms * factor,
                   collate_wall_ms=model.collate_wall_ms + extra)  # fmt: skip


# ---- a latency-bound fetch: objects that hold more samples, requests in flight ---------------

LAYOUTS = {"objects of 8 samples": ("samples_per_request", 8),
           "objects of 32 samples": ("samples_per_request", 32),
           "objects of 128 samples": ("samples_per_request", 128),
           "2 requests in flight": ("requests_in_flight", 2),
           "4 requests in flight": ("requests_in_flight", 4),
           "8 requests in flight": ("requests_in_flight", 8)}  # fmt: skip


def test_a_latency_bound_fetch_gets_rows_for_larger_objects_and_requests_in_flight():
    """By construction: each sample is one request that waits LATENCY_S for its first byte, then
    a 64 kB body at once. The rows share that wait as NOTE [ Larger objects and requests in
    flight, benched ] says, and nothing else of the load changes."""
    from netdata import BODY, LATENCY_S, Remote, server

    with server() as url:
        e = pipeprof.bench_encodings(Remote(url, 32), samples=16, workers=2, batch_size=8,
                                     kinds=["npy"], **FAST)  # fmt: skip
    f = e["fetch"]
    assert f["samples"] == 16 and f["requests_per_sample"] == 1
    assert f["bytes_per_sample"] == BODY
    assert LATENCY_S * 1e3 <= f["latency_ms"] < LATENCY_S * 1e3 + 15
    assert f["read_ms"] < f["latency_ms"] / 4
    rows = rows_of(e)
    assert {n for n, r in rows.items() if r.get("layout")} == set(LAYOUTS)
    cur = e["rows"][0]
    load_now = next(s for s in e.models[cur["encoding"]].stages if s.path == "load")
    for name, (key, size) in LAYOUTS.items():
        row = rows[name]
        assert row["layout"][key] == size and row["quality"] == "lossless: the same bytes"
        keep = 1 / size
        load = next(s for s in e.models[name].stages if s.path == "load")
        # the wait saved, down to the load's own work (under load, its CPU time can be more)
        floor = min(load_now.cpu_ms, load_now.wall_ms)
        saved = load_now.wall_ms - f["latency_ms"] * (1 - keep)
        assert load.wall_ms == pytest.approx(max(floor, saved), abs=2e-3)
        assert load.cpu_ms == load_now.cpu_ms  # the client's work is not counted out
        assert row["layout"]["fetch_ms"] == pytest.approx(f["latency_ms"] * keep + f["read_ms"],
                                                          abs=1e-3)  # fmt: skip
    rate = {n: rows[n]["predicted_samples_per_s"] for n in LAYOUTS}
    assert rate["objects of 8 samples"] > 2 * cur["predicted_samples_per_s"]
    flying = [rate[f"{n} requests in flight"] for n in (2, 4, 8)]
    assert flying == sorted(flying) and len(set(flying)) == 3
    text = e.render("text", width=160)
    assert "objects of 32 samples" in text and "waiting for the first byte" in text


def test_a_fetch_that_is_mostly_its_bodies_gets_no_layout_rows(jpegs):
    """Near misses: the headers come at once and the body in 16 parts 1.5 ms apart (the wait
    for the first byte is a small part of the fetch), and a dataset that fetches nothing."""
    from netdata import Remote, server

    with server() as url:
        e = pipeprof.bench_encodings(Remote(url + "slow/", 16), samples=8, workers=2,
                                     batch_size=8, kinds=["npy"], **FAST)  # fmt: skip
    f = e["fetch"]
    assert f["requests_per_sample"] == 1 and f["read_ms"] > 2 * f["latency_ms"]
    assert not [r for r in e["rows"] if r.get("layout")]
    assert any("no layout rows" in note for note in e["notes"])
    local = pipeprof.bench_encodings(datasets.ImageFolder(str(jpegs), transform=chain()),
                                     samples=4, kinds=["npy"], **FAST)  # fmt: skip
    assert local["fetch"] is None and not [r for r in local["rows"] if r.get("layout")]
