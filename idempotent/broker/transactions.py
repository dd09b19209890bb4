"""The application's transactions on a :class:`~idempotent.broker.broker.Broker` (SQLite,
memory): what one producer's open transaction holds until its commit.

A transaction's batches are held here, not written, while it is open: each is answered
ACCEPTED with no offset at once (the producer holds the delivery reports until the end), and
nothing of it reaches the log, so no reader can see it. The commit offers every held batch to
its partition's checker, in the order they were sent, and stores those the checkers accept in
one atomic write of the backend, with the producer's positions
(:class:`~idempotent.backend.AtomicAppends`). The checkers decide at the commit as they do for
any batch: a batch already stored is a DUPLICATE (a restarted application resending a
committed transaction with the same sequences), a gap or a fenced epoch refuses the whole
transaction. Aborting forgets the held batches; the checkers never saw them.

The commit keeps the held batches until it is known to be stored, so a commit whose outcome
is unknown (the backend failed) is simply called again: the checkers, rebuilt from the log,
answer DUPLICATE for what the first attempt stored, or accept it now.
"""

from __future__ import annotations

import attrs

from idempotent.core.request import ProduceRequest
from idempotent.core.types import TopicPartition


@attrs.define
class OpenTransaction:
    """One producer's open transaction (see the module docstring).

    Attributes:
        producer_epoch: the epoch that opened it; a batch of another epoch is not held.
        requests: the held batches, in the order they were sent.
        before: per partition written, the producer's last stored sequence when the
            transaction first wrote it (what an abort rewinds the producer's sequences to).
        in_doubt: a commit was tried and its outcome is unknown: an abort must first learn
            from the checkers whether it was stored.
        opened_at: when it was opened (``time.monotonic()``).
        aborted: why the broker aborted it while it was open (past ``transaction_timeout``,
            or holding more than ``max_transaction_bytes``), or None: what it held is dropped,
            its commit fails with that reason, and only an abort ends it.
        size: the bytes it holds (as ``Record.size`` counts).
    """

    producer_epoch: int
    opened_at: float
    requests: list[ProduceRequest] = attrs.field(factory=list)
    before: dict[TopicPartition, int] = attrs.field(factory=dict)
    in_doubt: bool = False
    aborted: str | None = None
    size: int = 0
    _held: set[tuple[str, int, int]] = attrs.field(factory=set)

    def hold(self, request: ProduceRequest, last_sequence: int) -> None:
        """Hold ``request`` (a resend of a held batch is held once); ``last_sequence``: the
        producer's last stored sequence on its partition now."""
        key = (request.topic, request.partition, request.header.base_sequence)
        if key in self._held:
            return
        self._held.add(key)
        self.requests.append(request)
        self.size += request.size
        self.before.setdefault(TopicPartition(request.topic, request.partition), last_sequence)

    @property
    def idle(self) -> bool:
        """Nothing held, no commit tried: as it was when it was opened."""
        return not self.requests and not self.in_doubt and self.aborted is None

    def abort(self, reason: str) -> None:
        """Abort it while it is open (``reason``: why): drop what it held (its partitions'
        ``before`` stay, for the abort that ends it)."""
        self.aborted = reason
        self.requests = []
        self._held = set()
        self.size = 0

    @property
    def partitions(self) -> list[TopicPartition]:
        """The partitions it wrote, sorted (the order their locks are taken in)."""
        return sorted(self.before)


__all__ = ["OpenTransaction"]
