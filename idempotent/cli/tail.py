"""``idempotent tail``: print records of a topic, optionally following new ones, as kcat does.

It reads an idempotent topic through any broker URL (a backend URL is opened read-only, see
:func:`~idempotent.cli.common.open_read_only`, so ``tail`` may run next to a writer) and a
plain Kafka or Pulsar topic through the source URLs ``mirror`` takes
(``kafka+native://host:port``, ``pulsar+native://host:port?admin_url=...``;
:mod:`idempotent.mirror.source`).

Where to start (``--from``): an offset, ``beginning``, ``end``, ``end-N`` (the last N
offsets of each partition: on Kafka transaction markers take offsets too, so fewer records
may show; on a ``pulsar+native://`` topic, the last N messages), or a time (ISO 8601, such
as ``2024-05-01T12:00:00Z``, or ``@`` and milliseconds since the epoch, as kcat's
``s@``): the first record at or after it (found by bisection on an idempotent topic; a
plain topic is read from its start and earlier records are passed over).

Output: a line per record (``--format text``, the default), one JSON object per line
(``--json``), or a kcat-style format string (``--format '%t %p %o %k %s\\n'``, see
:data:`FORMAT_HELP`); ``-K SEP`` prints ``key SEP value``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO, Any, Protocol
from urllib.parse import urlsplit

import attrs

from idempotent.core.records import StoredRecord

from ..api import BrokerAPI
from ..errors import ConfigError
from .common import (
    CliError,
    Subcommands,
    add_connect_timeout,
    int_type,
    open_read_only,
    partition_count,
    topic_type,
)
from .formatting import record_json, shown_text

TAIL_DEFAULT_LAST = 10
FOLLOW_INTERVAL = 0.5
#: Source URL schemes of plain (not idempotent) topics, read as ``mirror`` reads them.
NATIVE_SCHEMES = ("kafka+native", "pulsar+native")
_CHUNK = 500
FORMAT_HELP = (
    "a kcat-style format string: %%t topic, %%p partition, %%o offset, %%k key, %%K key size, %%s value, "
    "%%S value size, %%h headers (name=value,...), %%T timestamp (ms since the epoch), %%I timestamp (ISO 8601), "
    "%%P producer id, %%E producer epoch, %%Q sequence (idempotent topics; -1 on plain topics), %%%% a %%; "
    "\\n \\t \\r \\\\ as in C. Or 'text' (default) or 'json'."
)


@attrs.frozen
class TailRecord:
    """One record as ``tail`` prints it, from an idempotent topic or a plain one (whose
    producer fields are -1)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: float | None
    producer_id: int = -1
    producer_epoch: int = -1
    sequence: int = -1
    #: from a plain topic: no producer identity to show
    plain: bool = False


@attrs.frozen
class Start:
    """Where each partition is read from: ``kind`` is offset, beginning, end, last (the last
    ``value`` offsets) or time (``value`` in seconds since the epoch)."""

    kind: str
    value: float = 0


def parse_start(text: str) -> Start:
    """``--from``: an offset, ``beginning``, ``end``, ``end-N``, ISO 8601 or ``@MILLIS``.

    Raises:
        argparse.ArgumentTypeError: none of these.
    """
    text = text.strip()
    if text in ("beginning", "end"):
        return Start(text)
    if match := re.fullmatch(r"end-(\d+)", text):
        return Start("last", int(match.group(1)))
    if re.fullmatch(r"\d+", text):
        return Start("offset", int(text))
    if match := re.fullmatch(r"@(\d+)", text):
        return Start("time", int(match.group(1)) / 1000)
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a start: give an offset, beginning, end, end-N, a time such as "
            "2024-05-01T12:00:00Z, or @MILLISECONDS since the epoch"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # a time without a zone is local time
    return Start("time", moment.timestamp())


