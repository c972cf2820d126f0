"""Validate ``pipeprof.bench_encodings``: the throughput predicted for a switched encoding
against a real DataLoader run over the dataset written in it.

    .venv/bin/python benchmarks/encodings_validation.py                 # 3 rounds, ~1 minute
    .venv/bin/python benchmarks/encodings_validation.py --rounds 5 --json enc.json
    ENC_WORKERS=1 .venv/bin/python benchmarks/encodings_validation.py   # at 1 worker
    ENC_CROP=160 .venv/bin/python benchmarks/encodings_validation.py --width 500 --height 375

An ImageFolder of photo-like JPEGs (``pipeprof.demo.make_images``, 320×320 or ``--width`` ×
``--height``, quality 90) with RandomResizedCrop(128) (or ``ENC_CROP``), flip and ToTensor,
batches of 16. ``bench_encodings`` predicts the samples/s at 2 workers with the files as they
are and with each candidate; the whole dataset is then written presized (``convert_folder``, the
row's codec) and as raw ``.npy`` files, and a real DataLoader with 2 workers runs over each
(``pipeprof.bench.scaling.run_loader``: steady samples/s after every worker's first batch).
"predict" is the figure ``bench_encodings`` printed: the current files' rate measured in its own
short run over the sample set, times the row's predicted gain (NOTE [ Anchored to a real run ]).
"model" is the model alone (no run), re-predicted for the cores other programs used during each
run, as ``pipeprof.bench``'s scaling table does. Error = predicted / measured - 1. "run CPU" is
the model fed the CPU per batch the workers really used in the run (the scaling model alone,
apart from how far the stand-alone costs drift on a shared VM); "gain error" compares the
model's gain over the current files (rate with the encoding ÷ rate with the files) with the
measured one, runs back to back. The runs of a round start with a different encoding each round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate
from torchvision import datasets, transforms

import pipeprof
from pipeprof.analyze import whatif
from pipeprof.bench.codecs import Codec, convert_folder
from pipeprof.bench.scaling import run_loader
from pipeprof.demo import make_images

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whatif_validation import with_cpu

WORKERS, BATCH = int(os.environ.get("ENC_WORKERS", "2")), 16


CROP = int(os.environ.get("ENC_CROP", "128"))


def chain() -> Any:
    return transforms.Compose(
        [transforms.RandomResizedCrop(CROP), transforms.RandomHorizontalFlip(),
         transforms.ToTensor()]
    )  # fmt: skip


class NpyFolder(Dataset):  # type: ignore[type-arg]
    """The ImageFolder's images as raw uint8 ``.npy`` files, read back as PIL images."""

    def __init__(self, images: datasets.ImageFolder, root: str) -> None:
        self.paths, self.transform = [], images.transform
        os.makedirs(root, exist_ok=True)
        for i, (path, target) in enumerate(images.samples):
            out = os.path.join(root, f"{i:05d}.npy")
            np.save(out, np.asarray(Image.open(path).convert("RGB")))
            self.paths.append((out, target))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> Any:
        path, target = self.paths[i]
        return self.transform(Image.fromarray(np.load(path))), target


def measured(ds: Any, e: Any, name: str, seconds: float) -> dict[str, Any]:
    """A real run with WORKERS workers, and the row's prediction for it."""
    pred = e.predict(name)
    row = run_loader(ds, list(range(len(ds))), WORKERS, BATCH, default_collate, seconds, pred)
    base = replace(e.models[name], cores=float(e.bench.cores), background=0.0)
    others = row.get("others_cores") or 0.0
    bg = whatif.background_for(base, WORKERS, others) if others else 0.0
    fitted = replace(base, background=bg)
    model = whatif.throughput(fitted, WORKERS)
    x = row["samples_per_s"]
    alone = base.batch_ms()[1]
    f = row["worker_cpu_ms"] / alone if row.get("worker_cpu_ms") else None
    run_cpu = whatif.throughput(with_cpu(fitted, f), WORKERS) if f else None
    return {"cpu_inflation": round(f, 3) if f else None, "main_cpu_ms": row.get("main_cpu_ms"),
            "main_ms": round(base.main_ms, 3),
            "run_cpu_error": round(run_cpu / x - 1, 4) if run_cpu else None,
            "encoding": name, "predicted": round(pred, 1), "model": round(model, 1),
            "model_alone": next(r for r in e.rows if r["encoding"] == name)[
                "model_samples_per_s"],
            "measured": x, "error": round(model / x - 1, 4),
            "predict_error": round(pred / x - 1, 4), "others_cores": others}  # fmt: skip


