"""Mirror: resumable, duplicate-free copy jobs into idempotent topics (``idempotent mirror``).

    >>> from idempotent.mirror import Mirror
    >>> summary = Mirror("kafka+native://127.0.0.1:9092", "sqlite:///copy.db",
    ...                  topic="orders", job="orders-copy").run()  # doctest: +SKIP

Each source partition is copied by one named producer of the destination (``job/partition``)
with the record's source offset as its sequence, under the ``monotonic`` policy; the
destination's last stored sequence is where a restarted job resumes, and anything resent is
answered DUPLICATE. See docs/mirror.md, :mod:`.engine` (the job and its unit of work,
:func:`copy_partition`), :mod:`.source` (the source contract) and :mod:`.schemes` (which
source module reads which URL).
"""

from .engine import (
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    Mirror,
    MirrorSummary,
    PartitionProgress,
    PartitionSummary,
    PartitionTask,
    copy_partition,
    producer_name,
)
from .schemes import open_source
from .source import PartitionReader, Polled, Source, SourceRecord

__all__ = [
    "SOURCE_OFFSET",
    "SOURCE_PARTITION",
    "SOURCE_TIMESTAMP",
    "SOURCE_TOPIC",
    "Mirror",
    "MirrorSummary",
    "PartitionProgress",
    "PartitionReader",
    "PartitionSummary",
    "PartitionTask",
    "Polled",
    "Source",
    "SourceRecord",
    "copy_partition",
    "open_source",
    "producer_name",
]
