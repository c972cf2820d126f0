"""The change ``pipeprof tune`` proposes, as an edit of the script's own ``DataLoader(...)`` call:
its arguments replaced or added in place, and the process-wide settings as statements just
before the statement that makes the loader (where a trial applied them: attach/trial.py).
The rest of the file is left byte for byte."""

from __future__ import annotations

import ast
import difflib
from typing import Any

from pipeprof.analyze.tune import LOADER_KNOBS, WITHOUT_WORKERS

# DataLoader's positional parameters, in order (a call that passes num_workers positionally)
POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers",
              "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn")  # fmt: skip


def literal(value: Any) -> str:
    """A value as source: strings in double quotes, as most code writes them."""
    if isinstance(value, str) and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return repr(value)


class NoLoaderCall(LookupError):
    """No ``DataLoader(...)`` call at the line the loader was made."""


def _callee(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def find_call(tree: ast.AST, line: int) -> ast.Call:
    """The innermost call spanning ``line`` of something named like a loader (``DataLoader``,
    ``StatefulDataLoader``, ``MyLoader``)."""
    spanning = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and n.lineno <= line <= (n.end_lineno or n.lineno)]  # fmt: skip
    named = [n for n in spanning if _callee(n.func).endswith("Loader")]
    if not named:  # made by a framework or a factory of the script's: no call of ours to edit
        raise NoLoaderCall(f"no DataLoader(...) call at line {line}")
    return min(named, key=lambda n: ((n.end_lineno or n.lineno) - n.lineno, -n.col_offset))


def _statement(tree: ast.AST, call: ast.Call) -> ast.stmt:
    """The innermost statement the call is part of (not a def or class around it)."""
    around = [n for n in ast.walk(tree)
              if isinstance(n, ast.stmt)
              and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
              and n.lineno <= call.lineno
              and (n.end_lineno or 0) >= (call.end_lineno or 0)]  # fmt: skip
    if not around:  # pragma: no cover - a call is always inside a statement
        raise NoLoaderCall("the DataLoader call is in no statement")
    return max(around, key=lambda n: n.lineno)


def edited(source: str, line: int, settings: dict[str, Any]) -> str:
    """``source`` with ``settings`` applied to the DataLoader call at ``line``."""
    data = source.encode("utf-8")
    starts = [0]
    for raw in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(raw))

    def at(lineno: int, col: int) -> int:  # ast's (line, byte column) as an offset in data
        return starts[lineno - 1] + col

    if "worker_threads" in settings:
        k = settings["worker_threads"]
        raise NoLoaderCall(f"worker_threads is set in each worker: call torch.set_num_threads({k})"
                           " in the loader's worker_init_fn")  # fmt: skip
    tree = ast.parse(source)
    call = find_call(tree, line)
    edits: list[tuple[int, int, str]] = []  # (start, end, text) in bytes of data
    wanted = {k: settings[k] for k in LOADER_KNOBS if k in settings}
    named = {kw.arg for kw in call.keywords if kw.arg}
    if wanted.get("num_workers") == 0:  # those the call passes, or the setting has, valid
        wanted.update({k: v for k, v in WITHOUT_WORKERS.items() if k in named or k in wanted})
    opaque = [k for k in wanted if k not in named] if (
        any(kw.arg is None for kw in call.keywords)
        or any(isinstance(a, ast.Starred) for a in call.args)
    ) else []  # fmt: skip
    if opaque:  # **config or *args may hold them already: a second value would be an error
        raise NoLoaderCall(f"the call at line {line} passes *args or **kwargs that may hold "
                           f"{', '.join(opaque)}")  # fmt: skip
    kept = dict(wanted)
    for kw in call.keywords:
        if kw.arg in wanted:
            v = kw.value
            edits.append((at(v.lineno, v.col_offset),
                          at(v.end_lineno or v.lineno, v.end_col_offset or 0),
                          literal(wanted[kw.arg])))  # fmt: skip
            kept.pop(kw.arg)
    for i, v in enumerate(call.args[: len(POSITIONAL)]):
        name = POSITIONAL[i]
        if name in kept:
            edits.append((at(v.lineno, v.col_offset),
                          at(v.end_lineno or v.lineno, v.end_col_offset or 0), literal(kept[name])))
            kept.pop(name)
    if kept:
        edits.append(_added(data, call, kept, at))
    before = _process_lines(source, tree, call, settings)
    if before:
        stmt = _statement(tree, call)
        edits.append((at(stmt.lineno, 0), at(stmt.lineno, 0), before))
    for start, end, text in sorted(edits, reverse=True):
        data = data[:start] + text.encode("utf-8") + data[end:]
    return data.decode("utf-8")


def _added(data: bytes, call: ast.Call, kept: dict[str, Any], at: Any) -> tuple[int, int, str]:
    """New keyword arguments after the call's last one, in the call's own layout."""
    args: list[ast.AST] = [*call.args, *call.keywords]
    text = ", ".join(f"{k}={literal(v)}" for k, v in kept.items())
    close = at(call.end_lineno, (call.end_col_offset or 1) - 1)  # the closing parenthesis
    if not args:
        return close, close, text
    last = args[-1]
    end = at(last.end_lineno, last.end_col_offset)  # type: ignore[attr-defined]
    between = data[end:close]
    if last.lineno == call.lineno:  # type: ignore[attr-defined]  # one line, or hugging "("
        return end, end, ", " + text
    line_start = data.rfind(b"\n", 0, end) + 1
    row = data[line_start:].split(b"\n")[0]
    indent = row[: len(row) - len(row.lstrip())].decode("utf-8")
    lines = "".join(f"\n{indent}{k}={literal(v)}," for k, v in kept.items())
    if between.lstrip().startswith(b","):  # a trailing comma: one argument a line after it
        comma = end + between.index(b",") + 1
        return comma, comma, lines
    return end, end, "," + lines[:-1]


def _process_lines(source: str, tree: ast.AST, call: ast.Call, settings: dict[str, Any]) -> str:
    """The process-wide settings as statements, indented as the loader's statement is."""
    stmts = []
    if "sharing_strategy" in settings:
        strategy = literal(settings["sharing_strategy"])
        stmts.append(f"torch.multiprocessing.set_sharing_strategy({strategy})")
    if "torch_threads" in settings:
        stmts.append(f"torch.set_num_threads({settings['torch_threads']!r})")
    if not stmts:
        return ""
    plain = [a for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    if not any(a.name.split(".")[0] == "torch" and a.asname is None for a in plain):
        stmts.insert(0, "import torch")  # (``import torch.nn`` binds ``torch`` too)
    stmt = _statement(tree, call)
    line = source.split("\n")[stmt.lineno - 1]  # as ast counts lines (not at U+2028)
    indent = line[: len(line) - len(line.lstrip())]
    return "".join(f"{indent}{s}\n" for s in stmts)


def diff(path: str, source: str, new: str) -> str:
    """A unified diff of the script, as ``git diff`` would show it."""
    lines = difflib.unified_diff(source.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}")  # fmt: skip
    return "".join(lines)
