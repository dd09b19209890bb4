"""CutProxy: forwards length-prefixed frames and loses the answer to chosen requests."""

from __future__ import annotations

import socket
import struct
import threading

from idempotent.testing.native_proxy import CutProxy, kafka_produce, pulsar_rewrite, pulsar_send


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _kafka_request(api_key: int, correlation: int) -> bytes:
    return _frame(struct.pack(">hhi", api_key, 9, correlation) + b"payload")


def _recv_frame(sock: socket.socket) -> bytes | None:
    head = sock.recv(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">i", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    return body


class _Echo:
    """A fake broker: answers every Kafka-framed request with its correlation id."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received: list[int] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            while (body := _recv_frame(conn)) is not None:
                correlation = struct.unpack(">i", body[4:8])[0]
                self.received.append(correlation)
                conn.sendall(_frame(body[4:8] + b"answer 127.0.0.1:11111"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_cuts_the_connection_after_the_broker_answered_a_produce() -> None:
    echo = _Echo()
    with CutProxy(_free_port(), echo.port, cut=kafka_produce, cuts=1) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        client.sendall(_kafka_request(3, 1))  # metadata: forwarded both ways
        assert _recv_frame(client) == struct.pack(">i", 1) + b"answer 127.0.0.1:11111"
        client.sendall(_kafka_request(0, 2))  # produce: processed, answer dropped, connection cut
        assert _recv_frame(client) is None
        client.close()
        again = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        again.sendall(_kafka_request(0, 3))  # only one cut was asked for
        assert _recv_frame(again) == struct.pack(">i", 3) + b"answer 127.0.0.1:11111"
        again.close()
    assert echo.received == [1, 2, 3]
    assert proxy.injected == 1 and proxy.connections == 2


def test_a_second_armed_cut_waits_for_the_next_connection() -> None:
    """Two cuts armed while a client pipelines two produces on one connection: the first
    answer is dropped and the link cut; the second cut is not spent on the same link (where
    it would be lost with it) but on the next connection's produce."""
    echo = _Echo()
    with CutProxy(_free_port(), echo.port, cut=kafka_produce, cuts=2) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        client.sendall(_kafka_request(0, 1) + _kafka_request(0, 2))
        assert _recv_frame(client) is None
        client.close()
        again = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        again.sendall(_kafka_request(0, 3))
        assert _recv_frame(again) is None
        again.close()
        third = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        third.sendall(_kafka_request(0, 4))  # both cuts spent
        assert _recv_frame(third) == struct.pack(">i", 4) + b"answer 127.0.0.1:11111"
        third.close()
    assert proxy.injected == 2 and proxy.connections == 3


def test_pulsar_matchers_and_rewrite() -> None:
    send = struct.pack(">i", 10) + b"\x08\x06rest"
    receipt = struct.pack(">i", 10) + b"\x08\x07rest"
    answered = pulsar_send(send)
    assert answered is not None and answered(receipt) and not answered(send)
    assert pulsar_send(receipt) is None
    rewrite = pulsar_rewrite(11111, 22222)
    assert rewrite(b"pulsar://127.0.0.1:11111") == b"pulsar://127.0.0.1:22222"
