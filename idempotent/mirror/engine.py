"""The copy engine: one source partition is one unit of work, resumable from the destination.

Theory of operation. A job named ``J`` copies each source partition ``p`` with one named
producer (:func:`.names.producer_name`) into destination partition ``p`` (0 for files). A record's **source offset
is its application sequence** in the destination, and the destination topic uses the
``monotonic`` policy, so offsets with holes are accepted in order. The destination is then the
only checkpoint there is: on start, the named producer's ``last_sequence`` on the destination
partition is the last source offset stored, and the copy resumes right after it. A batch
resent (a retry of a request whose answer was lost) is answered DUPLICATE by the destination's
checker, never stored twice; a record not yet stored is read again. No offsets are committed
anywhere else, and nothing is transactional, so nothing times out.

Each topic of a job has resume points of its own: the producer of partition ``p`` of topic
``T`` is ``J/T/p`` (``J/p`` for a file; see :mod:`.names`).

Batches and sparse offsets. A batch holds consecutive sequences, but source offsets may have
holes (byte positions of lines, Pulsar message ids, compacted Kafka topics). Each batch of
``n`` records whose last source offset is ``L`` is therefore sent with the sequences
``L-n+1 .. L``: they grow strictly from batch to batch (the ``n`` offsets of the batch are
distinct, so ``L-n+1`` is at least its first offset, above the previous batch's ``L``), and a
stored batch's last sequence is exactly its last record's source offset. A batch is stored
whole or not at all, so the destination's last sequence is always a real source offset: the
one to resume after. Each record's own offset is in its ``idem.src.offset`` header. A batch
is also cut where offsets pass ``2**31 - 1`` (the checker keeps a batch on one side of the
int32 ring's end); the records above it then get sequences above it too.

One batch in flight. The ``monotonic`` policy accepts any sequence above the last one, so if
batch ``k`` were refused for a passing reason (a partition recovering, a connection lost)
while batch ``k+1``, sent behind it, was stored, ``k`` would be lost for good: nothing would
ever ask for it again. A partition's copy therefore sends its next batch only once the
previous one is answered stored; the source is read meanwhile, so reading and writing still
overlap. Partitions are copied in parallel. Each batch thus costs the destination a round
trip (a Kafka-backed one: a transaction), so batches are large: a poll of up to
:data:`POLL_RECORDS` goes as one batch, cut only before :data:`BATCH_BYTES` or the
destination's own limit (``ProducerSession.max_batch_bytes``/``max_batch_records``).

:func:`copy_partition` is the unit (what a Spark task runs); :class:`.job.Mirror` plans the
job (destination topics, policy, where each partition ends, which source the job copied) and
runs the units in threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import attrs

from idempotent.core.outcomes import Outcome, ProduceResult
from idempotent.core.records import Headers, Record, trusted_record
from idempotent.core.request import ProduceRequest
from idempotent.core.types import MAX_SEQUENCE

from ..api import BrokerAPI
from ..errors import ConfigError, ProducerError, ProducerFencedError, Recovery, SequenceDesyncError
from .names import (
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_PREFIX,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    producer_name,
)
from .schemes import open_source
from .source import Source, SourceRecord

_LOG = logging.getLogger("idempotent.mirror")

#: Records read from the source per poll (at most one batch's worth).
POLL_RECORDS = 10_000
#: A batch is cut before it would pass this many bytes, as ``Record.size`` counts them, or
#: the destination's own batch limit when that is lower (and at the end of a poll's records).
#: With one batch in flight per partition, each batch costs the destination one round trip
#: (a Kafka-backed destination: one transaction), so batches are as large as it takes.
BATCH_BYTES = 4 * 1024 * 1024
#: In-process restarts of a task after retriable failures, before its error is raised.
RETRIES = 8
#: ... and the seconds those failures must have lasted, with no record copied since the
#: first of them, before a task gives up: as long as a producer's default delivery timeout,
#: so that a broker restart, a leader election or a rolling restart of the source's or the
#: destination's cluster is waited out.
RETRY_WINDOW = 120.0
#: Seconds a copy asked to stop keeps retrying a retriable failure (a destination or source
#: still recovering) so that what it sent is settled and it stops cleanly; past it, the error
#: is raised and the next run resumes from the destination.
STOP_GRACE = 30.0
#: Seconds between two questions to the source about a partition's lag, for progress reports.
LAG_INTERVAL = 1.0


def source_headers(record: SourceRecord, topic: str, partition: int) -> Headers:
    """The record's own headers (without source coordinates of an earlier copy) followed by
    the ``idem.src.*`` coordinates of this copy."""
    topic_header, partition_header = (SOURCE_TOPIC, topic.encode()), (SOURCE_PARTITION, b"%d" % partition)
    return _with_coordinates(record, topic_header, partition_header, _fixed_size(topic_header, partition_header))[0]


def _fixed_size(topic_header: tuple[str, bytes], partition_header: tuple[str, bytes]) -> int:
    """What every copied record of one source partition adds to its ``Record.size`` beyond its
    key, value, own headers and offset: ``Record.size``'s 16, 4 per coordinate header (three),
    the topic's and the partition's headers, and the offset header's name."""
    return (
        28
        + len(topic_header[0])
        + len(topic_header[1])
        + len(partition_header[0])
        + len(partition_header[1])
        + len(SOURCE_OFFSET)
    )


