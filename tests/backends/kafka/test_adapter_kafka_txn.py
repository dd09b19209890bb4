"""TransactionalProducer's rules for a failed commit, against a scripted librdkafka client.

Each fake client answers the transactional calls from a script (an exception to raise, or
None for success) and records the calls it got, so a test can say exactly which calls the
rules make: resume a commit in doubt before anything else, abort an abortable one, never
call anything but ``commit_transaction`` on an instance whose commit timed out (librdkafka
answers ``_CONFLICT`` to everything else), replace an unusable instance with a fresh one that
fences it, and never replace a fenced one. The same rules against a real Kafka are tested
through the producer in ``tests/backends/kafka/test_adapter_kafka.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import idempotent.adapters.kafka.txn as txn
from idempotent.adapters.kafka.txn import TransactionalProducer, TxnState
from idempotent.errors import BackendUnavailableError, ConfigError, OwnershipLostError, Recovery


def _error(code: str, *, fatal: bool = False, retriable: bool = False, abortable: bool = False) -> KafkaException:
    return KafkaException(
        KafkaError(getattr(KafkaError, code), "reason", fatal=fatal, retriable=retriable, txn_requires_abort=abortable)
    )


TIMED_OUT = {"code": "_TIMED_OUT", "retriable": True}


class FakeClient:
    """A confluent-kafka ``Producer`` stand-in: ``script[call]`` is a list of answers
    (``None`` succeeds, an exception is raised) taken in turn; an empty list succeeds."""

    instances: list[FakeClient] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.calls: list[str] = []
        self.script: dict[str, list[KafkaException | None]] = {}
        FakeClient.instances.append(self)

    def _answer(self, call: str) -> None:
        self.calls.append(call)
        answers = self.script.get(call)
        if answers:
            answer = answers.pop(0)
            if answer is not None:
                raise answer

    def init_transactions(self, timeout: float) -> None:
        self._answer("init")

    def begin_transaction(self) -> None:
        self._answer("begin")

    def commit_transaction(self, timeout: float) -> None:
        self._answer("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._answer("abort")

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self._answer("produce")

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeClient]]:
    FakeClient.instances = []
    monkeypatch.setattr(txn, "Producer", FakeClient)
    yield FakeClient.instances


def _writer(timeout: float = 3.0) -> TransactionalProducer:
    return TransactionalProducer({"transactional.id": "idempotent-t-0"}, timeout, "t[0]")


def _write(writer: TransactionalProducer, late: Any = None) -> None:
    with writer.transaction(late) as client:
        client.produce("t", b"v")


def test_a_commit_that_succeeds_needs_nothing_more(clients: list[FakeClient]) -> None:
    writer = _writer()
    _write(writer)
    _write(writer)
    assert len(clients) == 1 and clients[0].calls == ["init", *(["begin", "produce", "commit"] * 2)]
    assert writer.state is TxnState.READY


def test_a_timed_out_commit_is_resumed_before_anything_else(clients: list[FakeClient]) -> None:
    writer = _writer()
    client = clients[0]
    client.script["commit"] = [_error(**TIMED_OUT), _error(**TIMED_OUT), None]
    late: list[str] = []
    with pytest.raises(BackendUnavailableError, match="did not finish within 3 s") as failed:
        _write(writer, lambda: late.append("committed late"))
    assert failed.value.recovery is Recovery.RETRY and writer.state is TxnState.IN_DOUBT
    # still silent: settling raises and leaves it in doubt; no other call reaches the client
    with pytest.raises(BackendUnavailableError, match="still in doubt"):
        _write(writer)
    assert client.calls == ["init", "begin", "produce", "commit", "commit"] and late == []
    # back: the resumed commit completes, the caller hears of it, then the next transaction
    _write(writer)
    assert late == ["committed late"]
    assert client.calls == ["init", "begin", "produce", "commit", "commit", "commit", "begin", "produce", "commit"]
    assert len(clients) == 1


def test_settle_resolves_a_commit_in_doubt_without_a_new_transaction(clients: list[FakeClient]) -> None:
    writer = _writer()
    client = clients[0]
    client.script["commit"] = [_error(**TIMED_OUT), None]
    late: list[str] = []
    with pytest.raises(BackendUnavailableError):
        _write(writer, lambda: late.append("x"))
    writer.settle()  # what a rebuild of the partition calls before it reads the log
    assert late == ["x"] and writer.state is TxnState.READY
    assert client.calls[-2:] == ["commit", "commit"]


def test_a_resumed_commit_that_must_abort_is_aborted(clients: list[FakeClient]) -> None:
    writer = _writer()
    client = clients[0]
    client.script["commit"] = [_error(**TIMED_OUT), _error("_MSG_TIMED_OUT", abortable=True)]
    late: list[str] = []
    with pytest.raises(BackendUnavailableError):
        _write(writer, lambda: late.append("x"))
    writer.settle()
    assert client.calls[-3:] == ["commit", "commit", "abort"] and late == []
    # aborted: replaced, so the next transaction runs under a new epoch (see "After an abort")
    assert writer.state is TxnState.READY and len(clients) == 2 and clients[1].calls == ["init"]


@pytest.mark.parametrize(
    "answer",
    [
        {"code": "PRODUCER_FENCED", "fatal": True},  # also how the coordinator ends a transaction open too long
        {"code": "_INCONSISTENT", "fatal": True},
        {"code": "_CONFLICT", "retriable": True},
        {"code": "_STATE", "retriable": True},
        {"code": "UNKNOWN"},  # none of the three flags: librdkafka says treat it as fatal
    ],
)
def test_a_commit_in_doubt_that_ends_badly_replaces_the_client(
    clients: list[FakeClient], answer: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    writer = _writer()
    old = clients[0]
    old.script["commit"] = [_error(**TIMED_OUT), _error(**answer)]
    with pytest.raises(BackendUnavailableError):
        _write(writer)
    with caplog.at_level(logging.WARNING, logger="idempotent.adapters.kafka"):
        writer.settle()
    # a fresh client fenced the old one (its init_transactions ends the old transaction)
    assert len(clients) == 2 and clients[1].calls == ["init"] and writer.state is TxnState.READY
    assert any("replacing the client" in r.getMessage() for r in caplog.records)
    _write(writer)
    assert old.calls == ["init", "begin", "produce", "commit", "commit"]  # never used again
    assert clients[1].calls == ["init", "begin", "produce", "commit"]


def test_a_client_that_answers_conflict_is_replaced_not_retried(clients: list[FakeClient]) -> None:
    # what a client left with a timed-out commit answers to begin_transaction
    writer = _writer()
    old = clients[0]
    old.script["begin"] = [_error("_CONFLICT", retriable=True)]
    with pytest.raises(BackendUnavailableError, match="_CONFLICT") as failed:
        _write(writer)
    assert "a fresh one that fences it takes over" in str(failed.value)
    _write(writer)
    assert old.calls == ["init", "begin"] and len(clients) == 2
    assert clients[1].calls == ["init", "begin", "produce", "commit"]


def test_an_abortable_commit_is_aborted_and_the_client_replaced(clients: list[FakeClient]) -> None:
    """An aborted transaction's batches may be in the log under the client's epoch with the
    sequences librdkafka gives the next transaction's records again (a lost acknowledgement):
    the next transaction runs on a fresh client (a new epoch), never on the same one."""
    writer = _writer()
    client = clients[0]
    client.script["commit"] = [_error("_INCONSISTENT", abortable=True)]
    with pytest.raises(BackendUnavailableError, match="aborted, nothing of it is stored"):
        _write(writer)
    assert writer.state is TxnState.REPLACE
    _write(writer)
    assert client.calls == ["init", "begin", "produce", "commit", "abort"]
    assert len(clients) == 2 and clients[1].calls == ["init", "begin", "produce", "commit"]


def test_an_abort_that_fails_replaces_the_client(clients: list[FakeClient]) -> None:
    writer = _writer()
    old = clients[0]
    old.script["commit"] = [_error("_INCONSISTENT", abortable=True)]
    old.script["abort"] = [_error(**TIMED_OUT)]
    with pytest.raises(BackendUnavailableError):
        _write(writer)
    assert writer.state is TxnState.REPLACE
    _write(writer)
    assert len(clients) == 2 and old.calls[-1] == "abort"


def test_a_fatal_commit_replaces_the_client(clients: list[FakeClient]) -> None:
    writer = _writer()
    clients[0].script["commit"] = [_error("_INCONSISTENT", fatal=True)]
    with pytest.raises(BackendUnavailableError, match="can do nothing more"):
        _write(writer)
    _write(writer)
    assert len(clients) == 2


def test_a_fenced_commit_is_lost_for_good(clients: list[FakeClient]) -> None:
    writer = _writer()
    clients[0].script["commit"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(OwnershipLostError):
        _write(writer)
    assert writer.fenced is not None and writer.state is TxnState.FENCED
    for use in (writer.settle, lambda: _write(writer)):
        with pytest.raises(OwnershipLostError):
            use()
    assert len(clients) == 1  # never replaced: that would fence the newer owner back


def test_a_refused_write_aborts_and_raises_the_mapped_error(clients: list[FakeClient]) -> None:
    from idempotent.errors import EntryTooLargeError

    writer = _writer()
    client = clients[0]
    client.script["produce"] = [_error("MSG_SIZE_TOO_LARGE")]
    with pytest.raises(EntryTooLargeError):
        _write(writer)
    assert client.calls[-1] == "abort" and writer.state is TxnState.REPLACE
    _write(writer)  # on a fresh client: a new epoch
    assert len(clients) == 2 and clients[1].calls == ["init", "begin", "produce", "commit"]


@pytest.mark.parametrize("refusal", ["produce", "body"])
def test_a_write_refused_because_a_newer_holder_fenced_this_one_is_ownership_lost(
    clients: list[FakeClient], refusal: str
) -> None:
    """Regression: a fenced client's produce() answers _FATAL ("Local: Fatal error"), which
    was raised as an internal error (a bug); the abort answers _FENCED, the cause."""
    writer = _writer()
    client = clients[0]
    client.script["abort"] = [_error("_FENCED", fatal=True)]
    if refusal == "produce":
        client.script["produce"] = [_error("_FATAL", fatal=True)]
        with pytest.raises(OwnershipLostError):
            _write(writer)
    else:  # a bulk call's refusal, raised by the body as a retriable error
        with pytest.raises(OwnershipLostError), writer.transaction():
            raise BackendUnavailableError("kafka: the client refused 10 of 10 records: _FATAL")
    assert writer.state is TxnState.FENCED and client.calls[-1] == "abort"
    with pytest.raises(OwnershipLostError):
        _write(writer)
    assert len(clients) == 1  # never replaced: that would fence the newer owner back


def _left_pending(cause: KafkaException) -> SystemError:
    """What confluent-kafka 2.16 raises from a fenced client's flush() or commit when a
    delivery report's callback runs after the fatal error."""
    error = SystemError("<method 'append' of 'list' objects> returned a result with an exception set")
    error.__cause__ = cause
    return error


