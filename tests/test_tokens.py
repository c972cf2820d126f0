"""Token batches' padding (NOTE [ Padding ] in analyze/tokens.py): a real ``transformers``
tokenizer built here (no hub), its ``DataCollatorWithPadding``, sequences of known lengths."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof

WORDS = [f"w{i}" for i in range(32)]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


class Texts(Dataset):  # type: ignore[type-arg]
    """32 texts of ``lengths[i % len(lengths)]`` words, tokenized in ``__getitem__``."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.tok = _tokenizer()

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        n = self.lengths[i % len(self.lengths)]
        return self.tok(" ".join(WORDS[(i + k) % 32] for k in range(n)))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("lengths", "share"), [([2, 4, 8, 16], 34 / 64), ([8], 0.0)])
def test_the_padding_share_of_token_batches(workers, lengths, share):
    """Batches of 4 texts of 2, 4, 8 and 16 tokens, padded to 16: 34 of 64 positions are pads;
    texts all of 8 tokens (the near miss, as packed sequences are): none. Counted in the
    training process and in fork workers; the batches are the collator's, unchanged."""
    from test_report import _schema_shape
    from transformers import DataCollatorWithPadding

    from pipeprof.analyze.tokens import Tokens

    data = Texts(lengths)
    collate = DataCollatorWithPadding(data.tok, return_tensors="pt")
    kw = {"multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(data, batch_size=4, num_workers=workers, collate_fn=collate, **kw)
    plain = list(loader)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        got = list(prof.wrap(loader))
    assert len(got) == len(plain) == 8
    for a, b in zip(plain, got):
        assert type(a) is type(b) and a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    report = prof.report()
    t = report.to_dict()["tokens"]
    assert t.keys() == Tokens.__annotations__.keys() == _schema_shape("tokens").keys()
    assert t["batches"] == 8 and t["tokens"] == 8 * 4 * max(lengths)
    assert t["padding_share"] == pytest.approx(share)
    assert f"padding: {share:.0%} of the tokens are pad tokens" in report.render("text")


def test_batches_without_an_attention_mask_have_no_token_figures():
    """Plain tensors (and a mapping without ``attention_mask``) are not token batches."""
    loader = DataLoader([{"x": torch.ones(3)} for _ in range(8)], batch_size=4)
    d = pipeprof.profile(loader).to_dict()
    assert "tokens" not in d
