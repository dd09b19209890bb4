"""Plain Pulsar topics as a mirror source (``pulsar+native://``): message ids as offsets."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent.adapters.pulsar.source import full_topic, pack_message_id, short_topic, unpack_offset
from idempotent.errors import ConfigError
from idempotent.mirror import Mirror, open_source
from idempotent.testing.services import ServiceInfo


def test_message_ids_pack_into_ordered_offsets() -> None:
    ids = [(0, 0, -1), (0, 0, 1), (0, 1, 0), (5, 0, 0), (5, 2**18 - 1, 4095), (2**33 - 1, 0, 0)]
    packed = [pack_message_id(*i) for i in ids]
    assert packed == sorted(packed) and len(set(packed)) == len(packed)
    assert packed[-1] < 2**63
    assert unpack_offset(pack_message_id(12, 34, 5)) == (12, 34, 5)
    for bad in [(2**33, 0, 0), (0, 2**18, 0), (0, 0, 2**12), (-1, 0, 0)]:
        with pytest.raises(ConfigError, match="does not fit"):
            pack_message_id(*bad)


def test_short_topic_names_are_in_public_default() -> None:
    assert full_topic("orders") == "persistent://public/default/orders"
    assert full_topic("persistent://t/n/x") == "persistent://t/n/x"
    assert full_topic("t/n/x") == "persistent://t/n/x"
    assert short_topic("persistent://public/default/orders") == "orders"
    assert short_topic("persistent://t/n/x") == "t/n/x"


def test_namespaces_to_list_are_checked() -> None:
    with pytest.raises(ConfigError, match="namespaces="):
        open_source("pulsar+native://127.0.0.1:1?namespaces=public")
    with pytest.raises(ConfigError, match="unknown pulsar"):
        open_source("pulsar+native://127.0.0.1:1?nope=1")


def _create(admin_url: str, topic: str, partitions: int) -> None:
    request = urllib.request.Request(
        f"{admin_url}/admin/v2/persistent/public/default/{topic}/partitions", data=b"%d" % partitions, method="PUT"
    )
    request.add_header("Content-Type", "application/json")
    urllib.request.urlopen(request, timeout=30).read()


def _send(service_url: str, topic: str, count: int, partitions: int, start: int = 0) -> None:
    import pulsar

    client = pulsar.Client(service_url, logger=logging.getLogger("test.pulsar"))
    try:
        producers = [
            client.create_producer(
                f"persistent://public/default/{topic}-partition-{p}", batching_enabled=True, batching_max_messages=7
            )
            for p in range(partitions)
        ]
        for i in range(start, start + count):
            producers[i % partitions].send_async(b"v%d" % i, None, partition_key=f"k{i}")
        for producer in producers:
            producer.flush()
    finally:
        client.close()


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


def _wait(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.pulsar
def test_reusing_a_job_for_another_pulsar_topic_is_refused(tmp_path: Path, pulsar_service: ServiceInfo) -> None:
    """Regression: a job given another Pulsar topic resumed after a message id of the first."""
    assert pulsar_service.admin_url is not None
    first, second = f"pm-{uuid.uuid4().hex[:8]}", f"pm-{uuid.uuid4().hex[:8]}"
    for topic in (first, second):
        _create(pulsar_service.admin_url, topic, 2)
        _send(pulsar_service.bootstrap, topic, 100, 2)
    source = f"pulsar+native://{pulsar_service.bootstrap.split('://')[1]}?admin_url={pulsar_service.admin_url}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    assert Mirror(source, dest, topic=first, to_topic="all", job="j").run().copied == 100
    with pytest.raises(ConfigError, match=rf"job 'j' copied '.*{first}-partition-\d' into all\[\d\]"):
        Mirror(source, dest, topic=second, to_topic="all", job="j").run()
    assert _count(dest, "all") == 100


@pytest.mark.pulsar
def test_a_source_written_by_this_project_is_copied_without_its_writers_identity(
    tmp_path: Path, pulsar_service: ServiceInfo
) -> None:
    """A topic a named producer of this project wrote on Pulsar (each record its own batch,
    each head carrying ``idem.*`` properties) copied through ``pulsar+native://``: the copies
    carry the application's headers, ``idem.``-named ones included, and not the source
    writer's identity."""
    assert pulsar_service.admin_url is not None
    topic = f"pm-{uuid.uuid4().hex[:8]}"
    _create(pulsar_service.admin_url, topic, 1)
    sent = [{"app": b"%d" % i, "idem.trace": b"t%d" % i} for i in range(3)]
    url = f"{pulsar_service.url}?admin_url={pulsar_service.admin_url}"
    with idempotent.Producer(url, producer_name=f"w-{topic}") as producer:
        for i, headers in enumerate(sent):
            producer.send(topic, b"v%d" % i, partition=0, headers=headers).result()
    source = f"pulsar+native://{pulsar_service.bootstrap.split('://')[1]}?admin_url={pulsar_service.admin_url}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    assert Mirror(source, dest, topic=topic, to_topic="copy", job="j").run().copied == 3
    broker = idempotent.connect(dest)
    try:
        copies = broker.read("copy", 0, 0, 100)
    finally:
        broker.close()
    assert [r.value for r in copies] == [b"v%d" % i for i in range(3)]
    for record, headers in zip(copies, sent, strict=True):
        own = {name: value for name, value in record.headers if not name.startswith("idem.src.")}
        assert own == headers


