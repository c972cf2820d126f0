"""The Report: what a profile found, ready to show, save and compare."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeprof.analysis import analyze
from pipeprof.session import Session, read_file

if TYPE_CHECKING:
    from pipeprof.compare import Comparison


class Report:
    """Analysed results of a profile (schema ``pipeprof/1``).

    Shows itself as a rich summary in a terminal (``print(report)`` or just ``report`` in a REPL
    with rich installed) and as an HTML page in Jupyter. ``to_dict()`` gives the JSON contract of
    DESIGN.md; ``save`` writes it together with the raw session, which ``pipeprof.load`` reads.
    Times are seconds (``_s``) or milliseconds (``_ms``); fractions are 0-1; n/a is ``None``.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self._data = analyze(session)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        return cls(read_file(path))

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (a deep copy: changing it changes nothing here)."""
        data: dict[str, Any] = json.loads(json.dumps(self._data))
        return data

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    @property
    def verdict(self) -> dict[str, Any]:
        return dict(self._data["verdict"])

    @property
    def findings(self) -> list[dict[str, Any]]:
        return [dict(f) for f in self._data["findings"]]

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the report and its raw session as one JSON file; returns the path."""
        target = Path(path)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(json.dumps({**self._data, "session": self.session.to_dict()}))
        os.replace(tmp, target)
        return target

    def render(self, fmt: str = "text", **options: Any) -> str:
        from pipeprof.renderers import get_renderer

        return get_renderer(fmt, **options).render(self)

    def write_html(self, path: str | os.PathLike[str]) -> Path:
        """Write the self-contained HTML report (works offline)."""
        target = Path(path)
        target.write_text(self.render("html"), encoding="utf-8")
        return target

    def compare(self, other: Report) -> Comparison:
        """This report (before) against ``other`` (after): per stage, for the loop, and how the
        verdict changed. The Comparison shows itself like a Report; ``to_dict()`` gives data."""
        from pipeprof.compare import compare

        return compare(self, other)

    # ---- display --------------------------------------------------------------------------

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from pipeprof.renderers.text import summary

        yield from summary(self._data)

    def _repr_html_(self) -> str:
        from pipeprof.renderers.html import HTMLRenderer

        return HTMLRenderer(fragment=True).render(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/html": self._repr_html_(), "text/plain": self.render("text", width=100)}

    def __repr__(self) -> str:
        v = self._data["verdict"]
        return (
            f"<pipeprof.Report {self._data['mode']} {self._data['batches']} batches: "
            f"{v['kind']}, stage={v.get('stage')}>"
        )

    def __str__(self) -> str:
        return self.render("text")
