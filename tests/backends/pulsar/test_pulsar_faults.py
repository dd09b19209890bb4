"""Pulsar's routine faults under load, on the suite's standalone: a topic unloaded during writes
(what the load balancer does when it moves a topic), a namespace bundle unloaded, and the
broker restarted. Three producers write at once, each into its own partitioned topic:
``idempotent.Producer`` named and anonymous, and the pulsar-client drop-in. For each: no
fatal error, every record gets its outcome within the send timeout, and the topic holds every
record exactly once."""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import idempotent
from idempotent.adapters.pulsar.admin import Admin
from idempotent.adapters.pulsar.names import pulsar_topic_name
from idempotent.compat import pulsar as compat
from idempotent.testing import services

pytestmark = pytest.mark.pulsar

RECORDS = 3000
PARTITIONS = 3
#: the send timeout: every record must have its outcome well before the test gives up on it
TIMEOUT_S = 120


def _url(service: Any) -> str:
    return f"{service.url}?{urllib.parse.urlencode({'admin_url': service.admin_url})}"


class _Writer:
    """One producer writing RECORDS values ``<name>-<i>`` into its own topic, paced so that the
    writes span the fault, on a thread of its own; it records each record's outcome."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.topic = f"public/default/faults-{kind}-{uuid.uuid4().hex[:8]}"
        self.url = url
        self.outcomes: dict[int, str] = {}
        self.errors: list[BaseException] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"writer-{kind}")

    def start(self) -> None:
        with idempotent.connect(self.url) as broker:
            broker.create_topic(self.topic, partitions=PARTITIONS)
        self._thread.start()

    def _record(self, index: int, outcome: str) -> None:
        with self._lock:
            self.outcomes[index] = outcome

    def _run(self) -> None:
        try:
            if self.kind == "drop-in":
                self._run_drop_in()
            else:
                self._run_producer()
        except BaseException as exc:  # reported by the test, which fails on it
            self.errors.append(exc)

    def _pace(self, index: int, began: float) -> None:
        self.sent = index + 1
        pause = began + index / 400 - time.monotonic()  # about 400 records a second
        if pause > 0:
            time.sleep(pause)

    def _run_producer(self) -> None:
        name = f"faults-{uuid.uuid4().hex[:8]}" if self.kind == "named" else None
        with idempotent.Producer(self.url, name, linger_ms=5, delivery_timeout_ms=TIMEOUT_S * 1000) as producer:
            began = time.monotonic()
            for index in range(RECORDS):

                def done(error: BaseException | None, metadata: Any, index: int = index) -> None:
                    self._record(index, "ok" if error is None else repr(error))

                producer.send(
                    self.topic, b"%s-%d" % (self.kind.encode(), index), key=b"k%d" % (index % 7), on_delivery=done
                )
                self._pace(index, began)
            producer.flush(TIMEOUT_S)

    def _run_drop_in(self) -> None:
        client = compat.Client(self.url)
        try:
            producer = client.create_producer(
                f"persistent://{self.topic}",
                producer_name=f"faults-{uuid.uuid4().hex[:8]}",
                send_timeout_millis=TIMEOUT_S * 1000,
                block_if_queue_full=True,
            )
            began = time.monotonic()
            for index in range(RECORDS):

                def done(result: Any, msg_id: Any, index: int = index) -> None:
                    self._record(index, "ok" if result == compat.Result.Ok else str(result))

                producer.send_async(b"drop-in-%d" % index, done, partition_key=f"k{index % 7}")
                self._pace(index, began)
            producer.flush()
            producer.close()
        finally:
            client.close()

    def join(self) -> None:
        self._thread.join(TIMEOUT_S + 60)
        assert not self._thread.is_alive(), f"{self.kind}: the writer did not end"

    def check(self) -> None:
        """No error, an outcome for every record, all stored, each exactly once."""
        assert not self.errors, f"{self.kind}: {self.errors!r}"
        failed = {i: o for i, o in self.outcomes.items() if o != "ok"}
        assert not failed, f"{self.kind}: {len(failed)} failed, e.g. {list(failed.items())[:3]}"
        assert len(self.outcomes) == RECORDS, f"{self.kind}: {RECORDS - len(self.outcomes)} records without an outcome"
        with idempotent.Reader(self.url, self.topic) as reader:
            stored = Counter(m.value for m in reader)
        expected = Counter(b"%s-%d" % (self.kind.encode(), i) for i in range(RECORDS))
        assert stored == expected, (
            f"{self.kind}: {sum((expected - stored).values())} lost, {sum((stored - expected).values())} duplicated"
        )


def _under_load(service: Any, fault: Callable[[list[_Writer]], None]) -> None:
    url = _url(service)
    writers = [_Writer(kind, url) for kind in ("named", "anonymous", "drop-in")]
    for writer in writers:
        writer.start()
    deadline = time.monotonic() + 120
    while min(w.sent for w in writers) < RECORDS // 4:  # every writer is well under way
        assert time.monotonic() < deadline, [(w.kind, w.sent, w.errors) for w in writers]
        assert not any(w.errors for w in writers), [(w.kind, w.errors) for w in writers]
        time.sleep(0.05)
    assert max(w.sent for w in writers) < RECORDS, "the writes ended before the fault: slow them down"
    fault(writers)
    for writer in writers:
        writer.join()
    for writer in writers:
        writer.check()


def _admin(service: Any) -> Admin:
    return Admin(service.admin_url, {}, 30)


def test_topics_unloaded_during_writes(pulsar_service: Any) -> None:
    admin = _admin(pulsar_service)

    def unload(writers: list[_Writer]) -> None:
        for _ in range(2):  # twice, a second apart: each writer reconnects and carries on
            for writer in writers:
                admin.unload_topic(pulsar_topic_name(writer.topic).rest)
            time.sleep(1)
        assert max(w.sent for w in writers) < RECORDS  # still writing

    _under_load(pulsar_service, unload)


def test_namespace_bundles_unloaded_during_writes(pulsar_service: Any) -> None:
    admin = _admin(pulsar_service)

    def unload(writers: list[_Writer]) -> None:
        bundles = admin.bundles("public/default")
        assert bundles
        for bundle in bundles:  # every bundle: the data topics and the project's own ones
            admin.unload_bundle("public/default", bundle)
        time.sleep(1)
        admin.unload_bundle("public/default")  # then the whole namespace
        assert max(w.sent for w in writers) < RECORDS  # still writing

    _under_load(pulsar_service, unload)


def test_broker_restarted_under_load(pulsar_service: Any) -> None:
    _under_load(pulsar_service, lambda writers: services.restart("pulsar"))
