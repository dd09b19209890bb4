"""The network client of several broker servers over one backend: :class:`ClusterBroker`
(re-exported by :mod:`idempotent.net.client`; ``docs/clustering.md``).

It keeps a :class:`~idempotent.net.remote.RemoteBroker` per broker it has talked to,
sends each partition's batches to its owner, follows
:class:`~idempotent.errors.NotOwnerError`, and moves on to another broker when one cannot be
reached. A round of batches (``submit_requests``) goes to each owner in one write.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Unpack

import attrs

from idempotent.core.request import ProduceRequest, ProduceShortcuts
from idempotent.core.topics import canonical_topic
from idempotent.core.types import TopicPartition
from idempotent.core.values import LastSequences
from idempotent.errors import (
    BrokerConnectionError,
    ConfigError,
    NotOwnerError,
    ProducerClosedError,
    ProducerError,
    RequestTimeoutError,
)
from idempotent.net.remote import ClientOptions, RemoteBroker, parse_url
from idempotent.runtime.future import LightFuture

if TYPE_CHECKING:
    from idempotent.core.checker import Policy
    from idempotent.core.outcomes import ProduceResult
    from idempotent.core.records import StoredRecord
    from idempotent.core.values import PartitionStats, ProducerSession


def parse_bootstrap(url: str) -> tuple[str, list[str]]:
    """``idem://h1:p1,h2:p2`` (or ``idems://``) -> (scheme, ["h1:p1", "h2:p2"]). Raises ConfigError."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("idem", "idems"):
        raise ConfigError(f"bad broker URL {url!r}: expected idem://host:port[,host:port...]")
    rest = rest.rstrip("/")
    addresses = [a for a in rest.split(",") if a]
    if not addresses:
        raise ConfigError(f"bad broker URL {url!r}: no address")
    out = []
    for address in addresses:
        host, port, _ = parse_url(f"{scheme}://{address}")
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return scheme, out


