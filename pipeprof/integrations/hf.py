"""Hugging Face ``Trainer``: ``PipeprofCallback`` (docs/integrations.md). Defined with the other
framework patches in ``pipeprof/attach/hf.py``; this is its public path."""

from pipeprof.attach.hf import PipeprofCallback

__all__ = ["PipeprofCallback"]
