"""A TCP proxy that loses the answer to chosen requests, for native-client fault tests.

Kafka's and Pulsar's wire protocols frame every request and response with a 4-byte
big-endian length. :class:`CutProxy` forwards both directions frame by frame. When a
client-to-broker frame matches ``cut`` (a Kafka Produce request, a Pulsar SEND command), the
proxy forwards it, waits for the broker's answer to it, drops that answer and closes both
connections. The broker has then
processed the request (a produce is stored) while the client saw only a broken connection,
which is exactly the case where a client must decide between resending (and possibly
duplicating) and giving up (and possibly losing). ``cuts`` bounds how many requests are cut;
after that the proxy forwards everything.

Clients must keep talking through the proxy after their first request, but both brokers
hand out their own address: Kafka in metadata, Pulsar in topic lookups. For Kafka, run the
proxy on the ``proxy_port`` the test service advertises for its second listener
(:class:`~idempotent.testing.services.ServiceInfo`), forwarding to its ``relay_port``. For
Pulsar, ``rewrite`` replaces the broker's address in lookup answers by the proxy's (same
length, so the frame stays valid): :func:`pulsar_rewrite`.

:meth:`CutProxy.blackhole` makes the link silent, as a network that drops every packet
does: nothing is forwarded in either direction and new connections get no answer, while the
connections stay open; :meth:`CutProxy.restore` lets everything held back through, in order
(as TCP retransmission delivers it once the network is back).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable

__all__ = ["CutProxy", "kafka_produce", "pulsar_rewrite", "pulsar_send"]

#: A matcher gets a request frame (without its length prefix) and returns, when the request
#: is to be cut, a predicate that recognises the broker's answer to it (else None).
Matcher = Callable[[bytes], Callable[[bytes], bool] | None]


def kafka_produce(frame: bytes) -> Callable[[bytes], bool] | None:
    """Matches a Kafka Produce request (API key 0); its answer starts with the same
    correlation id."""
    if len(frame) < 8 or struct.unpack(">h", frame[:2])[0] != 0:
        return None
    correlation = frame[4:8]
    return lambda answer: answer[:4] == correlation


_PULSAR_SEND = b"\x08\x06"  # BaseCommand.type = SEND (field 1, varint 6)
_PULSAR_SEND_RECEIPT = b"\x08\x07"


def pulsar_send(frame: bytes) -> Callable[[bytes], bool] | None:
    """Matches a Pulsar SEND command; the next SEND_RECEIPT answers it (the first cut SEND is
    the connection's first, so no earlier receipt is outstanding)."""
    if frame[4:6] != _PULSAR_SEND:
        return None
    return lambda answer: answer[4:6] == _PULSAR_SEND_RECEIPT


def pulsar_rewrite(broker_port: int, proxy_port: int, host: str = "127.0.0.1") -> Callable[[bytes], bytes]:
    """Replace the broker's address by the proxy's in Pulsar answers (lookups)."""
    old, new = f"{host}:{broker_port}".encode(), f"{host}:{proxy_port}".encode()
    if len(old) != len(new):
        raise ValueError("broker and proxy ports must have the same number of digits")
    return lambda frame: frame.replace(old, new)


def _read_exact(sock: socket.socket, count: int) -> bytes | None:
    data = bytearray()
    while len(data) < count:
        try:
            chunk = sock.recv(count - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exact(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    if size < 0:
        return None
    body = _read_exact(sock, size)
    return None if body is None else head + body


class _Link:
    def __init__(self, proxy: CutProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.answer: Callable[[bytes], bool] | None = None
        self.lock = threading.Lock()

    def close(self) -> None:
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def requests(self) -> None:
        while True:
            frame = _read_frame(self.client)
            if frame is None:
                break
            self.proxy.wait_open()
            match = self.proxy.cut(frame[4:])
            # one cut per link: a second armed cut waits for the next connection (taken here, it
            # would replace the first one's matcher and be lost with the link)
            if match is not None and self.answer is None and self.proxy.take_cut():
                with self.lock:
                    self.answer = match
            try:
                self.upstream.sendall(frame)
            except OSError:
                break
        self.close()

    def responses(self) -> None:
        while True:
            frame = _read_frame(self.upstream)
            if frame is None:
                break
            self.proxy.wait_open()
            with self.lock:
                answer = self.answer
            if answer is not None and answer(frame[4:]):
                self.proxy.record_cut()
                break  # the broker processed the request; the client never hears of it
            if self.proxy.rewrite is not None:
                frame = self.proxy.rewrite(frame)
            try:
                self.client.sendall(frame)
            except OSError:
                break
        self.close()


class CutProxy:
    """Forward ``127.0.0.1:listen_port`` to ``127.0.0.1:target_port``, cutting the connection
    after the first ``cuts`` requests that ``cut`` matches have been processed by the broker.

    ``cut`` is a :data:`Matcher` (:func:`kafka_produce`, :func:`pulsar_send`); ``rewrite``
    transforms every answer frame before it is forwarded (:func:`pulsar_rewrite`).
    ``injected`` counts the answers dropped.
    """

    def __init__(
        self,
        listen_port: int,
        target_port: int,
        cut: Matcher = kafka_produce,
        cuts: int = 0,
        rewrite: Callable[[bytes], bytes] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.target = (host, target_port)
        self.cut = cut
        self.rewrite = rewrite
        self._remaining = cuts
        self.injected = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._server = socket.create_server((host, listen_port), reuse_port=False)
        self._server.settimeout(0.2)
        self.port: int = self._server.getsockname()[1]
        self._closed = False
        self._open = threading.Event()  # cleared while the link is a blackhole
        self._open.set()
        self._thread = threading.Thread(target=self._accept, name="cut-proxy", daemon=True)
        self._thread.start()

    def take_cut(self) -> bool:
        with self._lock:
            if self._remaining <= 0:
                return False
            self._remaining -= 1
            return True

    def arm(self, count: int = 1) -> None:
        """Cut ``count`` more matching requests (after the ones already allowed)."""
        with self._lock:
            self._remaining += count

    def cut_all(self) -> None:
        """Close every connection now (both sides), whatever is in flight."""
        with self._lock:
            links = list(self._links)
            self._links.clear()
        for link in links:
            link.close()

    def blackhole(self) -> None:
        """Forward nothing from now on, in either direction, until :meth:`restore`: what is
        sent waits in the proxy and in the sockets' buffers, and new connections are
        accepted but get no answer. Connections stay open."""
        self._open.clear()

    def restore(self) -> None:
        """End a :meth:`blackhole`: what was held back is forwarded, in order."""
        self._open.set()

    def wait_open(self) -> None:
        """Block while the link is a blackhole (returns at once when the proxy closes)."""
        while not self._open.wait(0.2) and not self._closed:
            pass

    def record_cut(self) -> None:
        with self._lock:
            self.injected += 1

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.wait_open()
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            link = _Link(self, client, upstream)
            with self._lock:
                self.connections += 1
                self._links.append(link)
            threading.Thread(target=link.requests, daemon=True).start()
            threading.Thread(target=link.responses, daemon=True).start()

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.close()
        self._thread.join(2)
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def __enter__(self) -> CutProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
