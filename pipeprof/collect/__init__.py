"""Collection: everything that measures a running pipeline and writes a Session.

``torch/`` (DataLoader stages inside the workers), ``tf/`` (tf.data from TensorFlow's profiler
trace, and the prefix benchmark that stands in for it), ``loop.py`` (a training loop's steps),
``timer.py`` (Deep500-style regions), ``samplers/`` (NVML and psutil threads). Collectors never
build a Report: the entry points (pipeprof/profiler.py, pipeprof/attach/) do.
"""
