"""Plain Pulsar topics as a mirror source: ``pulsar+native://host:port?admin_url=http://host:port``.

Any topic written by any client is read with a pulsar-client **Reader** per partition (no
subscription is created; the destination holds the position). The topic may be given short
(``orders``, in ``public/default``), as ``tenant/ns/orders``, or in full
(``persistent://tenant/ns/orders``); a partitioned topic's partitions are its
``-partition-N`` topics, a non-partitioned topic is partition 0. The admin REST API
(``admin_url``, default ``http://host:8080``) gives the partition count, the topics of the
namespaces a ``--topics`` pattern is matched in (``namespaces=tenant/ns[,tenant/ns...]``,
default ``public/default``; names there are short, others ``tenant/ns/name``; system topics,
whose names start with ``__``, are left out) and, for jobs that stop, each partition's last
message id when they start.

Offsets. A Pulsar message id is (ledger, entry, batch index), ordered in that order, and not
dense: entry ids restart in each new ledger, ledger ids are shared by the whole cluster, and
a batch holds several messages in one entry. The offset is the id packed into 63 bits:
``ledger << 30 | entry << 12 | batch index``, which keeps the order as long as ledger ids stay
below 2**33, entries per ledger below 2**18 (the broker's default rollover is 50,000) and
messages per batch below 2**12 (producers batch 1,000 by default). A message id beyond these
stops the job with ConfigError before anything of it is copied. Keys (``partition_key``),
values, properties (as headers, sorted by name) and timestamps (the event time if the
producer set one, else the publish time) are kept, except the ``idem.*`` properties this
project's Pulsar backend adds (:func:`~idempotent.adapters.pulsar.messages.headers_of`): they
name the producer that wrote the source, and a record's exact headers come back from them.

The client's own C++ log lines go to the Python logger ``idempotent.mirror.pulsar`` (at
INFO and above only when that logger is enabled for them), never straight to stdout or
stderr.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from idempotent.adapters.pulsar.admin import Admin
from idempotent.adapters.pulsar.errors import map_errors
from idempotent.adapters.pulsar.messages import headers_of
from idempotent.errors import BackendUnavailableError, ConfigError, InvalidTopicError
from idempotent.mirror.source import Polled, SourceRecord
from idempotent.runtime.native_logs import drain_pulsar_logs, open_pulsar_client

try:
    import pulsar
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("pulsar+native:// sources need pulsar-client: pip install 'idempotent[pulsar]'") from exc

LEDGER_BITS = 33
ENTRY_BITS = 18
BATCH_BITS = 12
_TIMEOUT = 30.0
#: Where the client's own log lines go.
PULSAR_LOG = logging.getLogger("idempotent.mirror.pulsar")
DEFAULT_NAMESPACE = "public/default"


def pack_message_id(ledger: int, entry: int, batch_index: int) -> int:
    """The offset of a message id (``batch_index`` -1, not batched, counts as 0).

    Raises:
        ConfigError: a part does not fit its bits (see the module docstring).
    """
    batch_index = max(batch_index, 0)
    if not (0 <= ledger < 2**LEDGER_BITS and 0 <= entry < 2**ENTRY_BITS and batch_index < 2**BATCH_BITS):
        raise ConfigError(
            f"pulsar message id {ledger}:{entry}:{batch_index} does not fit the mirror's offsets "
            f"(ledger < 2**{LEDGER_BITS}, entry < 2**{ENTRY_BITS}, batch index < 2**{BATCH_BITS})"
        )
    return ledger << (ENTRY_BITS + BATCH_BITS) | entry << BATCH_BITS | batch_index


def unpack_offset(offset: int) -> tuple[int, int, int]:
    """The (ledger, entry, batch index) of an offset made by :func:`pack_message_id`."""
    return (
        offset >> (ENTRY_BITS + BATCH_BITS),
        (offset >> BATCH_BITS) & (2**ENTRY_BITS - 1),
        offset & (2**BATCH_BITS - 1),
    )


def full_topic(topic: str) -> str:
    """``persistent://public/default/T`` for a short name, ``persistent://tenant/ns/T`` for
    ``tenant/ns/T``, else the name itself."""
    if "://" in topic:
        return topic
    if topic.count("/") == 2:
        return f"persistent://{topic}"
    return f"persistent://{DEFAULT_NAMESPACE}/{topic}"


def short_topic(topic: str) -> str:
    """The name of a full topic name as :meth:`PulsarNativeSource.topics` lists it: short in
    ``public/default``, else ``tenant/ns/name``."""
    name = topic.partition("://")[2] if "://" in topic else topic
    prefix = DEFAULT_NAMESPACE + "/"
    return name[len(prefix) :] if name.startswith(prefix) else name


class PulsarNativeSource:
    """The topics of a Pulsar cluster, read as they are; see the module docstring.

    Raises:
        ConfigError: bad URL.
        BackendUnavailableError: the client could not be created.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "pulsar+native" or not parts.hostname:
            raise ConfigError(f"expected pulsar+native://host:port?admin_url=http://host:port, got {url!r}")
        options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(options) - {"admin_url", "namespaces"}
        if unknown:
            raise ConfigError(f"unknown pulsar+native option(s) {sorted(unknown)}; known: admin_url, namespaces")
        self.namespaces = [n.strip() for n in options.get("namespaces", DEFAULT_NAMESPACE).split(",") if n.strip()]
        bad = [n for n in self.namespaces if n.count("/") != 1 or n.startswith("/") or n.endswith("/")]
        if bad or not self.namespaces:
            raise ConfigError(f"pulsar+native namespaces= takes tenant/namespace[,tenant/namespace...], got {bad}")
        self._url = url
        self.service_url = f"pulsar://{parts.netloc}"
        self.admin_url = options.get("admin_url", f"http://{parts.hostname}:8080").rstrip("/")
        self._rest = Admin(self.admin_url, {}, _TIMEOUT)
        self._partitioned: dict[str, int] = {}
        with map_errors("connect"):
            # relayed through a file, not pulsar-client's Python logger (idempotent.runtime.native_logs)
            self._client = open_pulsar_client(
                pulsar.Client, self.service_url, log_to=PULSAR_LOG, operation_timeout_seconds=int(_TIMEOUT)
            )

    @property
    def url(self) -> str:
        return self._url

    def _admin(self, path: str) -> Any:
        """The decoded answer of a GET of the admin REST API (the backend's client, its
        errors translated by the backend's one mapping: 404 is InvalidTopicError).

        Raises:
            InvalidTopicError, BackendUnavailableError, ConfigError: as the mapping says.
        """
        with map_errors(f"admin {self.admin_url}{path}"):
            return self._rest.call("GET", path)[1]

    @staticmethod
    def _path(topic: str) -> str:
        domain, _, rest = full_topic(topic).partition("://")
        return f"/admin/v2/{domain}/{rest}"

    def topics(self) -> list[str]:
        """The persistent topics of :attr:`namespaces` (see the module docstring)."""
        out: set[str] = set()
        for namespace in self.namespaces:
            path = f"/admin/v2/persistent/{namespace}"
            partitioned = {str(t) for t in self._admin(path + "/partitioned") or []}
            for name in [*partitioned, *(str(t) for t in self._admin(path) or [])]:
                head, separator, tail = name.rpartition("-partition-")
                if separator and tail.isdigit() and head in partitioned:
                    continue  # a partition of a partitioned topic
                if not name.rpartition("/")[2].startswith("__"):
                    out.add(short_topic(name))
        return sorted(out)

    def partitions(self, topic: str) -> int:
        count = int(self._admin(self._path(topic) + "/partitions").get("partitions", 0))
        if count == 0:
            self._admin(self._path(topic) + "/lastMessageId")  # a non-partitioned topic must exist
        self._partitioned[topic] = count
        return max(count, 1)

    def partition_topic(self, topic: str, partition: int) -> str:
        """The Pulsar topic holding ``partition`` of ``topic``."""
        if topic not in self._partitioned:
            self.partitions(topic)
        if self._partitioned[topic] == 0:
            if partition != 0:
                raise InvalidTopicError(f"pulsar: {topic!r} is not partitioned: only partition 0")
            return full_topic(topic)
        return f"{full_topic(topic)}-partition-{partition}"

    def end(self, topic: str, partition: int) -> int:
        last = self._admin(self._path(self.partition_topic(topic, partition)) + "/lastMessageId")
        ledger, entry = int(last.get("ledgerId", -1)), int(last.get("entryId", -1))
        if ledger < 0:
            return 0
        return pack_message_id(ledger, entry + 1, 0) if entry + 1 < 2**ENTRY_BITS else pack_message_id(ledger + 1, 0, 0)

    def open_partition(self, topic: str, partition: int, after: int, end: int | None = None) -> PulsarPartitionReader:
        name = self.partition_topic(topic, partition)
        index = partition if self._partitioned[topic] else -1
        if after < 0:
            start = pulsar.MessageId.earliest
        else:
            # start at the entry of the last message copied (inclusive), and drop what was
            # copied: a batch's remaining messages are read either way
            ledger, entry, batch_index = unpack_offset(after)
            start = pulsar.MessageId(index, ledger, entry, batch_index)
        with map_errors(f"read {name}"):
            reader = self._client.create_reader(
                name, start, start_message_id_inclusive=after >= 0, receiver_queue_size=2000
            )
        return PulsarPartitionReader(reader, after)

    def lag(self, topic: str, partition: int, after: int, end: int) -> int | None:
        """Entries after the one of ``after`` and below ``end``: counted from the offsets in
        one ledger, else from the topic's ledgers (admin ``internalStats``). Messages of a
        batch entry are not counted apart: the entry of ``after`` counts as copied."""
        if end <= 0:
            return 0
        end_ledger, end_entry, _ = unpack_offset(end)
        if after >= 0:
            ledger, entry, _ = unpack_offset(after)
            if (ledger, entry) >= (end_ledger, end_entry - 1):
                return 0
            if ledger == end_ledger:
                return end_entry - entry - 1
        else:
            ledger, entry = -1, -1
        try:
            stats = self._admin(self._path(self.partition_topic(topic, partition)) + "/internalStats")
        except (BackendUnavailableError, InvalidTopicError):
            return None
        counts = {int(item["ledgerId"]): int(item.get("entries", 0)) for item in stats.get("ledgers", [])}
        if counts:
            counts[max(counts)] = max(counts[max(counts)], int(stats.get("currentLedgerEntries", 0)))
        behind = sum(n for ledger_id, n in counts.items() if ledger < ledger_id < end_ledger)
        if end_ledger != ledger:
            behind += min(counts.get(end_ledger, end_entry), end_entry)
        if ledger in counts:
            behind += max(0, counts[ledger] - entry - 1)
        return behind

    def source_topic(self, topic: str, partition: int) -> str:
        return self.partition_topic(topic, partition)

    def close(self) -> None:
        with contextlib.suppress(pulsar.PulsarException):
            self._client.close()
        drain_pulsar_logs()  # the client's lines so far, now rather than at the relay's next read


