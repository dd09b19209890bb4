"""What a Spark user reads when the data source fails: the reason first, not a traceback.

PySpark's Python workers report a failure to the JVM as the formatted exception, and Spark
puts that text after its own prefix (``[PYTHON_DATA_SOURCE_ERROR] Failed to initialize
Python data source writer:`` on the driver, ``An exception was thrown from the Python
worker:`` from a task). By default the text is a whole traceback, so the user first reads
``Traceback (most recent call last):`` and finds the reason (``the DataFrame has columns the
sink does not write: ...``) pages below. The worker formats only the exception line when
``SPARK_HIDE_TRACEBACK`` is set at the moment it reports, and every PySpark worker that runs
this data source's code (planning, tasks, commits, the streaming source) exits right after
reporting a failure. So :func:`reported` sets it when one of this project's errors that is
not a bug (everything but :class:`~idempotent.errors.InternalError`) leaves an entry point:
the reason becomes the first line after Spark's prefix. Any other exception (a bug, or the
user's own code in the same worker) keeps its traceback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from ..errors import InternalError, ProducerError

P = ParamSpec("P")
T = TypeVar("T")

#: PySpark's switch (``pyspark.util.handle_worker_exception``)
HIDE_TRACEBACK = "SPARK_HIDE_TRACEBACK"


def _explained(exc: BaseException) -> None:
    if isinstance(exc, ProducerError) and not isinstance(exc, InternalError):
        os.environ[HIDE_TRACEBACK] = "1"


def reported(function: Callable[P, T]) -> Callable[P, T]:
    """Decorate an entry point that Spark's worker calls: an error of this project that is
    not a bug is reported as its message alone. The exception itself passes unchanged."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return function(*args, **kwargs)
        except BaseException as exc:
            _explained(exc)
            raise

    return call


def reported_rows(rows: Iterator[T]) -> Iterator[T]:
    """:func:`reported` for a generator that Spark's worker consumes (a reader's rows)."""
    try:
        yield from rows
    except BaseException as exc:
        _explained(exc)
        raise
