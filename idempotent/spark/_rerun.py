"""Reruns of a Spark batch job: what earlier runs stored, and what a new run may write (pure).

A batch job writes under a name (option ``job``); running it again must store nothing twice,
however Spark splits the input this time. Every run leaves records in the job's **ledger**
(a topic beside the output topic, :mod:`idempotent.spark._sink`), and this module turns them,
with the last stored sequences of the earlier runs' producers, into decisions:

* **identity modes** (:class:`Mode`), chosen from what the rows carry:

  - ``position``: each row has a source position that does not depend on Spark's splits
    (``_metadata.row_index`` of a Parquet read, or the ``positionColumns`` option): a *unit*
    (a file, a source partition) and an *ordinal* that increases within the unit;
  - ``split``: each row has the file split it was read from (``_metadata`` of a CSV, JSON,
    text or ORC read): the unit is the split (file, start, length), the ordinal the row's
    index within it;
  - ``partition``: nothing; the unit is the Spark partition, the ordinal the row's index in it.

* **segments**: a task writes each unit's rows as one segment ``k`` of its producer, its rows
  bound for topic partition ``p`` numbered ``(k << 40) + 0, 1, 2, ...`` in ordinal order. Its
  ledger record (unit, first ordinal; the previous segment's last ordinal) is stored before
  any of its rows, so the ledger names every segment that may have stored something.

* **what a segment stored**: on topic partition ``p`` the first ``c`` of its rows, ``c``
  following from the producer's last stored sequence (:func:`stored_counts`); all of them
  once its task finished (a ``done`` record) or the job committed.

:func:`plan_run` (driver) decides whether a run is fresh, finished (it stores nothing), a
resumption, or refused; :class:`SegmentCheck` (task) says which rows of one segment are
stored already, or refuses the segment before any of its rows is sent.
"""

from __future__ import annotations

import enum
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ..errors import ConfigError

#: a segment's rows on a topic partition are numbered from ``index << SEGMENT_BITS``
SEGMENT_BITS = 40
#: segments per producer (sequences stay below 2**63)
MAX_SEGMENTS = 1 << (63 - SEGMENT_BITS)
#: a stored count meaning "every row of the segment on this partition"
COMPLETE = 1 << 62

DOCS = "docs/spark.md, section 'Running a job again'"


class Mode(enum.Enum):
    """How the rows of a batch job are identified across runs (module docstring)."""

    POSITION = "position"
    SPLIT = "split"
    PARTITION = "partition"


@attrs.frozen
class FileSplit:
    """The file range a row was read from, and the file's size and modification time
    (microseconds), as Spark's ``_metadata`` column gives them."""

    path: str
    start: int
    length: int
    size: int
    modified: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def key(self) -> str:
        """The unit key of the split (``split`` mode)."""
        return f"{self.path}@{self.start}+{self.length}"

    def overlaps(self, other: FileSplit) -> bool:
        return self.path == other.path and self.start < other.end and other.start < self.end

    def same_file(self, other: FileSplit) -> bool:
        return (self.size, self.modified) == (other.size, other.modified)

    def fits(self, split_size: int) -> bool:
        """Whether Spark cuts this split when it splits files into ``split_size`` bytes
        (a whole file is made by every split size)."""
        if self.start == 0 and self.length == self.size:
            return True
        return self.start % split_size == 0 and self.length == min(split_size, self.size - self.start)


@attrs.frozen
class Segment:
    """One segment as its ledger record describes it."""

    run: str
    producer: str
    index: int
    unit: str
    first: int
    #: the last ordinal, once the producer started another segment or finished
    end: int | None = None
    #: ``partition`` mode: CRC-32 of the first row (value and key), to notice another split
    digest: int | None = None
    #: ``split`` mode, and ``position`` mode over files: where the rows came from
    split: FileSplit | None = None
    #: ``position`` mode: the last ordinal whose row may have been sent (a ``progress``
    #: record is stored before rows beyond the previous one are sent)
    reached: int | None = None

    @property
    def bound(self) -> int | None:
        """The last ordinal this segment may have stored: its end, else how far it reached."""
        return self.end if self.end is not None else self.reached


def unit_hash(unit: str) -> int:
    """The offset of a unit's round robin: row ``o`` of a unit without key or ``partition``
    column goes to topic partition ``(unit_hash(unit) + o) % partitions``."""
    return zlib.crc32(unit.encode("utf-8", "surrogatepass"))


