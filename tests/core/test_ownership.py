"""The pure lease logic: the compare-and-set rule and one broker's decisions over time."""

from __future__ import annotations

import attrs
import pytest

from idempotent.core.ownership import Action, Lease, OwnershipTable, supersedes
from idempotent.core.types import TopicPartition
from idempotent.errors import ConfigError

TP = TopicPartition("t", 0)


def lease(broker_id: str, epoch: int, renewed_at: float = 0.0, released: bool = False) -> Lease:
    return Lease("t", 0, broker_id, f"{broker_id}:9", epoch, renewed_at, 3.0, released)


@pytest.mark.parametrize(
    ("current", "proposal", "wins"),
    [
        (None, lease("a", 1), True),
        (lease("a", 1), lease("b", 1), False),  # a racing claim of the same epoch
        (lease("a", 1), lease("b", 2), True),  # a takeover
        (lease("a", 2), lease("b", 1), False),  # a claim from an old view
        (lease("a", 1), lease("a", 1, 5.0), True),  # a renewal
        (lease("a", 1), lease("a", 1, released=True), True),  # a release
        (lease("a", 1, released=True), lease("a", 1, 5.0), False),  # no renewal after a release
        (lease("a", 1, released=True), lease("b", 2), True),
    ],
)
def test_supersedes(current: Lease | None, proposal: Lease, wins: bool) -> None:
    assert supersedes(current, proposal) is wins


def test_free_partition_is_claimed_at_epoch_one() -> None:
    table = OwnershipTable("a", "a:9", 3.0)
    assert table.decide(TP, now=0.0) is Action.ACQUIRE
    claim = table.claim(TP, wall=100.0)
    assert (claim.broker_id, claim.address, claim.epoch, claim.renewed_at, claim.duration) == (
        "a",
        "a:9",
        1,
        100.0,
        3.0,
    )
    assert table.settle(claim, claim, started=0.0)
    assert table.decide(TP, now=1.0) is Action.HOLD and table.holds(TP, now=2.9)
    assert not table.holds(TP, now=3.0)  # no confirmed renewal for a whole duration


def test_lost_claim_redirects_to_the_winner() -> None:
    table = OwnershipTable("b", "b:9", 3.0)
    claim = table.claim(TP, wall=1.0)
    winner = lease("a", 1)
    assert not table.settle(claim, winner, started=10.0)
    assert table.lease(TP) == winner and table.decide(TP, now=11.0) is Action.REDIRECT
    assert table.held() == []


def test_takeover_only_after_a_whole_lease_without_renewal() -> None:
    table = OwnershipTable("b", "b:9", 3.0)
    table.observe([lease("a", 4, renewed_at=1.0)], now=10.0)
    assert table.decide(TP, now=12.9) is Action.REDIRECT
    table.observe([lease("a", 4, renewed_at=2.0)], now=12.9)  # a heartbeat was seen
    assert table.decide(TP, now=15.8) is Action.REDIRECT
    table.observe([lease("a", 4, renewed_at=2.0)], now=15.8)  # the same record again
    assert table.decide(TP, now=15.9) is Action.ACQUIRE
    assert table.claim(TP, wall=0.0).epoch == 5


def test_released_and_earlier_life_records_are_claimed_at_once() -> None:
    table = OwnershipTable("a", "a:9", 3.0)
    table.observe([lease("b", 2, released=True)], now=0.0)
    assert table.decide(TP, now=0.0) is Action.ACQUIRE
    table.observe([lease("a", 3)], now=0.0)  # this broker id before a restart
    assert table.decide(TP, now=0.0) is Action.ACQUIRE and table.claim(TP, wall=0.0).epoch == 4


def test_renewals_are_due_after_a_third_of_the_lease() -> None:
    table = OwnershipTable("a", "a:9", 3.0)
    claim = table.claim(TP, wall=0.0)
    table.settle(claim, claim, started=0.0)
    assert table.renewals_due(now=0.9, wall=0.9) == []
    (renewal,) = table.renewals_due(now=1.0, wall=50.0)
    assert renewal == attrs.evolve(claim, renewed_at=50.0)
    assert table.settle(renewal, renewal, started=1.0) and table.holds(TP, now=3.9)
    assert table.renewals_due(now=1.5, wall=1.5) == []


def test_observing_a_takeover_drops_the_hold() -> None:
    table = OwnershipTable("a", "a:9", 3.0)
    claim = table.claim(TP, wall=0.0)
    table.settle(claim, claim, started=0.0)
    assert table.observe([claim], now=0.5) == []
    assert table.observe([lease("b", 2)], now=1.0) == [TP]
    assert not table.holds(TP, now=1.0) and table.decide(TP, now=1.0) is Action.REDIRECT
    assert table.renewal(TP, wall=1.0) is None


