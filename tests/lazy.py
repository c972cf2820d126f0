"""A framework module imported where a test first uses it, not as pytest collects the tests:
every process that collects the suite (each of xdist's, then the ``serial`` phase's) paid about
6 s for tensorflow, lightning and datasets, most of them in tests it then did not run.

The suite needs them (``dev/setup.sh test`` installs them): a missing one fails the tests that use
it, where ``pytest.importorskip`` would have skipped them."""

from __future__ import annotations

import importlib
import types
from typing import Any


class LazyModule(types.ModuleType):
    """``name``, imported at its first attribute read."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):  # what pytest asks of a module's names as it collects (_mock_name)
            raise AttributeError(attr)
        return getattr(importlib.import_module(self.__name__), attr)


def module(name: str) -> Any:
    return LazyModule(name)
