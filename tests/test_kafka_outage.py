"""A broker outage under named producers of both kinds, on the suite's Kafka: the broker paused
with SIGSTOP for longer than the request timeout, killed with -9 and restarted, and paused for
longer than the delivery timeout, while :class:`idempotent.Producer` and the confluent-kafka
drop-in write from their own processes (``tests/outage_apps.py``).

Counted from a plain ``read_committed`` consumer: no duplicate, no loss, no reorder, no fatal
error, every record with an outcome that matches the log (persisted: stored once; not
persisted: not stored; possibly persisted: either), and producing resumes by itself.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.kafka

PARTITIONS = 3


def _app(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.outage_apps", *map(str, args)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _result(process: subprocess.Popen[str], timeout: float = 400) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["log"] = err
    return result


def _topic(bootstrap: str) -> str:
    name = f"outage-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
    return name


def _read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes]]:
    """``(partition, value)`` of every record, in each partition's order, read by a plain
    ``read_committed`` consumer once no transaction is open on the topic (its reads end at
    the high watermark: a transaction an outage left open ends by Kafka's
    ``transaction.timeout.ms`` at the latest)."""
    deadline = time.monotonic() + 180
    while True:
        out, settled = _read_once(bootstrap, topic)
        if settled:
            return out
        assert time.monotonic() < deadline, f"a transaction stayed open on {topic} for 180 s"
        time.sleep(2)


def _read_once(bootstrap: str, topic: str) -> tuple[list[tuple[int, bytes]], bool]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    partitions = [confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    out: list[tuple[int, bytes]] = []
    ended: dict[int, int] = {}
    deadline = time.monotonic() + 120
    try:
        while len(ended) < PARTITIONS:
            assert time.monotonic() < deadline, f"read {len(out)} records; ended {sorted(ended)}"
            message = consumer.poll(1)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF, error
                ended[message.partition()] = message.offset()
                continue
            out.append((message.partition(), message.value()))
        highs = {p: consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1] for p, tp in enumerate(partitions)}
    finally:
        consumer.close()
    return out, all(ended[p] >= highs[p] for p in range(PARTITIONS))


def _check(results: dict[str, dict[str, Any]], stored: list[tuple[int, bytes]]) -> dict[str, Any]:
    """Every record's outcome against the log, per producer; the counts (all must be 0 but
    ``persisted``)."""
    counts: Counter[str] = Counter()
    for name, result in results.items():
        assert result["unended"] == 0 and result["left"] == 0, (name, result)
        indexes = [(p, int(v.decode().rsplit("-", 1)[1])) for p, v in stored if v.decode().rsplit("-", 1)[0] == name]
        copies = Counter(i for _, i in indexes)
        counts["duplicates"] += sum(n - 1 for n in copies.values())
        counts["lost"] += sum(1 for i in result["persisted"] if i not in copies)
        counts["stored though not persisted"] += sum(1 for i in result["not_persisted"] if i in copies)
        reported = {*result["persisted"], *result["possibly_persisted"]}
        counts["stored without an outcome"] += sum(1 for i in copies if i not in reported)
        for partition in range(PARTITIONS):
            order = [i for p, i in indexes if p == partition]
            counts["reordered"] += sum(1 for a, b in itertools.pairwise(order) if b <= a)
        counts["reported duplicates"] += result["duplicates"]
        counts["fatal send errors"] += sum(result["send_errors"].values())
        counts["persisted"] += len(result["persisted"])
    return dict(counts)


def _run(
    kafka_service: Any,
    fault: Callable[[], None],
    *,
    count: int = 2500,
    rate: float = 500,
    delivery_ms: float = 120_000,
    fault_after: float = 1.5,
    numbered: bool = False,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A named Producer and a named drop-in, each writing ``count`` records at ``rate`` a
    second into a new topic from its own process; ``fault`` runs ``fault_after`` seconds
    after both wrote their first records. Returns their results and the checked counts."""
    bootstrap = kafka_service.bootstrap
    topic = _topic(bootstrap)
    tag = uuid.uuid4().hex[:6]
    names = {"producer": f"p{tag}", "dropin": f"d{tag}"}
    # the request timeout of both (the backend's admin calls, flushes and commits; librdkafka's
    # request.timeout.ms) is 5 s: a pause longer than that times requests out
    url = f"{kafka_service.url}?timeout=5"
    flags = ["numbered"] if numbered else []
    apps = {
        "producer": _app("producer", url, topic, names["producer"], count, rate, delivery_ms),
        "dropin": _app("dropin", bootstrap, topic, names["dropin"], count, rate, delivery_ms, *flags),
    }
    try:
        deadline = time.monotonic() + 120
        while len({v.decode().rsplit("-", 1)[0] for _, v in _read_once(bootstrap, topic)[0]}) < 2:
            assert time.monotonic() < deadline, "the producers did not start writing"
            assert all(app.poll() is None for app in apps.values()), [_result(app) for app in apps.values()]
            time.sleep(0.5)
        time.sleep(fault_after)
        fault()
        results = {names[kind]: _result(app) for kind, app in apps.items()}
    finally:
        for app in apps.values():
            if app.poll() is None:
                app.kill()
                app.wait(30)
    counts = _check(results, _read_all(bootstrap, topic))
    return results, counts


