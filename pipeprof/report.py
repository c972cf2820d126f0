"""The Report (what a profile found) and the Comparison (two profiles side by side).

Both are result objects (render/result.py): they render, save and show themselves in a terminal
and in Jupyter the same way as ``Bench`` and ``TFBench``.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from pipeprof.analyze import analyze
from pipeprof.analyze.analysis import RunReport
from pipeprof.analyze.compare import compare_dicts
from pipeprof.core.session import Session, read_file, write_atomic
from pipeprof.render.result import Result

# what analysing malformed data from a file raises: turned into one ValueError naming the file
_MALFORMED = (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError)


class Report(Result):
    """Analysed results of a profile (schema ``pipeprof/1``).

    Shows itself as a rich summary in a terminal (``print(report)`` or just ``report`` in a REPL
    with rich installed) and as an HTML page in Jupyter. ``to_dict()`` gives the JSON contract of
    docs/schema.md; ``save`` writes it together with the raw session, which ``pipeprof.load`` reads.
    Times are seconds (``_s``) or milliseconds (``_ms``); fractions are 0-1; n/a is ``None``.

    Args:
        session: the collected session to analyse (``Profiler`` and ``profile`` make one); it is
            analysed once, here.
    """

    def __init__(self, session: Session) -> None:
        self.session = session
        self._data: RunReport = analyze(session)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """Load a report saved with ``Report.save``: ``pipeprof.load`` (its arguments, what it
        returns and raises are said there)."""
        session = read_file(path)  # ValueError naming the file when it is no valid session
        try:
            return cls(session)
        except _MALFORMED as exc:  # what read_file's checks let through: meta, gpu, host
            raise ValueError(
                f"{path} holds a session that cannot be analysed ({type(exc).__name__}: {exc}); "
                "was the file edited? Save the report again with report.save(path)"
            ) from exc

    def _data_dict(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self._data)  # render/ reads it as plain data

    @property
    def verdict(self) -> dict[str, Any]:
        """The verdict (a copy of ``to_dict()["verdict"]``)."""
        return dict(self._data["verdict"])

    @property
    def findings(self) -> list[dict[str, Any]]:
        """The findings (a copy of ``to_dict()["findings"]``)."""
        return [dict(f) for f in self._data["findings"]]

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the report and its raw session as one JSON file, which ``pipeprof.load`` reads.

        Args:
            path: the file to write (replaced atomically). In a distributed job of more than
                one rank, ``run.json`` becomes ``run.rank3.json`` (unless the path names its
                rank already): ranks never overwrite each other's file.

        Returns:
            The path written.

        Raises:
            OSError: the file cannot be written (the message names ``path``).
        """
        from pipeprof.collect.ranks import rank_path

        text = json.dumps({**self._data, "session": self.session.to_dict()})
        return write_atomic(rank_path(path), text)

    def render(self, fmt: str = "text", **options: Any) -> str:
        """``text`` (rich summary), ``json``, ``html`` or ``chrome`` (a Perfetto trace).

        Args:
            fmt: ``"text"``, ``"json"``, ``"html"`` or ``"chrome"``.
            **options: the format's own: ``text`` takes ``width`` (columns, default 80) and
                ``color`` (default False; ``NO_COLOR`` in the environment turns it off);
                ``json`` takes ``indent`` (default 2; None: one line) and ``session`` (default
                False; True: include the raw session, as ``save`` writes it); ``html`` takes
                ``fragment`` (default False; True: the part Jupyter embeds, without the page
                around it); ``chrome`` takes ``indent`` (default None: one line).

        Returns:
            The rendered report as a string.

        Raises:
            ValueError: ``fmt`` is not one of the four.
            TypeError: an option the format does not take.
        """
        from pipeprof.render import get_renderer

        return get_renderer(fmt, **options).render(self)

    def _renderables(self) -> Iterable[Any]:
        from pipeprof.render.text import summary

        return summary(self._data_dict())

    def log_to(self, target: str, **options: Any) -> str:
        """Log the report's metrics (``pipeprof/wait_fraction``, ... and per-step curves),
        params and summary to TensorBoard, MLflow or Weights & Biases. The tool is imported
        now. Names and options: docs/integrations.md.

        Args:
            target: ``"tensorboard"``, ``"mlflow"`` or ``"wandb"``.
            **options: the target's own: ``log_dir`` for ``"tensorboard"`` (default
                ``runs/pipeprof-<date>-<time>``); ``tracking_uri``, ``run_id`` and
                ``experiment`` for ``"mlflow"`` (default: the active run, else a new one);
                ``run`` or ``wandb.init`` options for ``"wandb"`` (default: the active run,
                else a new one).

        Returns:
            The TensorBoard log folder, or the MLflow or W&B run's id.

        Raises:
            ValueError: ``target`` is none of the three.
            ImportError: the tool is not installed (the message names the extra to install).
        """
        from pipeprof.integrations.export import log_to

        return log_to(self, target, **options)

    def compare(self, other: Report) -> Comparison:
        """This report (before) against ``other`` (after): per stage, for the loop, and how the
        verdict changed.

        Args:
            other: the report after the change.

        Returns:
            The Comparison, labelled ``before`` and ``after``; it shows itself like a Report,
            and ``to_dict()`` gives data.
        """
        return compare(self, other)

    def __repr__(self) -> str:
        v = self._data["verdict"]
        return (
            f"<pipeprof.Report {self._data['mode']} {self._data['batches']} batches: "
            f"{v['kind']}, stage={v.get('stage')}>"
        )


