"""Where the project's topics and offsets live in Pulsar: topic names and message ids.

A topic ``tenant/ns/name`` (exactly two ``/``) is ``persistent://tenant/ns/name``; any other
name ``a/b`` is ``persistent://public/default/a.b``; partition ``p`` of a partitioned topic is
``...-partition-p``. An offset is ``ledger_id << 40 | entry_id << 20 | batch_index``, so the
records of one entry (one of our batches) get consecutive offsets.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from idempotent.errors import BackendUnavailableError, ConfigError

try:
    import pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

SNAPSHOT_PREFIX = "__idempotent_snapshots."
_ENTRY_BITS = 20
_BATCH_BITS = 20


class PulsarName(NamedTuple):
    """Where a project topic lives in Pulsar."""

    tenant: str
    namespace: str
    local: str

    @property
    def topic(self) -> str:
        """The partitioned topic: ``persistent://tenant/ns/local``."""
        return f"persistent://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def rest(self) -> str:
        """The admin REST path of the partitioned topic."""
        return f"/admin/v2/persistent/{self.tenant}/{self.namespace}/{self.local}"

    def partition(self, partition: int) -> str:
        """The Pulsar topic holding one partition."""
        return f"{self.topic}-partition-{partition}"

    def snapshot_local(self, partition: int) -> str:
        """Local name of the partition's snapshot topic (in the same namespace)."""
        return f"{SNAPSHOT_PREFIX}{self.local}-{partition}"


def pulsar_topic_name(topic: str) -> PulsarName:
    """The Pulsar topic a project topic is stored in.

    ``tenant/ns/name`` maps to ``persistent://tenant/ns/name``; every other name goes to
    ``public/default`` with ``/`` replaced by ``.``.
    """
    parts = topic.split("/")
    if len(parts) == 3 and all(parts):
        return PulsarName(parts[0], parts[1], parts[2])
    return PulsarName("public", "default", topic.replace("/", "."))


def split_topic(full: str) -> PulsarName:
    """``persistent://tenant/ns/local`` -> its parts."""
    prefix = "persistent://"
    parts = full[len(prefix) :].split("/") if full.startswith(prefix) else []
    if len(parts) != 3 or not all(parts):
        raise ConfigError(f"expected persistent://tenant/namespace/topic, got {full!r}")
    return PulsarName(parts[0], parts[1], parts[2])


def encode_offset(ledger_id: int, entry_id: int, batch_index: int) -> int:
    """The offset of the message at ``(ledger_id, entry_id, batch_index)``."""
    batch_index = max(batch_index, 0)  # -1: an entry holding a single, non-batched message
    if ledger_id < 0 or not 0 <= entry_id < 1 << _ENTRY_BITS or batch_index >= 1 << _BATCH_BITS:
        raise BackendUnavailableError(
            f"pulsar: message id ({ledger_id}, {entry_id}, {batch_index}) does not fit an offset "
            f"(entry ids and batch indexes must stay below {1 << _ENTRY_BITS}; "
            "keep managedLedgerMaxEntriesPerLedger below that)"
        )
    return ledger_id << (_ENTRY_BITS + _BATCH_BITS) | entry_id << _BATCH_BITS | batch_index


def decode_offset(offset: int) -> tuple[int, int, int]:
    """``(ledger_id, entry_id, batch_index)`` of an offset."""
    mask = (1 << _BATCH_BITS) - 1
    return offset >> (_ENTRY_BITS + _BATCH_BITS), (offset >> _BATCH_BITS) & ((1 << _ENTRY_BITS) - 1), offset & mask


def start_id(offset: int) -> Any:
    """The message id a reader starts at (inclusive) to read from ``offset`` on."""
    if offset <= 0:
        return pulsar.MessageId.earliest
    ledger_id, entry_id, batch_index = decode_offset(offset)
    # batch index -1 means "the whole entry": also right for entries holding one plain message
    return pulsar.MessageId(-1, ledger_id, entry_id, batch_index if batch_index else -1)


def offset_of(message_id: Any) -> int:
    return encode_offset(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
