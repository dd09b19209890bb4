"""Plain Kafka topics as a mirror source: ``kafka+native://host:port[,host:port...]``.

Any topic written by any client (a Java service, kcat, ...) is read with confluent-kafka, one
consumer per partition, assigned (no consumer group is joined and no offset is committed: the
destination holds the position). The query string holds extra librdkafka settings, for
example ``kafka+native://host:9093?security.protocol=SSL&ssl.ca.location=/ca.pem``.

A record's offset is its Kafka offset. Offsets have holes: a compacted topic has removed
records, and transaction markers (and aborted records, which are skipped:
``isolation.level=read_committed``) take offsets of their own. Keys, values, headers and
timestamps (``CreateTime`` or ``LogAppendTime``) are kept; the identity headers this project's
Kafka backend puts on a batch's first record (:data:`~idempotent.adapters.kafka.heads.IDENTITY_HEADERS`)
are not: they name the producer that wrote the source, not the record, and the destination's
writer gives each batch its own.

The consumers' own log lines (librdkafka's ``FAIL``, ``%4|...`` ...) go to the Python logger
``idempotent.mirror.librdkafka`` at the level librdkafka gave them (confluent-kafka maps its
syslog levels to ``logging``'s), never straight to stderr; they are handed over while a
consumer is polled, so the metadata consumer is polled after each request.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from idempotent.adapters.kafka import errors
from idempotent.adapters.kafka.heads import IDENTITY_HEADERS
from idempotent.errors import ConfigError, InvalidTopicError, ProducerError
from idempotent.mirror.source import Polled, SourceRecord

try:
    from confluent_kafka import Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as KafkaTopicPartition
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("kafka+native:// sources need confluent-kafka: pip install 'idempotent[kafka]'") from exc

_TIMEOUT = 30.0
#: Where the consumers' own log lines go.
LIBRDKAFKA_LOG = logging.getLogger("idempotent.mirror.librdkafka")


@contextlib.contextmanager
def _map_errors(what: str) -> Iterator[None]:
    """Translate confluent-kafka errors into the project's tree with the backend's one
    translation (:mod:`idempotent.adapters.kafka.errors`). A topic the cluster does not know
    does not exist for a source: :class:`InvalidTopicError`."""
    with errors.map_errors(what, topic_may_be_new=False):
        yield


def _translate(error: Any, what: str) -> ProducerError:
    """The project error for a ``KafkaError`` a consumer returned (see :func:`_map_errors`)."""
    return errors.translate(error, what, topic_may_be_new=False)


def _unseen(error: Any, what: str, listed: Callable[[], bool]) -> ProducerError | None:
    """For an error that says a partition is unknown to the client (missing, or only without
    a leader now: see :data:`idempotent.adapters.kafka.errors.UNSEEN_CODES`), the project error once
    the cluster was asked afresh whether it lists the partition (``listed``); None for any
    other error."""
    if not errors.unseen(error):
        return None
    if isinstance(error, KafkaException):
        error = error.args[0]
    return errors.unseen_partition(error, what, listed(), topic_may_be_new=False)


def client_config(url: str) -> dict[str, str]:
    """The librdkafka settings a ``kafka+native://`` URL names.

    Raises:
        ConfigError: not a ``kafka+native://host:port`` URL.
    """
    parts = urlsplit(url)
    if parts.scheme != "kafka+native" or not parts.netloc:
        raise ConfigError(f"expected kafka+native://host:port[,host:port...], got {url!r}")
    return {**dict(parse_qsl(parts.query)), "bootstrap.servers": parts.netloc}


class KafkaNativeSource:
    """The topics of a Kafka cluster, read as they are; see the module docstring.

    Raises:
        ConfigError: bad URL or setting.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._config = client_config(url)
        self._meta: Any = None
        with _map_errors("open"):
            self._meta = self._consumer()

    @property
    def url(self) -> str:
        return self._url

    def _consumer(self) -> Any:
        try:
            return Consumer(
                {
                    **self._config,
                    # assigned partitions only: the group is never joined and nothing is committed
                    "group.id": f"idempotent-mirror-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    "auto.offset.reset": "earliest",
                    "logger": LIBRDKAFKA_LOG,
                }
            )
        except (KafkaException, ValueError, TypeError) as exc:
            raise ConfigError(f"kafka: bad client settings in {self._url}: {exc}") from exc

    def _serve_logs(self) -> None:
        """Hand the metadata consumer's queued log lines to :data:`LIBRDKAFKA_LOG`."""
        with contextlib.suppress(KafkaException, RuntimeError):
            self._meta.poll(0)

    def topics(self) -> list[str]:
        """Every topic of the cluster but Kafka's internal ones (names starting with ``__``)."""
        try:
            with _map_errors("list topics"):
                metadata = self._meta.list_topics(timeout=_TIMEOUT)
        finally:
            self._serve_logs()
        return sorted(
            name for name, found in metadata.topics.items() if not name.startswith("__") and found.error is None
        )

    def _describe(self, topic: str) -> Any:
        """The cluster's metadata of ``topic``, asked afresh (None when it is not listed).

        Raises:
            BackendUnavailableError: the cluster could not be asked.
        """
        try:
            with _map_errors(f"describe {topic!r}"):
                metadata = self._meta.list_topics(topic, timeout=_TIMEOUT)
        finally:
            self._serve_logs()
        return metadata.topics.get(topic)

    def partitions(self, topic: str) -> int:
        found = self._describe(topic)
        if found is None or found.error is not None or not found.partitions:
            detail = found.error.str() if found is not None and found.error is not None else "no partitions"
            raise InvalidTopicError(f"kafka: unknown topic {topic!r} ({detail})")
        return len(found.partitions)

    def end(self, topic: str, partition: int) -> int:
        """The partition's high watermark.

        Raises:
            InvalidTopicError: the cluster does not list the partition.
            BackendUnavailableError: it is listed but has no leader now (an election, its
                brokers away), or the cluster could not be reached: retry.
        """
        what = f"end of {topic}[{partition}]"
        try:
            with _map_errors(what):
                try:
                    _, high = self._meta.get_watermark_offsets(
                        KafkaTopicPartition(topic, partition), timeout=_TIMEOUT, cached=False
                    )
                except KafkaException as exc:
                    unseen = _unseen(exc, what, lambda: self.lists(topic, partition))
                    if unseen is None:
                        raise
                    raise unseen from exc
        finally:
            self._serve_logs()
        return int(high)

    def lists(self, topic: str, partition: int) -> bool:
        """Whether the cluster's metadata, asked afresh, lists ``partition`` of ``topic``
        (with a leader or without one).

        Raises:
            BackendUnavailableError: the cluster could not be asked.
        """
        found = self._describe(topic)
        if found is None or not found.partitions:
            return False
        if found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return False
        return partition in found.partitions

    def open_partition(self, topic: str, partition: int, after: int, end: int | None = None) -> KafkaPartitionReader:
        return KafkaPartitionReader(self._consumer(), topic, partition, after, lambda: self.lists(topic, partition))

    def lag(self, topic: str, partition: int, after: int, end: int) -> int | None:
        """Offsets above ``after``: records, and transaction markers (they take offsets too)."""
        return max(0, end - after - 1)

    def source_topic(self, topic: str, partition: int) -> str:
        return topic

    def close(self) -> None:
        if self._meta is not None:
            meta, self._meta = self._meta, None
            with contextlib.suppress(KafkaException, RuntimeError):
                meta.close()


