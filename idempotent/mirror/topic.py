"""Idempotent topics as a mirror source, on any broker URL of the README.

``sqlite://``, ``memory://``, ``kafka://`` and ``pulsar://`` are opened read-only in this
process (:func:`idempotent.adapters.read_only.open_read_only_broker`: no partition is taken over from the
broker that writes them, no topic is created); ``idem://`` and ``idems://`` ask the broker
server. A record's offset is its offset in the topic: dense on SQLite and memory, with holes
on Kafka (transaction markers); its timestamp is the time the source stored it.

An in-process broker knows the topics that existed when it was opened; a topic created
later (that a following job's ``--topics`` pattern matches) is read through a broker opened
after it, so the topics are listed from the backend itself.
"""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

from idempotent.broker.broker import Broker

from ..api import BrokerAPI
from ..errors import InvalidTopicError
from .source import Polled, SourceRecord


def open_source_broker(url: str) -> BrokerAPI:
    """A broker handle that reads ``url`` without writing to it.

    Raises:
        ConfigError: bad URL, or a SQLite file that does not exist.
        BackendUnavailableError, BrokerConnectionError: the broker could not be opened.
    """
    if urlsplit(url).scheme in ("idem", "idems"):
        from .. import connect

        return connect(url)
    from idempotent.adapters.read_only import open_read_only_broker

    return open_read_only_broker(url)


class TopicSource:
    """The topics of one broker URL; see the module docstring.

    Raises:
        ConfigError, BackendUnavailableError, BrokerConnectionError: see
            :func:`open_source_broker`.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = threading.Lock()
        #: the broker opened last, which knows the most topics
        self.broker = open_source_broker(url)
        self._opened: list[BrokerAPI] = [self.broker]
        self._by_topic: dict[str, BrokerAPI] = {}

    @property
    def url(self) -> str:
        return self._url

    def topics(self) -> list[str]:
        broker = self.broker
        if isinstance(broker, Broker):
            return sorted(broker.backend.list_topics())  # the stored topics, not those known at opening
        return sorted(broker.topics())

    def _broker_of(self, topic: str) -> BrokerAPI:
        """A broker that knows ``topic``: an in-process one opened after the topic was created.

        Raises:
            InvalidTopicError: the topic does not exist.
        """
        with self._lock:
            known = self._by_topic.get(topic)
            broker = self.broker
        if known is not None:
            return known
        try:
            broker.partitions_for(topic, create=False)
        except InvalidTopicError:
            if not isinstance(broker, Broker) or topic not in broker.backend.list_topics():
                raise  # a broker server knows every topic
            broker = open_source_broker(self._url)
            with self._lock:
                self._opened.append(broker)
                self.broker = broker
        with self._lock:
            return self._by_topic.setdefault(topic, broker)

    def partitions(self, topic: str) -> int:
        return self._broker_of(topic).partitions_for(topic, create=False)

    def end(self, topic: str, partition: int) -> int:
        return self._broker_of(topic).end_offset(topic, partition)

    def open_partition(self, topic: str, partition: int, after: int, end: int | None = None) -> TopicReader:
        return TopicReader(self._broker_of(topic), topic, partition, after + 1)

    def lag(self, topic: str, partition: int, after: int, end: int) -> int | None:
        """Offsets above ``after`` (records; on a Kafka-backed topic, transaction markers too)."""
        return max(0, end - after - 1)

    def source_topic(self, topic: str, partition: int) -> str:
        return topic

    def close(self) -> None:
        with self._lock:
            opened, self._opened = self._opened, []
        for broker in opened:
            broker.close()


class TopicReader:
    """Reads one partition of an idempotent topic forward from an offset."""

    def __init__(self, broker: BrokerAPI, topic: str, partition: int, position: int) -> None:
        self._broker = broker
        self._topic = topic
        self._partition = partition
        self._position = position

    def poll(self, max_records: int, timeout: float) -> Polled:
        stored = self._broker.read(self._topic, self._partition, self._position, max_records)
        records = [
            SourceRecord(r.offset, r.key, r.value, r.headers, r.timestamp or None)
            for r in stored
            if r.offset >= self._position  # a backend may hand back the start's neighbours
        ]
        if records:
            self._position = records[-1].offset + 1
        elif timeout > 0:
            time.sleep(min(timeout, 0.05))
        return Polled(records, not records)

    def close(self) -> None:
        """The broker is the source's; nothing to release here."""


__all__ = ["TopicReader", "TopicSource", "open_source_broker"]
