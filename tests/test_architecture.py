"""The package's imports go one way: collect → Session → analyze → Report → render.

Every import counts, also those inside functions and under ``TYPE_CHECKING``: a cycle hidden in a
function is still a cycle a reader has to untangle. See docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "pipeprof"

# What each layer may import besides itself. Modules at the package's top level (the public API,
# the CLI, the Report) sit above all layers and may import any of them.
ALLOWED = {
    "core": set(),
    # what profiles someone else's loop: the Profiler (top) through its public surface
    "attach": {"core", "collect", "analyze", "render", "top"},
    "integrations": {"core", "collect", "analyze", "render", "attach", "top"},  # above the layers
    "collect": {"core"},
    "analyze": {"core"},
    "render": {"core"},
    "bench": {"core", "collect", "analyze", "render"},
}
TOP = "top"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The pipeprof modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base_name = ".".join([*base, node.module] if node.module else base)
            else:
                base_name = node.module or ""
            targets = [f"{base_name}.{a.name}" for a in node.names] + [base_name]
            # ``from pipeprof.x import name``: the module x, or x.name when that is a module
            targets = [t for t in targets if t in known] or [base_name]
            targets = targets[:1] if targets[0] != base_name else targets
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def layer(name: str) -> str:
    parts = name.split(".")
    if parts[1:2] == ["integrations"]:  # public paths and exporters (docs/architecture.md)
        return "integrations"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else TOP


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def test_layers_import_only_downwards():
    wrong = []
    for name, targets in graph().items():
        mine = layer(name)
        if mine == TOP:
            continue
        for target in targets:
            theirs = layer(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{name} ({mine}) imports {target} ({theirs})")
    assert not wrong, "imports against the data flow:\n" + "\n".join(sorted(wrong))


def test_no_import_cycles():
    g = graph()
    # the package's __init__ re-exports the API; nothing inside the package imports it back
    back = sorted(n for n, targets in g.items() if "pipeprof" in targets and n != "pipeprof")
    assert not back, f"modules importing the package root (import the module they need): {back}"
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(g[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node)


def test_the_checker_sees_function_level_and_type_only_imports(tmp_path):
    """The walk must find what a reader would: imports in functions and under TYPE_CHECKING."""
    src = tmp_path / "mod.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pipeprof.report import Report\n"
        "def f():\n    from pipeprof.core import stats\n"
    )
    known = {"pipeprof.report", "pipeprof.core", "pipeprof.core.stats"}
    assert imports_of("pipeprof.analyze.mod", src, known) == {
        "pipeprof.report",
        "pipeprof.core.stats",
    }
    assert layer("pipeprof.analyze.mod") == "analyze"
    assert layer("pipeprof.report") == TOP
    assert layer("pipeprof.collect") == "collect"


def _private_names(path: Path, cls: str) -> set[str]:
    """The private names ``cls`` in ``path`` defines: its ``self._x`` fields and ``_x`` methods."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    [node] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    for sub in ast.walk(node):
        owner = sub.value if isinstance(sub, ast.Attribute) else None
        if isinstance(owner, ast.Name) and owner.id == "self":
            names.add(sub.attr)  # type: ignore[attr-defined]
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_nothing_outside_the_profiler_reads_its_private_fields():
    """What profiles someone else's loop (``pipeprof run``, the framework callbacks) uses the
    Profiler's public surface (``running``, ``step_log``, ``begin_pass``, ``release``...), not
    its private fields: a name the Profiler keeps private, read off anything but ``self``
    outside profiler.py, is named here."""
    private = _private_names(ROOT / "profiler.py", "Profiler")
    assert {"_steps_log", "_twins", "_running"} <= private
    found = []
    for name, path in modules().items():
        if name == "pipeprof.profiler":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    found.append(f"{name}:{node.lineno} .{node.attr}")
    assert not found, "the Profiler's private fields read from outside:\n" + "\n".join(found)


def _undocumented_args() -> list[str]:
    """``pipeprof``'s exports, and their public methods, that take arguments and whose
    docstring has no ``Args:`` section."""
    import inspect

    import pipeprof

    missing = []
    for name in pipeprof.__all__:
        obj = getattr(pipeprof, name)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        found = [(name, obj)]
        if inspect.isclass(obj):
            found += [(f"{name}.{m}", f) for m, f in vars(obj).items()
                      if not m.startswith("_") and inspect.isfunction(f)]  # fmt: skip
        for label, fn in found:
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if set(params) - {"self", "cls"} and "Args:" not in (inspect.getdoc(fn) or ""):
                missing.append(label)
    return missing


def test_every_public_function_and_method_says_its_args():
    """Issue 39: an ``Args:`` section for each public function and class that takes any."""
    assert _undocumented_args() == []
