"""The configuration of the confluent-kafka drop-in: librdkafka's properties, read as
librdkafka reads them, and what each one does here.

Where records go: ``idempotent.broker.url`` (any broker URL) or ``idempotent.broker`` (a
broker handle), else the environment variable ``IDEMPOTENT_BROKER_URL``, else the Kafka
cluster ``bootstrap.servers`` names (``kafka://`` with the application's connection settings:
every client the project opens there gets its ``security.protocol``, ``sasl.*``, ``ssl.*``
and other connection properties). With none of them, no broker is configured, as with
librdkafka: messages wait and time out.

Every property librdkafka or confluent-kafka accepts is accepted. Those that mean something
here are used; those that would weaken exactly-once are refused (``enable.idempotence=false``)
or overridden with a WARNING saying why, once (``acks`` other than all, ``retries=0``); the
others are accepted without effect and logged at INFO once each (listed in
docs/migration.md). An unknown key is refused as librdkafka refuses it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from idempotent.broker.config import BrokerConfig

from ..api import BrokerAPI
from ._kafka_errors import KafkaError, KafkaException
from ._partitioners import PARTITIONERS
from ._rdkafka import PROPERTIES

_LOG = logging.getLogger("idempotent.compat.confluent_kafka")

ENV_BROKER_URL = "IDEMPOTENT_BROKER_URL"

_ALIASES = {
    "metadata.broker.list": "bootstrap.servers",
    "queue.buffering.max.ms": "linger.ms",
    "delivery.timeout.ms": "message.timeout.ms",
    "max.in.flight.requests.per.connection": "max.in.flight",
    "message.send.max.retries": "retries",
    "request.required.acks": "acks",
    "compression.codec": "compression.type",
    "callback": "on_delivery",
}

_LIBRDKAFKA_DEFAULTS: dict[str, int] = {
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "message.timeout.ms": 300_000,
    "request.timeout.ms": 30_000,
    "max.in.flight": 5,
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 1_048_576,
    "message.max.bytes": 1_000_000,
    "statistics.interval.ms": 0,
    "sticky.partitioning.linger.ms": 10,
}
_LIMITS: dict[str, tuple[int, int]] = {
    "linger.ms": (0, 900_000),
    "message.timeout.ms": (0, 2**31 - 1),
    "max.in.flight": (1, 1_000_000),
    "message.max.bytes": (1000, 1_000_000_000),
    "statistics.interval.ms": (0, 86_400_000),
    "sticky.partitioning.linger.ms": (0, 900_000),
}

#: confluent-kafka's own keys (callbacks), next to librdkafka's properties
_CALLBACKS = ("on_delivery", "error_cb", "stats_cb", "throttle_cb", "oauth_cb")

#: connection properties: given to every Kafka client the project opens for this producer
_CONNECTION_PREFIXES = (
    "security.",
    "ssl.",
    "ssl_",
    "sasl.",
    "socket.",
    "broker.",
    "reconnect.",
    "api.version.",
    "client.dns.",
    "enable.ssl.",
    "enable.sasl.",
    "https.",
)
_CONNECTION_KEYS = frozenset(
    {"client.rack", "connections.max.idle.ms", "oauth_cb", "retry.backoff.ms", "retry.backoff.max.ms"}
)
#: settings of the producer's own Kafka writer (``idempotent.adapters.kafka.producer_log.TUNABLE``)
_WRITER_KEYS = frozenset({"compression.type", "compression.level", "transaction.timeout.ms"})

#: keys logged (once each) as accepted without effect, or overridden
_LOGGED: set[str] = set()


def _invalid(message: str) -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, message))


def _once(level: int, key: str, message: str, *args: object) -> None:
    if key not in _LOGGED:
        _LOGGED.add(key)
        _LOG.log(level, message, *args)


def _without_effect(key: str, why: str) -> None:
    _once(logging.INFO, key, "configuration property %r is accepted without effect: %s", key, why)


def _as_int(key: str, value: Any, minimum: int, maximum: int) -> int:
    try:
        number = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not minimum <= number <= maximum:
        raise _invalid(f"Configuration property {key!r}: {value!r} is not an integer in {minimum}..{maximum}")
    return number


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "t"):
        return True
    if text in ("false", "0", "f"):
        return False
    raise _invalid(f"Configuration property {key!r}: {value!r} is not a boolean")


def _flatten(conf: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The configuration as ``(key, value)`` pairs in the order librdkafka applies them: the
    keys in order (an alias sets the same property, so the later one wins), then the
    deprecated ``default.topic.config`` dict."""
    pairs: list[tuple[str, Any]] = []
    topic_conf: Any = None
    for key, value in conf.items():
        if not isinstance(key, str):
            raise TypeError(f"configuration keys must be str, got {key!r}")
        if key == "default.topic.config":
            topic_conf = value
        else:
            pairs.append((key, value))
    if topic_conf is not None:
        if not isinstance(topic_conf, Mapping):
            raise TypeError("default.topic.config must be a dict")
        pairs.extend(_flatten(topic_conf))
    return pairs


