"""Effectively-once PySpark pipelines over idempotent topics (extra ``spark``).

    import idempotent.spark
    idempotent.spark.register(spark)
    df.write.format("idempotent").option("url", URL).option("topic", T).option("job", NAME).save()
    spark.read.format("idempotent").option("url", URL).option("topic", T).load()

pyspark is imported only when :func:`register` runs. See docs/spark.md for options,
columns, guarantees and what the input must satisfy.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ._host import ensure_host, stop_host
from ._mirror import mirror


def register(spark: Any) -> None:
    """Register the ``idempotent`` data source with a SparkSession.

    Raises:
        ConfigError: pyspark (4.2 or later) is not installed; install ``idempotent[spark]``.
    """
    try:
        from ._source import IdempotentDataSource
    except ImportError as exc:
        raise ConfigError(
            f"the Spark data source needs pyspark>=4.2 and pyarrow: pip install 'idempotent[spark]' ({exc})"
        ) from None
    spark.dataSource.register(IdempotentDataSource)


def broker_url(url: str) -> str:
    """The ``idem://`` URL through which Spark's processes on this machine reach ``url``
    (the broker server :func:`register`'s data source starts for it); use it to read or
    inspect the topics a Spark job wrote while that server runs.

    Raises:
        BackendUnavailableError: the server could not be started.
    """
    return ensure_host(url)


__all__ = ["broker_url", "mirror", "register", "stop_host"]
