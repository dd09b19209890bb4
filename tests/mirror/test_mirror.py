"""The mirror engine, with file and idempotent-topic sources (memory and SQLite)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import attrs
import pytest

import idempotent
from idempotent.adapters.memory import reset_store
from idempotent.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidTopicError,
    PartitionRecoveringError,
    ProducerFencedError,
)
from idempotent.mirror import (
    Mirror,
    PartitionProgress,
    Polled,
    SourceRecord,
    TopicPattern,
    copy_partition,
    job_status,
    open_source,
    producer_name,
)
from idempotent.mirror.engine import POLL_RECORDS, _fixed_size, _with_coordinates, source_headers
from idempotent.mirror.names import JobProducer, parse_producer_name


def _stored(url: str, topic: str) -> dict[int, list[idempotent.StoredRecord]]:
    # wait for the copy's write lock rather than fail while it writes (a loaded machine)
    broker = idempotent.connect(url + "?timeout=60" if url.startswith("sqlite:") else url)
    try:
        out = {}
        for p in range(broker.topics().get(topic, 0)):
            out[p] = broker.read(topic, p, 0, 1_000_000)
        return out
    finally:
        broker.close()


def _fill(url: str, topic: str, partitions: int, count: int, start: int = 0) -> None:
    with idempotent.Producer(url, producer_name="writer") as producer:
        if topic not in producer.broker.topics():
            producer.broker.create_topic(topic, partitions)
        for i in range(start, start + count):
            producer.send(topic, f"v{i}", key=f"k{i}", partition=i % partitions, headers={"h": str(i).encode()})


def test_file_to_sqlite_copies_every_line_in_order_and_resumes(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    summary = Mirror(f"file://{source}", dest, to_topic="lines", job="j").run()
    assert (summary.copied, summary.duplicates, summary.completed) == (1000, 0, True)
    assert summary.partitions[0].resumed_after == -1
    stored = _stored(dest, "lines")[0]
    assert [r.value for r in stored] == [b"line %d" % i for i in range(1000)]
    offsets = [int(dict(r.headers)["idem.src.offset"]) for r in stored]
    assert offsets == [sum(len(b"line %d\n" % j) for j in range(i)) for i in range(1000)]
    assert dict(stored[0].headers)["idem.src.topic"] == str(source).encode()
    # the last stored sequence is the last line's offset: the resume position
    assert stored[-1].sequence == offsets[-1]

    again = Mirror(f"file://{source}", dest, to_topic="lines", job="j").run()
    assert (again.copied, again.duplicates) == (0, 0)
    assert again.partitions[0].resumed_after == offsets[-1]

    with source.open("ab") as handle:
        handle.write(b"more 1\nmore 2")  # the last line has no newline: the file's end ends it
    more = Mirror(f"file://{source}", dest, to_topic="lines", job="j").run()
    assert more.copied == 2
    assert [r.value for r in _stored(dest, "lines")[0][-3:]] == [b"line 999", b"more 1", b"more 2"]


def test_a_directory_is_its_files_in_name_order(tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "b.log").write_bytes(b"b1\nb2\n")
    (folder / "a.log").write_bytes(b"a1\na2")  # no newline at the end of a file that is not last
    (folder / ".hidden").write_bytes(b"x\n")
    (folder / "sub").mkdir()
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    summary = Mirror(f"file://{folder}", dest, to_topic="t", job="j").run()
    assert summary.copied == 4
    assert [r.value for r in _stored(dest, "t")[0]] == [b"a1", b"a2", b"b1", b"b2"]
    (folder / "c.log").write_bytes(b"c1\n")
    assert Mirror(f"file://{folder}", dest, to_topic="t", job="j").run().copied == 1
    assert [r.value for r in _stored(dest, "t")[0]][-1] == b"c1"


def test_topic_to_topic_keeps_partitions_keys_headers_and_order(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "orders", 3, 300)
    summary = Mirror(src, dest, topic="orders", to_topic="copy", job="j").run()
    assert summary.copied == 300 and len(summary.partitions) == 3
    source = _stored(src, "orders")
    copied = _stored(dest, "copy")
    assert sorted(copied) == [0, 1, 2]
    for p in range(3):
        assert [(r.key, r.value) for r in copied[p]] == [(r.key, r.value) for r in source[p]]
        for original, copy in zip(source[p], copied[p], strict=True):
            headers = dict(copy.headers)
            assert headers["h"] == dict(original.headers)["h"]
            assert headers["idem.src.topic"] == b"orders"
            assert headers["idem.src.partition"] == b"%d" % p
            assert headers["idem.src.offset"] == b"%d" % original.offset
            assert abs(int(headers["idem.src.timestamp"]) / 1000 - original.timestamp) < 0.002
    broker = idempotent.connect(dest)
    try:
        assert {s.policy for s in broker.stats("copy")} == {"monotonic"}
        names = {producer_name("j", p, "orders") for p in range(3)}
        assert {ps.producer_name for s in broker.stats("copy") for ps in s.producers} == names
    finally:
        broker.close()
    # a topic copied again under another job name is copied again
    assert Mirror(src, dest, topic="orders", to_topic="copy", job="j2").run().copied == 300


def test_interrupted_copy_resumes_without_duplicates_or_losses(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    total = 2 * 3 * POLL_RECORDS  # three batches per partition
    _fill(src, "t", 2, total)
    mirror: Mirror

    def stop_early(report: PartitionProgress) -> None:
        if report.copied >= 3000:
            mirror.stop()

    mirror = Mirror(src, dest, topic="t", job="j", progress=stop_early)
    first = mirror.run()
    assert not first.completed and 3000 <= first.copied < total
    second = Mirror(src, dest, topic="t", job="j").run()
    assert second.completed and first.copied + second.copied == total
    assert second.duplicates == 0
    source, copied = _stored(src, "t"), _stored(dest, "t")
    for p in (0, 1):
        assert [r.value for r in copied[p]] == [r.value for r in source[p]]
    resumed = {s.partition: s.resumed_after for s in second.partitions}
    assert resumed == {s.partition: s.last_offset for s in first.partitions}


def test_a_resent_batch_is_answered_duplicate(tmp_path: Path) -> None:
    """A batch resent under the same producer session (its answer was lost) is not stored twice."""
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    broker = idempotent.connect(dest)
    try:
        broker.create_topic("t", 1)
        broker.set_policy("monotonic", topic="t")
        session = broker.init_producer(producer_name("j", 0))
        records = [idempotent.Record(b"a"), idempotent.Record(b"b")]
        first = broker.produce("t", 0, session.producer_id, session.producer_epoch, 9, records)
        again = broker.produce("t", 0, session.producer_id, session.producer_epoch, 9, records)
        assert (first.outcome, again.outcome) == (idempotent.Outcome.ACCEPTED, idempotent.Outcome.DUPLICATE)
        assert broker.end_offset("t", 0) == 2
    finally:
        broker.close()
    # the job resumes after sequence 10 (the batch's last source offset)
    (tmp_path / "in.txt").write_bytes(b"0123456789\nnext\n")  # "next" starts at byte 11
    summary = Mirror(f"file://{tmp_path / 'in.txt'}", dest, to_topic="t", job="j").run()
    assert summary.partitions[0].resumed_after == 10 and summary.copied == 1
    assert [r.value for r in _stored(dest, "t")[0]] == [b"a", b"b", b"next"]


def test_follow_copies_new_records_until_stopped(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"one\n")
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    mirror = Mirror(f"file://{source}", dest, to_topic="t", job="j", follow=True)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(mirror.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 20
        with source.open("ab") as handle:
            handle.write(b"two\nthr")  # an unfinished line is not copied while following
            handle.flush()
            while len(_stored(dest, "t").get(0, [])) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            assert [r.value for r in _stored(dest, "t")[0]] == [b"one", b"two"]
            handle.write(b"ee\n")
        while len(_stored(dest, "t")[0]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        mirror.stop()
        thread.join(20)
    assert [r.value for r in _stored(dest, "t")[0]] == [b"one", b"two", b"three"]
    summary = result[0]
    assert isinstance(summary, idempotent.mirror.MirrorSummary)
    assert summary.copied == 3 and not summary.completed


def test_two_runs_of_one_task_fence_each_other(tmp_path: Path) -> None:
    src = f"memory://{uuid.uuid4().hex}"
    reset_store(src[len("memory://") :])
    count = 3 * POLL_RECORDS  # several batches
    _fill(src, "t", 1, count)
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    mirror = Mirror(src, dest, topic="t", job="j")
    source = open_source(src)
    broker = idempotent.connect(dest)
    try:
        (task,) = mirror.plan(source, broker)
        fenced = threading.Event()
        seen: list[int] = []

        def take_over(report: PartitionProgress) -> None:
            seen.append(report.position)
            if len(seen) == 1:  # a second run starts while the first is copying
                copy_partition(task, source=source, broker=broker)
                fenced.set()

        with pytest.raises(ProducerFencedError):
            copy_partition(task, source=source, broker=broker, progress=take_over)
        assert fenced.is_set()
        assert [r.value for r in broker.read("t", 0, 0, count)] == [f"v{i}".encode() for i in range(count)]
    finally:
        broker.close()
        source.close()


def test_bad_jobs_are_refused_before_anything_is_copied(tmp_path: Path) -> None:
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    with pytest.raises(ConfigError, match="name"):
        Mirror("sqlite:///x.db", dest, topic="t", job="")
    with pytest.raises(ConfigError, match="destination topic"):
        Mirror(f"file://{tmp_path}", dest, job="j")
    with pytest.raises(ConfigError, match="source topic"):
        Mirror("sqlite:///x.db", dest, job="j")
    with pytest.raises(ConfigError, match="unknown source URL scheme"):
        Mirror("ftp://host/x", dest, topic="t", job="j").run()
    with pytest.raises(InvalidTopicError):
        Mirror(f"file://{tmp_path / 'missing'}", dest, to_topic="t", job="j").run()
    src = f"sqlite:///{tmp_path / 's.db'}"
    _fill(src, "t", 3, 3)
    broker = idempotent.connect(dest)
    broker.create_topic("small", 2)
    broker.close()
    with pytest.raises(ConfigError, match="has 2 partitions; the source has 3"):
        Mirror(src, dest, topic="t", to_topic="small", job="j").run()
    with pytest.raises(InvalidTopicError):
        Mirror(src, dest, topic="nope", job="j").run()
    assert "nope" not in idempotent.connect(src).topics()


def test_source_headers_replace_the_coordinates_of_an_earlier_copy() -> None:
    record = SourceRecord(7, None, b"v", (("a", b"1"), ("idem.src.offset", b"3")), 1.5)
    assert source_headers(record, "t", 2) == (
        ("a", b"1"),
        ("idem.src.topic", b"t"),
        ("idem.src.partition", b"2"),
        ("idem.src.offset", b"7"),
        ("idem.src.timestamp", b"1500"),
    )
    assert source_headers(SourceRecord(7, None, b"v"), "t", 0)[-1] == ("idem.src.offset", b"7")


class _ListSource:
    """A source of one partition holding records at given offsets."""

    url = "list://"

    def __init__(self, offsets: list[int]) -> None:
        self.records = [SourceRecord(o, None, b"%d" % o) for o in offsets]

    def partitions(self, topic: str) -> int:
        return 1

    def end(self, topic: str, partition: int) -> int:
        return self.records[-1].offset + 1 if self.records[-1].offset < 2**63 - 1 else 2**63 - 1

    def open_partition(self, topic: str, partition: int, after: int, end: int | None) -> _ListReader:
        return _ListReader([r for r in self.records if r.offset > after])

    def source_topic(self, topic: str, partition: int) -> str:
        return topic

    def close(self) -> None:
        pass


class _ListReader:
    def __init__(self, records: list[SourceRecord]) -> None:
        self.records = records

    def poll(self, max_records: int, timeout: float) -> Polled:
        out, self.records = self.records[:2], self.records[2:]  # two per batch
        return Polled(out, not out)

    def close(self) -> None:
        pass


def test_offsets_beyond_31_bits_resume_exactly(tmp_path: Path) -> None:
    offsets = [0, 2**30 + 1, 2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**62, 2**63 - 2]
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    broker = idempotent.connect(dest)
    try:
        source = _ListSource(offsets[:5])
        (task,) = Mirror("list://", dest, topic="t", job="j").plan(source, broker)
        first = copy_partition(task, source=source, broker=broker)
        assert (first.copied, first.last_offset) == (5, 2**32)
        source = _ListSource(offsets)  # the source grew: the copy resumes after 2**32
        (task,) = Mirror("list://", dest, topic="t", job="j").plan(source, broker)
        second = copy_partition(task, source=source, broker=broker)
        assert (second.resumed_after, second.copied, second.last_offset) == (2**32, 3, 2**63 - 2)
        stored = broker.read("t", 0, 0, 100)
        assert [int(dict(r.headers)["idem.src.offset"]) for r in stored] == offsets
        assert [r.value for r in stored] == [b"%d" % o for o in offsets]
    finally:
        broker.close()


class _RefusesFirstBatch:
    """A destination whose first produce is refused (retriable, nothing stored) only after
    the copy could have sent the next batch behind it."""

    def __init__(self, inner: idempotent.BrokerAPI, on_refuse: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.refused = False
        self.on_refuse = on_refuse

    def init_producer(self, name: str) -> object:
        return self.inner.init_producer(name)

    def submit_request(self, request: idempotent.ProduceRequest) -> Future[idempotent.ProduceResult]:
        if self.refused:
            return self.inner.submit_request(request)
        self.refused = True
        if self.on_refuse is not None:
            self.on_refuse()
        answer: Future[idempotent.ProduceResult] = Future()
        threading.Timer(0.3, answer.set_exception, [PartitionRecoveringError("recovering")]).start()
        return answer


def test_a_stopped_copy_retries_a_passing_failure_and_stops_cleanly(tmp_path: Path) -> None:
    """A job stopped (SIGTERM) while its destination is still recovering settles what it sent
    and returns, instead of failing with "run the same command again"; nothing is stored
    twice or out of order."""
    source = tmp_path / "in.txt"
    count = 3 * POLL_RECORDS
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(count)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    broker = idempotent.connect(dest)
    try:
        (task,) = Mirror(f"file://{source}", dest, to_topic="t", job="j").plan(open_source(f"file://{source}"), broker)
        stop = threading.Event()
        flaky = _RefusesFirstBatch(broker, on_refuse=stop.set)  # the stop arrives with the refusal
        summary = copy_partition(task, broker=flaky, stop=stop)  # type: ignore[arg-type]
        assert flaky.refused
        stored = [r.value for r in broker.read("t", 0, 0, count)]
        assert stored == [b"line %d" % i for i in range(len(stored))] and summary.copied == len(stored)
    finally:
        broker.close()


def test_a_job_started_while_its_destination_is_down_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job started while its destination restarts (a connect or a topic creation that times
    out) retries as a running copy does, then copies everything once; a failure that is not
    retriable ends it at once."""
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    real = idempotent.connect
    calls: list[str] = []

    def down_twice(url: str, *args: object, **kwargs: object) -> idempotent.BrokerAPI:
        calls.append(url)
        if len(calls) <= 2:
            raise BackendUnavailableError("kafka: connect: _TIMED_OUT: Failed to get metadata")
        return real(url, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(idempotent, "connect", down_twice)
    summary = Mirror(f"file://{source}", dest, to_topic="lines", job="j").run()
    assert len(calls) == 3 and (summary.copied, summary.duplicates) == (100, 0)
    assert [r.value for r in _stored(dest, "lines")[0]] == [b"line %d" % i for i in range(100)]

    def refused(url: str, *args: object, **kwargs: object) -> idempotent.BrokerAPI:
        calls.append(url)
        raise ConfigError("bad destination")

    calls.clear()
    monkeypatch.setattr(idempotent, "connect", refused)
    with pytest.raises(ConfigError):
        Mirror(f"file://{source}", dest, to_topic="lines", job="j").run()
    assert len(calls) == 1


def test_a_batch_refused_for_a_passing_reason_is_not_overtaken(tmp_path: Path) -> None:
    """Regression: batches were pipelined, so under the monotonic policy the batch behind a
    refused one was stored and the refused one lost for good."""
    source = tmp_path / "in.txt"
    count = 3 * POLL_RECORDS  # several batches
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(count)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    broker = idempotent.connect(dest)
    try:
        (task,) = Mirror(f"file://{source}", dest, to_topic="t", job="j").plan(open_source(f"file://{source}"), broker)
        flaky = _RefusesFirstBatch(broker)
        summary = copy_partition(task, broker=flaky)  # type: ignore[arg-type]
        assert flaky.refused and summary.copied == count
        assert [r.value for r in broker.read("t", 0, 0, count)] == [b"line %d" % i for i in range(count)]
    finally:
        broker.close()


class _Limited:
    """A destination that says it takes batches of at most ``max_batch_bytes`` (as a
    Pulsar-backed broker says its entry size), and records the batches sent."""

    def __init__(self, inner: idempotent.BrokerAPI, max_batch_bytes: int | None) -> None:
        self.inner = inner
        self.max_batch_bytes = max_batch_bytes
        self.batches: list[tuple[int, int]] = []  # (records, size)

    def init_producer(self, name: str) -> object:
        return attrs.evolve(self.inner.init_producer(name), max_batch_bytes=self.max_batch_bytes)

    def submit_request(self, request: idempotent.ProduceRequest) -> Future[idempotent.ProduceResult]:
        self.batches.append((len(request.records), request.size))
        return self.inner.submit_request(request)


def _copy_file_through(tmp_path: Path, lines: list[bytes], max_batch_bytes: int | None) -> _Limited:
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    broker = idempotent.connect(dest)
    try:
        (task,) = Mirror(f"file://{source}", dest, to_topic="t", job="j").plan(open_source(f"file://{source}"), broker)
        limited = _Limited(broker, max_batch_bytes)
        summary = copy_partition(task, broker=limited)  # type: ignore[arg-type]
        assert summary.copied == len(lines)
        assert [r.value for r in broker.read("t", 0, 0, len(lines) + 1)] == lines
        return limited
    finally:
        broker.close()


def test_batches_stay_within_the_destinations_batch_limit(tmp_path: Path) -> None:
    """Regression: batches were cut at a fixed size whatever the destination takes, so a
    destination with a smaller limit (a Pulsar entry) would refuse them."""
    lines = [b"line %d" % i + b"x" * (i % 50) for i in range(3000)]
    limited = _copy_file_through(tmp_path, lines, 4000)
    assert len(limited.batches) > 1
    assert all(size <= 4000 for _, size in limited.batches)
    assert max(size for _, size in limited.batches) > 4000 - 200  # cut at the limit, not far below


def test_a_poll_of_records_goes_as_one_batch(tmp_path: Path) -> None:
    """Regression (throughput): each batch costs the destination one round trip (a Kafka
    transaction), and batches were cut at 2,000 records; a poll of up to 10,000 goes as one."""
    lines = [b"line %d" % i for i in range(10_000)]
    limited = _copy_file_through(tmp_path, lines, None)
    assert [records for records, _ in limited.batches] == [10_000]


@pytest.mark.parametrize(
    "record",
    [
        SourceRecord(0, None, b"v"),
        SourceRecord(2**62, b"key", None, (), 1_700_000_000.123),
        SourceRecord(7, b"", b"", (("a", b"1"), ("idem.src.offset", b"3"), ("b", b"")), 0.0),
        SourceRecord(12345, None, b"x" * 1000, (("idem.src.topic", b"old"),), None),
    ],
)
def test_the_size_of_a_copied_record_is_what_the_destination_counts(record: SourceRecord) -> None:
    topic, partition = ("idem.src.topic", b"persistent://public/default/t-partition-3"), ("idem.src.partition", b"3")
    headers, size = _with_coordinates(record, topic, partition, _fixed_size(topic, partition))
    assert headers == source_headers(record, topic[1].decode(), 3)
    assert size == idempotent.Record(record.value, record.key, headers).size


# -- a job copies one source ----------------------------------------------------------------


def test_a_job_refuses_another_file_before_copying_anything(tmp_path: Path) -> None:
    """Regression: reusing a job name for another file resumed after an offset of the first
    file and copied only the second file's tail (or nothing)."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"".join(b"a%d\n" % i for i in range(1000)))
    b.write_bytes(b"".join(b"b%d\n" % i for i in range(2000)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    assert Mirror(f"file://{a}", dest, to_topic="all", job="daily-import").run().copied == 1000
    with pytest.raises(ConfigError) as refused:
        Mirror(f"file://{b}", dest, to_topic="all", job="daily-import").run()
    message = refused.value.message
    assert "'daily-import'" in message and repr(str(a)) in message and repr(str(b)) in message
    assert "another --job name" in message
    assert [r.value for r in _stored(dest, "all")[0]] == [b"a%d" % i for i in range(1000)]  # nothing copied
    # a new job copies b from its beginning; the old one still resumes a
    assert Mirror(f"file://{b}", dest, to_topic="all", job="daily-import-b").run().copied == 2000
    assert Mirror(f"file://{a}", dest, to_topic="all", job="daily-import").run().copied == 0


def test_a_job_refuses_another_topic_into_the_same_destination(tmp_path: Path) -> None:
    """Regression: a job given another source topic resumed after the first topic's offsets."""
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "first", 2, 3000)
    _fill(src, "second", 2, 1000)
    assert Mirror(src, dest, topic="first", to_topic="all", job="j").run().copied == 3000
    with pytest.raises(ConfigError, match=r"job 'j' copied 'first' into all\[\d\].*cannot copy 'second'"):
        Mirror(src, dest, topic="second", to_topic="all", job="j").run()
    assert sum(len(records) for records in _stored(dest, "all").values()) == 3000


