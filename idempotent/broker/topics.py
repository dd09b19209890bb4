"""The topics one broker knows and their partition counts, kept in step with its backend.

:class:`TopicDirectory` holds the counts a :class:`~idempotent.broker.broker.Broker` serves with,
learnt from the backend (``list_topics`` of its metadata half, ``describe_topic`` and
``create_topic`` of its log half). A topic the broker does not know is looked up before
anything is created: the records are read again (another broker or process may have created
it) and, where the broker may create it, Kafka's and Pulsar's own metadata too, so an
existing topic is adopted with the count it really has (``docs/backends.md``). A known
count is read again in the background once it is ``refresh_interval`` seconds old, and at
once (at most once a second per topic) when a request names a partition beyond it: counts
only grow.

Lock: the broker's lock (``Broker._lock``), given in, guards the counts and is held around
``create_topic`` of the backend; ``describe_topic`` and ``list_topics`` are called outside
it. One background thread (``idempotent-topic-refresh``) reads counts again, started on
first need and ended by :meth:`TopicDirectory.stop`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping

from idempotent.backend import LogBackend
from idempotent.core.topics import canonical_topic
from idempotent.core.values import MAX_PARTITIONS
from idempotent.errors import InvalidTopicError, ProducerError

#: a request for a partition beyond a topic's known count reads the count again, at most
#: this often per topic
MISS_REFRESH_SECONDS = 1.0

_LOG = logging.getLogger("idempotent.broker")


class TopicDirectory:
    """The topics of one broker and their partition counts; see the module docstring.

    Args:
        backend: the broker's backend.
        lock: the broker's lock.
        stop: set when the broker closes (the background reads end).
        auto_create: ``BrokerConfig.auto_create_topics``.
        default_partitions: ``BrokerConfig.default_partitions``.
        refresh_interval: ``BrokerConfig.topic_refresh_interval``.
        join_timeout: how long :meth:`stop` waits for a background read under way.

    Raises:
        BackendUnavailableError: the topic records could not be read.
    """

    def __init__(
        self,
        backend: LogBackend,
        lock: threading.RLock,
        stop: threading.Event,
        *,
        auto_create: bool,
        default_partitions: int,
        refresh_interval: float,
        join_timeout: float,
    ) -> None:
        self._backend = backend
        self._lock = lock
        self._stop = stop
        self._auto_create = auto_create
        self._default_partitions = default_partitions
        self._refresh_interval = refresh_interval
        self._join_timeout = join_timeout
        self._topics = dict(backend.list_topics())
        #: topic -> time.monotonic() when its partition count was last read from the backend
        self._checked = dict.fromkeys(self._topics, time.monotonic())
        #: topics whose count is being read again in the background (see _refresh_later)
        self._refreshing: set[str] = set()
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._refresher: threading.Thread | None = None

    def create(self, name: str, partitions: int) -> None:
        """:meth:`Broker.create_topic <idempotent.broker.broker.Broker.create_topic>` for a stored
        ``name``.

        Raises:
            InvalidTopicError: bad count, or the topic exists with another count (it is then
                known, and used, with its own count).
            BackendUnavailableError: the backend failed; nothing is known to have changed.
        """
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidTopicError(f"partitions must be an int in 1..{MAX_PARTITIONS}, got {partitions!r}")
        with self._lock:
            existing = self._topics.get(name)
            if existing is None:
                existing = self._known(name, self._backend.create_topic(name, partitions))
        if existing != partitions:
            existing = self._refresh(name, existing)  # it may have grown since it was read
        if existing != partitions:
            raise InvalidTopicError(f"topic {name!r} exists with {existing} partitions, not {partitions}")

    def topics(self) -> dict[str, int]:
        """Every topic known and its partition count."""
        with self._lock:
            return dict(self._topics)

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        """:meth:`Broker.partitions_for <idempotent.broker.broker.Broker.partitions_for>` for a
        stored name.

        Raises:
            InvalidTopicError: no such topic (with ``create`` False or auto-creation off).
            BackendUnavailableError: the backend failed looking up a topic new to this broker.
        """
        with self._lock:
            count = self._topics.get(topic)
            checked = self._checked.get(topic, 0.0)
        if count is None:
            return self._look_up(topic, create)
        if time.monotonic() - checked >= self._refresh_interval:
            self._refresh_later(topic)
        return count

    def count_covering(self, topic: str, partition: object, *, create: bool = True) -> int:
        """The partition count of ``topic``, read again first when ``partition`` lies beyond
        the count known and that was read over :data:`MISS_REFRESH_SECONDS` ago (partitions
        may have been added since). The caller checks ``partition`` against it.

        Raises:
            InvalidTopicError, BackendUnavailableError: as :meth:`partitions_for`.
        """
        count = self.partitions_for(topic, create=create)
        if isinstance(partition, int) and not isinstance(partition, bool) and partition >= count:
            with self._lock:
                checked = self._checked.get(topic)
            if checked is not None and time.monotonic() - checked >= MISS_REFRESH_SECONDS:
                count = self._refresh(topic, count)
        return count

    def known(self, name: str) -> bool:
        """Whether ``name`` is a topic, reading the topic records again when this broker does
        not know it (another process may have created it).

        Raises:
            BackendUnavailableError: the records could not be read.
        """
        with self._lock:
            if name not in self._topics:
                for topic, count in self._backend.list_topics().items():
                    self._topics.setdefault(topic, count)
                    self._checked.setdefault(topic, time.monotonic())
            return name in self._topics

    def forget(self, name: str) -> None:
        """Forget a deleted topic (created again, it is looked up afresh)."""
        with self._lock:
            self._topics.pop(name, None)
            self._checked.pop(name, None)

    def replace(self, topics: Mapping[str, int]) -> None:
        """Use ``topics``, read from the backend just now (the broker became its writer)."""
        with self._lock:
            self._topics = dict(topics)
            self._checked = dict.fromkeys(topics, time.monotonic())

    def stop(self) -> None:
        """End the background reads of partition counts (before the backend closes); the
        broker has set its stop event."""
        with self._lock:
            refresher = self._refresher
        if refresher is not None:
            self._queue.put(None)
            refresher.join(self._join_timeout)

    def _refresh_later(self, topic: str) -> None:
        """Have a known topic's partition count read again in the background: the caller (a
        producer's ``send``, through its periodic ``partitions_for``) keeps the count it has,
        which can only grow, and never waits for a slow or unreachable backend."""
        with self._lock:
            if topic in self._refreshing or self._stop.is_set():
                return
            self._refreshing.add(topic)
            if self._refresher is None:
                self._refresher = threading.Thread(
                    target=self._refresh_loop, name="idempotent-topic-refresh", daemon=True
                )
                self._refresher.start()
        self._queue.put(topic)

    def _refresh_loop(self) -> None:
        while (topic := self._queue.get()) is not None and not self._stop.is_set():
            try:
                self._refresh(topic, self._topics.get(topic, 0))
            except ProducerError as exc:  # keep serving the count known; asked again later
                _LOG.warning("could not read the partition count of %r again: %s", topic, exc)
                with self._lock:
                    self._checked[topic] = time.monotonic()
            finally:
                with self._lock:
                    self._refreshing.discard(topic)

    def _look_up(self, topic: str, create: bool) -> int:
        """The partition count of a topic new to this broker, from the backend.

        With ``create`` the topic is created (``auto_create``) or, when it exists, adopted:
        recorded with its real count. Without it only the topic records are read: a topic no
        broker recorded is unknown to reads and tools.

        Raises:
            InvalidTopicError: no such topic, and it may not be created here.
        """
        if create:
            if not self._auto_create:
                count = self._backend.describe_topic(topic)
                if count is None:
                    raise InvalidTopicError(f"unknown topic {topic!r} (auto_create_topics is off)")
            else:
                count = self._default_partitions
            with self._lock:  # (the broker lock is held around backend.create_topic)
                known = self._topics.get(topic)
                return known if known is not None else self._known(topic, self._backend.create_topic(topic, count))
        stored = self._backend.list_topics()
        with self._lock:
            for name, count in stored.items():
                if name not in self._topics:
                    self._known(name, count)
            if topic in self._topics:
                return self._topics[topic]
        raise InvalidTopicError(f"unknown topic {topic!r}")

    def _known(self, topic: str, count: int) -> int:
        """Note ``count`` as ``topic``'s partition count, read from the backend just now."""
        with self._lock:
            if count >= self._topics.get(topic, 0):
                self._topics[topic] = count
            self._checked[topic] = time.monotonic()
            return self._topics[topic]

    def _refresh(self, topic: str, known: int) -> int:
        """Read a known topic's partition count from the backend again (it never shrinks).

        Raises:
            BackendUnavailableError: the backend failed.
        """
        count = self._backend.describe_topic(topic)
        return self._known(topic, known if count is None else count)


def validate_topic(topic: str) -> str:
    """The stored name of ``topic`` (any spelling :func:`idempotent.core.topics.canonical_topic`
    accepts, such as ``persistent://public/default/orders`` for ``orders``).

    Raises:
        InvalidTopicError: not a valid spelling of a topic name.
    """
    return canonical_topic(topic)
