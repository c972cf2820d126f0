"""Token batches' padding (NOTE [ Padding ] in analyze/tokens.py): a real ``transformers``
tokenizer built here (no hub), its ``DataCollatorWithPadding``, sequences of known lengths."""

from __future__ import annotations

import pytest
import torch
from pipelines import plain_and_profiled, same_batches, spin
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
    """``n`` texts of ``lengths[i % len(lengths)]`` words, tokenized in ``__getitem__``."""

    def __init__(self, lengths: list[int], n: int = 32) -> None:
        self.lengths = lengths
        self.n = n
        self.tok = _tokenizer()

    def __len__(self) -> int:
        return self.n

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


@pytest.mark.timing
@pytest.mark.parametrize(("lengths", "fires"), [([2, 4, 8, 16], True), ([6, 7, 8, 8], False),
                                                ([8], False)])  # fmt: skip
def test_padding_that_wastes_the_compute_is_a_finding(lengths, fires):
    """A compute-bound loop (3 ms of compute a step) over batches padded 53 %: the finding, a
    warning, with the compute a step the pads stand for. Near misses: 9 % of pads (lengths 6 to
    8), none. Profiling the loader alone (no loop): information, with no compute figure."""
    from transformers import DataCollatorWithPadding

    from pipeprof.analyze.tokens import PAD_WASTE

    data = Texts(lengths)
    loader = DataLoader(data, batch_size=4, collate_fn=DataCollatorWithPadding(data.tok))
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(loader):
            spin(3.0)
    report = prof.report().to_dict()
    share = report["tokens"]["padding_share"]
    found = {f["id"]: f for f in report["findings"]}
    assert ("padding" in found) == fires == (share >= PAD_WASTE)
    if not fires:
        return
    f = found["padding"]
    assert f["severity"] == "warning" and f["stage"] == "collate"
    ev = f["evidence"]
    assert ev["padding_share"] == pytest.approx(34 / 64) and ev["pad_tokens"] == 8 * 34
    assert ev["compute_ms_per_step"] >= 3.0 and ev["compute_fraction"] >= 0.5
    assert ev["pad_compute_ms_per_step"] == pytest.approx(ev["compute_ms_per_step"] * 34 / 64)
    assert "group_by_length=True" in f["fix"] and "53% of the batches' tokens" in f["message"]
    alone = pipeprof.profile(loader).to_dict()
    f = {f["id"]: f for f in alone["findings"]}["padding"]
    assert f["severity"] == "info" and "compute_ms_per_step" not in f["evidence"]


def test_batches_without_an_attention_mask_have_no_token_figures():
    """Plain tensors (and a mapping without ``attention_mask``) are not token batches."""
    loader = DataLoader([{"x": torch.ones(3)} for _ in range(8)], batch_size=4)
    d = pipeprof.profile(loader).to_dict()
    assert "tokens" not in d


class RawTexts(Dataset):  # type: ignore[type-arg]
    """The same 32 texts, untokenized: the collate_fn tokenizes a batch a call."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> str:
        return " ".join(WORDS[(i + k) % 32] for k in range(1 + i % 16))


class TokenizeBatch:
    def __init__(self, tok) -> None:  # type: ignore[no-untyped-def]
        self.tok = tok

    def __call__(self, texts):  # type: ignore[no-untyped-def]
        return self.tok(texts, padding=True, return_tensors="pt")


@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_a_tokenizer_called_once_a_text_is_a_stage_and_the_fix_says_once_a_batch(context):
    """``__getitem__`` tokenizes its text (512 calls of one text): ``load/tokenize``, a fast
    tokenizer's, counted in the training process and in 2 workers (a spawned one patches its
    own class); the verdict's stage, and the fix is to call it once a batch
    (benchmarks/tokenize_batched.py followed it).

    The tokenizer's calls cost about 2.5 times the collator's. 512 texts (~25 ms of calls, not
    32's ~2 ms) so that a slice of CPU taken by another program while a worker collates a batch
    cannot outweigh them: with 32, one did (a landing's CI, two tests at a time)."""
    from transformers import DataCollatorWithPadding
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    plain_call = PreTrainedTokenizerBase.__call__
    data = Texts([1, 2, 4, 8, 16, 32], n=512)
    kw = {"num_workers": 2, "multiprocessing_context": context} if context else {}
    collate = DataCollatorWithPadding(data.tok, return_tensors="pt")
    # batches of 8: the collator's 64 calls cost less than the 512 tokenizer calls
    loader = DataLoader(data, batch_size=8, collate_fn=collate, **kw)
    profiled = pipeprof.profile(loader, stage_every=1)  # every call counted
    report = profiled.to_dict()
    said = "tokenizer: 512 calls, 1 texts and"
    assert said in profiled.render("text") and said in profiled.render("html")
    assert PreTrainedTokenizerBase.__call__ is plain_call  # put back once the profile ends
    assert report["stages"]["load/tokenize"]["count"] == 512
    tok = report["tokens"]["tokenizer"]
    assert (tok["calls"], tok["texts"]) == (512, 512)
    assert (tok["fast_share"], tok["releases_gil"]) == (1, True)
    assert report["verdict"]["stage"] == "load/tokenize"
    dominant = next(f for f in report["findings"] if f["id"] == "dominant-stage")
    assert "called once a text" in dominant["fix"] and "once a batch" in dominant["fix"]


def test_a_batch_a_call_in_the_collate_fn_counts_each_text():
    """The fix followed: the collate_fn tokenizes a batch's 4 texts in one call
    (``collate/tokenize``, 8 calls of 4 texts), and the batches are the plain loader's."""
    tok = _tokenizer()
    plain, got, prof = plain_and_profiled(
        DataLoader(RawTexts(), batch_size=4, collate_fn=TokenizeBatch(tok))
    )
    assert same_batches(plain, got)
    report = prof.report().to_dict()
    assert report["stages"]["collate/tokenize"]["count"] == 8
    assert report["tokens"]["tokenizer"]["texts"] == 32
    assert report["tokens"]["tokenizer"]["calls"] == 8


def test_the_loops_own_tokenizer_calls_are_not_the_pipelines():
    """The near miss: the loop tokenizes between batches (a prompt for logging); the dataset
    gives tensors. No tokenize stage, no tokenizer figures."""
    tok = _tokenizer()
    loader = DataLoader([torch.ones(3) for _ in range(16)], batch_size=4)
    prof = pipeprof.Profiler(sample_hz=0)
    with prof:
        for _ in prof.wrap(loader):
            tok("w1 w2 w3")
    report = prof.report().to_dict()
    assert not any(path.endswith("tokenize") for path in report["stages"])
    assert "tokens" not in report


def test_the_tokenize_fix_follows_what_the_calls_were():
    from pipeprof.analyze.rules import tokenize_fix

    def calls(texts: int, fast: bool | None) -> dict:
        return {"calls": 10, "texts": texts, "ms_per_call": 0.2, "releases_gil": fast}

    assert "called once a text (0.2 ms a call)" in tokenize_fix(calls(10, True))
    assert "use_fast=True" in tokenize_fix(calls(320, False))
    assert "save_to_disk" in tokenize_fix(calls(320, True))
