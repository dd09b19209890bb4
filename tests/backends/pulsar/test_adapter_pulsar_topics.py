"""Pulsar topics that exist already: non-partitioned ones a plain client created, partitioned
ones made by Pulsar's admin API or another broker; and partitions added later."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

import idempotent
from idempotent import Outcome
from idempotent.testing.conformance import small_config, topic_name

pytestmark = pytest.mark.pulsar


def _client(service: Any) -> Any:
    import pulsar

    return pulsar.Client(service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))


def _admin(service: Any, method: str, path: str, body: object = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        service.admin_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def _local(prefix: str) -> str:
    return topic_name(prefix).replace("/", ".")


def _plain_topic(service: Any, local: str, values: list[bytes]) -> str:
    """Create a non-partitioned topic the way Pulsar does by default (a plain consumer
    subscribes to it), with ``values`` written by a plain producer."""
    full = f"persistent://public/default/{local}"
    client = _client(service)
    try:
        client.subscribe(full, "plain-app").close()
        producer = client.create_producer(full)
        for value in values:
            producer.send(value)
        producer.close()
    finally:
        client.close()
    return full


def _plain_read(service: Any, full: str, count: int) -> list[bytes]:
    import pulsar

    client = _client(service)
    try:
        reader = client.create_reader(full, pulsar.MessageId.earliest)
        return [reader.read_next(20_000).data() for _ in range(count)]
    finally:
        client.close()


def test_a_non_partitioned_topic_a_plain_consumer_created_is_one_partition(pulsar_service: Any) -> None:
    """Issue 22: the Pulsar backend refused a topic that a plain consumer created first
    (non-partitioned, Pulsar's default): ``Pulsar topic ... exists and is not partitioned``.
    It is now a topic with one partition written to the topic itself: read back, replayed
    after a restart (a resend is a duplicate) and snapshotted like any other."""
    local = _local("plain")
    full = _plain_topic(pulsar_service, local, [b"old-1", b"old-2"])
    broker = idempotent.connect(pulsar_service.connect_url, small_config())
    try:
        assert broker.partitions_for(local) == 1
        s = broker.init_producer("np-writer")
        first = broker.produce(local, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b"])
        assert first.outcome is Outcome.ACCEPTED
        assert [r.value for r in broker.read(local, 0, 0, 10)] == [b"old-1", b"old-2", b"a", b"b"]
    finally:
        broker.close()  # writes a snapshot of the partition
    assert _plain_read(pulsar_service, full, 4) == [b"old-1", b"old-2", b"a", b"b"]

    fresh = idempotent.connect(pulsar_service.connect_url, small_config())
    try:
        snapshot = fresh.backend.latest_snapshot(local, 0)
        assert snapshot is not None and snapshot.position > first.base_offset  # type: ignore[operator]
        batches = list(fresh.backend.replay(local, 0, 0))  # from where it was adopted: ours only
        assert [(b.producer_id, b.record_count) for b in batches] == [(s.producer_id, 2)]
        again = fresh.init_producer("np-writer")
        dup = fresh.produce(local, 0, again.producer_id, again.producer_epoch, 0, [b"a", b"b"])
        assert dup.outcome is Outcome.DUPLICATE and dup.base_offset == first.base_offset
        assert fresh.produce(local, 0, again.producer_id, again.producer_epoch, 2, [b"c"]).outcome is Outcome.ACCEPTED
    finally:
        fresh.close()
    assert _plain_read(pulsar_service, full, 5)[-1] == b"c"


def test_the_drop_in_produces_into_a_topic_a_plain_consumer_created(pulsar_service: Any) -> None:
    from idempotent.compat import pulsar as drop_in

    local = _local("plain")
    full = _plain_topic(pulsar_service, local, [])
    client = drop_in.Client(pulsar_service.connect_url)
    try:
        producer = client.create_producer(full)
        producer.send(b"one", partition_key="k")
        producer.send(b"two")
        assert client.get_topic_partitions(full) == [full]
    finally:
        client.close()
    assert _plain_read(pulsar_service, full, 2) == [b"one", b"two"]


def test_a_partitioned_topic_made_with_the_admin_api_keeps_its_partitions(pulsar_service: Any) -> None:
    local = _local("admin")
    _admin(pulsar_service, "PUT", f"/admin/v2/persistent/public/default/{local}/partitions", 3)
    broker = idempotent.connect(pulsar_service.connect_url, small_config())
    try:
        assert broker.partitions_for(local) == 3
        s = broker.init_producer()
        assert broker.produce(local, 2, s.producer_id, s.producer_epoch, 0, [b"x"]).outcome is Outcome.ACCEPTED
    finally:
        broker.close()
    assert _plain_read(pulsar_service, f"persistent://public/default/{local}-partition-2", 1) == [b"x"]


def test_a_partition_added_with_the_admin_api_is_served(pulsar_service: Any) -> None:
    local = _local("grows")
    broker = idempotent.connect(pulsar_service.connect_url, small_config())
    try:
        broker.create_topic(local, 2)
        s = broker.init_producer()
        _admin(pulsar_service, "POST", f"/admin/v2/persistent/public/default/{local}/partitions", 4)
        time.sleep(1.05)  # a request beyond the known count reads it again, at most once a second
        assert broker.produce(local, 3, s.producer_id, s.producer_epoch, 0, [b"new"]).outcome is Outcome.ACCEPTED
        assert broker.partitions_for(local) == 4
    finally:
        broker.close()
    fresh = idempotent.connect(pulsar_service.connect_url)
    try:
        assert fresh.topics()[local] == 4
        assert [r.value for r in fresh.read(local, 3, 0, 10)] == [b"new"]
    finally:
        fresh.close()
