"""Files as a mirror source: ``file:///path`` is one record per line.

A directory is read as its regular files in name order (names starting with ``.`` are
skipped), as if they were concatenated. A record's offset is the byte position where its line
starts in that concatenation, so offsets are sparse and pass ``2**31`` after 2 GiB. The value
is the line without its ``\\n``; there is no key, header or timestamp. Everything goes to
partition 0.

Stable offsets need an append-only source: only the last file (in name order) may grow, and
new files must sort after the existing ones. A last line without ``\\n`` is copied when the job
is not following (it is where the file ended); while following, it waits for its ``\\n``.
"""

from __future__ import annotations

import os
import time
from typing import IO
from urllib.parse import unquote, urlsplit

from ..errors import BackendUnavailableError, ConfigError, InvalidTopicError
from .source import Polled, SourceRecord


def file_path(url: str) -> str:
    """The local path of a ``file:///path`` URL.

    Raises:
        ConfigError: not a ``file://`` URL of a local absolute path.
    """
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise ConfigError(f"expected file:///absolute/path, got {url!r}")
    return unquote(parts.path)


class FileSource:
    """A file, or a directory of files, as one partition; see the module docstring.

    Raises:
        ConfigError: bad URL.
        InvalidTopicError: the path does not exist.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self.path = file_path(url)
        if not os.path.exists(self.path):
            raise InvalidTopicError(f"no file or directory {self.path!r} (from {url})")

    @property
    def url(self) -> str:
        return self._url

    def files(self) -> list[str]:
        """The files read, in order (the path itself, or a directory's files by name)."""
        try:
            if not os.path.isdir(self.path):
                return [self.path]
            names = sorted(n for n in os.listdir(self.path) if not n.startswith("."))
            return [p for p in (os.path.join(self.path, n) for n in names) if os.path.isfile(p)]
        except OSError as exc:
            raise BackendUnavailableError(f"cannot list {self.path!r}: {exc}") from exc

    def topics(self) -> list[str]:
        raise ConfigError(f"a file source has no topics ({self._url}): leave out --topics")

    def partitions(self, topic: str) -> int:
        return 1

    def end(self, topic: str, partition: int) -> int:
        try:
            return sum(os.path.getsize(p) for p in self.files())
        except OSError as exc:
            raise BackendUnavailableError(f"cannot read the size of {self.path!r}: {exc}") from exc

    def open_partition(self, topic: str, partition: int, after: int, end: int | None = None) -> FileReader:
        if partition != 0:
            raise InvalidTopicError(f"a file source has only partition 0, not {partition}")
        return FileReader(self, after, end)

    def lag(self, topic: str, partition: int, after: int, end: int) -> int | None:
        """The bytes after the line that starts at ``after``."""
        if after < 0:
            return end
        try:
            reader = FileReader(self, after, end)
        except BackendUnavailableError:
            return None
        try:
            return max(0, end - reader.position)
        finally:
            reader.close()

    def source_topic(self, topic: str, partition: int) -> str:
        return self.path

    def close(self) -> None:
        """Nothing to release."""


class FileReader:
    """Reads lines forward from a byte position of a :class:`FileSource`."""

    def __init__(self, source: FileSource, after: int, end: int | None) -> None:
        self._source = source
        self._end = end
        self._files = source.files()
        self._index = 0
        self._handle: IO[bytes] | None = None
        self._position = 0  # offset of the next line
        try:
            self._seek(after)
        except OSError as exc:
            self.close()
            raise BackendUnavailableError(f"cannot read {source.path!r}: {exc}") from exc

    def _open(self, index: int) -> IO[bytes] | None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self._index = index
        if index < len(self._files):
            self._handle = open(self._files[index], "rb")  # noqa: SIM115 - kept open across polls
        return self._handle

    def _seek(self, after: int) -> None:
        """Position at the line after the one starting at ``after`` (-1: the first line)."""
        if after < 0:
            self._open(0)
            return
        base = 0
        for index, path in enumerate(self._files):
            size = os.path.getsize(path)
            if after < base + size or index == len(self._files) - 1:
                handle = self._open(index)
                assert handle is not None
                handle.seek(after - base)
                skipped = handle.readline()  # the rest of the line already copied
                self._position = after + len(skipped)
                return
            base += size
        self._open(0)  # no files yet

    @property
    def position(self) -> int:
        """The offset of the next line."""
        return self._position

    def poll(self, max_records: int, timeout: float) -> Polled:
        try:
            return self._poll(max_records, timeout)
        except OSError as exc:
            raise BackendUnavailableError(f"cannot read {self._source.path!r}: {exc}") from exc

    def _poll(self, max_records: int, timeout: float) -> Polled:
        records: list[SourceRecord] = []
        caught_up = False
        while len(records) < max_records:
            handle = self._handle
            if handle is None:
                # past the last file known: look for new ones (they sort after the old ones)
                files = self._source.files()
                if len(files) <= len(self._files):
                    caught_up = True
                    break
                self._files = files
                self._open(self._index)
                continue
            line = handle.readline()
            if line.endswith(b"\n"):
                records.append(SourceRecord(self._position, None, line[:-1]))
                self._position += len(line)
                continue
            last = self._index == len(self._files) - 1
            if line and (not last or self._end is not None):
                records.append(SourceRecord(self._position, None, line))  # a file's end ends its line
                self._position += len(line)
                continue
            if line:  # an unfinished last line while following: wait for its end
                handle.seek(-len(line), os.SEEK_CUR)
            if last:
                files = self._source.files()
                if len(files) <= len(self._files):
                    caught_up = True
                    break
                self._files = files  # the line, if any, ended with its file: read it again
                continue
            self._open(self._index + 1)
        if not records and timeout > 0:
            time.sleep(min(timeout, 0.05))
        return Polled(records, caught_up)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


__all__ = ["FileReader", "FileSource", "file_path"]
