"""What every result object shares: it renders, saves and shows itself the same way.

``Report``, ``Comparison``, ``Bench`` and ``TFBench`` each say how they render (``render(fmt)``
and ``_renderables()`` for a terminal); this base gives them the rest: ``to_dict()`` as a copy,
``result["key"]``, ``save(path)`` (JSON), ``write_html(path)``, ``print(result)`` and display in a
terminal (``__rich_console__``) and in Jupyter (``_repr_html_``/``_repr_mimebundle_``) without
importing IPython.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pipeprof.core.session import write_atomic


class Result:
    """Base of the result objects; subclasses implement ``_data_dict``, ``render``,
    ``_renderables`` (and may extend ``save``)."""

    def _data_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The result as plain data (a deep copy: changing it changes nothing here)."""
        data: dict[str, Any] = json.loads(json.dumps(self._data_dict()))
        return data

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The result as ``text``, ``json`` or ``html`` (a Report also as a ``chrome`` trace).

        Args:
            fmt: the format's name.
            **options: the format's own options (each subclass names them).

        Returns:
            The rendered result as a string.
        """
        raise NotImplementedError

    def _renderables(self) -> Iterable[Any]:
        raise NotImplementedError

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``to_dict()`` as JSON, atomically.

        Args:
            path: the file to write (replaced, never left half written).

        Returns:
            The path written.

        Raises:
            OSError: the file cannot be written (the message names ``path``).
        """
        return write_atomic(path, json.dumps(self._data_dict()))

    def write_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the self-contained HTML page (works offline).

        Args:
            path: the file to write (replaced atomically, never left half written).

        Returns:
            The path written.

        Raises:
            OSError: the file cannot be written (the message names ``path``).
        """
        return write_atomic(path, self.render("html"))

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield from self._renderables()

    def _repr_html_(self) -> str:
        return self.render("html", fragment=True)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/html": self._repr_html_(), "text/plain": self.render("text", width=100)}

    def __str__(self) -> str:
        return self.render("text")