def row_digest(value: bytes | None, key: bytes | None) -> int:
    """CRC-32 of a row's value and key (``partition`` mode's first-row check)."""
    return zlib.crc32(key or b"", zlib.crc32(value or b"") ^ (0 if key is None else 1))


# -- ledger records ------------------------------------------------------------------------


def encode(record: Mapping[str, Any]) -> bytes:
    """A ledger record as stored (compact JSON)."""
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


def decode(value: bytes | None) -> dict[str, Any] | None:
    """A stored ledger record, or None for bytes that are not one (never raises)."""
    try:
        record = json.loads(value or b"")
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("kind"), str) else None


def job_record(job: str, mode: Mode, ledger_start: int) -> dict[str, Any]:
    """The job's anchor: its identity mode, and where its records start in the ledger."""
    return {"kind": "job", "job": job, "mode": mode.value, "ledger_start": ledger_start}


def run_record(job: str, run: str) -> dict[str, Any]:
    """A run started (stored before the run reads the ledger)."""
    return {"kind": "run", "job": job, "run": run}


def segment_record(job: str, segment: Segment, previous_end: int | None) -> dict[str, Any]:
    """A segment starts; ``previous_end`` is the last ordinal of the producer's segment before."""
    record: dict[str, Any] = {
        "kind": "segment",
        "job": job,
        "run": segment.run,
        "producer": segment.producer,
        "index": segment.index,
        "unit": segment.unit,
        "first": segment.first,
        "previous_end": previous_end,
    }
    if segment.digest is not None:
        record["digest"] = segment.digest
    if segment.split is not None:
        record["split"] = attrs.astuple(segment.split)
    return record


def progress_record(job: str, run: str, producer: str, index: int, reached: int) -> dict[str, Any]:
    """Segment ``index`` of ``producer`` may send rows up to ordinal ``reached`` (stored
    before they are sent: a rerun knows where the stored rows of a cut-off segment end)."""
    return {"kind": "progress", "job": job, "run": run, "producer": producer, "index": index, "reached": reached}


def done_record(job: str, run: str, producer: str, segments: int, end: int | None) -> dict[str, Any]:
    """A task stored every row it had (after its last acknowledgement)."""
    return {"kind": "done", "job": job, "run": run, "producer": producer, "segments": segments, "end": end}


def commit_record(job: str, run: str, tasks: int) -> dict[str, Any]:
    """Every task of a run succeeded and Spark committed the write."""
    return {"kind": "commit", "job": job, "run": run, "tasks": tasks}


@attrs.define
class JobHistory:
    """What the ledger says about one job, from its records in log order."""

    job: str
    #: mode of the run that first wrote a segment, None before that
    mode: Mode | None = None
    runs: list[str] = attrs.Factory(list)
    segments: list[Segment] = attrs.Factory(list)
    #: producers whose task stored every row (``done``)
    finished: set[str] = attrs.Factory(set)
    committed: bool = False

    @classmethod
    def from_records(cls, job: str, records: Iterable[Mapping[str, Any]]) -> JobHistory:
        """Fold the job's records (others are skipped). Malformed records of the job raise.

        Raises:
            ConfigError: a record of the job lacks a field: the ledger was written by
                something else; nothing can be decided.
        """
        history = cls(job)
        by_key: dict[tuple[str, int], Segment] = {}
        try:
            for record in records:
                if record.get("job") != job:
                    continue
                kind = record["kind"]
                if kind == "run":
                    history.runs.append(str(record["run"]))
                elif kind == "job" and history.mode is None:
                    history.mode = Mode(record["mode"])
                elif kind == "segment":
                    split = record.get("split")
                    segment = Segment(
                        str(record["run"]),
                        str(record["producer"]),
                        int(record["index"]),
                        str(record["unit"]),
                        int(record["first"]),
                        digest=record.get("digest"),
                        split=FileSplit(*split) if split is not None else None,
                    )
                    by_key.setdefault((segment.producer, segment.index), segment)
                    _end(by_key, segment.producer, segment.index - 1, record.get("previous_end"))
                elif kind == "progress":
                    key = (str(record["producer"]), int(record["index"]))
                    known = by_key.get(key)
                    reached = int(record["reached"])
                    if known is not None and (known.reached is None or reached > known.reached):
                        by_key[key] = attrs.evolve(known, reached=reached)
                elif kind == "done":
                    history.finished.add(str(record["producer"]))
                    _end(by_key, str(record["producer"]), int(record["segments"]) - 1, record.get("end"))
                elif kind == "commit":
                    history.committed = True
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"the Spark ledger of job {job!r} holds a record this version cannot read ({exc!r}); "
                "write under a new job name"
            ) from None
        history.segments = list(by_key.values())
        return history


