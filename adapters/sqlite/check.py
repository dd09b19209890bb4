"""A SQLite file's health: which errors mean the file is damaged, the FATAL error that says
so, and SQLite's own checks of a whole file (``check=`` of :mod:`idempotent.adapters.sqlite.backend`, and
``idempotent check``).
"""

from __future__ import annotations

import os
import sqlite3

from idempotent.errors import BackendUnavailableError, ConfigError, CorruptDataError

#: ``check`` modes: none, ``PRAGMA quick_check`` (every page and row, not whether each index
#: matches its table) or ``PRAGMA integrity_check`` (everything)
CHECKS = ("off", "quick", "full")
#: SQLite's primary result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB
_CORRUPT_CODES = frozenset({11, 26})
#: how many of the problems a check found an error quotes
PROBLEMS_QUOTED = 5


def is_corruption(exc: BaseException) -> bool:
    """Whether a sqlite3 error says the file is damaged or not a database at all (its
    primary result code, the low byte of ``sqlite_errorcode``, is SQLITE_CORRUPT or
    SQLITE_NOTADB; extended codes such as SQLITE_CORRUPT_INDEX share it)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF in _CORRUPT_CODES


def corrupt_file(path: str, detail: str) -> CorruptDataError:
    """The FATAL error for a damaged database file: names it and says how to check it."""
    return CorruptDataError(
        f"SQLite database {path!r} is damaged ({detail}). Retrying cannot repair it: stop the "
        f"processes using it, check it with `idempotent check sqlite:///{os.path.abspath(path)}`, then "
        "restore it from a backup (or salvage what is readable with the sqlite3 shell's .recover)"
    )


def check_database(db: sqlite3.Connection, mode: str = "full") -> list[str]:
    """Run SQLite's ``quick_check`` (``mode="quick"``) or ``integrity_check`` (``"full"``)
    on an open connection; the problems it reports, [] for a sound file. Reads every page
    (see ``docs/backends.md`` for what it costs).

    Raises:
        sqlite3.Error: the check could not run (a file that is not a database at all raises
            SQLITE_NOTADB here).
    """
    pragma = "quick_check" if mode == "quick" else "integrity_check"
    rows = [str(row[0]) for row in db.execute(f"PRAGMA {pragma}").fetchall()]
    return [] if rows == ["ok"] else rows


def check_file(path: str, mode: str = "full") -> list[str]:
    """:func:`check_database` on the file at ``path``, opened read-only (no lock file, safe
    next to a running writer: it checks the last committed state, WAL included).

    Damage the check cannot walk past (SQLite stops it with SQLITE_CORRUPT, or the file is
    not a database at all: SQLITE_NOTADB) is reported as the one problem.

    Raises:
        ConfigError: there is no such file.
        BackendUnavailableError: the file could not be read (locked too long, I/O error).
    """
    if not os.path.isfile(path):
        raise ConfigError(f"no SQLite database at {path!r}")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        raise BackendUnavailableError(f"cannot open {path!r}: {exc}") from exc
    try:
        return check_database(db, mode)
    except sqlite3.Error as exc:
        if is_corruption(exc):
            return [str(exc)]
        raise BackendUnavailableError(f"cannot check {path!r}: {exc}") from exc
    finally:
        db.close()


__all__ = ["CHECKS", "PROBLEMS_QUOTED", "check_database", "check_file", "corrupt_file", "is_corruption"]