def _separator(text: str) -> str:
    return _unescape(text)


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent tail`` to the subcommands."""
    tail = commands.add_parser(
        "tail",
        help="print records of a topic (idempotent, or plain Kafka/Pulsar), kcat-style",
        description="Print records of a topic: by default the last 10 of each partition. URL is a broker "
        "URL, or kafka+native://host:port or pulsar+native://host:port?admin_url=... for a plain topic.",
    )
    tail.add_argument("url", metavar="URL")
    tail.add_argument("topic", metavar="TOPIC")
    tail.add_argument("--partition", "-p", metavar="P", type=int_type(0, "--partition"), help="only this partition")
    start = tail.add_mutually_exclusive_group()
    start.add_argument(
        "--from",
        dest="start",
        metavar="WHERE",
        type=parse_start,
        help="where to start in every partition read: OFFSET, beginning, end, end-N, a time "
        "(2024-05-01T12:00:00Z) or @MILLISECONDS (default end-10)",
    )
    start.add_argument("--offset", metavar="O", type=int_type(0, "--offset"), help="start at this offset")
    start.add_argument("--from-beginning", action="store_true", help="start at the first record")
    count = tail.add_mutually_exclusive_group()
    count.add_argument("--count", "-c", metavar="N", type=int_type(1, "--count"), help="stop after N records in all")
    count.add_argument("--max", metavar="N", type=int_type(1, "--max"), help="the same as --count")
    tail.add_argument("--follow", "-f", action="store_true", help="keep polling for new records until Ctrl-C")
    output = tail.add_mutually_exclusive_group()
    output.add_argument("--format", metavar="FORMAT", default="text", help=FORMAT_HELP)
    output.add_argument("--json", action="store_true", help="one JSON object per record and line")
    tail.add_argument(
        "--key-delimiter",
        "-K",
        metavar="SEP",
        type=_separator,
        help="print 'KEY SEP VALUE' per record (with --format FMT: %%k and %%s stay where FMT puts them)",
    )
    add_connect_timeout(tail)
    tail.set_defaults(handler=cmd_tail)


# -- formats ---------------------------------------------------------------------------------


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}.get(m.group(1), m.group(0)), text)


def _iso(timestamp: float | None) -> str:
    if timestamp is None:
        return ""
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="milliseconds")


def _millis(timestamp: float | None) -> str:
    return "-1" if timestamp is None else str(round(timestamp * 1000))


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


_FIELDS: dict[str, Callable[[TailRecord], str]] = {
    "t": lambda r: r.topic,
    "p": lambda r: str(r.partition),
    "o": lambda r: str(r.offset),
    "k": lambda r: _text(r.key),
    "K": lambda r: "-1" if r.key is None else str(len(r.key)),
    "s": lambda r: _text(r.value),
    "S": lambda r: "-1" if r.value is None else str(len(r.value)),
    "h": lambda r: ",".join(f"{name}={_text(value)}" for name, value in r.headers),
    "T": lambda r: _millis(r.timestamp),
    "I": lambda r: _iso(r.timestamp),
    "P": lambda r: str(r.producer_id),
    "E": lambda r: str(r.producer_epoch),
    "Q": lambda r: str(r.sequence),
    "%": lambda r: "%",
}


def compile_format(fmt: str) -> Callable[[TailRecord], str]:
    """A kcat-style format string (see :data:`FORMAT_HELP`) as a function of a record.

    Raises:
        CliError: an unknown ``%`` field (the message lists the known ones).
    """
    pieces: list[str | Callable[[TailRecord], str]] = []
    for literal, field in re.findall(r"([^%]*)(%.?)?", _unescape(fmt)):
        if literal:
            pieces.append(literal)
        if field:
            getter = _FIELDS.get(field[1:])
            if getter is None:
                known = " ".join(f"%{k}" for k in _FIELDS)
                raise CliError(f"unknown field {field!r} in --format {fmt!r}: use {known}")
            pieces.append(getter)

    def render(record: TailRecord) -> str:
        return "".join(p if isinstance(p, str) else p(record) for p in pieces)

    return render


def format_text(record: TailRecord) -> str:
    """The default line: where the record is, its identity on an idempotent topic, key and value."""
    identity = (
        "" if record.plain else f"producer={record.producer_id} epoch={record.producer_epoch} seq={record.sequence} "
    )
    return (
        f"{record.topic}[{record.partition}] offset={record.offset} {identity}"
        f"key={shown_text(record.key)} value={shown_text(record.value)}\n"
    )


def format_json(record: TailRecord) -> str:
    """One JSON object (and a newline)."""
    return record_json(record.topic, record.partition, record) + "\n"


def _formatter(args: argparse.Namespace) -> Callable[[TailRecord], str]:
    if args.json or args.format == "json":
        return format_json
    if args.format != "text":
        if "%" not in args.format:
            raise CliError(f"--format {args.format!r} is not text, json, or a format string with %-fields")
        return compile_format(args.format)
    if args.key_delimiter is not None:
        sep = args.key_delimiter
        return lambda r: f"{_text(r.key)}{sep}{_text(r.value)}\n"
    return format_text


# -- sources ---------------------------------------------------------------------------------


class _Reader(Protocol):
    def poll(self, limit: int) -> tuple[list[TailRecord], bool]:
        """Next records, and whether the partition's end was reached."""
        ...

    def close(self) -> None: ...


