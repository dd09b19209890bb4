"""The network client of one broker server: :class:`RemoteBroker` (re-exported by
:mod:`idempotent.net.client`).

``idempotent.connect("idem://host:port")`` returns one (``idems://`` for TLS), and so does
``Producer("idem://host:port")`` under the hood. Requests are pipelined over one TCP
connection (a :class:`~idempotent.net.link.Link`): each gets a correlation id, a
background reader thread completes its future when the answer arrives; a round of batches
(``submit_requests``) goes out in one write. Errors the server reports are raised as the same
:mod:`idempotent.errors` class with the same fields; I/O failures are
:class:`~idempotent.errors.BrokerConnectionError` (connection refused or lost: the outcome of
requests in flight is unknown, resending is safe) and
:class:`~idempotent.errors.RequestTimeoutError`. A broken connection is re-established on the
next request (with backoff, up to ``connect_timeout``).
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import msgpack
import tenacity

import idempotent.core.protocol as wire
import idempotent.net.tls as tls_contexts
from idempotent.api import ProduceShortcuts
from idempotent.core.request import ProduceRequest
from idempotent.core.types import TopicPartition
from idempotent.errors import (
    AuthenticationError,
    BrokerConnectionError,
    ConfigError,
    InternalError,
    NotOwnerError,
    ProducerClosedError,
    ProducerError,
    ProtocolError,
    RemoteProtocolError,
    RequestTimeoutError,
    TransactionStateError,
    TransactionTimedOutError,
)
from idempotent.net.link import Decode, Link
from idempotent.net.options import ClientOptions
from idempotent.runtime.future import LightFuture

if TYPE_CHECKING:
    from idempotent.core.checker import Policy
    from idempotent.core.outcomes import ProduceResult
    from idempotent.core.records import StoredRecord
    from idempotent.core.values import PartitionStats, ProducerSession

#: Port of ``idem://host`` without an explicit port.
DEFAULT_PORT = 7650


#: Operations whose repetition has no further effect: retried after transport errors.
_REPEATABLE = frozenset(wire.SCHEMAS) - {"hello", "init_producer", "produce"}
#: how the message of a connection that could not be made at all begins
_UNREACHABLE = "cannot connect to"


def _same(value: dict[str, Any]) -> dict[str, Any]:
    return value


def parse_url(url: str) -> tuple[str, int, bool]:
    """``idem://host:port`` or ``idems://host:port`` -> (host, port, tls). Raises ConfigError."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"bad broker URL {url!r}: {exc}") from None
    if parts.scheme not in ("idem", "idems") or not parts.hostname:
        raise ConfigError(f"bad broker URL {url!r}: expected idem://host:port or idems://host:port")
    if parts.path not in ("", "/") or parts.query:
        raise ConfigError(f"bad broker URL {url!r}: no path or query allowed")
    return parts.hostname, port or DEFAULT_PORT, parts.scheme == "idems"


def _token_from_environment() -> str | None:
    """``IDEMPOTENT_TOKEN``, else the contents of ``IDEMPOTENT_TOKEN_FILE``, else None.

    Raises:
        ConfigError: the token file cannot be read.
    """
    token = os.environ.get("IDEMPOTENT_TOKEN")
    if token:
        return token.strip()
    path = os.environ.get("IDEMPOTENT_TOKEN_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read IDEMPOTENT_TOKEN_FILE {path!r}: {exc}") from None


