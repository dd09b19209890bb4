"""Every ``raise`` in idempotent/ and adapters/ raises a member of the one tree in errors.py.

A static scan (AST): a raise that constructs an exception by name must name a class of
``idempotent.errors``. Raising a variable or an attribute (a re-raise, ``raise self.failure``)
or the result of a call to a function (an error built by a mapper such as ``_translate``)
passes; so does a bare ``raise``. A few raises outside the tree are part of a protocol that
is not ours; each is listed below with the reason.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import idempotent.errors as errors

ROOT = Path(__file__).resolve().parent.parent
TREE = {name for name, value in vars(errors).items() if isinstance(value, type) and issubclass(value, BaseException)}
BUILTIN = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}
#: directories (and a module) whose raises follow another API than the library's, and why
FOREIGN = {
    "idempotent/compat/": "the drop-ins reproduce confluent_kafka's and pulsar-client's own exceptions",
    "idempotent/cli/": "argparse's ArgumentTypeError, and CliError, which cli.main turns into exit status 2",
    "idempotent/testing/": "test harnesses and the services tests start: their failures end a test",
    "idempotent/compare/": "the comparison harness (idempotent compare): its failures end a comparison run",
    "idempotent/runtime/future.py": "a concurrent.futures.Future: InvalidStateError, RuntimeError, as the standard one",
}
#: builtin exceptions that Python's own protocols require, anywhere
PROTOCOL = {
    "ImportError": "a missing optional extra is an ImportError naming the extra (as httpx does)",
    "SystemExit": "ends a process",
}
#: builtin exceptions required inside one special method
SPECIAL = {
    "__getitem__": "IndexError",
    "__getattr__": "AttributeError",
    "__next__": "StopIteration",
    # DeliveryFuture's wait: a future's result(timeout) raises TimeoutError, as concurrent.futures does
    "_ended": "TimeoutError",
    # the compiled Kafka write path's refused record, raised as the client's own produce call
    # raises it, so that the adapter's one handler translates both paths' refusals at its edge
    "_native_failure": "KafkaException",
}


def raised_names(path: Path) -> list[tuple[int, str, str]]:
    """(line, class name, enclosing function) of every ``raise Name(...)``/``raise a.Name(...)``."""
    out = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Raise) and isinstance(child.exc, ast.Call):
                func = child.exc.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name[:1].isupper():  # a class, not a function that builds an error
                    out.append((child.lineno, name, function))
            visit(child, function)

    visit(ast.parse(path.read_text(), str(path)), "")
    return out


def test_every_raise_site_raises_a_member_of_the_tree() -> None:
    files = sorted([*(ROOT / "idempotent").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")])
    assert len(files) > 30
    outside = []
    for path in files:
        relative = path.relative_to(ROOT).as_posix()
        if any(relative.startswith(folder) for folder in FOREIGN):
            continue
        for line, name, function in raised_names(path):
            if name in TREE or name in PROTOCOL or SPECIAL.get(function) == name:
                continue
            outside.append(f"{relative}:{line}: raise {name}(...)")
    assert outside == [], "raises outside the tree in errors.py:\n" + "\n".join(outside)


def test_the_scan_sees_raises() -> None:
    """The scan is not vacuous: it finds the tree's classes and would flag a builtin."""
    broker = ROOT / "idempotent" / "broker"
    names = [name for path in ("broker.py", "decisions.py") for _, name, _ in raised_names(broker / path)]
    assert "InvalidBatchError" in names and "PartitionRecoveringError" in names
    sample = raised_names(ROOT / "tests" / "test_raise_sites.py")
    assert ("TypeError" in BUILTIN) and ("TypeError", "_never_called") in [(n, f) for _, n, f in sample]


def _never_called() -> None:  # gives test_the_scan_sees_raises a builtin raise to find
    raise TypeError("not part of the library")
