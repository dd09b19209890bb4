"""The pulsar-client drop-in in a real deployment, against a real Pulsar: an application with
only its import changed, run as several processes at once into topics that Pulsar's own tools
made, read back by a plain pulsar-client consumer; replicas killed with -9 and restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from idempotent.testing.conformance import topic_name

pytestmark = pytest.mark.pulsar

#: the application: pulsar-client code with one import changed. It resends from its own
#: checkpoint (the highest sequence id it saw acknowledged, saved now and then) after a restart.
_APP = textwrap.dedent(
    """
    import json, os, sys
    from idempotent.compat import pulsar   # the one changed line: was "import pulsar"

    url, topic, name, tag, count, checkpoint = sys.argv[1:7]
    count = int(count)
    start = 0
    if os.path.exists(checkpoint):
        start = json.load(open(checkpoint)) + 1
    client = pulsar.Client(url)
    producer = client.create_producer(
        topic, producer_name=name or None, block_if_queue_full=True, max_pending_messages=5000,
        batching_enabled=True, batching_max_publish_delay_ms=5,
    )
    acked = [start - 1]

    def done(result, message_id, i):
        if result == pulsar.Result.Ok:
            acked[0] = max(acked[0], i)

    for i in range(start, count):
        producer.send_async(
            f"{tag}-{i}".encode(), lambda r, m, i=i: done(r, m, i), partition_key=f"key-{i % 13}", sequence_id=i
        )
        if i % 500 == 499:
            producer.flush()
            with open(checkpoint + ".tmp", "w") as f:
                json.dump(acked[0] - 250, f)   # an older checkpoint: its resends overlap what is stored
            os.replace(checkpoint + ".tmp", checkpoint)
            print(i, flush=True)
    producer.flush()
    client.close()
    print("done", flush=True)
    """
)


def _url(service: Any) -> str:
    return f"{service.url}?{urllib.parse.urlencode({'admin_url': service.admin_url})}"


def _admin(service: Any, method: str, path: str, body: Any = None) -> None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        service.admin_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def _make_topic(service: Any, name: str, partitions: int) -> None:
    """Create the topic with Pulsar's admin API, as an operator would."""
    if partitions > 1:
        _admin(service, "PUT", f"/admin/v2/persistent/public/default/{name}/partitions", partitions)
    else:
        _admin(service, "PUT", f"/admin/v2/persistent/public/default/{name}")


