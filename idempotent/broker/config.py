"""The options of a broker (:class:`BrokerConfig`), checked when they are made."""

from __future__ import annotations

import attrs

from idempotent.core.checker import CheckerConfig, Policy
from idempotent.core.values import MAX_PARTITIONS
from idempotent.errors import ConfigError

#: the default of :attr:`BrokerConfig.state_rebuild_records`
STATE_REBUILD_RECORDS = 2_000_000


@attrs.frozen
class BrokerConfig:
    """Broker-wide options.

    Attributes:
        checker: window, producer bounds and snapshot cadence of every partition.
        default_partitions: partition count of topics created on first produce.
        auto_create_topics: create unknown topics on first produce (else InvalidTopicError).
        deduplication: broker-wide default; topics and namespaces can override it.
        policy: broker-wide default sequence policy; topics and namespaces can override it.
        id_block_size: producer ids reserved from the backend at a time.
        append_timeout: seconds ``produce`` waits for the backend to acknowledge.
        maintenance_interval: seconds between expiry/snapshot sweeps (0 disables the thread).
        max_record_bytes: largest key + value + headers of one record.
        max_batch_bytes: largest total size of one batch.
        broker_id: set it to run several brokers over one backend (see ``docs/clustering.md``):
            each partition is then served by the one broker holding its lease. None (the
            default) serves every partition, with no ownership records.
        advertised_address: where clients reach this broker (``host:port``); stored in the
            leases it holds and returned in :class:`~idempotent.errors.NotOwnerError`.
        lease_duration: seconds a lease lasts without renewal; renewed every third of it.
            Another broker takes a partition over after seeing no renewal for this long.
        topic_refresh_interval: seconds a topic's partition count is trusted before
            :meth:`Broker.partitions_for` has it read from the backend again, in the
            background (partitions added to a Kafka or Pulsar topic are learnt this way; a
            request for a partition beyond the known count has it read at once, at most once a
            second per topic). 0 reads it again at every lookup.
        producer_record_retention: seconds after which the record (name, id, epoch) of a
            producer neither initialised nor seen writing is deleted by :meth:`Broker.maintain`
            (Kafka's ``transactional.id.expiration.ms``, 7 days). A later ``init`` of the name
            gets a fresh id with no state on any partition (docs/semantics.md).
        state_rebuild_records: a producer writing straight into Kafka or Pulsar
            (:class:`~idempotent.broker.direct.DirectBroker`): how many of a partition's last
            offsets its restart reads back, at most, to rebuild its stored state there when
            that state is missing, older than the data or unreadable (docs/semantics.md,
            "Lost producer state"). A state the window cannot rebuild refuses the restart
            with :class:`~idempotent.errors.ProducerStateLostError`.
        transaction_timeout: seconds an application's transaction held by this broker
            (SQLite, memory) may stay open (Kafka's ``transaction.timeout.ms``, 60 s). The
            maintenance sweep aborts one open longer, freeing what it held: its commit then
            raises :class:`~idempotent.errors.TransactionAbortableError`. So a client that
            died inside a transaction (a broker server's) leaves nothing held for good.
        max_transaction_bytes: the most an open transaction may hold (its records, as
            ``Record.size`` counts; 256 MiB). A transaction that grows past it is aborted at
            once, freeing what it held: its commit raises
            :class:`~idempotent.errors.TransactionAbortableError`. So a broker server's memory
            is bounded whatever its clients send.
    """

    checker: CheckerConfig = attrs.field(factory=CheckerConfig)
    default_partitions: int = 1
    auto_create_topics: bool = True
    deduplication: bool = True
    policy: Policy = Policy.STRICT
    id_block_size: int = 1000
    append_timeout: float = 30.0
    maintenance_interval: float = 10.0
    max_record_bytes: int = 8 * 1024 * 1024
    max_batch_bytes: int = 64 * 1024 * 1024
    broker_id: str | None = None
    advertised_address: str = ""
    lease_duration: float = 10.0
    producer_record_retention: float = 7 * 24 * 3600.0
    topic_refresh_interval: float = 10.0
    state_rebuild_records: int = STATE_REBUILD_RECORDS
    transaction_timeout: float = 60.0
    max_transaction_bytes: int = 256 * 1024 * 1024

    def __attrs_post_init__(self) -> None:
        if not self.producer_record_retention > 0:
            raise ConfigError("producer_record_retention must be positive")
        if self.broker_id is not None and (not isinstance(self.broker_id, str) or not self.broker_id):
            raise ConfigError("broker_id must be a non-empty string (or None for a single broker)")
        if not self.lease_duration > 0:
            raise ConfigError("lease_duration must be positive")
        if not 1 <= self.default_partitions <= MAX_PARTITIONS:
            raise ConfigError(f"default_partitions must be 1..{MAX_PARTITIONS}")
        if self.id_block_size < 1:
            raise ConfigError("id_block_size must be positive")
        if self.state_rebuild_records < 1:
            raise ConfigError("state_rebuild_records must be positive")
        if not self.transaction_timeout > 0:
            raise ConfigError("transaction_timeout must be positive")
        if self.max_transaction_bytes < 1:
            raise ConfigError("max_transaction_bytes must be positive")
        if not self.topic_refresh_interval >= 0:
            raise ConfigError("topic_refresh_interval must be 0 or more seconds")