class KafkaPartitionReader:
    """One consumer assigned to one partition, from the offset after ``after``."""

    def __init__(
        self, consumer: Any, topic: str, partition: int, after: int, listed: Callable[[], bool] | None = None
    ) -> None:
        self._consumer = consumer
        self._after = after
        self._where = f"{topic}[{partition}]"
        #: asks the cluster afresh whether it lists the partition (see :func:`_unseen`)
        self._listed: Callable[[], bool] = listed if listed is not None else lambda: False
        start = after + 1 if after >= 0 else -2  # -2: OFFSET_BEGINNING
        try:
            with _map_errors(f"assign {topic}[{partition}]"):
                consumer.assign([KafkaTopicPartition(topic, partition, start)])
        except BaseException:
            consumer.close()
            raise

    def poll(self, max_records: int, timeout: float) -> Polled:
        with _map_errors("consume"):
            messages = self._consumer.consume(num_messages=max_records, timeout=timeout)
        records = []
        caught_up = False
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    caught_up = True
                    continue
                unseen = _unseen(error, f"consume {self._where}", self._listed)
                raise unseen if unseen is not None else _translate(error, "consume")
            offset = message.offset()
            if offset <= self._after:
                continue
            caught_up = False
            kind, millis = message.timestamp()
            headers = message.headers()
            records.append(
                SourceRecord(
                    offset,
                    message.key(),
                    message.value(),
                    tuple(
                        (name, b"" if value is None else bytes(value))
                        for name, value in headers
                        if name not in IDENTITY_HEADERS
                    )
                    if headers
                    else (),
                    None if kind == 0 else millis / 1000,  # 0: TIMESTAMP_NOT_AVAILABLE
                )
            )
            self._after = offset
        return Polled(records, caught_up)

    def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()


__all__ = ["LIBRDKAFKA_LOG", "KafkaNativeSource", "KafkaPartitionReader", "client_config"]
