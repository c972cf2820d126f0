"""What if the images were stored presized? An ImageFolder what-if, nothing to download.

    python examples/presize_whatif.py              # 128 JPEGs of 500×375, 2 workers
    python examples/presize_whatif.py --check      # and run a real DataLoader on the presized copy

Photo-like JPEGs (``pipeprof.demo.make_images``) are read by an ImageFolder whose transform
crops to 160 px. ``pipeprof.bench_encodings`` writes a fixed sample of them in other encodings
(JPEG at lower qualities, JPEG presized to the crop, PNG, WebP, npy, HDF5) and predicts the
samples/s with each, anchored to a 2-second real run of the JPEGs as they are. With ``--check``
the whole folder is written presized as the table's row says and a real DataLoader runs over the
copy, to hold the prediction against (docs/bench.md, "Storage encodings", has the validation).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from torch.utils.data import DataLoader, default_collate
from torchvision import datasets, transforms

import pipeprof
from pipeprof.bench.codecs import Codec, convert_folder
from pipeprof.bench.scaling import run_loader
from pipeprof.demo import make_images


def pipeline() -> transforms.Compose:
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(160),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
        ]
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--check", action="store_true", help="run a real loader on the presized copy")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = make_images(Path(tmp) / "jpeg", count=args.images)
        dataset = datasets.ImageFolder(str(root), transform=pipeline())
        loader = DataLoader(dataset, batch_size=16, num_workers=args.workers)
        result = pipeprof.bench_encodings(loader, samples=64)
        print(result)
        row = next(r for r in result["rows"] if r.get("presize"))
        print(f"presized: {row['predicted_samples_per_s']:.0f} samples/s predicted, "
              f"{row['speedup']:.2f}× the JPEGs as they are")  # fmt: skip
        if not args.check:
            return
        small = Path(tmp) / "presized"
        convert_folder(root, small, Codec(**row["codec"]))
        copy = datasets.ImageFolder(str(small), transform=pipeline())
        # steady samples/s of a real DataLoader, after every worker's first batch
        run = run_loader(copy, list(range(len(copy))), args.workers, 16, default_collate, 2.0,
                         row["predicted_samples_per_s"])  # fmt: skip
        measured = run["samples_per_s"]
        error = row["predicted_samples_per_s"] / measured - 1
        print(f"measured on the presized copy: {measured:.0f} samples/s ({error:+.0%} predicted "
              "vs measured)")  # fmt: skip


if __name__ == "__main__":
    main()