def _with_coordinates(
    record: SourceRecord, topic_header: tuple[str, bytes], partition_header: tuple[str, bytes], fixed: int
) -> tuple[Headers, int]:
    """:func:`source_headers` with the topic's and partition's headers, and their share of
    the size (``fixed``, see :func:`_fixed_size`), made once per batch; and the record's
    ``Record.size`` with these headers (computed here, where the headers' lengths are known,
    rather than by a pass over them)."""
    number, key, value, own, timestamp = record
    offset = b"%d" % number
    size = fixed + len(offset)
    if value is not None:
        size += len(value)
    if key is not None:
        size += len(key)
    coordinates: Headers
    if timestamp is None:
        coordinates = (topic_header, partition_header, (SOURCE_OFFSET, offset))
    else:
        millis = b"%d" % round(timestamp * 1000)
        coordinates = (topic_header, partition_header, (SOURCE_OFFSET, offset), (SOURCE_TIMESTAMP, millis))
        size += 4 + len(SOURCE_TIMESTAMP) + len(millis)
    if not own:
        return coordinates, size
    if any(name.startswith(SOURCE_PREFIX) for name, _ in own):
        own = tuple(h for h in own if not h[0].startswith(SOURCE_PREFIX))
    for name, data in own:
        size += len(name) + len(data) + 4
    return own + coordinates, size


@attrs.frozen
class PartitionTask:
    """One source partition to copy: picklable, so a Spark task can carry it.

    Attributes:
        source: the source URL (see :mod:`idempotent.mirror.source`).
        destination: the destination broker URL.
        topic: the source topic ("" for files).
        to_topic: the destination topic.
        job: the job name; the copy is written by the named producer
            :attr:`producer_name` (``job/topic/partition``, ``job/partition`` for files).
        partition: the source partition.
        to_partition: the destination partition (``partition``, or 0 for files).
        end: copy the records with offsets below this (the source's end when the job was
            planned); None follows the source until stopped.
        legacy_position: the source offset the job stored under its name of before per-topic
            names (``job/partition``; -1: none). The copy resumes after it while
            :attr:`producer_name` has stored nothing on the destination partition.
    """

    source: str
    destination: str
    topic: str
    to_topic: str
    job: str
    partition: int
    to_partition: int
    end: int | None
    legacy_position: int = -1

    @property
    def producer_name(self) -> str:
        """The named producer that writes this partition's copy."""
        return producer_name(self.job, self.partition, self.topic)


@attrs.frozen
class PartitionSummary:
    """What :func:`copy_partition` did.

    Attributes:
        partition: the source partition.
        resumed_after: the source offset the copy resumed after (the producer's last stored
            sequence when it started; -1 when nothing had been copied). Every record at or
            below it was already copied and was skipped without being read.
        last_offset: the last source offset stored when the copy ended (-1: none).
        copied: records stored by this run.
        duplicates: records this run sent that the destination answered DUPLICATE (already
            stored by an earlier, interrupted run).
        elapsed: seconds the copy ran.
        completed: True when the copy reached its end (False: stopped, or following).
        topic: the source topic ("" for files).
        to_topic: the destination topic.
    """

    partition: int
    resumed_after: int
    last_offset: int
    copied: int
    duplicates: int
    elapsed: float
    completed: bool
    topic: str = ""
    to_topic: str = ""