def _end(by_key: dict[tuple[str, int], Segment], producer: str, index: int, end: object) -> None:
    segment = by_key.get((producer, index))
    if segment is not None and segment.end is None and isinstance(end, int):
        by_key[producer, index] = attrs.evolve(segment, end=end)


# -- what earlier runs stored --------------------------------------------------------------


@attrs.frozen
class Stored:
    """An earlier segment and how many of its rows each topic partition stored
    (:data:`COMPLETE`: all of them)."""

    segment: Segment
    counts: tuple[int, ...]

    @property
    def complete(self) -> bool:
        return all(count == COMPLETE for count in self.counts)

    @property
    def anything(self) -> bool:
        return any(self.counts)


def stored_counts(
    segment: Segment, last_sequences: Mapping[int, int], partitions: int, finished: bool
) -> tuple[int, ...]:
    """Per topic partition, how many of ``segment``'s rows its producer stored there, from
    the producer's last stored sequence per partition (-1 or absent: none)."""
    if finished:
        return (COMPLETE,) * partitions
    base = segment.index << SEGMENT_BITS
    counts = []
    for partition in range(partitions):
        last = last_sequences.get(partition, -1)
        if last >= (segment.index + 1) << SEGMENT_BITS:
            counts.append(COMPLETE)  # the producer went on to later segments there
        elif last < base:
            counts.append(0)
        else:
            counts.append(last - base + 1)
    return tuple(counts)


@attrs.frozen
class RunPlan:
    """What a run of a batch job does, decided on the driver before any task starts."""

    job: str
    run: str
    mode: Mode
    #: the job committed before: this run stores nothing
    finished: bool = False
    #: earlier runs stored rows and the job did not commit
    resuming: bool = False
    #: earlier segments with stored rows, by unit (``position`` and ``split`` modes)
    earlier: Mapping[str, tuple[Stored, ...]] = attrs.Factory(dict)
    #: earlier segments over files, by file path (``split`` mode; ``position`` over files)
    files: Mapping[str, tuple[Stored, ...]] = attrs.Factory(dict)
    #: ``partition`` mode: the first-row digest each Spark partition had
    digests: Mapping[str, int] = attrs.Factory(dict)
    #: ``split`` mode: the split size of the earlier runs (from a split that is not a file's last)
    split_size: int | None = None


def plan_run(
    job: str,
    run: str,
    mode: Mode,
    history: JobHistory,
    last_sequences: Mapping[str, Mapping[int, int]],
    partitions: int,
    *,
    same_partitioning: bool = False,
) -> RunPlan:
    """Decide what run ``run`` of ``job`` does.

    Args:
        history: the job's ledger.
        last_sequences: per producer of an earlier run (fenced before), its last stored
            sequence per topic partition of the output topic.
        partitions: the output topic's partition count.
        same_partitioning: ``partition`` mode: the user states that Spark splits the input
            exactly as in the earlier runs.

    Raises:
        ConfigError: the run must not write: the earlier runs used another identity mode, or
            (``partition`` mode) they stored part of the job and ``same_partitioning`` is not
            given. Nothing was written.
    """
    if history.committed:
        return RunPlan(job, run, mode, finished=True)
    earlier_runs = set(history.runs) - {run}
    stored = [
        Stored(s, stored_counts(s, last_sequences.get(s.producer, {}), partitions, s.producer in history.finished))
        for s in history.segments
        if s.run in earlier_runs
    ]
    stored = [s for s in stored if s.anything]
    if not stored:
        return RunPlan(job, run, mode)
    stored = _bounded(stored, history.segments)
    first_mode = history.mode or mode
    if first_mode is not mode:
        raise ConfigError(
            f"job {job!r} stopped part way in an earlier run whose rows were identified by their "
            f"{_describe(first_mode)}, and this run's rows by their {_describe(mode)}: rerun it with the "
            f"earlier run's columns and options, or write under a new job name ({DOCS})"
        )
    if mode is Mode.PARTITION:
        if not same_partitioning:
            raise ConfigError(
                f"job {job!r} stopped part way in an earlier run, and its rows carry no source position, so "
                "this run cannot tell which rows are stored if Spark splits the input differently: rerun it "
                "with exactly the earlier run's input, settings and cluster size and "
                "option('samePartitioning', 'true'), or give rows their position (select the '_metadata' "
                f"column of a file read, or option('positionColumns', ...)) in a new job ({DOCS})"
            )
        digests = {s.segment.unit: s.segment.digest for s in stored if s.segment.digest is not None}
        return RunPlan(job, run, mode, resuming=True, digests=digests)
    earlier: dict[str, list[Stored]] = {}
    files: dict[str, list[Stored]] = {}
    split_size = None
    order = {name: number for number, name in enumerate(history.runs)}
    for entry in sorted(stored, key=lambda s: (order.get(s.segment.run, len(order)), s.segment.producer)):
        earlier.setdefault(entry.segment.unit, []).append(entry)
        split = entry.segment.split
        if split is not None:
            files.setdefault(split.path, []).append(entry)
            if split_size is None and mode is Mode.SPLIT and split.end < split.size:
                split_size = split.length
    return RunPlan(
        job,
        run,
        mode,
        resuming=True,
        earlier={k: tuple(v) for k, v in earlier.items()},
        files={k: tuple(v) for k, v in files.items()},
        split_size=split_size,
    )


