"""The broker server: the Broker API over TCP (optionally TLS), for many clients at once.

An asyncio shell around the pure :mod:`idempotent.core.protocol` and an in-process
:class:`~idempotent.broker.broker.Broker` (see ``docs/protocol.md`` for the wire format)::

    server = BrokerServer(idempotent.connect("sqlite:///log.db"), "127.0.0.1", 0)
    server.start()                 # serves from a background thread
    print(server.address)          # "127.0.0.1:54321"
    ...
    server.close()                 # stop accepting, answer what is in flight, close the broker

Threads: one event loop thread does all socket I/O and framing, and parses each request once
(:func:`idempotent.core.protocol.parse_request`: a ``produce`` becomes the one
:class:`~idempotent.core.request.ProduceRequest` the broker takes). Produce requests go to a
fixed set of *lanes* (threads), a partition always to the same lane, so batches of one
partition reach ``Broker.submit_request`` in the order they arrived, across connections; the
requests of one pass of the loop reach a lane as one group (one hand-off, not one per
batch). Handshakes (``hello``) and ``ping`` run on their own small pool, so they never wait
behind other work. Every other request goes to a :class:`~idempotent.net.fairqueue.FairQueue`
served by the worker threads one connection at a time in turn, so one client's backlog delays
another client by at most one request. Answers go back through the loop: whichever thread
finishes a request queues its answer, and the loop is woken once for everything queued
since it last looked (produce answers are encoded there).

Backpressure: a connection stops being read while it has ``max_in_flight`` requests
unanswered or while its peer does not read its answers; the workers skip a connection whose
peer does not read its answers; the server as a whole stops reading every connection while
``max_pending`` requests are queued. What a connection queued is dropped when it closes. A
``read`` fetches at most ``read_chunk`` records from the backend (and answers at most half
a frame of them), so no request holds the backend for long.

Hooks: an ``authenticator`` turns the handshake's token into a principal (or raises) before
anything else happens on the connection; an ``authorizer`` sees ``(principal, op, args)``
before every request runs and may refuse it by raising; an ``owner_of`` callable says which
broker (``host:port``) owns a partition, and a produce for a partition owned elsewhere is
answered with :class:`~idempotent.errors.NotOwnerError`. Without one, a broker configured with a
``broker_id`` (several brokers over one backend, ``docs/clustering.md``) answers from its
ownership records: ``metadata`` gives each partition's owner (None while nobody holds it), and
the broker raises NotOwnerError itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import signal
import socket
import ssl
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import idempotent.core.protocol as wire
import idempotent.net.ops as ops
from idempotent import __version__
from idempotent.broker.broker import Broker
from idempotent.core.outcomes import ProduceResult
from idempotent.errors import (
    AuthenticationError,
    ConfigError,
    LocalProtocolError,
    NotOwnerError,
    ProducerClosedError,
    ProducerError,
    RequestTimeoutError,
    internal_error,
)
from idempotent.net.auth import ANONYMOUS, Principal
from idempotent.net.config import (
    Authenticator,
    Authorizer,
    Claimer,
    ServerConfig,
    allow_all,
    allow_anonymous,
    parse_listen,
    server_ssl_context,
)
from idempotent.net.fairqueue import FairQueue
from idempotent.net.ops import produce_args, produced

log = logging.getLogger("idempotent.net.server")


#: bytes one read takes from a socket: the loop reads every connection into one buffer of
#: this size (asyncio's default reader makes a new 256 KiB bytes object per read)
READ_BUFFER = 256 * 1024


class _Connection(asyncio.BufferedProtocol):
    """One client connection: framing, handshake, flow control. Runs on the loop thread.

    Reads land in the server's one read buffer (:meth:`get_buffer`); the frame decoder
    copies what it keeps before the next read."""

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.decoder = wire.FrameDecoder(server.config.max_frame)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.principal: object = None
        self.greeted = False
        self.greeting = False
        self.closing = False
        self.in_flight = 0
        self.backlog: deque[bytes] = deque()
        self.out: list[bytes] = []
        self.flush_scheduled = False
        self.write_paused = False
        self.read_paused = False
        self.eof = False
        now = time.monotonic()
        self.opened_at = now
        self.last_frame_at = now
        self.partial_since: float | None = None

    # -- asyncio.BufferedProtocol ------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.server._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.server._read_buffer[:nbytes])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.server._connections.add(self)
        if self.server._draining:
            self.fail(wire.encode_error(0, ProducerClosedError("the broker server is shutting down")))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server._work.drop(self)  # nobody is left to answer
        self.server._connections.discard(self)
        self.server._paused.discard(self)
        self.server._pending -= len(self.backlog)
        self.backlog.clear()
        self.server._resume_all()

    def data_received(self, data: bytes | memoryview) -> None:
        if self.closing:
            return
        frames = self.decoder.feed(data)
        for item in frames:
            if isinstance(item, wire.FrameTooLarge):
                self.fail(
                    wire.encode_error(
                        0, LocalProtocolError(f"frame of {item.length} bytes exceeds the limit of {item.limit}")
                    )
                )
                return
            self.backlog.append(item)
            self.server._pending += 1
        now = time.monotonic()
        if frames:
            self.last_frame_at = now
        if not self.decoder.buffered:
            self.partial_since = None
        elif self.partial_since is None or frames:  # a new frame started
            self.partial_since = now
        self.pump()

    def eof_received(self) -> bool:
        """The peer finished sending: answer what it sent, then close (half-close)."""
        self.eof = True
        if self.decoder.buffered:  # a frame that can never complete
            self.fail(wire.encode_error(0, LocalProtocolError("connection ended inside a frame")))
        else:
            self.close_if_done()
        return self.server.ssl_context is None  # TLS cannot half-close: the transport closes

    def close_if_done(self) -> None:
        if self.eof and not self.in_flight and not self.backlog and self.transport is not None and not self.closing:
            self.flush()
            self.closing = True
            self.transport.close()

    def pause_writing(self) -> None:
        self.write_paused = True
        self.update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.server._work.wake()  # the workers skipped this connection while it was paused
        self.update_reading()

    # -- request flow ------------------------------------------------------------------------

    def pump(self) -> None:
        """Dispatch backlogged frames while the in-flight limit allows."""
        limit = self.server.config.max_in_flight
        while self.backlog and self.in_flight < limit and not self.closing:
            if self.greeting:  # nothing else runs before the handshake has been answered
                break
            body = self.backlog.popleft()
            self.server._pending -= 1
            self.handle(body)
        self.update_reading()
        self.close_if_done()

    def update_reading(self) -> None:
        if self.transport is None or self.closing:
            return
        server = self.server
        want_pause = (
            self.write_paused
            or self.in_flight + len(self.backlog) >= server.config.max_in_flight
            or server._pending >= server.config.max_pending
            or server._draining
        )
        if want_pause and not self.read_paused:
            self.read_paused = True
            server._paused.add(self)
            self.transport.pause_reading()
        elif not want_pause and self.read_paused:
            self.read_paused = False
            server._paused.discard(self)
            self.transport.resume_reading()

    def handle(self, body: bytes) -> None:
        request = wire.parse_request(body)
        if type(request) is wire.Produce and self.greeted:  # the common case first
            self.in_flight += 1
            self.server._dispatch_produce(self, request)
            return
        if isinstance(request, wire.BadRequest):
            error = request.error
            if not self.greeted and request.op != "hello":
                error = LocalProtocolError("the first request must be 'hello'")
            frame = wire.encode_error(request.correlation_id, error)
            if request.fatal or not self.greeted:  # a refused first request ends the connection
                self.fail(frame)
            else:
                self.send(frame)
            return
        if not self.greeted:
            if not isinstance(request, wire.Request) or request.op != "hello":
                self.fail(
                    wire.encode_error(request.correlation_id, LocalProtocolError("the first request must be 'hello'"))
                )
                return
            self.greeting = True
            self.in_flight += 1
            self.server._control.submit(self.server._hello, self, request)
            return
        assert isinstance(request, wire.Request)
        if request.op == "hello":
            self.send(wire.encode_error(request.correlation_id, LocalProtocolError("'hello' was already answered")))
            return
        self.in_flight += 1
        self.server._dispatch(self, request)

    def answered(self, frame: bytes, *, greeted: object = None, fatal: bool = False) -> None:
        """A worker finished a request (called on the loop thread)."""
        self.in_flight -= 1
        if self.greeting:
            self.greeting = False
            if not fatal:
                self.greeted = True
                self.principal = greeted
        if fatal:
            self.fail(frame)
            return
        self.send(frame)
        self.pump()
        self.close_if_done()
        self.server._request_done()

    def send(self, frame: bytes) -> None:
        if self.closing or self.transport is None:
            return
        self.out.append(frame)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.server._flush_later(self)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.out and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self.out)
            self.out.clear()
            self.transport.write(data)

    def fail(self, frame: bytes) -> None:
        """Send a last error frame and close (after what is queued for the peer)."""
        if self.closing or self.transport is None:
            return
        self.out.append(frame)
        self.flush()
        self.closing = True
        self.server._pending -= len(self.backlog)
        self.backlog.clear()
        self.server._work.drop(self)
        self.transport.close()

    def check_timeouts(self, now: float) -> None:
        cfg = self.server.config
        if self.closing:
            return
        if not self.greeted and not self.greeting and now - self.opened_at > cfg.handshake_timeout:
            self.fail(wire.encode_error(0, LocalProtocolError(f"no 'hello' within {cfg.handshake_timeout:g} s")))
        elif self.partial_since is not None and now - self.partial_since > cfg.frame_timeout:
            self.fail(
                wire.encode_error(0, LocalProtocolError(f"a frame took longer than {cfg.frame_timeout:g} s to arrive"))
            )
        elif self.in_flight == 0 and not self.backlog and now - self.last_frame_at > cfg.idle_timeout:
            self.fail(wire.encode_error(0, RequestTimeoutError(f"connection idle for {cfg.idle_timeout:g} s")))


class BrokerServer:
    """Serves a :class:`~idempotent.broker.broker.Broker` over TCP (or TLS with ``ssl_context``).

    Args:
        broker: the broker to serve; closed by :meth:`close` when ``close_broker``.
        host, port: where to listen; port 0 picks a free port (see :attr:`address`).
        ssl_context: a server-side :class:`ssl.SSLContext` to serve TLS (``idems://``).
        authenticator: token -> principal, raising to refuse (default: anonymous for all).
        authorizer: ``(principal, op, args)`` -> None, raising to refuse (default: allow).
        claim: ``(principal, producer_name, previous record)`` -> owner, raising to refuse;
            runs inside ``init_producer`` under the broker lock (default: an existing
            producer keeps its owner, a new one is unowned). See :class:`Claimer`.
        owner_of: ``(topic, partition)`` -> owning broker address or None when unknown
            (default: this broker owns everything).
        advertised_address: the ``host:port`` clients should use for this broker (metadata);
            default: the listening address.
        config: limits and timeouts.

    Raises:
        ConfigError: bad limits.
    """

    def __init__(
        self,
        broker: Broker,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        ssl_context: ssl.SSLContext | None = None,
        authenticator: Authenticator | None = None,
        authorizer: Authorizer | None = None,
        claim: Claimer | None = None,
        owner_of: Callable[[str, int], str | None] | None = None,
        advertised_address: str | None = None,
        config: ServerConfig | None = None,
        close_broker: bool = True,
    ) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.authenticator: Authenticator = authenticator or allow_anonymous
        self.authorizer: Authorizer = authorizer or allow_all
        self.claim = claim
        self.owner_of = owner_of
        self.config = config or ServerConfig()
        self.close_broker = close_broker
        self._advertised = advertised_address
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._pending = 0
        self._draining = False
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._control = ThreadPoolExecutor(self.config.control_workers, thread_name_prefix="idempotent-control")
        self._work: FairQueue[_Connection, wire.Request] = FairQueue(_held)
        self._workers: list[threading.Thread] = []
        self._lanes: list[queue.SimpleQueue[list[tuple[_Connection, wire.Produce]] | None]] = []
        self._lane_threads: list[threading.Thread] = []
        #: produce requests read in this pass of the loop, per lane, handed over at its end
        self._lane_pending: list[list[tuple[_Connection, wire.Produce]]] = [[] for _ in range(self.config.lanes)]
        self._lanes_due = False
        #: answers finished on other threads, for the loop to send: (connection, correlation
        #: id, a produce's future or a ready frame, keywords of _Connection.answered)
        self._answers: deque[tuple[_Connection, int, Future[ProduceResult] | bytes, dict[str, Any] | None]] = deque()
        self._answers_due = False
        #: connections whose reading is paused (see _Connection.update_reading)
        self._paused: set[_Connection] = set()
        #: connections with answers to write at the end of this pass of the loop
        self._unflushed: list[_Connection] = []
        self._flush_due = False
        self._read_buffer = memoryview(bytearray(READ_BUFFER))
        self._closed = False
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` this server listens on (after :meth:`start`)."""
        return f"{self.host}:{self.port}"

    @property
    def advertised_address(self) -> str:
        """The address metadata gives for this broker."""
        return self._advertised or self.address

    @property
    def connection_count(self) -> int:
        """How many client connections are open now."""
        return len(self._connections)

    @property
    def url(self) -> str:
        """``idem://host:port`` (``idems://`` with TLS) for :func:`idempotent.connect`."""
        return f"{'idems' if self.ssl_context else 'idem'}://{self.address}"

    def start(self) -> BrokerServer:
        """Listen and serve from a background thread; return once listening.

        Raises:
            ConfigError: the address cannot be bound.
        """
        self._thread = threading.Thread(target=self._run_thread, name="idempotent-server-loop", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {self._start_error}")
        return self

    def _run_thread(self) -> None:
        asyncio.run(self.serve())

    def run(self, on_ready: Callable[[BrokerServer], None] | None = None) -> None:
        """Serve in this thread until SIGTERM/SIGINT (or :meth:`close`), then shut down.

        ``on_ready`` is called (on the loop thread) once the server listens.

        Raises:
            ConfigError: the address cannot be bound.
        """
        asyncio.run(self.serve(handle_signals=True, on_ready=on_ready))
        if self._start_error is not None:
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {self._start_error}")

    async def serve(
        self, *, handle_signals: bool = False, on_ready: Callable[[BrokerServer], None] | None = None
    ) -> None:
        """Serve on the running loop until :meth:`close` (or a signal), then drain and stop."""
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        try:
            self._server = await self._loop.create_server(
                lambda: _Connection(self),
                self.host,
                self.port,
                ssl=self.ssl_context,
                reuse_address=True,
                backlog=512,
            )
        except OSError as exc:
            self._start_error = exc
            self._ready.set()
            return
        sock = self._server.sockets[0]
        self.host, self.port = sock.getsockname()[:2]
        for i in range(self.config.lanes):
            lane: queue.SimpleQueue[list[tuple[_Connection, wire.Produce]] | None] = queue.SimpleQueue()
            thread = threading.Thread(target=self._lane_loop, args=(lane,), name=f"idempotent-lane-{i}", daemon=True)
            thread.start()
            self._lanes.append(lane)
            self._lane_threads.append(thread)
        for i in range(self.config.workers):
            thread = threading.Thread(target=self._work_loop, name=f"idempotent-worker-{i}", daemon=True)
            thread.start()
            self._workers.append(thread)
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    self._loop.add_signal_handler(sig, self._stopped.set)
        self._sweeper = asyncio.create_task(self._sweep())
        self._ready.set()
        log.info("serving %s on %s", self.broker.url, self.address)
        if on_ready is not None:
            on_ready(self)
        await self._stopped.wait()
        await self._shutdown()

    async def _sweep(self) -> None:
        cfg = self.config
        period = max(0.01, min(cfg.handshake_timeout, cfg.idle_timeout, cfg.frame_timeout, 1.0) / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self._connections):
                conn.check_timeouts(now)

    async def _shutdown(self) -> None:
        self._draining = True
        self._work.stop_holding()  # answer everything already read, even to peers that do not read
        assert self._server is not None
        self._server.close()
        for conn in list(self._connections):
            conn.update_reading()
        deadline = time.monotonic() + self.config.drain_timeout
        while any(c.in_flight for c in self._connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self._connections):
            conn.flush()
            conn.fail(wire.encode_error(0, ProducerClosedError("the broker server is shutting down")))
        if self._sweeper is not None:
            self._sweeper.cancel()
        for lane in self._lanes:
            lane.put(None)
        await self._loop.run_in_executor(None, self._stop_threads)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    def _stop_threads(self) -> None:
        for thread in self._lane_threads:
            thread.join(10)
        self._work.close()
        for thread in self._workers:
            thread.join(10)
        self._control.shutdown(wait=True)
        if self.close_broker:
            self.broker.close()

    def close(self) -> None:
        """Stop accepting, answer the requests in flight (up to ``drain_timeout``), close
        every connection, then close the broker (when ``close_broker``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and self._stopped is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.config.drain_timeout + 30)

    def __enter__(self) -> BrokerServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatch (loop thread) ---------------------------------------------------------------

    def _request_done(self) -> None:
        if self._pending < self.config.max_pending:
            self._resume_all()

    def _resume_all(self) -> None:
        if self._paused:
            for conn in list(self._paused):
                conn.update_reading()

    def _dispatch_produce(self, conn: _Connection, produce: wire.Produce) -> None:
        """Queue a produce request for its partition's lane; the requests of one pass of
        the loop are handed to each lane at its end, as one group."""
        request = produce.request
        self._lane_pending[(zlib.crc32(request.topic.encode()) + request.partition) % len(self._lanes)].append(
            (conn, produce)
        )
        if not self._lanes_due:
            self._lanes_due = True
            self._loop.call_soon(self._hand_to_lanes)

    def _hand_to_lanes(self) -> None:
        self._lanes_due = False
        pending = self._lane_pending
        for index, group in enumerate(pending):
            if group:
                pending[index] = []
                self._lanes[index].put(group)

    def _dispatch(self, conn: _Connection, request: wire.Request) -> None:
        if request.op == "ping":
            self._control.submit(self._run_request, conn, request)
        else:
            self._work.put(conn, request)

    def _work_loop(self) -> None:
        while (item := self._work.get()) is not None:
            conn, request = item
            if conn.closing:  # closed since it was queued: nobody would read the answer
                continue
            self._run_request(conn, request)

    # -- workers ---------------------------------------------------------------------------------

    def _reply(self, conn: _Connection, frame: bytes, **kw: Any) -> None:
        self._post(conn, 0, frame, kw or None)

    def _post(
        self, conn: _Connection, cid: int, answer: Future[ProduceResult] | bytes, kw: dict[str, Any] | None
    ) -> None:
        """Queue an answer for the loop (any thread); wake the loop unless a wake-up is due.

        The loop clears ``_answers_due`` before it empties the queue, so an answer queued
        while it is emptying is either taken by it or wakes it again: none is left behind.
        """
        self._answers.append((conn, cid, answer, kw))
        if not self._answers_due:
            self._answers_due = True
            # a RuntimeError means the loop is gone (hard stop): nobody is left to answer
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._send_answers)

    def _send_answers(self) -> None:
        """Send every queued answer (loop thread), each connection's in one write."""
        self._answers_due = False
        due, self._flush_due = self._flush_due, True  # written below, not in a pass of their own
        answers = self._answers
        try:
            while answers:
                conn, cid, answer, kw = answers.popleft()
                frame = answer if type(answer) is bytes else produced(cid, answer)  # type: ignore[arg-type]
                if kw is None:
                    conn.answered(frame)
                else:
                    conn.answered(frame, **kw)
        finally:
            if not due:
                self._flush_all()

    def _flush_later(self, conn: _Connection) -> None:
        """Write ``conn``'s answers at the end of this pass of the loop (loop thread)."""
        self._unflushed.append(conn)
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush_all)

    def _flush_all(self) -> None:
        self._flush_due = False
        unflushed, self._unflushed = self._unflushed, []
        for conn in unflushed:
            conn.flush()

    def _hello(self, conn: _Connection, request: wire.Request) -> None:
        try:
            self._greet(conn, request)
        except Exception as exc:  # a bug: logged; the connection still gets its answer
            error = internal_error("answering hello", exc, log)
            self._reply(conn, wire.encode_error(request.correlation_id, error), fatal=True)

    def _greet(self, conn: _Connection, request: wire.Request) -> None:
        args = request.args
        cid = request.correlation_id
        if args["version"] not in wire.SUPPORTED_VERSIONS:
            error = LocalProtocolError(
                f"protocol version {args['version']} is not supported; this broker speaks "
                f"{sorted(wire.SUPPORTED_VERSIONS)}"
            )
            self._reply(conn, wire.encode_error(cid, error), fatal=True)
            return
        try:
            principal = self.authenticator(args["token"])
        except ProducerError as exc:
            self._reply(conn, wire.encode_error(cid, exc), fatal=True)
            return
        except Exception as exc:  # a hook's own failure: its text may repeat the token, so only its type
            # a bug of the authenticator: logged (its type only) and refused for good, never retried
            log.error("the authenticator failed with %s; the client is refused", type(exc).__name__)
            refused = AuthenticationError(f"authentication failed ({type(exc).__name__} in the authenticator)")
            self._reply(conn, wire.encode_error(cid, refused), fatal=True)
            return
        result = {
            "version": wire.PROTOCOL_VERSION,
            "server": f"idempotent/{__version__}",
            "broker": self.advertised_address,
            "max_frame": self.config.max_frame,
            "max_in_flight": self.config.max_in_flight,
            "principal": _principal_name(principal),
            "extensions": list(wire.EXTENSIONS),
        }
        self._reply(conn, wire.encode_response(cid, result), greeted=principal)

    def _lane_loop(self, lane: queue.SimpleQueue[list[tuple[_Connection, wire.Produce]] | None]) -> None:
        while (group := lane.get()) is not None:
            for conn, produce in group:
                self._submit_produce(conn, produce)

    def _submit_produce(self, conn: _Connection, produce: wire.Produce) -> None:
        """Hand one parsed batch to the broker; its answer comes back through :meth:`_post`."""
        request, cid = produce.request, produce.correlation_id
        try:
            if self.authorizer is not allow_all:
                self.authorizer(conn.principal, "produce", produce_args(request))
            if self.owner_of is not None:
                self._check_owner(request.topic, request.partition)
            future = self.broker.submit_request(request)  # parsed once, at the edge: trusted here
        except ProducerError as exc:
            self._post(conn, cid, wire.encode_error(cid, exc), None)
            return
        except Exception as exc:  # a bug: logged, answered FATAL (never retried)
            self._post(conn, cid, wire.encode_error(cid, internal_error("submitting a produce", exc, log)), None)
            return
        future.add_done_callback(functools.partial(self._post, conn, cid, kw=None))

    def _check_owner(self, topic: str, partition: int) -> None:
        if self.owner_of is None:
            return  # a broker with a broker_id answers NotOwnerError itself (and claims free partitions)
        owner = self.owner_of(topic, partition)
        if owner != self.advertised_address:
            raise NotOwnerError(
                f"{topic}[{partition}] is owned by {owner or 'an unknown broker'}, not {self.advertised_address}",
                topic,
                partition,
                owner or "",
            )

    def _run_request(self, conn: _Connection, request: wire.Request) -> None:
        cid = request.correlation_id
        try:
            self.authorizer(conn.principal, request.op, request.args)
            result = self._call(request.op, request.args, conn.principal)
            frame = wire.encode_response(cid, result)
        except ProducerError as exc:
            frame = wire.encode_error(cid, exc)
        except Exception as exc:  # a bug: logged, answered FATAL (never retried)
            frame = wire.encode_error(cid, internal_error(f"serving {request.op!r}", exc, log))
        self._reply(conn, frame)

    def _call(self, op: str, a: dict[str, Any], principal: object = ANONYMOUS) -> dict[str, Any]:
        return ops.call(
            op,
            a,
            principal,
            broker=self.broker,
            config=self.config,
            claim=self.claim,
            owner_of=self.owner_of,
            address=self.advertised_address,
        )


def _held(conn: _Connection) -> bool:
    """A connection whose peer does not read its answers waits (FairQueue's ``held``)."""
    return conn.write_paused and not conn.closing


def _principal_name(principal: object) -> str | None:
    name = getattr(principal, "name", None)
    return None if name is None else str(name)


__all__ = [
    "ANONYMOUS",
    "READ_BUFFER",
    "Authenticator",
    "Authorizer",
    "BrokerServer",
    "Claimer",
    "Principal",
    "ServerConfig",
    "allow_all",
    "allow_anonymous",
    "parse_listen",
    "produce_args",
    "server_ssl_context",
]
