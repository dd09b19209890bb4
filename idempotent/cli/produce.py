"""``idempotent produce``: publish the lines of a file or generated records, resumably.

The command is resumable: running it again after a crash (even ``kill -9``) stores every
record exactly once. It uses a *named* producer (by default derived from the topic and the
input) and a fixed layout: record ``i`` of the input goes to partition ``i % P`` and is the
``i // P``-th record of its partition, so it carries sequence ``i // P``. When the named
producer starts again, the broker reports the last sequence it stored per partition; every
record up to it is skipped and the rest is sent. Records that were in flight at the crash and
sent again are recognised by the broker as duplicates.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import time
from collections import deque
from collections.abc import Iterator

import attrs

from idempotent.broker.broker import validate_topic
from idempotent.core.records import RecordColumns
from idempotent.core.types import SEQUENCE_SPACE
from idempotent.producer.producer import Producer, SendManyFuture

from ..api import BrokerAPI
from ..errors import DeliveryFailed, ProducerError, UsageError
from .common import CliError, Subcommands, add_connect_timeout, connect_options, float_type, int_type, topic_type
from .progress import Progress, add_progress_arguments

#: Records sent but not yet checked before the oldest are checked; bounds memory for inputs
#: of any length.
WINDOW = 20_000
#: Records read per block (one ``send_many`` per partition), and about how many of the oldest
#: are checked at a time once the window is full.
CHUNK = 5_000
#: Length of the prefix ``record-%012d`` of a generated record.
GENERATED_PREFIX = 19
MAX_GENERATED = 10**12 - 1


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent produce`` to the subcommands."""
    produce = commands.add_parser(
        "produce",
        help="publish the lines of a file or generated records, resumably",
        description="Publish each line of a file (without its newline) or N generated records. "
        "Resumable: run the same command again after a crash and every record is stored "
        "exactly once.",
    )
    produce.add_argument("url", metavar="URL")
    produce.add_argument("topic", metavar="TOPIC", type=topic_type)
    source = produce.add_mutually_exclusive_group(required=True)
    source.add_argument("--file", metavar="PATH", help="publish each line of this file")
    source.add_argument(
        "--generate",
        metavar="N",
        type=int_type(0, "--generate"),
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
        type=int_type(1, "--partitions"),
        help="create the topic with N partitions (default: its existing count, or the "
        "broker's default for a new topic); cannot change between runs",
    )
    produce.add_argument(
        "--size",
        metavar="BYTES",
        type=int_type(GENERATED_PREFIX, "--size"),
        default=100,
        help="size of each generated record (default 100)",
    )
    produce.add_argument("--linger-ms", metavar="MS", type=float_type, default=5.0, help="batch linger (default 5)")
    produce.add_argument(
        "--max-in-flight",
        metavar="N",
        type=int_type(1, "--max-in-flight"),
        default=5,
        help="pipelined batches per partition (default 5)",
    )
    add_progress_arguments(produce)
    produce.add_argument("--quiet", action="store_true", help="print nothing but errors (no progress, no summary)")
    add_connect_timeout(produce)
    produce.set_defaults(handler=cmd_produce)


@attrs.frozen
class _Source:
    """The records to publish: the lines of a file or N generated records."""

    count: int
    default_name: str
    path: str | None = None
    size: int = 0

    def blocks(self, start: int, size: int) -> Iterator[list[bytes | None]]:
        """Records ``start``, ``start + 1``, ... up to ``count``, in lists of ``size``."""
        if self.path is None:
            filler = _filler(self.size - GENERATED_PREFIX)
            records: Iterator[bytes | None] = (b"record-%012d%s" % (i, filler) for i in range(start, self.count))
        else:
            records = itertools.islice(_lines(self.path), start, self.count)
        while block := list(itertools.islice(records, size)):
            yield block

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
    from .. import connect

    broker = connect(args.url, **connect_options(args.url, args.connect_timeout))
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
        pending: deque[SendManyFuture] = deque()
        queued = 0  # records in the futures of ``pending``
        bar = Progress.from_args(args, topic, total=source.count, initial=skipped)

        def drain(keep: int) -> None:
            nonlocal duplicates, acknowledged, queued
            done = 0
            while queued > keep:
                deliveries = pending.popleft().result()
                duplicates += deliveries.duplicates
                done += len(deliveries)
                queued -= len(deliveries)
            acknowledged += done
            bar.update(done)

        sending = True
        try:
            position = start
            highest = max(last, default=-1)
            for block in source.blocks(start, CHUNK):
                # record i goes to partition i % partitions, as sequence i // partitions
                if position // partitions > highest:  # none of the block is stored: slice it
                    shares: list[list[bytes | None]] = [
                        block[(p - position) % partitions :: partitions] for p in range(partitions)
                    ]
                else:
                    shares = [[] for _ in range(partitions)]
                    for i, value in enumerate(block, position):
                        p = i % partitions
                        if i // partitions > last[p]:
                            shares[p].append(value)
                position += len(block)
                for p, share in enumerate(shares):
                    if share:
                        # as columns: no Record per line (every value is bytes)
                        pending.append(producer.send_many(topic, RecordColumns(share), partition=p))
                        queued += len(share)
                        sent += len(share)
                if queued >= WINDOW:
                    drain(WINDOW - CHUNK)
            producer.flush()
            drain(0)
        finally:
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
