"""pipeprof.keras.ProfilerCallback in real Keras fit(): input-bound, compute-bound, fallback."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
from lazy import module

tf = module("tensorflow")
keras = module("keras")

pipeprof_keras = module("pipeprof.keras")  # it imports tensorflow

TRUTH: list[int] = []
BATCH = 8


def slow_read(x):
    t0 = time.perf_counter_ns()
    time.sleep(0.008)
    TRUTH.append(time.perf_counter_ns() - t0)
    return x


def load_fn(x, y):
    x = tf.py_function(slow_read, [x], tf.float32)
    x.set_shape([32])
    return x, y


def data(slow: bool, batches: int = 20):
    rng = np.random.default_rng(0)
    xs = rng.random((batches * BATCH, 32), dtype=np.float32)
    ys = rng.random((batches * BATCH, 1), dtype=np.float32)
    ds = tf.data.Dataset.from_tensor_slices((xs, ys))
    if slow:
        ds = ds.map(load_fn)
    return ds.batch(BATCH).prefetch(1)


def model(units: int):
    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    m.compile(optimizer="sgd", loss="mse")
    return m


@pytest.fixture  # per test: a timing re-run must fit the model again, not re-read one result
def input_bound():
    TRUTH.clear()
    ds = data(slow=True)
    cb = pipeprof_keras.ProfilerCallback(ds)
    model(16).fit(ds, epochs=1, verbose=0, callbacks=[cb])
    return cb.report().to_dict(), statistics.fmean(TRUTH) / 1e6


@pytest.mark.timing
def test_input_bound_fit(input_bound):
    data_, per_sample_ms = input_bound
    assert data_["framework"] == "tf" and data_["mode"] == "loop"
    assert data_["verdict"]["kind"] == "input-bound"
    loop = data_["loop"]
    assert loop["steps"] == 18  # 20 steps, the first 2 skipped (they compile the train step)
    assert loop["steady"]["wait_fraction"] > 0.6
    assert data_["meta"]["keras"]["wait_method"] == "profiler"
    assert data_["meta"]["tf"]["bottleneck"]["stage"] == "transform/load_fn"
    f = {x["id"]: x for x in data_["findings"]}["tf-bottleneck"]
    assert f["severity"] == "warning" and "load_fn limits the pipeline" in f["message"]
    # in situ a py_function also waits for the GIL, which its own clock does not see
    load_ms = data_["stages"]["transform/load_fn"]["mean_ms"]
    assert per_sample_ms <= load_ms * 1.02 and load_ms == pytest.approx(per_sample_ms, rel=0.20)
    # with prefetch(1), each step waits for the batch's reading minus the overlapped compute
    # (10 % on a quiet machine; 20 % leaves room for the shared 2-core CI box)
    expected = BATCH * load_ms - loop["compute_ms"]["mean_ms"]
    assert loop["wait_ms"]["mean_ms"] == pytest.approx(expected, rel=0.20)
    assert data_["samples"] == 18 * BATCH


@pytest.mark.timing
def test_steps_per_execution_counts_every_batch():
    """Keras calls the batch hooks once per execution of steps_per_execution batches."""
    TRUTH.clear()
    ds = data(slow=True, batches=24)
    cb = pipeprof_keras.ProfilerCallback(ds, skip_steps=1)
    m = model(16)
    m.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    m.fit(ds, epochs=1, verbose=0, callbacks=[cb])
    data_ = cb.report().to_dict()
    assert data_["loop"]["steps"] == 5  # 6 executions of 4 batches, the first skipped
    assert data_["batches"] == 20 and data_["samples"] == 20 * BATCH
    row = data_["stages"]["transform/load_fn"]
    assert row["per_sample_ms"] == pytest.approx(row["mean_ms"], rel=0.25)
    true_rate = 1e9 / statistics.fmean(TRUTH)  # one sequential reader: samples/s at best
    rate = data_["loop"]["throughput"]["effective_samples_per_s"]
    assert 0.6 * true_rate < rate < 1.1 * true_rate, (rate, true_rate)


def test_compute_bound_fit():
    """Steps of ~35 ms of compute over batches in memory: a wait of ~0.2 %, far under the 5 %
    (with 1024 units, steps of ~7 ms and a wait of ~0.8 %, a few ms of another test's load on
    the prefetch thread would reach it)."""
    ds = data(slow=False, batches=12)
    cb = pipeprof_keras.ProfilerCallback(ds, trace_steps=8)
    model(2048).fit(ds, epochs=1, verbose=0, callbacks=[cb])
    data_ = cb.report().to_dict()
    assert data_["verdict"]["kind"] == "compute-bound", data_["verdict"]
    assert data_["loop"]["steps"] == 8
    assert data_["loop"]["steady"]["wait_fraction"] < 0.05
    # TensorFlow's rule always names the most blocking iterator (here the prefetch hand-over,
    # microseconds a step): that limits nothing in a compute-bound loop
    blocked = data_["meta"]["tf"]["bottleneck"]
    f = {x["id"]: x for x in data_["findings"]}["tf-bottleneck"]
    assert f["severity"] == "info" and f["message"].startswith("no tf.data stage limits"), f
    assert f["evidence"]["loop_share"] < 0.05 and blocked["blocking_s"] < 0.05 * data_["wall_s"]


def slow_start(seconds: float, batches: int):
    """Batches from a generator that takes ``seconds`` to open (a file listing, a connection)."""
    xs = np.zeros((batches * BATCH, 32), np.float32)
    ys = np.zeros((batches * BATCH, 1), np.float32)

    def gen():
        time.sleep(seconds)
        yield from zip(xs, ys)

    spec = (tf.TensorSpec((32,), tf.float32), tf.TensorSpec((1,), tf.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=spec).batch(BATCH).prefetch(1)


def test_the_report_says_which_steps_it_covers_and_measures_start_up():
    ds = slow_start(0.4, batches=12)
    cb = pipeprof_keras.ProfilerCallback(ds, trace_steps=4)
    model(16).fit(ds, epochs=1, verbose=0, callbacks=[cb])
    report = cb.report()
    loop = report.to_dict()["loop"]
    assert (loop["steps"], loop["steps_total"]) == (4, 12)  # 2 skipped, 4 traced, 6 after
    assert "covers 4 of 12 steps" in " ".join(report.render("text").replace("│", " ").split())
    assert "covers 4 of 12 steps" in report.render("html")
    # the generator's 0.4 s before the first batch, seen in the first step (not traced as one)
    assert 0.4 <= loop["startup_s"] < 0.4 + 0.3, loop["startup_s"]


def test_differential_run_restores_the_model():
    ds = data(slow=False, batches=6)
    m = model(16)
    cb = pipeprof_keras.ProfilerCallback(ds, differential=True, replay_batches=4)
    m.fit(ds, epochs=1, verbose=0, callbacks=[cb])
    before = [w.copy() for w in m.get_weights()]
    iterations = int(m.optimizer.iterations.numpy())
    cb._differential()  # again, on the trained model: it must leave no trace
    assert all(np.array_equal(a, b) for a, b in zip(before, m.get_weights()))
    assert int(m.optimizer.iterations.numpy()) == iterations
    replay = cb.report().to_dict()["loop"]["replay"]
    assert replay["batches"] == 4 and replay["compute_samples_per_s"] > 0


def test_profiler_busy_falls_back_to_the_differential_run(tmp_path):
    TRUTH.clear()
    ds = data(slow=True, batches=10)
    cb = pipeprof_keras.ProfilerCallback(ds)
    tf.profiler.experimental.start(str(tmp_path))
    try:
        model(16).fit(ds, epochs=1, verbose=0, callbacks=[cb])
    finally:
        tf.profiler.experimental.stop()
    data_ = cb.report().to_dict()
    assert data_["meta"]["keras"]["wait_method"] == "differential"
    assert any("profiler could not run" in n for n in data_["notes"])
    assert data_["verdict"]["kind"] == "input-bound"
