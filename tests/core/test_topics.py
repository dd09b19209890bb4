"""The one topic naming rule (idempotent/core/topics.py), and every API and command applying it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import idempotent
from idempotent import cli
from idempotent.adapters.memory import reset_store
from idempotent.compat import confluent_kafka, pulsar
from idempotent.core.topics import canonical_namespace, canonical_topic
from idempotent.errors import InvalidTopicError

SPELLINGS = [
    ("orders", "orders"),
    ("tenant/ns/orders", "tenant/ns/orders"),
    ("a/b/c/d", "a/b/c/d"),
    ("persistent://tenant/ns/orders", "tenant/ns/orders"),
    ("public/default/orders", "orders"),
    ("persistent://public/default/orders", "orders"),
    ("public/default/a/b", "public/default/a/b"),  # namespace public/default/a, not public/default
    ("x" * 249, "x" * 249),
]

REFUSED = [
    "",
    "/orders",
    "a//b",
    "bad name!",
    "x" * 250,
    "non-persistent://public/default/orders",
    "kafka://orders",
    "persistent://orders",
    "persistent://public/orders",
    "persistent://public/default/",
    "persistent:///default/orders",
]


@pytest.mark.parametrize(("spelling", "stored"), SPELLINGS)
def test_every_spelling_has_one_stored_name(spelling: str, stored: str) -> None:
    assert canonical_topic(spelling) == stored
    assert canonical_topic(stored) == stored


@pytest.mark.parametrize("spelling", REFUSED)
def test_bad_spellings_are_refused(spelling: str) -> None:
    with pytest.raises(InvalidTopicError, match="invalid topic name"):
        canonical_topic(spelling)


def test_non_strings_and_namespaces() -> None:
    with pytest.raises(InvalidTopicError):
        canonical_topic(5)  # type: ignore[arg-type]
    assert canonical_namespace("public/default") == "" and canonical_namespace("") == ""
    assert canonical_namespace("tenant/ns") == "tenant/ns"
    for bad in ("a//b", "/x", "bad ns"):
        with pytest.raises(InvalidTopicError, match="invalid namespace"):
            canonical_namespace(bad)


# -- one rule across the APIs and commands -----------------------------------------------------


@pytest.fixture
def url() -> Iterator[str]:
    name = uuid.uuid4().hex
    reset_store(name)
    yield f"memory://{name}"
    reset_store(name)


def test_pulsar_drop_in_topics_are_the_readers_and_the_producers(url: str) -> None:
    client = pulsar.Client(url)
    producer = client.create_producer("persistent://public/default/orders", producer_name="feed")
    producer.send(b"a")
    client.create_producer("orders").send(b"b")  # Pulsar's short name: the same topic
    producer.close()
    for spelling in ("persistent://public/default/orders", "public/default/orders", "orders"):
        with idempotent.Reader(url, spelling) as reader:
            messages = [reader.read_next(5), reader.read_next(5)]
        assert [m.value for m in messages] == [b"a", b"b"]
        assert messages[0].message_id.topic == "orders"
    broker = client.broker
    assert broker.topics() == {"orders": 1}
    # a named producer continues its sequence whatever spelling it is given
    with idempotent.Producer(broker, "feed") as native:
        assert native.last_sequence("persistent://public/default/orders", 0) == 0
        assert native.send("public/default/orders", b"c").result().offset == 2
        assert native.last_sequence("orders", 0) == 1
    # settings of Pulsar's default namespace are the root namespace's
    broker.set_policy("monotonic", namespace="public/default")
    assert broker.policy_for("orders").value == "monotonic"
    client.close()


def test_kafka_drop_in_and_the_reader_agree(url: str) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": "unused:9092", "idempotent.broker.url": url})
    producer.produce("payments", b"p")
    producer.flush()
    with idempotent.Reader(url, "persistent://public/default/payments") as reader:
        assert reader.read_next(5).value == b"p"


def test_every_command_accepts_every_spelling(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    assert cli.main(["produce", url, "persistent://public/default/orders", "--generate", "3", "--quiet"]) == 0
    assert cli.main(["produce", url, "orders", "--generate", "3"]) == 0  # the same input: resumed
    assert "sent=0 skipped=3" in capsys.readouterr().out
    for spelling in ("orders", "public/default/orders", "persistent://public/default/orders"):
        assert cli.main(["tail", url, spelling, "--format", "json"]) == 0
        assert capsys.readouterr().out.count('"topic": "orders"') == 3
        assert cli.main(["stats", url, spelling, "--json"]) == 0
        assert '"topic": "orders"' in capsys.readouterr().out
        assert cli.main(["admin", "--url", url, "describe-producers", spelling, "--json"]) == 0
        assert '"topic": "orders"' in capsys.readouterr().out
    assert cli.main(["admin", "--url", url, "set-deduplication", "public/default/", "--policy", "monotonic"]) == 0
    assert capsys.readouterr().out == "root namespace: policy monotonic\n"
    assert cli.main(["tail", url, "non-persistent://public/default/orders"]) == 2
    assert "non-persistent topics are not supported" in capsys.readouterr().err


def test_a_mirror_destination_takes_every_spelling(url: str, tmp_path: Path) -> None:
    from idempotent.mirror import Mirror

    source = tmp_path / "lines.txt"
    source.write_bytes(b"a\nb\n")
    job = Mirror(f"file://{source}", url, to_topic="persistent://public/default/copied", job="j")
    assert job.run().copied == 2
    assert Mirror(f"file://{source}", url, to_topic="copied", job="j").run().copied == 0  # the same job, resumed
    with idempotent.Reader(url, "public/default/copied") as reader:
        assert [reader.read_next(5).value for _ in range(2)] == [b"a", b"b"]
