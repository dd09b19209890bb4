"""The ``idempotent`` command line: resumable publishing, reading and inspecting topics.

Subcommands::

    idempotent produce URL TOPIC (--file PATH | --generate N) [options]
    idempotent tail URL TOPIC [--partition P] [--offset O | --from-beginning] [--max N]
                              [--follow] [--format text|json]
    idempotent stats URL [TOPIC] [--json]
    idempotent token (--secret-file F | --private-key F [--algorithm A]) --sub NAME [--role R ...]
                     [--ttl SECONDS] [--audience A] [--issuer I] [--roles-claim CLAIM]
    idempotent broker --backend URL [--listen HOST:PORT] [--tls-cert F --tls-key F] [--broker-id ID] [options]
                      [--auth-jwt-secret-file F | --auth-jwt-public-key F] [--auth-* options]
    idempotent admin [--url URL] set-deduplication (TOPIC | NAMESPACE/ | --broker)
                     [--enable | --disable | --clear] [--policy strict|monotonic|clear]
    idempotent admin [--url URL] stats TOPIC [--json]
    idempotent admin [--url URL] describe-producers TOPIC [--partition P] [--json]
    idempotent services ...
    idempotent --version

``produce`` is resumable: running the same command again after a crash (even ``kill -9``)
stores every record exactly once. It uses a *named* producer (by default derived from the
topic and the input) and a fixed layout: record ``i`` of the input goes to partition
``i % P`` and is the ``i // P``-th record of its partition, so it carries sequence ``i // P``.
When the named producer starts again, the broker reports the last sequence it stored per
partition; every record up to it is skipped and the rest is sent. Records that were in
flight at the crash and sent again are recognised by the broker as duplicates.

``tail`` and ``stats`` never write to the log: they open the backend read-only (no topic is
created, no snapshot or producer record is stored), so they may run next to a writer; so do
``admin stats`` and ``admin describe-producers`` on a backend URL. ``admin`` takes its URL
from ``--url`` or ``$IDEMPOTENT_URL`` (see ``docs/operations.md``).

Exit codes: 0 success, 1 failure (a delivery failed, the broker refused), 2 bad usage or
input (bad option, URL or file, unknown topic, a layout that does not match the topic),
130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import importlib
import itertools
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import IO, Any, NoReturn
from urllib.parse import urlsplit

import attrs

from . import __version__
from ._outcomes import RecordMetadata
from ._ownership import Lease
from ._records import Snapshot, StoredBatch, StoredRecord
from ._registry import ProducerRecord
from ._types import SEQUENCE_SPACE
from .api import BrokerAPI
from .backend import AppendBatch, LogBackend
from .broker import Broker, BrokerConfig, PartitionStats, validate_topic
from .errors import DeliveryFailed, InvalidTopicError, ProducerError, UsageError
from .producer import Producer

#: Futures kept before the oldest are checked; bounds memory for inputs of any length.
WINDOW = 20_000
#: How many of the oldest futures are checked at a time once the window is full.
CHUNK = 5_000
#: Length of the prefix ``record-%012d`` of a generated record.
GENERATED_PREFIX = 19
MAX_GENERATED = 10**12 - 1
TAIL_DEFAULT_LAST = 10
FOLLOW_INTERVAL = 0.5
TEXT_VALUE_LIMIT = 200


class CliError(Exception):
    """A failure the CLI reports as one line; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# -- argument parsing ----------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _int_type(minimum: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be at least {minimum}, got {value}")
        return value

    return parse