@pytest.mark.pulsar
def test_topics_by_pattern_follow_and_status(tmp_path: Path, pulsar_service: ServiceInfo) -> None:
    """``--topics`` over a Pulsar namespace: a following job picks up a new matching topic;
    ``mirror status`` counts the entries it is behind."""
    assert pulsar_service.admin_url is not None
    prefix = f"pt{uuid.uuid4().hex[:6]}"
    _create(pulsar_service.admin_url, f"{prefix}-a", 2)
    _create(pulsar_service.admin_url, f"{prefix}x", 1)
    _send(pulsar_service.bootstrap, f"{prefix}-a", 40, 2)
    _send(pulsar_service.bootstrap, f"{prefix}x", 5, 1)
    source = f"pulsar+native://{pulsar_service.bootstrap.split('://')[1]}?admin_url={pulsar_service.admin_url}"
    dest = f"sqlite:///{tmp_path / 'd.db'}"
    opened = open_source(source)
    try:
        assert {f"{prefix}-a", f"{prefix}x"} <= set(opened.topics())
        assert not any("-partition-" in t or t.startswith("__") for t in opened.topics())
    finally:
        opened.close()
    mirror = Mirror(source, dest, topics=f"{prefix}-.*", job="j", follow=True, refresh_interval=0.5)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(mirror.run()))
    thread.start()
    try:
        _wait(lambda: _count(dest, f"{prefix}-a") == 40)
        _create(pulsar_service.admin_url, f"{prefix}-b", 2)
        _send(pulsar_service.bootstrap, f"{prefix}-b", 30, 2)
        _wait(lambda: _count(dest, f"{prefix}-b") == 30)
    finally:
        mirror.stop()
        thread.join(60)
    summary = result[0]
    assert isinstance(summary, idempotent.mirror.MirrorSummary)
    assert summary.copied == 70 and summary.topics == [f"{prefix}-a", f"{prefix}-b"]
    rows = _status_rows(dest, source)
    assert {(r["topic"], r["partition"]) for r in rows} == {(f"{prefix}-{t}", p) for t in "ab" for p in (0, 1)}
    assert all(r["lag"] == 0 for r in rows), rows
    _send(pulsar_service.bootstrap, f"{prefix}-b", 14, 1, start=30)  # two batches of 7: two entries
    lags = {(r["topic"], r["partition"]): r["lag"] for r in _status_rows(dest, source)}
    assert lags[(f"{prefix}-b", 0)] == 2 and lags[(f"{prefix}-a", 0)] == 0


def _status_rows(dest: str, source: str) -> list[dict[str, Any]]:
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
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


_LOG_PROBE = """
import logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger().addHandler(Keep())
logging.getLogger("idempotent.mirror.pulsar").setLevel(logging.INFO)
from idempotent.mirror import open_source
source = open_source(sys.argv[1])
reader = source.open_partition(sys.argv[2], 0, -1, None)
reader.poll(10, 0.5)
reader.close()
source.close()
mine = [r for r in records if r.name == "idempotent.mirror.pulsar"]
print(len(mine), min((r.levelname for r in mine), default="-"))
"""


@pytest.mark.pulsar
def test_pulsar_client_lines_of_the_source_go_to_python_logging(pulsar_service: ServiceInfo) -> None:
    """Regression: the source client's C++ log lines went straight to the process's output."""
    assert pulsar_service.admin_url is not None
    topic = f"pl-{uuid.uuid4().hex[:8]}"
    _create(pulsar_service.admin_url, topic, 1)
    source = f"pulsar+native://{pulsar_service.bootstrap.split('://')[1]}?admin_url={pulsar_service.admin_url}"
    out = subprocess.run([sys.executable, "-c", _LOG_PROBE, source, topic], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    *before, last = out.stdout.splitlines()
    output = "\n".join(before) + out.stderr
    assert "ClientConnection" not in output and "INFO" not in output, output
    count, level = last.split()
    assert int(count) >= 1 and level == "INFO"