class _Rendered(Result):
    """A result held as a plain dict and drawn by one renderer module (``_renderer``, which has
    ``render(data, fmt)`` and ``summary(data)``): Comparison, Job."""

    _renderer = ""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def _data_dict(self) -> dict[str, Any]:
        return self._data

    def render(self, fmt: str = "text", **options: Any) -> str:
        """``text`` (80 columns), ``json`` or ``html``.

        Args:
            fmt: ``"text"``, ``"json"`` or ``"html"``.
            **options: ``width`` (text columns, default 80) and ``color`` (ANSI colours in the
                text, default False); ``fragment`` (HTML without the page around it, default
                False). ``json`` ignores them.

        Returns:
            The rendered result as a string.

        Raises:
            ValueError: ``fmt`` is none of the three.
            TypeError: an option not named here.
        """
        return importlib.import_module(self._renderer).render(self._data, fmt, **options)  # type: ignore[no-any-return]

    def _renderables(self) -> Iterable[Any]:
        return importlib.import_module(self._renderer).summary(self._data)  # type: ignore[no-any-return]

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/html": self._repr_html_(), "text/plain": self.render("text")}


class Comparison(_Rendered):
    """Two profiles side by side (schema ``pipeprof-compare/1``; analyze/compare.py says what
    each figure means); shows itself in a terminal and in Jupyter like a Report.

    Args:
        data: the comparison as plain data (schema ``pipeprof-compare/1``), as
            ``pipeprof.compare`` makes it or a saved comparison holds it.
    """

    _renderer = "pipeprof.render.comparison"

    def __repr__(self) -> str:
        v = self._data["verdict"]
        return f"<pipeprof.Comparison {v['before']['kind']} → {v['after']['kind']}>"


Source = Report | dict[str, Any] | str | os.PathLike[str]


def compare(before: Source, after: Source, labels: tuple[str, str] | None = None) -> Comparison:
    """Compare two profiles: Reports, report dictionaries or files saved by ``report.save`` (or
    written as plain report JSON).

    Args:
        before: the profile before the change: a Report, a report dictionary
            (``report.to_dict()``), or the path of a saved report.
        after: the profile after the change, as ``before``.
        labels: the two profiles' names in the comparison, ``(before, after)``; None: the
            files' names (``before`` and ``after`` for a Report or a dictionary), as
            ``before (NAME)`` and ``after (NAME)`` where both are the same.

    Returns:
        The Comparison (``print`` it, ``render("html")``, ``save(path)``, ``to_dict()``).

    Raises:
        FileNotFoundError: a path names no file.
        ValueError: a file is not a pipeprof report, or is a damaged one.
    """
    b, name_b = _as_dict(before)
    a, name_a = _as_dict(after)
    if labels is None:
        labels = (name_b or "before", name_a or "after")
        if labels[0] == labels[1]:
            labels = (f"before ({labels[0]})", f"after ({labels[1]})")
    return Comparison(compare_dicts(b, a, labels))


