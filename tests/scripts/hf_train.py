"""A tiny real Hugging Face Trainer script for tests/test_integrations_frameworks.py: a BERT
built from a config (no download), fake token data; each sample costs ``--load-ms`` to load, the
collator ``--collate-ms`` a batch, each step ``--step-ms`` of compute (known, injected costs).
Without ``--callback`` it has no pipeprof in it (``pipeprof run`` adds the callback itself)."""

import argparse
import tempfile
import time
import warnings

import torch
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.utils import logging

warnings.filterwarnings("ignore")
logging.set_verbosity_error()


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, ms):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.ms / 1000)
        return {"input_ids": torch.arange(i, i + 8) % 100, "labels": i % 2}


class Collator:
    """Pads nothing (fixed length); costs ``ms`` a batch."""

    def __init__(self, ms):
        self.ms = ms

    def __call__(self, samples):
        time.sleep(self.ms / 1000)
        return {
            "input_ids": torch.stack([s["input_ids"] for s in samples]),
            "labels": torch.tensor([s["labels"] for s in samples]),
        }


class SlowStep(TrainerCallback):
    """The step's known compute: ``ms`` before each optimizer step."""

    def __init__(self, ms, raise_at):
        self.ms, self.raise_at = ms, raise_at

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        time.sleep(self.ms / 1000)
        if state.global_step == self.raise_at:
            raise RuntimeError(f"boom at step {state.global_step}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--load-ms", type=float, default=1.0)
    p.add_argument("--collate-ms", type=float, default=2.0)
    p.add_argument("--step-ms", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--eval-steps", type=int, default=0)
    p.add_argument("--callback", default=None, help="add pipeprof's callback; save its report here")
    p.add_argument("--raise-at", type=int, default=-1)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    model = AutoModelForSequenceClassification.from_config(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            num_train_epochs=args.epochs,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            logging_steps=2,
            disable_tqdm=True,
            dataloader_num_workers=args.workers,
            eval_strategy="steps" if args.eval_steps else "no",
            eval_steps=args.eval_steps or None,
            seed=0,
        )
        callbacks = [SlowStep(args.step_ms, args.raise_at)]
        if args.callback:
            from pipeprof.integrations.hf import PipeprofCallback

            callbacks.append(PipeprofCallback(save=args.callback))
        trainer = Trainer(
            model=model,
            args=training,
            train_dataset=Tokens(args.samples, args.load_ms),
            eval_dataset=Tokens(16, args.load_ms),
            data_collator=Collator(args.collate_ms),
            callbacks=callbacks,
        )
        trainer.remove_callback(PrinterCallback)  # its logs hold timings: stdout is compared
        result = trainer.train()
    print("steps", result.global_step, "loss", round(result.training_loss, 4), flush=True)


if __name__ == "__main__":
    main()
