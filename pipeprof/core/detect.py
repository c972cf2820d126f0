"""What kind of data object the user passed, without importing a framework to find out."""

from __future__ import annotations

import sys
from typing import Any


def is_torch_loader(obj: Any) -> bool:
    """A ``torch.utils.data.DataLoader`` (torch is only looked up if already imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.utils.data.DataLoader)


def is_tf_dataset(obj: Any) -> bool:
    """A ``tf.data.Dataset`` (never imports TensorFlow: only a tf.data object brings it)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(obj, tf.data.Dataset)
