"""One renderer per output format, chosen by name or by a file's extension."""

from __future__ import annotations

from typing import Any

from pipeprof.render.base import Renderer

FORMATS = ("text", "json", "html", "chrome")
# longest first: "run.trace.json" is a Chrome trace, "run.json" the JSON report
_EXTENSIONS = {
    ".trace.json": "chrome",
    ".trace": "chrome",
    ".txt": "text",
    ".json": "json",
    ".html": "html",
    ".htm": "html",
}


def get_renderer(fmt: str, **options: Any) -> Renderer:
    """The renderer for ``fmt`` (one of FORMATS); ``options`` go to its constructor."""
    if fmt == "text":
        from pipeprof.render.text import TextRenderer

        return TextRenderer(**options)
    if fmt == "json":
        from pipeprof.render.jsonrenderer import JSONRenderer

        return JSONRenderer(**options)
    if fmt == "html":
        from pipeprof.render.html import HTMLRenderer

        return HTMLRenderer(**options)
    if fmt == "chrome":
        from pipeprof.render.chrome import ChromeRenderer

        return ChromeRenderer(**options)
    raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")


def format_for(path: str) -> str | None:
    """The format a file name asks for by its extension, or None."""
    for ext, fmt in _EXTENSIONS.items():
        if path.lower().endswith(ext):
            return fmt
    return None
