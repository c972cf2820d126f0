"""Per-step cost of pipeprof's framework callbacks (pipeprof.integrations), side by side.

Each case trains a tiny model on data that costs nothing (no workers, a 16-sample batch of an
8-vector for Lightning, 8 fake 8-token sequences for a 1-layer BERT built from a config for the
Hugging Face Trainer, a 2-layer MLP on a batched tf.data dataset for Keras ``fit()``), ``--steps``
steps, with and without pipeprof's callback. Rounds are
interleaved (plain, profiled, plain, ...), so a noisy neighbour slows both alike; the figure is
the median over rounds of the training call's wall time divided by its steps.

    python benchmarks/callback_cost.py                       # both frameworks, 5 rounds
    python benchmarks/callback_cost.py --only lightning --rounds 7 --json callback_cost.json

The Trainer needs ``accelerate`` (``pip install 'pipeprof[hf]'``); without it the Hugging Face
case is skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

warnings.filterwarnings("ignore")


def lightning_case(steps: int) -> Callable[[bool], float]:
    import lightning as L
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from pipeprof.integrations.lightning import PipeprofCallback

    logging_off()
    data = TensorDataset(torch.randn(16 * steps, 8), torch.randint(0, 2, (16 * steps,)))

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def run(profiled: bool) -> float:
        trainer = L.Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[PipeprofCallback(sample_hz=0)] if profiled else [],
        )
        t0 = time.perf_counter()
        trainer.fit(Model(), DataLoader(data, batch_size=16))
        return (time.perf_counter() - t0) / steps

    return run


def hf_case(steps: int) -> Callable[[bool], float]:
    from transformers import (
        AutoModelForSequenceClassification,
        BertConfig,
        PrinterCallback,
        Trainer,
        TrainingArguments,
    )

    from pipeprof.integrations.hf import PipeprofCallback

    logging_off()
    data = [{"input_ids": torch.arange(i, i + 8) % 100, "labels": i % 2} for i in range(8 * steps)]
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
    )

    def run(profiled: bool) -> float:
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory() as out:
            args = TrainingArguments(
                output_dir=out,
                per_device_train_batch_size=8,
                report_to=[],
                use_cpu=True,
                save_strategy="no",
                disable_tqdm=True,
                logging_strategy="no",
                num_train_epochs=1,
            )
            trainer = Trainer(
                model=AutoModelForSequenceClassification.from_config(config),
                args=args,
                train_dataset=data,
                callbacks=[PipeprofCallback(sample_hz=0)] if profiled else [],
            )
            trainer.remove_callback(PrinterCallback)
            t0 = time.perf_counter()
            trainer.train()
            return (time.perf_counter() - t0) / steps

    return run


def keras_case(steps: int) -> Callable[[bool], float]:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf

    import pipeprof.keras

    x = np.random.default_rng(0).standard_normal((16 * steps, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

    def run(profiled: bool) -> float:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(2)])  # fmt: skip
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        cb = [pipeprof.keras.ProfilerCallback(data)] if profiled else []
        model.fit(data.take(2), epochs=1, verbose=0)  # compiles the train function: not timed
        t0 = time.perf_counter()
        model.fit(data, epochs=1, verbose=0, callbacks=cb)
        return (time.perf_counter() - t0) / steps

    return run


def logging_off() -> None:
    import logging

    for name in ("lightning", "lightning.pytorch", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def measure(run: Callable[[bool], float], rounds: int) -> dict[str, float]:
    run(False), run(True)  # warm-up: imports, first-call costs
    plain, profiled = [], []
    for _ in range(rounds):
        plain.append(run(False))
        profiled.append(run(True))
    p, q = statistics.median(plain), statistics.median(profiled)
    return {
        "plain_us": round(p * 1e6, 1),
        "profiled_us": round(q * 1e6, 1),
        "added_us": round((q - p) * 1e6, 1),
        "ratio": round(q / p, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", choices=["lightning", "hf", "keras"], default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = {"lightning": lightning_case, "hf": hf_case, "keras": keras_case}
    results = {}
    for name, make in cases.items():
        if args.only not in (None, name):
            continue
        if name == "hf" and importlib.util.find_spec("accelerate") is None:
            print("hf: skipped (the Trainer needs accelerate: pip install 'pipeprof[hf]')")
            continue
        results[name] = r = measure(make(args.steps), args.rounds)
        print(
            f"{name}: {r['plain_us']:.0f} µs a step plain, {r['profiled_us']:.0f} µs with "
            f"pipeprof's callback: +{r['added_us']:.0f} µs (x{r['ratio']:.3f})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "rounds": args.rounds, **results}, f, indent=1)


if __name__ == "__main__":
    main()
