"""The README's two commands, run in a fresh clone of the committed repository."""

from __future__ import annotations

import os
import re
import signal
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
    assert "pipeprof run" in cmds[0] and "pytest" in cmds[1]


def run_in_group(cmd: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``cmd`` in its own process group; however the test ends, nothing it started survives.

    A killed test must not leave a set-up (pip, a nested pytest) loading the machine while the
    timing tests that follow it run.
    """
    proc = subprocess.Popen(
        cmd,
        shell=True,
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=1800)
        return proc.returncode, out
    finally:
        try:  # the shell's children too, even when the shell itself has exited
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(2400)
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
    rc, out = run_in_group(demo, clone, env)
    assert rc == 0, out[-6000:]
    assert "pipeprof" in out and "transform" in out
    assert (clone / "pipeprof-demo.html").exists()
    rc, out = run_in_group(tests, clone, env)
    assert rc == 0, out[-6000:]
    assert re.search(r"\d+ passed", out)