def load(path: str | os.PathLike[str]) -> Report:
    """Load a report saved with ``Report.save`` (or a raw session file).

    Args:
        path: the file ``Report.save`` wrote (or a session saved on its own, such as a
            ``stream=`` file).

    Returns:
        The Report, analysed again from the saved session.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file holds no pipeprof session (a report written as plain JSON has
            none), or its session is damaged or cannot be analysed; the message names the file.
    """
    return Report.load(path)


# The files pipeprof writes as plain data, by their schema: the result that draws each (a job
# report from ``pipeprof run`` under torchrun or ``pipeprof merge``, a comparison, a benchmark)
_SAVED = {
    "pipeprof-job/": "pipeprof.render.job",
    "pipeprof-compare/": "pipeprof.render.comparison",
    "pipeprof-bench/": "pipeprof.render.bench",
    "pipeprof-encodings/": "pipeprof.render.encodings",
}


def read(path: str | os.PathLike[str]) -> Result:
    """Any file pipeprof writes, as the result that renders it: a saved report (``Report``), a
    job report (``Job``, from ``pipeprof run`` under torchrun or ``pipeprof merge``), a
    comparison (``Comparison``) or a benchmark's result (``pipeprof bench --format json``).
    A file that is none of these raises ``ValueError`` saying what it is and what to pass."""
    data = _report_json(Path(path), any_schema=True)
    schema = str(data.get("schema", "")) if data is not None else ""
    kind = next((k for k in _SAVED if schema.startswith(k)), None)
    if data is None or kind is None:
        return Report.load(path)  # a saved session, or the error that says what the file is
    if kind == "pipeprof-job/":
        return Job(data)
    if kind == "pipeprof-compare/":
        return Comparison(data)
    return _Saved(data, _SAVED[kind])


def _as_dict(source: Source) -> tuple[dict[str, Any], str | None]:
    if isinstance(source, dict):
        return source, None
    if isinstance(source, (str, os.PathLike)):
        try:
            data = Report.load(source).to_dict()
        except ValueError:  # a report written without its session (`--format json`) compares
            plain = _report_json(Path(source))  # as well: a comparison reads only the report
            if plain is None:
                raise
            data = plain
        return _comparable(data, Path(source)), Path(source).name
    return source.to_dict(), None


def _report_json(path: Path, any_schema: bool = False) -> dict[str, Any] | None:
    """A report saved as plain JSON, without its session (``any_schema``: any of pipeprof's
    plain files); None when the file is something else (a saved session, however damaged, is
    not one)."""
    try:
        data: Any = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or "session" in data:
        return None
    schema = str(data.get("schema", ""))
    if any_schema:
        return dict(data) if schema.startswith("pipeprof") else None
    return dict(data) if schema.startswith("pipeprof/") and "stages" in data else None