def one_round(
    root: str, tmp: str, samples: int, seconds: float, turn: int = 0
) -> list[dict[str, Any]]:
    ds = datasets.ImageFolder(root, transform=chain())
    e = pipeprof.bench_encodings(ds, samples=samples, workers=WORKERS, batch_size=BATCH)
    print(e.render("text", width=120))
    sized = next(r for r in e.rows if r.get("presize"))
    codec = Codec(**sized["codec"])
    small = os.path.join(tmp, f"presized-{os.getpid()}")
    if not os.path.isdir(small):
        convert_folder(root, small, codec)
    npy = NpyFolder(ds, os.path.join(tmp, "npy"))
    todo = [
        (ds, e.rows[0]["encoding"]),
        (datasets.ImageFolder(small, transform=chain()), sized["encoding"]),
        (npy, "npy (raw)"),
    ]
    # Each round starts with a different encoding, so that none is always the first run after
    # the stand-alone timings (or always the last): the order's effects spread over all three.
    order = [(turn + i) % len(todo) for i in range(len(todo))]
    done = {i: measured(todo[i][0], e, todo[i][1], seconds) for i in order}
    runs = [done[i] for i in range(len(todo))]
    for r in runs[1:]:  # the gain over the current files, predicted vs measured back to back
        gain = r["model_alone"] / runs[0]["model_alone"]
        real = r["measured"] / runs[0]["measured"]
        r["gain_predicted"], r["gain_measured"] = round(gain, 4), round(real, 4)
        r["gain_error"] = round(gain / real - 1, 4)
    for r in runs:
        print(f"{r['encoding']:28} predicted {r['predicted']:7.1f} model {r['model']:7.1f} "
              f"measured {r['measured']:7.1f} error {r['error']:+.1%} "
              f"(predict {r['predict_error']:+.1%}), others {r['others_cores']:.2f} cores, "
              f"cpu× {r['cpu_inflation']}, run CPU {r['run_cpu_error']:+.1%}")  # fmt: skip
    return runs


def summarize(runs: list[dict[str, Any]]) -> None:
    print(
        f"\n{'encoding':28} {'runs':>4} {'predict, median':>15} {'worst':>7} "
        f"{'model, median':>13} {'worst':>7} {'run CPU':>8} {'gain error':>11}"
    )
    for name in dict.fromkeys(r["encoding"] for r in runs):
        mine = [r for r in runs if r["encoding"] == name]
        pes, errs = [r["predict_error"] for r in mine], [r["error"] for r in mine]
        rc = statistics.median(r["run_cpu_error"] for r in mine if r["run_cpu_error"] is not None)
        gains = [r["gain_error"] for r in mine if "gain_error" in r]
        ge = f"{statistics.median(gains):+.1%}" if gains else ""
        print(
            f"{name:28} {len(mine):4d} {statistics.median(pes):+15.1%} "
            f"{max(pes, key=abs):+7.1%} {statistics.median(errs):+13.1%} "
            f"{max(errs, key=abs):+7.1%} {rc:+8.1%} {ge:>11}"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--images", type=int, default=96)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--height", type=int, default=320)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--json", default=None)
    p.add_argument("--summarize", default=None, help="print the table of a saved --json file")
    args = p.parse_args()
    if args.summarize:
        with open(args.summarize) as f:
            summarize(json.load(f)["runs"])
        return 0
    torch.set_num_threads(1)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "jpeg")
        make_images(root, count=args.images, size=(args.width, args.height))
        for turn in range(args.rounds):
            runs += one_round(root, tmp, args.samples, args.seconds, turn)
    summarize(runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"python": sys.version.split()[0], "torch": torch.__version__,
                       "cores": os.cpu_count(), "runs": runs}, f, indent=2)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
