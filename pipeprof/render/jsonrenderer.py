"""The report contract as JSON (schema ``pipeprof/1``)."""

from __future__ import annotations

import json
from typing import Any

from pipeprof.render.base import Profiled, Renderer


class JSONRenderer(Renderer):
    output_file_extension = ".json"

    def __init__(self, indent: int | None = 2, session: bool = False) -> None:
        self.indent = indent
        self.session = session  # include the raw session (what report.save writes)

    def render(self, report: Profiled) -> str:
        data = report.to_dict()
        if self.session:
            data["session"] = report.session.to_dict()
        return self.render_dict(data)

    def render_dict(self, data: dict[str, Any]) -> str:
        return json.dumps(data, indent=self.indent)
