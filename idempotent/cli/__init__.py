"""The ``idempotent`` command line: resumable publishing, reading and inspecting topics.

Subcommands::

    idempotent produce URL TOPIC (--file PATH | --generate N) [options]
    idempotent mirror --from SOURCE --to DEST_URL (--topic T [--to-topic T2] | --topics LIST [--to-prefix P])
                      --job NAME [--follow [--refresh-topics SECONDS]]
    idempotent mirror status --job NAME --to DEST_URL [--from SOURCE] [--to-topic T2 ...] [--json]
    idempotent tail URL TOPIC [--partition P] [--from WHERE | --offset O | --from-beginning]
                              [--count N] [--follow] [--format text|json|FORMAT | --json] [-K SEP]
    idempotent stats URL [TOPIC] [--json]
    idempotent topics list URL [--json]
    idempotent topics describe URL TOPIC [--json]
    idempotent topics create URL TOPIC [--partitions N] [--config KEY=VALUE ...]
    idempotent topics delete URL TOPIC --yes
    idempotent token (--secret-file F | --private-key F [--algorithm A]) --sub NAME [--role R ...]
                     [--ttl SECONDS] [--audience A] [--issuer I] [--roles-claim CLAIM]
    idempotent broker --backend URL [--listen HOST:PORT] [--tls-cert F --tls-key F] [--broker-id ID] [options]
                      [--auth-jwt-secret-file F | --auth-jwt-public-key F] [--auth-* options]
    idempotent admin [--url URL] set-deduplication (TOPIC | NAMESPACE/ | --broker)
                     [--enable | --disable | --clear] [--policy strict|monotonic|clear]
    idempotent admin [--url URL] stats TOPIC [--json]
    idempotent admin [--url URL] describe-producers TOPIC [--partition P] [--json]
    idempotent services ...
    idempotent compare --systems LIST --faults LIST [--records N] [--rate R] [--schedules K] [--seed S] [--out DIR]
                       [--native-schedules K] [--capacity-records N] [--workload produce|ctp] [--resume]
    idempotent compare --long [options above]
    idempotent --version

Every parsed command takes ``-v`` (log lines on stderr, see :func:`.common.command_logging`);
those that open a Kafka, Pulsar or broker server URL take ``--connect-timeout SECONDS``.

Each command is one module of this package (``produce.py``, ``tail.py`` ...). **To add a
command**, write a module with ``add_parser(commands: Subcommands) -> None`` that calls
``commands.add_parser(NAME, ...)``, adds its arguments and sets
``set_defaults(handler=cmd_NAME)``, where ``cmd_NAME(args) -> int`` returns the exit code;
then list the module in :data:`COMMANDS` (the order is the order of ``--help``). What commands
share lives in :mod:`.common` (:class:`~.common.CliError`, argument types, read-only access),
:mod:`.formatting` (records, stats, tables, timestamps) and :mod:`.progress` (progress
reporting). A command that parses its own arguments is also listed in :data:`RAW_COMMANDS`.

Every command takes every broker URL (``sqlite:///``, ``memory://``, ``kafka://``,
``pulsar://``, ``idem://``, ``idems://``; ``tail`` and ``mirror`` also ``kafka+native://`` and
``pulsar+native://``) and every spelling of a topic
(:mod:`idempotent.core.topics`). ``tail`` and ``stats`` never write to the log: on a backend URL
they open the backend read-only (no topic is created, no snapshot or producer record is
stored), so they may run next to a writer; on a broker server URL they ask the server. So do
``admin stats`` and ``admin describe-producers``.

Exit codes: 0 success, 1 failure (a delivery failed, the broker refused), 2 bad usage or
input (bad option, URL or file, unknown topic, a layout that does not match the topic),
130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from idempotent.runtime.collector import fewer_collections

from .. import __version__
from ..errors import DeliveryFailed, ProducerError, UsageError
from . import admin, broker, check, compare, mirror, produce, services, stats, tail, token, topics
from .common import CliError, Parser, command_logging, err, exit_code, open_read_only
from .formatting import format_record

#: The command modules, in the order ``idempotent --help`` lists them; each has ``add_parser``.
COMMANDS: tuple[ModuleType, ...] = (
    produce,
    mirror,
    tail,
    stats,
    topics,
    check,
    token,
    broker,
    admin,
    services,
    compare,
)
VERBOSE_HELP = (
    "show log lines on stderr: -v the project's INFO and the Kafka/Pulsar clients' warnings, "
    "-vv more, -vvv everything (default: errors only)"
)
#: Commands that take their arguments unparsed (``idempotent NAME ARGS...`` calls ``run(ARGS)``).
RAW_COMMANDS: dict[str, Callable[[list[str]], int]] = {"services": services.run}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``idempotent`` command, with every module of :data:`COMMANDS`."""
    parser = Parser(
        prog="idempotent",
        description="Exactly-once publishing over SQLite, Kafka or Pulsar logs.",
        epilog="URLs: sqlite:///relative.db, sqlite:////absolute.db, kafka://host:port, pulsar://host:port, "
        "memory://, idem://host:port, idems://host:port; tail and mirror also read kafka+native://host:port "
        "and pulsar+native://host:port?admin_url=...",
    )
    parser.add_argument("--version", action="version", version=f"idempotent {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(commands)
    for name, command in commands.choices.items():
        if name not in RAW_COMMANDS:  # -v after the command too: idempotent tail URL T -v
            command.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        raw = RAW_COMMANDS.get(args_list[0]) if args_list else None
        if raw is not None:
            return raw(args_list[1:])
        parser = build_parser()
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        handler: Callable[[argparse.Namespace], int] = args.handler
        verbosity = max(args.verbose, getattr(args, "default_verbosity", 0))
        # the commands write and read in bulk: see idempotent.runtime.collector
        with command_logging(verbosity), fewer_collections():
            return handler(args)
    except SystemExit as exc:  # argparse (--help, --version, errors) and delegated commands
        return exit_code(exc.code)
    except CliError as exc:
        err(f"error: {exc.message}")
        return exc.code
    except DeliveryFailed as exc:
        err(f"error: delivery failed ({exc.status.value}): {exc.message}")
        return 1
    except UsageError as exc:
        err(f"error: {exc.message}")
        return 2
    except ProducerError as exc:
        err(f"error: {exc.message}")
        return 1
    except KeyboardInterrupt:
        err("interrupted")
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 0


def _silence_stdout() -> None:
    """After EPIPE (``idempotent tail ... | head``), stop Python failing on its final flush."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


__all__ = ["COMMANDS", "RAW_COMMANDS", "CliError", "build_parser", "format_record", "main", "open_read_only"]