def _comparable(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``data``, read from ``path``, once what a comparison reads of it reads without error."""
    try:
        compare_dicts(data, data)
    except _MALFORMED as exc:
        raise ValueError(
            f"{path} is a damaged pipeprof report ({type(exc).__name__}: {exc}): save it "
            "again (report.save(path), or `pipeprof report FILE --format json -o OUT.json`)"
        ) from None
    return data


class _Saved(_Rendered):
    """A benchmark's result read back from its file: drawn by its renderer module."""

    def __init__(self, data: dict[str, Any], renderer: str) -> None:
        super().__init__(data)
        self._renderer = renderer

    def _renderables(self) -> Iterable[Any]:
        return importlib.import_module(self._renderer).renderables(self._data)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<pipeprof result {self._data.get('schema')}>"


class Job(_Rendered):
    """One report for a distributed job, from its ranks' reports (schema ``pipeprof-job/1``;
    NOTE [ Job report ] in analyze/job.py): per-rank wait / transfer / compute / comm / other
    and samples/s, the straggler ranks and their slow stage, POP efficiencies and the rate if
    every rank's pipeline kept up. Shows itself like a Report.

    Args:
        data: the job report as plain data (schema ``pipeprof-job/1``), as ``pipeprof.merge``
            makes it or a saved job report holds it.
        ranks: the ranks' reports it was made from, for ``render("chrome")``; None: none (a
            job report read back from its file has none).
    """

    _renderer = "pipeprof.render.job"

    @property
    def stragglers(self) -> list[dict[str, Any]]:
        """The straggler ranks (a copy of ``to_dict()["stragglers"]``)."""
        return [dict(s) for s in self._data["stragglers"]]

    def __init__(self, data: Mapping[str, Any], ranks: list[Report] | None = None) -> None:
        super().__init__(dict(data))
        self._ranks = ranks or []  # the ranks' reports, where made from them: for the trace

    def render(self, fmt: str = "text", **options: Any) -> str:
        """``text`` (100 columns), ``json``, ``html``, or ``chrome``: one Chrome/Perfetto trace
        of every rank (a process per rank's main and workers, clocks aligned), from the ranks'
        reports (``pipeprof.merge`` of files or Reports).

        Args:
            fmt: ``"text"``, ``"json"``, ``"html"`` or ``"chrome"``.
            **options: ``width`` (text columns, default 100) and ``color`` (ANSI colours in
                the text, default False); ``fragment`` (HTML without the page around it,
                default False); ``indent`` for ``chrome`` (default None: one line).

        Returns:
            The rendered job report as a string.

        Raises:
            ValueError: ``fmt`` is none of the four, or ``chrome`` for a Job that holds no
                ranks' reports (one read back from its file).
            TypeError: an option ``text``, ``json`` or ``html`` does not take.
        """
        if fmt != "chrome":
            return super().render(fmt, **options)
        if not self._ranks:
            raise ValueError("a job trace needs the ranks' reports: pipeprof.merge(files)")
        from pipeprof.render.chrome import job_trace

        ranks = [(int(r.to_dict()["meta"]["rank"]["rank"]), str(r.to_dict()["meta"]["rank"].get(
            "host") or ""), r.to_dict(), r.session) for r in self._ranks]  # fmt: skip
        return json.dumps(job_trace(sorted(ranks, key=lambda x: x[0])), indent=options.get(
            "indent"))  # fmt: skip

    def __repr__(self) -> str:
        return f"<pipeprof.Job {self._data['headline']}>"


def merge(ranks: Iterable[Report | str | os.PathLike[str]]) -> Job:
    """One job report from the reports of a distributed job's ranks: ``Report`` objects or the
    files each rank saved (``run.rank0.json``, ``run.rank1.json``...). A missing rank is named
    in the report.

    Args:
        ranks: each rank's ``Report`` of a training loop, or the file it saved with
            ``report.save``, in any order.

    Returns:
        The Job (``print`` it, ``render("html")``, ``render("chrome")`` for one trace of every
        rank, ``save(path)``, ``to_dict()``).

    Raises:
        ValueError: no reports are given, a report says nothing of its rank or is not a
            training loop's, or there are duplicate ranks, files of different world sizes or
            of different runs (the message says which files); or a file cannot be read as a
            saved report (as ``pipeprof.load``).
        FileNotFoundError: a path names no file.
    """
    from pipeprof.analyze.job import job_dict

    named: list[tuple[str, dict[str, Any]]] = []
    reports: list[Report] = []
    for i, item in enumerate(ranks):
        report = item if isinstance(item, Report) else Report.load(item)
        name = str(item) if not isinstance(item, Report) else f"report #{i + 1}"
        named.append((name, {**report.to_dict(), "started_at": report.session.started_at}))
        reports.append(report)
    return Job(job_dict(named), reports)