def _bounded(entries: list[Stored], segments: Iterable[Segment]) -> list[Stored]:
    """Entries with the ends their records leave open bounded by the next segment of the
    same unit in the same run: one run's tasks read disjoint ranges of a unit."""
    starts: dict[tuple[str, str], list[int]] = {}
    for segment in segments:
        starts.setdefault((segment.run, segment.unit), []).append(segment.first)
    out = []
    for entry in entries:
        segment = entry.segment
        later = [first for first in starts[segment.run, segment.unit] if first > segment.first]
        if later and (segment.end is None or segment.end >= min(later)):
            entry = attrs.evolve(entry, segment=attrs.evolve(segment, end=min(later) - 1))
        out.append(entry)
    return out


def _describe(mode: Mode) -> str:
    return {
        Mode.POSITION: "source positions ('_metadata.row_index' or 'positionColumns')",
        Mode.SPLIT: "file splits (the '_metadata' column)",
        Mode.PARTITION: "Spark partition and position in it (no '_metadata' or 'positionColumns')",
    }[mode]


# -- the rows of one segment ---------------------------------------------------------------


class SegmentCheck:
    """Which rows of one segment of a task the earlier runs stored.

    Built when the task starts writing a unit. Then either :attr:`skip_all` (every row is
    stored), or :attr:`prefix` (per topic partition, how many of the segment's first rows
    bound there are stored), or :meth:`stored` row by row (earlier segments that start
    inside this one: another split of the same unit).

    Args:
        plan: the run's plan.
        unit: the segment's unit key.
        first: the segment's first ordinal.
        split: the file split the rows came from (``split`` mode; ``position`` over files).
        digest: ``partition`` mode: the digest of the segment's first row.
        partitions: the output topic's partition count.

    Raises:
        ConfigError: the segment must not be written (nothing of it was sent): Spark split
            the input differently than an earlier run that stored part of it, a file changed
            since the earlier run, or the first row is not the one the earlier run had.
    """

    def __init__(
        self,
        plan: RunPlan,
        unit: str,
        first: int,
        *,
        split: FileSplit | None = None,
        digest: int | None = None,
        partitions: int,
    ) -> None:
        self.skip_all = False
        self.prefix: list[int] | None = None
        self._ranges: list[tuple[Stored, int, int]] = []  # (stored, first, end)
        self._ranks: list[list[int]] = []
        if not plan.resuming:
            return
        if plan.mode is Mode.PARTITION:
            expected = plan.digests.get(unit)
            if expected is not None and digest is not None and expected != digest:
                raise ConfigError(
                    f"job {plan.job!r}: Spark partition {unit.removeprefix('partition:')} starts with another row than "
                    "in the earlier run, so Spark split the input differently and this run would store rows twice: "
                    "rerun with exactly the earlier run's input and settings, or write under a new job name "
                    f"({DOCS})"
                )
            return
        if split is not None:
            for entry in plan.files.get(split.path, ()):
                earlier_split = entry.segment.split
                if earlier_split is not None and not earlier_split.same_file(split):
                    raise ConfigError(
                        f"job {plan.job!r}: file {split.path} changed since an earlier run stored part of it "
                        f"(size {earlier_split.size} then, {split.size} now): a rerun must read the same input; "
                        f"write the new content under a new job name ({DOCS})"
                    )
        if plan.mode is Mode.SPLIT:
            assert split is not None  # the sink passes the split in this mode
            self._check_split(plan, split, partitions)
        else:
            self._check_position(plan, unit, first, partitions)

    def _check_split(self, plan: RunPlan, split: FileSplit, partitions: int) -> None:
        same: list[Stored] = []
        others: list[Stored] = []
        for entry in plan.files.get(split.path, ()):
            earlier = entry.segment.split
            if earlier is None or not earlier.overlaps(split):
                continue
            (same if (earlier.start, earlier.length) == (split.start, split.length) else others).append(entry)
        if others:
            if all(e.complete for e in others) and _covers([e.segment.split for e in others], split):
                self.skip_all = True
                return
            earlier_split = others[0].segment.split
            assert earlier_split is not None
            raise ConfigError(
                f"job {plan.job!r}: the partitioning changed since an earlier run that stored part of it: that run "
                f"read {split.path} in splits like bytes {earlier_split.start}-{earlier_split.end}, this one reads "
                f"bytes {split.start}-{split.end}, and rows cannot be matched across splits. Rerun with the earlier "
                f"split size (spark.sql.files.maxPartitionBytes and spark.sql.files.openCostInBytes = "
                f"{plan.split_size or earlier_split.length}) to complete it, or write under a new job name ({DOCS})"
            )
        if same:
            self.prefix = [max(e.counts[p] for e in same) for p in range(partitions)]
            self.skip_all = all(count == COMPLETE for count in self.prefix)
            return
        if plan.split_size is not None and not split.fits(plan.split_size):
            raise ConfigError(
                f"job {plan.job!r}: the partitioning changed since an earlier run that stored part of it: that run "
                f"split files into {plan.split_size} bytes, this one reads {split.path} bytes "
                f"{split.start}-{split.end}. Rerun with spark.sql.files.maxPartitionBytes and "
                f"spark.sql.files.openCostInBytes = {plan.split_size} to complete it, or write under a new job name "
                f"({DOCS})"
            )

    def _check_position(self, plan: RunPlan, unit: str, first: int, partitions: int) -> None:
        entries = plan.earlier.get(unit, ())
        for entry in entries:
            segment = entry.segment
            if segment.first < first and (segment.bound is None or segment.bound >= first) and not entry.complete:
                raise ConfigError(
                    f"job {plan.job!r}: an earlier run stored part of {unit} from position {segment.first} on, and "
                    f"this run starts reading it at position {first}, inside that part, so it cannot tell which "
                    "rows are stored: rerun with the earlier run's splits, or fewer and larger ones (a larger "
                    f"spark.sql.files.maxPartitionBytes), to complete it ({DOCS})"
                )
        if entries and all(e.segment.first == first and not e.complete for e in entries):
            self.prefix = [max(e.counts[p] for e in entries) for p in range(partitions)]
            return
        for entry in entries:
            if entry.segment.end is None and any(count == COMPLETE for count in entry.counts):
                raise ConfigError(
                    f"job {plan.job!r}: the ledger says an earlier segment of {unit} is stored but not where it "
                    f"ends (a record is missing), so this run cannot tell which rows are stored: write under a new "
                    f"job name ({DOCS})"
                )
            end = entry.segment.bound if entry.segment.bound is not None else COMPLETE
            if end >= first:  # segments that end before this one starts say nothing about it
                self._ranges.append((entry, entry.segment.first, end))
                self._ranks.append([0] * partitions)

    @property
    def row_by_row(self) -> bool:
        """Whether :meth:`stored` must be asked for each row."""
        return bool(self._ranges)

    def stored(self, ordinal: int, partition: int) -> bool:
        """Whether the row at ``ordinal`` bound for ``partition`` is stored; rows must be
        asked about in ordinal order, each once."""
        found = False
        for (entry, first, end), ranks in zip(self._ranges, self._ranks, strict=True):
            if first <= ordinal <= end:
                count = entry.counts[partition]
                if count == COMPLETE or ranks[partition] < count:
                    found = True
                ranks[partition] += 1
        return found


def _covers(splits: Sequence[FileSplit | None], split: FileSplit) -> bool:
    """Whether the byte ranges of ``splits`` together cover ``split``'s."""
    reached = split.start
    for other in sorted((s for s in splits if s is not None), key=lambda s: s.start):
        if other.start > reached:
            break
        reached = max(reached, other.end)
    return reached >= split.end
