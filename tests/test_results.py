"""Every result object (Report, Comparison, Bench) renders, saves and shows the same way.

TFBench, which needs TensorFlow, gets the same check in tests/test_tfdata.py
(``assert_behaves_like_a_result`` is shared).
"""

from __future__ import annotations

import json

import pytest
import torch
from golden_reports import FIXED, LOOP, golden_report

import pipeprof
from pipeprof.render.result import Result


def assert_behaves_like_a_result(result: object, tmp_path, words: list[str]) -> None:
    """``words`` come from the result's own data and must show in text and HTML alike."""
    assert isinstance(result, Result)
    data = result.to_dict()
    data["mutated"] = True
    assert "mutated" not in result.to_dict()  # a copy
    text = result.render("text")
    assert text == str(result)
    page = result.render("html")
    assert page.lower().startswith("<!doctype html")
    fragment = result._repr_html_()
    assert "<!doctype" not in fragment.lower()
    bundle = result._repr_mimebundle_()
    assert bundle["text/html"] == fragment and bundle["text/plain"]
    for word in words:
        assert word in text and word in page and word in fragment, word
    assert json.loads(result.render("json")) == result.to_dict()
    with pytest.raises(ValueError, match="unknown format"):
        result.render("pdf")
    saved = json.loads(result.save(tmp_path / "r.json").read_text())
    assert {k: saved[k] for k in result.to_dict()} == result.to_dict()
    assert result.write_html(tmp_path / "r.html").read_text(encoding="utf-8") == page
    from rich.console import Console

    console = Console(width=100, record=True, color_system=None)
    console.print(result)
    for word in words:
        assert word in console.export_text(), word


def test_report(tmp_path):
    report = golden_report(LOOP)
    limiting = report["verdict"]["stage"]
    assert_behaves_like_a_result(report, tmp_path, [limiting])
    assert pipeprof.load(tmp_path / "r.json").to_dict() == report.to_dict()  # with its session


def test_comparison(tmp_path):
    comparison = pipeprof.compare(golden_report(LOOP), golden_report(FIXED))
    after = comparison["verdict"]["after"]["kind"]
    assert_behaves_like_a_result(comparison, tmp_path, [after])
    assert comparison.to_dict() == golden_report(LOOP).compare(golden_report(FIXED)).to_dict()


class Halve:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x / 2


def test_bench(tmp_path):
    data = [torch.full((8,), float(i)) for i in range(16)]
    b = pipeprof.bench(data, [Halve()], samples=8, repeat=1, warmup=1, probe=False)
    assert_behaves_like_a_result(b, tmp_path, ["transform/Halve"])
