"""The broker surface that producers, readers and tools use, wherever the broker runs.

:class:`~idempotent.broker.broker.Broker` (in-process, over a backend URL) implements it, and so
does the network client that ``idempotent.connect("idem://host:port")`` returns. Code that
only needs this surface (``Producer``, ``Reader``, the drop-in modules, the admin CLI) works
unchanged against either.

A batch enters the surface as one :class:`~idempotent.core.request.ProduceRequest`, validated
where it was made (``submit_request``, ``submit_requests``). The loose-argument conveniences
``produce`` and ``submit_produce`` are not part of it: the handles of this project offer them
through :class:`ProduceShortcuts` (defined next to ``ProduceRequest``, re-exported here), and
code holding only a ``BrokerAPI`` builds the request itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from idempotent.core.request import ProduceRequest, ProduceShortcuts

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


__all__ = ["BrokerAPI", "ProduceShortcuts"]
