"""Plain Kafka topics as a mirror source (``kafka+native://``): offsets with holes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent.errors import ConfigError, InvalidTopicError
from idempotent.mirror import Mirror
from idempotent.testing.services import ServiceInfo

pytestmark = pytest.mark.kafka


def _topic(bootstrap: str, partitions: int = 1, config: dict[str, str] | None = None) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    name = f"mirror-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config=config or {})])[name].result()
    return name


def _native(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every committed record of partition 0, read independently."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, -2)])
    out: list[tuple[int, bytes | None, bytes | None]] = []
    while True:
        message: Any = consumer.poll(10)
        assert message is not None, "no end of partition"
        if message.error():
            break
        out.append((message.offset(), message.key(), message.value()))
    consumer.close()
    return out


def _copied(url: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    broker = idempotent.connect(url)
    try:
        return [(int(dict(r.headers)["idem.src.offset"]), r.key, r.value) for r in broker.read(topic, 0, 0, 100_000)]
    finally:
        broker.close()


def test_transaction_markers_and_aborted_records_leave_holes(tmp_path: Path, kafka_service: ServiceInfo) -> None:
    from confluent_kafka import Producer

    topic = _topic(kafka_service.bootstrap)
    producer = Producer({"bootstrap.servers": kafka_service.bootstrap, "transactional.id": uuid.uuid4().hex})
    producer.init_transactions(30)

    def transaction(first: int, count: int, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(first, first + count):
            producer.produce(topic, b"v%d" % i, key=b"k%d" % i, partition=0)
        # the records are written before the transaction ends, so aborted ones leave holes (an
        # abort while their partition's registration was in flight once failed with
        # INVALID_TXN_STATE in a fresh-clone run)
        assert producer.flush(30) == 0
        (producer.commit_transaction if commit else producer.abort_transaction)(30)

    transaction(0, 10, True)
    transaction(10, 5, False)
    transaction(15, 10, True)
    source = f"kafka+native://{kafka_service.bootstrap}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    summary = Mirror(source, dest, topic=topic, job="j").run()
    expected = _native(kafka_service.bootstrap, topic)
    assert [v for _, _, v in expected] == [b"v%d" % i for i in [*range(10), *range(15, 25)]]
    offsets = [o for o, _, _ in expected]
    assert offsets != list(range(offsets[0], offsets[0] + len(offsets)))  # holes
    assert summary.copied == 20 and summary.completed
    assert _copied(dest, topic) == expected
    # resumes after the last copied offset; markers at the end are not waited for
    transaction(25, 3, True)
    again = Mirror(source, dest, topic=topic, job="j").run()
    assert again.copied == 3
    assert _copied(dest, topic) == _native(kafka_service.bootstrap, topic)


def test_a_compacted_topic_copies_what_compaction_kept(tmp_path: Path, kafka_service: ServiceInfo) -> None:
    from confluent_kafka import Producer

    config = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "100",
    }
    topic = _topic(kafka_service.bootstrap, 1, config)
    producer = Producer({"bootstrap.servers": kafka_service.bootstrap})
    deadline = time.monotonic() + 90
    i = 0
    while True:  # overwrite 5 keys between unique ones until the log cleaner removed old values
        for _ in range(50):
            key = b"u%d" % i if i % 2 else b"k%d" % (i % 10)
            producer.produce(topic, b"v%d" % i, key=key, partition=0)
            i += 1
        producer.flush(30)
        records = _native(kafka_service.bootstrap, topic)
        offsets = [o for o, _, _ in records]
        if offsets[-1] - offsets[0] + 1 > len(offsets) + 20:
            break
        assert time.monotonic() < deadline, "the topic was not compacted in time"
        time.sleep(1.0)
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    summary = Mirror(f"kafka+native://{kafka_service.bootstrap}", dest, topic=topic, job="j").run()
    copied = _copied(dest, topic)
    # compaction may go on while copying: each copied record is what the topic held at its offset
    by_offset = {o: (k, v) for o, k, v in records}
    assert summary.completed and copied
    assert all(by_offset.get(o, (k, v)) == (k, v) for o, k, v in copied)
    assert [o for o, _, _ in copied] == sorted({o for o, _, _ in copied})
    assert copied[-1] == records[-1]


def test_an_unknown_topic_is_refused(tmp_path: Path, kafka_service: ServiceInfo) -> None:
    with pytest.raises(InvalidTopicError):
        Mirror(
            f"kafka+native://{kafka_service.bootstrap}", f"sqlite:///{tmp_path / 'd.db'}", topic="nope-x", job="j"
        ).run()


def test_headers_named_idem_survive_a_kafka_backed_destination(kafka_service: ServiceInfo) -> None:
    """Regression: the Kafka adapter read back only headers not starting with ``idem.``."""
    topic = f"h-{uuid.uuid4().hex[:8]}"
    with idempotent.Producer(kafka_service.url, producer_name=f"p-{topic}") as producer:
        producer.send(topic, b"x", headers={"idem.src.offset": b"7", "idem.trace": b"t"}).result()
        stored = producer.broker.read(topic, 0, 0, 10)
    assert dict(stored[0].headers) == {"idem.src.offset": b"7", "idem.trace": b"t"}


def test_a_source_written_by_this_project_is_copied_without_its_writers_identity(
    tmp_path: Path, kafka_service: ServiceInfo
) -> None:
    """A topic a named producer of this project wrote (each record its own batch, so each is a
    head with ``idem.*`` identity headers) copied through ``kafka+native://``: the copies carry
    the application's headers and the copy's coordinates, not the source writer's identity,
    and a Kafka-backed destination reads each copy back with the identity of its own batch."""
    from idempotent.adapters.kafka.heads import IDENTITY_HEADERS

    topic = f"src-{uuid.uuid4().hex[:8]}"
    with idempotent.Producer(kafka_service.url, producer_name=f"w-{topic}") as producer:
        for i in range(4):
            producer.send(topic, b"v%d" % i, partition=0, headers={"app": b"%d" % i}).result()
    source = f"kafka+native://{kafka_service.bootstrap}"
    for dest in (f"sqlite:///{tmp_path / 'd.db'}", kafka_service.url):
        mirrored = f"copy-{uuid.uuid4().hex[:8]}"
        assert Mirror(source, dest, topic=topic, to_topic=mirrored, job=f"j-{mirrored}").run().copied == 4
        broker = idempotent.connect(dest)
        try:
            copies = broker.read(mirrored, 0, 0, 100)
        finally:
            broker.close()
        assert [r.value for r in copies] == [b"v%d" % i for i in range(4)]
        for i, record in enumerate(copies):
            names = [name for name, _ in record.headers]
            assert not IDENTITY_HEADERS & set(names), names
            assert dict(record.headers)["app"] == b"%d" % i
        assert len({r.producer_id for r in copies}) == 1  # the copy job's producer, one for all


def _produce(bootstrap: str, topic: str, count: int, partitions: int = 1, start: int = 0) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(start, start + count):
        producer.produce(topic, b"v%d" % i, key=b"k%d" % i, partition=i % partitions)
    assert producer.flush(60) == 0


def _count(url: str, topic: str) -> int:
    try:
        broker = idempotent.connect(url + "?timeout=60")
    except idempotent.ProducerError:
        return 0
    try:
        count = broker.topics().get(topic)
        return 0 if count is None else sum(len(broker.read(topic, p, 0, 100_000)) for p in range(count))
    finally:
        broker.close()


def test_reusing_a_job_for_another_kafka_topic_is_refused(tmp_path: Path, kafka_service: ServiceInfo) -> None:
    """Regression (the issue's Kafka case): the job resumed after offset 2999 of the first
    topic, and copied 0 of the second topic's 3,000 records."""
    first, second = _topic(kafka_service.bootstrap), _topic(kafka_service.bootstrap)
    _produce(kafka_service.bootstrap, first, 3000)
    _produce(kafka_service.bootstrap, second, 3000)
    source = f"kafka+native://{kafka_service.bootstrap}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    assert Mirror(source, dest, topic=first, to_topic="all", job="j").run().copied == 3000
    with pytest.raises(ConfigError, match=rf"job 'j' copied '{first}' into all\[0\].*cannot copy '{second}'"):
        Mirror(source, dest, topic=second, to_topic="all", job="j").run()
    assert _count(dest, "all") == 3000
    assert Mirror(source, dest, topic=second, to_topic="all", job="j2").run().copied == 3000


def test_topics_by_pattern_with_their_own_resume_points(tmp_path: Path, kafka_service: ServiceInfo) -> None:
    """``--topics`` with real Kafka topics: a following job picks up a new matching topic, and
    each topic resumes from its own position."""
    bootstrap = kafka_service.bootstrap
    prefix = f"mt{uuid.uuid4().hex[:6]}"
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def create(name: str, partitions: int) -> None:
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result()

    create(f"{prefix}.a", 2)
    create(f"{prefix}-other", 1)
    _produce(bootstrap, f"{prefix}.a", 100, 2)
    _produce(bootstrap, f"{prefix}-other", 10)
    source = f"kafka+native://{bootstrap}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    mirror = Mirror(source, dest, topics=rf"{prefix}\..*", job="j", follow=True, refresh_interval=0.5)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(mirror.run()))
    thread.start()
    try:
        _wait(lambda: _count(dest, f"{prefix}.a") == 100)
        create(f"{prefix}.b", 3)
        _produce(bootstrap, f"{prefix}.b", 60, 3)
        _wait(lambda: _count(dest, f"{prefix}.b") == 60)
    finally:
        mirror.stop()
        thread.join(60)
    summary = result[0]
    assert isinstance(summary, idempotent.mirror.MirrorSummary)
    assert summary.copied == 160 and summary.topics == [f"{prefix}.a", f"{prefix}.b"]
    assert f"{prefix}-other" not in idempotent.connect(dest).topics()
    _produce(bootstrap, f"{prefix}.b", 6, 3, start=60)
    again = Mirror(source, dest, topics=f"{prefix}.a,{prefix}.b", job="j").run()
    assert again.copied == 6 and all(p.resumed_after >= 0 for p in again.partitions)
    for topic in (f"{prefix}.a", f"{prefix}.b"):
        broker = idempotent.connect(dest)
        try:
            for p in range(broker.topics()[topic]):
                copied = [(int(dict(r.headers)["idem.src.offset"]), r.value) for r in broker.read(topic, p, 0, 1000)]
                assert [o for o, _ in copied] == list(range(len(copied)))  # every offset once, in order
        finally:
            broker.close()


def test_status_shows_the_lag_behind_a_kafka_topic(tmp_path: Path, kafka_service: ServiceInfo) -> None:
    topic = _topic(kafka_service.bootstrap, 2)
    _produce(kafka_service.bootstrap, topic, 100, 2)
    source = f"kafka+native://{kafka_service.bootstrap}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    Mirror(source, dest, topic=topic, job="j").run()
    _produce(kafka_service.bootstrap, topic, 7, 1, start=100)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "idempotent",
            "mirror",
            "status",
            "--job",
            "j",
            "--to",
            dest,
            "--from",
            source,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["topic"], r["partition"], r["last_offset"], r["end"], r["lag"]) for r in rows] == [
        (topic, 0, 49, 57, 7),
        (topic, 1, 49, 50, 0),
    ]
    assert "%3|" not in out.stderr and "%4|" not in out.stderr


