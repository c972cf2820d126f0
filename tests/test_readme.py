"""The README's two commands. CI (.ci/run) runs both, as they are written, on a clean clone of
the repository: the tests' set-up builds .venv from nothing, then the demo runs in it."""

from __future__ import annotations

import re
from pathlib import Path

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
