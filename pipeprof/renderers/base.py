"""The base of every renderer: a Report (or its dictionary) in, a string out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeprof.report import Report


class Renderer:
    """Turns a Report into one output format.

    Most formats need only the report dictionary (``render_dict``), so they also render a
    hand-made or loaded ``pipeprof/1`` dictionary; ``render`` passes ``report.to_dict()``.
    """

    output_file_extension = ".txt"

    def render(self, report: Report) -> str:
        return self.render_dict(report.to_dict())

    def render_dict(self, data: dict[str, Any]) -> str:
        raise NotImplementedError
