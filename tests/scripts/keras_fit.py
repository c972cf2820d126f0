"""A plain Keras script for the tests of ``pipeprof run``: a tf.data pipeline iterated in a
Python loop, then the same pipeline given to ``model.fit``. No pipeprof in it."""

import sys
import time

import numpy as np
import tensorflow as tf


def slow(x, y):
    def work(v):
        time.sleep(0.002)
        return v

    return tf.ensure_shape(tf.numpy_function(work, [x], tf.float32), (8,)), y


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    xs = np.random.default_rng(0).normal(size=(n, 8)).astype("float32")
    ys = (xs.sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((xs, ys)).map(slow).batch(16)
    total = 0
    for x, _ in data:
        total += int(x.shape[0])
    print("looped", total, flush=True)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(data, epochs=2, verbose=0)
    print("fitted", flush=True)


if __name__ == "__main__":
    main()
