"""A broker outage under named producers of both kinds, on the suite's Kafka: the broker paused
with SIGSTOP for longer than the request timeout, killed with -9 and restarted, and paused for
longer than the delivery timeout, while :class:`idempotent.Producer` and the confluent-kafka
drop-in write from their own processes (``tests/outage_apps.py``).

Counted from a plain ``read_committed`` consumer: no duplicate, no loss, no reorder, no fatal
error, every record with an outcome that matches the log (persisted: stored once; not
persisted: not stored; possibly persisted: either), and producing resumes by itself.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import outage_apps

pytestmark = pytest.mark.kafka


def _run(
    kafka_service: Any,
    fault: Callable[[], None],
    *,
    count: int = 2500,
    rate: float = 500,
    delivery_ms: float = 120_000,
    fault_after: float = 1.5,
    numbered: bool = False,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A named Producer and a named drop-in, each writing ``count`` records at ``rate`` a
    second into a new topic from its own process; ``fault`` runs ``fault_after`` seconds
    after both wrote their first records. Returns their results and the checked counts."""
    bootstrap = kafka_service.bootstrap
    topic = outage_apps.plain_topic(bootstrap)
    tag = uuid.uuid4().hex[:6]
    names = {"producer": f"p{tag}", "dropin": f"d{tag}"}
    # the request timeout of both (the backend's admin calls, flushes and commits; librdkafka's
    # request.timeout.ms) is 5 s: a pause longer than that times requests out
    url = f"{kafka_service.url}?timeout=5"
    flags = ["numbered"] if numbered else []
    ready = {kind: Path(tempfile.mkdtemp()) / "ready" for kind in names}
    apps = {
        "producer": outage_apps.start(
            "producer", url, topic, names["producer"], count, rate, delivery_ms, ready_file=str(ready["producer"])
        ),
        "dropin": outage_apps.start(
            "dropin",
            bootstrap,
            topic,
            names["dropin"],
            count,
            rate,
            delivery_ms,
            *flags,
            ready_file=str(ready["dropin"]),
        ),
    }
    try:
        deadline = time.monotonic() + 120
        while not all(path.exists() for path in ready.values()):  # each acknowledged a record
            assert time.monotonic() < deadline, "the producers did not start writing"
            assert all(app.poll() is None for app in apps.values()), [
                outage_apps.result_of(app) for app in apps.values()
            ]
            time.sleep(0.5)
        time.sleep(fault_after)
        fault()
        results = {names[kind]: outage_apps.result_of(app) for kind, app in apps.items()}
    finally:
        for app in apps.values():
            if app.poll() is None:
                app.kill()
                app.wait(30)
    counts = outage_apps.check(results, outage_apps.read_all(bootstrap, topic))
    return results, counts


def _pid() -> int:
    from idempotent.testing import services

    running = services.status("kafka")
    assert running is not None
    return running.pid


def _pause(seconds: float) -> Callable[[], None]:
    def fault() -> None:
        pid = _pid()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the fault itself lasts this long
        finally:
            os.kill(pid, signal.SIGCONT)

    return fault


def _assert_exact(results: dict[str, dict[str, Any]], counts: dict[str, Any]) -> None:
    # (a DUPLICATE answer to a resend whose first attempt was stored is correct, not a copy)
    bad = {k: v for k, v in counts.items() if k not in ("persisted", "reported duplicates") and v}
    assert not bad, (bad, {name: {k: r[k] for k in ("errors", "send_errors", "left")} for name, r in results.items()})
    for name, result in results.items():
        # within the delivery timeout nothing fails: every record persisted, the last ones after the fault
        assert result["not_persisted"] == [] and result["possibly_persisted"] == [], (name, result["errors"])
        assert len(result["persisted"]) == result["sent"], name
        assert "a bug" not in result["log"] and "Traceback" not in result["log"], result["log"][-3000:]


def test_kafka_paused_past_the_request_timeout_under_both_producers(kafka_service: Any) -> None:
    results, counts = _run(kafka_service, _pause(12.0))
    _assert_exact(results, counts)
    assert all(r["longest_gap"] >= 5 for r in results.values())  # the pause did stop them


def test_kafka_killed_and_restarted_under_both_producers(kafka_service: Any) -> None:
    from idempotent.testing import services

    def kill_and_restart() -> None:
        services.kill9("kafka")
        services.up("kafka", fresh=False)

    results, counts = _run(kafka_service, kill_and_restart)
    _assert_exact(results, counts)


def test_an_outage_past_the_delivery_timeout_gives_every_record_its_status_and_producing_resumes(
    kafka_service: Any,
) -> None:
    # the drop-in numbers its records itself here: with the application's sequences, the
    # records after an expired one wait for the application to send it again
    results, counts = _run(kafka_service, _pause(20.0), delivery_ms=8000, count=2500, numbered=True)
    bad = {k: v for k, v in counts.items() if k not in ("persisted", "reported duplicates") and v}
    summary = {
        name: {k: r[k] for k in ("errors", "send_errors", "sent", "resumed_after")} for name, r in results.items()
    }
    assert not bad, (bad, summary, [r["log"][-2000:] for r in results.values()])
    for name, result in results.items():
        failed = result["not_persisted"] + result["possibly_persisted"]
        assert failed, (name, "nothing expired: the pause did not outlast the delivery timeout")
        assert set(result["errors"]) <= {"DeliveryTimeoutError", "_MSG_TIMED_OUT"}, (name, result["errors"])
        # the producer stayed usable: a round of records sent after the failed ones persisted whole
        assert result["resumed_after"] is not None, (name, result["errors"])
        assert max(result["persisted"]) == result["sent"] - 1, name
        after = [i for i in result["persisted"] if i > max(failed)]
        assert len(after) >= 100, (name, len(after))
        print(f"{name}: {len(failed)} failed, resumed {result['resumed_after']:.1f} s after the first run")
        assert "a bug" not in result["log"] and "Traceback" not in result["log"], result["log"][-3000:]