@attrs.frozen
class PartitionProgress:
    """A progress report of one partition (sent after every poll of the source that moved it).

    ``position`` is the last source offset known stored (-1: none), ``end`` the offset the
    copy stops at, or the source's end when last asked while following (None: not known).
    ``source_lag`` is what the source counts between them (:meth:`.source.Source.lag`, asked
    at most every :data:`LAG_INTERVAL` seconds), None when not asked.
    """

    partition: int
    position: int
    end: int | None
    copied: int
    duplicates: int
    topic: str = ""
    source_lag: int | None = None

    @property
    def lag(self) -> int | None:
        """How far the copy is behind ``end``: the source's count (records and Kafka
        transaction markers, bytes of a file, Pulsar entries), else ``end - position - 1``
        source offsets; None when the end is not known."""
        if self.source_lag is not None:
            return self.source_lag
        return None if self.end is None else max(0, self.end - self.position - 1)


ProgressCallback = Callable[[PartitionProgress], None]


def copy_partition(
    task: PartitionTask,
    *,
    source: Source | None = None,
    broker: BrokerAPI | None = None,
    stop: threading.Event | None = None,
    progress: ProgressCallback | None = None,
    follow_interval: float = 5.0,
    retries: int = RETRIES,
) -> PartitionSummary:
    """Copy one source partition to its destination partition, resuming where the
    destination says the job stopped. The unit of work of a job (a thread of
    :class:`~.job.Mirror`, or a Spark task).

    Contract:

    * Idempotent and resumable: running a task again, after any crash or ``kill -9`` of any
      earlier run, stores each source record of the partition exactly once, in source order.
    * The destination topic must exist with at least ``task.to_partition + 1`` partitions and
      the ``monotonic`` policy (:meth:`.job.Mirror.plan` does both); the source offsets must be
      stable (:mod:`idempotent.mirror.source`).
    * Two runs of the same task at once fence each other: the later one's named producer
      takes over and the earlier one fails with ProducerFencedError, having stored nothing
      twice.
    * With ``task.end`` set, it returns once every record below ``task.end`` is stored;
      with None, it copies until ``stop`` is set.

    Args:
        task: what to copy.
        source: an open source of ``task.source`` to share (opened and closed here if None).
        broker: an open broker of ``task.destination`` to share (likewise).
        stop: set it to end the copy early: what was sent is flushed, then it returns (a
            retriable failure met while stopping is retried for up to :data:`STOP_GRACE`
            seconds, then raised).
        progress: called (in this thread) whenever the stored position moved.
        follow_interval: seconds between asking the source for its end while following.
        retries: how many times a retriable failure (the destination or source unreachable,
            a partition recovering, a lost answer) restarts the copy from the destination's
            last stored offset before the error is raised, once such failures have also
            lasted :data:`RETRY_WINDOW` seconds with no record copied since the first.

    Returns:
        A :class:`PartitionSummary`.

    Raises:
        ProducerFencedError: another run of the same task took over.
        ConfigError, InvalidTopicError: bad URL, topic or partition.
        SequenceDesyncError: the destination refused a batch's sequences (another writer
            under the job's producer name, or a source whose offsets went back).
        TransportError: the source or destination kept failing (``retries`` exhausted);
            run the task again to resume.
        UsageError: a source offset is not a valid sequence.
    """
    started = time.monotonic()
    own_source = source is None
    own_broker = broker is None
    if source is None:
        source = open_source(task.source)
    try:
        if broker is None:
            from .. import connect

            broker = connect(task.destination)
        totals = _Totals()
        failures = 0
        failing_since = 0.0
        copied_then = -1  # records copied when the current run of failures began
        stopping_since: float | None = None  # when a retriable failure first met the stop
        while True:
            try:
                completed = _copy_once(task, source, broker, stop, progress, follow_interval, totals)
                break
            except ProducerError as exc:
                # A retriable failure restarts the copy from the destination's truth, exactly
                # as a restart after kill -9 would; anything else ends the task.
                now = time.monotonic()
                if totals.copied != copied_then:  # records copied since: a new run of failures
                    failures, failing_since, copied_then = 0, now, totals.copied
                failures += 1
                exhausted = failures > retries and now - failing_since >= RETRY_WINDOW
                if stop is not None and stop.is_set():  # stopping: settle what was sent, briefly
                    stopping_since = now if stopping_since is None else stopping_since
                    exhausted = exhausted or now - stopping_since >= STOP_GRACE
                if exc.recovery is Recovery.FATAL or exhausted:
                    raise
                _LOG.warning("%s: %s; resuming from the destination (attempt %d)", task.job, exc, failures)
                time.sleep(min(5.0, 0.1 * 2**failures))
        return PartitionSummary(
            task.partition,
            totals.resumed_after,
            totals.position,
            totals.copied,
            totals.duplicates,
            time.monotonic() - started,
            completed,
            task.topic,
            task.to_topic,
        )
    finally:
        try:
            if own_broker and broker is not None:
                broker.close()
        finally:
            if own_source:
                source.close()


