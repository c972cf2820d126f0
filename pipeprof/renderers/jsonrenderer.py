"""The report contract as JSON (schema ``pipeprof/1``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pipeprof.renderers.base import Renderer

if TYPE_CHECKING:
    from pipeprof.report import Report


class JSONRenderer(Renderer):
    output_file_extension = ".json"

    def __init__(self, indent: int | None = 2, session: bool = False) -> None:
        self.indent = indent
        self.session = session  # include the raw session (what report.save writes)

    def render(self, report: Report) -> str:
        data = report.to_dict()
        if self.session:
            data["session"] = report.session.to_dict()
        return self.render_dict(data)

    def render_dict(self, data: dict[str, Any]) -> str:
        return json.dumps(data, indent=self.indent)
