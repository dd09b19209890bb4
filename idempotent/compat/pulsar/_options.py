"""Checks of pulsar-client's arguments, as upstream checks them, and the settings accepted
without effect (each logged once at INFO, and listed in docs/migration.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ._errors import InvalidConfiguration, OperationNotSupported

_LOG = logging.getLogger("idempotent.compat.pulsar")

_NATIVE = "pulsar"
#: sequence ids are 0 .. 2**63-1, as pulsar-client's (compared without wrap-around by the
#: monotonic policy; the strict policy refuses any jump)
_MAX_SEQUENCE_ID = 2**63 - 1
_NO_TIMEOUT_MS = float(2**31 - 1)
#: the record headers a Pulsar writer stores as the message's event time and ordering key
#: (adapters/pulsar/producer_log.py)
EVENT_TIME_HEADER = "idem.event_time"
ORDERING_KEY_HEADER = "idem.ordering_key"


def _check_type(where: str, name: str, value: Any, *kinds: type) -> None:
    """pulsar-client's argument check: a value of the wrong type raises a ValueError.

    Raises:
        InvalidConfiguration: (a ValueError) naming the argument.
    """
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        expected = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
        raise InvalidConfiguration(f"{where}: {name} must be {expected}, not {value!r}")


# accepted without effect: logged once at INFO, and listed in docs/migration.md
_LOGGED: set[str] = set()


def _accept_without_effect(where: str, name: str, why: str) -> None:
    if name not in _LOGGED:
        _LOGGED.add(name)
        _LOG.info("%s: %s is accepted without effect: %s", where, name, why)


_CONNECTION = "records go through this project's broker; the backend's connection is set on the broker URL"
#: pulsar-client's service URL schemes: the backend is that Pulsar (see adapters/pulsar/url.py)
_PULSAR_SCHEMES = ("pulsar", "pulsar+ssl", "http", "https")
#: Client arguments that, on such a URL, configure the backend's own Pulsar client as well
_BACKEND_OPTIONS = (
    "authentication",
    "use_tls",
    "tls_trust_certs_file_path",
    "tls_allow_insecure_connection",
    "tls_validate_hostname",
    "tls_private_key_file_path",
    "tls_certificate_file_path",
    "listener_name",
)

_CLIENT_DEFAULTS: dict[str, Any] = {
    "authentication": None,
    "operation_timeout_seconds": 30,
    "io_threads": 1,
    "message_listener_threads": 1,
    "concurrent_lookup_requests": 50000,
    "log_conf_file_path": None,
    "stats_interval_in_seconds": 600,
    "use_tls": False,
    "tls_trust_certs_file_path": None,
    "tls_allow_insecure_connection": False,
    "tls_validate_hostname": False,
    "logger": None,
    "connection_timeout_ms": 10000,
    "listener_name": None,
    "tls_private_key_file_path": None,
    "tls_certificate_file_path": None,
}
_AUTHENTICATIONS = (
    "Authentication",
    "AuthenticationTLS",
    "AuthenticationToken",
    "AuthenticationAthenz",
    "AuthenticationOauth2",
    "AuthenticationBasic",
)


_PRODUCER_OPTIONS = (
    "schema",
    "compression_type",
    "max_pending_messages_across_partitions",
    "chunking_enabled",
    "message_routing_mode",
    "lazy_start_partitioned_producers",
    "properties",
    "batching_type",
    "encryption_key",
    "crypto_key_reader",
    "access_mode",
    "message_router",
)
_ENUMS = {
    "compression_type": "CompressionType",
    "message_routing_mode": "PartitionsRoutingMode",
    "batching_type": "BatchingType",
    "access_mode": "ProducerAccessMode",
}
_NO_EFFECT_HINTS = {
    "compression_type": "the backend stores records as the broker writes them",
    "max_pending_messages_across_partitions": "max_pending_messages bounds the whole producer",
    "chunking_enabled": "a record is stored whole, up to the broker's largest entry",
    "message_routing_mode": "messages are routed by partition_key hash, round robin without one",
    "lazy_start_partitioned_producers": "partitions are written through one producer",
    "properties": "producer properties are not stored",
    "batching_type": "batches are formed per partition",
    "access_mode": "a named producer fences its older instances; exclusivity between names is not enforced",
}


def _check_producer_options(options: Mapping[str, Any], direct: bool = False) -> Any:
    """Check create_producer's other options as pulsar-client does; return the schema.

    Raises:
        InvalidConfiguration: (a ValueError) an unknown option or a value of the wrong type.
        OperationNotSupported: encryption or a custom message router (they cannot work here).
    """
    where = "create_producer"
    for name, value in options.items():
        if name not in _PRODUCER_OPTIONS:
            raise InvalidConfiguration(f"{where}: unknown option {name!r}")
        if name in _ENUMS:
            if type(value).__name__ != _ENUMS[name]:
                raise InvalidConfiguration(f"{where}: {name} must be a pulsar.{_ENUMS[name]}, not {value!r}")
        elif name in ("chunking_enabled", "lazy_start_partitioned_producers"):
            _check_type(where, name, value, bool)
        elif name == "max_pending_messages_across_partitions":
            _check_type(where, name, value, int)
        elif name == "properties":
            _check_type(where, name, value, dict, type(None))
        elif name == "schema":
            if value is not None and not callable(getattr(value, "encode", None)):
                raise InvalidConfiguration(f"{where}: schema must be a pulsar schema, not {value!r}")
            continue
        elif value is not None and direct and name in _APPLIED_ON_PULSAR:
            continue  # encryption_key, crypto_key_reader: the producer's Pulsar writers encrypt
        elif name == "message_router" and value is not None:
            if not callable(value):
                raise InvalidConfiguration(f"{where}: message_router must be callable, not {value!r}")
            continue  # called per message with (message, partition count), as pulsar-client
        elif value is not None:  # encryption_key, crypto_key_reader, message_router
            raise OperationNotSupported(
                f"{where}: {name} is not supported: "
                + ("custom routers are not supported" if name == "message_router" else "encryption is not supported")
            )
        if name in _NO_EFFECT_HINTS and not (direct and name in _APPLIED_ON_PULSAR):
            _accept_without_effect(where, name, _NO_EFFECT_HINTS[name])
    schema = options.get("schema")
    return None if schema is None or type(schema).__name__ == "BytesSchema" else schema


_SEND_OPTIONS = (
    "ordering_key",
    "replication_clusters",
    "disable_replication",
    "event_timestamp",
    "deliver_at",
    "deliver_after",
)


#: producer settings that a Pulsar service URL applies to the producer's own Pulsar writers
_APPLIED_ON_PULSAR = frozenset({"compression_type", "access_mode", "encryption_key", "crypto_key_reader"})


def _check_send_options(options: Mapping[str, Any], direct: bool = False) -> None:
    """Check send's other options as pulsar-client does.

    Raises:
        InvalidConfiguration: (a ValueError) an unknown option or a value of the wrong type.
        OperationNotSupported: delayed delivery (deliver_at, deliver_after), which cannot work here.
    """
    where = "send"
    for name, value in options.items():
        if name not in _SEND_OPTIONS:
            raise InvalidConfiguration(f"{where}: unknown option {name!r}")
        if value is None:
            continue
        if name == "ordering_key":
            _check_type(where, name, value, str)
            if not direct:
                _accept_without_effect(where, name, "records are ordered per partition; use partition_key")
        elif name == "replication_clusters":
            _check_type(where, name, value, list)
            _accept_without_effect(where, name, "there is no geo-replication here")
        elif name == "disable_replication":
            _check_type(where, name, value, bool)
            _accept_without_effect(where, name, "there is no geo-replication here")
        elif name == "event_timestamp":
            _check_type(where, name, value, int)
            if not direct:
                _accept_without_effect(where, name, "records on this backend carry the time the broker stored them")
        else:
            if name == "deliver_at":
                _check_type(where, name, value, int)
            elif not hasattr(value, "total_seconds"):
                raise InvalidConfiguration(f"{where}: deliver_after must be a timedelta, not {value!r}")
            raise OperationNotSupported(f"{where}: {name} is not supported: delayed delivery is not available")