@attrs.define
class _Totals:
    """Counters of one task, across its in-process restarts."""

    resumed_after: int = -2  # -2: not yet initialised
    position: int = -1
    copied: int = 0
    duplicates: int = 0


def _copy_once(
    task: PartitionTask,
    source: Source,
    broker: BrokerAPI,
    stop: threading.Event | None,
    progress: ProgressCallback | None,
    follow_interval: float,
    totals: _Totals,
) -> bool:
    """One attempt of :func:`copy_partition`: True when the end was reached."""
    writer = _PartitionWriter(broker, task)
    if totals.resumed_after == -2:
        totals.resumed_after = writer.position
    writer.totals = totals
    totals.position = writer.position
    reader = source.open_partition(task.topic, task.partition, writer.position, task.end)
    try:
        source_topic = source.source_topic(task.topic, task.partition)
        end = task.end
        known_end = end
        next_end_check = time.monotonic()
        reported: tuple[int, int | None, int | None] | None = None  # position, end, lag
        lag = _LagProbe(source, task)
        done = False
        while not done and not (stop is not None and stop.is_set()):
            polled = reader.poll(POLL_RECORDS, 0.2)
            records = polled.records
            if end is not None and records and records[-1].offset >= end:
                records = [r for r in records if r.offset < end]
                done = True
            if records:
                writer.send(records, source_topic)
            if end is not None and polled.caught_up:
                done = True
            writer.collect(block=False)
            if end is None and time.monotonic() >= next_end_check:  # the end, for the lag report
                known_end = source.end(task.topic, task.partition)
                next_end_check = time.monotonic() + follow_interval
            if progress is not None:
                now = (totals.position, known_end, lag.ask(totals.position, known_end))
                if now != reported:  # the position, the end or the lag moved
                    reported = now
                    report = PartitionProgress(
                        task.partition, now[0], known_end, totals.copied, totals.duplicates, task.topic, now[2]
                    )
                    progress(report)
        writer.finish()
        if progress is not None:
            report = PartitionProgress(
                task.partition,
                totals.position,
                known_end,
                totals.copied,
                totals.duplicates,
                task.topic,
                lag.ask(totals.position, known_end, now=True),
            )
            progress(report)
        return done
    finally:
        reader.close()


class _LagProbe:
    """Asks the source how far a partition's copy is behind: again when the position or the
    end moved, but at most every LAG_INTERVAL (until then the last answer stands)."""

    def __init__(self, source: Source, task: PartitionTask) -> None:
        self._source = source
        self._task = task
        self._asked = -LAG_INTERVAL
        self._for: tuple[int, int] | None = None
        self._last: int | None = None

    def ask(self, position: int, end: int | None, *, now: bool = False) -> int | None:
        if end is None:
            return None
        if (position, end) != self._for and (now or time.monotonic() - self._asked >= LAG_INTERVAL):
            self._asked = time.monotonic()
            self._for = (position, end)
            try:
                self._last = self._source.lag(self._task.topic, self._task.partition, position, end)
            except ProducerError as exc:  # a progress report is no reason to stop a copy
                _LOG.debug("lag of %s[%d]: %s", self._task.topic, self._task.partition, exc)
                self._last = None
        return self._last


