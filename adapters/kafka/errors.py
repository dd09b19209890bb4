"""Kafka's errors in the project's tree: the one translation of confluent-kafka's errors, at
the adapter edge (:mod:`idempotent.adapters.kafka.backend`, its writer and :mod:`idempotent.adapters.kafka.txn`, the
producer log of :mod:`idempotent.adapters.kafka.producer_log`, and the mirror's Kafka source
:mod:`idempotent.adapters.kafka.source` use it).

A ``KafkaError`` carries a code and three flags librdkafka sets where it raises it:
``fatal()`` (the client instance can do nothing more), ``txn_requires_abort()`` (the current
transaction failed; abort it, a new one may succeed) and ``retriable()`` (the same call may
succeed later). :func:`translate` reads the code first (fenced, too large, refused rights,
bad settings, missing topics, a client used in a state that does not allow the call), then
the flags, then the codes Kafka's protocol documents as transient.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    EntryTooLargeError,
    InvalidBatchError,
    InvalidTopicError,
    OwnershipLostError,
    ProducerError,
    internal_error,
)

_LOG = logging.getLogger("idempotent.adapters.kafka")


@contextlib.contextmanager
def map_errors(what: str, *, topic_may_be_new: bool = True) -> Iterator[None]:
    """Translate confluent-kafka errors into the project's tree, once, at the adapter edge
    (see :func:`translate`, which ``topic_may_be_new`` is passed to). ``BufferError``
    (librdkafka's local queue is full) and ``TimeoutError`` (an admin request's future
    unanswered) are transient; any other exception is a bug: logged,
    FATAL."""
    try:
        yield
    except ProducerError:
        raise
    except KafkaException as exc:
        raise translate(exc.args[0] if exc.args else None, what, topic_may_be_new=topic_may_be_new) from exc
    except BufferError as exc:
        raise BackendUnavailableError(f"kafka: {what}: local queue full: {exc}") from exc
    except TimeoutError as exc:  # an admin request's future with no answer in its time
        raise BackendUnavailableError(f"kafka: {what}: the cluster did not answer in time") from exc
    except (RuntimeError, ValueError, TypeError) as exc:
        raise internal_error(f"kafka: {what}", exc, _LOG) from exc


#: Codes that mean a newer owner fenced this partition's transactional producer.
FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
#: A record or request larger than the broker or the client takes: stored nothing, for certain.
TOO_LARGE_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
#: librdkafka's code for records failed only because another record of their message set was refused
WITH_ANOTHER_RECORD = getattr(KafkaError, "_INVALID_DIFFERENT_RECORD", -138)
#: The broker refused a record of a batch (its time outside the topic's bounds, a missing key
#: on a compacted topic), and librdkafka failed the records sent with it
#: (:data:`WITH_ANOTHER_RECORD`): nothing of the batch is stored, and a resend is refused alike.
#: Produce answers only: a corrupt record (``CORRUPT_MESSAGE``, which a read can meet too)
#: stays an unexpected error.
REFUSED_CODES = frozenset({KafkaError.INVALID_RECORD, KafkaError.INVALID_TIMESTAMP, WITH_ANOTHER_RECORD})


def refused_record(error: Any) -> bool:
    """Whether ``error`` (a delivery report's) says the broker refused this very record, not
    only the message set it was sent in."""
    return isinstance(error, KafkaError) and error.code() in REFUSED_CODES and error.code() != WITH_ANOTHER_RECORD


#: The backend refused the broker's credentials or rights: fix ``client_config`` or the ACLs.
ACCESS_CODES = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.ILLEGAL_SASL_STATE,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED,
    }
)
#: A setting, a topic's configuration or the cluster's version does not allow the request.
CONFIG_CODES = frozenset(
    {
        KafkaError._INVALID_ARG,
        KafkaError._NOT_CONFIGURED,
        KafkaError._UNSUPPORTED_FEATURE,
        KafkaError._NOT_IMPLEMENTED,
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_PARTITIONS,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.INVALID_REPLICA_ASSIGNMENT,
        KafkaError.INVALID_REQUIRED_ACKS,
        KafkaError.INVALID_TRANSACTION_TIMEOUT,
        KafkaError.POLICY_VIOLATION,
        KafkaError.UNSUPPORTED_VERSION,
        KafkaError.UNSUPPORTED_COMPRESSION_TYPE,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        KafkaError.SECURITY_DISABLED,
    }
)
#: The topic or partition does not exist and will not appear by waiting (librdkafka's local
#: codes, after ``topic.metadata.propagation.max.ms``), or its name is invalid.
TOPIC_CODES = frozenset(
    {
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.TOPIC_ALREADY_EXISTS,
    }
)
#: Transient by Kafka's protocol and librdkafka's documentation: the network, a broker or a
#: leader is away or moving, replicas are short, a request or a message timed out, or the
#: transaction coordinator is loading, moving or still aborting a previous owner's
#: transaction (the course of a takeover, see :func:`idempotent.adapters.kafka.txn.fence`). Retrying
#: later may succeed.
TRANSIENT_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._QUEUE_FULL,
        KafkaError._RESOLVE,
        KafkaError._WAIT_COORD,
        KafkaError._ISR_INSUFF,
        KafkaError._RETRY,
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
        KafkaError._DESTROY,
        # librdkafka ends a request whose broker handle it retired (a broker that left the
        # metadata, or whose address changed): another broker serves the retry
        getattr(KafkaError, "_DESTROY_BROKER", -137),
        KafkaError._NODE_UPDATE,
        KafkaError._WAIT_CACHE,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,  # NOT_LEADER_OR_FOLLOWER
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.UNKNOWN_TOPIC_OR_PART,  # a new topic's metadata still propagating
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.NOT_CONTROLLER,
        KafkaError.THROTTLING_QUOTA_EXCEEDED,
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.TRANSACTION_ABORTABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,  # a new leader still settling its high watermark
        KafkaError.PREFERRED_LEADER_NOT_AVAILABLE,
        KafkaError.ELIGIBLE_LEADERS_NOT_AVAILABLE,
    }
)

#: What librdkafka answers for a topic or partition it has no leader for in the metadata it
#: holds: the same codes when the partition does not exist as when it exists and its leader is
#: away (an election under way, the broker of its only replica down or paused, a restarted
#: broker still loading it). A watermark query answers ``_UNKNOWN_PARTITION`` ("Failed to get
#: watermark offsets") in both cases. They are told apart by asking the cluster
#: (:func:`unseen_partition`): only a partition the cluster's own metadata does not list is
#: missing.
UNSEEN_CODES = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART})


def unseen(error: Any) -> bool:
    """Whether ``error`` (a ``KafkaError``, or a ``KafkaException`` carrying one) is one of
    :data:`UNSEEN_CODES`: missing, or only without a leader now (see :func:`unseen_partition`)."""
    if isinstance(error, KafkaException):
        error = error.args[0] if error.args else None
    return isinstance(error, KafkaError) and error.code() in UNSEEN_CODES


def unseen_partition(error: Any, what: str, listed: bool, *, topic_may_be_new: bool = True) -> ProducerError:
    """The project error for an error of :data:`UNSEEN_CODES` about a partition, once the
    cluster's metadata was asked afresh whether it lists that partition (``listed``).

    A listed partition exists and has no leader right now: :class:`BackendUnavailableError`
    (RETRY; the leader is elected or its broker comes back within the delivery timeout).
    Otherwise the error is translated as it is (:func:`translate`): a topic that does not
    exist is :class:`InvalidTopicError`.
    """
    if listed and isinstance(error, KafkaError):
        return BackendUnavailableError(
            f"kafka: {what}: {error.name()}: {error.str()} (the cluster lists the partition: its leader is away "
            "or being elected; retry)"
        )
    return translate(error, what, topic_may_be_new=topic_may_be_new)


#: The client was asked for something its own state does not allow: a transactional call while
#: another one is unfinished (``_CONFLICT``: after ``commit_transaction`` timed out, librdkafka
#: accepts only ``commit_transaction`` again), the same call from two threads
#: (``_PREV_IN_PROGRESS``), a call in the wrong transaction state (``_STATE``,
#: ``INVALID_TXN_STATE``), or any call after a fatal error (``_FATAL``). librdkafka flags the
#: first three retriable, but retrying the same call on the same instance answers the same, for
#: ever: :class:`idempotent.adapters.kafka.txn.TransactionalProducer` replaces the instance instead.
#: Anywhere else they are a bug in how the adapter drives its client.
CLIENT_STATE_CODES = frozenset(
    {
        KafkaError._CONFLICT,
        KafkaError._PREV_IN_PROGRESS,
        KafkaError._STATE,
        KafkaError._FATAL,
        KafkaError.INVALID_TXN_STATE,
    }
)


def translate(error: Any, what: str, *, topic_may_be_new: bool = True, delivery: bool = False) -> ProducerError:
    """The project error for a ``KafkaError`` (or whatever a ``KafkaException`` carried).

    ``delivery``: the error is a produced record's delivery report, where the codes of
    :data:`REFUSED_CODES` mean the broker refused the record's batch; elsewhere (a read, an
    admin call) they are unexpected.

    ``topic_may_be_new``: Kafka's UNKNOWN_TOPIC_OR_PART is transient for topics this project
    creates (a new topic's metadata is still propagating); False where topics are read as
    they are (the mirror's Kafka source), where it means the topic does not exist:
    :class:`InvalidTopicError`.

    In this order: fenced by a newer owner -> :class:`OwnershipLostError`; too large ->
    :class:`EntryTooLargeError`; in a delivery report, a record the broker refuses
    (:data:`REFUSED_CODES`, unless flagged retriable or abortable) -> :class:`InvalidBatchError`;
    refused credentials or rights, or a bad setting -> :class:`ConfigError`; a topic that is
    missing or invalid -> :class:`InvalidTopicError`;
    a call the client's state does not allow (:data:`CLIENT_STATE_CODES`: a bug here, or an
    instance that must be replaced, never a retry on it) or librdkafka's ``fatal()`` (the
    client instance is unusable) -> FATAL :class:`InternalError`;
    what librdkafka or Kafka's protocol documents as transient (``retriable()``,
    ``txn_requires_abort()``: the transaction was aborted, a new one may succeed, or a code of
    :data:`TRANSIENT_CODES`) -> :class:`BackendUnavailableError` (RETRY). Anything else is
    unexpected: a logged FATAL :class:`InternalError`, never a retry.
    """
    if not isinstance(error, KafkaError):
        return internal_error(f"kafka: {what}", KafkaException(error), _LOG)
    code = error.code()
    text = f"kafka: {what}: {error.name()}: {error.str()}"
    if code in FENCED_CODES:
        return OwnershipLostError(f"kafka: {what}: fenced by a newer owner ({error.str()})")
    if code in TOO_LARGE_CODES:
        return EntryTooLargeError(f"kafka: {what}: a record is larger than message.max.bytes ({error.str()})")
    if delivery and code in REFUSED_CODES and not (error.retriable() or error.txn_requires_abort()):
        return InvalidBatchError(f"{text} (the broker refused a record; nothing of the batch is stored)")
    if code in ACCESS_CODES:
        return ConfigError(f"{text} (the cluster refused the broker's credentials or rights; check client_config)")
    if code in CONFIG_CODES:
        return ConfigError(text)
    if code in TOPIC_CODES or (code == KafkaError.UNKNOWN_TOPIC_OR_PART and not topic_may_be_new):
        return InvalidTopicError(text)
    if code in CLIENT_STATE_CODES:
        return internal_error(f"kafka: {what} (a call the client's state does not allow)", KafkaException(error), _LOG)
    if error.fatal():
        return internal_error(f"kafka: {what} (a fatal librdkafka error)", KafkaException(error), _LOG)
    if error.retriable() or error.txn_requires_abort() or code in TRANSIENT_CODES:
        return BackendUnavailableError(text)
    return internal_error(f"kafka: {what} (an unexpected Kafka error)", KafkaException(error), _LOG)
