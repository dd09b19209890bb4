"""Progress reporting of long-running commands, shared by every command that needs it.

A command creates one :class:`Progress` (usually with :meth:`Progress.from_args`), calls
:meth:`Progress.update` as work completes (from any thread) and closes it at the end::

    with Progress.from_args(args, "orders", total=count, initial=skipped) as progress:
        for chunk in work:
            ...
            progress.update(len(chunk), detail="lag 0:12 1:3")

On a terminal it draws a tqdm bar. Anywhere else (CI, a pipe, a log file) it prints one
line every ``interval`` seconds (:data:`PROGRESS_INTERVAL` by default), from its own thread,
so the output moves even while the command waits::

    orders: 120000/1000000 records (12.0%), 24013 records/s, 5 s elapsed

``--quiet`` and ``--no-progress`` switch both off. A command that takes
``--progress-interval`` adds it with :func:`add_progress_arguments`, which also adds
``--no-progress``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any

from .common import float_type, isatty

#: Seconds between two progress lines when the output is not a terminal.
PROGRESS_INTERVAL = 5.0


def add_progress_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-progress`` and ``--progress-interval SECONDS`` to a command's parser."""
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    parser.add_argument(
        "--progress-interval",
        metavar="SECONDS",
        type=float_type,
        default=PROGRESS_INTERVAL,
        help=f"seconds between progress lines when stderr is not a terminal (default {PROGRESS_INTERVAL:g})",
    )


class Progress:
    """Counts completed work and shows it: a bar on a terminal, else a line every ``interval``.

    Args:
        label: what is progressing (a topic, a job), the start of every line.
        total: how much work there is in all (including ``initial``), None when unknown.
        initial: work already done before this run (counted in the total, not in the rate).
        interval: seconds between lines when ``stream`` is not a terminal (> 0).
        enabled: False shows nothing (``--quiet``, ``--no-progress``).
        stream: where to write (default: stderr).
        terminal: draw a bar (True) or print lines (False); default: whether ``stream`` is a
            terminal.
        clock: seconds, monotonic; for tests.
        rate_window: None: a line's rate is the average since the start. Else the rate over
            the last ``rate_window`` seconds or a little more (since the last line printed at
            least that long ago; since the start during the first ``rate_window`` seconds),
            with the span it covers (``1200 records/s (last 10 s)``): the current rate of a
            long-running job.

    Thread-safe: :meth:`update` may be called from any thread. In line mode a daemon thread
    prints the lines until :meth:`close`.
    """

    def __init__(
        self,
        label: str,
        *,
        total: int | None = None,
        initial: int = 0,
        interval: float = PROGRESS_INTERVAL,
        enabled: bool = True,
        stream: IO[str] | None = None,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        rate_window: float | None = None,
    ) -> None:
        self.label = label
        self.total = total
        self.initial = initial
        self.done = initial
        self.detail = ""
        self._interval = interval if interval > 0 else PROGRESS_INTERVAL
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._started = clock()
        self._rate_window = rate_window
        #: (time, done) of the lines printed, the oldest at most one before the rate window
        self._samples: deque[tuple[float, int]] = deque([(self._started, initial)])
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bar: Any = None
        self._ticker: threading.Thread | None = None
        self.lines = 0
        if not enabled:
            return
        if isatty(self._stream) if terminal is None else terminal:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="rec",
                unit_scale=True,
                mininterval=0.5,
                file=self._stream,
                desc=label,
            )
        else:
            self._ticker = threading.Thread(target=self._tick, name="idempotent-progress", daemon=True)
            self._ticker.start()

    @classmethod
    def from_args(
        cls,
        args: argparse.Namespace,
        label: str,
        *,
        total: int | None = None,
        initial: int = 0,
        rate_window: float | None = None,
    ) -> Progress:
        """A progress for a command, off with ``--quiet`` or ``--no-progress``, with the
        interval of ``--progress-interval`` when the command has it."""
        enabled = not (getattr(args, "quiet", False) or getattr(args, "no_progress", False))
        interval = getattr(args, "progress_interval", PROGRESS_INTERVAL)
        return cls(label, total=total, initial=initial, interval=interval, enabled=enabled, rate_window=rate_window)

    def update(self, count: int, detail: str | None = None) -> None:
        """``count`` more done; ``detail`` (when given) replaces the text after the counts."""
        with self._lock:
            self.done += count
            if detail is not None:
                self.detail = detail
            if self._bar is not None:
                if detail is not None:
                    self._bar.set_postfix_str(detail, refresh=False)
                self._bar.update(count)

    def line(self) -> str:
        """The progress line as it stands now."""
        with self._lock:
            done, detail = self.done, self.detail
            now = self._clock()
            if self._rate_window is None:
                since, done_then, span = self._started, self.initial, ""
            else:
                samples = self._samples
                samples.append((now, done))
                while len(samples) > 2 and samples[1][0] <= now - self._rate_window:
                    samples.popleft()
                since, done_then = samples[0]
                span = f" (last {now - since:.0f} s)"
        elapsed = max(now - self._started, 1e-9)
        counts = f"{done} records" if self.total is None else f"{done}/{self.total} records"
        if self.total:
            counts += f" ({100.0 * done / self.total:.1f}%)"
        rate = (done - done_then) / max(now - since, 1e-9)
        text = f"{self.label}: {counts}, {rate:.0f} records/s{span}, {elapsed:.0f} s elapsed"
        return f"{text}, {detail}" if detail else text

    def _tick(self) -> None:
        while not self._stop.wait(self._interval):
            self._print(self.line())

    def _print(self, text: str) -> None:
        try:
            print(text, file=self._stream, flush=True)
        except (OSError, ValueError):  # the stream went away (closed pipe): stop reporting
            self._stop.set()
            return
        self.lines += 1

    def close(self) -> None:
        """Stop the lines (or close the bar). Idempotent."""
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
