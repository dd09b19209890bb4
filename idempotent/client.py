"""The network client: :class:`RemoteBroker` implements the Broker API against a broker server.

``idempotent.connect("idem://host:port")`` returns one (``idems://`` for TLS), and so does
``Producer("idem://host:port")`` under the hood. Requests are pipelined over one TCP
connection: each gets a correlation id, a background reader thread completes its future
when the answer arrives. Errors the server reports are raised as the same
:mod:`idempotent.errors` class with the same fields; I/O failures are
:class:`~idempotent.errors.BrokerConnectionError` (connection refused or lost: the outcome of
requests in flight is unknown, resending is safe) and
:class:`~idempotent.errors.RequestTimeoutError`. A broken connection is re-established on the
next request (with backoff, up to ``connect_timeout``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import msgpack
import tenacity

from . import _protocol as wire
from . import tls as tls_contexts
from ._request import ProduceRequest
from ._topics import canonical_topic
from ._types import TopicPartition
from ._values import LastSequences
from .api import ProduceShortcuts
from .errors import (
    AuthenticationError,
    BrokerConnectionError,
    ConfigError,
    InternalError,
    InvalidBatchError,
    NotOwnerError,
    ProducerClosedError,
    ProducerError,
    ProtocolError,
    RemoteProtocolError,
    RequestTimeoutError,
    UsageError,
    internal_error,
)

if TYPE_CHECKING:
    from ._checker import Policy
    from ._outcomes import ProduceResult
    from ._records import StoredRecord
    from ._values import PartitionStats, ProducerSession

#: Port of ``idem://host`` without an explicit port.
DEFAULT_PORT = 7650

_Decode = Callable[[dict[str, Any]], Any]

#: Operations whose repetition has no further effect: retried after transport errors.
_REPEATABLE = frozenset(wire.SCHEMAS) - {"hello", "init_producer", "produce"}

_LOG = logging.getLogger("idempotent.client")
#: how the message of a connection that could not be made at all begins
_UNREACHABLE = "cannot connect to"


def _same(value: dict[str, Any]) -> dict[str, Any]:
    return value


def _same_error(error: ProducerError) -> ProducerError:
    return error


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


class _Link:
    """One established connection: pending requests by correlation id and the reader thread.

    Callers write requests (one at a time, under ``write_lock``); the reader thread reads
    answers. A TLS socket is non-blocking and every call into it holds ``io_lock``, because
    one SSL connection must not be used by two threads at once.
    """

    def __init__(self, sock: socket.socket, hello: dict[str, Any], address: str, send_timeout: float) -> None:
        self.sock = sock
        self.address = address
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.send_timeout = send_timeout
        if self.tls:
            sock.setblocking(False)
        else:
            sock.settimeout(send_timeout)  # only sends can block: reads wait in select first
        self.io_lock = threading.Lock()
        self.hello = hello
        self.max_frame = int(hello.get("max_frame", wire.DEFAULT_MAX_FRAME))
        offered = hello.get("extensions")
        #: the protocol extensions the server listed (docs/protocol.md)
        self.extensions = frozenset(e for e in offered if type(e) is str) if type(offered) is list else frozenset()
        self.pending: dict[int, tuple[Future[Any], _Decode, float]] = {}
        #: maps an error the server sent before it reaches the caller (set by the owner)
        self.translate: Callable[[ProducerError], ProducerError] = _same_error
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.alive = True
        self.ids = itertools.count(2)
        self.thread = threading.Thread(target=self._read_loop, name="idempotent-client-reader", daemon=True)
        self.thread.start()

    def next_id(self) -> int:
        cid = next(self.ids)
        if cid > wire.MAX_CORRELATION_ID:  # wrap; ids still pending that long ago are long failed
            self.ids = itertools.count(2)
            cid = 1
        return cid

    def submit(self, op: str, args: dict[str, Any], decode: _Decode, timeout: float) -> Future[Any]:
        future: Future[Any] = Future()
        with self.lock:
            if not self.alive:
                future.set_exception(BrokerConnectionError(f"connection to {self.address} is closed"))
                return future
            cid = self.next_id()
            self.pending[cid] = (future, decode, time.monotonic() + timeout)
        try:
            if "keys" in args and "keys" not in self.extensions:  # a server before the extension
                args = wire.without_keys(args)
            data = wire.encode_request(cid, op, args)
        except Exception as exc:  # a value MessagePack cannot carry
            with self.lock:
                self.pending.pop(cid, None)
            future.set_exception(UsageError(f"cannot encode the arguments of {op!r}: {exc}"))
            return future
        if len(data) - 4 > self.max_frame:
            with self.lock:
                self.pending.pop(cid, None)
            future.set_exception(
                InvalidBatchError(f"a {op!r} request of {len(data)} bytes exceeds the broker's frame limit")
            )
            return future
        try:
            with self.write_lock:
                self._send(data)
        except (OSError, ValueError) as exc:
            self.fail(BrokerConnectionError(f"sending to {self.address} failed: {exc}"))
        except BrokerConnectionError as exc:
            self.fail(exc)
        return future

    def _send(self, data: bytes) -> None:
        if not self.tls:
            self.sock.sendall(data)
            return
        view = memoryview(data)
        deadline = time.monotonic() + self.send_timeout
        while view:
            if not self.alive:
                raise BrokerConnectionError(f"sending to {self.address} failed: the connection was closed")
            with self.io_lock:
                try:
                    sent = self.sock.send(view)
                except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                    sent = 0
            if sent:
                view = view[sent:]
                continue
            if time.monotonic() > deadline:
                raise BrokerConnectionError(f"sending to {self.address} failed: blocked for {self.send_timeout:g} s")
            writable = select.poll()
            writable.register(self.sock, select.POLLOUT)
            writable.poll(50)

    def fail(self, error: ProducerError) -> None:
        """Mark the link dead and fail everything pending with ``error``."""
        with self.lock:
            self.alive = False
            pending = list(self.pending.values())
            self.pending.clear()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for future, _, _ in pending:
            if not future.done():
                future.set_exception(error)

    def _read_loop(self) -> None:
        decoder = wire.FrameDecoder(max(self.max_frame, wire.DEFAULT_MAX_FRAME) * 4)
        sock = self.sock
        readable = select.poll()  # not select.select: it fails for descriptors above 1024
        readable.register(sock, select.POLLIN)
        try:
            while self.alive:
                buffered = self.tls and sock.pending()  # type: ignore[attr-defined]
                if not buffered:
                    ready = readable.poll(100)
                    if not ready:
                        self._expire()
                        continue
                if self.tls:
                    with self.io_lock:
                        try:
                            data = sock.recv(1 << 18)
                        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                            continue
                else:
                    data = sock.recv(1 << 18)
                if not data:
                    self.fail(BrokerConnectionError(f"{self.address} closed the connection"))
                    return
                for body in decoder.feed(data):
                    if isinstance(body, wire.FrameTooLarge):
                        self.fail(RemoteProtocolError(f"the broker sent a frame of {body.length} bytes"))
                        return
                    self._deliver(body)
                self._expire()
        except OSError as exc:
            self.fail(BrokerConnectionError(f"connection to {self.address} failed: {exc}"))
        except RemoteProtocolError as exc:
            self.fail(exc)
        except Exception as exc:  # a bug: logged, and no future is left hanging
            self.fail(internal_error(f"reading answers from {self.address}", exc, _LOG))

    def _deliver(self, body: bytes) -> None:
        try:
            frame = msgpack.unpackb(body, raw=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise RemoteProtocolError(f"bad answer from {self.address}: {exc!r}") from None
        if type(frame) is not list or len(frame) != 3 or frame[0] not in (wire.RESPONSE, wire.ERROR):
            raise RemoteProtocolError(f"bad answer from {self.address}: unexpected frame {frame!r:.100}")
        kind, cid, value = frame
        if cid == 0:  # about the connection as a whole: it is about to close
            error = wire.error_from_wire(value) if kind == wire.ERROR else RemoteProtocolError("bad connection frame")
            if isinstance(error, ProducerClosedError | RequestTimeoutError):
                error = BrokerConnectionError(f"{self.address}: {error.message}")
            self.fail(error)
            return
        with self.lock:
            entry = self.pending.pop(cid, None)
        if entry is None:  # timed out earlier
            return
        future, decode, _ = entry
        if kind == wire.ERROR:
            future.set_exception(self.translate(wire.error_from_wire(value)))
            return
        try:
            result = decode(value)
        except Exception as exc:
            future.set_exception(RemoteProtocolError(f"malformed answer from {self.address}: {exc!r}"))
            return
        future.set_result(result)

    def _expire(self) -> None:
        now = time.monotonic()
        expired = []
        with self.lock:
            if not self.pending:
                return
            for cid, (_future, _, deadline) in list(self.pending.items()):
                if deadline < now:
                    expired.append(self.pending.pop(cid)[0])
        for future in expired:
            if not future.done():
                future.set_exception(RequestTimeoutError(f"no answer from {self.address} in time"))


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
        self._link: _Link | None = None
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

    def _current(self) -> _Link:
        link = self._link
        if link is not None and link.alive:
            return link
        return self._connect()

    def _connect(self) -> _Link:
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

    def _open(self) -> _Link:
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
        link = _Link(sock, value, self.address, self.timeout)
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
        self, op: str, args: dict[str, Any], decode: _Decode = _same, timeout: float | None = None
    ) -> Future[Any]:
        """Send one request; return the future of its decoded result (see ``docs/protocol.md``).

        Failures (server errors, I/O) end up on the future, except ProducerClosedError after
        :meth:`close`, which is raised.
        """
        try:
            link = self._current()
        except (BrokerConnectionError, AuthenticationError, ProtocolError, ConfigError) as exc:
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            return failed
        return link.submit(op, args, decode, self.timeout if timeout is None else timeout)

    def call(self, op: str, args: dict[str, Any], decode: _Decode = _same, timeout: float | None = None) -> Any:
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

    def _call_once(self, op: str, args: dict[str, Any], decode: _Decode, timeout: float | None) -> Any:
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

        Raises what the broker raises (see :meth:`idempotent.broker.Broker.init_producer`),
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
        header = request.header
        args = {
            "topic": request.topic,
            "partition": request.partition,
            "producer_id": header.producer_id,
            "producer_epoch": header.producer_epoch,
            "base_sequence": header.base_sequence,
        }
        wire.produce_args(request.records, args)
        if header.previous_sequence is not None:  # absent: the broker applies the rule without it
            args["previous_sequence"] = header.previous_sequence
        future: Future[ProduceResult] = self.submit("produce", args, wire.decode_result)
        return future

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
        brokers; see :meth:`idempotent.broker.Broker.last_sequence`). Raises NotOwnerError
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


def parse_bootstrap(url: str) -> tuple[str, list[str]]:
    """``idem://h1:p1,h2:p2`` (or ``idems://``) -> (scheme, ["h1:p1", "h2:p2"]). Raises ConfigError."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("idem", "idems"):
        raise ConfigError(f"bad broker URL {url!r}: expected idem://host:port[,host:port...]")
    rest = rest.rstrip("/")
    addresses = [a for a in rest.split(",") if a]
    if not addresses:
        raise ConfigError(f"bad broker URL {url!r}: no address")
    out = []
    for address in addresses:
        host, port, _ = parse_url(f"{scheme}://{address}")
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return scheme, out


