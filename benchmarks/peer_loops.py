"""The loops of benchmarks/peers.py, each under one tool (``--tool``), printing its own meter.

    python benchmarks/peer_loops.py --work tiny --tool plain      # what peers.py runs, per round

Workloads (``--work``): ``tiny`` (issue 38's step: ``TensorDataset``, ``num_workers=0``, batch
8, a linear model, SGD, 3,000 steps), ``jpeg`` (160 px JPEGs, RandomResizedCrop + flip +
ToTensor + Normalize, batch 32, 2 workers, a small CNN, 2 epochs of 1,024 images), ``hf`` (the
held-out HF Trainer text classification, 60 steps in the training process). Tools
(``--tool``): ``plain``; ``hand`` (``pipeprof.Profiler`` by hand: ``wrap`` and the
Forward/Backward/Optimizer regions; for ``hf``, its ``PipeprofCallback``); ``traceml`` (TraceML's
``init()`` + ``trace_step`` as its README writes a plain loop; for ``hf`` its Trainer callback;
launched by ``traceml run``); ``torchprof`` (``torch.profiler.profile`` over the whole loop,
CPU activities, its trace written after the meter); ``collected`` (plain, with ``gc.collect()``
before the loop: the workers fork from a collected heap); ``frozen`` (the same, then
``gc.freeze()``). ``pipeprof run`` runs ``--tool plain``
under it. The meter: the loop's seconds, from the first ``next()`` to the last step's end
(for ``hf``, the Trainer's ``train_samples_per_second`` made seconds), printed as METERS.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def tool_context(tool: str) -> tuple[Any, Any]:
    """(the context the loop runs in, a per-step bracket maker ``step(model)``)."""
    if tool == "hand":
        import pipeprof

        prof = pipeprof.Profiler(sample_hz=10)
        return prof, prof
    if tool == "traceml":
        import traceml_ai as traceml

        traceml.init(mode="auto")
        return contextlib.nullcontext(), traceml
    if tool == "torchprof":
        from torch.profiler import ProfilerActivity, profile

        return profile(activities=[ProfilerActivity.CPU]), None
    return contextlib.nullcontext(), None


def loader_for(work: str, root: str) -> tuple[DataLoader, nn.Module, int]:
    torch.manual_seed(0)
    if work == "tiny":
        steps = 3000
        data = TensorDataset(torch.randn(steps * 8, 32), torch.randint(0, 4, (steps * 8,)))
        return DataLoader(data, batch_size=8), nn.Linear(32, 4), 1
    from _common import jpeg160_dataset, jpeg160_images

    images = os.path.join(root, "jpeg160")
    jpeg160_images(images)
    data = jpeg160_dataset(images)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        nn.Linear(128, len(data.classes)),
    )  # fmt: skip
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=2)
    return loader, model, 2


def batches(tool: str, ctx: Any, loader: DataLoader) -> Iterator[Any]:
    return iter(ctx.wrap(loader)) if tool == "hand" else iter(loader)


def train(tool: str, work: str, root: str) -> dict[str, float]:
    loader, model, epochs = loader_for(work, root)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ctx, stepper = tool_context(tool)
    region = ctx.region if tool == "hand" else (lambda _name: contextlib.nullcontext())
    steps = 0
    if tool in ("collected", "frozen"):  # plain, its heap collected before the workers fork
        gc.collect()
        if tool == "frozen":  # ... and kept out of every later collection
            gc.freeze()
    with ctx:
        t0 = time.perf_counter()
        for _ in range(epochs):
            for x, y in batches(tool, ctx, loader):
                traced = tool == "traceml"
                with stepper.trace_step(model) if traced else contextlib.nullcontext():
                    opt.zero_grad()
                    with region("Forward"):
                        loss = nn.functional.cross_entropy(model(x), y)
                    with region("Backward"):
                        loss.backward()
                    with region("Optimizer"):
                        opt.step()
                steps += 1
        loop_s = time.perf_counter() - t0
    if tool == "torchprof":
        ctx.export_chrome_trace(os.path.join(root, "torchprof.trace.json"))
    elif tool == "hand":
        ctx.report()
    return {"loop_s": loop_s, "steps": steps}


def train_hf(tool: str) -> dict[str, float]:
    """The held-out HF script's run, with the tool's Trainer callback."""
    import runpy

    sys.argv = ["hf_text.py", "--steps", "60"]
    if tool == "hand":
        from pipeprof.integrations.hf import PipeprofCallback

        _patch_trainer(PipeprofCallback())
    elif tool == "traceml":
        from traceml_ai.integrations import huggingface as tml

        tml.init()
        _patch_trainer(tml.TraceMLTrainerCallback())
    elif tool == "torchprof":
        _patch_trainer(None, torchprof=True)
    elif tool in ("collected", "frozen"):
        gc.collect()
        if tool == "frozen":
            gc.freeze()
    here = os.path.dirname(os.path.abspath(__file__))
    runpy.run_path(os.path.join(here, "heldout", "hf_text.py"), run_name="__main__")
    return {}


def _patch_trainer(callback: Any, torchprof: bool = False) -> None:
    """Add ``callback`` to every Trainer the script builds, or run its ``train()`` under
    torch.profiler."""
    import transformers

    base = transformers.Trainer

    class Traced(base):  # type: ignore[misc,valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            if callback is not None:
                k["callbacks"] = [*(k.get("callbacks") or []), callback]
            super().__init__(*a, **k)

        def train(self, *a: Any, **k: Any) -> Any:
            if torchprof:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]):
                    return super().train(*a, **k)
            return super().train(*a, **k)

    transformers.Trainer = Traced


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", choices=("tiny", "jpeg", "hf"), required=True)
    tools = ("plain", "collected", "frozen", "hand", "traceml", "torchprof")
    p.add_argument("--tool", choices=tools, default="plain")
    p.add_argument("--root", default=os.environ.get("PEERS_ROOT", "/tmp/pipeprof-peers"))
    args = p.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.root, exist_ok=True)
    if args.work == "hf":
        train_hf(args.tool)  # its script prints METERS itself
        return
    got = train(args.tool, args.work, args.root)
    print("METERS", json.dumps(got), flush=True)


if __name__ == "__main__":
    main()
