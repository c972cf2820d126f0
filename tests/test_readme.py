"""The README's two commands, run in a fresh clone of the committed repository."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README has no bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_starts_with_exactly_two_commands():
    cmds = readme_commands()
    assert len(cmds) == 2
    assert "demo" in cmds[0] and "pytest" in cmds[1]


@pytest.mark.skipif(
    os.environ.get("PIPEPROF_README_NESTED") == "1",
    reason="already inside the README test's own run",
)
def test_readme_commands_work_in_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {
        **os.environ,
        "PIPEPROF_README_NESTED": "1",
        # the nested test run proves set-up and runner; the outer run has the full suite
        "PYTEST_ADDOPTS": "-k 'test_import or test_readme_starts'",
    }
    demo, tests = readme_commands()
    res = subprocess.run(
        demo, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=1800
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "pipeprof" in res.stdout and "transform" in res.stdout
    assert (clone / "pipeprof-demo.html").exists()
    res = subprocess.run(
        tests, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=1800
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"\d+ passed", res.stdout)