class PulsarPartitionReader:
    """A pulsar-client Reader of one partition, returning messages after ``after``."""

    def __init__(self, reader: Any, after: int) -> None:
        self._reader = reader
        self._after = after

    def poll(self, max_records: int, timeout: float) -> Polled:
        records: list[SourceRecord] = []
        caught_up = False
        with map_errors("read"):
            while len(records) < max_records:
                if not self._reader.has_message_available():
                    caught_up = True
                    break
                try:
                    message = self._reader.read_next(int(_TIMEOUT * 1000))
                except pulsar.Timeout:
                    break
                message_id = message.message_id()
                offset = pack_message_id(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
                if offset <= self._after:
                    continue
                self._after = offset
                key = message.partition_key()
                millis = message.event_timestamp() or message.publish_timestamp()
                records.append(
                    SourceRecord(
                        offset,
                        key.encode() if key else None,
                        message.data(),
                        headers_of(message.properties()),
                        millis / 1000 if millis else None,
                    )
                )
        if not records and timeout > 0:
            time.sleep(min(timeout, 0.05))
        return Polled(records, caught_up)

    def close(self) -> None:
        with contextlib.suppress(pulsar.PulsarException):
            self._reader.close()


__all__ = [
    "PULSAR_LOG",
    "PulsarNativeSource",
    "PulsarPartitionReader",
    "full_topic",
    "pack_message_id",
    "short_topic",
    "unpack_offset",
]
