"""The layers of ``idempotent`` import one another in one direction, without a circle.

Every import counts, also one deferred into a function body or under ``TYPE_CHECKING`` (a
circle hidden that way is still one: neither module can be understood, tested or moved
without the other). ``from package import name`` counts as importing the submodule
``package.name`` when there is one, else the package itself; the implicit import of a
module's parent packages does not count (every module would be in a circle with its
package's ``__init__``).

The rules, by path:

* ``idempotent/core/`` (the sans-I/O core) imports only ``idempotent/core/`` and
  ``idempotent/errors.py``, nowhere, not even in a function;
* the backends (``adapters/``, installed as ``idempotent.adapters``) are imported by the rest
  of the library only lazily (``connect``, the read-only tools), so that their client
  libraries stay optional;
* the developer services (``idempotent/testing/services/``: brokers run from Maven Central)
  are imported only by the rest of ``idempotent/testing/``, by ``idempotent compare`` (which
  runs the brokers it compares) and, lazily, by the CLI's ``services`` command.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: where each package's files are: the backends' folder is the package idempotent.adapters
#: (idempotent/adapters is a link to it, skipped so that no file is read twice)
TREES = (("idempotent", ROOT / "idempotent"), ("idempotent.adapters", ROOT / "adapters"))
CORE = "idempotent.core"
ADAPTERS = "idempotent.adapters"
SERVICES = "idempotent.testing.services"


def _modules() -> dict[str, tuple[pathlib.Path, bool]]:
    """Every module of the library: dotted name -> (file, is a package's __init__)."""
    found = {}
    for package, top in TREES:
        for path in top.rglob("*.py"):
            relative = path.relative_to(top)
            if package == "idempotent" and relative.parts[0] == "adapters":
                continue
            parts = [*package.split("."), *relative.with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


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
    assert "idempotent.broker.broker" in edges["idempotent.adapters.read_only"]  # absolute, at module level
    assert "idempotent.core.checker" in edges["idempotent.broker.broker"]
    assert "idempotent.mirror.source" in edges["idempotent.mirror.engine"]  # ``from .source import``
    assert "idempotent.mirror.source" in edges["idempotent.adapters.kafka.source"]  # across the two trees
    assert imports_of("idempotent.adapters.read_only")[ADAPTERS] is False  # deferred into a function
    assert ADAPTERS in edges["idempotent.connection"]  # deferred, still an edge
    assert not any(path.is_symlink() for path, _ in MODULES.values())


def test_no_import_circle_in_the_library() -> None:
    found = circle(graph())
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_the_core_imports_only_the_core_and_the_errors() -> None:
    outside = sorted(
        f"{module} imports {target}"
        for module in MODULES
        if _within(module, CORE)
        for target in imports_of(module)
        if not (_within(target, CORE) or target == "idempotent.errors")
    )
    assert outside == []


def test_the_library_never_imports_the_backends_at_module_level() -> None:
    eager = sorted(
        f"{module} imports {target}"
        for module in MODULES
        if not _within(module, ADAPTERS)
        for target, at_import in imports_of(module).items()
        if at_import and _within(target, ADAPTERS)
    )
    assert eager == []


def test_only_the_developer_tools_import_the_services() -> None:
    allowed = ("idempotent.testing", "idempotent.compare")
    users = {
        (module, at_import)
        for module in MODULES
        if not any(_within(module, package) for package in allowed)
        for target, at_import in imports_of(module).items()
        if _within(target, SERVICES)
    }
    assert users <= {("idempotent.cli.services", False)}, sorted(users)


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