def _wait(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


_LOG_PROBE = """
import logging, sys, time
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger().addHandler(Keep())
logging.getLogger().setLevel(logging.DEBUG)
from idempotent.mirror import open_source
source = open_source("kafka+native://127.0.0.1:1")
reader = source.open_partition("t", 0, -1, None)
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    reader.poll(10, 0.2)
reader.close()
source.close()
fails = [r for r in records if "FAIL" in r.getMessage()]
print(len(fails), fails[0].name if fails else "-", fails[0].levelname if fails else "-")
"""


def test_librdkafka_lines_of_the_source_go_to_python_logging() -> None:
    """Regression: the source consumers' librdkafka lines (``%3|...|FAIL|...``) went straight
    to stderr."""
    out = subprocess.run([sys.executable, "-c", _LOG_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "%3|" not in out.stderr and "|FAIL|" not in out.stderr, out.stderr
    count, name, level = out.stdout.split()
    assert int(count) >= 1 and name == "idempotent.mirror.librdkafka" and level == "ERROR"


# -- errors: the Kafka adapters' one translation (adapters/kafka/errors.py) -----------------


def _error(code_name: str, **flags: bool) -> Any:
    from confluent_kafka import KafkaError

    return KafkaError(getattr(KafkaError, code_name), "reason", **flags)


@pytest.mark.parametrize("code_name", ["INVALID_RECORD", "_BAD_MSG", "_CRIT_SYS_RESOURCE"])
def test_a_source_error_nobody_documents_as_transient_is_fatal_not_retried(code_name: str) -> None:
    """Regression: the mirror's Kafka source had a translation of its own that made every
    code it did not know a retriable BackendUnavailableError (and anything that was not a
    KafkaError too), so a bug or a broken record was retried as if the network had failed."""
    from idempotent.adapters.kafka.errors import translate
    from idempotent.adapters.kafka.source import _translate
    from idempotent.errors import InternalError, Recovery

    mapped = _translate(_error(code_name), "consume")
    assert type(mapped) is InternalError and mapped.recovery is Recovery.FATAL
    assert type(mapped) is type(translate(_error(code_name), "consume"))
    assert type(_translate(RuntimeError("not a KafkaError"), "consume")) is InternalError


@pytest.mark.parametrize(
    ("code_name", "expected"),
    [
        ("_TRANSPORT", "BackendUnavailableError"),
        ("LEADER_NOT_AVAILABLE", "BackendUnavailableError"),
        ("_INVALID_ARG", "ConfigError"),
        ("TOPIC_AUTHORIZATION_FAILED", "ConfigError"),
        ("_UNKNOWN_TOPIC", "InvalidTopicError"),
        ("_UNKNOWN_PARTITION", "InvalidTopicError"),
        # a source topic the cluster does not know does not exist (the backend's own topics
        # may still be propagating: transient there)
        ("UNKNOWN_TOPIC_OR_PART", "InvalidTopicError"),
    ],
)
def test_source_errors_map_as_the_adapters_map_them(code_name: str, expected: str) -> None:
    from idempotent.adapters.kafka.errors import translate
    from idempotent.adapters.kafka.source import _map_errors, _translate

    assert type(_translate(_error(code_name), "consume")).__name__ == expected
    if code_name != "UNKNOWN_TOPIC_OR_PART":
        assert type(translate(_error(code_name), "consume")).__name__ == expected
    from confluent_kafka import KafkaException

    with pytest.raises(Exception) as raised, _map_errors("list topics"):
        raise KafkaException(_error(code_name))
    assert type(raised.value).__name__ == expected and "list topics" in str(raised.value)
