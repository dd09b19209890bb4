"""Faults the transaction tests inject, shared by every backend's and both APIs' tests:

* :func:`kill_between_writes_and_commit`: an application writing rounds of transactions over
  several topics, killed with -9 between its writes and its commit, three times, then run
  to its end; the caller checks what is stored.
* :class:`KafkaPauses`: the suite's Kafka stopped with SIGSTOP as the application's
  ``commit_transaction`` reaches librdkafka (or a few ms into it).

And the calls in the wrong state every backend refuses alike (:func:`refuse_wrong_states`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

#: each round r: ten records ``r-i`` to every topic, then a commit with positions r + 1; a
#: restart resumes at the round its last commit recorded
KILLED_APP = textwrap.dedent(
    """
    import sys
    import idempotent

    url, name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    topics = sys.argv[4:]
    with idempotent.Producer(url, name) as producer:
        done = producer.committed_positions() or 0
        for r in range(done, rounds):
            producer.begin_transaction()
            for topic in topics:
                for i in range(10):
                    producer.send(topic, f"{r}-{i}".encode())
                producer.flush()
                print(f"wrote {r} {topic}", flush=True)
            print(f"committing {r}", flush=True)
            producer.commit_transaction(r + 1)
            print(f"committed {r}", flush=True)
    """
)
ROUNDS = 6


def rounds_expected(rounds: int = ROUNDS) -> list[bytes]:
    """What each topic holds once every round committed, in order."""
    return [f"{r}-{i}".encode() for r in range(rounds) for i in range(10)]


def kill_between_writes_and_commit(
    url: str, name: str, topics: Sequence[str], tmp_path: Path, after_kill: Callable[[], None] = lambda: None
) -> None:
    """Run :data:`KILLED_APP` on ``url`` and kill it with -9 after its writes of round 0
    reached the second topic, of round 2 the third, and as round 4's commit begins
    (``after_kill`` runs after each kill); then run it to its end.

    Raises:
        AssertionError: a kill point was not reached within 120 s, or the last run failed.
    """
    script = tmp_path / "killed_app.py"
    script.write_text(KILLED_APP)
    command = [sys.executable, str(script), url, name, str(ROUNDS), *topics]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    kills = 0
    for stop_at in (f"wrote 0 {topics[1]}", f"wrote 2 {topics[2]}", "committing 4"):
        app = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        assert app.stdout is not None
        deadline = time.monotonic() + 120
        for line in app.stdout:
            if line.strip() == stop_at:
                os.kill(app.pid, signal.SIGKILL)
                kills += 1
                break
            assert time.monotonic() < deadline
        app.wait(60)
        after_kill()
    final = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert final.returncode == 0, final.stderr
    assert kills == 3


def refuse_wrong_states(producer: Any, topic: str) -> None:
    """A commit or an abort with no transaction open, and a second begin, are refused with
    ``TransactionStateError`` and change nothing; then a transaction of one record ``x`` on
    ``topic`` commits (the caller checks it is stored)."""
    from idempotent.errors import TransactionStateError

    with pytest.raises(TransactionStateError):
        producer.commit_transaction()
    with pytest.raises(TransactionStateError):
        producer.abort_transaction()
    producer.begin_transaction()
    with pytest.raises(TransactionStateError):
        producer.begin_transaction()
    producer.send(topic, b"x")
    producer.commit_transaction()


def kafka_pid() -> int:
    """The process id of the suite's Kafka."""
    from idempotent.testing import services

    running = services.status("kafka")
    assert running is not None
    return running.pid


class KafkaPauses:
    """Stops the suite's Kafka with SIGSTOP when the next application commit reaches
    librdkafka (``TransactionalProducer._commit``), ``delay`` s into it, for ``length`` s:
    :meth:`arm` before the commit, :meth:`settle` after it (waits for the pause to end and
    resumes Kafka whatever happened)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from idempotent.adapters.kafka import txn

        self._pid = kafka_pid()
        self._armed: list[tuple[float, float]] = []
        self._timers: list[threading.Timer] = []
        commit = txn.TransactionalProducer._commit

        def paused_commit(producer: Any, on_late_commit: Any) -> None:
            if self._armed:
                delay, length = self._armed.pop()
                stop = threading.Timer(delay, os.kill, (self._pid, signal.SIGSTOP))
                resume = threading.Timer(delay + length, os.kill, (self._pid, signal.SIGCONT))
                self._timers.extend((stop, resume))
                for timer in self._timers:
                    timer.start()
            commit(producer, on_late_commit)

        monkeypatch.setattr(txn.TransactionalProducer, "_commit", paused_commit)

    def arm(self, delay: float, length: float) -> None:
        self._armed.append((delay, length))

    def settle(self) -> None:
        """Wait for the pause to end and resume Kafka.

        Raises:
            AssertionError: the armed pause never began (the commit did not reach Kafka).
        """
        for timer in self._timers:
            timer.join()
        self._timers.clear()
        os.kill(self._pid, signal.SIGCONT)
        assert not self._armed, "the commit did not reach Kafka"
