"""Imports the named modules once, rebuilding any of their .pyc files that cannot be read.

pip writes a .pyc for every module it installs. One written short (a disk that filled for a
moment, an install cut off) fails every later import of that module with ``EOFError: marshal
data too short``, and nothing rewrites it where ``PYTHONDONTWRITEBYTECODE`` is set, as on this
project's machines. ``dev/setup.sh`` runs this after each install:

    .venv/bin/python dev/check_imports.py torch lightning tensorflow ...

A module that still fails to import exits non-zero with its own traceback.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import py_compile
import sys

_get_code = importlib.machinery.SourceFileLoader.get_code
rebuilt: list[str] = []


def get_code(self: importlib.machinery.SourceFileLoader, fullname: str):  # type: ignore[no-untyped-def]
    try:
        return _get_code(self, fullname)
    except (EOFError, ValueError):  # marshal's "data too short" / "bad marshal data"
        cached = importlib.util.cache_from_source(self.path)
        py_compile.compile(self.path, cfile=cached, doraise=True)
        rebuilt.append(cached)
        return _get_code(self, fullname)


def main(names: list[str]) -> None:
    importlib.machinery.SourceFileLoader.get_code = get_code  # type: ignore[method-assign]
    for name in names:
        importlib.import_module(name)
    for path in rebuilt:
        print(f"setup: rebuilt {path} (it could not be read)")


if __name__ == "__main__":
    main(sys.argv[1:])
