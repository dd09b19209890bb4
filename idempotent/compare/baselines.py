"""Native producers behind one small interface, for benchmarks and comparison tests.

Each :class:`Baseline` publishes to one topic and records, for one message in
``sample_every``, the time from ``send`` to its delivery callback:

* ``kafka-raw``: confluent-kafka with ``enable.idempotence=false``;
* ``kafka-idempotent``: confluent-kafka with ``enable.idempotence=true`` (Kafka's own dedup);
* ``pulsar-raw``: pulsar-client on a namespace without deduplication;
* ``pulsar-dedup``: pulsar-client with a producer name on a namespace whose deduplication was
  enabled through the admin REST API (and reported ``Enabled`` by the topic's stats);
* ``idempotent``: this project's :class:`~idempotent.Producer` through its checker, ``send()``
  returning a future with a done-callback;
* ``idempotent-cb``: the same producer, ``send(..., on_delivery=...)`` (no future);
* ``kafka-drop-in``: the confluent-kafka drop-in (``idempotent.compat.confluent_kafka``),
  used exactly as ``kafka-idempotent`` uses confluent-kafka.

With ``every_callback=False`` only the sampled messages get a delivery callback (the same on
every side), which measures a producer whose application does not ask for each outcome.

All use the same batching settings where the client has them (linger 5 ms), acks from every
replica (``acks=all``; Pulsar always waits for the bookie quorum).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
import uuid
from typing import Any, Protocol

from idempotent.producer.producer import Producer

LINGER_MS = 5
#: the Pulsar producers' queue (pulsar-client's ``max_pending_messages``), the same on every side
MAX_PENDING = 1_000_000


class Baseline(Protocol):
    """A producer under test."""

    name: str
    latencies: list[float]

    def send(self, value: bytes, key: bytes | None = None) -> None:
        """Queue one message (asynchronous)."""
        ...

    def flush(self, timeout: float = 120.0) -> int:
        """Wait for every delivery; return how many messages failed. Raises on timeout."""
        ...

    def close(self) -> None:
        """Release the client."""
        ...


class _Sampler:
    def __init__(self, sample_every: int) -> None:
        self.sample_every = sample_every
        self.latencies: list[float] = []
        self.failed = 0
        self.count = 0
        self._lock = threading.Lock()

    def start(self) -> float | None:
        self.count += 1
        return time.perf_counter() if self.count % self.sample_every == 0 else None

    def done(self, started: float | None, ok: bool) -> None:
        if not ok:
            with self._lock:
                self.failed += 1
        elif started is not None:
            self.latencies.append(time.perf_counter() - started)


class KafkaBaseline:
    """confluent-kafka, with or without its idempotent producer."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        idempotence: bool,
        sample_every: int = 16,
        every_callback: bool = True,
        drop_in: bool = False,
    ) -> None:
        if drop_in:
            from ..compat import confluent_kafka as client
        else:
            import confluent_kafka as client  # type: ignore[no-redef]

        self.name = "kafka-drop-in" if drop_in else "kafka-idempotent" if idempotence else "kafka-raw"
        self.topic = topic
        self._sampler = _Sampler(sample_every)
        self._every_callback = every_callback
        self.latencies = self._sampler.latencies
        self._producer: Any = client.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": idempotence,
                "acks": "all",
                "linger.ms": LINGER_MS,
            }
        )

    def send(self, value: bytes, key: bytes | None = None) -> None:
        started = self._sampler.start()
        sampler = self._sampler
        delivered: Any = None
        if started is not None or self._every_callback:

            def delivered(err: Any, msg: Any) -> None:
                sampler.done(started, err is None)

        while True:
            try:
                self._producer.produce(self.topic, value, key, on_delivery=delivered)
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def flush(self, timeout: float = 120.0) -> int:
        if self._producer.flush(timeout):
            raise TimeoutError(f"{self.name}: flush timed out")
        return self._sampler.failed

    def close(self) -> None:
        self._producer.flush(10)


