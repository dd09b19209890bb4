"""What importing the library and its drop-ins loads: a producer's process does not pay for
the parts a producer does not use (asyncio, the in-process broker, the reader, SQLite state,
the retry library until a producer opens, TLS until a URL asks for it; the Kafka drop-in
opens its producer's own broker on its connecting thread).

Each import runs in a fresh interpreter, so that what other tests imported does not count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: modules a producer's start does not need, and that importing these does not load
NOT_AT_IMPORT = (
    "idempotent.producer.aio",
    "idempotent.broker.broker",
    "idempotent.consumer.reader",
    "idempotent.consumer.state",
    "idempotent.consumer.dedup",
    "idempotent.broker.direct",
    "idempotent.net.server",
    "idempotent.mirror",
    "idempotent.cli",
    "idempotent.broker.metrics",
    "tenacity",
    "prometheus_client",
    "tqdm",
)


def _loaded_after(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("statement", "used"),
    [
        ("import idempotent; idempotent.Producer; idempotent.connect", ()),
        ("from idempotent.compat.confluent_kafka import Producer", ()),
        # the pulsar drop-in's message ids and readers are the reader's, its client opens the direct broker
        ("from idempotent.compat.pulsar import Client", ("idempotent.consumer.reader", "idempotent.broker.direct")),
    ],
)
def test_import_leaves_out_what_a_producer_does_not_use(statement: str, used: tuple[str, ...]) -> None:
    loaded = _loaded_after(statement)
    assert "idempotent.producer.producer" in loaded
    assert sorted(name for name in NOT_AT_IMPORT if name in loaded and name not in used) == []


def test_import_of_the_package_loads_neither_asyncio_nor_ssl() -> None:
    # confluent-kafka itself imports asyncio (its serializing consumer), so only the package is
    # pinned here
    loaded = _loaded_after("import idempotent; idempotent.Producer")
    assert {"asyncio", "ssl"} & loaded == set()


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("AsyncProducer", "idempotent.producer.aio"),
        ("Broker", "idempotent.broker.broker"),
        ("Reader", "idempotent.consumer.reader"),
        ("SqliteCheckpoint", "idempotent.consumer.state"),
        ("DuplicateFilter", "idempotent.consumer.dedup"),
    ],
)
def test_lazy_names_load_their_module_on_first_use(name: str, module: str) -> None:
    code = f"import idempotent; print(getattr(idempotent, {name!r}).__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == module


def test_unknown_name_is_an_attribute_error() -> None:
    import idempotent

    with pytest.raises(AttributeError, match="no_such_name"):
        idempotent.no_such_name  # noqa: B018
    assert "AsyncProducer" in dir(idempotent)
