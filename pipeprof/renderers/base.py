"""The base of every renderer: a Report in, a string out."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeprof.report import Report


class Renderer:
    """Turns a Report into one output format."""

    output_file_extension = ".txt"

    def render(self, report: Report) -> str:
        raise NotImplementedError
