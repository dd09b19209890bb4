"""Apache Pulsar log backend (pulsar-client).

``pulsar://host:port[,host:port...]``, or any other service URL pulsar-client takes
(``pulsar+ssl://`` over TLS, ``http://`` and ``https://`` for lookups over the web service;
see :mod:`adapters._pulsar_url`), with options passed as keyword arguments to
:func:`idempotent.connect` (or :class:`PulsarBackend`), or as URL query parameters
(``?admin_url=...&timeout=...``, and pulsar-client's TLS arguments; keywords win):

* ``admin_url`` (default ``http://<first host>:8080``, ``https://<first host>:8443`` for
  ``pulsar+ssl://``, the URL itself for ``http(s)://``): the broker's admin REST base URL;
* ``admin_headers``: extra HTTP headers for admin calls (e.g. ``Authorization``);
* ``client_options``: keyword arguments for :class:`pulsar.Client` (``authentication``,
  TLS paths and flags, which the admin calls over ``https`` use too,
  ``operation_timeout_seconds``, ``logger``, ...); without a ``logger``, the C++ client's
  lines go to the Python logger ``idempotent.clients.pulsar`` (:mod:`idempotent.clientlogs`);
* ``service_url``: what the Pulsar client connects to, if not the URL itself (for example
  ``pulsar+ssl://host:6651``);
* ``meta_topic`` (default ``persistent://public/default/__idempotent_meta``);
* ``max_entry_bytes`` (default 5 MiB, Pulsar's ``maxMessageSize``): the largest entry
  this backend writes; a batch that does not fit fails with :class:`EntryTooLargeError`;
* ``timeout`` (default 30 s): admin calls, producer creation, sends and reads;
* ``connect_timeout`` (default 10 s): how long to try to reach the service and admin
  addresses at all before failing with :class:`BackendUnavailableError` (see
  :mod:`adapters._reach`); also the client's ``connection_timeout_ms``;
* ``read_only`` (default False): never take a partition over (``replay`` and
  ``latest_snapshot`` then read without fencing the owner; appends are refused), for tools
  such as ``idempotent stats`` that must not disturb a running broker.

How the model maps onto Pulsar (see ``docs/backends.md``):

* A topic ``tenant/ns/name`` (exactly two ``/``) is ``persistent://tenant/ns/name``; any
  other name ``a/b`` is ``persistent://public/default/a.b``. A topic created here is a
  *partitioned* Pulsar topic; partition ``p`` is ``...-partition-p``. A Pulsar topic that
  exists already is adopted as it is, with its partition count; a non-partitioned one (a
  plain client's, Pulsar's default) has one partition, the topic itself. Every record is an
  ordinary message: key as partition key, value as payload, event time = the batch's
  timestamp, user headers as properties, plus properties ``idem.pid``, ``idem.epoch``,
  ``idem.seq`` and, on the first record of a batch, ``idem.count``. Plain consumers read
  them unchanged.
* One of our batches is written as **one Pulsar entry** (a Pulsar batch), so an offset is
  ``ledger_id << 40 | entry_id << 20 | batch_index`` and the records of a batch get
  consecutive offsets.
* Each partition is written by one producer opened with ``ExclusiveWithFencing`` under a
  fixed name. Opening it fences every earlier owner (another broker, or this one before a
  restart), which then gets :class:`OwnershipLostError`. Because the name is fixed, Pulsar
  registers the new owner only once the old one's pending writes have completed, so a
  replay after taking ownership sees everything the old owner will ever have stored.
* Pulsar's own deduplication is enabled on the data topics and the owner sends explicit,
  increasing sequence ids, so the client's internal resends never duplicate an entry.
* Snapshots go to ``__idempotent_snapshots.<name>-<p>`` in the topic's namespace, written by
  the partition's owner after the batches they cover. Topics, producer records, settings and
  producer-id blocks go to the meta topic; an id block's start is the sum of the sizes of the
  blocks before it in that topic's log order, so concurrent brokers never overlap.

Every pulsar-client and admin REST error is translated in :func:`_map_errors`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import attrs
import msgpack

from adapters._meta import TopicOrigin, pack_snapshot, unpack_snapshot
from adapters._metadata import CompactedMetadataStore, MetadataDelegate
from adapters._pulsar_url import admin_ssl_context, flag, parse_url
from adapters._reach import DEFAULT_CONNECT_TIMEOUT, check_connect_timeout, parse_addresses, wait_reachable
from adapters._writer import GroupQueue
from idempotent._records import Record, Snapshot, StoredBatch, StoredRecord
from idempotent._sequence import sequence_at
from idempotent._types import NO_PRODUCER_ID, Epoch, ProducerId
from idempotent._types import Sequence as SequenceNumber
from idempotent.backend import AppendBatch
from idempotent.clientlogs import drain_pulsar_logs, open_pulsar_client
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

try:
    import pulsar
    from pulsar import exceptions as pulsar_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")
#: the port of a service URL without one, by scheme (pulsar-client's defaults)
_DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651, "http": 80, "https": 443}
META_TOPIC = "persistent://public/default/__idempotent_meta"
SNAPSHOT_PREFIX = "__idempotent_snapshots."
OWNER_PREFIX = "idempotent-owner-"
DEFAULT_MAX_ENTRY_BYTES = 5 * 1024 * 1024
_PROPERTY_PREFIX = "idem."
_ENTRY_BITS = 20
_BATCH_BITS = 20
_MAX_GROUP_RECORDS = 100_000  # records of several queued batches sent as one entry
_MESSAGE_OVERHEAD = 64  # per message in an entry: metadata, generously
#: what an entry needs beyond the batch's own bytes (as Record.size counts them) for one record
_ENTRY_MARGIN = 4096


# -- names and offsets ---------------------------------------------------------------------


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


def _split_topic(full: str) -> PulsarName:
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


def _start_id(offset: int) -> Any:
    """The message id a reader starts at (inclusive) to read from ``offset`` on."""
    if offset <= 0:
        return pulsar.MessageId.earliest
    ledger_id, entry_id, batch_index = decode_offset(offset)
    # batch index -1 means "the whole entry": also right for entries holding one plain message
    return pulsar.MessageId(-1, ledger_id, entry_id, batch_index if batch_index else -1)


def _offset_of(message_id: Any) -> int:
    return encode_offset(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


# -- errors --------------------------------------------------------------------------------


class _HttpError(Exception):
    def __init__(self, status: int, reason: str, url: str) -> None:
        super().__init__(f"HTTP {status} from {url}: {reason}")
        self.status = status
        self.reason = reason


@contextlib.contextmanager
def _map_errors(what: str) -> Iterator[None]:
    """Translate pulsar-client and admin REST errors into the project's tree, once, here."""
    try:
        yield
    except ProducerError:
        raise
    except Exception as exc:
        raise _translate(exc, what) from exc


