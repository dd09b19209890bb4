"""A copy job: which topics, where each goes, and the threads that copy their partitions.

:class:`Mirror` plans a job (:meth:`Mirror.plan`: destination topics with the source's
partition counts and the ``monotonic`` policy, where each partition ends, and the check that
the job copied no other source, :mod:`.binding`), then runs one
:func:`~.engine.copy_partition` per source partition. A job copies one topic (``topic``),
the topics ``topics`` selects (:class:`~.topics.TopicPattern`, as MirrorMaker 2's
``topics``), or a file. A following job whose ``topics`` hold a regular expression asks the
source for its topics every ``refresh_interval`` seconds and starts copying each new match;
every topic has resume points of its own (:mod:`.names`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar
from urllib.parse import urlsplit

import attrs

from ..api import BrokerAPI
from ..errors import ConfigError, InvalidTopicError, ProducerError, Recovery
from .binding import bind_tasks
from .engine import RETRY_WINDOW, PartitionSummary, PartitionTask, ProgressCallback, copy_partition
from .names import topic_key
from .schemes import open_source
from .source import Source
from .topics import TopicPattern

_LOG = logging.getLogger("idempotent.mirror")
_T = TypeVar("_T")

#: Seconds between two listings of the source's topics by a following job with a pattern.
REFRESH_INTERVAL = 30.0


@attrs.frozen
class MirrorSummary:
    """What :meth:`Mirror.run` did, per partition and in total.

    ``topic`` is the source topic, or the ``topics`` entries of a job that selects several;
    ``to_topic`` the destination topic, or the ``to_prefix`` of such a job. Each partition's
    summary names its own topics.
    """

    job: str
    source: str
    destination: str
    topic: str
    to_topic: str
    partitions: tuple[PartitionSummary, ...]
    elapsed: float

    @property
    def copied(self) -> int:
        """Records stored by this run."""
        return sum(p.copied for p in self.partitions)

    @property
    def duplicates(self) -> int:
        """Records resent by this run that the destination already held."""
        return sum(p.duplicates for p in self.partitions)

    @property
    def resumed(self) -> int:
        """Partitions where this run resumed an earlier copy (skipping what it had stored)."""
        return sum(p.resumed_after >= 0 for p in self.partitions)

    @property
    def completed(self) -> bool:
        """Every partition reached its end."""
        return all(p.completed for p in self.partitions)

    @property
    def topics(self) -> list[str]:
        """The source topics copied, in the order of the partitions."""
        return list(dict.fromkeys(p.topic for p in self.partitions))

    def __str__(self) -> str:
        rate = self.copied / self.elapsed if self.elapsed > 0 else 0.0
        pairs = {(p.topic, p.to_topic) for p in self.partitions}
        several = len(pairs) > 1
        resumed = ", ".join(
            (f"{p.topic}[{p.partition}]@{p.resumed_after}" if several else f"{p.partition}@{p.resumed_after}")
            for p in self.partitions
            if p.resumed_after >= 0
        )
        if several:
            what = f"{self.source} {len(self.topics)} topics ({self.topic}) -> {self.destination} {self.to_topic}*"
        else:
            topic, to_topic = pairs.pop() if pairs else (self.topic, self.to_topic)
            what = f"{self.source}{' ' + topic if topic else ''} -> {self.destination} {to_topic}"
        return (
            f"mirror {self.job}: {what}: "
            f"copied={self.copied} already-copied-skipped-after={{{resumed}}} duplicates={self.duplicates} "
            f"partitions={len(self.partitions)} elapsed={self.elapsed:.2f}s rate={rate:.0f} records/s"
            + ("" if self.completed else " (stopped before the end)")
        )


class Mirror:
    """A copy job from a source to a destination broker: resumable, and exactly once.

    Args:
        source: the source URL: ``file:///path``, ``kafka+native://host:port``,
            ``pulsar+native://host:port?admin_url=http://host:port``, or a broker URL
            (``sqlite://``, ``memory://``, ``idem://``, ``kafka://``, ``pulsar://``) for an
            idempotent topic.
        destination: the destination broker URL.
        topic: the source topic (ignored for files).
        topics: instead of ``topic``: the topics to copy, names and regular expressions
            (``"orders,payments"``, ``"orders-.*"``, or a sequence of entries; see
            :mod:`.topics`). Topic ``T`` is copied to ``to_prefix + T``.
        to_topic: the destination topic of ``topic`` (default: ``to_prefix + topic``) or of a
            file (required).
        to_prefix: prepended to a source topic's name to name its destination topic.
        job: the job's name. Running the same job again resumes it; another name copies
            again. Its partitions are written by named producers (``job/topic/partition``,
            ``job/partition`` for a file). A job copies one source: run with another source
            into a destination partition it wrote, it is refused (:mod:`.binding`).
        follow: keep copying new records (and, with a regular expression in ``topics``, new
            matching topics) until :meth:`stop`; else stop at the end the source had when
            :meth:`run` started.
        parallelism: partitions copied at once by a job that does not follow (a following job
            copies every partition at once: each waits for new records).
        progress: called with a :class:`~.engine.PartitionProgress` from the partition threads.
        refresh_interval: seconds between two listings of the source's topics by a following
            job with a regular expression in ``topics``.

    Raises:
        ConfigError: missing topic or job, both ``topic`` and ``topics``, ``to_topic`` with
            ``topics``, a bad ``topics`` entry, or a bad URL.
    """

    def __init__(
        self,
        source: str,
        destination: str,
        *,
        topic: str | None = None,
        topics: str | Sequence[str] | None = None,
        to_topic: str | None = None,
        to_prefix: str = "",
        job: str,
        follow: bool = False,
        parallelism: int = 8,
        progress: ProgressCallback | None = None,
        refresh_interval: float = REFRESH_INTERVAL,
    ) -> None:
        self.is_file = urlsplit(source).scheme == "file"
        if not job or not isinstance(job, str):
            raise ConfigError("a mirror job needs a name (job=...)")
        if topic and topics:
            raise ConfigError("give either a topic (--topic) or topics (--topics), not both")
        if self.is_file and topics:
            raise ConfigError("a file source has no topics: leave out --topics, and give --to-topic")
        if not self.is_file and not topic and not topics:
            raise ConfigError(f"copying from {source} needs a source topic (--topic) or topics (--topics)")
        if self.is_file and not to_topic:
            raise ConfigError("copying a file needs a destination topic (to_topic=...)")
        if topics and to_topic:
            raise ConfigError(
                "--to-topic names one destination topic; with --topics each topic T is copied to "
                "PREFIX + T (--to-prefix PREFIX)"
            )
        if parallelism < 1:
            raise ConfigError("parallelism must be at least 1")
        if refresh_interval <= 0:
            raise ConfigError("refresh_interval must be above 0 seconds")
        self.source = source
        self.destination = destination
        self.pattern = TopicPattern(topics) if topics else None
        self.topic = "" if self.is_file else (self.pattern.spec if self.pattern else str(topic))
        self.to_prefix = to_prefix
        if self.pattern is not None:
            self.to_topic = to_prefix
        else:
            self.to_topic = str(to_topic or to_prefix + topic_key(self.topic))
        self.job = job
        self.follow = follow
        self.parallelism = parallelism
        self.progress = progress
        self.refresh_interval = refresh_interval
        self._stop = threading.Event()

    def destination_topic(self, topic: str) -> str:
        """Where source ``topic`` is copied to."""
        if self.pattern is None:
            return self.to_topic
        return self.to_prefix + topic_key(topic)

    def select_topics(self, source: Source) -> list[str]:
        """The source topics the job copies now ("" for a file).

        Raises:
            ConfigError: ``topics`` matches no topic and the job does not follow.
            BackendUnavailableError: the source could not list its topics.
        """
        if self.pattern is None:
            return [self.topic]
        available = source.topics() if self.pattern.has_expressions else []
        selected = self.pattern.select(available)
        if not selected and not self.follow:
            raise ConfigError(f"no topic of {self.source} matches --topics {self.pattern.spec!r}")
        return selected

    def plan(self, source: Source, broker: BrokerAPI, topics: Sequence[str] | None = None) -> list[PartitionTask]:
        """Prepare the destination and return one task per source partition.

        For each topic (``topics``, default :meth:`select_topics`): checks that the job
        copied no other source into the partitions it is to write (:func:`.binding.bind_tasks`),
        creates the destination topic with the source's partition count (1 for files) unless
        it exists with at least as many, sets its policy to ``monotonic``, and fixes each
        partition's end (the source's end now; None when following).

        Raises:
            InvalidTopicError: a source topic does not exist.
            ConfigError: the job copied another source into a destination partition, or a
                destination topic has fewer partitions than its source. Nothing was written.
            BrokerError, TransportError: the destination refused or failed.
        """
        selected = self.select_topics(source) if topics is None else list(topics)
        counts = {topic: source.partitions(topic) for topic in selected}
        existing = broker.topics()
        for topic, count in counts.items():
            to_topic = self.destination_topic(topic)
            if existing.get(to_topic, count) < count:
                raise ConfigError(
                    f"destination topic {to_topic!r} has {existing[to_topic]} partitions; the source has {count}"
                )
        tasks = [
            PartitionTask(
                self.source,
                self.destination,
                topic,
                self.destination_topic(topic),
                self.job,
                p,
                0 if self.is_file else p,
                None if self.follow else source.end(topic, p),
            )
            for topic, count in counts.items()
            for p in range(count)
        ]
        tasks = bind_tasks(broker, source, tasks)
        for topic, count in counts.items():
            to_topic = self.destination_topic(topic)
            if to_topic not in existing:
                broker.create_topic(to_topic, count)
            broker.set_policy("monotonic", topic=to_topic)
        return tasks

    def stop(self) -> None:
        """Ask a running :meth:`run` to flush what it sent and return (thread- and
        signal-safe)."""
        self._stop.set()

    def run(self) -> MirrorSummary:
        """Copy, resuming the job where its destination says it stopped.

        Returns:
            A :class:`MirrorSummary`: records copied, where each partition resumed (what was
            already copied was skipped), and duplicates answered.

        Raises:
            The errors of :func:`~.engine.copy_partition` and :meth:`plan`; a failure of one
            partition stops the others (what they sent is flushed). Nothing is lost or
            duplicated by a failure: run the job again to resume it.
        """
        from .. import connect

        started = time.monotonic()
        source = self._starting("open the source", lambda: open_source(self.source))
        try:
            broker = self._starting("connect to the destination", lambda: connect(self.destination))
            try:
                tasks = self._starting("plan the copy", lambda: self.plan(source, broker))
                if self.follow:
                    summaries = self._follow(tasks, source, broker)
                else:
                    summaries = self._run_tasks(tasks, source, broker)
            finally:
                broker.close()
        finally:
            source.close()
        return MirrorSummary(
            self.job,
            self.source,
            self.destination,
            self.topic,
            self.to_topic,
            tuple(summaries),
            time.monotonic() - started,
        )

    def _starting(self, what: str, step: Callable[[], _T]) -> _T:
        """Run one start-up step, retrying a retriable failure (a source or destination that
        is restarting, electing leaders or not answering yet) with a growing pause for up to
        :data:`~.engine.RETRY_WINDOW` seconds, as a copy already running does.

        Raises:
            ProducerError: a failure that is not retriable, one that lasted past the window,
            or any failure once the job was asked to stop. Nothing was copied yet.
        """
        began = time.monotonic()
        failures = 0
        while True:
            try:
                return step()
            except ProducerError as exc:
                failures += 1
                if exc.recovery is Recovery.FATAL or self._stop.is_set() or time.monotonic() - began >= RETRY_WINDOW:
                    raise
                _LOG.warning("%s: %s: %s; retrying (attempt %d)", self.job, what, exc, failures)
                self._stop.wait(min(5.0, 0.1 * 2**failures))

    def _copy(self, task: PartitionTask, source: Source, broker: BrokerAPI) -> PartitionSummary:
        try:
            return copy_partition(task, source=source, broker=broker, stop=self._stop, progress=self.progress)
        except BaseException:
            self._stop.set()  # one failure ends the job; the others flush and return
            raise

    def _run_tasks(self, tasks: list[PartitionTask], source: Source, broker: BrokerAPI) -> list[PartitionSummary]:
        with ThreadPoolExecutor(min(self.parallelism, len(tasks)) or 1, thread_name_prefix="mirror") as pool:
            futures = [pool.submit(self._copy, task, source, broker) for task in tasks]
            while not all(f.done() for f in futures):
                # wait in short steps so that a signal handler runs promptly in the main thread
                time.sleep(0.05)
        return [f.result() for f in futures]

    def _follow(self, tasks: list[PartitionTask], source: Source, broker: BrokerAPI) -> list[PartitionSummary]:
        """Copy every partition at once until stopped, starting the new topics a pattern
        matches every ``refresh_interval``."""
        futures = [self._start(task, source, broker) for task in tasks]
        planned = {task.topic for task in tasks}
        refresh = self.pattern is not None and self.pattern.has_expressions
        next_refresh = time.monotonic() + self.refresh_interval
        failure: ProducerError | None = None
        try:
            while not (self._stop.is_set() and all(f.done() for f in futures)):
                time.sleep(0.05)  # short steps, so that a signal handler runs promptly
                if refresh and not self._stop.is_set() and time.monotonic() >= next_refresh:
                    failure = self._add_new_topics(source, broker, planned, futures)
                    if failure is not None:
                        self._stop.set()  # a topic this job may not copy: stop, and say why
                    next_refresh = time.monotonic() + self.refresh_interval
        finally:
            self._stop.set()  # on any way out, the partitions flush and end
            for future in futures:
                future.exception()  # waits
        summaries = [f.result() for f in futures]
        if failure is not None:
            raise failure
        return summaries

    def _add_new_topics(
        self, source: Source, broker: BrokerAPI, planned: set[str], futures: list[Future[PartitionSummary]]
    ) -> ProducerError | None:
        """Start copying the topics that match now and were not planned; returns the error
        that ends the job (a topic it may not copy), if any."""
        try:
            new = [t for t in self.select_topics(source) if t not in planned]
            if not new:
                return None
            added = self.plan(source, broker, new)
        except InvalidTopicError as exc:  # deleted since it was listed: looked for again next time
            _LOG.warning("job %r: %s", self.job, exc)
            return None
        except ProducerError as exc:
            if not exc.retriable:
                return exc
            _LOG.warning("job %r: cannot add the new topics of %s: %s", self.job, self.source, exc)
            return None
        _LOG.info("job %r: copying new topics %s", self.job, ", ".join(new))
        planned.update(new)
        futures.extend(self._start(task, source, broker) for task in added)
        return None

    def _start(self, task: PartitionTask, source: Source, broker: BrokerAPI) -> Future[PartitionSummary]:
        """Copy ``task`` in a thread of its own."""
        future: Future[PartitionSummary] = Future()

        def body() -> None:
            future.set_running_or_notify_cancel()
            try:
                future.set_result(self._copy(task, source, broker))
            except BaseException as exc:
                future.set_exception(exc)

        name = f"mirror-{task.topic or 'file'}[{task.partition}]"
        threading.Thread(target=body, name=name).start()
        return future


__all__ = ["REFRESH_INTERVAL", "Mirror", "MirrorSummary"]
