"""Broker events for monitoring: what a :class:`BrokerObserver` is told, and when.

A :class:`~idempotent.broker.broker.Broker` calls every observer added with
:meth:`~idempotent.broker.broker.Broker.add_observer` as things happen. This module knows nothing of
any monitoring system; :mod:`idempotent.broker.metrics` turns the events into Prometheus metrics,
and anything else (logging, tracing, tests) can subclass :class:`BrokerObserver` and override
only the events it needs.

Rules for observers:

* Calls are synchronous, on the thread that did the work, some while a partition lock is
  held: an observer must be quick and must not call back into the broker.
* An exception raised by an observer is logged (logger ``idempotent.broker.observer``) and
  otherwise ignored: an observer can never change what the broker does.
* Gauges (in-flight batches, tracked producers, snapshot age) are not events: read them
  when needed with :meth:`~idempotent.broker.broker.Broker.stats` (``recover=False`` for the
  partitions already loaded, without recovering any).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from concurrent.futures import Future

    from idempotent.core.outcomes import ProduceResult
    from idempotent.core.request import ProduceRequest

LOG = logging.getLogger("idempotent.broker.observer")


class BrokerObserver:
    """Receives broker events. Every method does nothing; override the ones you need.

    ``seconds`` are measured with :func:`time.monotonic`.
    """

    def produce_completed(
        self, topic: str, partition: int, result: ProduceResult, record_count: int, byte_count: int, seconds: float
    ) -> None:
        """A produce request got its answer (any :class:`~idempotent.Outcome`).

        ``seconds`` runs from the request's arrival to its answer (for ACCEPTED, until the
        backend acknowledged the append); ``byte_count`` is the batch's size as
        ``BrokerConfig.max_batch_bytes`` counts it (keys, values and headers, plus 16 bytes per
        record and 4 per header).
        """

    def produce_failed(self, topic: str, partition: int, error: BaseException, seconds: float) -> None:
        """A produce request ended with an exception instead of an outcome.

        Input errors (:class:`~idempotent.errors.InvalidBatchError`,
        :class:`~idempotent.errors.InvalidTopicError`, ``topic`` may then be any string a client
        sent), :class:`~idempotent.errors.PartitionRecoveringError`, and backend failures.
        """

    def append_completed(self, topic: str, partition: int, seconds: float, ok: bool) -> None:
        """The backend finished one append (``ok`` False: it failed, the partition recovers)."""

    def partition_recovered(self, topic: str, partition: int, seconds: float, replayed_batches: int) -> None:
        """A partition's checker was rebuilt from its newest snapshot plus a replay of the log."""

    def snapshot_written(self, topic: str, partition: int, ok: bool) -> None:
        """A checker snapshot was stored (on its own, or together with an append), or failed to."""

    def producers_evicted(self, topic: str, partition: int, count: int) -> None:
        """Producers' state was dropped from a partition (expired, or over ``max_producers``)."""

    def producer_initialised(self, named: bool, ok: bool) -> None:
        """``init_producer`` ended: a new id (``named`` False) or a named producer's new epoch."""


def notify(observers: tuple[BrokerObserver, ...], event: str, *args: object) -> None:
    """Call ``event`` on every observer; log and swallow what they raise."""
    for observer in observers:
        try:
            getattr(observer, event)(*args)
        except Exception:
            LOG.exception("observer %r failed on %s", observer, event)


def observe_produce(
    observers: tuple[BrokerObserver, ...],
    request: ProduceRequest,
    submit: Callable[[ProduceRequest], Future[ProduceResult]],
) -> Future[ProduceResult]:
    """``submit(request)``, telling ``observers`` how the produce request ends:
    ``produce_failed`` when ``submit`` raises (what it raised is raised again) or its future
    fails, else ``produce_completed`` with the future's result; ``seconds`` from this call."""
    topic, partition = request.topic, request.partition
    started = time.monotonic()
    try:
        future = submit(request)
    except BaseException as exc:
        notify(observers, "produce_failed", topic, partition, exc, time.monotonic() - started)
        raise
    count, size = request.header.record_count, request.size

    def done(f: Future[ProduceResult]) -> None:
        seconds = time.monotonic() - started
        exc = f.exception()
        if exc is not None:
            notify(observers, "produce_failed", topic, partition, exc, seconds)
        else:
            notify(observers, "produce_completed", topic, partition, f.result(), count, size, seconds)

    future.add_done_callback(done)
    return future


__all__ = ["BrokerObserver", "notify", "observe_produce"]
