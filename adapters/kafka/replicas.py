"""How many copies the Kafka backend keeps of the topics it creates, and the check of the
internal topics it finds.

* **Created topics** (the internal ``__idempotent_meta``, ``__idempotent_snapshots`` and
  ``__idempotent_producer_state``, and the data topics it creates) get the cluster's own
  defaults: ``replication_factor`` -1 in the CreateTopics request (Kafka then applies the
  brokers' ``default.replication.factor``), and no ``min.insync.replicas`` of their own (the
  brokers' applies). The backend's ``replication_factor`` and ``min_insync_replicas`` options
  set them explicitly instead (:func:`replica_options` checks them).
* **The check** (:class:`ReplicaCheck`): an internal topic with fewer replicas than the
  brokers' default, than ``replication_factor`` asks for, or than a data topic it serves is
  logged at WARNING, once per topic, with its replica count and the fix
  (``kafka-reassign-partitions``). It is never fatal: the topic works, it is only less
  durable than the data it describes.
* **A factor refused that the cluster's brokers can give** (:func:`cluster_brokers`): Kafka
  places a new topic's replicas only on the brokers it can use now, which leaves out a broker
  in controlled shutdown (a rolling restart) while the metadata still lists it. That refusal
  is the broker's absence, an outage (:class:`~idempotent.errors.BackendUnavailableError`,
  retriable); a factor above the cluster's size is the setting's
  (:class:`~idempotent.errors.ConfigError`).
* :func:`describe_replicas`: each partition's replicas, in-sync replicas and leader, and the
  topic's ``min.insync.replicas`` in force (``idempotent topics describe``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from idempotent.backend import PartitionReplicas, TopicReplicas
from idempotent.errors import ConfigError

try:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ConfigSource, NewTopic  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the kafka backend needs confluent-kafka: pip install 'idempotent[kafka]'") from exc

_LOG = logging.getLogger("idempotent.adapters.kafka")

#: what CreateTopics takes for "the brokers' default.replication.factor"
BROKER_DEFAULT = -1
#: Kafka stores a replication factor as a 16-bit integer
_MAX_REPLICAS = 32767
#: what each internal topic holds, for the warning (why not to delete it)
_HOLDS = {
    "__idempotent_meta": "the topics, producer ids and settings",
    "__idempotent_snapshots": "the checkers' snapshots",
    "__idempotent_producer_state": "the named producers' states",
}


def _count(name: str, value: object, low: int, where: str) -> int | None:
    """An option's count: None when not given (or -1: the brokers' default)."""
    if value is None:
        return None
    bad = ConfigError(f"{name} must be a whole number, not {value!r}, in {where}")
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise bad
    try:
        number = int(value)
    except ValueError:
        raise bad from None
    if number == BROKER_DEFAULT:
        return None
    if not low <= number <= _MAX_REPLICAS:
        raise ConfigError(
            f"{name} must be from {low} to {_MAX_REPLICAS} (or -1, or left out, for the brokers' default), "
            f"not {value!r}, in {where}"
        )
    return number


def replica_options(
    replication_factor: object, min_insync_replicas: object, topic_config: Mapping[str, str], where: str
) -> tuple[int | None, int | None]:
    """The replication factor and ``min.insync.replicas`` of the topics a backend creates, as
    given (keyword or URL query value, an int or its decimal text): None for the brokers'
    default, which is also what -1 means.

    Raises:
        ConfigError: a value that is not a whole number from 1 to 32767, a
            ``min_insync_replicas`` above the ``replication_factor``, or one that differs from
            ``min.insync.replicas`` in ``topic_config`` (``where`` names the URL).
    """
    factor = _count("replication_factor", replication_factor, 1, where)
    insync = _count("min_insync_replicas", min_insync_replicas, 1, where)
    if factor is not None and insync is not None and insync > factor:
        raise ConfigError(
            f"min_insync_replicas={insync} is more than replication_factor={factor}, in {where}: "
            "no write could ever be acknowledged"
        )
    configured = topic_config.get("min.insync.replicas")
    if insync is not None and configured is not None and str(configured).strip() != str(insync):
        raise ConfigError(
            f"min_insync_replicas={insync} and topic_config's min.insync.replicas={configured!r} differ, in {where}"
        )
    return factor, insync


def new_topic(
    name: str, partitions: int, config: Mapping[str, str], replication_factor: int | None, min_insync: int | None
) -> Any:
    """The CreateTopics request of one topic: the brokers' defaults where None."""
    settings = dict(config)
    if min_insync is not None:
        settings["min.insync.replicas"] = str(min_insync)
    factor = BROKER_DEFAULT if replication_factor is None else replication_factor
    return NewTopic(name, num_partitions=partitions, replication_factor=factor, config=settings)


def cluster_brokers(cluster: Any) -> set[int]:
    """The brokers the cluster has (confluent-kafka's ClusterMetadata): those up now, and
    those that hold a replica of some topic yet are not up (a restart, a pause, a crash)."""
    up = {int(broker) for broker in getattr(cluster, "brokers", None) or {}}
    held = {
        int(replica)
        for topic in (getattr(cluster, "topics", None) or {}).values()
        for partition in (getattr(topic, "partitions", None) or {}).values()
        for replica in partition.replicas
    }
    return up | held