def pulsar_admin(admin_url: str, method: str, path: str, body: object | None = None) -> Any:
    """Call the Pulsar admin REST API; returns the decoded JSON answer (or None)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(admin_url + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as answer:
        text = answer.read()
    return json.loads(text) if text else None


def enable_pulsar_dedup(admin_url: str, namespace: str, topic: str, timeout: float = 60.0) -> None:
    """Enable deduplication on a namespace and wait until ``topic`` reports it Enabled."""
    tenant, ns = namespace.split("/")
    try:
        pulsar_admin(admin_url, "PUT", f"/admin/v2/namespaces/{tenant}/{ns}", {})
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
    pulsar_admin(admin_url, "POST", f"/admin/v2/namespaces/{tenant}/{ns}/deduplication", True)
    path = f"/admin/v2/persistent/{tenant}/{ns}/{topic}"
    try:
        pulsar_admin(admin_url, "PUT", path)
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
    deadline = time.monotonic() + timeout
    while True:
        stats = pulsar_admin(admin_url, "GET", path + "/stats")
        if stats.get("deduplicationStatus") == "Enabled":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"deduplication on {namespace}/{topic} did not become Enabled: {stats}")
        time.sleep(0.2)


class PulsarBaseline:
    """pulsar-client, on a namespace with or without deduplication; with ``drop_in``, the
    pulsar-client drop-in (``idempotent.compat.pulsar``) on the service URL plus ``admin_url``,
    used the same way. Both sides get the same producer settings (batching, a queue that
    blocks when full at the same size, no send timeout with deduplication)."""

    def __init__(
        self,
        url: str,
        admin_url: str,
        topic: str,
        *,
        dedup: bool,
        sample_every: int = 16,
        every_callback: bool = True,
        drop_in: bool = False,
    ) -> None:
        import pulsar

        self.name = "pulsar-drop-in" if drop_in else "pulsar-dedup" if dedup else "pulsar-raw"
        namespace = "public/bench-dedup" if dedup and not drop_in else "public/default"
        if dedup and not drop_in:
            enable_pulsar_dedup(admin_url, namespace, topic)
        self._sampler = _Sampler(sample_every)
        self._every_callback = every_callback
        self.latencies = self._sampler.latencies
        self._ok = pulsar.Result.Ok
        if drop_in:
            from ..compat import pulsar as drop_in_module

            self._client: Any = drop_in_module.Client(f"{url}?{urllib.parse.urlencode({'admin_url': admin_url})}")
        else:
            self._client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        self._producer = self._client.create_producer(
            f"persistent://{namespace}/{topic}",
            producer_name=f"bench-{uuid.uuid4().hex[:8]}" if dedup else None,
            batching_enabled=True,
            batching_max_publish_delay_ms=LINGER_MS,
            block_if_queue_full=True,
            max_pending_messages=MAX_PENDING,
            send_timeout_millis=0 if dedup else 30_000,
        )

    def send(self, value: bytes, key: bytes | None = None) -> None:
        started = self._sampler.start()
        sampler = self._sampler

        ok = self._ok
        if started is None and not self._every_callback:
            self._producer.send_async(value, _ignore, partition_key=key.decode() if key else None)
            return

        def delivered(result: Any, message_id: Any) -> None:
            sampler.done(started, result == ok)

        self._producer.send_async(value, delivered, partition_key=key.decode() if key else None)

    def flush(self, timeout: float = 120.0) -> int:
        self._producer.flush()
        return self._sampler.failed

    def close(self) -> None:
        self._producer.close()
        self._client.close()


def _ignore(*_: Any) -> None:
    """pulsar-client's ``send_async`` needs a callable."""


class IdempotentBaseline:
    """This project's producer, through its broker and checker, on any backend URL:
    ``send()`` and a done-callback on its future, or with ``on_delivery=True``,
    ``send(..., on_delivery=callback)``."""

    def __init__(
        self,
        url: str,
        topic: str,
        *,
        sample_every: int = 16,
        every_callback: bool = True,
        on_delivery: bool = False,
        **options: Any,
    ) -> None:
        self.name = "idempotent-cb" if on_delivery else "idempotent"
        self.topic = topic
        self._sampler = _Sampler(sample_every)
        self._every_callback = every_callback
        self._on_delivery = on_delivery
        self.latencies = self._sampler.latencies
        self._producer = Producer(url, linger_ms=LINGER_MS, **options)

    def send(self, value: bytes, key: bytes | None = None) -> None:
        started = self._sampler.start()
        sampler = self._sampler  # a callback per message, like the native clients' delivery callbacks
        if started is None and not self._every_callback:
            self._producer.send(self.topic, value, key, partition=0)
        elif self._on_delivery:

            def delivered(error: Any, metadata: Any) -> None:
                sampler.done(started, error is None)

            self._producer.send(self.topic, value, key, partition=0, on_delivery=delivered)
        else:
            future = self._producer.send(self.topic, value, key, partition=0)
            future.add_done_callback(lambda f: sampler.done(started, f.exception() is None))

    def flush(self, timeout: float = 120.0) -> int:
        left = self._producer.flush(timeout)
        if left:
            raise TimeoutError(f"idempotent: {left} messages still unfinished after {timeout} s")
        return self._sampler.failed

    def close(self) -> None:
        self._producer.close()