#: pulsar-client exceptions that are transient: the connection, a lookup, the broker's
#: metadata store or BookKeeper failed or timed out, the topic is moving between brokers
#: (ServiceUnitNotReady), the client's queue or memory is full, a backlog quota holds the
#: producer, another producer still holds the exclusive partition (during a takeover), or
#: the client is closing. Retrying later may succeed.
_TRANSIENT = (
    pulsar_errors.Timeout,
    pulsar_errors.ConnectError,
    pulsar_errors.NotConnected,
    pulsar_errors.ReadError,
    pulsar_errors.LookupError,
    pulsar_errors.TooManyLookupRequestException,
    pulsar_errors.ServiceUnitNotReady,
    pulsar_errors.BrokerMetadataError,
    pulsar_errors.BrokerPersistenceError,
    pulsar_errors.ProducerQueueIsFull,
    pulsar_errors.MemoryBufferIsFull,
    pulsar_errors.ProducerBlockedQuotaExceededError,
    pulsar_errors.ProducerBlockedQuotaExceededException,
    pulsar_errors.AlreadyClosed,
)
#: The broker's credentials, the client's settings or the cluster refuse the request for good.
_CONFIG = (
    pulsar_errors.AuthenticationError,
    pulsar_errors.AuthorizationError,
    pulsar_errors.ErrorGettingAuthenticationData,
    pulsar_errors.InvalidConfiguration,
    pulsar_errors.InvalidUrl,
    pulsar_errors.OperationNotSupported,
    pulsar_errors.NotAllowedError,
    pulsar_errors.UnsupportedVersionError,
    pulsar_errors.IncompatibleSchema,
    pulsar_errors.CryptoError,
)


