"""``idempotent admin``: deduplication settings and producer state."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

import idempotent
from idempotent import cli
from idempotent.adapters.memory import MemoryBackend, reset_store
from idempotent.producer.producer import Producer

from ..cli_helpers import run


def _admin_db(tmp_path: Path) -> str:
    """A database with topics ``t`` (2 partitions) and ``a/b/t``, written by named producers."""
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.connect(url) as broker:
        broker.create_topic("t", 2)
        with Producer(broker, "orders-copy") as producer:
            for i in range(6):
                producer.send("t", b"%d" % i, partition=i % 2)
            producer.send("a/b/t", b"x")
        with Producer(broker) as anonymous:
            anonymous.send("t", b"y", partition=1)
    return url


def _effective(url: str, topic: str) -> tuple[bool, str]:
    broker = cli.open_read_only(url)
    try:
        assert isinstance(broker, idempotent.Broker)
        return broker.deduplication_enabled(topic), broker.policy_for(topic).value
    finally:
        broker.close()


def test_admin_set_deduplication_at_every_level(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _admin_db(tmp_path)
    assert _effective(url, "t") == (True, "strict")

    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "t", "--disable")
    assert (code, out, err) == (0, "topic 't': deduplication disabled\n", "")
    assert _effective(url, "t") == (False, "strict")
    assert _effective(url, "a/b/t") == (True, "strict")

    # a namespace ends in '/': the namespace of 'a/b/t' is 'a/b'
    code, out, err = run(capsys, "admin", "set-deduplication", "a/b/", "--policy", "monotonic", "--url", url, "--json")
    assert code == 0, err
    assert json.loads(out) == {"target": "namespace", "name": "a/b", "policy": "monotonic"}
    assert _effective(url, "a/b/t") == (True, "monotonic")
    assert _effective(url, "t") == (False, "strict")

    # '/' is the root namespace: names without '/'; the topic's own setting still wins
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "/", "--enable", "--policy", "monotonic")
    assert (code, out) == (0, "root namespace: deduplication enabled, policy monotonic\n"), err
    assert _effective(url, "t") == (False, "monotonic")
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "t", "--clear")
    assert (code, out) == (0, "topic 't': deduplication cleared\n"), err
    assert _effective(url, "t") == (True, "monotonic")

    # the broker-wide default applies where no topic or namespace setting does
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "--broker", "--disable")
    assert (code, out) == (0, "broker default: deduplication disabled\n"), err
    assert _effective(url, "a/b/t") == (False, "monotonic")
    assert _effective(url, "t") == (True, "monotonic")
    for argv in (["/", "--clear", "--policy", "clear"], ["a/b/", "--policy", "clear"], ["--broker", "--clear"]):
        assert run(capsys, "admin", "--url", url, "set-deduplication", *argv)[0] == 0
    assert _effective(url, "t") == (True, "strict") and _effective(url, "a/b/t") == (True, "strict")

    # a topic that does not exist yet only with --allow-unknown; it applies once created
    code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "new", "--disable", "--allow-unknown")
    assert code == 0, err
    with idempotent.connect(url) as broker:
        s = broker.init_producer()
        for _ in range(2):  # the resend is stored again: deduplication is off on 'new'
            assert (
                broker.produce("new", 0, s.producer_id, s.producer_epoch, 0, [b"v"]).outcome
                is idempotent.Outcome.ACCEPTED
            )
        assert broker.end_offset("new", 0) == 2


def test_admin_changes_reach_a_running_broker(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # memory:// stores are shared in one process, like a Kafka or Pulsar cluster between processes
    name = uuid.uuid4().hex
    reset_store(name)
    url = f"memory://{name}"
    monkeypatch.setenv(cli.common.URL_ENV, url)  # the URL from the environment
    running = idempotent.Broker(MemoryBackend(url), idempotent.BrokerConfig(maintenance_interval=0))
    try:
        s = running.init_producer()
        accepted = idempotent.Outcome.ACCEPTED
        assert running.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is accepted
        code, out, err = run(capsys, "admin", "set-deduplication", "t", "--disable")
        assert (code, out) == (0, "topic 't': deduplication disabled\n"), err
        assert running.deduplication_enabled("t")  # stored in the backend, not read yet
        running.maintain()  # the maintenance sweep (every maintenance_interval) reloads the settings
        assert not running.deduplication_enabled("t")
        assert running.produce("t", 0, s.producer_id, s.producer_epoch, 0, [b"a"]).outcome is accepted
    finally:
        running.close()


def test_admin_change_on_a_database_a_broker_holds_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _admin_db(tmp_path)
    with idempotent.connect(url) as holder:  # one writer per SQLite database: changes go through it
        holder.create_topic("other", 1)  # it locks the database at its first write
        code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", "t", "--disable")
        assert (code, out) == (2, "")
        assert "is being written by another process" in err
        assert run(capsys, "admin", "--url", url, "stats", "t")[0] == 0  # reads still work
    assert _effective(url, "t") == (True, "strict")


def test_admin_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _admin_db(tmp_path)
    code, out, err = run(capsys, "admin", "--url", url, "stats", "t")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "topic t: 2 partition(s), deduplication on, policy strict, 2 ready, 0 recovering"
    assert "t[0]: ready, dedup on, policy strict" in lines
    assert "t[1]: ready, dedup on, policy strict" in lines
    assert any("snapshot at 4" in line for line in lines)  # the broker snapshotted at close
    assert ["0", "orders-copy", "0", "2", "2"] in [line.split() for line in lines]  # id name epoch last_seq last_offset

    run(capsys, "admin", "--url", url, "set-deduplication", "t", "--disable", "--policy", "monotonic")
    code, out, err = run(capsys, "admin", "--url", url, "stats", "t", "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert {k: stats[k] for k in ("topic", "partitions", "deduplication", "policy", "ready", "recovering")} == {
        "topic": "t",
        "partitions": 2,
        "deduplication": False,
        "policy": "monotonic",
        "ready": 2,
        "recovering": 0,
    }
    p1 = stats["partition_stats"][1]
    assert (p1["partition"], p1["status"], p1["position"], p1["snapshot_position"]) == (1, "ready", 4, 4)
    assert [(p["producer_name"], p["last_sequence"], p["last_offset"]) for p in p1["producers"]] == [
        ("orders-copy", 2, 2),
        (None, 0, 3),
    ]


def test_admin_describe_producers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _admin_db(tmp_path)
    with idempotent.connect(url) as broker:  # a restart of the named producer bumps its epoch
        broker.init_producer("orders-copy")
    code, out, err = run(capsys, "admin", "--url", url, "describe-producers", "t")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == [
        "PARTITION", "PRODUCER_ID", "NAME", "EPOCH", "LAST_SEQUENCE", "LAST_OFFSET", "LAST_TIMESTAMP"
    ]  # fmt: skip
    cells = [row.split() for row in rows]
    assert [c[:6] for c in cells] == [
        ["0", "0", "orders-copy", "0", "2", "2"],  # the epoch of its last stored batch
        ["1", "0", "orders-copy", "0", "2", "2"],
        ["1", "1", "-", "0", "0", "3"],
    ]
    assert all(c[6].endswith("+00:00") and c[6][:2] == "20" for c in cells)

    code, out, err = run(capsys, "admin", "--url", url, "describe-producers", "t", "--partition", "1", "--json")
    assert code == 0, err
    rows_json = json.loads(out)
    assert [(r["partition"], r["producer_id"], r["producer_name"], r["last_offset"]) for r in rows_json] == [
        (1, 0, "orders-copy", 2),
        (1, 1, None, 3),
    ]
    assert isinstance(rows_json[0]["last_timestamp"], float)

    with idempotent.connect(url) as broker:
        broker.create_topic("empty", 1)
    code, out, err = run(capsys, "admin", "--url", url, "describe-producers", "empty")
    assert (code, out) == (0, "no producers tracked on topic empty\n"), err


def test_admin_reads_never_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    broker = idempotent.connect(url)
    with Producer(broker, "w") as producer:
        for i in range(20):
            producer.send("t", b"%d" % i)
    broker.abandon()  # no snapshot at close: the reader recovers from the log
    broker.backend.close()

    def rows() -> list[tuple[object, ...]]:
        with sqlite3.connect(tmp_path / "log.db") as db:
            return (
                db.execute("SELECT topic, partition, position FROM snapshots").fetchall()
                + db.execute("SELECT key, value FROM meta ORDER BY key").fetchall()
            )

    before = rows()
    assert run(capsys, "admin", "--url", url, "stats", "t")[0] == 0
    assert run(capsys, "admin", "--url", url, "describe-producers", "t", "--json")[0] == 0
    assert rows() == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set-deduplication", "nope", "--enable"], "unknown topic 'nope'"),
        (["set-deduplication", "t", "--policy", "lenient"], "unknown policy 'lenient'"),
        (["set-deduplication", "t", "--enable", "--disable"], "not allowed with"),
        (["set-deduplication", "t"], "nothing to change"),
        (["set-deduplication", "--enable"], "give a TOPIC, a NAMESPACE/"),
        (["set-deduplication", "t", "--broker", "--enable"], "not both"),
        (["set-deduplication", "a//", "--enable"], "invalid namespace 'a//'"),
        (["set-deduplication", "bad topic", "--enable"], "invalid topic name"),
        (["stats", "nope"], "unknown topic 'nope'"),
        (["stats", "bad topic"], "invalid topic name"),
        (["describe-producers", "nope"], "unknown topic 'nope'"),
        (["describe-producers", "t", "--partition", "2"], "partitions 0..1, not 2"),
        (["describe-producers", "t", "--partition", "-1"], "at least 0"),
        (["rename", "t"], "invalid choice"),
        ([], "required: ADMIN_COMMAND"),
    ],
)
def test_admin_refusals_are_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.connect(url) as broker:
        broker.create_topic("t", 2)
    code, out, err = run(capsys, "admin", "--url", url, *argv)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err
    with idempotent.connect(url) as broker:  # nothing changed
        assert broker.topics() == {"t": 2}
        assert isinstance(broker, idempotent.Broker)
        assert broker.deduplication_enabled("t") and broker.policy_for("t").value == "strict"


@pytest.mark.parametrize(
    "command", [["stats", "t"], ["describe-producers", "t"], ["set-deduplication", "t", "--enable"]]
)
def test_admin_needs_a_url_and_an_existing_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.delenv(cli.common.URL_ENV, raising=False)
    code, out, err = run(capsys, "admin", *command)
    assert (code, out) == (2, "")
    assert err == f"error: no broker URL: give --url URL or set {cli.common.URL_ENV}\n"
    missing = tmp_path / "missing.db"
    monkeypatch.setenv(cli.common.URL_ENV, f"sqlite:///{missing}")
    code, out, err = run(capsys, "admin", *command)
    assert (code, out) == (2, "")
    assert "no database file" in err
    assert not missing.exists()  # not created by a typo


def test_admin_backend_failure_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    with idempotent.connect(url) as broker:
        broker.create_topic("t", 1)
    (tmp_path / "log.db").write_bytes(b"not a database" * 100)
    code, out, err = run(capsys, "admin", "--url", url, "stats", "t")
    assert (code, out) == (1, "")
    assert err.startswith("error: ") and "Traceback" not in err


@pytest.mark.kafka
def test_admin_next_to_a_running_kafka_broker(kafka_service: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from idempotent.testing.conformance import small_config, topic_name

    url = kafka_service.url
    running = idempotent.connect(url, small_config())
    topic = topic_name("admin")
    try:
        running.create_topic(topic, 1)
        s = running.init_producer("admin-test")
        accepted = idempotent.Outcome.ACCEPTED
        assert running.produce(topic, 0, s.producer_id, s.producer_epoch, 0, [b"a", b"b"]).outcome is accepted
        # reads open Kafka read-only: the running broker keeps its partition
        code, out, err = run(capsys, "admin", "--url", url, "describe-producers", topic, "--json")
        assert code == 0, err
        assert [(r["producer_name"], r["last_sequence"], r["last_offset"]) for r in json.loads(out)] == [
            ("admin-test", 1, 1)
        ]
        code, out, err = run(capsys, "admin", "--url", url, "stats", topic)
        assert code == 0, err
        assert out.startswith(f"topic {topic}: 1 partition(s), deduplication on, policy strict, 1 ready")
        assert running.produce(topic, 0, s.producer_id, s.producer_epoch, 2, [b"c"]).outcome is accepted
        # a change goes through the Kafka metadata log; the running broker reloads it in its sweep
        code, out, err = run(capsys, "admin", "--url", url, "set-deduplication", topic, "--policy", "monotonic")
        assert (code, out) == (0, f"topic {topic!r}: policy monotonic\n"), err
        assert isinstance(running, idempotent.Broker)
        running.maintain()
        assert running.policy_for(topic).value == "monotonic"
        gap = running.produce(topic, 0, s.producer_id, s.producer_epoch, 10, [b"d"])
        assert gap.outcome is accepted  # monotonic: holes allowed
    finally:
        running.close()
