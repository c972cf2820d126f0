"""The built-in demo: a realistic image pipeline on JPEGs it makes itself (nothing to download)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any


def make_images(
    root: str | os.PathLike[str],
    count: int = 256,
    size: tuple[int, int] = (500, 375),
    classes: int = 4,
    seed: int = 0,
) -> Path:
    """Write ``count`` photo-like JPEGs (gradients, shapes and noise) in ImageFolder layout."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = random.Random(seed)
    root = Path(root)
    noise = Image.effect_noise(size, 40).convert("RGB")
    for i in range(count):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        base = Image.linear_gradient("L").resize(size).convert("RGB")
        img = Image.blend(base, noise, 0.35)
        draw = ImageDraw.Draw(img)
        for _ in range(12):
            x, y = rng.randrange(size[0]), rng.randrange(size[1])
            r = rng.randrange(10, 90)
            color = tuple(rng.randrange(256) for _ in range(3))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=color)
        img.filter(ImageFilter.SMOOTH).save(folder / f"img{i:05d}.jpg", quality=90)
    return root


def demo_loader(root: str | os.PathLike[str], workers: int = 2, batch_size: int = 32) -> Any:
    """ImageFolder + decode + RandomResizedCrop/flip/jitter/normalise, ``workers`` processes."""
    try:
        from torch.utils.data import DataLoader
        from torchvision import datasets, transforms
    except ImportError as exc:
        raise ImportError(
            "the demo needs torch and torchvision: pip install 'pipeprof[torch]'"
        ) from exc
    chain = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(0.3, 0.3, 0.3),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    dataset = datasets.ImageFolder(str(root), transform=chain)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)


def tiny_model() -> Any:
    """A small CNN for 224×224 RGB images and 4 classes."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=4),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 4),
    )


def train(loader: Any, device: str, batches: int | None = None, sample_hz: float = 10.0) -> Any:
    """One epoch of real training under ``pipeprof.Profiler``; returns the Report. Ctrl-C stops
    the training early: the Report covers what was measured (``report["interrupted"]``)."""
    import torch

    from pipeprof.profiler import Profiler

    model = tiny_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    # On the CPU there is no copy to time; on a GPU pipeprof moves each batch (transfer/h2d).
    prof = Profiler(device=None if device == "cpu" else device, sample_hz=sample_hz)
    try:
        with prof:
            for i, (images, labels) in enumerate(prof.wrap(loader)):
                with prof.region("Forward"):
                    loss = loss_fn(model(images), labels)
                with prof.region("Backward"):
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                if batches is not None and i + 1 >= batches:
                    break
    except KeyboardInterrupt:  # the Profiler has stopped and marked its session interrupted
        pass
    return prof.report()
