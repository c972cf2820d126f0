"""Token batches' padding (NOTE [ Padding ]).

NOTE [ Padding ]
A language model's batch pads its sequences to the longest one (or to a fixed length): the pad
tokens are computed on like the real ones, then masked out. Where a batch is a mapping with a
2-D ``attention_mask`` tensor (what Hugging Face's collators and tokenizers make: 1 a real
token, 0 a pad), the collate wrapper counts its ones and its size, in the batches whose stages
are timed, in whichever process collated them; the padding share is the pad tokens over all
tokens. Counting is one ``sum`` over the mask, outside the collate's time.
"""

from __future__ import annotations

from typing import TypedDict

from pipeprof.core.session import Session


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
