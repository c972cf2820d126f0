"""examples/report.ipynb executed by a real Jupyter kernel (nbclient, ipykernel), its outputs
checked; and the %pipeprof / %%pipeprof magics in an in-process IPython shell."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from machine import require

import pipeprof

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "report.ipynb"


def outputs(cell: dict[str, Any], mime: str) -> list[str]:
    return [o["data"][mime] for o in cell["outputs"] if mime in o.get("data", {})]


def find(cells: list[dict[str, Any]], source: str) -> dict[str, Any]:
    """The one code cell whose source starts with ``source``."""
    (cell,) = [c for c in cells if c["source"].startswith(source)]
    return cell


def execute(nb, tmp_path_factory) -> None:
    """Run the notebook ``nb`` in place in a real kernel of this very interpreter (a kernel
    spec made for it, so the kernel sees this environment's pipeprof)."""
    require("nbclient", "nbformat", "ipykernel", extra="test")
    import nbclient

    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "pipeprof-test"
    spec.mkdir(parents=True)
    spec.joinpath("kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "pipeprof test",
                "language": "python",
            }
        )
    )
    work = tmp_path_factory.mktemp("run")
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root))
    mp.setenv("IPYTHONDIR", str(root / "ipython"))
    try:
        client = nbclient.NotebookClient(
            nb,
            timeout=300,
            kernel_name="pipeprof-test",
            resources={"metadata": {"path": str(work)}},
        )
        client.execute()
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    require("nbclient", "nbformat", "ipykernel", extra="test")
    import nbformat

    nb = nbformat.read(EXAMPLE, as_version=4)
    execute(nb, tmp_path_factory)
    return [c for c in nb.cells if c.cell_type == "code"]


def test_notebook_runs_without_errors(executed):
    for cell in executed:
        kinds = {o["output_type"] for o in cell["outputs"]}
        assert "error" not in kinds, cell["outputs"]
        streams = "".join(o.get("text", "") for o in cell["outputs"] if o.get("name") == "stderr")
        assert "Traceback" not in streams


def test_reports_show_as_html_with_charts(executed):
    profile = find(executed, "report = pipeprof.profile")
    magic = find(executed, "%%pipeprof")
    after_magic = find(executed, "loop_report = _pipeprof_report")
    compared = find(executed, "small = ")
    files = find(executed, "out = pathlib.Path")
    (page,) = outputs(profile, "text/html")
    assert page.startswith("<style>") and '<div class="pipeprof">' in page
    for chart in ("step-timeline", "stage-icicle", "workers"):
        assert f'class="chart {chart}"' in page
    assert "transform/RandomResizedCrop" in page and "loader mode" in page
    (plain,) = outputs(profile, "text/plain")
    assert "pipeprof · loader" in plain and "\x1b[" not in plain
    (loop_page,) = outputs(magic, "text/html")
    for chart in ("step-breakdown", "step-timeline", "regions", "stage-icicle"):
        assert f'class="chart {chart}"' in loop_page
    assert "loop mode" in loop_page and "Forward" in loop_page and "Backward" in loop_page
    (steps,) = outputs(after_magic, "text/plain")
    assert steps.startswith("(6, '")  # 96 samples / 16 per batch
    (cmp_page,) = outputs(compared, "text/html")
    assert "pipeprof compare" in cmp_page and 'class="chart compare-stages"' in cmp_page
    (names,) = outputs(files, "text/plain")
    assert names == "['run.html', 'run.json', 'run.trace.json']"


def test_headline_and_stage_figures(executed):
    headline = find(executed, 'report["verdict"]')
    stages = find(executed, "{path: row")
    assert "the loader delivers" in outputs(headline, "text/plain")[0]
    assert "'transform/RandomResizedCrop':" in outputs(stages, "text/plain")[0]


@pytest.fixture
def shell(tmp_path, monkeypatch):
    require("IPython", extra="test")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "pipeprof")
    yield ip
    InteractiveShell.clear_instance()


LOOP_CELL = """
for x, i in prof.wrap(loader):
    with prof.region("Forward"):
        spin(0.5)
"""


def test_magics_profile_a_loader_and_a_cell(shell, tmp_path):
    from IPython.core.error import UsageError
    from pipelines import CostDataset, spin
    from torch.utils.data import DataLoader

    shell.user_ns.update(loader=DataLoader(CostDataset(16), batch_size=4), spin=spin)
    report = shell.run_line_magic("pipeprof", f"-b 2 -o {tmp_path / 'a.html'} loader")
    assert report["batches"] == 2 and report["mode"] == "loader"
    assert (tmp_path / "a.html").read_text().startswith("<!DOCTYPE html>")
    cell = shell.run_cell_magic("pipeprof", f"-o {tmp_path / 'b.trace.json'}", LOOP_CELL)
    assert cell["mode"] == "loop" and cell["loop"]["steps"] == 4
    assert "Forward" in cell["loop"]["regions"] and shell.user_ns["_pipeprof_report"] is cell
    assert json.loads((tmp_path / "b.trace.json").read_text())["traceEvents"]
    quiet = shell.run_cell_magic("pipeprof", "-q -n p", LOOP_CELL.replace("prof.", "p."))
    assert quiet is None and shell.user_ns["_pipeprof_report"]["loop"]["steps"] == 4
    with pytest.raises(UsageError, match="never iterated prof.wrap"):
        shell.run_cell_magic("pipeprof", "", "x = 1")
    failing = "for i, _ in enumerate(prof.wrap(loader)):\n    if i == 2:\n        1 / 0\n"
    with pytest.raises(ZeroDivisionError):  # the cell's own error, and what ran is kept
        shell.run_cell_magic("pipeprof", f"-q -o {tmp_path / 'c.json'}", failing)
    kept = shell.user_ns["_pipeprof_report"]
    assert kept["interrupted"] and kept["loop"]["steps"] == 3
    assert pipeprof.load(tmp_path / "c.json")["loop"]["steps"] == 3
    with pytest.raises(UsageError, match="needs a DataLoader"):
        shell.run_line_magic("pipeprof", "")
    with pytest.raises(UsageError, match="invalid int value"):
        shell.run_line_magic("pipeprof", "-b many loader")
    shell.user_ns["CostDataset"], shell.user_ns["DataLoader"] = CostDataset, DataLoader
    inline = shell.run_line_magic(
        "pipeprof", "--batches 1 DataLoader(CostDataset(8), batch_size=4 )"
    )
    assert inline["batches"] == 1 and inline["samples"] == 4


def test_option_parsing_keeps_the_expression_verbatim():
    require("IPython", extra="test")  # pipeprof.magic is IPython's extension
    from pipeprof.magic import parse

    args, rest = parse('-b 3 -q --device cuda:1 make("a b",  x=-1)')
    assert (args.batches, args.quiet, args.device, rest) == (
        3,
        True,
        "cuda:1",
        'make("a b",  x=-1)',
    )
    args, rest = parse("-o out.html")
    assert args.output == "out.html" and rest == ""
