"""Keras imported before TensorFlow (keras imports tensorflow itself), then fit()."""

import keras
import numpy as np
import tensorflow as tf

xs = np.zeros((64, 4), "float32")
ys = np.zeros((64,), "int32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(tf.data.Dataset.from_tensor_slices((xs, ys)).batch(8), epochs=1, verbose=0)
print("fitted")
