"""Token batches' padding (NOTE [ Padding ]).

NOTE [ Padding ]
A language model's batch pads its sequences to the longest one (or to a fixed length): the pad
tokens are computed on like the real ones, then masked out. Where a batch is a mapping with a
2-D ``attention_mask`` tensor (what Hugging Face's collators and tokenizers make: 1 a real
token, 0 a pad), the collate wrapper counts its ones and its size, in the batches whose stages
are timed, in whichever process collated them; the padding share is the pad tokens over all
tokens. Counting is one ``sum`` over the mask, outside the collate's time.

The model computes on the pads as on real tokens, so the pads' share of the tokens is about
their share of the compute where its cost follows the tokens (the projections and the MLPs;
attention, quadratic in the length, wastes more on long padded rows). From PAD_WASTE on, the
``padding`` finding says so, with the compute a step that share stands for, and the fix:
batches of sequences of similar lengths, or packed rows. It is a warning where the loop is
compute-bound (the pads' compute is in the loop's time), else information.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pipeprof.analyze.finding import Finding, Severity, finding
from pipeprof.analyze.verdict import loop_view
from pipeprof.core.session import Session

PAD_WASTE = 0.25  # pad tokens from this share of the tokens on: the ``padding`` finding
COMPUTING = 0.5  # the loop's compute share from which the pads' compute is a warning


class TokenizerCalls(TypedDict):
    """A Hugging Face tokenizer's calls in the pipeline (NOTE [ Tokenizer calls ] in
    collect/tokenizer.py), over the timed batches."""

    calls: int
    texts: int  # a batch call's list counts each text
    ms_per_call: float
    ms_per_text: float
    fast_share: float  # the calls made by a fast (Rust) tokenizer
    releases_gil: bool | None  # every call's tokenizer fast (True), none (False), or both (None)


class Tokens(TypedDict):
    """The padding of the token batches seen (the timed ones), and the tokenizer's calls."""

    batches: int
    tokens: int  # all positions, pads included
    pad_tokens: int
    padding_share: float | None  # pad_tokens / tokens; None where no batch held a mask
    tokenizer: TokenizerCalls | None  # None where no tokenizer was called in the pipeline


def tokens_section(session: Session) -> Tokens | None:
    """The padding and tokenizer figures, or None where there were neither."""
    t = session.tokens
    total, real = int(t.get("total") or 0), int(t.get("real") or 0)
    tok = tokenizer_calls(t)
    if not total and tok is None:
        return None
    return {
        "batches": int(t.get("batches") or 0),
        "tokens": total,
        "pad_tokens": total - real,
        "padding_share": round((total - real) / total, 6) if total else None,
        "tokenizer": tok,
    }


def tokenizer_calls(t: dict[str, int]) -> TokenizerCalls | None:
    calls = int(t.get("calls") or 0)
    if not calls:
        return None
    texts, ns = int(t.get("texts") or 0), int(t.get("call_ns") or 0)
    fast = int(t.get("fast_calls") or 0)
    return {
        "calls": calls,
        "texts": texts,
        "ms_per_call": round(ns / calls / 1e6, 6),
        "ms_per_text": round(ns / max(1, texts) / 1e6, 6),
        "fast_share": round(fast / calls, 6),
        "releases_gil": True if fast == calls else False if not fast else None,
    }


PADDING_FIX = (
    "put sequences of similar lengths in the same batch: TrainingArguments(group_by_length=True) "
    "under the Hugging Face Trainer, else a sampler that sorts by length within groups of a few "
    "batches (transformers.trainer_pt_utils.LengthGroupedSampler(batch_size, lengths=...)); or "
    "pack several sequences into each row, with no pads at all. Pad to the batch's longest "
    "(padding='longest', DataCollatorWithPadding's default), not to a fixed max_length"
)


def rule_padding(report: dict[str, Any], facts: dict[str, Any]) -> Finding | None:
    """Token batches whose pads take PAD_WASTE of their tokens or more (NOTE [ Padding ])."""
    tok = report.get("tokens") or {}
    share = tok.get("padding_share")
    if share is None or share < PAD_WASTE:
        return None
    evidence: dict[str, Any] = {k: tok[k] for k in ("padding_share", "pad_tokens", "tokens",
                                                      "batches")}  # fmt: skip
    said = ""
    severity: Severity = "info"
    loop = report.get("loop")
    if loop:
        computing = loop_view(loop).get("compute_fraction") or 0.0
        ms = (loop.get("compute_ms") or {}).get("mean_ms")
        evidence["compute_fraction"] = computing
        if ms:
            evidence["compute_ms_per_step"] = ms
            evidence["pad_compute_ms_per_step"] = round(ms * share, 6)
            said = f": about {ms * share:.3g} ms of each step's {ms:.3g} ms of compute"
        if computing >= COMPUTING:
            severity = "warning"
    return finding(
        "padding", severity, "collate",
        f"{share:.0%} of the batches' tokens are padding ({tok['pad_tokens']:,} of "
        f"{tok['tokens']:,}), computed on and masked out{said}",
        evidence, PADDING_FIX,
    )  # fmt: skip


TOKEN_RULES = [rule_padding]
