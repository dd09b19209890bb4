"""``idempotent services``: start or stop local Kafka/Pulsar test services.

Everything after ``services`` is handed to ``idempotent.testing.services.main`` unparsed, so
:func:`add_parser` only lists the command in the help.
"""

from __future__ import annotations

import importlib

from .common import CliError, Subcommands, exit_code


def add_parser(commands: Subcommands) -> None:
    """List ``idempotent services`` in the help (its arguments are parsed by :func:`run`)."""
    commands.add_parser(
        "services",
        help="start or stop local Kafka/Pulsar test services (see 'idempotent services --help')",
        add_help=False,
    )


def run(argv: list[str]) -> int:
    """``idempotent services ...``: delegate to ``idempotent.testing.services.main``."""
    try:
        module = importlib.import_module("idempotent.testing.services")
    except ImportError as exc:
        raise CliError(f"the services command is not available: {exc}") from None
    delegate = getattr(module, "main", None)
    if not callable(delegate):
        raise CliError("the services command is not available: idempotent.testing.services has no main()")
    code = delegate(argv)
    return exit_code(code)
