"""A fault-injecting broker wrapper that works over every backend.

:class:`FaultyBroker` is a :class:`~idempotent.broker.broker.Broker` whose ``submit_request`` loses
requests, loses acknowledgements (after the batch was stored) and delivers requests twice,
at seeded random. A producer over it sees exactly what it would see on a lossy network, so
the exactly-once property can be checked against SQLite, Kafka and Pulsar alike.
"""

from __future__ import annotations

import random
from concurrent.futures import Future

import attrs

from idempotent.broker.broker import Broker, BrokerConfig
from idempotent.core.outcomes import ProduceResult
from idempotent.core.request import ProduceRequest

from ..backend import LogBackend
from ..errors import RequestTimeoutError


@attrs.define
class LinkFaults:
    """Probabilities per produce request (each in 0..1), and the seed.

    ``drop_first_responses`` loses the answers to the first that many produce requests for
    certain (after the batch was processed), like a connection cut before the response.
    """

    drop_request: float = 0.0
    drop_response: float = 0.0
    duplicate: float = 0.0
    seed: int = 0
    injected: dict[str, int] = attrs.field(factory=lambda: {"drop_request": 0, "drop_response": 0, "duplicate": 0})
    drop_first_responses: int = 0


class FaultyBroker(Broker):
    """A broker that misbehaves like a lossy link on produce requests (see module docstring)."""

    def __init__(
        self, backend: LogBackend, config: BrokerConfig | None = None, faults: LinkFaults | None = None
    ) -> None:
        super().__init__(backend, config)
        self.faults = faults or LinkFaults()
        self._rng = random.Random(self.faults.seed)

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        f = self.faults
        roll = self._rng.random
        if roll() < f.drop_request:
            f.injected["drop_request"] += 1
            lost: Future[ProduceResult] = Future()
            lost.set_exception(RequestTimeoutError("request lost (injected)"))
            return lost
        answer = super().submit_request(request)
        if roll() < f.duplicate:
            f.injected["duplicate"] += 1
            super().submit_request(request)
        lost_answer = roll() < f.drop_response
        if f.drop_first_responses > 0:
            f.drop_first_responses -= 1
            lost_answer = True
        if lost_answer:
            f.injected["drop_response"] += 1
            out: Future[ProduceResult] = Future()

            def lose(_: Future[ProduceResult]) -> None:
                out.set_exception(RequestTimeoutError("response lost (injected)"))

            answer.add_done_callback(lose)
            return out
        return answer