def test_a_job_of_before_per_topic_names_resumes_without_copying_again(tmp_path: Path) -> None:
    """A partition a job wrote under ``job/partition`` (the names before topics were in them)
    resumes after what that producer stored, and is written under the new name from then on."""
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "t", 1, 100)
    source = _stored(src, "t")[0]
    broker = idempotent.connect(dest)
    try:  # what the job stored under its old name: the first 60 records, offsets as sequences
        broker.create_topic("t", 1)
        broker.set_policy("monotonic", topic="t")
        session = broker.init_producer("j/0")
        batch = [
            idempotent.Record(r.value, r.key, source_headers(SourceRecord(r.offset, r.key, r.value), "t", 0))
            for r in source[:60]
        ]
        assert broker.produce("t", 0, session.producer_id, session.producer_epoch, 0, batch).outcome.value == "accepted"
    finally:
        broker.close()
    summary = Mirror(src, dest, topic="t", job="j").run()
    assert (summary.copied, summary.partitions[0].resumed_after) == (40, 59)
    assert [r.value for r in _stored(dest, "t")[0]] == [r.value for r in source]
    # the old name copied another topic: refused
    _fill(src, "u", 1, 10)
    with pytest.raises(ConfigError, match="copied 't'"):
        Mirror(src, dest, topic="u", to_topic="t", job="j").run()


