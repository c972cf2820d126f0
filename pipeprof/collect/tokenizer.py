"""A Hugging Face tokenizer's calls timed where the pipeline makes them: the relative stage
``tokenize`` (``load/tokenize`` in ``__getitem__``, ``transform/encode/tokenize`` in a
``with_transform`` function), with how many texts each call took and whether the tokenizer
releases the GIL while it encodes.

NOTE [ Tokenizer calls ]
Every ``transformers`` tokenizer is called through ``PreTrainedTokenizerBase.__call__`` (no
backend overrides it). pipeprof replaces that one method, as it does h5py's reads (NOTE
[ Counted class patches ] in collect/patch.py; in a worker for its life, in the training process
for a pass), only once ``transformers`` is imported by the user's code, and calls the original
with the same arguments. A call inside the pipeline's stages (or on a helper thread while the
pipeline thread is in one) is the stage ``tokenize``, unless it is inside one already; a call the
training loop makes between batches is not timed. Counted in the sink's ``tokens`` aggregate,
beside the padding (NOTE [ Padding ] in analyze/tokens.py): calls, texts (a batch call's list
counts each), their ns, and the calls made by a fast tokenizer (``is_fast``: Rust's
``tokenizers``, which encodes with the GIL released, so threads tokenize in parallel; a Python
tokenizer holds it, and only processes do).
"""

from __future__ import annotations

import sys
from typing import Any

from pipeprof.collect.patch import ClassPatch, close_stage, open_stage, piped
from pipeprof.core.recorder import counts, recorder

_rec = recorder()


def _base() -> Any:
    module = sys.modules.get("transformers.tokenization_utils_base")
    return None if module is None else module.PreTrainedTokenizerBase


def _call(self: Any, *args: Any, **kwargs: Any) -> Any:
    if not piped():
        return _ORIG["__call__"](self, *args, **kwargs)
    frame, t0 = open_stage("tokenize")
    try:
        return _ORIG["__call__"](self, *args, **kwargs)
    finally:
        ns = close_stage(frame, t0)
        _count(self, args[0] if args else kwargs.get("text"), ns)


def _count(tokenizer: Any, text: Any, ns: int) -> None:
    """One call into this thread's sink: the texts it took (a list or tuple: each of them)."""
    texts = len(text) if isinstance(text, (list, tuple)) else 1
    found = counts(_rec.sink).setdefault("tokens", {"batches": 0, "real": 0, "total": 0})
    found["calls"] = found.get("calls", 0) + 1
    found["texts"] = found.get("texts", 0) + texts
    found["call_ns"] = found.get("call_ns", 0) + ns
    if getattr(tokenizer, "is_fast", False):
        found["fast_calls"] = found.get("fast_calls", 0) + 1


# tokenizer calls timed in this process while installed (NOTE [ Tokenizer calls ]; install is
# False while transformers' tokenizers are not imported): NOTE [ Counted class patches ] in
# collect/patch.py. The original, which ours calls, in _ORIG.
PATCH = ClassPatch([(_base, "__call__", _call)])
install, uninstall, installed = PATCH.install, PATCH.uninstall, PATCH.installed
_ORIG = PATCH.orig
