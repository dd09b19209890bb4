"""One connection of the network client to a broker server: :class:`Link`.

A :class:`~idempotent.net.client.RemoteBroker` holds one :class:`Link` at a time (and opens a new
one after a failure). The link writes requests (any thread, one write at a time) and runs a
reader thread that completes each request's future by its correlation id, expires requests
past their timeout, and fails everything pending when the connection breaks. Internal to the
client; its public names are in :mod:`idempotent.net.client`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import msgpack

import idempotent.core.protocol as wire
from idempotent.core.request import ProduceRequest
from idempotent.errors import (
    BrokerConnectionError,
    InvalidBatchError,
    ProducerClosedError,
    ProducerError,
    RemoteProtocolError,
    RequestTimeoutError,
    UsageError,
    internal_error,
)
from idempotent.runtime.future import LightFuture

#: turns an answer's result map into the value the caller gets
Decode = Callable[[dict[str, Any]], Any]
#: a request to send: its operation, its arguments (a map, or the ProduceRequest of a
#: ``produce``), and how to decode its answer
Outgoing = tuple[str, "dict[str, Any] | ProduceRequest", Decode]

log = logging.getLogger("idempotent.net.client")


def _same_error(error: ProducerError) -> ProducerError:
    return error


class Link:
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
        self.pending: dict[int, tuple[Future[Any], Decode, float]] = {}
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

    def submit(self, op: str, args: dict[str, Any] | ProduceRequest, decode: Decode, timeout: float) -> Future[Any]:
        """Send one request; return the future of its decoded answer (see :meth:`submit_many`)."""
        return self.submit_many([(op, args, decode)], timeout)[0]

    def submit_many(self, requests: Sequence[Outgoing], timeout: float) -> list[Future[Any]]:
        """Send requests, in order, in one write; return the futures of their decoded
        answers. A ``produce`` may be given as its :class:`ProduceRequest`, encoded here
        straight from it (a batch of :class:`~idempotent.core.records.RecordColumns` as its
        columns, with no object per record). Failures end up on the futures: a request that
        cannot be encoded or exceeds the server's frame limit fails alone, a failed write
        fails the link (and everything pending on it)."""
        futures: list[Future[Any]] = [LightFuture() for _ in requests]
        with self.lock:
            if not self.alive:
                error = BrokerConnectionError(f"connection to {self.address} is closed")
                for future in futures:
                    future.set_exception(error)
                return futures
            deadline = time.monotonic() + timeout
            cids = []
            for future, (_, _, decode) in zip(futures, requests, strict=True):
                cid = self.next_id()
                self.pending[cid] = (future, decode, deadline)
                cids.append(cid)
        keys = "keys" in self.extensions
        frames: list[bytes] = []
        for cid, future, (op, args, _) in zip(cids, futures, requests, strict=True):
            try:
                if type(args) is ProduceRequest:
                    data = wire.encode_produce(cid, args, keys=keys)
                else:
                    assert isinstance(args, dict)
                    if "keys" in args and not keys:  # a server before the extension
                        args = wire.without_keys(args)
                    data = wire.encode_request(cid, op, args)
            except Exception as exc:  # a value MessagePack cannot carry
                self._forget(cid)
                future.set_exception(UsageError(f"cannot encode the arguments of {op!r}: {exc}"))
                continue
            if len(data) - 4 > self.max_frame:
                self._forget(cid)
                future.set_exception(
                    InvalidBatchError(f"a {op!r} request of {len(data)} bytes exceeds the broker's frame limit")
                )
                continue
            frames.append(data)
        if not frames:
            return futures
        try:
            with self.write_lock:
                self._send(frames[0] if len(frames) == 1 else b"".join(frames))
        except (OSError, ValueError) as exc:
            self.fail(BrokerConnectionError(f"sending to {self.address} failed: {exc}"))
        except BrokerConnectionError as exc:
            self.fail(exc)
        return futures

    def _forget(self, cid: int) -> None:
        with self.lock:
            self.pending.pop(cid, None)

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
            self.fail(internal_error(f"reading answers from {self.address}", exc, log))

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


__all__ = ["Decode", "Link", "Outgoing"]