class _Source(Protocol):
    def partitions(self) -> int: ...

    def end(self, partition: int) -> int: ...

    def reader(self, partition: int, start: Start) -> _Reader:
        """A reader of the partition from ``start`` (for ``last``, from early enough that
        the last N records are among what it reads)."""
        ...

    def close(self) -> None: ...


def _stored(topic: str, partition: int, record: StoredRecord) -> TailRecord:
    return TailRecord(
        topic,
        partition,
        record.offset,
        record.key,
        record.value,
        tuple(record.headers),
        record.timestamp,
        record.producer_id,
        record.producer_epoch,
        record.sequence,
    )


class _BrokerReader:
    def __init__(self, broker: BrokerAPI, topic: str, partition: int, offset: int) -> None:
        self.broker, self.topic, self.partition, self.offset = broker, topic, partition, offset

    def poll(self, limit: int) -> tuple[list[TailRecord], bool]:
        records = self.broker.read(self.topic, self.partition, self.offset, limit)
        if records:
            self.offset = records[-1].offset + 1
        return [_stored(self.topic, self.partition, r) for r in records], not records

    def close(self) -> None:
        pass


class _BrokerSource:
    """An idempotent topic, read through a broker handle (never writing)."""

    def __init__(self, url: str, topic: str, connect_timeout: float) -> None:
        self.topic = topic
        self.broker = open_read_only(url, connect_timeout)

    def partitions(self) -> int:
        return partition_count(self.broker, self.topic)

    def end(self, partition: int) -> int:
        return self.broker.end_offset(self.topic, partition)

    def _first_at(self, partition: int, moment: float) -> int:
        """The first offset whose record is at or after ``moment`` (bisection: a partition's
        timestamps do not decrease), or the end."""
        low, high = 0, self.end(partition)
        while low < high:
            middle = (low + high) // 2
            found = self.broker.read(self.topic, partition, middle, 1)
            if not found:
                high = middle
            elif found[0].timestamp >= moment:
                high = middle  # nothing is stored between middle and found[0].offset
            else:
                low = found[0].offset + 1
        return low

    def reader(self, partition: int, start: Start) -> _Reader:
        if start.kind == "beginning":
            offset = 0
        elif start.kind == "end":
            offset = self.end(partition)
        elif start.kind == "last":
            offset = max(0, self.end(partition) - int(start.value))
        elif start.kind == "time":
            offset = self._first_at(partition, start.value)
        else:
            offset = int(start.value)
        return _BrokerReader(self.broker, self.topic, partition, offset)

    def close(self) -> None:
        self.broker.close()


class _NativeReader:
    def __init__(self, inner: Any, topic: str, partition: int, since: float | None) -> None:
        self.inner, self.topic, self.partition, self.since = inner, topic, partition, since

    def poll(self, limit: int) -> tuple[list[TailRecord], bool]:
        polled = self.inner.poll(limit, 0.2)
        out = [
            TailRecord(self.topic, self.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp, plain=True)
            for r in polled.records
            if self.since is None or (r.timestamp is not None and r.timestamp >= self.since)
        ]
        return out, polled.caught_up

    def close(self) -> None:
        self.inner.close()