# -- several topics -------------------------------------------------------------------------


def test_producer_names_split_back_and_never_collide() -> None:
    assert producer_name("j", 0) == "j/0"  # a file, as before
    assert producer_name("j", 2, "orders") == "j/orders/2"
    assert producer_name("j", 2, "persistent://public/default/orders") == "j/orders/2"
    assert producer_name("j", 1, "tenant/ns/x") == "j/tenant%2Fns%2Fx/1"
    assert producer_name("a/b", 0, "t") == "a%2Fb/t/0" != producer_name("a", 0, "b/t") == "a/b%2Ft/0"
    assert parse_producer_name("j", "j/tenant%2Fns%2Fx/1") == JobProducer("j/tenant%2Fns%2Fx/1", "tenant/ns/x", 1)
    assert parse_producer_name("j", "j/3") == JobProducer("j/3", None, 3)
    for other in ["j2/0", "j/x/y/0", "j/x/01", "j//0", "j/x/", None, "a/b/t/0"]:
        assert parse_producer_name("j", other) is None, other
    assert parse_producer_name("a/b", "a/b/t/0") is None
    assert parse_producer_name("a/b", "a%2Fb/t/0") == JobProducer("a%2Fb/t/0", "t", 0)


def test_topic_patterns_are_names_and_whole_name_expressions() -> None:
    pattern = TopicPattern("orders, orders.v1,pay-.*")
    assert pattern.names == ("orders", "orders.v1") and pattern.has_expressions
    assert pattern.matches("pay-eu") and pattern.matches("orders.v1")
    assert not pattern.matches("ordersXv1") and not pattern.matches("xpay-eu") and not pattern.matches("pay")
    assert pattern.select(["pay-us", "zzz", "orders", "pay-eu"]) == ["orders", "orders.v1", "pay-eu", "pay-us"]
    assert not TopicPattern(["a", "b"]).has_expressions
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        TopicPattern("a,(b")
    with pytest.raises(ConfigError, match="names no topic"):
        TopicPattern(" , ")


