"""The broker surface that producers, readers and tools use, wherever the broker runs.

:class:`~idempotent.broker.broker.Broker` (in-process, over a backend URL) implements it, and so
does the network client that ``idempotent.connect("idem://host:port")`` returns. Code that
only needs this surface (``Producer``, ``Reader``, the drop-in modules, the admin CLI) works
unchanged against either.

A batch enters the surface as one :class:`~idempotent.core.request.ProduceRequest`, validated
where it was made (``submit_request``, ``submit_requests``). The loose-argument conveniences
``produce`` and ``submit_produce`` are not part of it: the handles of this project offer them
through :class:`ProduceShortcuts` (here, over ``ProduceRequest``), and
code holding only a ``BrokerAPI`` builds the request itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from idempotent.core.records import Record
from idempotent.core.request import ProduceRequest
from idempotent.errors import ProducerError, RequestTimeoutError
from idempotent.runtime.future import LightFuture

if TYPE_CHECKING:
    from idempotent.core.checker import Policy
    from idempotent.core.outcomes import ProduceResult
    from idempotent.core.records import StoredRecord
    from idempotent.core.values import PartitionStats, ProducerSession


# runtime_checkable: Producer, Reader and the drop-ins take "a URL or an open broker" and
# tell the two apart with isinstance, turning anything else into a ConfigError that names
# it, once, when they are made. isinstance checks only that the members exist, not their
# signatures; mypy checks those for the handles of this project.
@runtime_checkable
class BrokerAPI(Protocol):
    """What every broker handle offers. Errors are those of :mod:`idempotent.errors`."""

    @property
    def url(self) -> str:
        """The URL the broker was opened with."""
        ...

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic. Raises InvalidTopicError (bad name, or it exists with another count)."""
        ...

    def delete_topic(self, name: str) -> None:
        """Delete a topic with its records and checker state. Raises InvalidTopicError (bad
        name, or no such topic)."""
        ...

    def topics(self) -> dict[str, int]:
        """Every topic and its partition count."""
        ...

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        """Partition count of ``topic``; created with the default count when ``create``."""
        ...

    def init_producer(self, producer_name: str | None = None, *, timeout: float = 30.0) -> ProducerSession:
        """Allocate a producer id, or re-initialise a named producer (epoch bumped)."""
        ...

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        """Check a batch, validated into a :class:`ProduceRequest` where it was made, and
        store it if accepted; return at once with the future of its result. One partition's
        batches keep submission order.

        Raises:
            InvalidBatchError, InvalidTopicError: the batch exceeds this broker's limits or
                the partition does not exist; nothing changed. Errors of the append end up
                on the future.
        """
        ...

    def submit_requests(self, requests: Sequence[ProduceRequest]) -> list[Future[ProduceResult]]:
        """``submit_request`` of a group of batches, in order: a producer's sender hands
        each round's batches over at once (a producer's own broker writes them as one
        transaction)."""
        ...

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        """Up to ``max_records`` stored records from ``offset`` on."""
        ...

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next stored record of the partition will get."""
        ...

    def stats(self, topic: str | None = None) -> list[PartitionStats]:
        """Checker state of every partition (of one topic)."""
        ...

    def set_deduplication(
        self, enabled: bool | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        """Switch deduplication at topic, namespace or broker level (None clears)."""
        ...

    def set_policy(
        self, policy: Policy | str | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        """Set the sequence policy at one level (None clears)."""
        ...

    def close(self) -> None:
        """Release the handle. Acknowledged data stays stored."""
        ...


class ProduceShortcuts:
    """``produce`` and ``submit_produce`` (loose arguments) of a broker handle, over its
    ``submit_request``: each builds one :class:`ProduceRequest` (validated there, once) and
    hands it on; and ``submit_requests``, which submits a group one batch at a time. A class
    using it defines ``submit_request``, ``url`` and, when it waits, ``produce_timeout``."""

    #: True when the handle runs in the producer's process and checks the batches submitted
    #: for a partition in submission order, so no copy of an earlier attempt reaches the
    #: checker after a later one: a producer may then fill a hole that batches expired past
    #: the delivery timeout left (:class:`~idempotent.core.sequencer.ProducerSequencer`,
    #: ``in_order``). False for a handle across a network, which may reorder them.
    attempts_in_order: ClassVar[bool] = False

    @property
    def produce_timeout(self) -> float | None:
        """Seconds ``produce`` waits for the answer (None: as long as it takes)."""
        return None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        raise NotImplementedError

    def submit_requests(self, requests: Sequence[ProduceRequest]) -> list[Future[ProduceResult]]:
        """``submit_request`` of each batch, in order; a batch it refuses at once gets its
        error on its future, and the others go on."""
        out: list[Future[ProduceResult]] = []
        for request in requests:
            try:
                out.append(self.submit_request(request))
            except ProducerError as exc:
                refused: Future[ProduceResult] = LightFuture()
                refused.set_exception(exc)
                out.append(refused)
        return out

    def submit_produce(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        records: Sequence[Record | bytes | str | None],
        previous_sequence: int | None = None,
    ) -> Future[ProduceResult]:
        """Check a batch and store it if accepted; return at once with the future of its result.

        Raises:
            InvalidBatchError, InvalidTopicError: bad input (nothing sent).
            And what ``submit_request`` raises; errors of the append end up on the future.
        """
        try:
            request = ProduceRequest.build(
                topic, partition, producer_id, producer_epoch, base_sequence, records, previous_sequence
            )
        except ProducerError as exc:
            self._refused(topic, partition, exc)
            raise
        return self.submit_request(request)

    def _refused(self, topic: str, partition: int, error: ProducerError) -> None:
        """Called when a batch given as loose arguments does not validate (a hook: the
        in-process broker tells its observers)."""

    def produce(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        records: Sequence[Record | bytes | str | None],
        previous_sequence: int | None = None,
    ) -> ProduceResult:
        """:meth:`submit_produce`, then wait for the result (up to ``produce_timeout``).

        Raises:
            RequestTimeoutError: no answer in time; the batch's outcome is unknown (resending
                it is safe).
            And what ``submit_produce`` raises or its future fails with.
        """
        future = self.submit_produce(
            topic, partition, producer_id, producer_epoch, base_sequence, records, previous_sequence
        )
        wait = self.produce_timeout
        try:
            return future.result(wait)
        except TimeoutError:
            raise RequestTimeoutError(f"no answer from {self.url} within {wait:g} s") from None


__all__ = ["BrokerAPI", "ProduceShortcuts"]
