"""How the CLI prints records, partition stats, tables and timestamps (shared by commands)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from idempotent.core.records import StoredRecord
from idempotent.core.values import PartitionStats

#: Characters of a key or value ``text`` output shows before it truncates with an ellipsis.
TEXT_VALUE_LIMIT = 200


def text_of(data: bytes | None, limit: int | None) -> str | None:
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return text


class PrintedRecord(Protocol):
    """What a printed record shows besides where it is: a :class:`StoredRecord`, or a record
    of ``tail`` (of an idempotent topic or a plain one)."""

    @property
    def offset(self) -> int: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def sequence(self) -> int: ...
    @property
    def timestamp(self) -> float | None: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


def shown_text(data: bytes | None, limit: int = TEXT_VALUE_LIMIT) -> str:
    """A key or value on one line of text output: decoded (bad UTF-8 replaced), truncated at
    ``limit`` characters, backslashes and line breaks escaped; ``null`` for None."""
    text = text_of(data, limit)
    if text is None:
        return "null"
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def record_json(topic: str, partition: int, record: PrintedRecord) -> str:
    """A record as one JSON object (no newline): where it is, its producer identity, its
    time, and its key, value and headers decoded as text in full."""
    return json.dumps(
        {
            "topic": topic,
            "partition": partition,
            "offset": record.offset,
            "producer_id": record.producer_id,
            "producer_epoch": record.producer_epoch,
            "sequence": record.sequence,
            "timestamp": record.timestamp,
            "key": text_of(record.key, None),
            "value": text_of(record.value, None),
            "headers": [[name, text_of(data, None)] for name, data in record.headers],
        },
        ensure_ascii=False,
    )


def format_record(topic: str, partition: int, record: StoredRecord, fmt: str) -> str:
    """One record as a line of ``tail`` output (``text`` or ``json``)."""
    if fmt == "json":
        return record_json(topic, partition, record)
    return (
        f"{topic}[{partition}] offset={record.offset} producer={record.producer_id} "
        f"epoch={record.producer_epoch} seq={record.sequence} "
        f"key={shown_text(record.key)} value={shown_text(record.value)}"
    )


def stats_dict(stats: PartitionStats) -> dict[str, Any]:
    return attrs.asdict(stats)


def format_stats(stats: PartitionStats) -> str:
    """One partition's block of ``stats`` output."""
    if stats.snapshot_position >= 0:
        age = "" if stats.snapshot_age is None else f", {stats.snapshot_age:.1f} s old"
        snapshot = f"snapshot at {stats.snapshot_position}{age}"
    else:
        snapshot = "no snapshot"
    lines = [
        f"{stats.topic}[{stats.partition}]: {stats.status}, "
        f"dedup {'on' if stats.deduplication else 'off'}, policy {stats.policy}",
        f"  position {stats.position} (pending {stats.pending}), {snapshot}, "
        f"{stats.entries_since_snapshot} entries since snapshot",
        f"  recovery {stats.recovery_seconds:.3f} s, {stats.replayed_batches} batches replayed",
    ]
    if not stats.producers:
        lines.append("  producers: none")
        return "\n".join(lines)
    header = ("id", "name", "epoch", "last_seq", "last_offset")
    rows = [header] + [
        (
            str(p.producer_id),
            p.producer_name if p.producer_name is not None else "-",
            str(p.producer_epoch),
            str(p.last_sequence),
            str(p.last_offset),
        )
        for p in stats.producers
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines.append(f"  producers: {len(stats.producers)}")
    for row in rows:
        cells = [
            cell.ljust(w) if i == 1 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("    " + "  ".join(cells).rstrip())
    return "\n".join(lines)


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: frozenset[int] = frozenset()) -> list[str]:
    """Aligned columns: numbers to the right, the columns in ``left`` to the left."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in [header, *rows]
    ]


def iso(timestamp: float) -> str:
    """A record timestamp (seconds since the epoch) as UTC ISO 8601 with milliseconds."""
    return datetime.datetime.fromtimestamp(timestamp, datetime.UTC).isoformat(timespec="milliseconds")
