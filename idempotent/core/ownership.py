"""Partition ownership among several brokers over one backend: leases, decided purely.

Several broker processes may serve one Kafka or Pulsar cluster. Each partition is then owned
by one broker at a time, through a :class:`Lease` record stored in the backend's metadata
(``LogBackend.load_leases`` / ``propose_leases``), which every broker reads:

* A lease names the owner (``broker_id`` and the ``address`` clients reach it at), carries a
  lease ``epoch`` that grows by one with every change of owner, the holder's promised renewal
  period (``duration``) and ``released`` (the owner gave the partition up on a clean close).
* Backends store proposals in one order and keep a proposal only when
  :func:`supersedes` says so: a claim must carry a higher epoch than the stored record, a
  renewal or release the same epoch and broker as a lease that is not released. Two brokers
  claiming the same epoch at once: the first one stored wins, the other learns the winner.
* A broker takes a partition over only when the record is missing, released, an earlier life
  of the same broker id, or when it has seen no change of the record (no renewal) for a whole
  ``duration`` on its *own* clock (:meth:`OwnershipTable.decide`). Clocks of different
  machines are never compared.

The lease is for routing and for deciding when to take over. It is not what keeps a stale
owner from writing: the Kafka and Pulsar backends fence the previous writer when a new one
opens a partition (Kafka transactional ids, Pulsar exclusive producers), so a broker that
still believes it holds an expired lease gets :class:`~idempotent.errors.OwnershipLostError`
on its next write. The memory backend does not fence (a stale owner can still append until
its own clock shows the lease expired); SQLite allows one writing process per file.

Everything here is pure: time is passed in as ``now`` (the caller's monotonic clock, for its
own decisions) and ``wall`` (wall-clock seconds, only written into records for people).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

from idempotent.core.types import TopicPartition
from idempotent.errors import ConfigError

#: a holder renews when this fraction of its lease duration has passed since its last renewal
RENEW_FRACTION = 1 / 3


@attrs.frozen
class Lease:
    """The ownership record of one partition, as stored in the backend.

    Attributes:
        topic, partition: the partition owned.
        broker_id: the owner's id (``BrokerConfig.broker_id``).
        address: where clients reach the owner (``BrokerConfig.advertised_address``); may be "".
        epoch: 1 for the first owner, one more for every claim after it.
        renewed_at: wall-clock seconds of the owner's last renewal (informational only).
        duration: seconds within which the owner promises to renew.
        released: the owner gave the partition up (clean close): others may claim it at once.
    """

    topic: str
    partition: int
    broker_id: str
    address: str
    epoch: int
    renewed_at: float
    duration: float
    released: bool = False

    @property
    def tp(self) -> TopicPartition:
        """The partition as a :class:`~idempotent.core.types.TopicPartition`."""
        return TopicPartition(self.topic, self.partition)


def supersedes(current: Lease | None, proposal: Lease) -> bool:
    """Whether ``proposal``, stored after ``current``, becomes the partition's record.

    Every backend applies this rule to proposals in its storage order (a compare-and-set):
    a claim wins when its epoch is higher than the stored one; a renewal or a release wins
    when it comes from the stored, unreleased lease's broker with the same epoch.
    """
    if current is None:
        return True
    if proposal.epoch > current.epoch:
        return True
    return proposal.epoch == current.epoch and proposal.broker_id == current.broker_id and not current.released


def _order(lease: Lease) -> tuple[int, bool]:
    """Records of one partition in the order the backend accepts them: by epoch, and within
    an epoch (one holder) the release last. Any other change within an epoch is a renewal,
    whatever its clock says."""
    return (lease.epoch, lease.released)


class Action(enum.Enum):
    """What a broker should do about one partition (see :meth:`OwnershipTable.decide`)."""

    #: this broker holds a live lease: serve the partition
    HOLD = "hold"
    #: free, released, expired, or left by an earlier life of this broker: claim it
    ACQUIRE = "acquire"
    #: another broker holds a live lease: send clients there
    REDIRECT = "redirect"


@attrs.define
class _Seen:
    lease: Lease
    #: caller's clock when this record (or a renewal of it) was first observed
    observed_at: float


class OwnershipTable:
    """One broker's view of the partitions' leases and of the ones it holds. Not thread-safe
    (the broker shell serialises calls).

    ``now`` arguments are the caller's monotonic clock; ``wall`` arguments are wall-clock
    seconds, written into records only.
    """

    def __init__(self, broker_id: str, address: str, duration: float) -> None:
        if not broker_id:
            raise ConfigError("broker_id must be a non-empty string")
        if duration <= 0:
            raise ConfigError("lease duration must be positive")
        self.broker_id = broker_id
        self.address = address
        self.duration = duration
        self._seen: dict[TopicPartition, _Seen] = {}
        #: partitions held: the epoch held and the caller's clock at the start of the last
        #: renewal the backend confirmed
        self._held: dict[TopicPartition, tuple[int, float]] = {}

    # -- observing the backend --------------------------------------------------------------

    def observe(self, leases: Iterable[Lease], now: float) -> list[TopicPartition]:
        """Fold the records read from the backend. Returns the partitions this broker held
        and has now lost (the stored record names another epoch or broker)."""
        lost = []
        for record in leases:
            lease = self._note(record, now)
            held = self._held.get(lease.tp)
            if held is not None and (lease.epoch != held[0] or lease.broker_id != self.broker_id or lease.released):
                del self._held[lease.tp]
                lost.append(lease.tp)
        return lost

    def _note(self, lease: Lease, now: float) -> Lease:
        """Keep ``lease`` when it is newer than the record seen; return the newest. Records
        read before a newer one was seen (a slow read racing a claim) are ignored."""
        seen = self._seen.get(lease.tp)
        if (
            seen is None
            or _order(lease) > _order(seen.lease)
            or (_order(lease) == _order(seen.lease) and lease != seen.lease)
        ):
            self._seen[lease.tp] = _Seen(lease, now)
            return lease
        return seen.lease

    def lease(self, tp: TopicPartition) -> Lease | None:
        """The newest record seen for a partition, or None."""
        seen = self._seen.get(tp)
        return seen.lease if seen is not None else None

    def leases(self) -> Mapping[TopicPartition, Lease]:
        """Every record seen, by partition."""
        return {tp: seen.lease for tp, seen in self._seen.items()}

    # -- deciding ---------------------------------------------------------------------------

    def holds(self, tp: TopicPartition, now: float) -> bool:
        """True while this broker holds the partition's lease and its last confirmed renewal
        is younger than the lease duration."""
        held = self._held.get(tp)
        return held is not None and now - held[1] < self.duration

    def held(self) -> list[TopicPartition]:
        """Partitions whose lease this broker holds (possibly due for renewal)."""
        return sorted(self._held)

    def decide(self, tp: TopicPartition, now: float) -> Action:
        """What to do about a partition, given the records observed so far."""
        seen = self._seen.get(tp)
        if seen is None or seen.lease.released:
            return Action.ACQUIRE
        lease = seen.lease
        if lease.broker_id == self.broker_id:
            held = self._held.get(tp)
            return Action.HOLD if held is not None and held[0] == lease.epoch else Action.ACQUIRE
        if now - seen.observed_at >= lease.duration:
            return Action.ACQUIRE
        return Action.REDIRECT

    # -- proposals (the caller stores them, then calls settle) --------------------------------

    def claim(self, tp: TopicPartition, wall: float) -> Lease:
        """A proposal taking the partition over: one epoch above the newest record seen."""
        current = self.lease(tp)
        epoch = (current.epoch if current is not None else 0) + 1
        return Lease(tp.topic, tp.partition, self.broker_id, self.address, epoch, wall, self.duration)

    def renewal(self, tp: TopicPartition, wall: float) -> Lease | None:
        """A proposal renewing a held lease, or None when it is not held."""
        held = self._held.get(tp)
        if held is None:
            return None
        return Lease(tp.topic, tp.partition, self.broker_id, self.address, held[0], wall, self.duration)

    def renewals_due(self, now: float, wall: float) -> list[Lease]:
        """Renewal proposals for the held leases whose last renewal is older than
        ``RENEW_FRACTION`` of the duration."""
        return [
            Lease(tp.topic, tp.partition, self.broker_id, self.address, epoch, wall, self.duration)
            for tp, (epoch, renewed) in sorted(self._held.items())
            if now - renewed >= self.duration * RENEW_FRACTION
        ]

    def releases(self, wall: float) -> list[Lease]:
        """Release proposals for every held lease (clean close)."""
        return [
            Lease(tp.topic, tp.partition, self.broker_id, self.address, epoch, wall, self.duration, True)
            for tp, (epoch, _) in sorted(self._held.items())
        ]

    def settle(self, proposal: Lease, stored: Lease | None, started: float) -> bool:
        """Record the backend's answer to a proposal sent at ``started`` (the caller's clock
        before it was sent). Returns True when the backend stored the proposal (and it is not
        a release).

        A late answer never touches a hold at a newer epoch: renewals go out without the lease
        lock, so the partition may have been claimed again at a higher epoch meanwhile."""
        tp = proposal.tp
        if stored is not None:
            self._note(stored, started)
        won = stored == proposal and not proposal.released
        held = self._held.get(tp)
        if held is None or held[0] <= proposal.epoch:
            if won:
                self._held[tp] = (proposal.epoch, started)
            else:
                self._held.pop(tp, None)
        return won

    def forget(self, tp: TopicPartition) -> None:
        """Stop counting a partition as held (its writes were fenced, or it was released)."""
        self._held.pop(tp, None)
