"""Where a copy job stands, read from its destination: :func:`job_status`.

A job keeps no state of its own: each partition's resume point is the last sequence its
named producer stored in the destination (:mod:`.names`). So the destination alone says, per
source partition, the last source offset copied and when the job last wrote it; asked
beside a running job, or long after it died, the answer is the same as the job's own. The
source is asked only for its end offsets, to tell the lag.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs

from ..api import BrokerAPI
from ..errors import InvalidTopicError, TransportError
from .binding import copied_source
from .names import JobProducer, parse_producer_name
from .source import Source

_LOG = logging.getLogger("idempotent.mirror")


@attrs.frozen
class PartitionStatus:
    """One source partition of a job, as its destination holds it.

    Attributes:
        topic: the source topic, as the job's producer names it; for a file (or a topic
            copied before producer names held the topic), what its last record's
            ``idem.src.topic`` says (the file's path).
        partition: the source partition.
        to_topic: the destination topic.
        to_partition: the destination partition.
        producer_name: the job's producer that writes it.
        last_offset: the last source offset copied: the job resumes after it.
        last_write: when the job last stored records there (seconds since the epoch).
        end: the source's end offset when asked (None: the source was not asked, or failed,
            or no longer has the topic).
        lag: how far the copy is behind ``end``, as the source counts it
            (:meth:`.source.Source.lag`: records and transaction markers of Kafka, bytes of a
            file, Pulsar entries); 0: caught up; None: not known.
    """

    topic: str
    partition: int
    to_topic: str
    to_partition: int
    producer_name: str
    last_offset: int
    last_write: float
    end: int | None = None
    lag: int | None = None


def job_status(
    broker: BrokerAPI, job: str, *, to_topics: Sequence[str] | None = None, source: Source | None = None
) -> list[PartitionStatus]:
    """Every source partition ``job`` copied to ``broker`` (in ``to_topics``, default every
    topic), with the source's end offsets when ``source`` is given.

    Reads only: give a broker opened read-only (``idempotent.cli.open_read_only``) to ask
    beside a running job. A partition the job's producer stored nothing in is not listed.

    Raises:
        InvalidTopicError: a topic of ``to_topics`` does not exist.
        BrokerError, TransportError: the destination (or the source) failed.
    """
    names = list(to_topics) if to_topics is not None else sorted(broker.topics())
    out: list[PartitionStatus] = []
    for to_topic in names:
        for stats in broker.stats(to_topic):
            best: dict[int, tuple[JobProducer, PartitionStatus]] = {}
            for producer in stats.producers:
                parsed = parse_producer_name(job, producer.producer_name)
                if parsed is None or producer.last_sequence < 0:
                    continue
                topic = parsed.topic
                if topic is None:
                    topic = copied_source(broker, stats.topic, stats.partition, producer) or ""
                row = PartitionStatus(
                    topic,
                    parsed.partition,
                    stats.topic,
                    stats.partition,
                    parsed.name,
                    producer.last_sequence,
                    producer.last_timestamp,
                )
                before = best.get(parsed.partition)
                # a job that began under its name of before per-topic names: the newer name wins
                if before is None or (before[0].topic is None and parsed.topic is not None):
                    best[parsed.partition] = (parsed, row)
            out.extend(row for _, row in best.values())
    out.sort(key=lambda s: (s.topic, s.partition, s.to_topic))
    if source is not None:
        out = [_with_end(source, row) for row in out]
    return out


def _with_end(source: Source, row: PartitionStatus) -> PartitionStatus:
    end = _end(source, row)
    if end is None:
        return row
    try:
        lag = source.lag(row.topic, row.partition, row.last_offset, end)
    except (InvalidTopicError, TransportError) as exc:
        _LOG.warning("the lag of %s[%d] is not known: %s", row.topic, row.partition, exc)
        lag = None
    return attrs.evolve(row, end=end, lag=lag)


def _end(source: Source, row: PartitionStatus) -> int | None:
    """The source's end of the row's partition; None when the source failed or lost the topic."""
    suffix = f"-partition-{row.partition}"
    try:
        try:
            return source.end(row.topic, row.partition)
        except InvalidTopicError:
            if not row.topic.endswith(suffix):  # else: a Pulsar partition's own name, from a header
                raise
            return source.end(row.topic[: -len(suffix)], row.partition)
    except (InvalidTopicError, TransportError) as exc:
        _LOG.warning("the end of %s[%d] is not known: %s", row.topic, row.partition, exc)
        return None


__all__ = ["PartitionStatus", "job_status"]