class ClusterBroker(ProduceShortcuts):
    """The Broker API over several broker servers that share one backend, each owning some
    partitions (``docs/clustering.md``). Thread-safe.

    ``idempotent.connect("idem://h1:p1,h2:p2")`` returns one. It keeps a
    :class:`RemoteBroker` per broker it has talked to, sends each partition's batches to the
    broker that owns it, follows :class:`~idempotent.errors.NotOwnerError` to the owner it
    names, and when a broker cannot be reached, sends to another one, which takes the
    partition over once the dead owner's lease expires. A produce is retried this way for
    up to ``timeout`` seconds; then its future fails with the last error (all retriable).

    Other requests go to any reachable broker (reads are served by every broker); ``stats``
    asks every known broker and joins their answers (each reports the partitions it owns).

    Args:
        url: ``idem://host:port[,host:port...]`` (``idems://`` for TLS): where to start; the
            owners' addresses are learnt from the brokers.
        timeout: seconds a produce or other request may take, redirects included.
        attempt_timeout: seconds to wait for one broker's answer before trying another one
            (a paused or cut-off broker); that broker is then tried last for as long.
        connect_timeout: seconds to try to reach one broker before trying the next.
        options: passed to each :class:`RemoteBroker` (``token``, ``cafile``, ...).

    Raises:
        ConfigError: bad URL or options.
        BrokerConnectionError: none of the brokers could be reached.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        attempt_timeout: float = 10.0,
        connect_timeout: float = 0.5,
        **options: Unpack[ClientOptions],
    ) -> None:
        self._scheme, self._bootstrap = parse_bootstrap(url)
        self._url = url
        if not timeout > 0 or not attempt_timeout > 0:
            raise ConfigError("timeout and attempt_timeout must be positive")
        self.timeout = float(timeout)
        self._quarantine = max(1.0, float(attempt_timeout))
        # each link fails fast; this client does the retrying, on another broker
        self._options: dict[str, Any] = {
            **options,
            "timeout": min(timeout, attempt_timeout),
            "connect_timeout": connect_timeout,
            "retries": 0,
        }
        self._lock = threading.Lock()
        self._links: dict[str, RemoteBroker] = {}
        self._route: dict[tuple[str, int], str] = {}
        self._down: dict[str, float] = {}  # address -> time.monotonic() of its last failure
        self._closed = False
        self._retry_pool = ThreadPoolExecutor(4, thread_name_prefix="idempotent-route")
        self._any()  # fail early when nobody answers

    @property
    def url(self) -> str:
        return self._url

    # -- links -----------------------------------------------------------------------------------

    def _link(self, address: str) -> RemoteBroker:
        with self._lock:
            if self._closed:
                raise ProducerClosedError(f"client for {self._url} is closed")
            link = self._links.get(address)
        if link is not None:
            return link
        try:
            link = RemoteBroker(f"{self._scheme}://{address}", **self._options)
        except BrokerConnectionError:
            self._failed(address)
            raise
        link.routed = True  # this client follows NotOwnerError itself
        with self._lock:
            existing = self._links.setdefault(address, link)
        if existing is not link:
            link.close()
        return existing

    def _failed(self, address: str) -> None:
        """Forget a broker that did not answer: its link, and the partitions routed to it."""
        with self._lock:
            self._down[address] = time.monotonic()
            for tp in [tp for tp, a in self._route.items() if a == address]:
                del self._route[tp]
            link = self._links.pop(address, None)
        if link is not None:  # callers still holding it get a retriable error, not a closed client
            link.close(BrokerConnectionError(f"the connection to {address} was dropped after a failure"))

    def _candidates(self, first: str | None = None) -> list[str]:
        """Addresses to try, best first: ``first``, known live links, the bootstrap list, and
        last the ones that failed recently."""
        with self._lock:
            known = list(self._links)
            down = dict(self._down)
        order = ([first] if first else []) + known + self._bootstrap
        seen: list[str] = []
        for address in order:
            if address not in seen:
                seen.append(address)
        now = time.monotonic()
        recent = {a for a, t in down.items() if now - t < self._quarantine}
        return [a for a in seen if a not in recent] + [a for a in seen if a in recent]

    def _any(self) -> RemoteBroker:
        last: ProducerError | None = None
        for address in self._candidates():
            try:
                return self._link(address)
            except BrokerConnectionError as exc:
                last = exc
        raise last or BrokerConnectionError(f"no broker of {self._url} could be reached")

    def _call(self, fn: Callable[[RemoteBroker], Any]) -> Any:
        """Run a request on any reachable broker, moving on when one cannot be reached."""
        last: ProducerError | None = None
        for address in self._candidates():
            try:
                return fn(self._link(address))
            except (BrokerConnectionError, RequestTimeoutError) as exc:
                self._failed(address)
                last = exc
        raise last or BrokerConnectionError(f"no broker of {self._url} could be reached")

    # -- routing ---------------------------------------------------------------------------------

    def owner(self, topic: str, partition: int) -> str | None:
        """The address this client sends the partition's batches to, or None when unknown.

        Raises:
            InvalidTopicError: not a valid spelling of a topic name.
        """
        topic = canonical_topic(topic)
        with self._lock:
            return self._route.get((topic, partition))

    def metadata(self, topics: Sequence[str] | None = None, *, create: bool = False) -> dict[str, list[str | None]]:
        """Owner address of every partition of ``topics`` (None while nobody owns it), as one
        broker sees it; also remembered for routing."""
        result: dict[str, list[str | None]] = self._call(lambda b: b.metadata(topics, create=create))
        with self._lock:
            for topic, owners in result.items():
                for partition, address in enumerate(owners):
                    if address:
                        self._route[(topic, partition)] = address
        return result

    @property
    def produce_timeout(self) -> float:
        """Seconds :meth:`produce` waits for the answer: the request timeout, and 5 s more."""
        return self.timeout + 5

    def submit_request(self, request: ProduceRequest) -> Future[ProduceResult]:
        """Send a batch to the partition's owner; return the future of its result. Batches
        of one partition go out in call order; a batch that is redirected or resent after a
        lost connection may arrive after a later one (the checker answers that one
        OUT_OF_ORDER_SEQUENCE, which the producer resends).

        Raises:
            ProducerClosedError: this client is closed.
        """
        return self.submit_requests([request])[0]

    def submit_requests(self, requests: Sequence[ProduceRequest]) -> list[Future[ProduceResult]]:
        """:meth:`submit_request` of a round of batches: the batches for owners this client
        is connected to go out to each owner in one write, in order; the others are routed
        one by one, as :meth:`submit_request` routes them.

        Raises:
            ProducerClosedError: this client is closed.
        """
        outs: list[Future[ProduceResult]] = [LightFuture() for _ in requests]
        deadline = time.monotonic() + self.timeout
        groups: dict[str, list[int]] = {}
        unrouted: list[int] = []
        with self._lock:
            routes, links, down = self._route, self._links, self._down
            for index, request in enumerate(requests):
                address = routes.get((request.topic, request.partition))  # keyed by the stored name
                if address is not None and address in links and address not in down:
                    groups.setdefault(address, []).append(index)
                else:
                    unrouted.append(index)
        for address, indexes in groups.items():  # the common case: in order, no thread hop
            self._attempt_many(address, [requests[i] for i in indexes], [outs[i] for i in indexes], deadline)
        for index in unrouted:
            try:
                self._retry_pool.submit(self._route_and_attempt, requests[index], outs[index], deadline, None)
            except RuntimeError:  # closed meanwhile
                raise ProducerClosedError(f"client for {self._url} is closed") from None
        return outs

    def _route_and_attempt(
        self, request: ProduceRequest, out: Future[ProduceResult], deadline: float, hint: str | None
    ) -> None:
        last: ProducerError | None = None
        for address in self._candidates(hint or self.owner(request.topic, request.partition)):
            try:
                self._link(address)
            except BrokerConnectionError as exc:
                last = exc
                continue
            except ProducerError as exc:
                out.set_exception(exc)
                return
            self._attempt(address, request, out, deadline)
            return
        self._later(request, out, deadline, None, last or BrokerConnectionError(f"no broker of {self._url} answers"))

    def _attempt(self, address: str, request: ProduceRequest, out: Future[ProduceResult], deadline: float) -> None:
        self._attempt_many(address, [request], [out], deadline)

    def _attempt_many(
        self, address: str, requests: list[ProduceRequest], outs: list[Future[ProduceResult]], deadline: float
    ) -> None:
        try:
            futures = self._link(address).submit_requests(requests)
        except BrokerConnectionError as exc:
            self._failed(address)
            for request, out in zip(requests, outs, strict=True):
                self._later(request, out, deadline, None, exc)
            return
        except ProducerError as exc:
            for out in outs:
                out.set_exception(exc)
            return
        for request, out, future in zip(requests, outs, futures, strict=True):
            future.add_done_callback(functools.partial(self._answered, address, request, out, deadline))

    def _answered(
        self, address: str, request: ProduceRequest, out: Future[ProduceResult], deadline: float, future: Future[Any]
    ) -> None:
        exc = future.exception()
        key = (request.topic, request.partition)
        if exc is None:
            with self._lock:
                self._route[key] = address
                self._down.pop(address, None)
            out.set_result(future.result())
            return
        if isinstance(exc, NotOwnerError):
            owner = exc.owner if exc.owner and exc.owner != address else None
            with self._lock:
                if owner is not None:
                    self._route[key] = owner
                else:
                    self._route.pop(key, None)
                owner_down = owner is not None and time.monotonic() - self._down.get(owner, -1e9) < self._quarantine
            if owner is not None and not owner_down:
                self._later(request, out, deadline, owner, exc, delay=0.0)
            else:  # nobody or a dead broker owns it: ask again until its lease expires
                self._later(request, out, deadline, None, exc)
            return
        lost = isinstance(exc, BrokerConnectionError | RequestTimeoutError)
        if lost:
            self._failed(address)
            self._later(request, out, deadline, None, exc if isinstance(exc, ProducerError) else None)
            return
        out.set_exception(exc)  # anything else is the broker's answer (retriable or not)

    def _later(
        self,
        request: ProduceRequest,
        out: Future[ProduceResult],
        deadline: float,
        hint: str | None,
        error: ProducerError | None,
        delay: float = 0.1,
    ) -> None:
        error = error or BrokerConnectionError(f"no broker of {self._url} answered")
        if time.monotonic() + delay > deadline or self._closed:
            out.set_exception(error)
            return

        def again() -> None:
            if delay:
                time.sleep(delay)
            self._route_and_attempt(request, out, deadline, hint)

        try:
            self._retry_pool.submit(again)
        except RuntimeError:  # closed meanwhile
            out.set_exception(error)

    # -- BrokerAPI -------------------------------------------------------------------------------

    def init_producer(self, producer_name: str | None = None, *, timeout: float = 30.0) -> ProducerSession:
        """Allocate a producer id, or re-initialise a named producer. Its last sequences on
        partitions the answering broker does not own are asked from their owners, so the
        session covers every partition it wrote to.

        Raises what :meth:`RemoteBroker.init_producer` raises.
        """
        session: ProducerSession = self._call(lambda b: b.init_producer(producer_name, timeout=timeout))
        if not session.elsewhere:
            return session
        last = dict(session.last_sequences.items())
        deadline = time.monotonic() + timeout
        for topic, partition in session.elsewhere:
            sequence = self._ask_owner(topic, partition, session, deadline)
            if sequence >= 0:
                last[TopicPartition(topic, partition)] = sequence
        return attrs.evolve(session, last_sequences=LastSequences(last), elsewhere=())

    def _ask_owner(self, topic: str, partition: int, session: ProducerSession, deadline: float) -> int:
        hint = self.owner(topic, partition)
        while True:
            last: ProducerError | None = None
            for address in self._candidates(hint):
                try:
                    return self._link(address).last_sequence(
                        topic, partition, session.producer_id, session.producer_epoch, timeout=self.timeout
                    )
                except NotOwnerError as exc:
                    last = exc
                    if exc.owner and exc.owner != address:
                        hint = exc.owner
                        break
                except (BrokerConnectionError, RequestTimeoutError) as exc:
                    self._failed(address)
                    last = exc
            if time.monotonic() > deadline:
                raise last or RequestTimeoutError(f"no owner of {topic}[{partition}] answered")
            time.sleep(0.1)

    def create_topic(self, name: str, partitions: int = 1) -> None:
        self._call(lambda b: b.create_topic(name, partitions))

    def delete_topic(self, name: str) -> None:
        self._call(lambda b: b.delete_topic(name))

    def topics(self) -> dict[str, int]:
        result: dict[str, int] = self._call(lambda b: b.topics())
        return result

    def partitions_for(self, topic: str, *, create: bool = True) -> int:
        count: int = self._call(lambda b: b.partitions_for(topic, create=create))
        return count

    def read(self, topic: str, partition: int, offset: int = 0, max_records: int = 500) -> list[StoredRecord]:
        records: list[StoredRecord] = self._call(lambda b: b.read(topic, partition, offset, max_records))
        return records

    def end_offset(self, topic: str, partition: int) -> int:
        offset: int = self._call(lambda b: b.end_offset(topic, partition))
        return offset

    def stats(self, topic: str | None = None) -> list[PartitionStats]:
        """Every reachable broker's stats (each covers the partitions it owns), joined."""
        out: dict[tuple[str, int], PartitionStats] = {}
        now = time.monotonic()
        with self._lock:
            down = {a for a, t in self._down.items() if now - t < self._quarantine}
        for address in self._candidates():
            if address in down:
                continue
            try:
                for stat in self._link(address).stats(topic):
                    out.setdefault((stat.topic, stat.partition), stat)
            except (BrokerConnectionError, RequestTimeoutError):
                self._failed(address)
        return [out[k] for k in sorted(out)]

    def set_deduplication(
        self, enabled: bool | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        self._call(lambda b: b.set_deduplication(enabled, topic=topic, namespace=namespace))

    def set_policy(
        self, policy: Policy | str | None, *, topic: str | None = None, namespace: str | None = None
    ) -> None:
        self._call(lambda b: b.set_policy(policy, topic=topic, namespace=namespace))

    def close(self) -> None:
        """Close every connection; produce requests still in flight fail."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            links, self._links = list(self._links.values()), {}
        # queued routing jobs still run: they find the client closed and fail their futures
        self._retry_pool.shutdown(wait=False)
        for link in links:
            link.close()

    def __enter__(self) -> ClusterBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ClusterBroker", "parse_bootstrap"]
