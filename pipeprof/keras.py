"""Keras ``fit()``: ``ProfilerCallback`` (docs/tfdata.md). Defined with the other framework
patches in ``pipeprof/attach/keras.py``; this is its public path (it imports TensorFlow)."""

from pipeprof.attach.keras import ProfilerCallback

__all__ = ["ProfilerCallback"]