def _float_type(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``idempotent`` command."""
    parser = _Parser(
        prog="idempotent",
        description="Exactly-once publishing over SQLite, Kafka or Pulsar logs.",
        epilog="URLs: sqlite:///relative.db, sqlite:////absolute.db, kafka://host:port, pulsar://host:port, memory://",
    )
    parser.add_argument("--version", action="version", version=f"idempotent {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    produce = commands.add_parser(
        "produce",
        help="publish the lines of a file or generated records, resumably",
        description="Publish each line of a file (without its newline) or N generated records. "
        "Resumable: run the same command again after a crash and every record is stored "
        "exactly once.",
    )
    produce.add_argument("url", metavar="URL")
    produce.add_argument("topic", metavar="TOPIC")
    source = produce.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", metavar="PATH", help="publish each line of this file")
    source.add_argument(
        "--generate",
        metavar="N",
        type=_int_type(0, "--generate"),
        help="publish N deterministic records 'record-%%012d' padded to --size bytes",
    )
    produce.add_argument(
        "--producer-name",
        metavar="NAME",
        help="producer name (default: derived from the topic and the input, so that the same command resumes)",
    )
    produce.add_argument(
        "--partitions",
        metavar="N",
        type=_int_type(1, "--partitions"),
        help="create the topic with N partitions (default: its existing count, or the "
        "broker's default for a new topic); cannot change between runs",
    )
    produce.add_argument(
        "--size",
        metavar="BYTES",
        type=_int_type(GENERATED_PREFIX, "--size"),
        default=100,
        help="size of each generated record (default 100)",
    )
    produce.add_argument("--linger-ms", metavar="MS", type=_float_type, default=5.0, help="batch linger (default 5)")
    produce.add_argument(
        "--max-in-flight",
        metavar="N",
        type=_int_type(1, "--max-in-flight"),
        default=5,
        help="pipelined batches per partition (default 5)",
    )
    produce.add_argument("--no-progress", action="store_true", help="no progress bar")
    produce.add_argument("--quiet", action="store_true", help="print nothing but errors (no bar, no summary)")
    produce.set_defaults(handler=cmd_produce)

    tail = commands.add_parser(
        "tail",
        help="print records of a topic",
        description="Print records of a topic: by default the last 10 of each partition.",
    )
    tail.add_argument("url", metavar="URL")
    tail.add_argument("topic", metavar="TOPIC")
    tail.add_argument("--partition", metavar="P", type=_int_type(0, "--partition"), help="only this partition")
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--offset",
        metavar="O",
        type=_int_type(0, "--offset"),
        help="start at this offset (in every partition read)",
    )
    start.add_argument("--from-beginning", action="store_true", help="start at offset 0")
    tail.add_argument("--max", metavar="N", type=_int_type(1, "--max"), help="stop after N records in all")
    tail.add_argument("--follow", "-f", action="store_true", help="keep polling for new records until Ctrl-C")
    tail.add_argument("--format", choices=("text", "json"), default="text")
    tail.set_defaults(handler=cmd_tail)

    stats = commands.add_parser(
        "stats",
        help="show the checker state of every partition",
        description="Show the sequence checker's state per partition (of one topic or all).",
    )
    stats.add_argument("url", metavar="URL")
    stats.add_argument("topic", metavar="TOPIC", nargs="?")
    stats.add_argument("--json", action="store_true", help="print a JSON list")
    stats.set_defaults(handler=cmd_stats)

    token = commands.add_parser(
        "token",
        help="sign an access token for a broker server",
        description="Print a signed JWT for a broker server that authenticates with tokens (see docs/security.md).",
    )
    key = token.add_mutually_exclusive_group(required=True)
    key.add_argument("--secret-file", metavar="F", help="HMAC secret shared with the broker (HS256/384/512)")
    key.add_argument("--private-key", metavar="F", help="PEM private key whose public key the broker has")
    token.add_argument(
        "--algorithm",
        default=None,
        help="HS256 (default with --secret-file), RS256 (default with --private-key), ES256, EdDSA, ...",
    )
    token.add_argument("--sub", required=True, help="the principal's name")
    token.add_argument("--role", action="append", default=[], help="a role, e.g. admin (repeatable)")
    token.add_argument("--ttl", type=_float_type, default=3600.0, help="seconds the token is valid (default 3600)")
    token.add_argument("--audience", help="the aud claim the broker expects")
    token.add_argument("--issuer", help="the iss claim the broker expects")
    token.add_argument("--roles-claim", default="roles", help="claim (dotted path) for the roles (default roles)")
    token.set_defaults(handler=cmd_token)
    _add_broker_command(commands)
    _add_admin_parser(commands)

    commands.add_parser(
        "services",
        help="start or stop local Kafka/Pulsar test services (see 'idempotent services --help')",
        add_help=False,
    )
    return parser


# -- entry point ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        if args_list[:1] == ["services"]:
            return cmd_services(args_list[1:])
        parser = build_parser()
        args = parser.parse_args(args_list)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except SystemExit as exc:  # argparse (--help, --version, errors) and delegated commands
        return _exit_code(exc.code)
    except CliError as exc:
        _err(f"error: {exc.message}")
        return exc.code
    except DeliveryFailed as exc:
        _err(f"error: delivery failed ({exc.status.value}): {exc.message}")
        return 1
    except UsageError as exc:
        _err(f"error: {exc.message}")
        return 2
    except ProducerError as exc:
        _err(f"error: {exc.message}")
        return 1
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    _err(str(code))
    return 1


def _err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _silence_stdout() -> None:
    """After EPIPE (``idempotent tail ... | head``), stop Python failing on its final flush."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


# -- read-only access ----------------------------------------------------------------------


class ReadOnlyBackend:
    """A :class:`~idempotent.backend.LogBackend` wrapper that never writes.

    Reads pass through. Derived state a broker persists on its own (checker snapshots,
    producer records flagged after expiry) is dropped; writes of data, topics, producer ids
    or settings are refused.
    """

    def __init__(self, inner: LogBackend) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable

    def _refuse(self, what: str) -> NoReturn:
        raise UsageError(f"{self.url} is opened read-only: cannot {what}")

    def list_topics(self) -> dict[str, int]:
        return self.inner.list_topics()

    def create_topic(self, topic: str, partitions: int) -> None:
        self._refuse(f"create topic {topic!r}")

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        self._refuse(f"append to {topic}[{partition}]")

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        return self.inner.read(topic, partition, offset, max_records)

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        return self.inner.replay(topic, partition, from_offset)

    def end_offset(self, topic: str, partition: int) -> int:
        return self.inner.end_offset(topic, partition)

    def latest_snapshot(self, topic: str, partition: int) -> Snapshot | None:
        return self.inner.latest_snapshot(topic, partition)

    def write_snapshot(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        return None

    def allocate_producer_ids(self, count: int) -> int:
        self._refuse("allocate producer ids")

    def load_producers(self) -> list[ProducerRecord]:
        return self.inner.load_producers()

    def save_producer(self, record: ProducerRecord) -> None:
        return None

    def load_settings(self) -> dict[str, str]:
        return self.inner.load_settings()

    def save_setting(self, key: str, value: str | None) -> None:
        self._refuse("change settings")

    def load_leases(self) -> list[Lease]:
        return self.inner.load_leases()

    def propose_leases(self, proposals: Sequence[Lease]) -> list[Lease | None]:
        self._refuse("claim partitions")

    def release(self, topic: str, partition: int) -> None:
        return None

    def close(self) -> None:
        self.inner.close()


def open_read_only(url: str) -> Broker:
    """Open a broker over ``url`` that never writes (no topic creation, no snapshots).

    Raises:
        CliError: a ``sqlite://`` URL names a file that does not exist.
        ConfigError: bad URL.
    """
    from adapters import open_backend

    if urlsplit(url).scheme == "sqlite":
        from adapters.sqlite import parse_sqlite_url

        path, _ = parse_sqlite_url(url)
        if not os.path.exists(path):
            raise CliError(f"no database file {path!r} (from {url})")
    scheme = urlsplit(url).scheme
    options: dict[str, object] = {"read_only": True} if scheme in ("kafka", "pulsar") else {}
    backend = ReadOnlyBackend(open_backend(url, **options))
    try:
        return Broker(backend, BrokerConfig(auto_create_topics=False, maintenance_interval=0))
    except BaseException:
        backend.close()
        raise


def _partition_count(broker: BrokerAPI, topic: str) -> int:
    validate_topic(topic)
    if topic not in broker.topics():
        known = ", ".join(sorted(broker.topics())) or "none"
        raise CliError(f"unknown topic {topic!r} in {broker.url} (topics: {known})")
    return broker.partitions_for(topic, create=False)


# -- produce -------------------------------------------------------------------------------


@attrs.frozen
class _Source:
    """The records to publish: the lines of a file or N generated records."""

    count: int
    default_name: str
    path: str | None = None
    size: int = 0

    def records(self, start: int) -> Iterator[bytes]:
        """Record ``start``, ``start + 1``, ... up to ``count``."""
        if self.path is None:
            filler = _filler(self.size - GENERATED_PREFIX)
            return (b"record-%012d%s" % (i, filler) for i in range(start, self.count))
        return itertools.islice(_lines(self.path), start, self.count)

    def records_at(self, indexes: set[int]) -> dict[int, bytes]:
        """The records at some indexes (one pass over a file)."""
        if self.path is None:
            filler = _filler(self.size - GENERATED_PREFIX)
            return {i: b"record-%012d%s" % (i, filler) for i in indexes if i < self.count}
        out: dict[int, bytes] = {}
        if not indexes:
            return out
        last = max(indexes)
        for i, line in enumerate(itertools.islice(_lines(self.path), self.count)):
            if i in indexes:
                out[i] = line
            if i >= last:
                break
        return out


def _filler(length: int) -> bytes:
    pattern = b" abcdefghijklmnopqrstuvwxyz0123456789"
    return (pattern * (length // len(pattern) + 1))[:length]


def _lines(path: str) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        for line in handle:
            yield line[:-1] if line.endswith(b"\n") else line


def _count_lines(path: str) -> int:
    count = 0
    last = b"\n"
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def _source(args: argparse.Namespace) -> _Source:
    topic = args.topic
    if args.file is not None:
        path = args.file
        if path == "-":
            raise CliError(
                "--file - (stdin) is not supported: a resumed run must read the same input "
                "again; save it to a file first"
            )
        if not os.path.exists(path):
            raise CliError(f"no such file: {path!r}")
        if not os.path.isfile(path):
            raise CliError(f"not a regular file: {path!r}")
        absolute = os.path.abspath(path)
        try:
            count = _count_lines(path)
        except OSError as exc:
            raise CliError(f"cannot read {path!r}: {exc.strerror or exc}") from None
        digest = hashlib.sha256(absolute.encode()).hexdigest()[:16]
        name = f"cli:{topic}:file:{os.path.basename(absolute)}:{digest}"
        return _Source(count, name, path=path)
    n, size = args.generate, args.size
    if n > MAX_GENERATED:
        raise CliError(f"--generate is limited to {MAX_GENERATED} records")
    return _Source(n, f"cli:{topic}:generate:{n}:{size}", size=size)


def _topic_layout(broker: BrokerAPI, topic: str, requested: int | None) -> int:
    """The topic's partition count, creating the topic first if needed."""
    validate_topic(topic)
    existing = broker.topics().get(topic)
    if requested is None:
        return existing if existing is not None else broker.partitions_for(topic)
    if existing is not None and existing != requested:
        raise CliError(
            f"topic {topic!r} already has {existing} partition(s), not {requested}: records are "
            "assigned to partitions by their position in the input, so the partition count "
            "cannot change between runs (omit --partitions to use the existing count, or use "
            "another topic)"
        )
    broker.create_topic(topic, requested)
    return requested


def _partition_share(count: int, partitions: int, partition: int) -> int:
    """How many of ``count`` records go to ``partition`` (record i to i % partitions)."""
    return max(0, (count - partition + partitions - 1) // partitions)


def _check_resume(producer: Producer, topic: str, partitions: int, last: list[int], source: _Source) -> None:
    """Refuse to resume when what the broker stored does not fit this input and layout.

    Raises:
        CliError: more records stored than the input puts on a partition; the last stored
            record of the producer on a partition is not the one the input puts there; or the
            broker lost the producer's state on a partition whose newest record is its own.
    """
    name = producer.producer_name
    hint = (
        "the input or the partition layout changed since the previous run with this producer "
        "name; use another --producer-name or topic to publish it as new data"
    )
    for p, h in enumerate(last):
        share = _partition_share(source.count, partitions, p)
        if h + 1 > share:
            raise CliError(
                f"{topic}[{p}] already holds {h + 1} records of producer {name!r}, but this "
                f"input puts only {share} there: {hint}"
            )
    broker = producer.broker
    for p, h in enumerate(last):
        end = broker.end_offset(topic, p)
        if h < 0 and end > 0:
            newest = broker.read(topic, p, end - 1, 1)
            if newest and newest[0].producer_id == producer.producer_id:
                raise CliError(
                    f"{topic}[{p}] holds records of producer {name!r}, but the broker no longer "
                    "has its sequence state there (it expired or was evicted), so what was "
                    "stored cannot be told apart from what was not: resuming could duplicate "
                    "records. Publish to a new topic, or use another --producer-name to publish "
                    "the whole input again as new data"
                )
    if all(h < 0 for h in last):
        return
    offsets: dict[int, int] = {}
    for part in broker.stats(topic):
        for ps in part.producers:
            if ps.producer_id == producer.producer_id and ps.last_sequence == last[part.partition]:
                offsets[part.partition] = ps.last_offset
    expected_at = {p: h * partitions + p for p, h in enumerate(last) if h >= 0}
    expected = source.records_at(set(expected_at.values()))
    for p, index in expected_at.items():
        offset = offsets.get(p, -1)
        if offset < 0:
            continue
        got = broker.read(topic, p, offset, 1)
        if not got or got[0].offset != offset:
            continue
        record = got[0]
        if record.producer_id != producer.producer_id or record.sequence != last[p]:
            raise CliError(
                f"{topic}[{p}] offset {offset} holds producer {record.producer_id} sequence "
                f"{record.sequence}, not producer {producer.producer_id} sequence {last[p]}: "
                "the log does not match the broker's producer state"
            )
        if record.value != expected.get(index):
            raise CliError(
                f"{topic}[{p}] offset {offset}: the last record stored by producer {name!r} "
                f"is not record {index} of this input: {hint}"
            )


def cmd_produce(args: argparse.Namespace) -> int:
    """``idempotent produce``: publish a file's lines or generated records, resumably."""
    started = time.monotonic()
    source = _source(args)
    topic: str = args.topic
    from . import connect

    broker = connect(args.url)
    producer: Producer | None = None
    sent = duplicates = acknowledged = 0
    clean = sending = False
    try:
        partitions = _topic_layout(broker, topic, args.partitions)
        if source.count and (source.count - 1) // partitions >= SEQUENCE_SPACE:
            raise CliError(f"at most {SEQUENCE_SPACE} records per partition")
        producer = Producer(
            broker,
            args.producer_name or source.default_name,
            linger_ms=args.linger_ms,
            max_in_flight=args.max_in_flight,
        )
        last = [producer.last_sequence(topic, p) for p in range(partitions)]
        _check_resume(producer, topic, partitions, last, source)
        skipped = sum(h + 1 for h in last)
        # Every record before the first unsent one of every partition is skipped wholesale.
        start = min(((h + 1) * partitions + p for p, h in enumerate(last)), default=source.count)
        start = min(start, source.count)
        pending: deque[Future[RecordMetadata]] = deque()
        bar = _progress(args, source.count, skipped)

        def drain(keep: int) -> None:
            nonlocal duplicates, acknowledged
            done = 0
            while len(pending) > keep:
                if pending.popleft().result().duplicate:
                    duplicates += 1
                done += 1
            acknowledged += done
            if bar is not None:
                bar.update(done)

        sending = True
        try:
            send = producer.send
            for i, value in enumerate(source.records(start), start):
                p = i % partitions
                if i // partitions <= last[p]:
                    continue
                pending.append(send(topic, value, partition=p))
                sent += 1
                if len(pending) >= WINDOW:
                    drain(WINDOW - CHUNK)
            producer.flush()
            drain(0)
        finally:
            if bar is not None:
                bar.close()
        clean = True
    except ProducerError as exc:
        if not sending or isinstance(exc, UsageError):
            raise
        status = f" ({exc.status.value})" if isinstance(exc, DeliveryFailed) else ""
        raise CliError(
            f"delivery failed{status}: {exc.message}\n"
            f"{acknowledged} records were acknowledged in this run before the failure. Stored "
            "records are kept: run the same command again to resume (stored records are "
            "skipped, nothing is duplicated).",
            code=1,
        ) from None
    except KeyboardInterrupt:
        raise CliError(
            f"interrupted after sending {sent} records ({acknowledged} known stored); run the "
            "same command again to resume (stored records are skipped)",
            code=130,
        ) from None
    finally:
        try:
            if producer is not None:
                producer.close(None if clean else 10.0)
        finally:
            broker.close()
    elapsed = time.monotonic() - started
    if not args.quiet:
        rate = sent / elapsed if elapsed > 0 else 0.0
        print(
            f"{topic}: sent={sent} skipped={skipped} duplicates={duplicates} "
            f"elapsed={elapsed:.2f}s rate={rate:.0f} records/s "
            f"(partitions={partitions}, producer={producer.producer_name if producer else None!r})",
            flush=True,
        )
    return 0


def _progress(args: argparse.Namespace, total: int, initial: int) -> Any:
    if args.quiet or args.no_progress or not _isatty(sys.stderr):
        return None
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="rec",
        unit_scale=True,
        mininterval=0.5,
        file=sys.stderr,
        desc=args.topic,
    )


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -- tail ----------------------------------------------------------------------------------


def _text(data: bytes | None, limit: int | None) -> str | None:
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return text


def format_record(topic: str, partition: int, record: StoredRecord, fmt: str) -> str:
    """One record as a line of ``tail`` output (``text`` or ``json``)."""
    if fmt == "json":
        return json.dumps(
            {
                "topic": topic,
                "partition": partition,
                "offset": record.offset,
                "producer_id": record.producer_id,
                "producer_epoch": record.producer_epoch,
                "sequence": record.sequence,
                "timestamp": record.timestamp,
                "key": _text(record.key, None),
                "value": _text(record.value, None),
                "headers": [[name, _text(data, None)] for name, data in record.headers],
            },
            ensure_ascii=False,
        )

    def show(data: bytes | None) -> str:
        text = _text(data, TEXT_VALUE_LIMIT)
        if text is None:
            return "null"
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")

    return (
        f"{topic}[{partition}] offset={record.offset} producer={record.producer_id} "
        f"epoch={record.producer_epoch} seq={record.sequence} "
        f"key={show(record.key)} value={show(record.value)}"
    )


def cmd_tail(args: argparse.Namespace) -> int:
    """``idempotent tail``: print records of a topic, optionally following new ones."""
    broker = open_read_only(args.url)
    try:
        topic: str = args.topic
        count = _partition_count(broker, topic)
        if args.partition is not None and args.partition >= count:
            raise CliError(f"topic {topic!r} has partitions 0..{count - 1}, not {args.partition}")
        parts = [args.partition] if args.partition is not None else list(range(count))
        if args.offset is not None:
            offsets = {p: args.offset for p in parts}
        elif args.from_beginning:
            offsets = {p: 0 for p in parts}
        else:
            offsets = {p: max(0, broker.end_offset(topic, p) - TAIL_DEFAULT_LAST) for p in parts}
        remaining: int | None = args.max
        out = sys.stdout
        try:
            while True:
                printed = 0
                for p in parts:
                    while remaining is None or remaining > 0:
                        limit = 500 if remaining is None else min(500, remaining)
                        records = broker.read(topic, p, offsets[p], limit)
                        if not records:
                            break
                        for record in records:
                            out.write(format_record(topic, p, record, args.format) + "\n")
                        offsets[p] = records[-1].offset + 1
                        printed += len(records)
                        if remaining is not None:
                            remaining -= len(records)
                if not args.follow or remaining == 0:
                    break
                out.flush()
                if not printed:
                    time.sleep(FOLLOW_INTERVAL)
        except KeyboardInterrupt:
            if not args.follow:
                raise
        out.flush()
        return 0
    finally:
        broker.close()


# -- stats ---------------------------------------------------------------------------------


def _stats_dict(stats: PartitionStats) -> dict[str, Any]:
    return attrs.asdict(stats)


def format_stats(stats: PartitionStats) -> str:
    """One partition's block of ``stats`` output."""
    if stats.snapshot_position >= 0:
        age = "" if stats.snapshot_age is None else f", {stats.snapshot_age:.1f} s old"
        snapshot = f"snapshot at {stats.snapshot_position}{age}"
    else:
        snapshot = "no snapshot"
    lines = [
        f"{stats.topic}[{stats.partition}]: {stats.status}, "
        f"dedup {'on' if stats.deduplication else 'off'}, policy {stats.policy}",
        f"  position {stats.position} (pending {stats.pending}), {snapshot}, "
        f"{stats.entries_since_snapshot} entries since snapshot",
        f"  recovery {stats.recovery_seconds:.3f} s, {stats.replayed_batches} batches replayed",
    ]
    if not stats.producers:
        lines.append("  producers: none")
        return "\n".join(lines)
    header = ("id", "name", "epoch", "last_seq", "last_offset")
    rows = [header] + [
        (
            str(p.producer_id),
            p.producer_name if p.producer_name is not None else "-",
            str(p.producer_epoch),
            str(p.last_sequence),
            str(p.last_offset),
        )
        for p in stats.producers
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines.append(f"  producers: {len(stats.producers)}")
    for row in rows:
        cells = [
            cell.ljust(w) if i == 1 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("    " + "  ".join(cells).rstrip())
    return "\n".join(lines)


def cmd_stats(args: argparse.Namespace) -> int:
    """``idempotent stats``: the checker state of every partition (of one topic)."""
    broker = open_read_only(args.url)
    try:
        if args.topic is not None:
            _partition_count(broker, args.topic)
        stats = broker.stats(args.topic)
        if args.json:
            print(json.dumps([_stats_dict(s) for s in stats], indent=2))
        elif not stats:
            print(f"no topics in {broker.url}")
        else:
            print("\n\n".join(format_stats(s) for s in stats))
        return 0
    finally:
        broker.close()


# -- broker server ---------------------------------------------------------------------------


def _add_broker_command(commands: Any) -> None:
    broker = commands.add_parser(
        "broker",
        help="serve a backend to producers over the network (idem:// or idems://)",
        description="Run a broker server: the sequence checker over BACKEND, served over TCP "
        "(TLS with --tls-cert/--tls-key). Clients connect with idem://HOST:PORT (idems:// for "
        "TLS). SIGTERM or Ctrl-C stops accepting, answers what is in flight, and exits.",
    )
    broker.add_argument("--backend", metavar="URL", required=True, help="sqlite:///file.db, kafka://..., pulsar://...")
    broker.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:7650", help="default 127.0.0.1:7650")
    broker.add_argument("--advertise", metavar="HOST:PORT", help="address clients should use (default: --listen)")
    broker.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate chain (PEM)")
    broker.add_argument("--tls-key", metavar="FILE", help="private key of --tls-cert (PEM)")
    broker.add_argument("--tls-client-ca", metavar="FILE", help="require client certificates signed by this CA")
    auth = broker.add_argument_group("authentication (see docs/security.md)")
    key = auth.add_mutually_exclusive_group()
    key.add_argument("--auth-jwt-secret-file", metavar="FILE", help="require HMAC-signed JWTs (HS256) with this secret")
    key.add_argument("--auth-jwt-public-key", metavar="FILE", help="require JWTs signed by this PEM public key's owner")
    auth.add_argument(
        "--auth-jwt-algorithm",
        metavar="ALG",
        action="append",
        help="accepted algorithm (repeatable; default HS256 with a secret, every one of the key's type with a key)",
    )
    auth.add_argument("--auth-audience", metavar="AUD", help="tokens must name this audience (aud)")
    auth.add_argument("--auth-issuer", metavar="ISS", help="tokens must come from this issuer (iss)")
    auth.add_argument("--auth-leeway", metavar="S", type=_float_type, default=30.0, help="clock skew allowed (30)")
    auth.add_argument("--auth-roles-claim", metavar="CLAIM", default="roles", help="claim holding the roles (roles)")
    auth.add_argument("--auth-admin-role", metavar="ROLE", default="admin", help="role of administrators (admin)")
    auth.add_argument(
        "--auth-optional",
        action="store_true",
        help="let connections without a token in, as the anonymous principal (migration only)",
    )
    auth.add_argument(
        "--auth-adopt-unowned",
        action="store_true",
        help="let a principal take over producer names created before authentication was on",
    )
    broker.add_argument("--max-in-flight", metavar="N", type=_int_type(1, "--max-in-flight"), default=64)
    broker.add_argument("--max-frame", metavar="BYTES", type=_int_type(1024, "--max-frame"), default=16 * 1024 * 1024)
    broker.add_argument("--idle-timeout", metavar="S", type=_float_type, default=300.0)
    broker.add_argument("--ready-file", metavar="PATH", help="write the listening address here once serving")
    broker.add_argument(
        "--broker-id",
        metavar="ID",
        help="run as one of several brokers over one Kafka or Pulsar cluster, each owning some partitions "
        "(docs/clustering.md); unique per broker",
    )
    broker.add_argument(
        "--lease-seconds",
        metavar="S",
        type=_float_type,
        default=10.0,
        help="with --broker-id: partitions of a broker silent this long are taken over (default 10)",
    )
    broker.add_argument(
        "--metrics-listen", metavar="HOST:PORT", help="serve Prometheus metrics at http://HOST:PORT/metrics"
    )
    broker.set_defaults(handler=cmd_broker)


def cmd_broker(args: argparse.Namespace) -> int:
    """``idempotent broker``: serve a backend over the network until SIGTERM/SIGINT."""
    import logging

    from .server import BrokerServer, ServerConfig, parse_listen, server_ssl_context

    host, port = parse_listen(args.listen)
    if args.tls_key and not args.tls_cert:
        raise CliError("--tls-key needs --tls-cert")
    jwt_options = ("auth_jwt_algorithm", "auth_audience", "auth_issuer", "auth_optional", "auth_adopt_unowned")
    if not (args.auth_jwt_secret_file or args.auth_jwt_public_key) and any(getattr(args, o) for o in jwt_options):
        raise CliError("the --auth-* options need --auth-jwt-secret-file or --auth-jwt-public-key")
    context = server_ssl_context(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    config = ServerConfig(max_frame=args.max_frame, max_in_flight=args.max_in_flight, idle_timeout=args.idle_timeout)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.backend.startswith(("idem://", "idems://")):
        raise CliError("--backend must name a storage backend (sqlite://, kafka://, pulsar://, memory://)")
    from . import connect

    broker_config = None
    if args.broker_id is not None:
        broker_config = BrokerConfig(
            broker_id=args.broker_id, advertised_address=args.advertise or "", lease_duration=args.lease_seconds
        )
    broker = connect(args.backend, broker_config)
    assert isinstance(broker, Broker)
    try:
        security = _broker_security(args, broker)
    except BaseException:
        broker.close()
        raise
    server = BrokerServer(
        broker, host, port, ssl_context=context, advertised_address=args.advertise, config=config, **security
    )

    def ready(served: BrokerServer) -> None:
        if args.broker_id is not None and not args.advertise:
            broker.advertise(served.advertised_address)  # the port is known once bound
        _err(f"serving {broker.url} on {served.url}")
        if security and context is None:
            _err("warning: tokens travel in clear text; serve TLS (--tls-cert) when authenticating")
        if args.ready_file:
            with open(args.ready_file, "w") as out:
                out.write(served.address + "\n")

    metrics = None
    if args.metrics_listen:
        from .metrics import start_metrics_server

        try:
            metrics = start_metrics_server(broker, *parse_listen(args.metrics_listen))
        except BaseException:
            broker.close()
            raise
        _err(f"metrics on {metrics.url}")
    try:
        server.run(on_ready=ready)
    finally:
        if metrics is not None:
            metrics.close()
    return 0


def _broker_security(args: argparse.Namespace, broker: Broker) -> dict[str, Any]:
    """The server's authenticator, authorizer and claim hooks from the ``--auth-*`` options
    (none without a JWT key: every connection may do everything)."""
    from .auth import AccessPolicy, BrokerGuard, JWTAuthenticator

    if not (args.auth_jwt_secret_file or args.auth_jwt_public_key):
        return {}
    options: dict[str, Any] = {
        "audience": args.auth_audience,
        "issuer": args.auth_issuer,
        "leeway": args.auth_leeway,
        "roles_claim": args.auth_roles_claim,
        "required": not args.auth_optional,
    }
    if args.auth_jwt_secret_file:
        authenticator = JWTAuthenticator.from_secret_file(
            args.auth_jwt_secret_file, args.auth_jwt_algorithm or ("HS256",), **options
        )
    else:
        authenticator = JWTAuthenticator.from_public_key_file(
            args.auth_jwt_public_key, args.auth_jwt_algorithm, **options
        )
    policy = AccessPolicy(admin_role=args.auth_admin_role, adopt_unowned=args.auth_adopt_unowned)
    # refresh: a producer initialised through another broker of the cluster has an owner too
    guard = BrokerGuard(authenticator, policy, functools.partial(broker.producer_record, refresh=True))
    return {"authenticator": guard.authenticate, "authorizer": guard.authorize, "claim": guard.claim}


# -- admin ---------------------------------------------------------------------------------
#
# ``idempotent admin``: deduplication settings and checker state of a broker, over the
# BrokerAPI surface, so that the same commands work on a backend URL (a broker opened in this
# process) and on a broker server (``idem://host:port``).

#: Environment variable the admin commands read the broker URL from when --url is not given.
URL_ENV = "IDEMPOTENT_URL"
#: Schemes of a broker server: ``stats`` and ``describe-producers`` ask it, nothing is opened here.
SERVER_SCHEMES = ("idem", "idems")
_POLICY_CHOICES = ("strict", "monotonic", "clear")


@attrs.frozen
class AdminTarget:
    """What ``set-deduplication`` changes: a topic, a namespace, or the broker-wide default."""

    kind: str  # "topic", "namespace" or "broker"
    name: str | None

    def describe(self) -> str:
        if self.kind == "broker":
            return "broker default"
        if self.kind == "namespace":
            return "root namespace" if self.name == "" else f"namespace {self.name!r}"
        return f"topic {self.name!r}"

    def keywords(self) -> dict[str, str]:
        """The ``topic=`` / ``namespace=`` keyword of ``set_deduplication`` and ``set_policy``."""
        return {} if self.name is None else {self.kind: self.name}


def parse_admin_target(text: str | None) -> AdminTarget:
    """The target of ``set-deduplication``: a topic, or a namespace when it ends with ``/``.

    A topic's namespace is the part of its name before its last ``/`` (``tenant/ns/orders``
    is in namespace ``tenant/ns``, ``orders`` in the root namespace ``""``), as
    :func:`idempotent._types.namespace_of` defines. So ``tenant/ns/`` names the namespace
    ``tenant/ns``, ``/`` the root namespace, anything else a topic; None is the broker-wide
    default.

    Raises:
        InvalidTopicError: the topic or namespace name is not valid.
    """
    if text is None:
        return AdminTarget("broker", None)
    if text == "/":
        return AdminTarget("namespace", "")
    if text.endswith("/"):
        name = text[:-1]
        try:
            validate_topic(name)
            if name.endswith("/"):
                raise InvalidTopicError(name)
        except InvalidTopicError:
            raise InvalidTopicError(
                f"invalid namespace {text!r}: a namespace is a topic name prefix ending in '/', like 'tenant/ns/'"
            ) from None
        return AdminTarget("namespace", name)
    return AdminTarget("topic", validate_topic(text))


def _policy_type(text: str) -> str:
    if text not in _POLICY_CHOICES:
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}: use strict, monotonic or clear")
    return text


def _add_admin_parser(commands: Any) -> None:
    admin = commands.add_parser(
        "admin",
        help="deduplication settings and producer state of a broker",
        description="Change deduplication settings and inspect the checker state of a broker. "
        f"The broker is --url, else ${URL_ENV}: a broker server (idem://host:port) or a backend "
        "URL (sqlite:///..., kafka://..., pulsar://...). stats and describe-producers only read; "
        "on a backend URL they open it read-only, never taking a partition over from a running broker.",
    )
    admin.add_argument("--url", metavar="URL", help=f"the broker (default: ${URL_ENV})")
    verbs = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", metavar="URL", default=argparse.SUPPRESS, help=f"the broker (default: ${URL_ENV})")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")

    dedup = verbs.add_parser(
        "set-deduplication",
        help="switch deduplication or set the sequence policy of a topic, a namespace, or the broker",
        description="Switch deduplication on or off, or set the sequence policy, for a topic, a "
        "namespace (a name ending in '/': 'tenant/ns/' is the namespace of 'tenant/ns/orders', "
        "'/' the root namespace of names without '/'), or with --broker the broker-wide default. "
        "The most specific setting applies: topic, then namespace, then broker, then the "
        "broker's configuration. --clear removes a setting so that the next level applies.",
    )
    dedup.add_argument("target", metavar="TOPIC|NAMESPACE/", nargs="?", help="a topic, or a namespace ending in '/'")
    dedup.add_argument("--broker", action="store_true", help="change the broker-wide default instead")
    switch = dedup.add_mutually_exclusive_group()
    switch.add_argument(
        "--enable", dest="dedup", action="store_const", const="enable", help="check duplicates and gaps"
    )
    switch.add_argument(
        "--disable",
        dest="dedup",
        action="store_const",
        const="disable",
        help="accept every well-formed batch (no duplicate or gap check)",
    )
    switch.add_argument("--clear", dest="dedup", action="store_const", const="clear", help="remove the setting")
    dedup.add_argument(
        "--policy",
        type=_policy_type,
        metavar="strict|monotonic|clear",
        help="sequence policy: strict (a gap is refused), monotonic (gaps allowed), clear (remove the setting)",
    )
    dedup.add_argument(
        "--allow-unknown",
        action="store_true",
        help="configure a topic that does not exist yet (it applies once the topic is created)",
    )
    common(dedup)
    dedup.set_defaults(handler=cmd_admin_set_deduplication)

    stats = verbs.add_parser(
        "stats",
        help="deduplication status, policy, producers and snapshot state of a topic",
        description="Show a topic's deduplication status and policy and, per partition: ready or "
        "recovering, log position, snapshot position and age, and every producer's id, name, "
        "epoch, last sequence and last offset.",
    )
    stats.add_argument("topic", metavar="TOPIC")
    common(stats)
    stats.set_defaults(handler=cmd_admin_stats)

    producers = verbs.add_parser(
        "describe-producers",
        help="the producers a topic's partitions track",
        description="List the producers each partition of a topic tracks: id, name, epoch, last "
        "sequence, last offset and the time of its last stored record.",
    )
    producers.add_argument("topic", metavar="TOPIC")
    producers.add_argument("--partition", metavar="P", type=_int_type(0, "--partition"), help="only this partition")
    common(producers)
    producers.set_defaults(handler=cmd_admin_describe_producers)


def admin_url(args: argparse.Namespace) -> str:
    """The broker URL of an admin command: ``--url``, else ``$IDEMPOTENT_URL``.

    Raises:
        CliError: neither is set.
    """
    url: str | None = getattr(args, "url", None) or os.environ.get(URL_ENV)
    if not url:
        raise CliError(f"no broker URL: give --url URL or set {URL_ENV}")
    return url


def _require_database(url: str) -> None:
    """Refuse a ``sqlite://`` URL whose file does not exist (opening it would create it)."""
    if urlsplit(url).scheme == "sqlite":
        from adapters.sqlite import parse_sqlite_url

        path, _ = parse_sqlite_url(url)
        if not os.path.exists(path):
            raise CliError(f"no database file {path!r} (from {url})")


def open_admin(url: str, *, write: bool) -> BrokerAPI:
    """The broker handle of an admin command.

    A broker server is connected to. A backend URL is opened in this process: read-only
    (:func:`open_read_only`) unless ``write``; a ``sqlite://`` file must exist either way.

    Raises:
        CliError: a missing sqlite file.
        ConfigError: bad URL.
        BackendUnavailableError: the broker or backend cannot be reached.
    """
    from . import connect

    if urlsplit(url).scheme in SERVER_SCHEMES:
        return connect(url)
    if not write:
        return open_read_only(url)
    _require_database(url)
    return connect(url, BrokerConfig(auto_create_topics=False, maintenance_interval=0))


def cmd_admin_set_deduplication(args: argparse.Namespace) -> int:
    """``idempotent admin set-deduplication``: change a deduplication or policy setting."""
    if args.broker and args.target is not None:
        raise CliError("give a TOPIC, a NAMESPACE/ or --broker, not both")
    if not args.broker and args.target is None:
        raise CliError("give a TOPIC, a NAMESPACE/ (ending in '/'), or --broker for the broker-wide default")
    if args.dedup is None and args.policy is None:
        raise CliError("nothing to change: give --enable, --disable or --clear, and/or --policy")
    target = parse_admin_target(args.target)
    url = admin_url(args)
    broker = open_admin(url, write=True)
    try:
        if target.kind == "topic" and not args.allow_unknown and target.name not in broker.topics():
            known = ", ".join(sorted(broker.topics())) or "none"
            raise CliError(
                f"unknown topic {target.name!r} in {broker.url} (topics: {known}); give --allow-unknown to "
                "configure a topic before it is created, or end a namespace with '/'"
            )
        changes: dict[str, str] = {}
        if args.dedup is not None:
            enabled = {"enable": True, "disable": False, "clear": None}[args.dedup]
            broker.set_deduplication(enabled, **target.keywords())
            changes["deduplication"] = {"enable": "enabled", "disable": "disabled", "clear": "cleared"}[args.dedup]
        if args.policy is not None:
            broker.set_policy(None if args.policy == "clear" else args.policy, **target.keywords())
            changes["policy"] = "cleared" if args.policy == "clear" else args.policy
    finally:
        broker.close()
    if args.json:
        print(json.dumps({"target": target.kind, "name": target.name, **changes}))
    else:
        text = ", ".join(f"{what} {how}" for what, how in changes.items())
        print(f"{target.describe()}: {text}")
    return 0


def cmd_admin_stats(args: argparse.Namespace) -> int:
    """``idempotent admin stats``: a topic's deduplication status and checker state."""
    validate_topic(args.topic)
    broker = open_admin(admin_url(args), write=False)
    try:
        count = _partition_count(broker, args.topic)
        stats = broker.stats(args.topic)
    finally:
        broker.close()
    first = stats[0] if stats else None
    summary = {
        "topic": args.topic,
        "partitions": count,
        "deduplication": first.deduplication if first else None,
        "policy": first.policy if first else None,
        "ready": sum(1 for s in stats if s.status == "ready"),
        "recovering": sum(1 for s in stats if s.status == "recovering"),
    }
    if args.json:
        print(json.dumps({**summary, "partition_stats": [_stats_dict(s) for s in stats]}, indent=2))
        return 0
    dedup = "on" if summary["deduplication"] else "off"
    print(
        f"topic {args.topic}: {count} partition(s), deduplication {dedup}, policy {summary['policy']}, "
        f"{summary['ready']} ready, {summary['recovering']} recovering"
    )
    for s in stats:
        print()
        print(format_stats(s))
    return 0


def producer_rows(stats: Sequence[PartitionStats], partition: int | None = None) -> list[dict[str, Any]]:
    """One row per producer and partition, as ``describe-producers`` prints them."""
    return [
        {
            "topic": s.topic,
            "partition": s.partition,
            "producer_id": p.producer_id,
            "producer_name": p.producer_name,
            "producer_epoch": p.producer_epoch,
            "last_sequence": p.last_sequence,
            "last_offset": p.last_offset,
            "last_timestamp": p.last_timestamp,
        }
        for s in stats
        if partition is None or s.partition == partition
        for p in s.producers
    ]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: frozenset[int] = frozenset()) -> list[str]:
    """Aligned columns: numbers to the right, the columns in ``left`` to the left."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]


def cmd_admin_describe_producers(args: argparse.Namespace) -> int:
    """``idempotent admin describe-producers``: the producers each partition tracks."""
    validate_topic(args.topic)
    broker = open_admin(admin_url(args), write=False)
    try:
        count = _partition_count(broker, args.topic)
        if args.partition is not None and args.partition >= count:
            raise CliError(f"topic {args.topic!r} has partitions 0..{count - 1}, not {args.partition}")
        rows = producer_rows(broker.stats(args.topic), args.partition)
    finally:
        broker.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        where = f"{args.topic}[{args.partition}]" if args.partition is not None else f"topic {args.topic}"
        print(f"no producers tracked on {where}")
        return 0
    header = ("PARTITION", "PRODUCER_ID", "NAME", "EPOCH", "LAST_SEQUENCE", "LAST_OFFSET", "LAST_TIMESTAMP")
    table = [
        (
            str(r["partition"]),
            str(r["producer_id"]),
            r["producer_name"] if r["producer_name"] is not None else "-",
            str(r["producer_epoch"]),
            str(r["last_sequence"]),
            str(r["last_offset"]),
            _iso(r["last_timestamp"]),
        )
        for r in rows
    ]
    print("\n".join(_table(header, table, left=frozenset({2, 6}))))
    return 0


def _iso(timestamp: float) -> str:
    """A record timestamp (seconds since the epoch) as UTC ISO 8601 with milliseconds."""
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="milliseconds")


# -- services ------------------------------------------------------------------------------


def cmd_token(args: argparse.Namespace) -> int:
    """Print a signed token (``idempotent token``)."""
    from .auth import mint_token

    path = args.secret_file or args.private_key
    try:
        with open(path, "rb") as handle:
            key = handle.read()
    except OSError as exc:
        raise CliError(f"cannot read {path!r}: {exc.strerror}") from None
    if args.secret_file:
        key = key.rstrip(b"\r\n")
    algorithm = args.algorithm or ("HS256" if args.secret_file else "RS256")
    if args.secret_file and not algorithm.startswith("HS"):
        raise CliError("--secret-file signs only HS256, HS384 or HS512")
    if args.private_key and algorithm.startswith("HS"):
        raise CliError("--private-key signs RS*, PS*, ES* or EdDSA; use --secret-file for HS*")
    print(
        mint_token(
            key,
            args.sub,
            now=time.time(),
            ttl=args.ttl,
            roles=args.role,
            algorithm=algorithm,
            audience=args.audience,
            issuer=args.issuer,
            roles_claim=args.roles_claim,
        )
    )
    return 0


def cmd_services(argv: list[str]) -> int:
    """``idempotent services ...``: delegate to ``idempotent.testing.services.main``."""
    try:
        module = importlib.import_module("idempotent.testing.services")
    except ImportError as exc:
        raise CliError(f"the services command is not available: {exc}") from None
    run = getattr(module, "main", None)
    if not callable(run):
        raise CliError("the services command is not available: idempotent.testing.services has no main()")
    code = run(argv)
    return _exit_code(code)


__all__ = ["CliError", "ReadOnlyBackend", "build_parser", "format_record", "main", "open_read_only"]
