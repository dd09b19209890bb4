"""Domain scalars and limits shared by the broker-side checker and the client-side sequencer.

Producer ids are unsigned 63-bit integers handed out by the broker, epochs are int16 values
bumped on every re-initialisation of a named producer, and sequences are int32 values that
wrap from ``MAX_SEQUENCE`` back to 0, as in Kafka's record batch format, or, under the
``monotonic`` policy, application-chosen values up to ``MAX_APPLICATION_SEQUENCE`` (int64, like
pulsar-client's ``sequence_id``) that never wrap (see ``_sequence.py``).
"""

from __future__ import annotations

from typing import NamedTuple, NewType

ProducerId = NewType("ProducerId", int)
Epoch = NewType("Epoch", int)
Sequence = NewType("Sequence", int)

#: Sentinel for "no sequence stored yet" (the first batch of a producer starts at 0).
NO_SEQUENCE = Sequence(-1)
#: Sentinel producer id for records written without a producer (deduplication disabled).
NO_PRODUCER_ID = ProducerId(-1)
#: Highest sequence of the int32 ring (the ``strict`` policy); the next one is 0.
MAX_SEQUENCE = 2**31 - 1
#: Number of distinct sequence values on the int32 ring.
SEQUENCE_SPACE = 2**31
#: Highest sequence an application may choose (the ``monotonic`` policy; no wrap-around).
MAX_APPLICATION_SEQUENCE = 2**63 - 1
#: Highest producer epoch (int16); re-initialising past it allocates a new producer id.
MAX_EPOCH = 2**15 - 1
#: Highest producer id (the broker allocates ids below this).
MAX_PRODUCER_ID = 2**63 - 1
#: Largest number of records one batch may carry.
MAX_BATCH_RECORDS = 1_000_000
#: Default number of recent batches the checker keeps per producer and partition.
DEFAULT_WINDOW = 16
#: Default number of pipelined batches per partition on the client side.
DEFAULT_MAX_IN_FLIGHT = 5


class TopicPartition(NamedTuple):
    """A topic name and a partition index."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


def namespace_of(topic: str) -> str:
    """Return the namespace of a topic: the part of its name before the last ``/``.

    A topic without ``/`` is in the root namespace ``""``.
    """
    head, sep, _ = topic.rpartition("/")
    return head if sep else ""