def test_topics_copy_each_topic_with_its_own_resume_point(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "eu.orders", 2, 400)
    _fill(src, "us.orders", 3, 300)
    _fill(src, "audit", 1, 50)
    summary = Mirror(src, dest, topics=r"(eu|us)\.orders", to_prefix="copy.", job="j").run()
    assert summary.copied == 700 and summary.topics == ["eu.orders", "us.orders"]
    assert "2 topics" in str(summary) and "eu.orders[0]" not in str(summary)
    for topic, count in (("eu.orders", 2), ("us.orders", 3)):
        source, copied = _stored(src, topic), _stored(dest, "copy." + topic)
        assert len(copied) == count
        for p in range(count):
            assert [r.value for r in copied[p]] == [r.value for r in source[p]]
    assert "audit" not in idempotent.connect(dest).topics() and "copy.audit" not in idempotent.connect(dest).topics()
    # one topic grows: only it is copied, from its own resume point
    _fill(src, "us.orders", 3, 30, start=300)
    again = Mirror(src, dest, topics="eu.orders,us.orders", to_prefix="copy.", job="j").run()
    assert again.copied == 30
    assert {(p.topic, p.partition): p.resumed_after >= 0 for p in again.partitions} == {
        ("eu.orders", 0): True,
        ("eu.orders", 1): True,
        ("us.orders", 0): True,
        ("us.orders", 1): True,
        ("us.orders", 2): True,
    }
    assert "eu.orders[0]@" in str(again)
    with pytest.raises(InvalidTopicError):
        Mirror(src, dest, topics="eu.orders,missing", job="j").run()
    with pytest.raises(ConfigError, match=r"no topic of .* matches"):
        Mirror(src, dest, topics="nothing-.*", job="j").run()