def test_a_fence_that_confluent_kafka_leaves_pending_in_a_flush_is_ownership_lost(clients: list[FakeClient]) -> None:
    """Regression: it was an internal error (a bug) when the fence was learnt in a flush."""
    writer = _writer()
    clients[0].script["abort"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(OwnershipLostError), writer.transaction():
        raise _left_pending(_error("_FENCED", fatal=True))
    assert writer.state is TxnState.FENCED


def test_a_fence_that_confluent_kafka_leaves_pending_in_a_commit_is_ownership_lost(clients: list[FakeClient]) -> None:
    writer = _writer()
    clients[0].script["commit"] = [_left_pending(_error("_FENCED", fatal=True))]
    with pytest.raises(OwnershipLostError):
        _write(writer)
    assert writer.state is TxnState.FENCED and len(clients) == 1


def test_a_system_error_of_its_own_is_not_taken_for_a_refusal(clients: list[FakeClient]) -> None:
    writer = _writer()
    with pytest.raises(SystemError), writer.transaction():
        raise SystemError("something else")
    assert writer.state is TxnState.REPLACE and clients[0].calls[-1] == "abort"


def test_a_bug_in_the_body_stays_a_bug_when_the_abort_finds_the_client_fenced(clients: list[FakeClient]) -> None:
    writer = _writer()
    clients[0].script["abort"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(RuntimeError), writer.transaction():
        raise RuntimeError("a bug in the body")
    assert writer.state is TxnState.FENCED


def test_a_failed_body_is_aborted_and_its_error_raised(clients: list[FakeClient]) -> None:
    writer = _writer()
    with pytest.raises(RuntimeError), writer.transaction():
        raise RuntimeError("a bug in the body")
    assert clients[0].calls == ["init", "begin", "abort"] and writer.state is TxnState.REPLACE


def test_a_replacement_that_cannot_fence_yet_is_tried_again(clients: list[FakeClient]) -> None:
    writer = _writer(timeout=0.3)
    clients[0].script["commit"] = [_error("_INCONSISTENT", fatal=True)]
    with pytest.raises(BackendUnavailableError):
        _write(writer)
    # the fresh clients cannot reach the cluster yet
    original = FakeClient.init_transactions

    def silent(self: FakeClient, timeout: float) -> None:
        self.calls.append("init")
        raise _error("_TIMED_OUT", retriable=True)

    try:
        FakeClient.init_transactions = silent  # type: ignore[method-assign]
        with pytest.raises(BackendUnavailableError):
            writer.settle()
    finally:
        FakeClient.init_transactions = original  # type: ignore[method-assign]
    assert writer.state is TxnState.REPLACE
    writer.settle()
    assert writer.state is TxnState.READY


def test_a_coordinator_still_loading_is_asked_again_within_the_timeout(clients: list[FakeClient]) -> None:
    """Regression: a retriable InitProducerId answer other than a timeout (the coordinator
    moved by a broker restart and still loading its state) failed the writer's open at once."""
    original = FakeClient.init_transactions
    answers = [_error("COORDINATOR_LOAD_IN_PROGRESS", retriable=True), _error("NOT_COORDINATOR", retriable=True)]

    def loading(self: FakeClient, timeout: float) -> None:
        self.calls.append("init")
        if answers:
            raise answers.pop(0)

    try:
        FakeClient.init_transactions = loading  # type: ignore[method-assign]
        writer = _writer()
    finally:
        FakeClient.init_transactions = original  # type: ignore[method-assign]
    assert [c.calls for c in clients] == [["init"], ["init"], ["init"]] and answers == []
    _write(writer)
    assert writer.state is TxnState.READY


def test_a_non_retriable_init_answer_is_raised_at_once(clients: list[FakeClient]) -> None:
    original = FakeClient.init_transactions

    def refused(self: FakeClient, timeout: float) -> None:
        self.calls.append("init")
        raise _error("TRANSACTIONAL_ID_AUTHORIZATION_FAILED")

    try:
        FakeClient.init_transactions = refused  # type: ignore[method-assign]
        with pytest.raises(ConfigError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            _writer()
    finally:
        FakeClient.init_transactions = original  # type: ignore[method-assign]
    assert len(clients) == 1


# -- a fence told apart from a takeover by the caller's check ------------------------------


class Registry:
    """The takeover check's stand-in: ``answers`` are taken in turn (True: a newer instance
    exists, an exception is raised), the last one repeated; ``asked`` counts the calls and
    ``clients`` records how many clients existed at each call."""

    def __init__(self, clients: list[FakeClient], *answers: bool | Exception) -> None:
        self.answers = list(answers)
        self.clients = clients
        self.asked: list[int] = []

    def __call__(self) -> bool:
        self.asked.append(len(self.clients))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _checked_writer(registry: Registry) -> TransactionalProducer:
    return TransactionalProducer({"transactional.id": "idempotent-n-a"}, 3.0, "a", registry)


def test_the_first_opening_asks_the_check_after_it_fenced(clients: list[FakeClient]) -> None:
    registry = Registry(clients, False)
    writer = _checked_writer(registry)
    assert registry.asked == [1] and clients[0].calls == ["init"] and writer.state is TxnState.READY
    # a newer instance that fenced before this one did: this one stops before it writes
    with pytest.raises(OwnershipLostError):
        _checked_writer(Registry(clients, True))
    assert clients[1].calls == ["init"]


@pytest.mark.parametrize("refusal", ["produce", "bulk"])
def test_a_fence_with_no_newer_instance_is_retried_on_a_fresh_client(clients: list[FakeClient], refusal: str) -> None:
    """Kafka's coordinator aborted a transaction left open past transaction.timeout.ms: the
    same _FENCED as a takeover, but the registry has no newer instance."""
    registry = Registry(clients, False)
    writer = _checked_writer(registry)
    client = clients[0]
    client.script["abort"] = [_error("_FENCED", fatal=True)]
    if refusal == "produce":
        client.script["produce"] = [_error("_FATAL", fatal=True)]
        with pytest.raises(BackendUnavailableError, match="nothing of it is stored") as failed:
            _write(writer)
    else:
        with pytest.raises(BackendUnavailableError, match="nothing of it is stored") as failed, writer.transaction():
            raise BackendUnavailableError("kafka: the client refused 10 of 10 records: _FATAL")
    assert not isinstance(failed.value, OwnershipLostError) and failed.value.recovery is Recovery.RETRY
    assert writer.state is TxnState.REPLACE and writer.fenced is None and registry.asked == [1, 1]
    _write(writer)  # checked before and after the fresh client's fence, then written
    assert registry.asked == [1, 1, 1, 2] and len(clients) == 2
    assert clients[1].calls == ["init", "begin", "produce", "commit"] and client.calls[-1] == "abort"


def test_a_fence_with_a_newer_instance_is_a_takeover(clients: list[FakeClient]) -> None:
    registry = Registry(clients, False, True)
    writer = _checked_writer(registry)
    clients[0].script["produce"] = [_error("_FENCED", fatal=True)]
    clients[0].script["abort"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(OwnershipLostError):
        _write(writer)
    assert writer.state is TxnState.FENCED
    with pytest.raises(OwnershipLostError):
        _write(writer)
    assert len(clients) == 1  # never replaced: that would fence the newer owner back


def test_a_takeover_that_races_the_check_stops_the_fresh_client_before_it_writes(clients: list[FakeClient]) -> None:
    # opened; the fence found no newer instance; the fresh client's check finds one
    registry = Registry(clients, False, False, False, True)
    writer = _checked_writer(registry)
    clients[0].script["commit"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(BackendUnavailableError, match="in doubt"):
        _write(writer)
    with pytest.raises(OwnershipLostError):
        _write(writer)
    assert writer.state is TxnState.FENCED and registry.asked == [1, 1, 1, 2]
    assert clients[1].calls == ["init"]  # nothing begun, nothing written


def test_a_fenced_commit_with_no_newer_instance_is_in_doubt_and_settled_on_a_fresh_client(
    clients: list[FakeClient],
) -> None:
    registry = Registry(clients, False)
    writer = _checked_writer(registry)
    clients[0].script["commit"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(BackendUnavailableError, match="its commit is in doubt") as failed:
        _write(writer)
    assert not isinstance(failed.value, OwnershipLostError)
    assert writer.state is TxnState.REPLACE  # KafkaProducerLog.write takes this as unresolved
    writer.settle()  # the fresh client's fence ends the old transaction; the log says how
    assert writer.state is TxnState.READY and len(clients) == 2 and clients[0].calls[-1] == "commit"


def test_a_check_that_cannot_answer_is_retriable_and_asked_again(clients: list[FakeClient]) -> None:
    registry = Registry(clients, False, BackendUnavailableError("kafka: the metadata cannot be read"), True)
    writer = _checked_writer(registry)
    clients[0].script["commit"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(BackendUnavailableError, match="could not be read yet") as failed:
        _write(writer)
    assert not isinstance(failed.value, OwnershipLostError) and writer.state is TxnState.REPLACE
    with pytest.raises(OwnershipLostError):  # asked again before a fresh client fences anyone
        writer.settle()
    assert len(clients) == 1


def test_without_a_check_every_fence_stays_a_takeover(clients: list[FakeClient]) -> None:
    writer = _writer()
    clients[0].script["commit"] = [_error("_FENCED", fatal=True)]
    with pytest.raises(OwnershipLostError):
        _write(writer)
    assert writer.state is TxnState.FENCED and len(clients) == 1


def test_a_commit_the_body_made_is_not_made_again_and_its_answer_follows_the_same_rules(
    clients: list[FakeClient],
) -> None:
    """The compiled write path commits inside the body (``committed``): a success needs no
    second commit call; a timed-out answer leaves the transaction in doubt, resumed by the
    next settle exactly as a commit the transaction made itself; an abortable one is aborted."""
    writer = _writer()
    with writer.transaction() as client:
        client.produce("t", b"v")
        writer.committed(None)
    assert clients[0].calls == ["init", "begin", "produce"] and writer.state is TxnState.READY
    late: list[bool] = []
    with pytest.raises(BackendUnavailableError, match="did not finish"), writer.transaction(lambda: late.append(True)):
        writer.committed(_error("_TIMED_OUT", retriable=True))
    assert writer.state is TxnState.IN_DOUBT
    writer.settle()  # the resumed commit succeeds
    assert clients[0].calls[-1] == "commit" and late == [True] and writer.state is TxnState.READY
    with pytest.raises(BackendUnavailableError, match="aborted, nothing of it is stored"), writer.transaction():
        writer.committed(_error("_INCONSISTENT", abortable=True))
    # aborted, and (as after every abort) the client is replaced before the next transaction
    assert clients[0].calls[-1] == "abort" and writer.state is TxnState.REPLACE
