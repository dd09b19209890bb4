"""The options of the ``idempotent`` data source, parsed once (see docs/spark.md, Options)."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from ._host import machine, resolve_url


def required(options: Mapping[str, str], name: str) -> str:
    """The value of a required option.

    Raises:
        ConfigError: the option is missing or empty.
    """
    value = options.get(name)
    if not value:
        raise ConfigError(f"option {name!r} is required: add .option({name!r}, ...) (docs/spark.md, Options)")
    return value


def _flag(options: Mapping[str, str], name: str) -> bool:
    value = options.get(name, "false").strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name!r} is 'true' or 'false', not {options.get(name)!r}")
    return value == "true"


class Options:
    """Every option of a read or a write, parsed on the driver (tasks get a pickled copy).

    ``url`` is resolved here, once (:func:`~idempotent.spark._host.resolve_url`: a relative
    SQLite path made absolute from the driver's working directory), and ``machine`` names the
    driver's machine: tasks reach the URL through
    :func:`~idempotent.spark._host.executor_url`, which refuses what only the driver's
    machine serves on any other.

    Raises:
        ConfigError: (on construction) ``url`` or ``topic`` missing, or a malformed value.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.url = resolve_url(required(options, "url"))
        self.machine = machine()
        self.topic = required(options, "topic")
        self.job = options.get("job")
        self.partitions = options.get("partitions")
        if self.partitions is not None and not self.partitions.strip().isdigit():
            raise ConfigError(f"option 'partitions' is a partition count, not {self.partitions!r}")
        try:
            self.linger_ms = float(options.get("lingerMs", "5"))
        except ValueError:
            raise ConfigError(
                f"option 'lingerMs' is a number of milliseconds, not {options.get('lingerMs')!r}"
            ) from None
        self.starting = options.get("startingOffsets")
        self.ending = options.get("endingOffsets")
        columns = options.get("positionColumns")
        self.position_columns = [c.strip() for c in columns.split(",") if c.strip()] if columns else []
        if columns is not None and not self.position_columns:
            raise ConfigError("option 'positionColumns' names columns: 'unit1,...,ordinal'")
        self.same_partitioning = _flag(options, "samePartitioning")