def replica_count(metadata: Any) -> int | None:
    """The fewest replicas any partition of a topic has (confluent-kafka's TopicMetadata);
    None when it has no partitions (yet)."""
    partitions = getattr(metadata, "partitions", None) or {}
    counts = [len(p.replicas) for p in partitions.values()]
    return min(counts) if counts else None


def broker_default_replicas(admin: Any, brokers: Mapping[int, Any], timeout: float) -> int | None:
    """The brokers' ``default.replication.factor``, as one of them reports it; None when the
    cluster does not say (the principal may not describe the brokers' configuration, or the
    request failed: the check it serves is advice, and waits for no answer)."""
    if not brokers:
        return None
    resource = ConfigResource(ConfigResource.Type.BROKER, str(min(brokers)))
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
    except (KafkaException, TimeoutError) as exc:  # TimeoutError: the future got no answer in time
        _LOG.debug("kafka: the brokers' default.replication.factor is not known: %r", exc)
        return None
    entry = entries.get("default.replication.factor")
    return None if entry is None or entry.value is None else int(entry.value)


def describe_replicas(admin: Any, metadata: Any, name: str, timeout: float) -> TopicReplicas:
    """The replicas of the Kafka topic ``name`` (``metadata``: its TopicMetadata) and its
    ``min.insync.replicas`` in force (None when the principal may not describe its
    configuration)."""
    partitions = tuple(
        PartitionReplicas(p.id, int(p.leader), tuple(int(r) for r in p.replicas), tuple(int(r) for r in p.isrs))
        for p in sorted(metadata.partitions.values(), key=lambda p: p.id)
    )
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
    except (KafkaException, TimeoutError) as exc:  # TimeoutError: the future got no answer in time
        _LOG.debug("kafka: the configuration of %r is not known: %r", name, exc)
        return TopicReplicas(partitions)
    entry = entries.get("min.insync.replicas")
    if entry is None or entry.value is None:
        return TopicReplicas(partitions)
    source = "topic" if int(entry.source) == int(ConfigSource.DYNAMIC_TOPIC_CONFIG.value) else "broker"
    return TopicReplicas(partitions, int(entry.value), source)


def shortfall_message(name: str, count: int, partitions: int, target: int, reason: str) -> str:
    """The warning for an internal topic with fewer replicas than ``target``."""
    base = next((holds for suffix, holds in _HOLDS.items() if name.endswith(suffix)), "this backend's state")
    return (
        f"kafka: the internal topic {name!r} has {count} replica(s) per partition, fewer than {reason} ({target}): "
        f"one broker's loss can lose {base}. Raise it to {target} with kafka-reassign-partitions "
        f"(--reassignment-json-file listing {target} broker ids for each of its {partitions} partition(s), "
        "then --execute); do not delete it to have it recreated: what it holds would be gone"
    )


class ReplicaCheck:
    """What the backend knows of the replication of its internal topics and of the data
    topics they serve; warns (once per internal topic) when one has fewer replicas than it
    should (see the module docstring). Thread-safe."""

    def __init__(self, replication_factor: int | None) -> None:
        self._asked = replication_factor
        self._lock = threading.Lock()
        #: internal topic -> (fewest replicas of a partition, partitions)
        self._internal: dict[str, tuple[int, int]] = {}
        self._broker_default: int | None = None
        self._broker_default_known = False
        #: the data topic with the most replicas seen so far, and that count
        self._data: tuple[str, int] | None = None
        self._seen_data: set[str] = set()
        self._warned: set[str] = set()

    @property
    def broker_default_known(self) -> bool:
        return self._broker_default_known

    def note_broker_default(self, replicas: int | None) -> None:
        with self._lock:
            self._broker_default, self._broker_default_known = replicas, True
        self._warn()

    def note_internal(self, name: str, metadata: Any) -> None:
        """An internal topic's metadata (confluent-kafka's TopicMetadata) as found now."""
        count = replica_count(metadata)
        if count is None:
            return
        with self._lock:
            self._internal[name] = (count, len(metadata.partitions))
        self._warn()

    def note_data(self, name: str, metadata: Any) -> None:
        """A data topic's metadata, as found when it was described (each topic counted once)."""
        if name in self._seen_data:
            return
        count = replica_count(metadata)
        if count is None:
            return
        with self._lock:
            self._seen_data.add(name)
            if self._data is None or count > self._data[1]:
                self._data = (name, count)
        self._warn()

    def _warn(self) -> None:
        with self._lock:
            targets: list[tuple[int, str]] = []
            if self._broker_default is not None:
                targets.append((self._broker_default, "the brokers' default.replication.factor"))
            if self._asked is not None:
                targets.append((self._asked, "replication_factor"))
            if self._data is not None:
                targets.append((self._data[1], f"the data topic {self._data[0]!r} it serves has"))
            if not targets:
                return
            target, reason = max(targets, key=lambda t: t[0])  # a tie: the first named
            due = [
                (name, count, partitions)
                for name, (count, partitions) in sorted(self._internal.items())
                if count < target and name not in self._warned
            ]
            self._warned.update(name for name, _, _ in due)
        for name, count, partitions in due:
            _LOG.warning("%s", shortfall_message(name, count, partitions, target, reason))
