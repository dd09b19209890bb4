"""Apache Pulsar log backend (pulsar-client).

``pulsar://host:port[,host:port...]``, or any other service URL pulsar-client takes
(``pulsar+ssl://`` over TLS, ``http://`` and ``https://`` for lookups over the web service;
see :mod:`idempotent.adapters.pulsar.url`), with options passed as keyword arguments to
:func:`idempotent.connect` (or :class:`PulsarBackend`), or as URL query parameters
(``?admin_url=...&timeout=...``, and pulsar-client's TLS arguments; keywords win):

* ``admin_url`` (default ``http://<first host>:8080``, ``https://<first host>:8443`` for
  ``pulsar+ssl://``, the URL itself for ``http(s)://``): the broker's admin REST base URL;
* ``admin_headers``: extra HTTP headers for admin calls (e.g. ``Authorization``);
* ``client_options``: keyword arguments for :class:`pulsar.Client` (``authentication``,
  TLS paths and flags, which the admin calls over ``https`` use too,
  ``operation_timeout_seconds``, ``logger``, ...); without a ``logger``, the C++ client's
  lines go to the Python logger ``idempotent.clients.pulsar`` (:mod:`idempotent.runtime.native_logs`);
* ``service_url``: what the Pulsar client connects to, if not the URL itself (for example
  ``pulsar+ssl://host:6651``);
* ``meta_topic`` (default ``persistent://public/default/__idempotent_meta``);
* ``max_entry_bytes`` (default 5 MiB, Pulsar's ``maxMessageSize``): the largest entry
  this backend writes; a batch that does not fit fails with :class:`EntryTooLargeError`;
* ``timeout`` (default 30 s): admin calls, producer creation, sends and reads;
* ``connect_timeout`` (default 10 s): how long to try to reach the service and admin
  addresses at all before failing with :class:`BackendUnavailableError` (see
  :mod:`idempotent.adapters.reach`); also the client's ``connection_timeout_ms``;
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
* Pulsar's own deduplication is enabled (for the data topics' namespace, never as a topic
  policy: see ``_enable_deduplication``) and the owner sends explicit,
  increasing sequence ids, so the client's internal resends never duplicate an entry.
* Snapshots go to ``__idempotent_snapshots.<name>-<p>`` in the topic's namespace, written by
  the partition's owner after the batches they cover. Topics, producer records, settings and
  producer-id blocks go to the meta topic; an id block's start is the sum of the sizes of the
  blocks before it in that topic's log order, so concurrent brokers never overlap.

Every pulsar-client and admin REST error is translated in one place,
:mod:`idempotent.adapters.pulsar.errors`. The other concerns have modules of their own: names and
offsets (:mod:`idempotent.adapters.pulsar.names`), the admin REST client (:mod:`idempotent.adapters.pulsar.admin`),
records as messages (:mod:`idempotent.adapters.pulsar.messages`), the partition writer
(:mod:`idempotent.adapters.pulsar.writer`), URLs (:mod:`idempotent.adapters.pulsar.url`) and the metadata store
shared with Kafka (:mod:`idempotent.adapters.metadata`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import attrs

from idempotent.adapters.meta import TopicOrigin, unpack_snapshot
from idempotent.adapters.metadata import CompactedMetadataStore, MetadataDelegate
from idempotent.adapters.pulsar.admin import Admin
from idempotent.adapters.pulsar.errors import _HttpError as _HttpError
from idempotent.adapters.pulsar.errors import map_errors, translate
from idempotent.adapters.pulsar.messages import Message, encode_record, property_int, stored_record, timestamp_of
from idempotent.adapters.pulsar.names import (
    SNAPSHOT_PREFIX,
    PulsarName,
    decode_offset,
    encode_offset,
    offset_of,
    pulsar_topic_name,
    split_topic,
    start_id,
)
from idempotent.adapters.pulsar.url import admin_ssl_context, flag, parse_url
from idempotent.adapters.pulsar.writer import MAX_GROUP_RECORDS, OWNER_PREFIX, PartitionWriter, Unsettled
from idempotent.adapters.reach import DEFAULT_CONNECT_TIMEOUT, check_connect_timeout, parse_addresses, wait_reachable
from idempotent.backend import AppendBatch, TopicReplicas
from idempotent.core.records import Snapshot, StoredBatch, StoredRecord
from idempotent.core.types import NO_PRODUCER_ID, Epoch, ProducerId
from idempotent.core.types import Sequence as SequenceNumber
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    EntryTooLargeError,
    InvalidTopicError,
    OwnershipLostError,
)
from idempotent.runtime.native_logs import drain_pulsar_logs, open_pulsar_client

try:
    import pulsar
    from pulsar import exceptions as pulsar_errors
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the pulsar backend needs pulsar-client: pip install 'idempotent[pulsar]'") from exc

_LOG = logging.getLogger("idempotent.adapters.pulsar")
#: admin statuses of a topic no broker owns for a moment (its bundle being unloaded or moved)
_UNOWNED = (404, 412)
#: the port of a service URL without one, by scheme (pulsar-client's defaults)
_DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651, "http": 80, "https": 443}
META_TOPIC = "persistent://public/default/__idempotent_meta"
DEFAULT_MAX_ENTRY_BYTES = 5 * 1024 * 1024
#: what an entry needs beyond the batch's own bytes (as Record.size counts them) for one record
_ENTRY_MARGIN = 4096


# -- the backend ---------------------------------------------------------------------------


def _quorums(body: object, *keys: str) -> tuple[int, int, int] | None:
    """The ensemble size, write quorum and ack quorum named by ``keys`` in an admin answer
    (numbers, or their text in the brokers' configuration); None when it lacks them."""
    if not isinstance(body, dict) or not all(k in body for k in keys):
        return None
    try:
        ensemble, write, ack = (int(body[k]) for k in keys)
    except (TypeError, ValueError):
        return None
    return ensemble, write, ack


class PulsarBackend(MetadataDelegate):
    """A log in Apache Pulsar; see the module docstring. Its metadata half is a
    :class:`~idempotent.adapters.metadata.CompactedMetadataStore` over the meta topic."""

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
        meta_name = split_topic(self.meta_topic)
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
        # fail an address where nothing listens within connect_timeout (see idempotent.adapters.reach):
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
        self._admin = Admin(admin, dict(admin_headers or {}), self.timeout, admin_ssl_context(admin, options))
        self._lock = threading.RLock()
        self._writers: dict[tuple[str, int], PartitionWriter] = {}
        #: what failed writers left in doubt, until the writer replacing them checked it
        self._unsettled: dict[tuple[str, int], Unsettled] = {}
        self.metadata: CompactedMetadataStore[tuple[int, int]] = CompactedMetadataStore(
            "pulsar", self._put_metas, self._meta_records, self._lock, timeout=self.timeout, writable=not read_only
        )
        self._namespaces: set[tuple[str, str]] = set()
        #: namespaces whose deduplication policy is known to be on
        self._deduplicating: set[tuple[str, str]] = set()
        #: topics checked for a topic-level deduplication policy
        self._policy_checked: set[str] = set()
        self._clusters: list[str] | None = None
        self._client: Any = None
        self._meta_producer: Any = None
        self._meta_reader: Any = None
        with map_errors("connect"):
            # the C++ client's lines go to Python logging (idempotent.runtime.native_logs) unless options name a logger
            self._client = open_pulsar_client(pulsar.Client, service_url or parsed.service_url, **options)
            try:
                if not read_only:
                    self.ensure_topic(meta_name)
                    self._meta_producer = self._client.create_producer(
                        self.meta_topic, send_timeout_millis=int(self.timeout * 1000), block_if_queue_full=True
                    )
                self._meta_reader = self._open_reader(
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
                    "deduplicationEnabled": True,
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

    def _enable_deduplication(self, name: PulsarName) -> None:
        """Switch Pulsar's deduplication on for the namespace of ``name`` (once per namespace
        and process; a namespace created here has it from the start), never as a topic-level
        policy: a topic that has topic-level policies runs two deduplication recoveries at
        once when it is loaded (an unload, a bundle move, a broker restart) in Pulsar before
        the fix of apache/pulsar#25954 (PR #25953), and their interleaved replays can leave the
        broker's last sequence id of a producer below what is stored, so that a resend after
        the reload is stored a second time. A namespace policy is read when the topic loads
        and starts one recovery."""
        key = (name.tenant, name.namespace)
        if key in self._deduplicating:
            return
        where = f"/admin/v2/namespaces/{name.tenant}/{name.namespace}/deduplication"
        _, enabled = self._admin.call("GET", where)
        if enabled is not True:
            self._admin.call("POST", where, True)
            _LOG.warning(
                "pulsar: deduplication enabled for the namespace %s/%s (pulsar-admin namespaces "
                "set-deduplication): it now applies to every topic there, and drops a producer's "
                "message whose sequence id is not above that name's last stored one",
                name.tenant,
                name.namespace,
            )
        self._deduplicating.add(key)

    def _warn_topic_policy(self, name: PulsarName) -> None:
        """A topic-level deduplication policy (set by earlier versions of this adapter, or by
        hand) keeps the topic exposed to the double recovery of :meth:`_enable_deduplication`:
        say so once per topic and process."""
        if name.topic in self._policy_checked:
            return
        self._policy_checked.add(name.topic)
        status, value = self._admin.call("GET", f"{name.rest}/deduplicationEnabled", accept=(404, 405))
        if status < 300 and value is not None:
            _LOG.warning(
                "pulsar: %s has a topic-level deduplication policy (%s). A topic with topic-level policies "
                "may store a producer's resend twice after an unload or a broker restart, on Pulsar without "
                "the fix of apache/pulsar#25954; deduplication is enabled for its namespace, so the topic "
                "needs none (topic-level policies stay once set: recreate the topic to drop them)",
                name.topic,
                value,
            )

    def ensure_topic(self, name: PulsarName) -> str:
        """Create a non-partitioned topic if it is missing; return its full name."""
        self._ensure_namespace(name.tenant, name.namespace)
        self._admin.call("PUT", name.rest, accept=(409,))
        return name.topic

    def ensure_deduplication(self, name: PulsarName, data_topic: str) -> None:
        """Make sure Pulsar's deduplication is active on a partition's topic ``data_topic``
        before we write to it (enabling it is asynchronous; until it is active, sends are not
        checked). ``name`` is the topic whose namespace's policy enables it
        (:meth:`_enable_deduplication`)."""
        self._warn_topic_policy(name)
        stats = "/admin/v2/persistent/" + data_topic.removeprefix("persistent://") + "/stats"
        deadline = time.monotonic() + self.timeout
        requested = False
        while True:
            # 404/412 ("Can't find owner for topic"): no broker owns its bundle for a moment (a
            # bundle or namespace unloaded, a broker restarting); asked again until the timeout
            code, body = self._admin.call("GET", stats, accept=_UNOWNED)
            if code in _UNOWNED:
                if time.monotonic() > deadline:
                    raise translate(_HttpError(code, str(body), stats), f"read the stats of {data_topic}")
                time.sleep(0.05)
                continue
            status = body.get("deduplicationStatus") if isinstance(body, dict) else None
            if status == "Enabled":
                return
            if not requested and status not in ("Recovering", "Initialized"):
                # (again: a policy set by create_topic may simply not have arrived yet)
                self._deduplicating.discard((name.tenant, name.namespace))
                self._enable_deduplication(name)
                requested = True
            if time.monotonic() > deadline:
                if status in ("Recovering", "Initialized"):
                    raise BackendUnavailableError(f"pulsar: deduplication on {data_topic} is {status}")
                raise ConfigError(
                    f"pulsar: deduplication on {data_topic} is {status!r}, not Enabled, although it was "
                    f"requested for the namespace {name.tenant}/{name.namespace} (check it with pulsar-admin "
                    f"namespaces get-deduplication {name.tenant}/{name.namespace})"
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
                batching_max_messages=MAX_GROUP_RECORDS + (1 << 20),
                batching_max_allowed_size_in_bytes=1 << 30,
                batching_max_publish_delay_ms=24 * 3600 * 1000,
                max_pending_messages=MAX_GROUP_RECORDS + (1 << 20),
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

    def _open_reader(self, topic: str, start: Any, **options: Any) -> Any:
        """``create_reader``, tried again for up to ``timeout`` while Pulsar answers
        ``ConsumerBusy``. Every reader has a subscription of its own, so that answer means the
        broker still holds the client's own earlier attempt at this one (it timed out on the
        client's side and was sent again, as under a loaded or moving broker); the broker lets
        go of it once it sees the attempt abandoned.

        Raises:
            pulsar exceptions: anything else at once, and ``ConsumerBusy`` after ``timeout``
                (translated by the caller: retriable).
        """
        deadline = time.monotonic() + self.timeout
        pause = 0.05
        while True:
            try:
                return self._client.create_reader(topic, start, **options)
            except pulsar_errors.ConsumerBusy:
                if time.monotonic() + pause > deadline:
                    raise
                _LOG.info("pulsar: opening a reader of %s: ConsumerBusy, trying again in %.2f s", topic, pause)
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _read(self, topic: str, start: Any, limit: int | None = None) -> Iterator[Any]:
        """Messages of one Pulsar topic from ``start`` (inclusive) to its current end."""
        queue = 1000 if limit is None else max(1, min(limit, 1000))
        reader = self._open_reader(topic, start, start_message_id_inclusive=True, receiver_queue_size=queue)
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
        """The newest message of a Pulsar topic, or None.

        A topic that Pulsar's admin API says retains no entry (``internalStats``:
        ``numberOfEntries`` 0, as for a topic just made) is answered None at once: opening a
        reader to find that out takes a lookup, a subscription and a round trip for the last
        message id, about 100 ms, which every new producer's first delivery waited for."""
        if self._retains_no_entry(topic):
            return None
        reader = self._open_reader(topic, pulsar.MessageId.latest, start_message_id_inclusive=True)
        try:
            if not reader.has_message_available():
                return None
            return reader.read_next(int(self.timeout * 1000))
        finally:
            with contextlib.suppress(Exception):
                reader.close()

    def _retains_no_entry(self, topic: str) -> bool:
        """Whether the admin API says ``topic`` retains no entry (a reader would find no
        message); False when it cannot say (no such topic yet, a refusal, no answer), and
        then the caller asks a reader."""
        try:
            status, body = self._admin.call("GET", f"{split_topic(topic).rest}/internalStats", accept=(404,))
        except (_HttpError, OSError):
            return False
        return status != 404 and isinstance(body, dict) and body.get("numberOfEntries") == 0

    # -- metadata (the meta topic) ----------------------------------------------------------------

    def _meta_records(self, after: tuple[int, int] | None) -> Iterator[tuple[str, bytes | None, tuple[int, int]]]:
        """The keyed records of the meta topic after ``after`` (the metadata store's reads,
        see :mod:`idempotent.adapters.metadata`): the meta reader keeps its place, which is ``after``."""
        reader = self._meta_reader
        timeout_ms = int(self.timeout * 1000)
        with map_errors("read the metadata"):
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
        metadata store's writes, see :mod:`idempotent.adapters.metadata`)."""
        positions: list[tuple[int, int]] = []
        for key, value in items:
            if self._meta_producer is None:
                raise ConfigError(f"{self.url} is opened read-only: cannot store {key}")
            with self._lock, map_errors(f"store {key}"):
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
        with self._lock, map_errors(f"describe topic {topic}"):
            self.metadata.catch_up()
            if self._clash(topic, name) is not None:
                return None
            native = self._native(name)
            recorded = self.metadata.partition_count(topic)
            if recorded is None:
                return None if native is None else native[0]
            return self._current(topic, recorded, native)

    def describe_replicas(self, topic: str) -> TopicReplicas | None:
        """How ``topic`` is replicated: Pulsar keeps its copies in BookKeeper, as its
        namespace's persistence policy says (ensemble, write quorum, ack quorum: the same for
        every partition), else as the brokers' defaults (``managedLedgerDefault*``). The answer
        has no partitions, only its ``note``; None when Pulsar has no such topic.

        Raises:
            BackendUnavailableError: Pulsar did not answer.
        """
        name = pulsar_topic_name(topic)
        namespace = f"{name.tenant}/{name.namespace}"
        refused = (401, 403)
        with self._lock, map_errors(f"describe the replicas of {topic}"):
            if self._native(name) is None:
                return None
            status, policy = self._admin.call("GET", f"/admin/v2/namespaces/{namespace}/persistence", accept=refused)
            values = _quorums(policy, "bookkeeperEnsemble", "bookkeeperWriteQuorum", "bookkeeperAckQuorum")
            where = f"from the namespace {namespace}'s persistence policy"
            if values is None and status not in refused:  # no policy of its own: the brokers' defaults
                _, config = self._admin.call("GET", "/admin/v2/brokers/configuration/runtime", accept=refused)
                values = _quorums(
                    config,
                    "managedLedgerDefaultEnsembleSize",
                    "managedLedgerDefaultWriteQuorum",
                    "managedLedgerDefaultAckQuorum",
                )
                where = f"from the brokers' defaults: the namespace {namespace} has no persistence policy"
        if values is None:
            note = (
                f"kept by BookKeeper as the namespace's persistence policy or the brokers' defaults say, which "
                f"could not be read here (pulsar-admin namespaces get-persistence {namespace})"
            )
        else:
            ensemble, write, ack = values
            note = (
                f"kept by BookKeeper: each write on {write} bookie(s) of an ensemble of {ensemble}, acknowledged "
                f"by {ack}, for every partition ({where})"
            )
        return TopicReplicas((), note=note)

    def create_topic(self, topic: str, partitions: int) -> int:
        """Create a partitioned topic, or adopt the Pulsar topic of its name, partitioned or
        not (see LogBackend)."""
        name = pulsar_topic_name(topic)
        with self._lock, map_errors(f"create topic {topic}"):
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
            # for the namespace, not as a topic policy (see _enable_deduplication); checked
            # active on each partition before its first write
            self._enable_deduplication(name)
            return self.metadata.record_topic(topic, count, origin)  # an origin recorded first wins

    def _end(self, data_topic: str) -> int:
        """Where the next message of a Pulsar topic will be, or later (0 when it is empty):
        after the newest message's batch index, or, when that message was not batched (a
        plain producer's), at the next entry: a reader started inside a plain entry would
        read it again.

        Asked of the admin REST API (the topic's last message id): a client reader started at
        the latest message, inclusive, can wait for ever in ``has_message_available`` on a
        topic written by batches (seen on Pulsar 3.0.7 with pulsar-client 3.x). Only when
        Pulsar answers that the topic holds no entry is a reader asked (after a ledger
        rollover the last id can name the new, empty ledger)."""
        status, body = self._admin.call("GET", f"{split_topic(data_topic).rest}/lastMessageId", accept=(404,))
        if status != 404 and isinstance(body, dict) and int(body.get("entryId", -1)) >= 0:
            ledger_id, entry_id = int(body["ledgerId"]), int(body["entryId"])
            batch_index = int(body.get("batchIndex", -1))
            if batch_index < 0:
                return encode_offset(ledger_id, entry_id + 1, 0)
            return encode_offset(ledger_id, entry_id, batch_index) + 1
        last = self._last(data_topic)
        if last is None:
            return 0
        message_id = last.message_id()
        if message_id.batch_index() < 0:
            return encode_offset(message_id.ledger_id(), message_id.entry_id() + 1, 0)
        return offset_of(message_id) + 1

    def delete_topic(self, topic: str) -> None:
        """Delete the partitioned Pulsar topic and its snapshot topics (forcefully: readers
        are disconnected), and tombstone its topic record."""
        if self.read_only:
            raise ConfigError(f"{self.url} is opened read-only: cannot delete {topic}")
        name = pulsar_topic_name(topic)
        with self._lock, map_errors(f"delete topic {topic}"):
            self.metadata.catch_up()
            partitions = self.metadata.partition_count(topic) or 0
            for partition in range(partitions):
                self.release(topic, partition)
            self._admin.call("DELETE", f"{name.rest}/partitions?force=true", accept=(404,))
            for partition in range(partitions):
                snapshots = f"/admin/v2/persistent/{name.tenant}/{name.namespace}/{name.snapshot_local(partition)}"
                self._admin.call("DELETE", f"{snapshots}?force=true", accept=(404,))
            self.metadata.forget_topic(topic)

    def _writer(self, topic: str, partition: int, *, renew: bool = False) -> PartitionWriter:
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
                if writer.unsettled is not None:  # kept until a new writer has checked it
                    self._unsettled[key] = writer.unsettled
            writer = self._writers[key] = PartitionWriter(self, topic, partition, self._unsettled.get(key))
            self._unsettled.pop(key, None)
            return writer

    def _check(self, topic: str, partition: int) -> None:
        if not 0 <= partition < (self.metadata.partition_count(topic) or 0):
            with self._lock, map_errors("list topics"):
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
        # An entry a producer log wrote (idempotent.adapters.pulsar.producer_log) names its batch's identity on
        # its head only (batch index 0): read from the head of the entry holding ``offset``, so
        # that every record gets the identity it was written under (the head's sequence plus
        # its batch index, the batch's sequences being consecutive).
        batch_index = decode_offset(offset)[2] if offset > 0 else 0
        start = offset - batch_index
        records: list[StoredRecord] = []
        head: StoredRecord | None = None
        with map_errors(f"read {topic}[{partition}]"):
            for message in self._read(data_topic, start_id(start), max_records + batch_index):
                record = stored_record(message)
                index = message.message_id().batch_index()
                if index <= 0 or record.producer_id != NO_PRODUCER_ID:
                    head = record
                elif head is not None and head.offset == record.offset - index and head.producer_id != NO_PRODUCER_ID:
                    record = attrs.evolve(
                        record,
                        producer_id=head.producer_id,
                        producer_epoch=head.producer_epoch,
                        sequence=head.sequence + index,
                    )
                if record.offset >= offset:
                    records.append(record)
        return records

    def replay(self, topic: str, partition: int, from_offset: int) -> Iterator[StoredBatch]:
        self._check(topic, partition)
        if not self.read_only:
            self._writer(topic, partition, renew=True)  # take ownership first: fences a stale owner
        data_topic = self.data_topic(topic, partition)
        origin = self.metadata.origin(topic)
        if origin is not None:  # an adopted topic's records before its adoption are not ours
            from_offset = max(from_offset, origin.start(partition))
        batches: list[StoredBatch] = []
        with map_errors(f"replay {topic}[{partition}]"):
            reader = self._open_reader(
                data_topic, start_id(from_offset), start_message_id_inclusive=True, receiver_queue_size=1000
            )
            try:
                timeout_ms = int(self.timeout * 1000)
                while reader.has_message_available():
                    message = reader.read_next(timeout_ms)
                    offset = offset_of(message.message_id())
                    properties = message.properties()
                    count = properties.get("idem.count")
                    if count is None:
                        if "idem.pid" not in properties:  # a record written without the checker
                            batches.append(StoredBatch(offset, NO_PRODUCER_ID, Epoch(-1), SequenceNumber(-1), 1, 0.0))
                        continue
                    batches.append(
                        StoredBatch(
                            offset,
                            ProducerId(property_int(properties, "idem.pid")),
                            Epoch(property_int(properties, "idem.epoch")),
                            SequenceNumber(property_int(properties, "idem.seq")),
                            int(count),
                            timestamp_of(message),
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
        with map_errors(f"end offset of {topic}[{partition}]"):
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
            with map_errors(f"read the snapshot of {where}"):
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


# The helpers moved to modules of their own by concern; their former names here stay importable.
_map_errors, _translate, _Admin = map_errors, translate, Admin
_split_topic, _start_id, _offset_of = split_topic, start_id, offset_of
_Message, _encode_record, _stored = Message, encode_record, stored_record
_decimal, _timestamp = property_int, timestamp_of
_PartitionWriter, _MAX_GROUP_RECORDS = PartitionWriter, MAX_GROUP_RECORDS

__all__ = [
    "OWNER_PREFIX",
    "SNAPSHOT_PREFIX",
    "EntryTooLargeError",
    "OwnershipLostError",
    "PulsarBackend",
    "PulsarName",
    "decode_offset",
    "encode_offset",
    "pulsar_topic_name",
]
