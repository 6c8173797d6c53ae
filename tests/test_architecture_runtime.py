"""The runtime is written once, and it stays so (checked on the source).

The runtime's modules -- the worker and its loop, the effects package, the
asyncio face and the transport -- import one another without a cycle
(imports under ``TYPE_CHECKING`` and inside functions count), and none of
them uses a private attribute of another module's object or imports a
private name of another module: the sync and async faces meet through
named calls only (a pass's steps, ``advance_at_current``, ``run_sync``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import reliable_flow

PACKAGE = Path(reliable_flow.__file__).parent
RUNTIME = sorted([PACKAGE / "_worker.py", PACKAGE / "_loop.py", *(PACKAGE / "_effects").glob("*.py"),
                  *(PACKAGE / "aio").glob("*.py"), *(PACKAGE / "transport").rglob("*.py")])
# A namedtuple's own API, not a private attribute.
ALLOWED = {"_replace", "_asdict", "_fields"}


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, wherever the import is."""
    name = _module(path)
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            start = base[: len(base) - node.level + 1] if node.level else []
            module = ".".join(start + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return (found & known) - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (empty when there is none)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_runtime_modules_import_no_cycle() -> None:
    known = {_module(p) for p in RUNTIME}
    assert _cycle({_module(p): _imports(p, known) for p in RUNTIME}) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def _private_reaches(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and node.attr not in ALLOWED
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.ImportFrom) and node.level:
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")
                      and not (node.module is None)]
    return found


@pytest.mark.parametrize("path", RUNTIME, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_reach_between_modules(path: Path) -> None:
    assert _private_reaches(path.read_text(encoding="utf-8")) == []


def test_the_reach_check_sees_one() -> None:
    assert _private_reaches("def f(w):\n    w._failed(1)\n    self._ok()\n") == ["2: w._failed"]
    assert _private_reaches("from ._executor import _POLL, AsyncEffectExecutor\n") == ["1: import _POLL"]
