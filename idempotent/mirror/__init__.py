"""Mirror: resumable, duplicate-free copy jobs into idempotent topics (``idempotent mirror``).

    >>> from idempotent.mirror import Mirror
    >>> summary = Mirror("kafka+native://127.0.0.1:9092", "sqlite:///copy.db",
    ...                  topic="orders", job="orders-copy").run()  # doctest: +SKIP

Each source partition is copied by one named producer of the destination
(``job/topic/partition``; ``job/partition`` for a file) with the record's source offset as its
sequence, under the ``monotonic`` policy; the destination's last stored sequence is where a
restarted job resumes, and anything resent is answered DUPLICATE. See docs/mirror.md.

Modules, each importing only those listed before it: :mod:`.source` (the source contract),
:mod:`.names` (producer and header names), :mod:`.topics` (``--topics`` patterns), the
sources (:mod:`.file`, :mod:`.kafka`, :mod:`.pulsar`, :mod:`.topic`), :mod:`.schemes`
(:func:`open_source`), :mod:`.engine` (the unit of work, :func:`copy_partition`),
:mod:`.binding` (a job copies one source), :mod:`.job` (:class:`Mirror`) and :mod:`.status`
(a job's progress, read from its destination).
"""

from .engine import PartitionProgress, PartitionSummary, PartitionTask, copy_partition
from .job import Mirror, MirrorSummary
from .names import SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TIMESTAMP, SOURCE_TOPIC, producer_name
from .schemes import open_source
from .source import PartitionReader, Polled, Source, SourceRecord
from .status import PartitionStatus, job_status
from .topics import TopicPattern

__all__ = [
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_TIMESTAMP",
    "SOURCE_TOPIC",
    "Mirror",
    "MirrorSummary",
    "PartitionProgress",
    "PartitionReader",
    "PartitionStatus",
    "PartitionSummary",
    "PartitionTask",
    "Polled",
    "Source",
    "SourceRecord",
    "TopicPattern",
    "copy_partition",
    "job_status",
    "open_source",
    "producer_name",
]
