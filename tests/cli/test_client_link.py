"""One connection of the network client: requests written in order, one write per round."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import idempotent
from idempotent import Outcome, ProduceRequest
from idempotent.core.records import RecordColumns
from idempotent.errors import InvalidBatchError, UsageError
from idempotent.net.client import RemoteBroker
from idempotent.net.link import Link
from idempotent.net.server import BrokerServer, ServerConfig


@pytest.fixture
def server() -> Iterator[BrokerServer]:
    broker = idempotent.connect(f"memory://{uuid.uuid4().hex}")
    assert isinstance(broker, idempotent.Broker)
    with BrokerServer(broker, config=ServerConfig(max_frame=64 * 1024)) as srv:
        yield srv


def _writes(link: Link, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    sent: list[bytes] = []
    send = link._send

    def recording(data: bytes) -> None:
        sent.append(data)
        send(data)

    monkeypatch.setattr(link, "_send", recording)
    return sent


def test_a_round_of_requests_is_one_write_in_order(server: BrokerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with RemoteBroker(server.url) as client:
        s = client.init_producer()
        link = client._current()
        writes = _writes(link, monkeypatch)
        requests = [
            ProduceRequest.build("t", 0, s.producer_id, s.producer_epoch, 2 * i, RecordColumns([b"a%d" % i, b"b"]))
            for i in range(5)
        ]
        futures = link.submit_many([("produce", r, idempotent.core.protocol.decode_result) for r in requests], 10)
        assert [f.result(10).base_offset for f in futures] == [0, 2, 4, 6, 8]
        assert len(writes) == 1
        assert [r.value for r in server.broker.read("t", 0)] == [v for i in range(5) for v in (b"a%d" % i, b"b")]


def test_a_request_that_cannot_go_fails_alone(server: BrokerServer, monkeypatch: pytest.MonkeyPatch) -> None:
    with RemoteBroker(server.url) as client:
        s = client.init_producer()
        link = client._current()
        writes = _writes(link, monkeypatch)
        decode = idempotent.core.protocol.decode_result
        too_big = ProduceRequest.build("t", 0, s.producer_id, s.producer_epoch, 0, [b"x" * 70_000])
        good = ProduceRequest.build("t", 0, s.producer_id, s.producer_epoch, 0, [b"ok"])
        futures = link.submit_many(
            [("topics", {"x": object()}, dict), ("produce", too_big, decode), ("produce", good, decode)], 10
        )
        with pytest.raises(UsageError, match="cannot encode"):
            futures[0].result(10)
        with pytest.raises(InvalidBatchError, match="frame limit"):
            futures[1].result(10)
        assert futures[2].result(10).outcome is Outcome.ACCEPTED
        assert len(writes) == 1 and not link.pending
