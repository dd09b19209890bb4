"""What every command of the CLI shares: its error, argument types, and read-only access.

A command module (see :mod:`idempotent.cli`) raises :class:`CliError` for a one-line failure,
builds its parser with :data:`Subcommands`, :func:`int_type`, :func:`float_type` and
:func:`topic_type` (every command accepts the same spellings of a topic), and opens
a backend it only reads with :func:`open_read_only`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeAlias
from urllib.parse import urlsplit

from idempotent.broker.broker import validate_topic
from idempotent.core.topics import canonical_topic
from idempotent.runtime.native_logs import CLIENTS_LOGGER, drain_pulsar_logs

from ..api import BrokerAPI
from ..errors import InvalidTopicError

if TYPE_CHECKING:
    Subcommands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Subcommands = argparse._SubParsersAction

#: Environment variable the admin commands read the broker URL from when --url is not given.
URL_ENV = "IDEMPOTENT_URL"
#: Schemes of a broker server: ``stats`` and ``describe-producers`` ask it, nothing is opened here.
SERVER_SCHEMES = ("idem", "idems")
#: Seconds a command tries to reach a Kafka, Pulsar or broker server address by default.
DEFAULT_CONNECT_TIMEOUT = 10.0


class CliError(Exception):
    """A failure the CLI reports as one line; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_type(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer of at least ``minimum`` (``_`` separators allowed)."""

    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be at least {minimum}, got {value}")
        return value

    return parse


def add_connect_timeout(parser: argparse.ArgumentParser) -> None:
    """Give a command that opens a broker URL the ``--connect-timeout`` option."""
    parser.add_argument(
        "--connect-timeout",
        metavar="SECONDS",
        type=positive_float_type,
        default=DEFAULT_CONNECT_TIMEOUT,
        help="how long to try to reach a Kafka, Pulsar or broker server address before failing "
        f"(default {DEFAULT_CONNECT_TIMEOUT:g})",
    )


def positive_float_type(text: str) -> float:
    """An argparse ``type=`` for a finite number > 0."""
    value = float_type(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def float_type(text: str) -> float:
    """An argparse ``type=`` for a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def topic_type(text: str) -> str:
    """An argparse ``type=`` for a topic: its stored name, from any spelling the project
    accepts (:func:`idempotent.core.topics.canonical_topic`)."""
    try:
        return canonical_topic(text)
    except InvalidTopicError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def exit_code(code: object) -> int:
    """The exit code of a ``SystemExit.code`` (a message is printed and exits 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    err(str(code))
    return 1


def err(message: str) -> None:
    """Print one line on stderr."""
    print(message, file=sys.stderr, flush=True)


def isatty(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal (False for streams without a file, or closed ones)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def connect_options(url: str, connect_timeout: float | None) -> dict[str, Any]:
    """The keyword options that give ``connect`` (or a backend) of ``url`` the command's
    ``--connect-timeout``: for Kafka, Pulsar and broker servers; none for SQLite or memory."""
    from idempotent.adapters import NETWORK_SCHEMES  # (idempotent imports adapters only when used)

    if connect_timeout is None or urlsplit(url).scheme not in (*NETWORK_SCHEMES, *SERVER_SCHEMES):
        return {}
    return {"connect_timeout": connect_timeout}


def open_read_only(url: str, connect_timeout: float | None = None) -> BrokerAPI:
    """Open ``url`` to read from it, writing nothing (no topic creation, no snapshots).

    A broker server (``idem://``, ``idems://``, also several hosts) is connected to: reads
    through it write nothing. A backend URL is opened in this process, its backend wrapped
    in :class:`idempotent.adapters.read_only.ReadOnlyBackend`; Kafka and Pulsar are also opened with
    ``read_only=True``, so no partition is taken over from a writer. ``connect_timeout``:
    seconds to try to reach a Kafka, Pulsar or broker server address (their default if None).

    Raises:
        CliError: a ``sqlite://`` URL names a file that does not exist.
        ConfigError: bad URL.
        BackendUnavailableError, BrokerConnectionError: the backend or broker server cannot
            be reached (within ``connect_timeout``, which the message names).
    """
    from idempotent.adapters.read_only import open_read_only_broker

    options = connect_options(url, connect_timeout)
    if urlsplit(url).scheme in SERVER_SCHEMES:
        from .. import connect

        return connect(url, **options)
    if urlsplit(url).scheme == "sqlite":
        from idempotent.adapters.sqlite.backend import parse_sqlite_url

        path, _ = parse_sqlite_url(url)
        if not os.path.exists(path):
            raise CliError(f"no database file {path!r} (from {url})")
    return open_read_only_broker(url, **options)


def partition_count(broker: BrokerAPI, topic: str) -> int:
    """The partition count of an existing topic.

    Raises:
        InvalidTopicError: not a valid topic name.
        CliError: the broker has no such topic (the message lists the topics it has).
    """
    validate_topic(topic)
    if topic not in broker.topics():
        known = ", ".join(sorted(broker.topics())) or "none"
        raise CliError(f"unknown topic {topic!r} in {broker.url} (topics: {known})")
    return broker.partitions_for(topic, create=False)


#: (the level of the project's and other Python loggers, the level of the native clients'
#: loggers) shown for each ``-v`` count: quiet but for errors, then more and more.
VERBOSITY_LEVELS = (
    (logging.ERROR, logging.CRITICAL + 1),
    (logging.INFO, logging.WARNING),
    (logging.DEBUG, logging.INFO),
    (logging.DEBUG, logging.DEBUG),
)


#: The loggers of the native clients' own lines: the project's router (idempotent.runtime.native_logs)
#: and the mirror sources' loggers.
CLIENT_LOGGERS = (CLIENTS_LOGGER, "idempotent.mirror.librdkafka", "idempotent.mirror.pulsar")


class _VerbosityFilter(logging.Filter):
    """Lets a record through at the level its source gets (see :data:`VERBOSITY_LEVELS`)."""

    def __init__(self, own: int, clients: int) -> None:
        super().__init__()
        self.own = own
        self.clients = clients

    def filter(self, record: logging.LogRecord) -> bool:
        client = any(record.name == name or record.name.startswith(name + ".") for name in CLIENT_LOGGERS)
        return record.levelno >= (self.clients if client else self.own)


@contextlib.contextmanager
def command_logging(verbosity: int) -> Iterator[None]:
    """Log records on stderr while a command runs, as much as ``verbosity`` (the count of
    ``-v``) asks for: none but errors by default, and none of the native clients' lines
    (librdkafka, the Pulsar C++ client; :mod:`idempotent.runtime.native_logs`) below ``-v``. The
    root logger's level and handlers are as before afterwards."""
    own, clients = VERBOSITY_LEVELS[max(0, min(verbosity, len(VERBOSITY_LEVELS) - 1))]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.addFilter(_VerbosityFilter(own, clients))
    root = logging.getLogger()
    level = root.level
    root.setLevel(min(own, clients, level if level != logging.NOTSET else logging.WARNING))
    root.addHandler(handler)
    try:
        yield
    finally:
        drain_pulsar_logs()  # lines the Pulsar clients wrote until now, while they still show
        root.removeHandler(handler)
        root.setLevel(level)