def _translate(exc: BaseException | Any, what: str) -> ProducerError:
    """The project error for a pulsar-client exception, a failed send's ``pulsar.Result``, an
    admin REST failure, or anything else.

    Fenced -> :class:`OwnershipLostError`; MessageTooBig -> :class:`EntryTooLargeError`; a
    missing, invalid or terminated topic -> :class:`InvalidTopicError`; credentials, settings
    or a refused operation -> :class:`ConfigError`; the transient failures of
    :data:`_TRANSIENT`, admin HTTP 408/429/5xx and network errors ->
    :class:`BackendUnavailableError` (RETRY). Anything else (``UnknownError``, another HTTP
    status, an exception Pulsar does not document) is a logged FATAL :class:`InternalError`.
    """
    if isinstance(exc, pulsar.Result):  # a send callback's result: raise what send() would
        error_class = getattr(pulsar_errors, exc.name, None)
        if isinstance(error_class, type) and issubclass(error_class, pulsar_errors.PulsarException):
            return _translate(error_class(f"Pulsar error: {exc.name}"), what)
        return internal_error(f"pulsar: {what}", pulsar_errors.PulsarException(f"unknown result {exc.name}"), _LOG)
    if isinstance(exc, pulsar_errors.ProducerFenced):
        return OwnershipLostError(f"pulsar: {what}: fenced by a newer owner ({exc})")
    if isinstance(exc, pulsar_errors.MessageTooBig):
        return EntryTooLargeError(f"pulsar: {what}: the batch is larger than the broker's maxMessageSize ({exc})")
    if isinstance(exc, pulsar_errors.InvalidTopicName | pulsar_errors.TopicNotFound | pulsar_errors.TopicTerminated):
        return InvalidTopicError(f"pulsar: {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, _CONFIG):
        return ConfigError(f"pulsar: {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, pulsar_errors.ProducerBusy):
        return BackendUnavailableError(f"pulsar: {what}: the partition is still owned by another producer ({exc})")
    if isinstance(exc, _TRANSIENT):
        return BackendUnavailableError(f"pulsar: {what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, _HttpError):
        if exc.status in (401, 403):
            return ConfigError(f"pulsar admin: {what}: not authorized ({exc}); check admin_headers")
        if exc.status in (400, 404, 412):
            return InvalidTopicError(f"pulsar admin: {what}: {exc.reason}")
        if exc.status in (408, 429) or exc.status >= 500:
            return BackendUnavailableError(f"pulsar admin: {what}: {exc}")
    if isinstance(exc, urllib.error.URLError | OSError) and not isinstance(exc, urllib.error.HTTPError):
        return BackendUnavailableError(f"pulsar admin: {what}: {exc}")
    return internal_error(f"pulsar: {what}", exc, _LOG)  # nothing Pulsar documents as transient


# -- admin REST ----------------------------------------------------------------------------


class _KeepMethodRedirects(urllib.request.HTTPRedirectHandler):
    """Follow 307/308 (a broker redirecting to a topic's owner) with the same method and body."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if code in (307, 308):
            return urllib.request.Request(
                newurl, data=req.data, headers=dict(req.header_items()), method=req.get_method()
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_NO_BODY = object()


class _Admin:
    def __init__(
        self, base_url: str, headers: dict[str, str], timeout: float, context: ssl.SSLContext | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Accept": "application/json", **headers}
        self.timeout = timeout
        handlers: list[urllib.request.BaseHandler] = [_KeepMethodRedirects()]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def call(self, method: str, path: str, body: object = _NO_BODY, *, accept: Sequence[int] = ()) -> tuple[int, Any]:
        """``(status, decoded JSON or None)``; statuses in ``accept`` are returned, not raised."""
        url = self.base_url + urllib.parse.quote(path, safe="/:=?&")
        data = None if body is _NO_BODY else json.dumps(body).encode()
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                payload = response.read()
                return int(response.status), json.loads(payload) if payload else None
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                text = str(json.loads(text).get("reason", text))
            if exc.code in accept:
                return int(exc.code), text
            raise _HttpError(int(exc.code), text, url) from None


# -- records <-> messages ------------------------------------------------------------------


class _Message(NamedTuple):
    content: bytes | None
    properties: dict[str, str]
    partition_key: str | None
    event_time: int  # milliseconds


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _encode_record(record: Record, idem: dict[str, str], event_time: int) -> _Message:
    """One record as a Pulsar message: key, value and headers readable by plain consumers.

    Header values that are not UTF-8 are stored base64-encoded; when the properties cannot
    reproduce the headers exactly (such values, repeated or ``idem.`` names, an order other
    than sorted), ``idem.headers`` also holds the exact list. A key that is not UTF-8 text
    (or is empty) is stored base64-encoded as ``idem.key`` (and as the partition key).
    """
    properties: dict[str, str] = {}
    exact = True
    names = [name for name, _ in record.headers]
    if names != sorted(names) or len(set(names)) != len(names):
        exact = False
    for name, value in record.headers:
        if not name or name.startswith(_PROPERTY_PREFIX):
            exact = False
            continue
        try:
            properties[name] = value.decode()
        except UnicodeDecodeError:
            properties[name] = _b64(value)
            exact = False
    if not exact:
        properties["idem.headers"] = _b64(msgpack.packb([[name, value] for name, value in record.headers]))
    key: str | None = None
    if record.key is not None:
        try:
            key = record.key.decode() or None
        except UnicodeDecodeError:
            key = None
        if key is None:
            properties["idem.key"] = key = _b64(record.key)
    properties.update(idem)
    return _Message(record.value, properties, key or None, event_time)


def _message_size(message: _Message) -> int:
    size = _MESSAGE_OVERHEAD + len(message.content or b"") + len(message.partition_key or "")
    for name, value in message.properties.items():
        size += len(name.encode()) + len(value.encode()) + 8
    return size


def _headers_of(properties: dict[str, str]) -> tuple[tuple[str, bytes], ...]:
    exact = properties.get("idem.headers")
    if exact is not None:
        return tuple((str(name), bytes(value)) for name, value in msgpack.unpackb(base64.b64decode(exact)))
    return tuple((name, value.encode()) for name, value in sorted(properties.items()) if not name.startswith("idem."))


def _key_of(message: Any, properties: dict[str, str]) -> bytes | None:
    encoded = properties.get("idem.key")
    if encoded is not None:
        return base64.b64decode(encoded)
    key = message.partition_key()
    return key.encode() if key else None


def _decimal(properties: dict[str, str], name: str, default: int = -1) -> int:
    value = properties.get(name)
    return default if value is None else int(value)


def _timestamp(message: Any) -> float:
    return float(message.event_timestamp() or message.publish_timestamp()) / 1000


def _stored(message: Any) -> StoredRecord:
    properties = dict(message.properties())
    return StoredRecord(
        _offset_of(message.message_id()),
        _decimal(properties, "idem.pid"),
        _decimal(properties, "idem.epoch"),
        _decimal(properties, "idem.seq"),
        _key_of(message, properties),
        None if message.has_null_value() else message.data(),
        _headers_of(properties),
        _timestamp(message),
    )


# -- the partition owner -------------------------------------------------------------------


@attrs.define
class _Item:
    batch: AppendBatch | None
    snapshot: Snapshot | None
    future: Future[int]
    messages: list[_Message] = attrs.field(factory=list)
    size: int = 0


class _PartitionWriter(GroupQueue[_Item]):
    """The exclusive producer that owns one partition (and its snapshot topic), with a thread
    that writes queued batches in order, several at a time as one entry."""

    def __init__(self, backend: PulsarBackend, topic: str, partition: int) -> None:
        super().__init__()
        self.backend = backend
        self.topic = topic
        self.partition = partition
        self.name = pulsar_topic_name(topic)
        self.where = f"{topic}[{partition}]"
        #: set once another owner fenced ours: sticky, this backend never takes it back
        self.lost: ProducerError | None = None
        #: set after any other failure: appends fail until the broker rebuilds the partition,
        #: which opens a new writer (and so waits until Pulsar has settled this one's writes)
        self.broken: ProducerError | None = None
        self._producer: Any = None
        self._snapshots: Any = None
        owner = f"{OWNER_PREFIX}{self.name.local}-{partition}"
        with _map_errors(f"take ownership of {self.where}"):
            data_topic = backend.data_topic(topic, partition)
            backend.ensure_deduplication(self.name, data_topic)
            snapshot_topic = backend.ensure_topic(self.name._replace(local=self.name.snapshot_local(partition)))
            try:
                self._producer = backend.open_owner(data_topic, owner, batching=True)
                self._snapshots = backend.open_owner(snapshot_topic, owner, batching=False)
            except BaseException:
                self._close_producers()
                raise
            # the broker remembers the first id of the last entry: continue above it; the
            # sync API treats 0 as "unset", so never send 0
            self._next_sequence = max(int(self._producer.last_sequence_id()) + 1, 1)
        self._thread = threading.Thread(target=self._run, name=f"idempotent-pulsar-{topic}-{partition}", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> ProducerError | None:
        return self.lost or self.broken

    def submit(self, batch: AppendBatch | None, snapshot: Snapshot | None) -> Future[int]:
        future: Future[int] = Future()
        item = _Item(batch, snapshot, future)
        if batch is not None:
            try:
                self._encode(item)
            except Exception as exc:  # records are bytes and str: a failure here is a bug
                failure = internal_error(f"pulsar: encoding a batch of {self.where}", exc, _LOG)
                with self._cond:  # and nothing submitted after it may be
                    self.broken = self.broken or failure
                future.set_exception(failure)
                return future
        with self._cond:
            error = self.failed
            if error is None and self._closed:
                error = BackendUnavailableError("pulsar backend is closed")
            if error is None:
                self._queue.append(item)
                self._cond.notify()
        if error is not None:
            future.set_exception(error)
        return future

    def _encode(self, item: _Item) -> None:
        batch = item.batch
        assert batch is not None
        header = batch.header
        count = len(batch.records)
        event_time = round(batch.timestamp * 1000)
        for i, record in enumerate(batch.records):
            idem: dict[str, str] = {}
            if header is not None:
                idem = {
                    "idem.pid": str(header.producer_id),
                    "idem.epoch": str(header.producer_epoch),
                    "idem.seq": str(sequence_at(header.base_sequence, i)),
                }
                if i == 0:
                    idem["idem.count"] = str(count)
            item.messages.append(_encode_record(record, idem, event_time))
        item.size = sum(_message_size(m) for m in item.messages) + 256

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.backend.timeout + 5)
        self._close_producers()

    def _close_producers(self) -> None:
        producers, self._producer, self._snapshots = (self._producer, self._snapshots), None, None
        if self.lost is not None:
            return  # fenced: the client has closed them already
        for producer in producers:
            if producer is not None:
                with contextlib.suppress(Exception):
                    producer.close()

    # -- the writer thread -----------------------------------------------------------------

    def _run(self) -> None:
        while (items := self._take_group()) is not None:
            start = 0
            while start < len(items):
                end = self._group_end(items, start)
                group = items[start:end]
                try:
                    offsets = self._write(group)
                except InvalidBatchError as exc:  # refused for good, nothing of it stored:
                    for item in group:  # it fails alone, the ones after it go on
                        item.future.set_exception(exc)
                    start = end
                    continue
                except ProducerError as exc:
                    self._fail(items[start:], exc)
                    return
                except Exception as exc:  # a bug: logged, FATAL (never retried)
                    self._fail(items[start:], internal_error(f"pulsar: appending to {self.where}", exc, _LOG))
                    return
                for item, offset in zip(group, offsets, strict=True):
                    item.future.set_result(offset)
                start = end

    def _group_end(self, items: list[_Item], start: int) -> int:
        """Queued batches from ``start`` on that fit into one entry together."""
        size = records = 0
        end = start
        while end < len(items):
            item = items[end]
            if end > start and (
                size + item.size > self.backend.max_entry_bytes or records + len(item.messages) > _MAX_GROUP_RECORDS
            ):
                break
            size += item.size
            records += len(item.messages)
            end += 1
        return end

    def _write(self, group: list[_Item]) -> list[int]:
        """Send a group of batches as one entry, then its newest snapshot. Offsets per item."""
        messages = [m for item in group for m in item.messages]
        offsets = [-1] * len(group)
        if messages:
            size = sum(item.size for item in group)
            if size > self.backend.max_entry_bytes:
                raise EntryTooLargeError(
                    f"pulsar: a batch of {self.where} needs about {size} bytes, more than one Pulsar entry holds "
                    f"(max_entry_bytes={self.backend.max_entry_bytes}, the broker's maxMessageSize)"
                )
            ids = self._send_entry(messages)
            first = ids[0]
            expected = [(first[0], first[1], first[2] + i) for i in range(len(ids))]
            if ids != expected:
                raise BackendUnavailableError(
                    f"pulsar: the batch of {self.where} was not stored as one entry with consecutive "
                    f"batch indexes: {ids[:3]}...; check the producer's batching settings"
                )
            position = 0
            for index, item in enumerate(group):
                if item.messages:
                    offsets[index] = encode_offset(*ids[position])
                    position += len(item.messages)
        snapshots = [item.snapshot for item in group if item.snapshot is not None]
        if snapshots:
            self.put_snapshot(snapshots[-1])
        return offsets

    def _send_entry(self, messages: list[_Message]) -> list[tuple[int, int, int]]:
        results: list[tuple[Any, Any] | None] = [None] * len(messages)
        done = threading.Condition()
        pending = [len(messages)]

        def delivered(index: int) -> Any:
            def callback(result: Any, message_id: Any) -> None:
                try:  # an exception escaping a pulsar callback terminates the process
                    with done:
                        results[index] = (result, message_id)
                        pending[0] -= 1
                        done.notify_all()
                except BaseException:  # pragma: no cover - defensive
                    _LOG.exception("pulsar send callback failed")

            return callback

        what = f"append to {self.where}"
        producer = self._producer
        with _map_errors(what):
            for index, message in enumerate(messages):
                producer.send_async(
                    message.content,
                    delivered(index),
                    properties=message.properties,
                    partition_key=message.partition_key,
                    sequence_id=self._next_sequence,
                    event_timestamp=message.event_time or None,
                )
                self._next_sequence += 1
            producer.flush()
        deadline = time.monotonic() + self.backend.timeout
        with done:
            while pending[0] and done.wait(max(0.0, deadline - time.monotonic())):
                pass
        if pending[0]:
            raise BackendUnavailableError(f"pulsar: {what}: no acknowledgement within {self.backend.timeout} s")
        ids: list[tuple[int, int, int]] = []
        for outcome in results:
            assert outcome is not None
            result, message_id = outcome
            if result != pulsar.Result.Ok:
                raise _translate(result, what)
            if message_id.ledger_id() < 0:  # Pulsar's dedup: stored before, position unknown
                raise BackendUnavailableError(f"pulsar: {what}: the entry was stored by an earlier attempt")
            ids.append((message_id.ledger_id(), message_id.entry_id(), max(message_id.batch_index(), 0)))
        return ids

    def put_snapshot(self, snapshot: Snapshot) -> None:
        """Write a snapshot now (on the writer thread, or from a callback running on it)."""
        with _map_errors(f"store the snapshot of {self.where}"):
            self._snapshots.send(
                pack_snapshot(snapshot),
                properties={"idem.topic": self.topic, "idem.partition": str(self.partition)},
            )

    def _fail(self, items: list[_Item], error: ProducerError) -> None:
        # Refuse new appends first, then stop the producers (nothing queued in the client may
        # be sent after a failure; Pulsar settles their pending writes before a new owner is
        # registered), then fail the failed group and everything queued behind it: nothing
        # after a failed append may be stored (the ordering contract of LogBackend.append).
        with self._cond:
            if isinstance(error, OwnershipLostError):
                self.lost = error
            else:
                self.broken = error
            queued, self._queue = self._queue, []
        self._close_producers()
        for item in [*items, *queued]:
            item.future.set_exception(error)

    def is_writer_thread(self) -> bool:
        return threading.current_thread() is self._thread


# -- the backend ---------------------------------------------------------------------------


class PulsarBackend(MetadataDelegate):
    """A log in Apache Pulsar; see the module docstring. Its metadata half is a
    :class:`~adapters._metadata.CompactedMetadataStore` over the meta topic."""

    durable = True

    def __init__(
        self,
        url: str,
        *,
        admin_url: str | None = None,
        admin_headers: dict[str, str] | None = None,
        client_options: dict[str, Any] | None = None,
        service_url: str | None = None,
        meta_topic: str | None = None,
        max_entry_bytes: int | None = None,
        timeout: float | None = None,
        read_only: bool | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        parsed = parse_url(url)
        query = parsed.query
        self.url = url
        self.timeout = float(timeout if timeout is not None else query.get("timeout", 30.0))
        self.max_entry_bytes = int(
            max_entry_bytes if max_entry_bytes is not None else query.get("max_entry_bytes", DEFAULT_MAX_ENTRY_BYTES)
        )
        self.meta_topic = meta_topic or query.get("meta_topic") or META_TOPIC
        if read_only is None:
            read_only = flag(query.get("read_only", "false"))
        self.read_only = read_only
        meta_name = _split_topic(self.meta_topic)
        self.connect_timeout = check_connect_timeout(
            connect_timeout if connect_timeout is not None else query.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        )
        options: dict[str, Any] = {
            "operation_timeout_seconds": max(1, round(self.timeout)),
            "connection_timeout_ms": max(1, round(self.connect_timeout * 1000)),
            **parsed.tls,
        }
        options.update(client_options or {})
        admin = admin_url or query.get("admin_url") or parsed.admin_url
        # fail an address where nothing listens within connect_timeout (see adapters._reach):
        # the client itself would retry until the operation timeout and then say only TimeOut
        service = urllib.parse.urlsplit(service_url or parsed.service_url)
        admin_parts = urllib.parse.urlsplit(admin)
        wait_reachable(
            "pulsar", parse_addresses(service.netloc, _DEFAULT_PORTS.get(service.scheme)), self.connect_timeout
        )
        wait_reachable(
            f"pulsar admin {admin}",
            parse_addresses(admin_parts.netloc, 443 if admin_parts.scheme == "https" else 80),
            self.connect_timeout,
        )
        self._admin = _Admin(admin, dict(admin_headers or {}), self.timeout, admin_ssl_context(admin, options))
        self._lock = threading.RLock()
        self._writers: dict[tuple[str, int], _PartitionWriter] = {}
        self.metadata: CompactedMetadataStore[tuple[int, int]] = CompactedMetadataStore(
            "pulsar", self._put_metas, self._meta_records, self._lock, timeout=self.timeout, writable=not read_only
        )
        self._namespaces: set[tuple[str, str]] = set()
        self._clusters: list[str] | None = None
        self._client: Any = None
        self._meta_producer: Any = None
        self._meta_reader: Any = None
        with _map_errors("connect"):
            # the C++ client's lines go to Python logging (idempotent.clientlogs) unless options name a logger
            self._client = open_pulsar_client(pulsar.Client, service_url or parsed.service_url, **options)
            try:
                if not read_only:
                    self.ensure_topic(meta_name)
                    self._meta_producer = self._client.create_producer(
                        self.meta_topic, send_timeout_millis=int(self.timeout * 1000), block_if_queue_full=True
                    )
                self._meta_reader = self._client.create_reader(
                    self.meta_topic, pulsar.MessageId.earliest, is_read_compacted=True
                )
                self.metadata.catch_up()
            except BaseException:
                self._client.close()
                raise

    # -- admin helpers -----------------------------------------------------------------------

    def _ensure_namespace(self, tenant: str, namespace: str) -> None:
        """Create the tenant and namespace if they are missing (a namespace created here keeps
        its messages forever and its idle topics: what a log needs)."""
        if (tenant, namespace) in self._namespaces:
            return
        status, listing = self._admin.call("GET", f"/admin/v2/namespaces/{tenant}", accept=(404,))
        if status == 404:
            if self._clusters is None:
                _, clusters = self._admin.call("GET", "/admin/v2/clusters")
                self._clusters = [str(c) for c in clusters or []]
            self._admin.call(
                "PUT",
                f"/admin/v2/tenants/{tenant}",
                {"allowedClusters": self._clusters, "adminRoles": []},
                accept=(409,),
            )
            listing = []
        if f"{tenant}/{namespace}" not in (listing or []):
            self._admin.call(
                "PUT",
                f"/admin/v2/namespaces/{tenant}/{namespace}",
                {
                    "retention_policies": {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1},
                    "inactive_topic_policies": {
                        "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
                        "maxInactiveDurationSeconds": 60,
                        "deleteWhileInactive": False,
                    },
                },
                accept=(409,),
            )
        self._namespaces.add((tenant, namespace))

    def ensure_topic(self, name: PulsarName) -> str:
        """Create a non-partitioned topic if it is missing; return its full name."""
        self._ensure_namespace(name.tenant, name.namespace)
        self._admin.call("PUT", name.rest, accept=(409,))
        return name.topic

    def ensure_deduplication(self, name: PulsarName, data_topic: str) -> None:
        """Make sure Pulsar's deduplication is active on a partition's topic ``data_topic``
        before we write to it (enabling it is asynchronous; until it is active, sends are not
        checked). ``name`` is the topic whose policy enables it."""
        stats = "/admin/v2/persistent/" + data_topic.removeprefix("persistent://") + "/stats"
        deadline = time.monotonic() + self.timeout
        requested = False
        while True:
            _, body = self._admin.call("GET", stats)
            status = body.get("deduplicationStatus") if isinstance(body, dict) else None
            if status == "Enabled":
                return
            if not requested and status not in ("Recovering", "Initialized"):
                # (again: a policy set by create_topic may simply not have arrived yet)
                self._admin.call("POST", f"{name.rest}/deduplicationEnabled", True, accept=(405,))
                requested = True
            if time.monotonic() > deadline:
                if status in ("Recovering", "Initialized"):
                    raise BackendUnavailableError(f"pulsar: deduplication on {data_topic} is {status}")
                raise ConfigError(
                    f"pulsar: deduplication on {data_topic} is {status!r}, not Enabled: the broker "
                    "needs topicLevelPoliciesEnabled=true, or enable deduplication for the namespace "
                    f"(pulsar-admin namespaces set-deduplication {name.tenant}/{name.namespace} --enable)"
                )
            time.sleep(0.05)

    def open_owner(self, topic: str, name: str, *, batching: bool) -> Any:
        """Open the exclusive producer of a topic, fencing any other. Pulsar refuses a second
        producer of the same name (ProducerBusy) until the fenced one's writes are settled:
        retried until the timeout."""
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        options: dict[str, Any] = {
            "producer_name": name,
            "access_mode": pulsar.ProducerAccessMode.ExclusiveWithFencing,
            "send_timeout_millis": int(self.timeout * 1000),
            "block_if_queue_full": True,
        }
        if batching:
            # our flush() decides the entry boundaries: nothing else may close a Pulsar batch
            options.update(
                batching_enabled=True,
                batching_max_messages=_MAX_GROUP_RECORDS + (1 << 20),
                batching_max_allowed_size_in_bytes=1 << 30,
                batching_max_publish_delay_ms=24 * 3600 * 1000,
                max_pending_messages=_MAX_GROUP_RECORDS + (1 << 20),
            )
        while True:
            try:
                return self._client.create_producer(topic, **options)
            except pulsar_errors.ProducerBusy:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    # -- readers -------------------------------------------------------------------------------

    def _read(self, topic: str, start: Any, limit: int | None = None) -> Iterator[Any]:
        """Messages of one Pulsar topic from ``start`` (inclusive) to its current end."""
        queue = 1000 if limit is None else max(1, min(limit, 1000))
        reader = self._client.create_reader(topic, start, start_message_id_inclusive=True, receiver_queue_size=queue)
        try:
            count = 0
            timeout_ms = int(self.timeout * 1000)
            while (limit is None or count < limit) and reader.has_message_available():
                yield reader.read_next(timeout_ms)
                count += 1
        finally:
            with contextlib.suppress(Exception):
                reader.close()

    def _last(self, topic: str) -> Any | None:
        """The newest message of a Pulsar topic, or None."""
        reader = self._client.create_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
        try:
            if not reader.has_message_available():
                return None
            return reader.read_next(int(self.timeout * 1000))
        finally:
            with contextlib.suppress(Exception):
                reader.close()

    # -- metadata (the meta topic) ----------------------------------------------------------------

    def _meta_records(self, after: tuple[int, int] | None) -> Iterator[tuple[str, bytes | None, tuple[int, int]]]:
        """The keyed records of the meta topic after ``after`` (the metadata store's reads,
        see :mod:`adapters._metadata`): the meta reader keeps its place, which is ``after``."""
        reader = self._meta_reader
        timeout_ms = int(self.timeout * 1000)
        with _map_errors("read the metadata"):
            while reader.has_message_available():
                message = reader.read_next(timeout_ms)
                message_id = message.message_id()
                position = (message_id.ledger_id(), message_id.entry_id())
                if after is not None and position <= after:
                    continue  # (never: the reader is only asked for what follows)
                value = None if message.has_null_value() else message.data()
                yield message.partition_key(), value, position

    def _put_metas(self, items: Sequence[tuple[str, bytes | None]]) -> list[tuple[int, int]]:
        """Store keyed records in the meta topic, one after the other; their positions (the
        metadata store's writes, see :mod:`adapters._metadata`)."""
        positions: list[tuple[int, int]] = []
        for key, value in items:
            if self._meta_producer is None:
                raise ConfigError(f"{self.url} is opened read-only: cannot store {key}")
            with self._lock, _map_errors(f"store {key}"):
                message_id = self._meta_producer.send(value, partition_key=key)
            positions.append((int(message_id.ledger_id()), int(message_id.entry_id())))
        return positions

    # -- LogBackend ------------------------------------------------------------------------------

    def data_topic(self, topic: str, partition: int) -> str:
        """The Pulsar topic holding one partition of a project topic: ``...-partition-p`` of
        a partitioned topic, the topic itself for an adopted non-partitioned one."""
        name = pulsar_topic_name(topic)
        origin = self.metadata.origin(topic)
        return name.topic if origin is not None and not origin.partitioned else name.partition(partition)

    def _native(self, name: PulsarName) -> tuple[int, bool] | None:
        """``(partition count, partitioned)`` of the Pulsar topic ``name`` as Pulsar's metadata
        has it now (a non-partitioned topic counts one partition), or None when it does not
        exist. Reads only: nothing is created."""
        status, body = self._admin.call("GET", f"{name.rest}/partitions", accept=(404,))
        count = int(body.get("partitions", 0)) if status == 200 and isinstance(body, dict) else 0
        if count > 0:
            return count, True
        if status == 404:
            return None
        # 0: not partitioned, or (brokers before 3.0) missing: its stats say which
        status, _ = self._admin.call("GET", f"{name.rest}/stats", accept=(404,))
        return None if status == 404 else (1, False)

    def _clash(self, topic: str, name: PulsarName) -> str | None:
        """Another recorded topic stored in the same Pulsar topic as ``topic``, if any."""
        return next((t for t in self.metadata.recorded_topics() if t != topic and pulsar_topic_name(t) == name), None)

    def _current(self, topic: str, recorded: int, native: tuple[int, bool] | None) -> int:
        """The count of a recorded topic: Pulsar's when partitions were added since (noted in
        the records, so that other brokers and tools learn it too). Needs self._lock."""
        if native is None or native[0] <= recorded:
            return recorded
        _LOG.info("topic %r has %d partitions now (recorded: %d)", topic, native[0], recorded)
        self.metadata.note_count(topic, native[0])
        return native[0]

    def describe_topic(self, topic: str) -> int | None:
        name = pulsar_topic_name(topic)
        with self._lock, _map_errors(f"describe topic {topic}"):
            self.metadata.catch_up()
            if self._clash(topic, name) is not None:
                return None
            native = self._native(name)
            recorded = self.metadata.partition_count(topic)
            if recorded is None:
                return None if native is None else native[0]
            return self._current(topic, recorded, native)

    def create_topic(self, topic: str, partitions: int) -> int:
        """Create a partitioned topic, or adopt the Pulsar topic of its name, partitioned or
        not (see LogBackend)."""
        name = pulsar_topic_name(topic)
        with self._lock, _map_errors(f"create topic {topic}"):
            self.metadata.catch_up()
            clash = self._clash(topic, name)
            if clash is not None:
                raise InvalidTopicError(f"topic {topic!r} would share the Pulsar topic {name.topic} with {clash!r}")
            self._ensure_namespace(name.tenant, name.namespace)
            native = self._native(name)
            recorded = self.metadata.partition_count(topic)
            if recorded is not None:
                return self._current(topic, recorded, native)
            if native is None:
                status, _ = self._admin.call("PUT", f"{name.rest}/partitions", partitions, accept=(409,))
                if status == 409:  # created meanwhile by someone else: adopt theirs
                    native = self._native(name)
                    if native is None:
                        raise BackendUnavailableError(f"pulsar: topic {name.topic} exists but has no metadata yet")
            if native is None:
                origin, count = TopicOrigin(adopted=False), partitions
            else:  # made by Pulsar's tools, a plain client or another broker: use it as it is
                count, partitioned = native
                ends = tuple(self._end(name.partition(p) if partitioned else name.topic) for p in range(count))
                origin = TopicOrigin(adopted=True, starts=ends, partitioned=partitioned)
                _LOG.info(
                    "adopting the Pulsar topic %s (%d partitions, partitioned: %s)", name.topic, count, partitioned
                )
            # 405: topic policies are off; then the namespace or broker must enable it (checked
            # before the first write)
            self._admin.call("POST", f"{name.rest}/deduplicationEnabled", True, accept=(405,))
            return self.metadata.record_topic(topic, count, origin)  # an origin recorded first wins

    def _end(self, data_topic: str) -> int:
        """Where the next message of a Pulsar topic will be, or later (0 when it is empty):
        after the newest message's batch index, or, when that message was not batched (a
        plain producer's), at the next entry: a reader started inside a plain entry would
        read it again."""
        last = self._last(data_topic)
        if last is None:
            return 0
        message_id = last.message_id()
        if message_id.batch_index() < 0:
            return encode_offset(message_id.ledger_id(), message_id.entry_id() + 1, 0)
        return _offset_of(message_id) + 1

    def delete_topic(self, topic: str) -> None:
        """Delete the partitioned Pulsar topic and its snapshot topics (forcefully: readers
        are disconnected), and tombstone its topic record."""
        if self.read_only:
            raise ConfigError(f"{self.url} is opened read-only: cannot delete {topic}")
        name = pulsar_topic_name(topic)
        with self._lock, _map_errors(f"delete topic {topic}"):
            self.metadata.catch_up()
            partitions = self.metadata.partition_count(topic) or 0
            for partition in range(partitions):
                self.release(topic, partition)
            self._admin.call("DELETE", f"{name.rest}/partitions?force=true", accept=(404,))
            for partition in range(partitions):
                snapshots = f"/admin/v2/persistent/{name.tenant}/{name.namespace}/{name.snapshot_local(partition)}"
                self._admin.call("DELETE", f"{snapshots}?force=true", accept=(404,))
            self.metadata.forget_topic(topic)

    def _writer(self, topic: str, partition: int, *, renew: bool = False) -> _PartitionWriter:
        """The partition's writer, opened (taking ownership) if needed. ``renew`` replaces a
        writer that failed; appends never do, so that nothing submitted after a failure is
        stored before the broker has rebuilt the partition."""
        key = (topic, partition)
        if self.read_only:
            raise ConfigError(f"{self.url} is opened read-only: cannot write to {topic}[{partition}]")
        with self._lock:
            writer = self._writers.get(key)
            if writer is not None:
                if writer.lost is not None:
                    raise writer.lost
                if writer.broken is None or not renew:
                    return writer
                writer.close()
                del self._writers[key]
            writer = self._writers[key] = _PartitionWriter(self, topic, partition)
            return writer

    def _check(self, topic: str, partition: int) -> None:
        if not 0 <= partition < (self.metadata.partition_count(topic) or 0):
            with self._lock, _map_errors("list topics"):
                self.metadata.catch_up()
                recorded = self.metadata.partition_count(topic)
                if recorded is not None and partition >= recorded:  # added since it was recorded?
                    self._current(topic, recorded, self._native(pulsar_topic_name(topic)))
            if not 0 <= partition < (self.metadata.partition_count(topic) or 0):
                raise InvalidTopicError(f"no partition {topic}[{partition}] in {self.url}")

    def append(self, topic: str, partition: int, batch: AppendBatch, snapshot: Snapshot | None) -> Future[int]:
        self._check(topic, partition)
        return self._writer(topic, partition).submit(batch, snapshot)

    def read(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        self._check(topic, partition)
        data_topic = self.data_topic(topic, partition)
        with _map_errors(f"read {topic}[{partition}]"):
            return [_stored(message) for message in self._read(data_topic, _start_id(offset), max_records)]

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        self._check(topic, partition)
        if not self.read_only:
            self._writer(topic, partition, renew=True)  # take ownership first: fences a stale owner
        data_topic = self.data_topic(topic, partition)
        origin = self.metadata.origin(topic)
        if origin is not None:  # an adopted topic's records before its adoption are not ours
            from_offset = max(from_offset, origin.start(partition))
        batches: list[StoredBatch] = []
        with _map_errors(f"replay {topic}[{partition}]"):
            reader = self._client.create_reader(
                data_topic, _start_id(from_offset), start_message_id_inclusive=True, receiver_queue_size=1000
            )
            try:
                timeout_ms = int(self.timeout * 1000)
                while reader.has_message_available():
                    message = reader.read_next(timeout_ms)
                    offset = _offset_of(message.message_id())
                    properties = message.properties()
                    count = properties.get("idem.count")
                    if count is None:
                        if "idem.pid" not in properties:  # a record written without the checker
                            batches.append(StoredBatch(offset, NO_PRODUCER_ID, Epoch(-1), SequenceNumber(-1), 1, 0.0))
                        continue
                    batches.append(
                        StoredBatch(
                            offset,
                            ProducerId(_decimal(properties, "idem.pid")),
                            Epoch(_decimal(properties, "idem.epoch")),
                            SequenceNumber(_decimal(properties, "idem.seq")),
                            int(count),
                            _timestamp(message),
                        )
                    )
                    # the batch's other records follow in the same entry (it was written as
                    # one, with consecutive batch indexes): taken without looking at them
                    for _ in range(int(count) - 1):
                        reader.read_next(timeout_ms)
            finally:
                with contextlib.suppress(Exception):
                    reader.close()
        return iter(batches)

    def end_offset(self, topic: str, partition: int) -> int:
        """One past the newest record (0 when empty). The next append gets this offset or a
        higher one: offsets are sparse across entries."""
        self._check(topic, partition)
        with _map_errors(f"end offset of {topic}[{partition}]"):
            return self._end(self.data_topic(topic, partition))

    # -- snapshots (one topic per partition, written by the partition's owner) ------------------

    def latest_snapshot(self, topic: str, partition: int) -> Snapshot | None:
        self._check(topic, partition)
        if not self.read_only:
            self._writer(topic, partition, renew=True)  # fence a stale owner first
        name = pulsar_topic_name(topic)
        where = f"{topic}[{partition}]"
        snapshot_topic = name._replace(local=name.snapshot_local(partition)).topic
        try:
            with _map_errors(f"read the snapshot of {where}"):
                last = self._last(snapshot_topic)
        except InvalidTopicError:  # no snapshot topic yet (a broker that does not auto-create topics)
            return None
        if last is None or last.has_null_value():
            return None
        try:
            return unpack_snapshot(last.data())
        except (ValueError, TypeError) as exc:
            _LOG.warning("ignoring an unreadable snapshot of %s: %r", where, exc)
            return None

    def write_snapshot(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        self._check(topic, partition)
        writer = self._writer(topic, partition)
        if writer.is_writer_thread():
            # called back from an append the writer thread just completed: queueing it behind
            # ourselves would wait forever, and the owner may write it right away
            writer.put_snapshot(snapshot)
            return
        future = writer.submit(None, snapshot)
        try:
            future.result(self.timeout + 5)
        except TimeoutError:
            raise BackendUnavailableError(f"pulsar: writing the snapshot of {topic}[{partition}] timed out") from None

    @property
    def max_record_bytes(self) -> int | None:
        return None  # only the entry limit (max_batch_bytes)

    @property
    def max_batch_bytes(self) -> int | None:
        """One batch must fit into one entry (``max_entry_bytes``), with room for the framing
        and the ``idem.*`` properties of its records."""
        return self.max_entry_bytes - _ENTRY_MARGIN

    def release(self, topic: str, partition: int) -> None:
        with self._lock:
            writer = self._writers.pop((topic, partition), None)
        if writer is not None:
            writer.close()

    def close(self) -> None:
        with self._lock:
            writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.close()
        for handle in (self._meta_reader, self._meta_producer, self._client):
            if handle is not None:
                with contextlib.suppress(Exception):
                    handle.close()
        drain_pulsar_logs()  # the client's lines so far, now rather than at the relay's next read


__all__ = [
    "EntryTooLargeError",
    "OwnershipLostError",
    "PulsarBackend",
    "PulsarName",
    "decode_offset",
    "encode_offset",
    "pulsar_topic_name",
]
