"""The names a copy job writes under: its producers' names and the headers of copied records.

Pure: no I/O. A job ``J`` writes each source partition with one named producer of the
destination, whose last stored sequence is that partition's resume point:

* ``J/<topic>/<partition>`` for a partition of a topic, where ``<topic>`` is the topic's
  stored name (:func:`topic_key`), so that every topic of a job has resume points of its own;
* ``J/<partition>`` for a file (partition 0).

``%`` and ``/`` in ``J`` and ``<topic>`` are percent-encoded, so a name splits back into its
parts and two jobs never share a name. Before names held the topic, a job wrote every
partition ``p`` as ``J/p`` with ``J`` as it is: :func:`legacy_producer_name`. A job resumes
from that name once, and writes under its own name from then on (see :mod:`.binding`); for
a job without ``%`` or ``/`` in its name, a file's name did not change.
"""

from __future__ import annotations

from urllib.parse import unquote

import attrs

from idempotent.core.topics import canonical_topic

from ..errors import InvalidTopicError

#: Header names of the source coordinates every copied record carries (ASCII decimal numbers,
#: the timestamp in milliseconds since the epoch; absent when the source has none).
SOURCE_TOPIC = "idem.src.topic"
SOURCE_PARTITION = "idem.src.partition"
SOURCE_OFFSET = "idem.src.offset"
SOURCE_TIMESTAMP = "idem.src.timestamp"
SOURCE_PREFIX = "idem.src."


def topic_key(topic: str) -> str:
    """The name of a source topic in producer names: its stored name
    (:func:`idempotent.core.topics.canonical_topic`: ``persistent://public/default/orders`` and
    ``orders`` are one topic), or the name itself when it is no valid topic name."""
    if not topic:
        return ""
    try:
        return canonical_topic(topic)
    except InvalidTopicError:
        return topic


def _quote(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F")


def producer_name(job: str, partition: int, topic: str = "") -> str:
    """The named producer that copies ``partition`` of the source ``topic`` ("" for a file)
    for ``job``: ``job/partition`` for a file, else ``job/<topic>/partition`` (see the module
    docstring)."""
    if not topic:
        return f"{_quote(job)}/{partition}"
    return f"{_quote(job)}/{_quote(topic_key(topic))}/{partition}"


def legacy_producer_name(job: str, partition: int) -> str:
    """The name a job wrote a partition under before producer names held the topic (and
    percent-encoded the job's name)."""
    return f"{job}/{partition}"


@attrs.frozen
class JobProducer:
    """A producer name of a job, split into its parts.

    Attributes:
        name: the producer name.
        topic: the source topic's key (:func:`topic_key`); None for ``job/partition`` (a file,
            or a topic copied before names held the topic, by a job without ``%`` or ``/`` in
            its name).
        partition: the source partition.
    """

    name: str
    topic: str | None
    partition: int


def parse_producer_name(job: str, name: str | None) -> JobProducer | None:
    """The parts of ``name`` if it is a producer name :func:`producer_name` gives ``job``,
    else None (also for a :func:`legacy_producer_name` that differs from it)."""
    prefix = _quote(job) + "/"
    if not name or not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    topic, separator, partition = rest.rpartition("/")
    if not partition.isdigit() or partition != str(int(partition)) or "/" in topic:
        return None
    if not separator:
        return JobProducer(name, None, int(partition))
    if not topic:
        return None
    return JobProducer(name, unquote(topic), int(partition))


__all__ = [
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_PREFIX",
    "SOURCE_TIMESTAMP",
    "SOURCE_TOPIC",
    "JobProducer",
    "legacy_producer_name",
    "parse_producer_name",
    "producer_name",
    "topic_key",
]
