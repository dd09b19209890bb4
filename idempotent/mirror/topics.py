"""Which source topics a job copies: ``--topics``, a list of names and regular expressions.

As MirrorMaker 2's ``topics`` setting: a comma-separated list (or a sequence) of entries; a
topic is copied when one entry matches its whole name. An entry made only of characters a
topic name holds (letters, digits, ``.``, ``_``, ``-``, ``/``, ``:``) is a **name**: it
matches that topic only (``orders.v1`` does not match ``ordersXv1``), and the topic must
exist. Any other entry is a **regular expression** (Python's ``re``) that must match the
whole name: ``orders-.*``, ``(eu|us)\\.payments``. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..errors import ConfigError

_NAME = re.compile(r"[A-Za-z0-9._\-/:]+")


class TopicPattern:
    """The topics a job selects; see the module docstring.

    Args:
        spec: ``"a,b,orders-.*"``, or the entries as a sequence.

    Raises:
        ConfigError: no entry, or an entry that is not a valid regular expression.
    """

    def __init__(self, spec: str | Sequence[str]) -> None:
        entries = spec.split(",") if isinstance(spec, str) else list(spec)
        entries = [e.strip() for e in entries if isinstance(e, str) and e.strip()]
        if not entries:
            raise ConfigError(
                f"--topics names no topic in {spec!r}: give names or regular expressions, comma-separated"
            )
        self.spec = ",".join(entries)
        self.names: tuple[str, ...] = tuple(dict.fromkeys(e for e in entries if _NAME.fullmatch(e)))
        patterns = [e for e in entries if not _NAME.fullmatch(e)]
        self.expressions: tuple[re.Pattern[str], ...] = tuple(_compile(e) for e in patterns)

    @property
    def has_expressions(self) -> bool:
        """Whether an entry is a regular expression (the topics it selects may change)."""
        return bool(self.expressions)

    def matches(self, topic: str) -> bool:
        """Whether the job copies ``topic``."""
        return topic in self.names or any(e.fullmatch(topic) for e in self.expressions)

    def select(self, available: Iterable[str]) -> list[str]:
        """The named topics, then the ``available`` topics an expression matches, in name
        order, each once."""
        matched = sorted(
            {t for t in available if t not in self.names and any(e.fullmatch(t) for e in self.expressions)}
        )
        return [*self.names, *matched]

    def __repr__(self) -> str:
        return f"TopicPattern({self.spec!r})"


def _compile(entry: str) -> re.Pattern[str]:
    try:
        return re.compile(entry)
    except re.error as exc:
        raise ConfigError(f"--topics entry {entry!r} is not a valid regular expression: {exc}") from None


__all__ = ["TopicPattern"]