class _NativeSource:
    """A plain Kafka or Pulsar topic, read with the mirror's sources."""

    def __init__(self, url: str, topic: str, connect_timeout: float) -> None:
        from idempotent.adapters.reach import parse_addresses, wait_reachable

        from ..mirror.schemes import open_source

        parts = urlsplit(url)
        scheme = parts.scheme.partition("+")[0]
        wait_reachable(scheme, parse_addresses(parts.netloc, 9092 if scheme == "kafka" else 6650), connect_timeout)
        self.scheme = scheme
        self.topic = topic
        self.source = open_source(url)

    def partitions(self) -> int:
        return self.source.partitions(self.topic)

    def end(self, partition: int) -> int:
        return self.source.end(self.topic, partition)

    def _after_for_last(self, partition: int, count: int) -> int:
        end = self.end(partition)
        if self.scheme == "kafka":
            return max(-1, end - count - 1)
        from idempotent.adapters.pulsar.source import pack_message_id, unpack_offset

        ledger, entry, _ = unpack_offset(end)  # every entry holds one message or more
        return pack_message_id(ledger, entry - count, 0) - 1 if entry - count > 0 else -1

    def reader(self, partition: int, start: Start) -> _Reader:
        since = None
        if start.kind in ("beginning", "time"):
            after = -1
            since = start.value if start.kind == "time" else None
        elif start.kind == "end":
            after = self.end(partition) - 1
        elif start.kind == "last":
            after = self._after_for_last(partition, int(start.value))
        else:
            after = int(start.value) - 1
        inner = self.source.open_partition(self.topic, partition, after, None)
        return _NativeReader(inner, self.source.source_topic(self.topic, partition), partition, since)

    def close(self) -> None:
        self.source.close()


def _open(args: argparse.Namespace) -> _Source:
    scheme = urlsplit(args.url).scheme
    if scheme in NATIVE_SCHEMES:
        return _NativeSource(args.url, args.topic, args.connect_timeout)
    if scheme == "file":
        raise CliError(f"tail reads topics, not files: {args.url!r}; give a broker URL or {', '.join(NATIVE_SCHEMES)}")
    try:
        topic = topic_type(args.topic)
    except argparse.ArgumentTypeError as exc:
        raise CliError(str(exc)) from None
    return _BrokerSource(args.url, topic, args.connect_timeout)


def _start(args: argparse.Namespace) -> Start:
    if args.start is not None:
        start: Start = args.start
        return start
    if args.offset is not None:
        return Start("offset", args.offset)
    if args.from_beginning:
        return Start("beginning")
    return Start("last", TAIL_DEFAULT_LAST)


# -- the command -----------------------------------------------------------------------------


def cmd_tail(args: argparse.Namespace) -> int:
    """``idempotent tail``: print records of a topic, optionally following new ones."""
    render = _formatter(args)
    start = _start(args)
    try:
        source = _open(args)
    except ConfigError as exc:
        raise CliError(exc.message) from None
    readers: list[_Reader] = []
    try:
        count = source.partitions()
        if args.partition is not None and args.partition >= count:
            raise CliError(f"topic {args.topic!r} has partitions 0..{count - 1}, not {args.partition}")
        parts = [args.partition] if args.partition is not None else list(range(count))
        readers = [source.reader(p, start) for p in parts]
        remaining: int | None = args.count if args.count is not None else args.max
        out = sys.stdout
        keep = int(start.value) if start.kind == "last" else None
        try:
            for reader in readers:  # what is stored now, partition by partition
                remaining = _drain(reader, out, render, remaining, keep)
                if remaining == 0:
                    break
            while args.follow and remaining != 0:
                out.flush()
                printed = 0
                for reader in readers:
                    records, _ = reader.poll(_CHUNK if remaining is None else min(_CHUNK, remaining))
                    remaining = _write(records, out, render, remaining)
                    printed += len(records)
                    if remaining == 0:
                        break
                if not printed:
                    time.sleep(FOLLOW_INTERVAL)
        except KeyboardInterrupt:
            if not args.follow:
                raise
        out.flush()
        return 0
    finally:
        for reader in readers:
            reader.close()
        source.close()


def _drain(
    reader: _Reader, out: IO[str], render: Callable[[TailRecord], str], remaining: int | None, keep: int | None
) -> int | None:
    """Print what the partition holds up to its end now (only the last ``keep`` of it, when
    given); return the records still to print."""
    last: collections.deque[TailRecord] | None = None if keep is None else collections.deque(maxlen=keep)
    while remaining is None or remaining > 0:
        records, at_end = reader.poll(_CHUNK if remaining is None or last is not None else min(_CHUNK, remaining))
        if last is not None:
            last.extend(records)
        else:
            remaining = _write(records, out, render, remaining)
        if at_end:
            break
    if last is not None:
        remaining = _write(list(last), out, render, remaining)
    return remaining


def _write(
    records: Sequence[TailRecord], out: IO[str], render: Callable[[TailRecord], str], remaining: int | None
) -> int | None:
    if remaining is not None:
        records = records[:remaining]
    for record in records:
        out.write(render(record))
    return None if remaining is None else remaining - len(records)
