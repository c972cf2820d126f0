"""Held-out script 5: Hugging Face Trainer text classification, as a tutorial writes it.

A word-piece tokenizer trained on the fly (nothing to download), a small BERT built from a
config, a dataset that tokenizes each text when it is read and returns lists (the tutorials'
``dataset.map(tokenize)`` without the cache), ``DataCollatorWithPadding``. The Trainer's own
meter, ``train_samples_per_second``, is printed as METERS.
"""

import argparse
import json
import random
import tempfile
import warnings

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)
from transformers.utils import logging

warnings.filterwarnings("ignore")
logging.set_verbosity_error()
p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=0)
p.add_argument("--steps", type=int, default=60)
args = p.parse_args()

rng = random.Random(0)
WORDS = [f"w{i}" + "abcdefgh"[i % 8] * (1 + i % 5) for i in range(3000)]
texts = [" ".join(rng.choices(WORDS, k=rng.randint(40, 200))) for _ in range(4000)]
labels = [len(t) % 2 for t in texts]

raw = Tokenizer(models.WordPiece(unk_token="[UNK]"))
raw.normalizer = normalizers.BertNormalizer()
raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
raw.train_from_iterator(texts[:500], trainers.WordPieceTrainer(
    vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]",
                                    cls_token="[CLS]", sep_token="[SEP]")


class Reviews(torch.utils.data.Dataset):
    def __len__(self):
        return len(texts)

    def __getitem__(self, i):
        enc = tokenizer(texts[i], truncation=True, max_length=256)
        return {**enc, "labels": labels[i]}


config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=128, max_position_embeddings=256)
model = BertForSequenceClassification(config)
with tempfile.TemporaryDirectory() as out:
    targs = TrainingArguments(
        output_dir=out, per_device_train_batch_size=16, max_steps=args.steps,
        dataloader_num_workers=args.workers, report_to=[], save_strategy="no",
        logging_strategy="no", use_cpu=True, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=Reviews(),
                      data_collator=DataCollatorWithPadding(tokenizer))
    metrics = trainer.train().metrics
print("METERS", json.dumps({"samples_per_s": metrics["train_samples_per_second"]}))