def test_topics_and_topic_are_one_job(tmp_path: Path) -> None:
    """``--topic T`` and ``--topics T`` name the same producers: either resumes the other."""
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "t", 2, 100)
    assert Mirror(src, dest, topic="t", job="j").run().copied == 100
    assert Mirror(src, dest, topics="t", job="j").run().copied == 0
    assert Mirror(src, dest, topics=".*", job="j").run().copied == 0


def test_bad_topic_options_are_refused(tmp_path: Path) -> None:
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    with pytest.raises(ConfigError, match="not both"):
        Mirror("sqlite:///x.db", dest, topic="t", topics="u", job="j")
    with pytest.raises(ConfigError, match="--to-prefix"):
        Mirror("sqlite:///x.db", dest, topics="u", to_topic="v", job="j")
    with pytest.raises(ConfigError, match="file source has no topics"):
        Mirror(f"file://{tmp_path}", dest, topics="u", to_topic="v", job="j")


def _wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _count(url: str, topic: str) -> int:
    try:
        return sum(len(records) for records in _stored(url, topic).values())
    except idempotent.ProducerError:
        return 0


def test_a_following_job_picks_up_new_matching_topics(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "logs-a", 1, 20)
    mirror = Mirror(src, dest, topics="logs-.*", job="j", follow=True, refresh_interval=0.2)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(mirror.run()))
    thread.start()
    try:
        _wait_for(lambda: _count(dest, "logs-a") == 20)
        _fill(src, "logs-b", 2, 30)
        _fill(src, "other", 1, 5)
        _wait_for(lambda: _count(dest, "logs-b") == 30)
        _fill(src, "logs-a", 1, 5, start=20)
        _wait_for(lambda: _count(dest, "logs-a") == 25)
    finally:
        mirror.stop()
        thread.join(30)
    summary = result[0]
    assert isinstance(summary, idempotent.mirror.MirrorSummary)
    assert summary.copied == 55 and summary.topics == ["logs-a", "logs-b"]
    assert "other" not in idempotent.connect(dest).topics()


