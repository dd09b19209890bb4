"""Readiness: when a started broker really answers (Kafka: metadata, a probe topic and a
transactional commit; Pulsar: the health endpoint and one message sent), and Pulsar's admin
calls. The clients are imported lazily.

Part of the services helpers of :mod:`idempotent.testing.services`.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from idempotent.testing.services.ports import _can_connect
from idempotent.testing.services.state import ServiceInfo

_PROBE_TOPIC = "__idempotent_probe"


def _kafka_ready(info: ServiceInfo, deadline: float, check_alive: Callable[[], None]) -> None:
    """Kafka answers: metadata lists the broker, a probe topic can be created, a
    transactional producer commits one record to it, and the topic is deleted."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    port = int(info.bootstrap.rsplit(":", 1)[1])
    quiet: dict[str, str | int | float] = {"bootstrap.servers": info.bootstrap, "log_level": 0}
    last = "not reachable"
    while time.monotonic() < deadline:
        check_alive()
        if not _can_connect(port):
            time.sleep(0.2)
            continue
        try:
            admin = AdminClient(dict(quiet))
            metadata = admin.list_topics(timeout=5)
            if not metadata.brokers:
                raise RuntimeError("metadata has no brokers yet")
            futures = admin.create_topics([NewTopic(_PROBE_TOPIC, 1, 1)], operation_timeout=15, request_timeout=20)
            try:
                futures[_PROBE_TOPIC].result()
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            producer = Producer({**quiet, "transactional.id": "idempotent-services-probe", "linger.ms": 0})
            producer.init_transactions(30)
            producer.begin_transaction()
            producer.produce(_PROBE_TOPIC, b"probe")
            producer.commit_transaction(30)
            admin.delete_topics([_PROBE_TOPIC], operation_timeout=15)[_PROBE_TOPIC].result()
            return
        except Exception as exc:  # not ready yet: retry until the deadline
            last = repr(exc)  # a string: keeping exc would keep its frames' clients alive
            time.sleep(0.5)
    raise TimeoutError(f"kafka did not become ready: {last}")


def _http_status(url: str, method: str = "GET", timeout: float = 5.0) -> int:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _pulsar_ready(info: ServiceInfo, deadline: float, check_alive: Callable[[], None]) -> None:
    """Pulsar answers: GET /admin/v2/brokers/health is 200 and a producer can send one
    message to persistent://public/default/<probe> (the topic is then deleted)."""
    import pulsar

    assert info.admin_url is not None
    web_port = int(info.admin_url.rsplit(":", 1)[1])
    topic = f"persistent://public/default/{_PROBE_TOPIC}"
    last = "not reachable"
    while time.monotonic() < deadline:
        check_alive()
        if not _can_connect(web_port):
            time.sleep(0.2)
            continue
        try:
            code = _http_status(f"{info.admin_url}/admin/v2/brokers/health", timeout=10)
            if code != 200:
                raise RuntimeError(f"brokers/health returned HTTP {code}")
            client = pulsar.Client(
                info.bootstrap,
                operation_timeout_seconds=15,
                logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
            )
            try:
                producer = client.create_producer(topic, send_timeout_millis=15000)
                producer.send(b"probe")
                producer.close()
            finally:
                client.close()
            with contextlib.suppress(OSError):
                _http_status(
                    f"{info.admin_url}/admin/v2/persistent/public/default/{_PROBE_TOPIC}?force=true",
                    method="DELETE",
                    timeout=15,
                )
            return
        except Exception as exc:  # not ready yet: retry until the deadline
            last = repr(exc)  # a string: keeping exc would keep its frames' clients alive
            time.sleep(0.5)
    raise TimeoutError(f"pulsar did not become ready: {last}")


def _answers(info: ServiceInfo, timeout: float = 5.0) -> bool:
    """A quick 'is it answering' check (no writes)."""
    try:
        if info.name == "kafka":
            port = int(info.bootstrap.rsplit(":", 1)[1])
            if not _can_connect(port, timeout):
                return False
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": info.bootstrap, "log_level": 0})
            return bool(admin.list_topics(timeout=timeout).brokers)
        assert info.admin_url is not None
        return _http_status(f"{info.admin_url}/admin/v2/brokers/health", timeout=timeout) == 200
    except Exception:
        return False


# ------------------------------------------------------------------------- launch


def _pulsar_unload_all(info: ServiceInfo, budget: float) -> None:
    deadline = time.monotonic() + budget

    def get(path: str) -> list[str]:
        left = max(0.5, deadline - time.monotonic())
        with urllib.request.urlopen(f"{info.admin_url}{path}", timeout=left) as response:
            return [str(item) for item in json.load(response)]

    for tenant in get("/admin/v2/tenants"):
        for namespace in get(f"/admin/v2/namespaces/{tenant}"):
            if time.monotonic() >= deadline:
                return
            with contextlib.suppress(urllib.error.URLError, OSError):
                _http_status(
                    f"{info.admin_url}/admin/v2/namespaces/{namespace}/unload",
                    method="PUT",
                    timeout=max(0.5, deadline - time.monotonic()),
                )
