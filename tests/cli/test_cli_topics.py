"""``idempotent topics list|describe|create|delete`` on every broker URL, run as the command."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent.net.server import BrokerServer

from ..cli_helpers import run


def _lifecycle(capsys: pytest.CaptureFixture[str], url: str) -> None:
    """Create with settings, fill, list, describe, refuse a delete without --yes, delete, and
    create again under the name with another partition count: it starts empty."""
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    code, out, err = run(capsys, "topics", "create", url, topic, "--partitions", "2", "--config", "policy=monotonic")
    assert code == 0, err
    assert f"created topic {topic} with 2 partition(s)" in out and "policy monotonic" in out
    assert run(capsys, "produce", url, topic, "--generate", "6", "--quiet")[0] == 0

    code, out, err = run(capsys, "topics", "list", url, "--json")
    assert code == 0, err
    (row,) = [r for r in json.loads(out) if r["topic"] == topic]
    ends = _read_ends(url, topic)  # read here: Kafka's markers and Pulsar's ids take offsets too
    assert row == {"topic": topic, "partitions": 2, "end_offsets": ends, "deduplication": True, "policy": "monotonic"}
    code, out, err = run(capsys, "topics", "list", url)
    (line,) = [line.split() for line in out.splitlines() if line.startswith(topic + " ")]
    assert line == [topic, "2", "on", "monotonic", f"{ends[0]},{ends[1]}"], out

    code, out, err = run(capsys, "topics", "describe", url, topic, "--json")
    assert code == 0, err
    described = json.loads(out)
    assert (described["partitions"], described["end_offsets"], described["policy"]) == (2, ends, "monotonic")
    assert [p["end_offset"] for p in described["partition_details"]] == ends
    assert all(p["producers"] == 1 for p in described["partition_details"])
    code, out, err = run(capsys, "topics", "describe", url, topic)
    assert code == 0 and out.startswith(f"topic {topic}: 2 partition(s), deduplication on, policy monotonic"), out

    code, out, err = run(capsys, "topics", "delete", url, topic)
    assert (code, out) == (2, "")
    assert "without --yes" in err and f"2 partition(s), end offsets {ends[0]},{ends[1]}" in err
    assert topic in json.dumps(json.loads(run(capsys, "topics", "list", url, "--json")[1]))

    code, out, err = run(capsys, "topics", "delete", url, topic, "--yes")
    assert code == 0, err
    assert f"deleted topic {topic} (2 partition(s), end offsets {ends[0]},{ends[1]})" in out
    code, out, _ = run(capsys, "topics", "list", url, "--json")
    assert topic not in [r["topic"] for r in json.loads(out)]
    code, _, err = run(capsys, "topics", "delete", url, topic, "--yes")
    assert code == 2 and f"unknown topic {topic!r}" in err

    assert run(capsys, "topics", "create", url, topic, "--partitions", "3")[0] == 0  # the old count is gone
    assert run(capsys, "produce", url, topic, "--generate", "3", "--quiet")[0] == 0
    code, out, err = run(capsys, "topics", "describe", url, topic, "--json")
    again = json.loads(out)
    assert (again["partitions"], again["end_offsets"], again["policy"]) == (3, _read_ends(url, topic), "strict")
    assert _records(url, topic) == 3, again  # the 6 records of before are gone


def _read_ends(url: str, topic: str) -> list[int]:
    from idempotent.cli import open_read_only

    broker = open_read_only(url)
    try:
        return [broker.end_offset(topic, p) for p in range(broker.partitions_for(topic, create=False))]
    finally:
        broker.close()


def _records(url: str, topic: str) -> int:
    from ..cli_helpers import read_all

    return sum(len(records) for records in read_all(url, topic).values())


def test_topics_on_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _lifecycle(capsys, f"sqlite:///{tmp_path / 'log.db'}")


def test_topics_through_a_broker_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broker = idempotent.connect(f"sqlite:///{tmp_path / 'log.db'}")
    with BrokerServer(broker) as server:
        _lifecycle(capsys, server.url)


def test_topics_on_memory_say_what_it_means(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "topics", "create", "memory://", "t", "--partitions", "2")
    assert code == 0 and "created topic t" in out
    assert "memory:// lives in this process only" in err
    code, out, err = run(capsys, "topics", "list", "memory://")
    assert (code, out.strip()) == (0, "no topics in memory://")
    assert "memory:// lives in this process only" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topics", "create", "sqlite:///{db}", "t", "--config", "retention.ms=1"], "unknown setting 'retention.ms'"),
        (["topics", "create", "sqlite:///{db}", "t", "--config", "policy=loose"], "policy takes strict or monotonic"),
        (["topics", "create", "sqlite:///{db}", "t", "--partitions", "0"], "at least 1"),
        (["topics", "describe", "sqlite:///{db}", "nope"], "unknown topic 'nope'"),
        (["topics", "delete", "sqlite:///{tmp}/missing.db", "t", "--yes"], "no database file"),
        (["topics", "list", "sqlite:///{tmp}/missing.db"], "no database file"),
    ],
)
def test_topics_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    db = tmp_path / "log.db"
    with idempotent.connect(f"sqlite:///{db}") as broker:
        broker.create_topic("t", 1)
    code, out, err = run(capsys, *(a.format(db=db, tmp=tmp_path) for a in argv))
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "missing.db").exists()


@pytest.fixture
def pulsar_url(pulsar_service: Any) -> Iterator[str]:
    yield f"{pulsar_service.url}?{urllib.parse.urlencode({'admin_url': pulsar_service.admin_url})}"


@pytest.mark.kafka
def test_topics_on_kafka(kafka_service: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _lifecycle(capsys, kafka_service.url)


@pytest.mark.pulsar
def test_topics_on_pulsar(pulsar_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _lifecycle(capsys, pulsar_url)


def test_a_topic_whose_settings_cannot_be_read_is_listed_without_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One topic that cannot be read (a foreign, encrypted one on Pulsar timed out the whole
    listing) leaves the others listed as usual; stderr names it and why."""
    from idempotent.broker.broker import Broker
    from idempotent.errors import BackendUnavailableError

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    for topic in ("a", "b"):
        assert run(capsys, "topics", "create", url, topic, "--partitions", "2")[0] == 0
    real = Broker.stats

    def stats(self: Broker, topic: str | None = None) -> Any:
        if topic in (None, "a"):
            raise BackendUnavailableError("replay a[0]: timed out")
        return real(self, topic)

    monkeypatch.setattr(Broker, "stats", stats)
    code, out, err = run(capsys, "topics", "list", url, "--json")
    assert code == 0, err
    rows = {r["topic"]: r for r in json.loads(out)}
    assert (rows["a"]["partitions"], rows["a"]["deduplication"]) == (2, None)
    assert (rows["b"]["partitions"], rows["b"]["deduplication"]) == (2, True)
    assert "topic a: its settings could not be read (BackendUnavailableError: replay a[0]: timed out)" in err
