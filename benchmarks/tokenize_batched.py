"""The dominant-stage fix for ``*/tokenize``, followed: a text dataset tokenized one text a call
in ``__getitem__`` against the same texts tokenized a batch a call in the ``collate_fn``.

A real ``transformers`` fast tokenizer built here (a word-level vocabulary, no hub), 2,048 texts
of 8 to 128 words, batches of 32 padded to their longest text; plain loaders (no pipeprof),
interleaved rounds, the median samples/s of each. Then pipeprof's view of the per-text loader:
its tokenizer line and the finding's fix.

    .venv/bin/python benchmarks/tokenize_batched.py --rounds 5   # ~1 min
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _common import emit

WORDS = [f"w{i}" for i in range(512)]


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def texts(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 7 + k) % 512] for k in range(8 + (i * 37) % 121)) for i in range(n)]


class PerText:
    """``__getitem__`` tokenizes its text: one call a text."""

    def __init__(self, data: list[str], tok: Any) -> None:
        self.data, self.tok = data, tok

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return self.tok(self.data[i])


class Texts:
    """The texts as they are; the ``collate_fn`` tokenizes a batch at once."""

    def __init__(self, data: list[str]) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> str:
        return self.data[i]


class BatchTokenize:
    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def __call__(self, batch: list[str]) -> Any:
        return self.tok(batch, padding=True, return_tensors="pt")


def loaders(n: int, workers: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader
    from transformers import DataCollatorWithPadding

    tok, data = tokenizer(), texts(n)
    kw: dict[str, Any] = {"batch_size": 32, "num_workers": workers}
    return {
        "per text": DataLoader(
            PerText(data, tok), collate_fn=DataCollatorWithPadding(tok, return_tensors="pt"), **kw
        ),
        "a batch a call": DataLoader(Texts(data), collate_fn=BatchTokenize(tok), **kw),
    }


def rate(loader: Any) -> float:
    t0, samples = time.perf_counter(), 0
    for batch in loader:
        samples += int(batch["input_ids"].shape[0])
    return samples / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    import pipeprof

    made = loaders(args.samples, args.workers)
    rates: dict[str, list[float]] = {name: [] for name in made}
    for r in range(args.rounds):
        for name in list(made)[:: 1 if r % 2 == 0 else -1]:
            rates[name].append(rate(made[name]))
    medians = {name: statistics.median(v) for name, v in rates.items()}
    report = pipeprof.profile(made["per text"]).to_dict()
    dominant = [f for f in report["findings"] if f["id"] == "dominant-stage"]
    out = {
        "samples": args.samples,
        "workers": args.workers,
        "rounds": rates,
        "median_samples_per_s": medians,
        "speedup": round(medians["a batch a call"] / medians["per text"], 3),
        "tokenizer": report["tokens"]["tokenizer"],
        "dominant_stage": dominant[0]["stage"] if dominant else None,
        "fix": dominant[0]["fix"] if dominant else None,
    }
    emit(out, args.json)


if __name__ == "__main__":
    main()
