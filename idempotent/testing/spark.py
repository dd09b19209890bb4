"""Spark's own Kafka connector for tests and benchmarks, resolved from Maven Central once.

PySpark from PyPI does not ship ``spark-sql-kafka-0-10``; :func:`kafka_connector_jars`
resolves it for the installed PySpark version with Maven (as the brokers are resolved in
:mod:`idempotent.testing.services`) into ``<cache>/spark-kafka-<version>/lib`` and returns the
jars, to pass as ``spark.jars`` before the session starts.
"""

from __future__ import annotations

import pathlib
import shutil

from .services import _POM_DIR, _locked, _tail, cache_dir
from .services.maven import _copy_dependencies

_ARTIFACTS = "spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2"


def kafka_connector_jars() -> list[pathlib.Path]:
    """The jars of Spark's Kafka connector matching the installed PySpark (its version, or
    the first release of its minor line when that one is not on Maven Central yet).

    Raises:
        RuntimeError: ``mvn`` is missing or the resolution failed (with Maven's log tail).
    """
    import pyspark

    # a patch release of PySpark may come before its connector reaches Maven Central;
    # Spark keeps patch releases of one minor line binary compatible
    major, minor, *_ = pyspark.__version__.split(".")
    versions = dict.fromkeys([pyspark.__version__, f"{major}.{minor}.0"])
    failures = []
    for version in versions:
        try:
            return _resolve(version)
        except RuntimeError as exc:
            failures.append(str(exc))
    raise RuntimeError("\n".join(failures))


def _resolve(version: str) -> list[pathlib.Path]:
    home = cache_dir() / f"spark-kafka-{version}"
    lib = home / "lib"
    with _locked(cache_dir() / f"spark-kafka-{version}.lock"):
        jars = sorted(lib.glob("*.jar"))
        if any(j.name.startswith("spark-sql-kafka") for j in jars):
            return jars
        mvn = shutil.which("mvn")
        if not mvn:
            raise RuntimeError("mvn (Maven 3.x) not found on PATH; needed once to resolve Spark's Kafka connector")
        home.mkdir(parents=True, exist_ok=True)
        pom = home / "pom.xml"
        pom.write_bytes((_POM_DIR / "spark-kafka.xml").read_bytes())
        staging = home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        log = home / "maven.log"
        rc = _copy_dependencies(
            mvn, pom, staging, log, f"-Dspark.version={version}", f"-DincludeArtifactIds={_ARTIFACTS}"
        )
        if rc != 0 or not any(staging.glob("spark-sql-kafka*.jar")):
            raise RuntimeError(f"resolving spark-sql-kafka {version} failed (mvn exit {rc}):\n" + _tail(log))
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        return sorted(lib.glob("*.jar"))