def is_connection_key(key: str) -> bool:
    """Whether a librdkafka property is about reaching the cluster (see the module docstring)."""
    return key in _CONNECTION_KEYS or key.startswith(_CONNECTION_PREFIXES)


class Config:
    """The producer configuration, validated (see the module docstring).

    Raises:
        TypeError: not a dict, a key that is not a str, a callback that is not callable.
        KafkaException: ``_INVALID_ARG`` for an unknown key or a bad value (named in the
            message), or ``enable.idempotence=false``.
    """

    def __init__(self, conf: Mapping[str, Any]) -> None:
        if not isinstance(conf, Mapping):
            raise TypeError(f"expected configuration dict, got {type(conf).__name__}")
        self.broker: BrokerAPI | None = None
        self.url: str | None = None
        self.bootstrap: str | None = None
        self.producer_name: str | None = None
        #: BrokerConfig.state_rebuild_records of a producer writing into Kafka itself (None: its default)
        self.state_rebuild_records: int | None = None
        self.on_delivery: Callable[[Any, Any], Any] | None = None
        self.error_cb: Callable[[KafkaError], Any] | None = None
        self.stats_cb: Callable[[str], Any] | None = None
        self.logger: logging.Logger | logging.LoggerAdapter[Any] | None = None
        self.client_id = "rdkafka"
        self.only_errors = False
        self.partitioner = "consistent_random"
        #: librdkafka properties for every Kafka client opened for this producer
        self.connection: dict[str, Any] = {}
        #: librdkafka properties of this producer's own Kafka writer
        self.writer: dict[str, Any] = {}
        numbers = dict(_LIBRDKAFKA_DEFAULTS)
        for raw_key, value in _flatten(conf):
            key = _ALIASES.get(raw_key, raw_key)
            if value is None:  # as librdkafka's NULL: the property goes back to its default
                if key in numbers:
                    numbers[key] = _LIBRDKAFKA_DEFAULTS[key]
                elif key == "bootstrap.servers":
                    self.bootstrap = None
                continue
            if key in numbers:
                low, high = _LIMITS.get(key, (1, 2**31 - 1))
                numbers[key] = _as_int(raw_key, value, low, high)
            elif key == "bootstrap.servers":
                if not isinstance(value, str):
                    raise _invalid(f"Configuration property {raw_key!r} must be a str, not {value!r}")
                self.bootstrap = value.strip() or None
            elif key == "idempotent.broker.url":
                if not isinstance(value, str):
                    raise _invalid(f"Configuration property 'idempotent.broker.url' must be a URL str, not {value!r}")
                self.url = value
            elif key == "idempotent.broker":
                if not isinstance(value, BrokerAPI):
                    raise _invalid(f"Configuration property 'idempotent.broker' must be a broker handle, not {value!r}")
                self.broker = value
            elif key == "idempotent.state.rebuild.records":
                self.state_rebuild_records = _as_int(raw_key, value, 1, 2**63 - 1)
            elif key in ("idempotent.producer.name", "transactional.id"):
                if not isinstance(value, str) or not value:
                    raise _invalid(f"Configuration property {key!r} must be a non-empty str")
                if self.producer_name is not None and self.producer_name != value:
                    raise _invalid("'transactional.id' and 'idempotent.producer.name' name different producers")
                self.producer_name = value
            elif key == "enable.idempotence":
                if not _as_bool(key, value):
                    raise _invalid(
                        "Configuration property 'enable.idempotence'=false is not supported: it would give up "
                        "the exactly-once guarantee; every record goes through the producer's sequence checker"
                    )
            elif key == "acks":
                if str(value).strip().lower() not in ("all", "-1"):
                    _once(
                        logging.WARNING,
                        key,
                        "acks=%s is overridden: records are stored with acks=all (every in-sync replica), "
                        "which exactly-once needs; an acknowledgement from fewer replicas can be lost",
                        value,
                    )
            elif key == "retries":
                if _as_int(raw_key, value, 0, 2**31 - 1) == 0:
                    _once(
                        logging.WARNING,
                        key,
                        "retries=0 is overridden: a batch without an answer is resent until message.timeout.ms, "
                        "and a resend of stored records is recognised as a duplicate, never stored twice",
                    )
            elif key == "partitioner":
                if value not in PARTITIONERS:
                    raise _invalid(f'Invalid value for configuration property "partitioner": {value}')
                self.partitioner = value
            elif key in _CALLBACKS:
                if value is not None and not callable(value):
                    raise TypeError(f"expected {key} property as a callable function")
                if key == "on_delivery":
                    self.on_delivery = value
                elif key == "error_cb":
                    self.error_cb = value
                elif key == "stats_cb":
                    self.stats_cb = value
                elif key == "oauth_cb":
                    self.connection[key] = value
                else:
                    _without_effect(key, "broker throttling is not reported")
            elif key == "logger":
                if value is not None and not isinstance(value, logging.Logger | logging.LoggerAdapter):
                    raise TypeError("logger must be a logging.Logger")
                self.logger = value
            elif key == "delivery.report.only.error":
                self.only_errors = _as_bool(key, value)
            elif key == "client.id":
                self.client_id = str(value)
                self.connection[key] = self.client_id
            elif key in _WRITER_KEYS:
                self.writer[key] = value
            elif key in PROPERTIES and is_connection_key(key):
                self.connection[key] = value
            elif key in PROPERTIES:
                _without_effect(key, _NO_EFFECT_REASON)
            else:
                raise _invalid(f'No such configuration property: "{raw_key}"')
        if self.url is None and self.broker is None:
            self.url = os.environ.get(ENV_BROKER_URL) or None
        self.linger_ms = float(numbers["linger.ms"])
        self.batch_size = int(numbers["batch.size"])
        self.max_batch_records = int(numbers["batch.num.messages"])
        timeout = int(numbers["message.timeout.ms"])
        self.delivery_timeout_ms = float(timeout) if timeout > 0 else float(2**31 - 1)  # 0 = infinite
        self.request_timeout_ms = float(numbers["request.timeout.ms"])
        # more in flight than the checker's window would let a resend go unrecognised: at most 5
        self.max_in_flight = min(int(numbers["max.in.flight"]), 5)
        self.max_messages = int(numbers["queue.buffering.max.messages"])
        self.max_bytes = int(numbers["queue.buffering.max.kbytes"]) * 1024
        self.max_message_bytes = int(numbers["message.max.bytes"])
        self.stats_interval = int(numbers["statistics.interval.ms"]) / 1000.0
        self.sticky_linger = int(numbers["sticky.partitioning.linger.ms"]) / 1000.0

    @property
    def target(self) -> str | None:
        """The URL records go to (None: a broker handle, or no broker configured)."""
        if self.url is not None:
            return self.url
        if self.broker is not None or self.bootstrap is None:
            return None
        return f"kafka://{self.bootstrap}"

    @property
    def cluster(self) -> str:
        """The Kafka cluster records go to, as librdkafka's ``bootstrap.servers`` (the hosts
        of a ``kafka://`` URL); empty when they go elsewhere."""
        target = self.target
        if target is None or not target.startswith("kafka://"):
            return ""
        return target[len("kafka://") :].split("?", 1)[0].split("/", 1)[0]

    @property
    def kafka(self) -> bool:
        """Whether records go to a Kafka cluster (where the connection properties apply)."""
        target = self.target
        return target is not None and target.startswith("kafka://")

    def connect_options(self) -> dict[str, Any]:
        """The options of :class:`idempotent.Producer` (and its backend) for the target."""
        if not self.kafka:
            for key in (*self.connection, *self.writer):
                _without_effect(key, f"records go to {self.target or 'a broker handle'}, not a Kafka cluster")
            return {}
        client_config = dict(self.connection)
        if self.logger is not None:
            client_config["logger"] = self.logger
        options: dict[str, Any] = {"client_config": client_config, "log_settings": dict(self.writer)}
        if self.state_rebuild_records is not None:
            options["config"] = BrokerConfig(state_rebuild_records=self.state_rebuild_records)
        return options


_NO_EFFECT_REASON = (
    "it tunes librdkafka's own producer, and this producer batches, numbers and writes its records "
    "itself (see docs/migration.md)"
)

__all__ = ["ENV_BROKER_URL", "Config", "is_connection_key"]
