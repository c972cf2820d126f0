"""tf.data's own findings (``tf-cache``, ``tf-interleave``) on real pipelines whose reading is slow,
and their near misses. The source is ``from_generator`` over a generator that sleeps: a slow read
with a known cost, timed by the generator itself."""

from __future__ import annotations

import os
import time

import pytest
from lazy import module

tf = module("tensorflow")

import pipeprof  # noqa: E402

TRUTH: dict[str, list[int]] = {}


def reader(ms: float, n: int):
    """A generator function yielding ``n`` elements, each read in ``ms`` (logged as ``read``)."""

    def read(*_):
        for i in range(n):
            t0 = time.perf_counter_ns()
            time.sleep(ms / 1e3)
            TRUTH.setdefault("read", []).append(time.perf_counter_ns() - t0)
            yield i

    return read


def source(ms: float, n: int = 24):
    return tf.data.Dataset.from_generator(
        reader(ms, n), output_signature=tf.TensorSpec((), tf.int64)
    )


def augment(ms: float):
    """A map function whose py_function sleeps ``ms`` (logged as ``augment``)."""

    def body(x):
        t0 = time.perf_counter_ns()
        time.sleep(ms / 1e3)
        TRUTH.setdefault("augment", []).append(time.perf_counter_ns() - t0)
        return x

    def augment(x):
        return tf.py_function(body, [x], tf.int64)

    return augment


def run(ds) -> tuple[dict, dict[str, float]]:
    TRUTH.clear()
    report = pipeprof.profile(ds).to_dict()
    return report, {k: sum(v) / 1e9 for k, v in TRUTH.items()}


def findings(report: dict) -> dict[str, dict]:
    return {f["id"]: f for f in report["findings"]}


@pytest.mark.timing
def test_slow_reads_without_cache_or_interleave():
    report, true = run(source(8.0).map(augment(2.0)).batch(4).prefetch(1))
    assert (
        report["samples"] == 24 and report["meta"]["tf"]["bottleneck"]["stage"] == "load/Generator"
    )
    found = findings(report)
    cache = found["tf-cache"]
    assert (cache["severity"], cache["stage"]) == ("info", "load")
    ev = cache["evidence"]
    # the map's py_function pays a GIL hand-over its own clock does not see: a few points of share
    assert ev["load_share"] == pytest.approx(
        true["read"] / (true["read"] + true["augment"]), abs=0.08
    )
    assert ev["load_per_sample_ms"] == pytest.approx(true["read"] * 1e3 / 24, rel=0.12)
    assert ev["cardinality"] == "unknown"  # a generator's length is unknown, not infinite
    assert f"{ev['load_per_sample_ms']:.3g} ms per sample" in cache["fix"]
    inter = found["tf-interleave"]
    cores = os.cpu_count()
    assert (inter["severity"], inter["stage"]) == ("warning", "load/Generator")
    assert inter["evidence"] == {"interleave": False, "cores": cores}
    assert f"cycle_length={cores}" in inter["fix"]


@pytest.mark.timing
def test_cached_reads_get_no_cache_finding():
    report, true = run(source(8.0).cache().map(augment(2.0)).batch(4).prefetch(1))
    assert true["read"] / (true["read"] + true["augment"]) >= 0.6  # reading still dominates
    assert "cache" in report["stages"]
    assert "tf-cache" not in findings(report)


@pytest.mark.timing
def test_cheap_reads_get_neither_cache_nor_interleave():
    report, true = run(source(1.0).map(augment(6.0)).batch(4).prefetch(1))
    assert true["read"] / (true["read"] + true["augment"]) < 0.3
    assert report["meta"]["tf"]["bottleneck"]["stage"] == "transform/augment"
    assert not {"tf-cache", "tf-interleave"} & set(findings(report))


@pytest.mark.timing
def test_files_interleaved_one_at_a_time():
    files = tf.data.Dataset.range(2)
    ds = files.interleave(lambda i: source(6.0, 12), cycle_length=1).batch(4).prefetch(1)
    report, true = run(ds)
    f = findings(report)["tf-interleave"]
    cores = os.cpu_count()
    assert (f["severity"], f["stage"]) == ("warning", "load/Generator")
    assert f["evidence"] == {"cycle_length": 1, "num_parallel_calls": None, "cores": cores}
    assert f"cycle_length={max(cores, 1)}" in f["fix"]
    assert report["stages"]["load/Generator"]["mean_ms"] == pytest.approx(
        true["read"] * 1e3 / 24, rel=0.12
    )


@pytest.mark.timing
def test_files_interleaved_in_parallel_on_every_core():
    cores = os.cpu_count()
    ds = (
        tf.data.Dataset.range(2)
        .interleave(
            lambda i: source(6.0, 12), cycle_length=cores, num_parallel_calls=tf.data.AUTOTUNE
        )
        .batch(4)
        .prefetch(1)
    )
    report, _ = run(ds)
    assert report["meta"]["tf"]["bottleneck"]["stage"] == "load/Generator"  # still read-bound
    assert "tf-interleave" not in findings(report)


def test_files_interleaved_with_autotune_get_no_interleave_finding():
    """tf.data's own idiom: AUTOTUNE for both. TensorFlow stores the cycle_length it picked (on 2
    cores: 1) in the graph, not AUTOTUNE, so the rule must not read it as "one at a time"."""
    auto = tf.data.AUTOTUNE
    ds = (
        tf.data.Dataset.range(2)
        .interleave(lambda i: source(6.0, 12), cycle_length=auto, num_parallel_calls=auto)
        .batch(4)
        .prefetch(1)
    )
    report, _ = run(ds)
    assert report["meta"]["tf"]["bottleneck"]["stage"] == "load/Generator"  # still read-bound
    assert "tf-interleave" not in findings(report), findings(report).get("tf-interleave")