class RemoteBroker(ProduceShortcuts):
    """The Broker API of a broker server, over TCP or TLS. Thread-safe.

    Args:
        url: ``idem://host:port`` or ``idems://host:port`` (TLS).
        token: credentials sent in the handshake (for a server with an authenticator);
            default: the environment variable ``IDEMPOTENT_TOKEN``, else the contents of the
            file ``IDEMPOTENT_TOKEN_FILE`` names (see ``docs/security.md``).
        timeout: seconds to wait for each answer (``init_producer`` adds its own timeout).
        connect_timeout: seconds to keep trying to (re)connect before failing a request.
        cafile: CA bundle to verify the server's certificate (TLS); default:
            ``IDEMPOTENT_TLS_CA``, else the system's trust store.
        verify: False accepts any server certificate (TLS; for tests only).
        certfile, keyfile: a client certificate (TLS servers that require one); default:
            ``IDEMPOTENT_TLS_CERT`` and ``IDEMPOTENT_TLS_KEY``.
        ssl_context: a ready client-side context instead of the options above.
        client_name: sent in the handshake, for the server's logs.
        retries: how often a request that is safe to repeat (everything but ``produce`` and
            ``init_producer``, which the producer retries itself) is resent after a lost
            connection or a timeout.

    Raises:
        ConfigError: bad URL or options.
        BrokerConnectionError: the server could not be reached within ``connect_timeout``.
        AuthenticationError: the server refused the token.
        RemoteProtocolError: the server does not speak this protocol version.

    A produce sent to a broker that does not own the partition (several brokers, see
    ``docs/clustering.md``) fails with ConfigError naming the owner: one address cannot
    follow owners; connect with the list of brokers (a :class:`ClusterBroker`).
    """

    #: True when a :class:`ClusterBroker` routes through this client and follows
    #: NotOwnerError itself; False (standalone) turns NotOwnerError into ConfigError.
    routed: bool = False

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        cafile: str | None = None,
        verify: bool = True,
        certfile: str | None = None,
        keyfile: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        client_name: str | None = None,
        retries: int = 3,
    ) -> None:
        self.host, self.port, tls = parse_url(url)
        self._url = url
        self.token = token if token is not None else _token_from_environment()
        if tls and ssl_context is None:
            cafile = cafile or os.environ.get("IDEMPOTENT_TLS_CA") or None
            certfile = certfile or os.environ.get("IDEMPOTENT_TLS_CERT") or None
            keyfile = keyfile or os.environ.get("IDEMPOTENT_TLS_KEY") or None
        if not timeout > 0 or not connect_timeout > 0:
            raise ConfigError("timeout and connect_timeout must be positive")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.client_name = client_name or "idempotent-python"
        if not isinstance(retries, int) or retries < 0:
            raise ConfigError("retries must be a non-negative int")
        self.retries = retries
        self._ssl: ssl.SSLContext | None = None
        if tls:
            if ssl_context is not None:
                self._ssl = ssl_context
            else:
                context = tls_contexts.client_context(
                    cafile, certfile=certfile or None, keyfile=keyfile, check_hostname=verify
                )
                if not verify:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                self._ssl = context
        elif ssl_context is not None or cafile or certfile:
            raise ConfigError("TLS options need an idems:// URL")
        self._lock = threading.Lock()
        self.address = f"{self.host}:{self.port}"
        self._link: Link | None = None
        self._closed = False
        self._closed_error: ProducerError = ProducerClosedError(f"client for {url} is closed")
        self._connect()

    # -- connection ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The URL this client was opened with."""
        return self._url

    @property
    def server_info(self) -> dict[str, Any]:
        """The server's answer to the handshake (version, limits, principal, address)."""
        link = self._current()
        return dict(link.hello)

    def _current(self) -> Link:
        link = self._link
        if link is not None and link.alive:
            return link
        return self._connect()

    def _connect(self) -> Link:
        with self._lock:
            if self._closed:
                raise self._closed_error
            link = self._link
            if link is not None and link.alive:
                return link
            try:
                for attempt in tenacity.Retrying(
                    retry=tenacity.retry_if_exception_type(BrokerConnectionError),
                    wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
                    stop=tenacity.stop_after_delay(self.connect_timeout),
                    reraise=True,
                ):
                    with attempt:
                        self._link = self._open()
            except BrokerConnectionError as exc:
                prefix = f"{_UNREACHABLE} {self._url}: "
                if not exc.message.startswith(prefix):
                    raise
                raise BrokerConnectionError(
                    f"{_UNREACHABLE} {self._url} within the connect timeout of {self.connect_timeout:g} s "
                    f"({exc.message[len(prefix) :]}); "
                    "check that the broker server runs there (idempotent broker --listen HOST:PORT) and the "
                    "URL is right, or allow longer with connect_timeout (--connect-timeout on the command line)"
                ) from None
            assert self._link is not None
            return self._link

    def _open(self) -> Link:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except OSError as exc:
            raise BrokerConnectionError(f"{_UNREACHABLE} {self._url}: {exc.strerror or exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
            hello = {"version": wire.PROTOCOL_VERSION, "token": self.token, "client": self.client_name}
            sock.sendall(wire.encode_request(1, "hello", hello))
            answer = self._read_one(sock)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise ConfigError(f"TLS verification of {self._url} failed: {exc.verify_message}") from None
        except ssl.SSLError as exc:
            sock.close()
            if exc.reason == "WRONG_VERSION_NUMBER":  # the peer answered, but not in TLS
                raise ConfigError(f"{self._url} does not speak TLS; use idem:// for a plain listener") from None
            raise BrokerConnectionError(f"TLS handshake with {self._url} failed: {exc}") from None
        except (OSError, ValueError) as exc:
            sock.close()
            raise BrokerConnectionError(f"handshake with {self._url} failed: {exc}") from None
        except BaseException:
            sock.close()
            raise
        kind, cid, value = answer
        if kind == wire.ERROR:
            sock.close()
            raise wire.error_from_wire(value)
        if kind != wire.RESPONSE or cid != 1 or type(value) is not dict:
            sock.close()
            raise RemoteProtocolError(f"{self._url} answered the handshake with {answer!r:.100}")
        link = Link(sock, value, self.address, self.timeout)
        link.translate = self._translate
        return link

    def _read_one(self, sock: socket.socket) -> list[Any]:
        decoder = wire.FrameDecoder(wire.DEFAULT_MAX_FRAME)
        while True:
            data = sock.recv(65536)
            if not data:
                raise BrokerConnectionError(f"{self._url} closed the connection during the handshake")
            for body in decoder.feed(data):
                if isinstance(body, wire.FrameTooLarge):
                    raise RemoteProtocolError("oversized handshake answer")
                try:
                    frame = msgpack.unpackb(body, raw=False)
                except (ValueError, msgpack.UnpackException):
                    frame = None
                if type(frame) is not list or len(frame) != 3:
                    raise RemoteProtocolError(f"{self._url} does not speak the idempotent protocol")
                return frame

    # -- requests --------------------------------------------------------------------------------

    def submit(
        self, op: str, args: dict[str, Any], decode: Decode = _same, timeout: float | None = None
    ) -> Future[Any]:
        """Send one request; return the future of its decoded result (see ``docs/protocol.md``).

        Failures (server errors, I/O) end up on the future, except ProducerClosedError after
        :meth:`close`, which is raised.
        """
        try:
            link = self._current()
        except (BrokerConnectionError, AuthenticationError, ProtocolError, ConfigError) as exc:
            failed: Future[Any] = LightFuture()
            failed.set_exception(exc)
            return failed
        return link.submit(op, args, decode, self.timeout if timeout is None else timeout)

    def call(self, op: str, args: dict[str, Any], decode: Decode = _same, timeout: float | None = None) -> Any:
        """Send one request and wait for its result. Raises what the server reported.

        Requests that are safe to repeat (every operation but ``init_producer`` and
        ``produce``) are sent again, up to ``retries`` times, after a lost connection or a
        timeout."""
        if op not in _REPEATABLE or self.retries == 0:
            return self._call_once(op, args, decode, timeout)
        for attempt in tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((BrokerConnectionError, RequestTimeoutError)),
            wait=tenacity.wait_exponential_jitter(multiplier=0.05, max=1.0, jitter=0.05),
            stop=tenacity.stop_after_attempt(self.retries + 1),
            reraise=True,
        ):
            with attempt:
                return self._call_once(op, args, decode, timeout)
        raise InternalError("unreachable: the retry loop ended without a result")  # pragma: no cover

    def _call_once(self, op: str, args: dict[str, Any], decode: Decode, timeout: float | None) -> Any:
        wait = self.timeout if timeout is None else timeout
        future = self.submit(op, args, decode, wait)
        try:
            return future.result(wait + 5)
        except TimeoutError:
            raise RequestTimeoutError(f"no answer from {self._url} within {wait:g} s") from None

    def ping(self) -> float:
        """Round-trip time of one request, in seconds."""
        started = time.perf_counter()
        self.call("ping", {})
        return time.perf_counter() - started

    def metadata(self, topics: Sequence[str] | None = None, *, create: bool = False) -> dict[str, list[str | None]]:
        """Owner address (``host:port``, None when unknown) of every partition of ``topics``
        (default: every topic)."""
        args = {"topics": None if topics is None else list(topics), "create": create}
        result = self.call("metadata", args)
        topics_map: dict[str, list[str | None]] = result["topics"]
        return topics_map

    # -- BrokerAPI -------------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic. Raises InvalidTopicError (bad name, or it exists with another count)."""
        self.call("create_topic", {"name": name, "partitions": partitions})

    def delete_topic(self, name: str) -> None:
        """Delete a topic. Raises InvalidTopicError (bad name, or no such topic)."""
        self.call("delete_topic", {"name": name})

    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        result: dict[str, int] = self.call("topics", {})["topics"]
        return result

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        """Partition count of ``topic``; created with the default count when ``create``."""
        count: int = self.call("partitions_for", {"topic": topic, "create": create})["partitions"]
        return count

    def init_producer(self, producer_name: str | None = None, *, timeout: float = 30.0) -> ProducerSession:
        """Allocate a producer id, or re-initialise a named producer (epoch bumped).

        Raises what the broker raises (see :meth:`idempotent.broker.broker.Broker.init_producer`),
        plus the I/O errors of this client.
        """
        session: ProducerSession = self.call(
            "init_producer",
            {"producer_name": producer_name, "timeout": timeout},
            wire.decode_session,
            timeout=timeout + self.timeout,
        )
        return session

    @property
    def produce_timeout(self) -> float:
        """Seconds :meth:`produce` waits for the answer: the request timeout, and 5 s more."""
        return self.timeout + 5

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        """Send a batch; return the future of its result. Batches of one partition are sent,
        and stored, in the order of these calls.

        Raises:
            ProducerClosedError: this client is closed.
        """
        return self.submit_requests([request])[0]

    def submit_requests(self, requests: Sequence[ProduceRequest]) -> list[Future[ProduceResult]]:
        """Send batches in one write, in order; return the futures of their results. A batch
        of :class:`~idempotent.core.records.RecordColumns` goes as its columns, with no object
        per record. Failures (server errors, I/O) end up on the futures.

        Raises:
            ProducerClosedError: this client is closed.
        """
        try:
            link = self._current()
        except (BrokerConnectionError, AuthenticationError, ProtocolError, ConfigError) as exc:
            failed: list[Future[ProduceResult]] = []
            for _ in requests:
                future: Future[ProduceResult] = LightFuture()
                future.set_exception(exc)
                failed.append(future)
            return failed
        return link.submit_many([("produce", r, wire.decode_result) for r in requests], self.timeout)

    def _translate(self, error: ProducerError) -> ProducerError:
        """The error a caller of this client sees for one the server sent (on error frames
        only): standalone, a NotOwnerError becomes a ConfigError, because a client of one
        address cannot follow it (the producer would retry it until its delivery timeout)."""
        if self.routed or not isinstance(error, NotOwnerError):
            return error
        owner = f"{self._url.split('://', 1)[0]}://{error.owner}" if error.owner else "its owner"
        return ConfigError(
            f"{self._url} is one of several brokers and does not own {error.topic}[{error.partition}] "
            f"(owned by {owner}); connect with a list of the brokers, e.g. "
            f"'{self._url.rstrip('/')},{error.owner or 'host:port'}' (docs/clustering.md)"
        )

    # -- the application's transactions (a broker server on sqlite:// or memory://) --------------

    #: the server holds a transaction's batches until its commit (answered without offsets)
    holds_transactions = True

    def _transaction_call(self, op: str, args: dict[str, Any]) -> Any:
        """``op`` of a transaction, waiting as long as the server's commit may (its backend's
        append timeout). A lost connection or a timeout, once the repeats are used up, is
        :class:`~idempotent.errors.TransactionTimedOutError`: the call may be made again (the
        server answers a repeat of an ended commit or abort as the first time).

        Raises:
            TransactionStateError: the server predates transactions; what the server raises.
        """
        if "transactions" not in self._current().extensions:
            raise TransactionStateError(f"the broker server at {self._url} predates transactions: upgrade it")
        try:
            return self.call(op, args, timeout=max(self.timeout, 60.0))
        except (BrokerConnectionError, RequestTimeoutError) as exc:
            raise TransactionTimedOutError(f"{op}: no answer from {self._url} ({exc}); call it again") from exc

    def begin_transaction(self, producer_id: int, producer_epoch: int) -> None:
        """Open the producer's transaction on the server
        (:meth:`idempotent.broker.broker.Broker.begin_transaction`).

        Raises:
            What the server's broker raises; TransactionTimedOutError (no answer: call again).
        """
        self._transaction_call("begin_transaction", {"producer_id": producer_id, "producer_epoch": producer_epoch})

    def commit_transaction(
        self, producer_id: int, producer_epoch: int, positions: bytes | None = None
    ) -> dict[tuple[str, int, int], tuple[int | None, bool]]:
        """Commit it (:meth:`idempotent.broker.broker.Broker.commit_transaction`): per batch
        (topic, partition, base sequence), its base offset and whether it was a duplicate.

        Raises:
            What the server's broker raises; TransactionTimedOutError (no answer: call again).
        """
        args = {"producer_id": producer_id, "producer_epoch": producer_epoch, "positions": positions}
        answers = self._transaction_call("commit_transaction", args)["answers"]
        return {(str(t), int(p), int(seq)): (offset, bool(dup)) for t, p, seq, offset, dup in answers}

    def abort_transaction(self, producer_id: int, producer_epoch: int) -> dict[TopicPartition, int]:
        """Abort it (:meth:`idempotent.broker.broker.Broker.abort_transaction`): the producer's
        last stored sequence on each partition the transaction wrote.

        Raises:
            What the server's broker raises; TransactionTimedOutError (no answer: call again).
        """
        args = {"producer_id": producer_id, "producer_epoch": producer_epoch}
        rewound = self._transaction_call("abort_transaction", args)["last_sequences"]
        return {TopicPartition(str(t), int(p)): int(seq) for t, p, seq in rewound}

    def committed_positions(self, producer_id: int) -> bytes | None:
        """What the last committed transaction of the (named) producer stored, or None.

        Raises:
            TransactionStateError: the server predates transactions, or its backend has none.
        """
        positions: bytes | None = self._transaction_call("committed_positions", {"producer_id": producer_id})[
            "positions"
        ]
        return positions

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        """Up to ``max_records`` stored records from ``offset`` on (the server may return fewer
        to keep its answer under its frame limit)."""
        max_records = min(max_records, wire.MAX_READ_RECORDS) if isinstance(max_records, int) else max_records
        result = self.call(
            "read", {"topic": topic, "partition": partition, "offset": offset, "max_records": max_records}
        )
        return [wire.decode_stored(r) for r in result["records"]]

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next stored record of the partition will get."""
        offset: int = self.call("end_offset", {"topic": topic, "partition": partition})["offset"]
        return offset

    def last_sequence(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, *, timeout: float = 30.0
    ) -> int:
        """The last stored sequence of a producer on a partition the server owns (several
        brokers; see :meth:`idempotent.broker.broker.Broker.last_sequence`). Raises NotOwnerError
        when another broker owns it."""
        args = {
            "topic": topic,
            "partition": partition,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "timeout": timeout,
        }
        sequence: int = self.call("last_sequence", args, timeout=timeout + self.timeout)["sequence"]
        return sequence

    def stats(self, topic: str | None = None) -> list[PartitionStats]:
        """Checker state of every partition (of one topic)."""
        result = self.call("stats", {"topic": topic})
        return [wire.decode_stats(s) for s in result["partitions"]]

    def set_deduplication(
        self, enabled: bool | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        """Switch deduplication at topic, namespace or broker level (None clears)."""
        self.call("set_deduplication", {"enabled": enabled, "topic": topic, "namespace": namespace})

    def set_policy(
        self, policy: Policy | str | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        """Set the sequence policy at one level (None clears). Raises ConfigError for an unknown one."""
        value = getattr(policy, "value", policy)
        self.call("set_policy", {"policy": value, "topic": topic, "namespace": namespace})

    def close(self, error: ProducerError | None = None) -> None:
        """Close the connection; requests still in flight, and any made later, fail with
        ``error`` (default ProducerClosedError; their outcome is unknown). A
        :class:`ClusterBroker` dropping a failed link passes a retriable error instead. Data
        the server acknowledged stays stored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closed_error = error or ProducerClosedError(f"client for {self._url} was closed")
            link = self._link
        if link is not None:
            link.fail(self._closed_error)
            if link.thread is not threading.current_thread():
                link.thread.join(5)

    def __enter__(self) -> RemoteBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_PORT", "ClientOptions", "RemoteBroker", "parse_url"]
