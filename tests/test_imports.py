"""The modules of ``idempotent`` and ``adapters`` import one another without a circle, and the
library never imports the adapters at module level.

Every import counts for circles, also one deferred into a function body or under
``TYPE_CHECKING`` (a circle hidden that way is still one: neither module can be understood,
tested or moved without the other). ``from package import name`` counts as importing the
submodule ``package.name`` when there is one, else the package itself; the implicit import
of a module's parent packages does not count (every module would be in a circle with its
package's ``__init__``).

Adapters import ``idempotent``, never the reverse at module level: ``idempotent`` opens them
lazily (``connect``, the read-only tools), so their client libraries stay optional.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("idempotent", "adapters")


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Every module of the two packages: dotted name -> (file, is a package's __init__)."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """``name`` or its nearest enclosing module of the two packages (``a.b.Class`` -> ``a.b``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> dict[str, bool]:
    """The modules of the two packages ``module`` imports, each with whether the import runs
    when ``module`` is imported (at module level, not in a function or under TYPE_CHECKING)."""
    path, is_package = MODULES[module]
    package = module if is_package else module.rpartition(".")[0]
    found: dict[str, bool] = {}

    def add(name: str, eager: bool) -> None:
        target = _known(name)
        if target is not None and target != module:
            found[target] = found.get(target, False) or eager

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            deferred = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test)
            )
            child_eager = eager and not deferred
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, eager)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    source = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    source = child.module or ""
                for alias in child.names:
                    submodule = f"{source}.{alias.name}"
                    add(submodule if submodule in MODULES else source, eager)
            visit(child, child_eager)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def graph() -> dict[str, set[str]]:
    return {module: set(imports_of(module)) for module in MODULES}


def circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``edges`` (the modules along it, the first repeated), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state:
            found = visit(module)
            if found:
                return found
    return None


def test_the_graph_is_read() -> None:
    edges = graph()
    assert len(edges) > 100
    assert "idempotent.broker" in edges["idempotent.adapters.read_only"]  # absolute, at module level
    assert "idempotent.core.checker" in edges["idempotent.broker"]  # relative
    assert "idempotent.mirror.source" in edges["idempotent.mirror.kafka"]  # ``from .source import``
    assert imports_of("idempotent.adapters.read_only")["adapters"] is False  # deferred into a function
    assert "adapters" in edges["idempotent.connection"]  # deferred, still an edge


def test_no_import_circle_in_idempotent_and_adapters() -> None:
    found = circle(graph())
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_idempotent_never_imports_adapters_at_module_level() -> None:
    eager = sorted(
        f"{module} imports {target}"
        for module in MODULES
        if module.split(".")[0] == "idempotent"
        for target, at_import in imports_of(module).items()
        if at_import and target.split(".")[0] == "adapters"
    )
    assert eager == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": set()}, None),
        ({"a": {"a"}}, ["a", "a"]),
    ],
)
def test_the_circle_finder(edges: dict[str, set[str]], expected: list[str] | None) -> None:
    assert circle(edges) == expected
