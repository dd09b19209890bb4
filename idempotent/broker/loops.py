"""A broker's background threads: the maintenance sweep and the lease heartbeat.

Each loop runs one step every interval until the broker stops. An error of the tree (the
backend failed) is logged as a warning and the step runs again next interval. Anything else is
a bug: it is logged with its traceback and kept as the broker's :attr:`BackgroundLoops.failure`,
a FATAL :class:`~idempotent.errors.InternalError` that every later request of the broker
raises, and the loop stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from idempotent.errors import InternalError, ProducerError, internal_error

_LOG = logging.getLogger("idempotent.broker")


class BackgroundLoops:
    """The background loops of one broker (see the module docstring).

    Args:
        stop: set when the broker stops: every loop ends at its next wait.
    """

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop
        #: a bug a loop hit: every later request of the broker raises it
        self.failure: InternalError | None = None

    def start(self, name: str, interval: float, what: str, step: Callable[[], None]) -> threading.Thread:
        """Start a daemon thread ``name`` that calls ``step`` (``what`` it does, for the log)
        every ``interval`` seconds, the first time one interval from now."""
        thread = threading.Thread(target=self._loop, args=(interval, what, step), name=name, daemon=True)
        thread.start()
        return thread

    def _loop(self, interval: float, what: str, step: Callable[[], None]) -> None:
        while not self._stop.wait(interval):
            if not self.run(what, step):
                return

    def run(self, what: str, step: Callable[[], None]) -> bool:
        """One step of a loop (see the module docstring). Returns whether the loop goes on."""
        try:
            step()
        except ProducerError as exc:
            _LOG.warning("%s failed, retried next interval: %s", what, exc)
        except Exception as exc:
            self.failure = internal_error(what, exc, _LOG)
            return False
        return True
