"""A producer's own broker over a pipelined log (as Pulsar's: ``prepare`` + ``submit``, each
batch answered on its own, failures settled by ``resolve_entries``), on a scripted in-memory
log: the settlement of entries whose outcome was unknown, CPU only. Pulsar itself runs it in
tests/backends/pulsar."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from idempotent import Outcome
from idempotent.backend import AppendBatch
from idempotent.broker.direct import DirectBroker
from idempotent.core.records import RecordColumns, Snapshot
from idempotent.core.request import ProduceRequest
from idempotent.errors import BackendUnavailableError, ProducerError


@attrs.define(eq=False)
class Entry:
    entry_id: int
    topic: str
    partition: int
    offset: int | None = None  # where it landed, None: not stored


class ScriptedLog:
    """Stores every batch at the next offset of its partition, unless ``script`` says:
    ``"lost_ack"`` (stored, answer lost) or ``"failed"`` (not stored, outcome unknown)."""

    max_batch_bytes = 1 << 20
    max_batch_records = 10_000
    max_in_flight = 5

    def __init__(self) -> None:
        self.script: list[str] = []
        self.ends: dict[tuple[str, int], int] = {}
        self.failed: list[Entry] = []
        self.states: dict[tuple[str, int], Snapshot] = {}
        self.next_id = 0

    def load_states(self, producer_id: int = -1, **_: Any) -> dict[tuple[str, int], Snapshot]:
        return {}

    def prepare(self, partitions: Sequence[tuple[str, int]]) -> None:
        pass

    def submit(
        self,
        batches: Sequence[tuple[str, int, AppendBatch]],
        done: Callable[[int, int | None, ProducerError | None, Any], None],
    ) -> None:
        for i, (topic, partition, batch) in enumerate(batches):
            self.next_id += 1
            entry = Entry(self.next_id, topic, partition)
            fate = self.script.pop(0) if self.script else "stored"
            if fate != "failed":
                entry.offset = self.ends.get((topic, partition), 0)
                self.ends[(topic, partition)] = entry.offset + batch.header.record_count
            if fate == "stored":
                done(i, entry.offset, None, entry)
            else:
                self.failed.append(entry)
                done(i, None, BackendUnavailableError(f"no answer ({fate})"), entry)

    def resolve_entries(self) -> dict[Entry, int | None]:
        settled, self.failed = self.failed, []
        return {entry: entry.offset for entry in settled}

    def note_state(self, topic: str, partition: int, snapshot: Snapshot) -> None:
        self.states[(topic, partition)] = snapshot

    def close(self) -> None:
        pass


def open_producer_log(backend: Any, key: str, named: bool, settings: Any, takeover: Any = None) -> ScriptedLog:
    return ScriptedLog()


def _broker() -> tuple[DirectBroker, ScriptedLog, int, int]:
    broker = DirectBroker(f"memory://pipelined-{uuid.uuid4().hex[:8]}", log_module=sys.modules[__name__])
    broker.create_topic("t", 2)
    session = broker.init_producer("p")
    log = broker._log
    assert isinstance(log, ScriptedLog)
    return broker, log, session.producer_id, session.producer_epoch


def _one(seq: int) -> RecordColumns:
    return RecordColumns([b"r%d" % seq])


def test_a_lost_answer_is_settled_stored_and_its_resend_is_a_duplicate_at_its_offset() -> None:
    broker, log, pid, epoch = _broker()
    with broker:
        assert broker.produce("t", 0, pid, epoch, 0, _one(0)).base_offset == 0
        log.script = ["lost_ack"]
        assert broker.submit_request(ProduceRequest.build("t", 0, pid, epoch, 1, _one(1))).exception() is not None
        assert broker._unsettled
        resend = broker.produce("t", 0, pid, epoch, 1, _one(1))  # settled first
        assert (resend.outcome, resend.base_offset) == (Outcome.DUPLICATE, 1)
        assert not broker._unsettled and broker.last_sequence("t", 0) == 1
        assert log.states[("t", 0)] is not None  # the named producer's state was noted


def test_an_entry_not_stored_forgets_its_partitions_later_batches_and_they_are_resent_as_new() -> None:
    broker, log, pid, epoch = _broker()
    with broker:
        assert broker.produce("t", 0, pid, epoch, 0, _one(0)).outcome is Outcome.ACCEPTED
        assert broker.produce("t", 1, pid, epoch, 0, _one(0)).outcome is Outcome.ACCEPTED
        # partition 0: seq 1 not stored, seq 2 after it answered stored; partition 1: seq 1 stored
        log.script = ["failed", "stored", "stored"]
        futures = broker.submit_requests(
            [
                ProduceRequest.build("t", 0, pid, epoch, 1, _one(1)),
                ProduceRequest.build("t", 0, pid, epoch, 2, _one(2)),
                ProduceRequest.build("t", 1, pid, epoch, 1, _one(1)),
            ]
        )
        assert futures[0].exception() is not None
        assert futures[1].result().outcome is Outcome.ACCEPTED and futures[2].result().outcome is Outcome.ACCEPTED
        log.ends[("t", 0)] = 1  # (the log kept nothing after the failed entry on partition 0)
        again = broker.produce("t", 0, pid, epoch, 1, _one(1))  # settles first: both forgotten
        assert (again.outcome, again.base_offset) == (Outcome.ACCEPTED, 1)
        assert broker.produce("t", 0, pid, epoch, 2, _one(2)).outcome is Outcome.ACCEPTED
        assert broker.produce("t", 1, pid, epoch, 1, _one(1)).outcome is Outcome.DUPLICATE
        assert broker.last_sequence("t", 0) == 2 and broker.last_sequence("t", 1) == 1
