"""Held-out script 4: Keras image classification from a directory of JPEGs (tf.data made by
keras.utils.image_dataset_from_directory), an augmentation map, model.fit."""

import argparse
import os
import tempfile

import keras
import tensorflow as tf

from pipeprof.demo import make_images

p = argparse.ArgumentParser()
p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pipeprof-heldout-jpeg"))
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()
if not os.path.isdir(args.data):
    make_images(args.data, count=512, size=(160, 160))
data = keras.utils.image_dataset_from_directory(args.data, image_size=(96, 96), batch_size=32,
                                                verbose=False)  # fmt: skip


def augment(images, labels):
    return tf.image.random_flip_left_right(images) / 255.0, labels


data = data.map(augment).prefetch(tf.data.AUTOTUNE)
model = keras.Sequential([
    keras.Input((96, 96, 3)), keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
    keras.layers.Conv2D(32, 3, strides=2, activation="relu"), keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(4),
])  # fmt: skip
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(data, epochs=args.epochs, verbose=0)
print("fitted")
