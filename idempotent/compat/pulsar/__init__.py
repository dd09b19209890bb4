"""A drop-in for pulsar-client's ``Client`` and ``Producer``: exactly-once publishing by
changing one import.

::

    from idempotent.compat import pulsar   # instead of: import pulsar

    client = pulsar.Client("pulsar://localhost:6650")
    producer = client.create_producer("orders", producer_name="orders-feed")
    msg_id = producer.send(b"...", sequence_id=42)

The service URL is any broker URL of this project: pulsar-client's own (``pulsar://host:port``,
``pulsar+ssl://host:port`` over TLS, ``http(s)://host:port`` for lookups over the web
service) store into that Pulsar cluster (through this project's broker and checker; give the
admin REST URL as ``?admin_url=...`` when it is not the default of
:mod:`idempotent.adapters.pulsar.url`; the client's TLS arguments and ``authentication`` apply),
``sqlite:///file.db`` the embedded log, ``memory://`` an in-process one, ``kafka://`` Kafka.
An open broker handle (:class:`idempotent.BrokerAPI`) is accepted as well.

Topics follow Pulsar's naming, which is the project's (:mod:`idempotent.core.topics`): ``orders``
and ``persistent://public/default/orders`` are the same topic, stored as ``orders``; Pulsar's
default namespace ``public/default`` is the project's root namespace. So
``idempotent.Reader(url, "persistent://public/default/orders")`` reads what was sent here.

Application-chosen sequence ids (``send(..., sequence_id=n)``, PIP-6) are the records'
sequences in the broker. A topic this module is the first to use gets Pulsar's rule (the
``monotonic`` policy: any increase, holes allowed), so ``initial_sequence_id`` and gapped
sequence ids work on a broker with default settings. A topic that already existed keeps the
policy in force on it (the broker's default is ``strict``: consecutive sequence ids, starting
after the producer's last stored one, at 0 for a new producer). A sequence id at or below the
last stored one is a duplicate: it is not stored again and ``send`` returns the original
message id (or ``-1:-1`` when it is out of the checker's window, as Pulsar does).

Every argument of pulsar-client's Client, ``create_producer`` and ``send`` is accepted and
type-checked as upstream (a wrong type raises a ValueError); connection tuning has no effect
(logged once at DEBUG); what cannot work here (encryption, custom routers, delayed delivery)
raises :class:`OperationNotSupported` saying so. ``create_reader`` works on every URL through
:class:`idempotent.Reader`; ``subscribe`` and ``create_table_view`` go to a real
``pulsar.Client`` on a Pulsar service URL. Every other name of pulsar-client (schemas,
``ConsumerType``, authentication classes, ...) is passed through from the installed module.
See ``docs/migration.md``.
"""

from __future__ import annotations

from typing import Any

from idempotent.runtime.native_logs import route_pulsar_attribute

from .. import _shared
from ._client import Client
from ._errors import (
    AlreadyClosed,
    AuthenticationError,
    AuthorizationError,
    BrokerMetadataError,
    BrokerPersistenceError,
    ConnectError,
    Interrupted,
    InvalidConfiguration,
    InvalidMessage,
    InvalidTopicName,
    InvalidUrl,
    LookupError,
    MessageTooBig,
    NotAllowedError,
    NotConnected,
    OperationNotSupported,
    ProducerBusy,
    ProducerFenced,
    ProducerNotInitialized,
    ProducerQueueIsFull,
    PulsarException,
    ReadError,
    Result,
    ServiceUnitNotReady,
    Timeout,
    TopicNotFound,
    TopicTerminated,
    UnknownError,
    _Absent,
    _exception_for,  # noqa: F401  (the mapping, for tests)
    _native,
)
from ._ids import MessageId, topic_name
from ._options import _LOGGED, _NATIVE  # noqa: F401  (_LOGGED: tests reset it)
from ._producer import Producer
from ._reading import Message, Reader

# What applications catch are pulsar-client's own exception classes (when it is installed):
# the drop-in raises subclasses of them, and the consumers and readers it passes through raise
# them, so ``except pulsar.Timeout`` catches both.
for _name in (
    "PulsarException",
    "UnknownError",
    "InvalidConfiguration",
    "Timeout",
    "LookupError",
    "ConnectError",
    "ReadError",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "NotConnected",
    "AlreadyClosed",
    "InvalidMessage",
    "ProducerNotInitialized",
    "ProducerBusy",
    "InvalidTopicName",
    "InvalidUrl",
    "ServiceUnitNotReady",
    "OperationNotSupported",
    "ProducerQueueIsFull",
    "MessageTooBig",
    "TopicNotFound",
    "TopicTerminated",
    "NotAllowedError",
    "ProducerFenced",
    "Interrupted",
):
    _native_class = _native(_name)
    if _native_class is not Exception and _native_class is not _Absent:  # pulsar-client's own
        globals()[_name] = _native_class

# ``import idempotent.compat.pulsar.schema`` (and every other submodule pulsar-client has) is
# the native one; this package's own modules start with an underscore
_shared.pass_through_submodules(__name__, _NATIVE, route_pulsar_attribute)

__all__ = [
    "AlreadyClosed",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerMetadataError",
    "BrokerPersistenceError",
    "Client",
    "ConnectError",
    "Interrupted",
    "InvalidConfiguration",
    "InvalidMessage",
    "InvalidTopicName",
    "InvalidUrl",
    "LookupError",
    "Message",
    "MessageId",
    "MessageTooBig",
    "NotAllowedError",
    "NotConnected",
    "OperationNotSupported",
    "Producer",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerNotInitialized",
    "ProducerQueueIsFull",
    "PulsarException",
    "ReadError",
    "Reader",
    "Result",
    "ServiceUnitNotReady",
    "Timeout",
    "TopicNotFound",
    "TopicTerminated",
    "UnknownError",
    "topic_name",
]


def __getattr__(name: str) -> Any:
    """The rest of pulsar-client (schemas, ``ConsumerType``, ``AuthenticationToken``,
    ``ConsoleLogger``, ...), passed through from the installed module."""
    return _shared.native_attribute(__name__, _NATIVE, name, route_pulsar_attribute)
