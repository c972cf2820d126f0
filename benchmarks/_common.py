"""What several benchmarks share: the machine they ran on, and the issue-11 JPEG pipeline.

Benchmarks run as scripts (``python benchmarks/x.py``), so this directory is on ``sys.path``.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def machine() -> dict[str, Any]:
    """CPU model and count, Python, platform and the versions that shape the figures."""
    import PIL
    import torch
    import torchvision

    import pipeprof

    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model
            )
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pillow": PIL.__version__,
        "torch_threads": torch.get_num_threads(),
        "pipeprof": pipeprof.__version__,
    }


def compiled() -> None:
    """Compile pipeprof's modules, as installing it does. Run from a source tree where
    PYTHONDONTWRITEBYTECODE is set (as on this project's machines), a module changed since its
    last .pyc is compiled at every import: 31 ms for ``collect/torch/loader.py``, which
    ``pipeprof run`` imports when the script imports torch, and as much for each module
    imported inside a loop that is timed."""
    import compileall

    import pipeprof

    compileall.compile_dir(os.path.dirname(pipeprof.__file__), quiet=1)


def jpeg160_images(root: str, count: int = 1024) -> None:
    """The issue's JPEGs (``count`` of 160 x 160 px, ImageFolder layout) in ``root``, made once:
    a folder that has files already is used as it is."""
    from pipeprof.demo import make_images

    os.makedirs(root, exist_ok=True)
    if not any(os.scandir(root)):
        make_images(root, count=count, size=(160, 160))


def jpeg160_dataset(root: str) -> Any:
    """ImageFolder over ``root`` with the issue's augmentation: RandomResizedCrop(128), flip,
    ToTensor, Normalize (the images: ``pipeprof.demo.make_images(root, size=(160, 160))``)."""
    from torchvision import datasets, transforms

    chain = transforms.Compose(
        [
            transforms.RandomResizedCrop(128),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    return datasets.ImageFolder(root, transform=chain)


def emit(out: dict[str, Any], path: str | None) -> None:
    """A benchmark's results: printed as JSON, and written to ``path`` where one is given."""
    import json

    print(json.dumps(out, indent=1))
    if path:
        with open(path, "w") as f:
            json.dump(out, f, indent=1)
