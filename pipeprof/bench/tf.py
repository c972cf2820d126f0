"""``pipeprof.bench`` for a tf.data pipeline: each op's stand-alone cost, prefix by prefix.

See NOTE [ Prefix benchmark ] in collect/tf/prefix.py for the method and what a marginal
cost means. Each prefix runs ``repeat`` passes over the same ``samples`` elements after
``warmup``; every ``next()`` is timed, which gives the per-element distribution (p50/p95) of
the prefix and the marginal mean of the op it adds. Worker-count predictions do not apply:
tf.data runs in threads inside one process (``num_parallel_calls`` is its knob).
"""

from __future__ import annotations

from typing import Any

from pipeprof.collect.tf.prefix import time_elements
from pipeprof.collect.tf.prefix import walk as prefix_walk
from pipeprof.render.figures import visible
from pipeprof.render.result import Result


def _nbytes(element: Any) -> int | None:
    from pipeprof.collect.tf.dataset import import_tf

    tf = import_tf()
    try:
        return sum(int(t.numpy().nbytes) for t in tf.nest.flatten(element))
    except (AttributeError, TypeError, ValueError):
        return None


def bench_tf(dataset: Any, samples: int = 64, repeat: int = 3, warmup: int = 4) -> TFBench:
    """Time every prefix of ``dataset`` (source, source+op, ..., the whole pipeline)."""
    rows: list[dict[str, Any]] = []
    previous = 0.0
    for prefix, op, stage, batched in prefix_walk(dataset):
        times: list[int] = []
        seen = 0
        last = None
        for _ in range(repeat):
            t, s, last = time_elements(prefix, samples, warmup, batched)
            times += t
            seen += s
        total = sum(times)
        per_sample = total / 1e6 / seen if seen else float("nan")
        per_element = sorted(times)
        ratio = seen / len(times) if times else 1.0  # samples per element
        rows.append({
            "op": op["op"], "stage": stage, "elements": len(times), "samples": seen,
            "ms_per_sample": round(per_sample, 6),
            "marginal_ms_per_sample": round(per_sample - previous, 6),
            "p50_ms_per_sample": round(_q(per_element, 0.5) / 1e6 / ratio, 6) if times else None,
            "p95_ms_per_sample": round(_q(per_element, 0.95) / 1e6 / ratio, 6) if times else None,
            "samples_per_s": round(seen / (total / 1e9), 3) if total else None,
            "output": str(getattr(prefix, "element_spec", "")),
            "output_bytes": _nbytes(last) if last is not None else None,
        })  # fmt: skip
        previous = per_sample
    return TFBench(rows, samples=samples, repeat=repeat)


def _q(values: list[int], q: float) -> float:
    return float(values[min(len(values) - 1, int(q * len(values)))])


class TFBench(Result):
    """The prefix benchmark's result: a table of ops with their marginal cost per sample.

    Made by ``pipeprof.bench`` for a tf.data pipeline:

    Args:
        rows: one dict per prefix of the pipeline (source, source+op, ..., the whole), in
            order: its op, stage, timings per sample and output.
        samples: the elements timed per prefix and pass.
        repeat: the timed passes per prefix.
    """

    def __init__(self, rows: list[dict[str, Any]], samples: int, repeat: int) -> None:
        self.rows = rows
        self.samples = samples
        self.repeat = repeat

    @property
    def slowest(self) -> str | None:
        """The stage whose op adds the most time per sample."""
        costly = [
            r for r in self.rows if r["marginal_ms_per_sample"] == r["marginal_ms_per_sample"]
        ]
        return max(costly, key=lambda r: r["marginal_ms_per_sample"])["stage"] if costly else None

    def _data_dict(self) -> dict[str, Any]:
        whole = self.rows[-1]["ms_per_sample"] if self.rows else None
        for r in self.rows:
            r["share"] = round(max(0.0, r["marginal_ms_per_sample"]) / whole, 6) if whole else None
        return {"framework": "tf", "method": "prefix benchmark (stand-alone, marginal)",
                "samples": self.samples, "repeat": self.repeat, "slowest": self.slowest,
                "stages": [dict(r) for r in self.rows],
                "pipeline_samples_per_s": self.rows[-1]["samples_per_s"] if self.rows
                else None}  # fmt: skip

    def predict(self, **kwargs: Any) -> float:
        """Not available for tf.data: worker-count predictions are for PyTorch DataLoaders.

        Args:
            **kwargs: accepted as ``Bench.predict`` takes them, and not used.

        Raises:
            NotImplementedError: always; raise ``num_parallel_calls`` (or AUTOTUNE) on the
                slowest map instead.
        """
        raise NotImplementedError(
            "worker-count predictions are for PyTorch DataLoaders; tf.data runs its stages in "
            "threads: raise num_parallel_calls (or AUTOTUNE) on the slowest map instead"
        )

    def _table(self) -> Any:
        from rich.table import Table
        from rich.text import Text

        t = Table(title=f"tf.data prefix benchmark ({self.samples} elements × {self.repeat})",
                  title_justify="left")  # fmt: skip
        t.add_column("stage", no_wrap=True)
        for col in ("+ms/sample", "p95 ms", "share", "samples/s"):
            t.add_column(col, justify="right", no_wrap=True)
        for r in visible(self.to_dict())["stages"]:
            t.add_row(Text(r["stage"]), f"{r['marginal_ms_per_sample']:.3g}",
                      f"{r['p95_ms_per_sample'] or 0:.3g}", f"{r['share'] or 0:.0%}",
                      f"{r['samples_per_s'] or 0:.0f}")  # fmt: skip
        return t

    def _renderables(self) -> Any:
        yield self._table()

    def render(self, fmt: str = "text", **options: Any) -> str:
        """The table as ``text``, ``json`` or ``html``.

        Args:
            fmt: ``"text"``, ``"json"`` or ``"html"``.
            **options: ``width`` (text columns, default 80) and ``fragment`` (HTML without the
                page around it, default False); others are ignored.

        Returns:
            The rendered table as a string.

        Raises:
            ValueError: ``fmt`` is none of the three.
        """
        width, fragment = int(options.get("width", 80)), bool(options.get("fragment"))
        import io
        import json
        from html import escape

        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2)
        if fmt == "html":
            rows = "".join(
                f"<tr><td>{escape(r['op'])}</td><td>{escape(r['stage'])}</td>"
                f"<td>{r['marginal_ms_per_sample']:.3g}</td><td>{r['share'] or 0:.0%}</td></tr>"
                for r in visible(self.to_dict())["stages"]
            )
            table = ("<table><tr><th>op</th><th>stage</th><th>+ms/sample</th><th>share</th></tr>"
                     f"{rows}</table>")  # fmt: skip
            return table if fragment else f"<!doctype html><meta charset='utf-8'>{table}"
        if fmt != "text":
            raise ValueError(f"unknown format {fmt!r}: use text, json or html")
        from rich.console import Console

        buf = io.StringIO()
        Console(file=buf, width=width, no_color=True).print(self._table())
        return buf.getvalue()

    def __repr__(self) -> str:
        return f"<pipeprof TFBench {len(self.rows)} ops, slowest={self.slowest}>"
