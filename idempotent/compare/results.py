"""The results file of a comparison, ``runs.jsonl``: what makes a long comparison resumable.

The first line says what every run in the file was made with (workload, records, rate,
value size, capacity records); each further line is one finished run's report entry, appended and
flushed to disk as soon as the run ends. A comparison that is interrupted (Ctrl-C, SIGTERM,
kill -9, a reboot) therefore loses at most the run it was in: run the same command again
and it carries out only the runs the file does not hold. A run that ended with status
``error`` is carried out again; a torn last line (the process died while writing it) is cut
off.
"""

from __future__ import annotations

import fcntl
import json
import os
import pathlib
from typing import Any

from .config import CompareConfig, PlannedRun

FILE_NAME = "runs.jsonl"
#: What a file's runs must have been made with to be continued (CompareConfig fields).
SHAPE = ("workload", "records", "rate", "value_bytes", "capacity_records")
#: What a file written before a field of SHAPE existed was made with.
UNRECORDED = {"workload": "produce"}

Key = tuple[str, str, str, int]


def key_of(entry: dict[str, Any]) -> Key:
    """The (kind, system, fault, seed) of a report entry."""
    return (entry.get("kind", "fault"), entry["system"], entry["fault"], int(entry["seed"]))


def _shape(config: CompareConfig) -> dict[str, Any]:
    return {"results": 1, **{name: getattr(config, name) for name in SHAPE}}


class Results:
    """The runs of ``out/runs.jsonl``, continued (``resume``) or started afresh.

    The file stays locked until :meth:`close`, so two comparisons never write into the same
    ``out`` at once.

    Raises:
        ValueError: another comparison is writing to the file; or ``resume`` and the file
            was made with another workload, records, rate, value size or capacity records (the message
            names them), or is not a results file. The file is left as it was.
        OSError: the file cannot be read or written.
    """

    def __init__(self, out: pathlib.Path, config: CompareConfig, resume: bool) -> None:
        self.path = out / FILE_NAME
        self._entries: dict[Key, dict[str, Any]] = {}
        self._file = self.path.open("a+b")
        try:
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(f"another idempotent compare is writing to {self.path}; wait for it to end") from None
            shape = _shape(config)
            self._file.seek(0)
            data = self._file.read()
            if resume and data:
                self._load(data, shape)
            else:
                self._file.truncate(0)
                self._append(shape)
        except BaseException:
            self._file.close()
            raise

    def _load(self, data: bytes, shape: dict[str, Any]) -> None:
        lines = data[: data.rfind(b"\n") + 1].decode().splitlines()
        try:
            head = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            head = None
        if not isinstance(head, dict) or head.get("results") != 1:
            raise ValueError(f"{self.path} is not a results file of idempotent compare; use another --out")
        made_with = {name: head.get(name, UNRECORDED.get(name)) for name in SHAPE}
        differs = [name for name in SHAPE if made_with[name] != shape[name]]
        if differs:
            made = " ".join(f"--{n.replace('_', '-')} {made_with[n]}" for n in differs)
            asked = " ".join(f"--{n.replace('_', '-')} {shape[n]}" for n in differs)
            raise ValueError(
                f"{self.path} holds runs made with {made}, not {asked}: "
                "run with the same values to continue it, or choose another --out"
            )
        for line in lines[1:]:
            entry = json.loads(line)
            self._entries[key_of(entry)] = entry
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a torn last line: the process died while writing it
            self._file.truncate(end)

    def _append(self, value: dict[str, Any]) -> None:
        self._file.write(json.dumps(value, separators=(",", ":")).encode() + b"\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def done(self, run: PlannedRun) -> dict[str, Any] | None:
        """The entry of ``run`` when the file holds it finished (not with status error)."""
        entry = self._entries.get(run.key)
        if entry is None or entry.get("status") == "error":
            return None
        return entry

    def add(self, entry: dict[str, Any]) -> None:
        """Append one finished run and flush it to disk."""
        self._entries[key_of(entry)] = entry
        self._append(entry)

    def entries(self, plan: list[PlannedRun]) -> list[dict[str, Any]]:
        """The entries of ``plan``'s runs that the file holds, in plan order."""
        found = (self._entries.get(run.key) for run in plan)
        return [entry for entry in found if entry is not None]

    def close(self) -> None:
        """Release the file (and its lock)."""
        self._file.close()


__all__ = ["FILE_NAME", "Results", "key_of"]