def test_a_following_job_copies_every_partition_whatever_its_parallelism(tmp_path: Path) -> None:
    """Regression: a following job ran its partitions in a pool of ``parallelism`` threads, so
    the partitions beyond it were never copied (the first ones never end)."""
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "t", 3, 30)
    mirror = Mirror(src, dest, topic="t", job="j", follow=True, parallelism=1)
    thread = threading.Thread(target=mirror.run)
    thread.start()
    try:
        _wait_for(lambda: _count(dest, "t") == 30, timeout=20)
    finally:
        mirror.stop()
        thread.join(30)


# -- status -----------------------------------------------------------------------------------


def test_status_reads_the_resume_points_and_the_lag_from_the_destination(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path / 's.db'}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    _fill(src, "t", 2, 100)
    before = time.time()
    Mirror(src, dest, topic="t", to_topic="copy", job="j").run()
    _fill(src, "t", 2, 10, start=100)
    source = open_source(src)
    broker = idempotent.connect(dest)
    try:
        rows = job_status(broker, "j", source=source)
        assert [(r.topic, r.partition, r.to_topic, r.to_partition, r.producer_name) for r in rows] == [
            ("t", 0, "copy", 0, "j/t/0"),
            ("t", 1, "copy", 1, "j/t/1"),
        ]
        assert [(r.last_offset, r.end, r.lag) for r in rows] == [(49, 55, 5), (49, 55, 5)]
        assert all(before - 1 <= r.last_write <= time.time() + 1 for r in rows)
        assert [r.end for r in job_status(broker, "j", to_topics=["copy"])] == [None, None]
        assert job_status(broker, "other") == [] and job_status(broker, "j/t") == []
    finally:
        broker.close()
        source.close()


