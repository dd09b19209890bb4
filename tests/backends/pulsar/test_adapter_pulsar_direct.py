"""A producer's own writer into a real Pulsar (adapters/pulsar/producer_log.py): restart recovery
from the state topic plus a bounded read, unknown outcomes settled before the next write, and
older instances of a named producer kept out."""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any

import pytest

from idempotent import Producer
from idempotent.adapters.pulsar import producer_log as pulsar_direct
from idempotent.adapters.pulsar.backend import PulsarBackend
from idempotent.adapters.pulsar.producer_log import PulsarProducerLog
from idempotent.backend import AppendBatch
from idempotent.core.checker import make_header
from idempotent.errors import BackendUnavailableError, OwnershipLostError
from idempotent.testing.conformance import topic_name

pytestmark = pytest.mark.pulsar


def _url(service: Any) -> str:
    return f"{service.url}?{urllib.parse.urlencode({'admin_url': service.admin_url})}"


def _read_all(service: Any, pulsar_topic: str) -> list[Any]:
    import pulsar

    client = pulsar.Client(service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(pulsar_topic, pulsar.MessageId.earliest)
        out = []
        while reader.has_message_available():
            out.append(reader.read_next(20_000))
        return out
    finally:
        client.close()


@pytest.fixture
def backend(pulsar_service: Any) -> Any:
    backend = PulsarBackend(pulsar_service.url, admin_url=pulsar_service.admin_url, timeout=5)
    yield backend
    backend.close()


def _batch(pid: int, epoch: int, base: int, values: list[bytes]) -> AppendBatch:
    from idempotent.core.records import RecordColumns

    return AppendBatch(make_header(pid, epoch, base, len(values)), RecordColumns(values, None), 1_700_000_000.0)


def test_producer_url_writes_through_its_own_log(pulsar_service: Any) -> None:
    topic = topic_name("direct")
    with Producer(_url(pulsar_service), linger_ms=1) as producer:
        assert type(producer.broker).__name__ == "DirectBroker"
        metas = [producer.send(topic, b"v%d" % i, key=b"k%d" % (i % 3)) for i in range(50)]
        producer.flush()
        assert all(not m.result().duplicate for m in metas)
    partitions = len({m.result().partition for m in metas})
    assert partitions >= 1
    stored = [m for p in range(8) for m in _maybe_read(pulsar_service, topic, p)]
    assert sorted(m.data() for m in stored) == sorted(b"v%d" % i for i in range(50))


def _maybe_read(service: Any, topic: str, partition: int) -> list[Any]:
    import pulsar

    try:
        return _read_all(service, f"persistent://public/default/{topic}-partition-{partition}")
    except pulsar.exceptions.PulsarException:
        return []


def test_named_restart_continues_from_the_log_past_its_last_state(
    pulsar_service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash after the last state write: the restart reads the partition from the state's
    position on and finds the batches written since, with their offsets."""
    url = _url(pulsar_service)
    topic = topic_name("restart")
    name = topic_name("named")
    monkeypatch.setattr(pulsar_direct, "STATE_INTERVAL", 3600.0)  # only the first state is written
    first = Producer(url, name, linger_ms=1)
    metas = []
    for i in range(5):  # five groups: the state written before the first one names none of them
        metas.append(first.send(topic, b"v%d" % i, partition=0))
        first.flush()
    log = first.broker._log  # type: ignore[attr-defined]
    monkeypatch.setattr(log, "_write_state", lambda wait: None)  # "crash": no state on close
    first.close()
    second = Producer(url, name)
    try:
        assert second.producer_epoch == first.producer_epoch + 1
        assert second.last_sequence(topic, 0) == 4
        again = second.send(topic, b"v3", partition=0, sequence=3).result()
        assert again.duplicate
        assert again.offset == metas[3].result().offset
        fresh = second.send(topic, b"v5", partition=0).result()
        assert (fresh.sequence, fresh.duplicate) == (5, False)
    finally:
        second.close()
    stored = _read_all(pulsar_service, f"persistent://public/default/{topic}-partition-0")
    assert [m.data() for m in stored] == [b"v%d" % i for i in range(6)]


def test_unknown_outcome_stored_is_settled_as_stored(pulsar_service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry whose acknowledgement is lost (stored, but reported failed) is settled before
    anything else is written: its resend is a duplicate with the original offset, stored once."""
    import pulsar

    url = _url(pulsar_service)
    topic = topic_name("doubt")
    lost = iter([True])
    original = PulsarProducerLog._last

    def lose_once(self: Any, entry: Any, result: Any, message_id: Any) -> None:
        if result == pulsar.Result.Ok and next(lost, False):
            result = pulsar.Result.Timeout  # stored, but the answer says otherwise
        original(self, entry, result, message_id)

    with Producer(url, "doubt-" + topic, linger_ms=1) as producer:
        producer.send(topic, b"head", partition=0).result()
        monkeypatch.setattr(PulsarProducerLog, "_last", lose_once)
        meta = producer.send(topic, b"once", partition=0).result()
        assert meta.duplicate  # the resend found it stored
        after = producer.send(topic, b"after", partition=0).result()
    stored = _read_all(pulsar_service, f"persistent://public/default/{topic}-partition-0")
    assert [m.data() for m in stored] == [b"head", b"once", b"after"]
    assert after.sequence == meta.sequence + 1
    assert meta.offset is not None and meta.offset < after.offset  # type: ignore[operator]


def test_unknown_outcome_not_stored_is_resent_once(pulsar_service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry the client refused before it left is settled (its writer closed and reopened)
    and the resend stores it exactly once."""
    url = _url(pulsar_service)
    topic = topic_name("lost")
    refused = iter([True])
    original = PulsarProducerLog._flush

    def refuse_once(self: Any, writer: Any) -> None:
        if next(refused, False):
            raise BackendUnavailableError("pulsar: the client refused the flush (test)")
        original(self, writer)

    with Producer(url, "lost-" + topic, linger_ms=1) as producer:
        producer.send(topic, b"head", partition=0).result()
        monkeypatch.setattr(PulsarProducerLog, "_flush", refuse_once)
        producer.send(topic, b"once", partition=0).result()
        producer.send(topic, b"after", partition=0).result()
    stored = _read_all(pulsar_service, f"persistent://public/default/{topic}-partition-0")
    assert [m.data() for m in stored] == [b"head", b"once", b"after"]


def test_pipelined_groups_keep_order_and_offsets(pulsar_service: Any) -> None:
    """Several batches of one partition in flight at once: stored in order, one entry each."""
    url = _url(pulsar_service)
    topic = topic_name("pipe")
    with Producer(url, linger_ms=0, max_batch_records=7) as producer:
        assert producer.broker._log.max_in_flight > 1  # type: ignore[attr-defined]
        metas = [producer.send(topic, b"v%d" % i, partition=0) for i in range(500)]
        producer.flush()
        offsets = [m.result().offset for m in metas]
    assert offsets == sorted(offsets)
    stored = _read_all(pulsar_service, f"persistent://public/default/{topic}-partition-0")
    assert [m.data() for m in stored] == [b"v%d" % i for i in range(500)]


def test_an_older_instance_stores_nothing_once_a_newer_one_opened(backend: Any) -> None:
    """The newer instance fences the older's state producer first; the older learns it at its
    next write (at most the group it is writing lands, before the newer holds the partition,
    and the newer reads it), lets go of its partitions, and never stores anything again."""
    from idempotent.core.checker import PartitionChecker

    topic = topic_name("zombie")
    backend.create_topic(topic, 1)
    older = PulsarProducerLog(backend, "z-" + topic, True)
    older.load_states()
    older.write([(topic, 0, _batch(7, 0, 0, [b"a", b"b"]))])

    def states(offsets: list[int]) -> list[tuple[str, int, Any]]:  # as the DirectBroker passes them
        return [(topic, 0, PartitionChecker.restore(None).snapshot(0.0))]

    newer = PulsarProducerLog(backend, "z-" + topic, True)  # fences the older's state producer
    opened: list[Any] = []
    thread = threading.Thread(target=lambda: opened.append(newer.load_states()))
    thread.start()  # waits for the older to let go of the partition
    stored = 2
    with pytest.raises(OwnershipLostError):
        for _ in range(50):
            older.write([(topic, 0, _batch(7, 0, stored, [b"x%d" % stored]))], states)
            stored += 1
            time.sleep(0.1)
    thread.join(30)
    assert opened, "the newer instance did not get the partition"
    with pytest.raises(OwnershipLostError):
        older.write([(topic, 0, _batch(7, 0, stored, [b"late"]))])
    checker = PartitionChecker.restore(opened[0][(topic, 0)])
    assert checker.last_sequence(7) == stored - 1  # everything the older stored is known
    offsets = newer.write([(topic, 0, _batch(7, 1, stored, [b"c"]))])
    newer.close()
    older.close()
    records = backend.read(topic, 0, 0, 100)
    assert [r.value for r in records] == [b"a", b"b", *[b"x%d" % i for i in range(2, stored)], b"c"]
    assert records[-1].offset == offsets[0]


def test_a_live_older_instance_is_named_in_the_error(backend: Any) -> None:
    topic = topic_name("busy")
    backend.create_topic(topic, 1)
    backend.timeout = 1.0
    holder = PulsarProducerLog(backend, "b-" + topic, False)
    holder.write([(topic, 0, _batch(8, 0, 0, [b"a"]))])
    other = PulsarProducerLog(backend, "b-" + topic, False)
    try:
        with pytest.raises(BackendUnavailableError, match=r"another instance of producer .* is still connected"):
            other.write([(topic, 0, _batch(8, 0, 1, [b"b"]))])
    finally:
        holder.close()
        other.close()


def test_deduplication_is_the_namespace_policy_and_survives_unloads(backend: Any, pulsar_service: Any) -> None:
    """Pulsar's deduplication of a data topic comes from its namespace's policy, never from a
    topic-level one: on Pulsar 3.0 a topic with topic-level policies runs two deduplication
    recoveries at once each time it is loaded (apache/pulsar#25954), which can leave the
    broker's last sequence id of a producer below what is stored, so a resend after an unload
    (the client's own, or a settle's) was stored twice (tests/backends/pulsar/test_pulsar_faults.py). After
    each unload, a producer name's last sequence id is exactly the last one stored, and a
    resend of it is dropped."""
    import pulsar

    from idempotent.adapters.pulsar.admin import Admin
    from idempotent.adapters.pulsar.names import pulsar_topic_name

    topic = topic_name("dedup-ns")
    backend.create_topic(topic, 1)
    name = pulsar_topic_name(topic)
    data_topic = backend.data_topic(topic, 0)
    backend.ensure_deduplication(name, data_topic)
    admin = Admin(pulsar_service.admin_url, {}, 30)
    assert admin.call("GET", f"/admin/v2/namespaces/{name.tenant}/{name.namespace}/deduplication")[1] is True
    assert admin.call("GET", f"{name.rest}/deduplicationEnabled")[1] is None, "no topic-level policy"
    client = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        sent = 0
        for _ in range(4):
            producer = client.create_producer(data_topic, producer_name="dedup-ns", batching_enabled=False)
            assert producer.last_sequence_id() == sent - 1
            if sent:
                again = producer.send(b"again", sequence_id=sent - 1)
                assert (again.ledger_id(), again.entry_id()) == (-1, -1), "a resend must be a duplicate"
            for _ in range(250):  # more than one 100-entry read of the broker's recovery
                producer.send_async(b"x", None, sequence_id=sent)
                sent += 1
            producer.flush()
            producer.close()
            admin.unload_topic(name.rest)
            backend.ensure_deduplication(name, data_topic)
    finally:
        client.close()
    assert len(_read_all(pulsar_service, data_topic)) == sent


class _UnownedAdmin:
    """An admin REST stub whose partition stats say "Can't find owner for topic" (404) the
    first ``unowned`` times: no broker owns the topic's bundle while it is unloaded."""

    def __init__(self, unowned: int) -> None:
        self.unowned = unowned
        self.stats = 0

    def call(self, method: str, path: str, body: object = None, *, accept: Any = ()) -> tuple[int, Any]:
        if path.endswith("/stats"):
            self.stats += 1
            if self.stats <= self.unowned:
                assert 404 in accept, "a 404 of the stats must not be raised at once"
                return 404, "Can't find owner for topic persistent://public/default/t-partition-0"
            return 200, {"deduplicationStatus": "Enabled"}
        return 200, True if "/namespaces/" in path else None


def _stub_backend(admin: _UnownedAdmin, timeout: float) -> Any:
    stub = object.__new__(PulsarBackend)  # not connected: only what ensure_deduplication uses
    stub._admin = admin
    stub.timeout = timeout
    stub._deduplicating = set()
    stub._policy_checked = set()
    return stub


def test_a_partition_no_broker_owns_for_a_moment_is_waited_for() -> None:
    """While a bundle or namespace is unloaded, a settle's reopening of a partition read its
    stats and got 404 "Can't find owner for topic": that was an InvalidTopicError, which failed
    every later record of the drop-in (seen in tests/backends/pulsar/test_pulsar_faults.py, bundles unloaded).
    It is asked again until the timeout; a topic still unknown then is an InvalidTopicError."""
    from idempotent.adapters.pulsar.names import pulsar_topic_name
    from idempotent.errors import InvalidTopicError

    name = pulsar_topic_name("t")
    admin = _UnownedAdmin(unowned=3)
    PulsarBackend.ensure_deduplication(_stub_backend(admin, 5), name, "persistent://public/default/t-partition-0")
    assert admin.stats == 4
    with pytest.raises(InvalidTopicError, match="Can't find owner"):
        PulsarBackend.ensure_deduplication(
            _stub_backend(_UnownedAdmin(unowned=1_000_000), 0.3), name, "persistent://public/default/t-partition-0"
        )


def test_transactions_are_refused_saying_why_and_what_to_use(pulsar_service: Any) -> None:
    from idempotent.errors import TransactionStateError

    with Producer(_url(pulsar_service), linger_ms=1) as producer:
        with pytest.raises(TransactionStateError) as refused:
            producer.begin_transaction()
        message = str(refused.value)
        assert "pulsar-client has no transaction API" in message and "kafka://" in message
        topic = topic_name("ptx")
        assert producer.send(topic, b"still-once").result(60).offset is not None  # the producer goes on


def test_the_newest_message_of_an_empty_topic_is_known_without_a_reader(backend: Any, pulsar_service: Any) -> None:
    """A topic that retains no entry (just made) is answered None from the admin API, no
    reader opened; once a message is stored, a reader finds it as before."""
    import pulsar

    name = f"persistent://public/default/{topic_name('newest')}"
    backend._admin.call("PUT", f"/admin/v2/persistent/public/default/{name.rsplit('/', 1)[1]}")
    opened: list[str] = []
    real = backend._client.create_reader

    def counted(topic: str, *args: Any, **kwargs: Any) -> Any:
        opened.append(topic)
        return real(topic, *args, **kwargs)

    backend._client.create_reader = counted
    try:
        assert backend._last(name) is None
        assert opened == []
        client = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            client.create_producer(name).send(b"stored")
        finally:
            client.close()
        assert backend._last(name).data() == b"stored"
        assert opened == [name]
    finally:
        backend._client.create_reader = real