def test_release_gives_everything_up() -> None:
    table = OwnershipTable("a", "a:9", 3.0)
    other = TopicPartition("t", 1)
    for tp in (TP, other):
        claim = table.claim(tp, wall=0.0)
        table.settle(claim, claim, started=0.0)
    releases = table.releases(wall=2.0)
    assert [(r.partition, r.released, r.epoch) for r in releases] == [(0, True, 1), (1, True, 1)]
    for release in releases:
        assert not table.settle(release, release, started=2.0)
    assert table.held() == [] and table.decide(TP, now=2.0) is Action.ACQUIRE


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        OwnershipTable("", "x", 1.0)
    with pytest.raises(ConfigError):
        OwnershipTable("a", "x", 0.0)


# -- the broker shell over the in-memory backend ------------------------------------------------


def test_broker_config_checks_the_cluster_options() -> None:
    from idempotent.broker.broker import BrokerConfig
    from idempotent.errors import ConfigError

    with pytest.raises(ConfigError):
        BrokerConfig(broker_id="")
    with pytest.raises(ConfigError):
        BrokerConfig(broker_id="a", lease_duration=0)


def test_single_broker_keeps_no_ownership_records() -> None:
    import idempotent

    from ..conftest import memory_harness

    broker = idempotent.connect(memory_harness().url)
    try:
        broker.create_topic("solo", 1)
        s = broker.init_producer()
        broker.produce("solo", 0, s.producer_id, s.producer_epoch, 0, [b"x"])
        assert broker.owner_of("solo", 0) is None and broker.owned() == []
        assert broker.backend.load_leases() == []
    finally:
        broker.close()


def test_clean_close_releases_and_stats_cover_owned_partitions() -> None:
    from idempotent.testing.conformance import cluster_config

    from ..conftest import memory_harness

    harness = memory_harness()
    first, second = harness.open(cluster_config("a", 30.0)), harness.open(cluster_config("b", 30.0))
    first.create_topic("pair", 2)
    s = first.init_producer()
    first.produce("pair", 0, s.producer_id, s.producer_epoch, 0, [b"x"])
    second.produce("pair", 1, s.producer_id, s.producer_epoch, 0, [b"y"])
    assert [(p.topic, p.partition) for p in first.stats("pair")] == [("pair", 0)]
    assert [(p.topic, p.partition) for p in second.stats("pair")] == [("pair", 1)]
    first.close()
    assert second.owner_of("pair", 0) is None  # released: no 30 s wait for the next owner
    assert second.produce("pair", 0, s.producer_id, s.producer_epoch, 1, [b"z"]).base_offset == 1
    assert second.owned() == [("pair", 0), ("pair", 1)]
    second.close()


def test_a_stale_read_does_not_undo_a_newer_record() -> None:
    table = OwnershipTable("b", "b:9", 3.0)
    table.observe([lease("a", 1)], now=0.0)
    claim = table.claim(TP, wall=5.0)
    assert table.settle(claim, claim, started=1.0)
    # a heartbeat that read the records before the claim was stored
    assert table.observe([lease("a", 1)], now=1.1) == []
    assert table.lease(TP) == claim and table.holds(TP, now=1.1)
    table.observe([lease("b", 2, released=True)], now=1.2)
    table.observe([lease("b", 2, renewed_at=9.0)], now=1.3)  # a renewal read before the release
    assert table.lease(TP) == lease("b", 2, released=True)


def test_late_answer_to_an_old_renewal_keeps_the_newer_hold() -> None:
    """A renewal at epoch 1 is answered only after the broker re-claimed the partition at
    epoch 2: neither a refusal nor an acceptance of the old renewal changes the newer hold."""
    table = OwnershipTable("a", "a:9", 3.0)
    first = table.claim(TP, wall=0.0)
    assert table.settle(first, first, started=0.0)
    renewal = table.renewal(TP, wall=1.0)
    assert renewal is not None and renewal.epoch == 1
    second = lease("a", 2, 1.5)
    assert table.settle(second, second, started=1.5)
    assert not table.settle(renewal, second, started=1.0)  # refused: epoch 2 is stored
    assert table.held() == [TP] and table.holds(TP, now=4.0) and table.decide(TP, now=4.0) is Action.HOLD
    assert table.settle(renewal, renewal, started=1.0)  # stored before the claim, answered after it
    held = table.renewal(TP, wall=2.0)
    assert held is not None and held.epoch == 2 and table.holds(TP, now=4.0)