class _PartitionWriter:
    """Sends one partition's batches through a named producer session, one at a time."""

    def __init__(self, broker: BrokerAPI, task: PartitionTask) -> None:
        self._broker = broker
        self._task = task
        session = broker.init_producer(task.producer_name)
        if session.elsewhere:
            raise ConfigError(
                f"{session.producer_name!r} wrote to partitions another broker owns: "
                "connect to every broker of the cluster (idem://b1:port,b2:port)"
            )
        self._producer_id = session.producer_id
        self._producer_epoch = session.producer_epoch
        #: the last source offset known stored (under the job's name of before per-topic
        #: names while this producer has stored nothing: see PartitionTask.legacy_position)
        self.position = session.last_sequences[(task.to_topic, task.to_partition)]
        if self.position < 0:
            self.position = task.legacy_position
        self.totals = _Totals()
        self._pending: deque[tuple[int, int, Future[ProduceResult]]] = deque()
        #: the largest batch sent, as ``Record.size`` counts (the destination's limit when
        #: lower than BATCH_BYTES), and the most records in one (None: no limit)
        self.batch_bytes = min(BATCH_BYTES, session.max_batch_bytes or BATCH_BYTES)
        self.batch_records = session.max_batch_records

    def send(self, records: list[SourceRecord], source_topic: str) -> None:
        """Send ``records`` (offset order, above everything sent) as batches ending at the
        source offset of their last record. A batch is cut before a record that would take
        it past :attr:`batch_bytes` (a record larger than that alone goes alone: the
        destination refuses it, as it would any record too large), after
        :attr:`batch_records` records, and where the offsets pass ``MAX_SEQUENCE`` (no batch
        may hold both sides of the int32 ring's end)."""
        topic_header = (SOURCE_TOPIC, source_topic.encode())
        partition_header = (SOURCE_PARTITION, b"%d" % self._task.partition)
        fixed = _fixed_size(topic_header, partition_header)
        limit = self.batch_bytes
        most = self.batch_records or len(records)
        batch: list[Record] = []
        size = largest = 0
        last = -1
        for record in records:
            # a source hands out bytes (or None) and (str, bytes) headers: no conversion needed
            headers, record_size = _with_coordinates(record, topic_header, partition_header, fixed)
            if batch and (
                size + record_size > limit
                or len(batch) >= most
                or last <= MAX_SEQUENCE < record.offset  # this one is past the ring
            ):
                self._submit(batch, last, size, largest)
                batch = []
                size = largest = 0
            batch.append(trusted_record(record.value, record.key, headers))
            size += record_size
            if record_size > largest:
                largest = record_size
            last = record.offset
        if batch:
            self._submit(batch, last, size, largest)

    def _submit(self, batch: list[Record], last: int, size: int, largest: int) -> None:
        self.collect(block=True)  # the previous batch must be stored first
        task = self._task
        request = ProduceRequest.build(
            task.to_topic,
            task.to_partition,
            self._producer_id,
            self._producer_epoch,
            last - len(batch) + 1,
            batch,
            measured=(size, largest),
        )
        future = self._broker.submit_request(request)
        self._pending.append((last, len(batch), future))

    def collect(self, *, block: bool) -> None:
        """Take the answer of the batch in flight if it is ready, or with ``block``, wait for it.

        Raises:
            ProducerFencedError: another run of the task took over.
            SequenceDesyncError: the destination refused a batch's sequences.
            ProducerError: the request failed (nothing after it is counted as stored).
        """
        pending = self._pending
        totals = self.totals
        while pending and (block or pending[0][2].done()):
            last, count, future = pending.popleft()
            result = future.result()
            if result.outcome is Outcome.ACCEPTED:
                totals.copied += count
            elif result.outcome is Outcome.DUPLICATE:
                totals.duplicates += count
            elif result.outcome is Outcome.FENCED:
                raise ProducerFencedError(
                    f"job {self._task.job!r}, partition {self._task.partition}: another run took over",
                    self._producer_id,
                    result.producer_epoch if result.producer_epoch is not None else -1,
                )
            else:
                raise SequenceDesyncError(
                    f"{self._task.to_topic}[{self._task.to_partition}] answered {result.outcome.value} "
                    f"to the batch ending at source offset {last}",
                    result.expected_sequence if result.expected_sequence is not None else -1,
                )
            self.position = totals.position = last

    def finish(self) -> None:
        """Wait for every answer (raises as :meth:`collect`)."""
        self.collect(block=True)


__all__ = [
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_TIMESTAMP",
    "SOURCE_TOPIC",
    "PartitionProgress",
    "PartitionSummary",
    "PartitionTask",
    "copy_partition",
    "producer_name",
    "source_headers",
]