def test_mirror_modules_import_each_other_in_one_direction() -> None:
    """Regression: ``source.open_source`` imported the source modules, which imported
    ``source`` back (an import circle, even through imports inside functions)."""
    import ast
    import importlib.util

    package = Path(importlib.util.find_spec("idempotent.mirror").origin).parent  # type: ignore[arg-type, union-attr]
    names = {p.stem for p in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    imported.add(node.module.split(".")[0])
                else:
                    imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("idempotent.mirror."):
                imported.add(node.module.split(".")[2])
        graph[path.stem] = {m for m in imported if m in names and m != path.stem}
    graph.pop("__init__", None)

    def cycle_from(start: str, node: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in graph.get(node, ()):
            if nxt == start:
                return (*seen, nxt)
            if nxt not in seen:
                found = cycle_from(start, nxt, (*seen, nxt))
                if found:
                    return found
        return None

    cycles = [c for m in graph if (c := cycle_from(m, m, (m,)))]
    assert not cycles, f"import circles among idempotent.mirror modules: {cycles}"


def test_a_following_job_reports_lag_0_once_caught_up(tmp_path: Path) -> None:
    """The progress reports follow the lag as the source counts it (bytes after the last
    copied line), also when the position stopped moving: a caught-up file shows 0."""
    source = tmp_path / "in.txt"
    source.write_bytes(b"".join(b"line %d\n" % i for i in range(3000)))
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    reports: list[PartitionProgress] = []
    mirror = Mirror(f"file://{source}", dest, to_topic="t", job="j", follow=True, progress=reports.append)
    thread = threading.Thread(target=mirror.run)
    thread.start()
    try:
        _wait_for(lambda: bool(reports) and reports[-1].copied == 3000)
        _wait_for(lambda: reports[-1].lag == 0, timeout=15)  # the end is asked every 5 s
        with source.open("ab") as handle:
            handle.write(b"x\n")
        _wait_for(lambda: reports[-1].copied == 3001 and reports[-1].lag == 0, timeout=15)
    finally:
        mirror.stop()
        thread.join(30)
