"""tf.data profiling within bounds: memory stays flat however many elements are taken, a
pipeline that never ends is refused, and device strings are checked before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from lazy import module

tf = module("tensorflow")

import pipeprof  # noqa: E402
from pipeprof.collect.tf.dataset import TRACE_BATCHES, check_device  # noqa: E402


def has_gpu() -> bool:
    """Whether TensorFlow sees a GPU (read as a skip is decided, not as the tests are collected)."""
    return bool(tf.config.list_logical_devices("GPU"))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PEAK_RSS = """
import json, resource, sys
import tensorflow as tf
import pipeprof

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

def f(x):
    return x * 2

def pipeline():
    return tf.data.Dataset.range(20000).map(f).batch(1)

pipeprof.profile(tf.data.Dataset.range(8).map(f).batch(1))  # loads the profiler's libraries
for _ in pipeline():
    pass
plain = peak_mib()
data = pipeprof.profile(pipeline()).to_dict()
print(json.dumps({"plain": plain, "profiled": peak_mib(), "batches": data["batches"],
                  "tf": {k: data["meta"]["tf"].get(k) for k in ("traced_batches", "method")},
                  "notes": data["notes"]}))
"""


def test_profiling_20000_elements_keeps_peak_memory_near_a_plain_iteration():
    """Peak RSS (a child process: TensorFlow's own baseline is large) after a plain pass over
    20000 elements, then after profiling them: the trace stops after TRACE_BATCHES elements."""
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", PEAK_RSS], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["batches"] == 20000
    assert got["tf"] == {"traced_batches": TRACE_BATCHES, "method": "profiler"}
    assert any("first 200 elements" in n and "waits" in n for n in got["notes"])
    assert got["profiled"] - got["plain"] < 40, got  # MiB


class _Stuck(Exception):
    pass


def test_a_pipeline_that_repeats_forever_behind_a_filter_is_refused_at_once():
    """``range(10).repeat().filter(...)`` has UNKNOWN cardinality, but its input is infinite:
    with batches=None the profile would never end."""
    ds = tf.data.Dataset.range(10).repeat().filter(lambda x: x % 2 == 0)
    assert int(ds.cardinality()) == tf.data.UNKNOWN_CARDINALITY

    def stuck(*_):
        raise _Stuck("profile() ran on instead of refusing")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.setitimer(signal.ITIMER_REAL, 20)
    try:
        with pytest.raises(ValueError, match=r"repeats forever.*batches=N"):
            pipeprof.profile(ds)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    data = pipeprof.profile(ds, batches=30).to_dict()  # with a bound it runs
    assert data["batches"] == 30


def test_stage_figures_divide_by_the_traced_elements_and_copies_match_them():
    """300 elements of 2 samples: the trace covers the first 200; each stage's figures per
    sample and per batch (the device copy's included) are over the same elements."""
    ds = tf.data.Dataset.range(600).batch(2).map(lambda x: x + 1)
    data = pipeprof.profile(ds, device="/CPU:0").to_dict()
    tf_meta = data["meta"]["tf"]
    assert data["batches"] == 300 and data["samples"] == 600
    assert (tf_meta["traced_batches"], tf_meta["traced_samples"]) == (200, 400)
    h2d = data["stages"]["transfer/h2d"]
    assert h2d["count"] == 200  # the copies of the traced elements, like every stage
    assert h2d["per_batch_ms"] == pytest.approx(h2d["total_s"] * 1e3 / 200, rel=1e-3)
    collate = data["stages"]["collate"]
    assert collate["count"] <= 201
    assert collate["per_sample_ms"] == pytest.approx(collate["total_s"] * 1e3 / 400, rel=1e-3)
    assert any("first 200 elements" in n for n in data["notes"])


def test_large_batches_are_traced_up_to_a_number_of_samples():
    """A map before batch(256) is 256 traced calls per element: the trace ends at 5,000
    samples (memory grows with the calls traced), not after 200 elements."""
    ds = tf.data.Dataset.range(40 * 256).map(lambda x: x - 1).batch(256)
    data = pipeprof.profile(ds).to_dict()
    tf_meta = data["meta"]["tf"]
    assert data["batches"] == 40
    assert (tf_meta["traced_batches"], tf_meta["traced_samples"]) == (20, 20 * 256)
    assert any("first 20 elements" in n for n in data["notes"])


def test_wrap_divides_traced_stages_by_traced_elements_and_copies_by_all():
    """In a loop every copy is timed (each step's transfer), the pipeline's stages only for the
    traced elements: each per-sample figure divides by the elements it covers."""
    ds = tf.data.Dataset.range(600).batch(2).map(lambda x: x + 1)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(ds, device="/CPU:0"):
            pass
    data = prof.report().to_dict()
    assert data["meta"]["tf"]["traced_batches"] == 200 and data["batches"] == 300
    h2d, collate = data["stages"]["transfer/h2d"], data["stages"]["collate"]
    assert h2d["count"] == 300
    assert h2d["per_batch_ms"] == pytest.approx(h2d["total_s"] * 1e3 / 300, rel=1e-3)
    assert collate["per_batch_ms"] == pytest.approx(collate["total_s"] * 1e3 / 200, rel=1e-3)


def test_the_prefix_benchmark_is_bounded_too(tmp_path):
    """Where the profiler cannot run, the stand-in benchmark takes at most TRACE_BATCHES
    elements of each prefix, not as many as the profile took."""
    ds = tf.data.Dataset.range(TRACE_BATCHES + 100).map(lambda x: x * 3)
    tf.profiler.experimental.start(str(tmp_path))
    try:
        data = pipeprof.profile(ds).to_dict()
    finally:
        tf.profiler.experimental.stop()
    assert data["batches"] == TRACE_BATCHES + 100
    rows = data["meta"]["tf"]["prefix_benchmark"]
    assert rows and all(r["elements"] <= TRACE_BATCHES for r in rows)


# ---- device strings ---------------------------------------------------------------------------


@pytest.mark.skipif("has_gpu()", reason="checks a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "/GPU:0", "gpu"])
def test_a_gpu_device_without_a_gpu_is_refused_with_the_tensorflow_spelling(device):
    ds = tf.data.Dataset.range(4)
    with pytest.raises(ValueError, match=r"no GPU.*device=None") as err:
        pipeprof.profile(ds, device=device)
    assert "Unknown attribute" not in str(err.value)
    if device.startswith("cuda"):
        assert "'/GPU:0'" in str(err.value)
    prof = pipeprof.Profiler(sample_hz=0)
    with pytest.raises(ValueError, match=r"no GPU"):
        prof.wrap(ds, device=device)
    assert not prof._running  # the failed wrap stopped what it started


@pytest.mark.skipif("has_gpu()", reason="checks a machine without a GPU")
def test_a_torch_device_is_read_as_its_tensorflow_spelling():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match=r"'/GPU:1'.*no GPU"):
        check_device(torch.device("cuda", 1))
    assert check_device(torch.device("cpu")) == "/CPU:0"


@pytest.mark.parametrize("device", ["bogus", "/job:worker", 3, "/CPU:7"])
def test_device_strings_tensorflow_cannot_use_are_refused(device):
    with pytest.raises(ValueError, match="device="):
        pipeprof.profile(tf.data.Dataset.range(4), device=device)


@pytest.mark.skipif("not has_gpu()", reason="needs a GPU TensorFlow can see")
def test_cuda_is_the_first_gpu():
    assert check_device("cuda") == "/GPU:0" and check_device("/gpu:0") == "/GPU:0"
    data = pipeprof.profile(tf.data.Dataset.range(8).batch(2), device="cuda").to_dict()
    assert data["stages"]["transfer/h2d"]["count"] == 4 and data["meta"]["device"] == "/GPU:0"


def test_a_cpu_device_is_accepted_and_timed():
    assert check_device("cpu") == "/CPU:0" and check_device(None) is None
    data = pipeprof.profile(tf.data.Dataset.range(8).batch(2), device="/cpu:0").to_dict()
    assert data["stages"]["transfer/h2d"]["count"] == 4 and data["meta"]["device"] == "/CPU:0"


# ---- Keras --------------------------------------------------------------------------------------


def test_keras_callback_keeps_no_per_step_list_outside_its_trace_window():
    """A long fit() must not grow the callback: steps outside the window are counted, not kept."""
    keras = pytest.importorskip("keras")
    import numpy as np

    import pipeprof.keras

    xs, ys = np.zeros((60, 4), np.float32), np.zeros((60, 1), np.float32)
    ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(1)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile(optimizer="sgd", loss="mse")
    cb = pipeprof.keras.ProfilerCallback(ds, skip_steps=1, trace_steps=4)
    m.fit(ds, epochs=1, verbose=0, callbacks=[cb])
    lists = {k: len(v) for k, v in vars(cb).items() if isinstance(v, list)}
    assert max(lists.values()) <= 4, lists
    meta = cb.report().to_dict()["meta"]["keras"]
    assert meta["traced_steps"] == 4 and meta["untraced_steps"] == 56
    assert meta["untraced_step_ms"] > 0
