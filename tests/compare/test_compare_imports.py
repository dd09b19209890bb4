"""The modules of ``idempotent.compare`` import one another without a circle.

Every import counts, also one deferred into a function body (a circle hidden that way is
still one: neither module can be understood, tested or moved without the other).
"""

from __future__ import annotations

import ast
import pathlib

import idempotent.compare

PACKAGE = pathlib.Path(idempotent.compare.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
    """The sibling modules ``path`` imports (relative or absolute), wherever the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:
                found.add(node.module.split(".")[0])
            elif node.level == 1:
                found.update(alias.name for alias in node.names)
            elif node.level == 0 and (node.module or "").startswith("idempotent.compare."):
                found.add((node.module or "").split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("idempotent.compare."))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    return {m: _imports(PACKAGE / f"{m}.py") & modules - {m} for m in modules}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (the modules along it), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_graph_is_read() -> None:
    graph = _graph()
    assert {"runner", "report", "config", "systems", "worker"} <= set(graph)
    assert "report" in graph["runner"] and "systems" in graph["runner"]


def test_compare_modules_have_no_import_circle() -> None:
    """Regression: report imported CompareConfig from runner, runner imported write_report from report."""
    circle = _circle(_graph())
    assert circle is None, " -> ".join(circle or [])


def test_circle_finder_finds_a_circle() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None
