"""Fault injection for the comparison, one mechanism per place a fault can happen.

* On the wire to a broker server (``idem+*`` systems): :class:`~idempotent.testing.proxy.FaultyProxy`,
  armed per event with :meth:`~idempotent.testing.proxy.FaultyProxy.arm` (lose the next
  answer, duplicate the next request, cut every connection).
* On the wire to Kafka or Pulsar (our in-process broker over them, and the native clients):
  :class:`~idempotent.testing.native_proxy.CutProxy`, armed with
  :meth:`~idempotent.testing.native_proxy.CutProxy.arm` (the next produce is stored and its
  answer lost with the connection) or :meth:`~idempotent.testing.native_proxy.CutProxy.cut_all`.
* In the producing process, between our producer and an in-process broker (``memory`` and
  ``sqlite``, where there is no wire): :class:`LinkInjector`, a :class:`~idempotent.api.BrokerAPI`
  that loses answers and duplicates requests when armed, and can be severed to simulate the
  death of the producer instance behind it.
* Processes: SIGKILL/SIGTERM of the broker server, of the producing process, and of Kafka or
  Pulsar through :mod:`idempotent.testing.services` (only brokers the comparison started
  itself; see :mod:`idempotent.compare.systems`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from idempotent.core.request import ProduceRequest

from ..api import BrokerAPI
from ..errors import BrokerConnectionError, RequestTimeoutError

if TYPE_CHECKING:
    from idempotent.core.checker import Policy
    from idempotent.core.outcomes import ProduceResult
    from idempotent.core.records import StoredRecord
    from idempotent.core.values import PartitionStats, ProducerSession


class LinkInjector:
    """A :class:`BrokerAPI` in front of another that misbehaves on demand (thread-safe).

    ``arm_lost_ack()`` loses the answer to the next produce request after the broker has
    processed it (the producer gets :class:`RequestTimeoutError`); ``arm_duplicate()``
    delivers the next produce request twice; ``sever()`` makes every later call fail with
    :class:`BrokerConnectionError` and drops the answers still outstanding, which is what a
    producer instance sees of its own death. ``injected`` counts what happened.

    A round of batches the producer hands over at once (``submit_requests``) reaches the
    broker behind as one group too, a duplicated batch right behind its original.
    """

    def __init__(self, inner: BrokerAPI) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self._lost_acks = 0
        self._duplicates = 0
        self._severed = False
        self.injected = {"lost-ack": 0, "duplicate-request": 0}

    def arm_lost_ack(self, count: int = 1) -> None:
        """Lose the answers to the next ``count`` produce requests."""
        with self._lock:
            self._lost_acks += count

    def arm_duplicate(self, count: int = 1) -> None:
        """Deliver the next ``count`` produce requests twice."""
        with self._lock:
            self._duplicates += count

    def sever(self) -> None:
        """Fail every later call and lose every outstanding answer."""
        with self._lock:
            self._severed = True

    def _check(self) -> None:
        if self._severed:
            raise BrokerConnectionError("link severed (injected)")

    @property
    def url(self) -> str:
        return self.inner.url

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self._check()
        self.inner.create_topic(name, partitions)

    def delete_topic(self, name: str) -> None:
        self._check()
        self.inner.delete_topic(name)

    def topics(self) -> dict[str, int]:
        self._check()
        return self.inner.topics()

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        self._check()
        return self.inner.partitions_for(topic, create=create)

    def init_producer(self, producer_name: str | None = None, *, timeout: float = 30.0) -> ProducerSession:
        self._check()
        return self.inner.init_producer(producer_name, timeout=timeout)

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        return self.submit_requests([request])[0]

    def submit_requests(self, requests: Sequence[ProduceRequest]) -> list[Future[ProduceResult]]:
        plan: list[tuple[bool, bool]] = []  # (lose the answer, send twice) per request
        with self._lock:
            self._check()
            for _ in requests:
                lose = self._lost_acks > 0
                if lose:
                    self._lost_acks -= 1
                    self.injected["lost-ack"] += 1
                duplicate = self._duplicates > 0
                if duplicate:
                    self._duplicates -= 1
                    self.injected["duplicate-request"] += 1
                plan.append((lose, duplicate))
        sent: list[ProduceRequest] = []
        for request, (_, duplicate) in zip(requests, plan, strict=True):
            sent += (request, request) if duplicate else (request,)
        answers = iter(self.inner.submit_requests(sent))
        out: list[Future[ProduceResult]] = []
        for lose, duplicate in plan:
            answer = next(answers)
            if duplicate:
                next(answers)  # the copy's answer: the producer never sees it
            relayed: Future[ProduceResult] = Future()
            answer.add_done_callback(functools.partial(self._relay, relayed, lose))
            out.append(relayed)
        return out

    def _relay(self, out: Future[ProduceResult], lose: bool, done: Future[ProduceResult]) -> None:
        if lose:
            out.set_exception(RequestTimeoutError("answer lost (injected)"))
        elif self._severed:
            out.set_exception(BrokerConnectionError("link severed (injected)"))
        elif (exc := done.exception()) is not None:
            out.set_exception(exc)
        else:
            out.set_result(done.result())

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        return self.inner.read(topic, partition, offset, max_records)

    def end_offset(self, topic: str, partition: int) -> int:
        return self.inner.end_offset(topic, partition)

    def stats(self, topic: str | None = None) -> list[PartitionStats]:
        return self.inner.stats(topic)

    def set_deduplication(
        self, enabled: bool | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        self.inner.set_deduplication(enabled, topic=topic, namespace=namespace)

    def set_policy(
        self, policy: Policy | str | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        self.inner.set_policy(policy, topic=topic, namespace=namespace)

    def close(self) -> None:
        """Does not close the broker behind it: it outlives the producer instances."""


__all__ = ["LinkInjector"]
