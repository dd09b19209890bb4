"""A frame-aware TCP proxy that loses, duplicates and cuts broker-protocol traffic (tests).

Put it between a :class:`~idempotent.net.client.RemoteBroker` and a broker server::

    proxy = FaultyProxy("127.0.0.1:7650", ProxyFaults(drop_response=0.1, seed=1)).start()
    producer = Producer(f"idem://{proxy.address}", "job", timeout=1.0)

Each frame after the handshake is, at seeded random, forwarded, dropped, forwarded twice,
or the whole connection is cut (both sides closed). The client then sees exactly what a bad
network does: missing answers (timeouts), duplicated requests, and broken connections.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading

import attrs

import idempotent.core.protocol as wire


@attrs.define
class ProxyFaults:
    """Probabilities per frame (each in 0..1), and the seed."""

    drop_request: float = 0.0
    drop_response: float = 0.0
    duplicate_request: float = 0.0
    cut: float = 0.0
    seed: int = 0
    injected: dict[str, int] = attrs.field(
        factory=lambda: {"drop_request": 0, "drop_response": 0, "duplicate_request": 0, "cut": 0}
    )


class FaultyProxy:
    """Listens on a free local port and forwards to ``upstream`` (``host:port``)."""

    def __init__(self, upstream: str, faults: ProxyFaults | None = None) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.faults = faults or ProxyFaults()
        self._rng = random.Random(self.faults.seed)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = "{}:{}".format(*self._listener.getsockname()[:2])
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._armed = {"drop_request": 0, "drop_response": 0, "duplicate_request": 0, "cut": 0}

    def start(self) -> FaultyProxy:
        threading.Thread(target=self._accept_loop, name="faulty-proxy", daemon=True).start()
        return self

    def arm(self, kind: str, count: int = 1) -> None:
        """Inject fault ``kind`` (a key of ``ProxyFaults.injected``) on the next ``count``
        frames it applies to, whatever the probabilities say.

        Raises:
            ValueError: unknown kind.
        """
        if kind not in self._armed:
            raise ValueError(f"unknown fault {kind!r}; expected one of {sorted(self._armed)}")
        with self._lock:
            self._armed[kind] += count

    def _roll(self, kind: str, probability: float) -> bool:
        with self._lock:
            if self._armed[kind] > 0:
                self._armed[kind] -= 1
                self.faults.injected[kind] += 1
                return True
        if probability <= 0:
            return False
        with self._lock:
            hit = self._rng.random() < probability
            if hit:
                self.faults.injected[kind] += 1
            return hit

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets.update((client, server))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        decoder = wire.FrameDecoder(1 << 30)
        f = self.faults
        first = True
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                for body in decoder.feed(data):
                    assert isinstance(body, bytes)
                    frame = wire.frame(body)
                    if first:  # the handshake always passes
                        first = False
                        sink.sendall(frame)
                        continue
                    if self._roll("cut", f.cut):
                        raise OSError("cut (injected)")
                    if requests:
                        if self._roll("drop_request", f.drop_request):
                            continue
                        sink.sendall(frame)
                        if self._roll("duplicate_request", f.duplicate_request):
                            sink.sendall(frame)
                    else:
                        if self._roll("drop_response", f.drop_response):
                            continue
                        sink.sendall(frame)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def cut_all(self) -> None:
        """Break every proxied connection now."""
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop accepting and break every connection."""
        self._closed = True
        with contextlib.suppress(OSError):  # wakes the accept() blocked in the accept thread
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.cut_all()


__all__ = ["FaultyProxy", "ProxyFaults"]
