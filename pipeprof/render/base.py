"""The base of every renderer: a report (its dictionary and its Session) in, a string out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipeprof.core.session import Session


class Profiled(Protocol):
    """What a renderer reads from a report: its dictionary (schema ``pipeprof/1``) and the Session
    it came from (traces and timelines draw the Session's spans). ``pipeprof.Report`` is one."""

    session: Session

    def to_dict(self) -> dict[str, Any]: ...


class Renderer:
    """Turns a report into one output format.

    Most formats need only the report dictionary (``render_dict``), so they also render a
    hand-made or loaded ``pipeprof/1`` dictionary; ``render`` passes ``report.to_dict()``.
    """

    output_file_extension = ".txt"

    def render(self, report: Profiled) -> str:
        return self.render_dict(report.to_dict())

    def render_dict(self, data: dict[str, Any]) -> str:
        raise NotImplementedError