def _consume_all(service: Any, name: str, expected: int) -> list[tuple[bytes, str, str]]:
    """Every message of the topic as a plain pulsar-client consumer reads it: (value, key,
    partition topic)."""
    import pulsar

    client = pulsar.Client(service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = client.subscribe(
            f"persistent://public/default/{name}",
            "check",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        out = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                message = consumer.receive(3000 if len(out) >= expected else 10_000)
            except pulsar.Timeout:
                if len(out) >= expected:
                    break
                continue
            out.append((message.data(), message.partition_key(), message.topic_name()))
            consumer.acknowledge(message)
        return out
    finally:
        client.close()


def _start(url: str, topic: str, name: str, tag: str, count: int, checkpoint: Path, app: Path) -> Any:
    return subprocess.Popen(
        [sys.executable, str(app), url, topic, name, tag, str(count), str(checkpoint)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _check(messages: list[tuple[bytes, str, str]], expected: set[bytes]) -> None:
    values = [value for value, _, _ in messages]
    assert len(values) == len(set(values)), "a record was stored twice"
    assert set(values) == expected, f"missing: {sorted(expected - set(values))[:5]}"
    where: dict[str, set[str]] = {}
    for _, key, partition_topic in messages:
        where.setdefault(key, set()).add(partition_topic)
    assert all(len(topics) == 1 for topics in where.values()), "a key landed in two partitions"


@pytest.mark.parametrize("partitions", [1, 4])
def test_two_processes_into_an_existing_topic_each_record_once(
    pulsar_service: Any, tmp_path: Path, partitions: int
) -> None:
    name = topic_name("deploy")
    _make_topic(pulsar_service, name, partitions)
    app = tmp_path / "app.py"
    app.write_text(_APP)
    url = _url(pulsar_service)
    count = 2000
    runs = [
        _start(url, name, f"{name}-a", "a", count, tmp_path / "a.json", app),
        _start(url, name, "", "b", count, tmp_path / "b.json", app),  # anonymous
    ]
    for run in runs:
        _, err = run.communicate(timeout=240)
        assert run.returncode == 0, err[-3000:]
    expected = {f"{tag}-{i}".encode() for tag in "ab" for i in range(count)}
    _check(_consume_all(pulsar_service, name, len(expected)), expected)


def test_three_replicas_one_killed_and_restarted_each_record_once(pulsar_service: Any, tmp_path: Path) -> None:
    """Three named replicas write one partitioned topic; one is killed with -9 mid-run and
    restarted with the same producer_name, resending from its own (older) checkpoint."""
    name = topic_name("replicas")
    _make_topic(pulsar_service, name, 3)
    app = tmp_path / "app.py"
    app.write_text(_APP)
    url = _url(pulsar_service)
    count = 6000
    replicas = {tag: _start(url, name, f"{name}-{tag}", tag, count, tmp_path / f"{tag}.json", app) for tag in "xyz"}
    victim = replicas["y"]
    assert victim.stdout is not None
    for line in victim.stdout:  # wait until it is well under way
        if line.strip().isdigit() and int(line) >= 1999:
            break
    victim.send_signal(signal.SIGKILL)
    victim.wait(30)
    killed_at = time.monotonic()
    restarted = _start(url, name, f"{name}-y", "y", count, tmp_path / "y.json", app)
    assert restarted.stdout is not None
    first_progress = None
    for line in restarted.stdout:
        if first_progress is None and line.strip().isdigit():
            first_progress = time.monotonic() - killed_at
        if line.strip() == "done":
            break
    restarted.wait(240)
    assert restarted.returncode == 0, restarted.stderr.read()[-3000:] if restarted.stderr else ""
    assert first_progress is not None and first_progress < 30, f"the restarted replica stalled {first_progress} s"
    for tag in "xz":
        _, err = replicas[tag].communicate(timeout=240)
        assert replicas[tag].returncode == 0, err[-3000:]
    expected = {f"{tag}-{i}".encode() for tag in "xyz" for i in range(count)}
    _check(_consume_all(pulsar_service, name, len(expected)), expected)


def test_event_timestamp_and_properties_reach_a_plain_consumer(pulsar_service: Any) -> None:
    """``event_timestamp`` is the stored message's event time (it was accepted and dropped)."""
    import pulsar

    from idempotent.compat import pulsar as drop_in

    name = topic_name("event-time")
    _make_topic(pulsar_service, name, 1)
    client = drop_in.Client(_url(pulsar_service))
    producer = client.create_producer(name, producer_name=f"{name}-p")
    producer.send(b"one", {"color": "blue"}, event_timestamp=1_000_000_000_123)
    producer.send(b"two")
    client.close()
    native = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = native.create_reader(f"persistent://public/default/{name}", pulsar.MessageId.earliest)
        first, second = reader.read_next(20_000), reader.read_next(20_000)
    finally:
        native.close()
    assert (first.data(), first.event_timestamp()) == (b"one", 1_000_000_000_123)
    assert first.properties()["color"] == "blue"
    assert second.data() == b"two"


def test_drop_in_consumers_and_readers_give_the_properties_the_application_set(pulsar_service: Any) -> None:
    """Messages sent through the drop-in (each its own batch, so each carries the ``idem.*``
    identity in the topic) read back through the drop-in's ``receive``, ``batch_receive``,
    ``message_listener``, reader and asyncio consumer with exactly the properties their
    application gave them, a property the application named ``idem.*`` included; a
    pulsar-client reader still sees the identity (docs/migration.md says so)."""
    import asyncio
    import queue

    import pulsar

    from idempotent.compat import pulsar as drop_in
    from idempotent.compat.pulsar import asyncio as drop_in_asyncio

    name = topic_name("shown-properties")
    full = f"persistent://public/default/{name}"
    _make_topic(pulsar_service, name, 1)
    sent: list[dict[str, str]] = [{}, {"color": "blue", "size": "9"}, {"idem.note": "kept", "b": "2", "a": "1"}]
    client = drop_in.Client(_url(pulsar_service))
    try:
        received: queue.Queue[Any] = queue.Queue()
        consumers = {
            "receive": client.subscribe(full, f"{name}-receive"),
            "batch": client.subscribe(
                full,
                f"{name}-batch",
                batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(len(sent), -1, 20_000),
            ),
            "listener": client.subscribe(
                full, f"{name}-listener", message_listener=lambda c, m: received.put(m.properties())
            ),
        }
        producer = client.create_producer(name, producer_name=f"{name}-p")
        for index, properties in enumerate(sent):
            producer.send(b"m%d" % index, properties or None)
        by_receive = [consumers["receive"].receive(20_000).properties() for _ in sent]
        by_batch: list[dict[str, str]] = []
        deadline = time.monotonic() + 30
        while len(by_batch) < len(sent) and time.monotonic() < deadline:
            by_batch += [m.properties() for m in consumers["batch"].batch_receive()]
        by_listener = [received.get(timeout=20) for _ in sent]
        reader = client.create_reader(full, drop_in.MessageId.earliest)
        by_reader = [reader.read_next(20_000).properties() for _ in sent]
        for consumer in consumers.values():
            consumer.close()
    finally:
        client.close()

    async def by_async_consumer() -> list[dict[str, str]]:
        async_client = drop_in_asyncio.Client(_url(pulsar_service))
        try:
            consumer = await async_client.subscribe(
                full, f"{name}-async", initial_position=pulsar.InitialPosition.Earliest
            )
            return [(await consumer.receive()).properties() for _ in sent]
        finally:
            await async_client.close()

    by_async = asyncio.run(asyncio.wait_for(by_async_consumer(), 60))
    for seen in (by_receive, by_batch, by_listener, by_reader, by_async):
        assert seen == sent
    native = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        plain = native.create_reader(full, pulsar.MessageId.earliest)
        assert all("idem.pid" in plain.read_next(20_000).properties() for _ in sent)
    finally:
        native.close()


def test_a_new_topic_is_made_as_pulsar_makes_it_and_access_modes_apply(pulsar_service: Any) -> None:
    """A topic the drop-in is the first to use is not partitioned (as Pulsar creates one for
    a producer; it was a partitioned topic of one partition), and an exclusive access mode
    keeps another producer out (it was accepted without effect)."""
    import pulsar

    from idempotent.compat import pulsar as drop_in

    name = topic_name("made")
    client = drop_in.Client(_url(pulsar_service))
    try:
        first = client.create_producer(name, producer_name="p1", access_mode=pulsar.ProducerAccessMode.Exclusive)
        with pytest.raises(drop_in.ProducerFenced):
            client.create_producer(name, producer_name="p2", access_mode=pulsar.ProducerAccessMode.Exclusive)
        message_id = first.send(b"one")
    finally:
        client.close()
    assert message_id.partition() == -1  # pulsar-client's id of a non-partitioned topic
    with urllib.request.urlopen(
        f"{pulsar_service.admin_url}/admin/v2/persistent/public/default/{name}/partitions", timeout=30
    ) as response:
        assert json.load(response)["partitions"] == 0


@pytest.mark.parametrize("partitions", [0, 2])
def test_send_async_calls_back_with_the_ids_a_plain_reader_sees(pulsar_service: Any, partitions: int) -> None:
    """The id ``send_async``'s callback gets is pulsar-client's id of the stored message
    (ledger, entry, batch index; the partition on a partitioned topic, -1 on one that is
    not), for every message of a batch, as a plain reader of the topic sees it."""
    import threading

    import pulsar

    from idempotent.compat import pulsar as drop_in

    name = topic_name("ids")
    if partitions:
        _make_topic(pulsar_service, name, partitions)
    client = drop_in.Client(_url(pulsar_service))
    got: dict[bytes, Any] = {}
    lock = threading.Lock()
    try:
        producer = client.create_producer(
            name, producer_name=f"{name}-p", batching_enabled=True, batching_max_publish_delay_ms=50
        )
        for i in range(20):
            value = f"m{i}".encode()

            def done(result: Any, message_id: Any, value: bytes = value) -> None:
                with lock:
                    got[value] = (result, message_id)

            producer.send_async(value, done, partition_key=f"k{i}")
        producer.flush()
    finally:
        client.close()
    assert all(result == drop_in.Result.Ok for result, _ in got.values())
    native = pulsar.Client(pulsar_service.bootstrap, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    seen: dict[bytes, Any] = {}
    try:
        parts = [f"-partition-{p}" for p in range(partitions)] or [""]
        for suffix in parts:
            reader = native.create_reader(f"persistent://public/default/{name}{suffix}", pulsar.MessageId.earliest)
            while reader.has_message_available():
                message = reader.read_next(20_000)
                seen[message.data()] = message.message_id()
    finally:
        native.close()
    assert set(seen) == set(got)
    ids = {value: message_id for value, (_, message_id) in got.items()}
    assert {v: (i.partition(), i.ledger_id(), i.entry_id(), i.batch_index()) for v, i in ids.items()} == {
        v: (i.partition() if partitions else -1, i.ledger_id(), i.entry_id(), i.batch_index()) for v, i in seen.items()
    }
    assert len({i.batch_index() for i in ids.values()}) > 1  # several messages shared an entry