class ClusterBroker(ProduceShortcuts):
    """The Broker API over several broker servers that share one backend, each owning some
    partitions (``docs/clustering.md``). Thread-safe.

    ``idempotent.connect("idem://h1:p1,h2:p2")`` returns one. It keeps a
    :class:`RemoteBroker` per broker it has talked to, sends each partition's batches to the
    broker that owns it, follows :class:`~idempotent.errors.NotOwnerError` to the owner it
    names, and when a broker cannot be reached, sends to another one, which takes the
    partition over once the dead owner's lease expires. A produce is retried this way for
    up to ``timeout`` seconds; then its future fails with the last error (all retriable).

    Other requests go to any reachable broker (reads are served by every broker); ``stats``
    asks every known broker and joins their answers (each reports the partitions it owns).

    Args:
        url: ``idem://host:port[,host:port...]`` (``idems://`` for TLS): where to start; the
            owners' addresses are learnt from the brokers.
        timeout: seconds a produce or other request may take, redirects included.
        attempt_timeout: seconds to wait for one broker's answer before trying another one
            (a paused or cut-off broker); that broker is then tried last for as long.
        connect_timeout: seconds to try to reach one broker before trying the next.
        options: passed to each :class:`RemoteBroker` (``token``, ``cafile``, ...).

    Raises:
        ConfigError: bad URL or options.
        BrokerConnectionError: none of the brokers could be reached.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        attempt_timeout: float = 10.0,
        connect_timeout: float = 0.5,
        **options: Any,
    ) -> None:
        self._scheme, self._bootstrap = parse_bootstrap(url)
        self._url = url
        if not timeout > 0 or not attempt_timeout > 0:
            raise ConfigError("timeout and attempt_timeout must be positive")
        self.timeout = float(timeout)
        self._quarantine = max(1.0, float(attempt_timeout))
        # each link fails fast; this client does the retrying, on another broker
        self._options = {
            **options,
            "timeout": min(timeout, attempt_timeout),
            "connect_timeout": connect_timeout,
            "retries": 0,
        }
        self._lock = threading.Lock()
        self._links: dict[str, RemoteBroker] = {}
        self._route: dict[tuple[str, int], str] = {}
        self._down: dict[str, float] = {}  # address -> time.monotonic() of its last failure
        self._closed = False
        self._retry_pool = ThreadPoolExecutor(4, thread_name_prefix="idempotent-route")
        self._any()  # fail early when nobody answers

    @property
    def url(self) -> str:
        return self._url

    # -- links -----------------------------------------------------------------------------------

    def _link(self, address: str) -> RemoteBroker:
        with self._lock:
            if self._closed:
                raise ProducerClosedError(f"client for {self._url} is closed")
            link = self._links.get(address)
        if link is not None:
            return link
        try:
            link = RemoteBroker(f"{self._scheme}://{address}", **self._options)
        except BrokerConnectionError:
            self._failed(address)
            raise
        link.routed = True  # this client follows NotOwnerError itself
        with self._lock:
            existing = self._links.setdefault(address, link)
        if existing is not link:
            link.close()
        return existing

    def _failed(self, address: str) -> None:
        """Forget a broker that did not answer: its link, and the partitions routed to it."""
        with self._lock:
            self._down[address] = time.monotonic()
            for tp in [tp for tp, a in self._route.items() if a == address]:
                del self._route[tp]
            link = self._links.pop(address, None)
        if link is not None:  # callers still holding it get a retriable error, not a closed client
            link.close(BrokerConnectionError(f"the connection to {address} was dropped after a failure"))

    def _candidates(self, first: str | None = None) -> list[str]:
        """Addresses to try, best first: ``first``, known live links, the bootstrap list, and
        last the ones that failed recently."""
        with self._lock:
            known = list(self._links)
            down = dict(self._down)
        order = ([first] if first else []) + known + self._bootstrap
        seen: list[str] = []
        for address in order:
            if address not in seen:
                seen.append(address)
        now = time.monotonic()
        recent = {a for a, t in down.items() if now - t < self._quarantine}
        return [a for a in seen if a not in recent] + [a for a in seen if a in recent]

    def _any(self) -> RemoteBroker:
        last: ProducerError | None = None
        for address in self._candidates():
            try:
                return self._link(address)
            except BrokerConnectionError as exc:
                last = exc
        raise last or BrokerConnectionError(f"no broker of {self._url} could be reached")

    def _call(self, fn: Callable[[RemoteBroker], Any]) -> Any:
        """Run a request on any reachable broker, moving on when one cannot be reached."""
        last: ProducerError | None = None
        for address in self._candidates():
            try:
                return fn(self._link(address))
            except (BrokerConnectionError, RequestTimeoutError) as exc:
                self._failed(address)
                last = exc
        raise last or BrokerConnectionError(f"no broker of {self._url} could be reached")

    # -- routing ---------------------------------------------------------------------------------

    def owner(self, topic: str, partition: int) -> str | None:
        """The address this client sends the partition's batches to, or None when unknown.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        topic = canonical_topic(topic)
        with self._lock:
            return self._route.get((topic, partition))

    def metadata(self, topics: Sequence[str] | None = None, *, create: bool = False) -> dict[str, list[str | None]]:
        """Owner address of every partition of ``topics`` (None while nobody owns it), as one
        broker sees it; also remembered for routing."""
        result: dict[str, list[str | None]] = self._call(lambda b: b.metadata(topics, create=create))
        with self._lock:
            for topic, owners in result.items():
                for partition, address in enumerate(owners):
                    if address:
                        self._route[(topic, partition)] = address
        return result

    @property
    def produce_timeout(self) -> float:
        """Seconds :meth:`produce` waits for the answer: the request timeout, and 5 s more."""
        return self.timeout + 5

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        """Send a batch to the partition's owner; return the future of its result. Batches
        of one partition go out in call order; a batch that is redirected or resent after a
        lost connection may arrive after a later one (the checker answers that one
        OUT_OF_ORDER_SEQUENCE, which the producer resends).

        Raises:
            ProducerClosedError: this client is closed.
        """
        out: Future[ProduceResult] = Future()
        deadline = time.monotonic() + self.timeout
        address = self.owner(request.topic, request.partition)  # routes are keyed by the stored name
        with self._lock:
            usable = address is not None and address in self._links and address not in self._down
        if usable:
            assert address is not None
            self._attempt(address, request, out, deadline)  # the common case: in order, no thread hop
        else:
            try:
                self._retry_pool.submit(self._route_and_attempt, request, out, deadline, None)
            except RuntimeError:  # closed meanwhile
                raise ProducerClosedError(f"client for {self._url} is closed") from None
        return out

    def _route_and_attempt(
        self, request: ProduceRequest, out: Future[ProduceResult], deadline: float, hint: str | None
    ) -> None:
        last: ProducerError | None = None
        for address in self._candidates(hint or self.owner(request.topic, request.partition)):
            try:
                self._link(address)
            except BrokerConnectionError as exc:
                last = exc
                continue
            except ProducerError as exc:
                out.set_exception(exc)
                return
            self._attempt(address, request, out, deadline)
            return
        self._later(request, out, deadline, None, last or BrokerConnectionError(f"no broker of {self._url} answers"))

    def _attempt(self, address: str, request: ProduceRequest, out: Future[ProduceResult], deadline: float) -> None:
        try:
            future = self._link(address).submit_request(request)
        except BrokerConnectionError as exc:
            self._failed(address)
            self._later(request, out, deadline, None, exc)
            return
        except ProducerError as exc:
            out.set_exception(exc)
            return
        future.add_done_callback(lambda f: self._answered(address, request, out, deadline, f))

    def _answered(
        self, address: str, request: ProduceRequest, out: Future[ProduceResult], deadline: float, future: Future[Any]
    ) -> None:
        exc = future.exception()
        key = (request.topic, request.partition)
        if exc is None:
            with self._lock:
                self._route[key] = address
                self._down.pop(address, None)
            out.set_result(future.result())
            return
        if isinstance(exc, NotOwnerError):
            owner = exc.owner if exc.owner and exc.owner != address else None
            with self._lock:
                if owner is not None:
                    self._route[key] = owner
                else:
                    self._route.pop(key, None)
                owner_down = owner is not None and time.monotonic() - self._down.get(owner, -1e9) < self._quarantine
            if owner is not None and not owner_down:
                self._later(request, out, deadline, owner, exc, delay=0.0)
            else:  # nobody or a dead broker owns it: ask again until its lease expires
                self._later(request, out, deadline, None, exc)
            return
        lost = isinstance(exc, BrokerConnectionError | RequestTimeoutError)
        if lost:
            self._failed(address)
            self._later(request, out, deadline, None, exc if isinstance(exc, ProducerError) else None)
            return
        out.set_exception(exc)  # anything else is the broker's answer (retriable or not)

    def _later(
        self,
        request: ProduceRequest,
        out: Future[ProduceResult],
        deadline: float,
        hint: str | None,
        error: ProducerError | None,
        delay: float = 0.1,
    ) -> None:
        error = error or BrokerConnectionError(f"no broker of {self._url} answered")
        if time.monotonic() + delay > deadline or self._closed:
            out.set_exception(error)
            return

        def again() -> None:
            if delay:
                time.sleep(delay)
            self._route_and_attempt(request, out, deadline, hint)

        try:
            self._retry_pool.submit(again)
        except RuntimeError:  # closed meanwhile
            out.set_exception(error)

    # -- BrokerAPI -------------------------------------------------------------------------------

    def init_producer(self, producer_name: str | None = None, *, timeout: float = 30.0) -> ProducerSession:
        """Allocate a producer id, or re-initialise a named producer. Its last sequences on
        partitions the answering broker does not own are asked from their owners, so the
        session covers every partition it wrote to.

        Raises what :meth:`RemoteBroker.init_producer` raises.
        """
        session: ProducerSession = self._call(lambda b: b.init_producer(producer_name, timeout=timeout))
        if not session.elsewhere:
            return session
        last = dict(session.last_sequences.items())
        deadline = time.monotonic() + timeout
        for topic, partition in session.elsewhere:
            sequence = self._ask_owner(topic, partition, session, deadline)
            if sequence >= 0:
                last[TopicPartition(topic, partition)] = sequence
        return attrs.evolve(session, last_sequences=LastSequences(last), elsewhere=())

    def _ask_owner(self, topic: str, partition: int, session: ProducerSession, deadline: float) -> int:
        hint = self.owner(topic, partition)
        while True:
            last: ProducerError | None = None
            for address in self._candidates(hint):
                try:
                    return self._link(address).last_sequence(
                        topic, partition, session.producer_id, session.producer_epoch, timeout=self.timeout
                    )
                except NotOwnerError as exc:
                    last = exc
                    if exc.owner and exc.owner != address:
                        hint = exc.owner
                        break
                except (BrokerConnectionError, RequestTimeoutError) as exc:
                    self._failed(address)
                    last = exc
            if time.monotonic() > deadline:
                raise last or RequestTimeoutError(f"no owner of {topic}[{partition}] answered")
            time.sleep(0.1)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self._call(lambda b: b.create_topic(name, partitions))

    def delete_topic(self, name: str) -> None:
        self._call(lambda b: b.delete_topic(name))

    def topics(self) -> dict[str, int]:
        result: dict[str, int] = self._call(lambda b: b.topics())
        return result

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        count: int = self._call(lambda b: b.partitions_for(topic, create=create))
        return count

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        records: list[StoredRecord] = self._call(lambda b: b.read(topic, partition, offset, max_records))
        return records

    def end_offset(self, topic: str, partition: int) -> int:
        offset: int = self._call(lambda b: b.end_offset(topic, partition))
        return offset

    def stats(self, topic: str | None = None) -> list[PartitionStats]:
        """Every reachable broker's stats (each covers the partitions it owns), joined."""
        out: dict[tuple[str, int], PartitionStats] = {}
        now = time.monotonic()
        with self._lock:
            down = {a for a, t in self._down.items() if now - t < self._quarantine}
        for address in self._candidates():
            if address in down:
                continue
            try:
                for stat in self._link(address).stats(topic):
                    out.setdefault((stat.topic, stat.partition), stat)
            except (BrokerConnectionError, RequestTimeoutError):
                self._failed(address)
        return [out[k] for k in sorted(out)]

    def set_deduplication(
        self, enabled: bool | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        self._call(lambda b: b.set_deduplication(enabled, topic=topic, namespace=namespace))

    def set_policy(
        self, policy: Policy | str | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        self._call(lambda b: b.set_policy(policy, topic=topic, namespace=namespace))

    def close(self) -> None:
        """Close every connection; produce requests still in flight fail."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            links, self._links = list(self._links.values()), {}
        # queued routing jobs still run: they find the client closed and fail their futures
        self._retry_pool.shutdown(wait=False)
        for link in links:
            link.close()

    def __enter__(self) -> ClusterBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_PORT", "ClusterBroker", "RemoteBroker", "parse_bootstrap", "parse_url"]
