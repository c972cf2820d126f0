"""PyTorch Lightning: ``PipeprofCallback`` (docs/integrations.md). Defined with the other
framework patches in ``pipeprof/attach/lightning.py``; this is its public path."""

from pipeprof.attach.lightning import PipeprofCallback

__all__ = ["PipeprofCallback"]
