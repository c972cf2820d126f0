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


class Tokens(TypedDict):
    """The padding of the token batches seen (the timed ones)."""

    batches: int
    tokens: int  # all positions, pads included
    pad_tokens: int
    padding_share: float  # pad_tokens / tokens


def tokens_section(session: Session) -> Tokens | None:
    """The padding figures, or None where no batch held an attention mask."""
    t = session.tokens
    total, real = int(t.get("total") or 0), int(t.get("real") or 0)
    if not total:
        return None
    return {
        "batches": int(t.get("batches") or 0),
        "tokens": total,
        "pad_tokens": total - real,
        "padding_share": round((total - real) / total, 6),
    }