def _pid() -> int:
    from idempotent.testing import services

    running = services.status("kafka")
    assert running is not None
    return running.pid


def _pause(seconds: float) -> Callable[[], None]:
    def fault() -> None:
        pid = _pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the fault itself lasts this long
        finally:
            os.kill(pid, signal.SIGCONT)

    return fault


def _assert_exact(results: dict[str, dict[str, Any]], counts: dict[str, Any]) -> None:
    # (a DUPLICATE answer to a resend whose first attempt was stored is correct, not a copy)
    bad = {k: v for k, v in counts.items() if k not in ("persisted", "reported duplicates") and v}
    assert not bad, (bad, {name: {k: r[k] for k in ("errors", "send_errors", "left")} for name, r in results.items()})
    for name, result in results.items():
        # within the delivery timeout nothing fails: every record persisted, the last ones after the fault
        assert result["not_persisted"] == [] and result["possibly_persisted"] == [], (name, result["errors"])
        assert len(result["persisted"]) == result["sent"], name
        assert "a bug" not in result["log"] and "Traceback" not in result["log"], result["log"][-3000:]


def test_kafka_paused_past_the_request_timeout_under_both_producers(kafka_service: Any) -> None:
    results, counts = _run(kafka_service, _pause(12.0))
    _assert_exact(results, counts)
    assert all(r["longest_gap"] >= 5 for r in results.values())  # the pause did stop them


def test_kafka_killed_and_restarted_under_both_producers(kafka_service: Any) -> None:
    from idempotent.testing import services

    def kill_and_restart() -> None:
        services.kill9("kafka")
        services.up("kafka", fresh=False)

    results, counts = _run(kafka_service, kill_and_restart)
    _assert_exact(results, counts)


def test_an_outage_past_the_delivery_timeout_gives_every_record_its_status_and_producing_resumes(
    kafka_service: Any,
) -> None:
    # the drop-in numbers its records itself here: with the application's sequences, the
    # records after an expired one wait for the application to send it again
    results, counts = _run(kafka_service, _pause(20.0), delivery_ms=8000, count=2500, numbered=True)
    bad = {k: v for k, v in counts.items() if k not in ("persisted", "reported duplicates") and v}
    summary = {
        name: {k: r[k] for k in ("errors", "send_errors", "sent", "resumed_after")} for name, r in results.items()
    }
    assert not bad, (bad, summary, [r["log"][-2000:] for r in results.values()])
    for name, result in results.items():
        failed = result["not_persisted"] + result["possibly_persisted"]
        assert failed, (name, "nothing expired: the pause did not outlast the delivery timeout")
        assert set(result["errors"]) <= {"DeliveryTimeoutError", "_MSG_TIMED_OUT"}, (name, result["errors"])
        # the producer stayed usable: a round of records sent after the failed ones persisted whole
        assert result["resumed_after"] is not None, (name, result["errors"])
        assert max(result["persisted"]) == result["sent"] - 1, name
        after = [i for i in result["persisted"] if i > max(failed)]
        assert len(after) >= 100, (name, len(after))
        print(f"{name}: {len(failed)} failed, resumed {result['resumed_after']:.1f} s after the first run")
        assert "a bug" not in result["log"] and "Traceback" not in result["log"], result["log"][-3000:]
