"""One client connection of the broker server: :class:`Connection`, the asyncio protocol
that frames, gates the handshake and applies flow control, on the server's loop thread.
Internal to :mod:`idempotent.server`, which owns the connections and hands their requests on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections import deque
from typing import TYPE_CHECKING

from . import _protocol as wire
from .errors import LocalProtocolError, ProducerClosedError, RequestTimeoutError

if TYPE_CHECKING:
    from .server import BrokerServer


#: bytes one read takes from a socket: the loop reads every connection into one buffer of
#: this size (asyncio's default reader makes a new 256 KiB bytes object per read)
READ_BUFFER = 256 * 1024


class Connection(asyncio.BufferedProtocol):
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


def held(conn: Connection) -> bool:
    """A connection whose peer does not read its answers waits (FairQueue's ``held``)."""
    return conn.write_paused and not conn.closing


__all__ = ["READ_BUFFER", "Connection", "held"]
