"""Download: the brokers' runtime classpaths, resolved once from Maven Central into the cache.

Also the small file helpers the other services modules share (the lock, a log's tail, the
``java`` to run). Part of the services helpers: use :func:`idempotent.testing.services.install`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator

from idempotent.testing.services.state import _POM_DIR, _Spec, _spec, cache_dir

_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

_LOG_TAIL_LINES = 40


def _version(spec: _Spec) -> str:
    """The broker version, read from the POM's <properties> (single source of truth)."""
    root = ET.parse(_POM_DIR / spec.pom).getroot()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = root.find(f"m:properties/m:{spec.version_property}", ns)
    if node is None or not (node.text or "").strip():
        raise RuntimeError(f"{spec.pom} has no <{spec.version_property}> property")
    return (node.text or "").strip()


def _home(spec: _Spec) -> pathlib.Path:
    return cache_dir() / f"{spec.name}-{_version(spec)}"


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _tail(path: pathlib.Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _say(message: str, progress: bool, end: str = "\n") -> None:
    if progress:
        print(message, end=end, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------- install


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (pathlib.Path(home) / "bin" / "java").exists():
        return str(pathlib.Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise RuntimeError("java (17+) not found on PATH or in $JAVA_HOME")
    return found


def _copy_dependencies(mvn: str, pom: pathlib.Path, staging: pathlib.Path, log: pathlib.Path, *options: str) -> int:
    """Run Maven (``mvn``) to copy the runtime dependencies of ``pom`` into ``staging``, with
    the ``-D`` ``options`` given (``-Dname=value``), its output written to ``log``. Returns
    Maven's exit status (non-zero: ``log`` says why; ``staging`` may hold some jars)."""
    cmd = [
        mvn,
        "-B",
        "-f",
        str(pom),
        f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        *options,
        f"-DoutputDirectory={staging}",
    ]
    with log.open("wb") as out:
        return subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False
        ).returncode


def install(name: str, progress: bool = True) -> pathlib.Path:
    """Resolve the broker's runtime classpath from Maven Central once; return its lib dir.

    Runs ``mvn -B -f <pom> maven-dependency-plugin:3.8.1:copy-dependencies
    -DincludeScope=runtime`` into ``cache_dir()/<name>-<version>/lib`` (Maven's log
    goes to ``maven.log`` next to it) and writes a marker holding the POM's hash: a
    second call with the same POM runs nothing and downloads nothing. Safe to call
    from concurrent processes (file lock).

    Raises ValueError for an unknown name, RuntimeError if ``mvn`` is missing or
    resolution fails (the message carries the tail of ``maven.log``; the previous lib
    dir, if any, is left untouched).
    """
    spec = _spec(name)
    version = _version(spec)
    home = _home(spec)
    lib = home / "lib"
    marker = home / ".installed"
    pom_bytes = (_POM_DIR / spec.pom).read_bytes()
    pom_hash = hashlib.sha256(pom_bytes).hexdigest()
    with _locked(cache_dir() / f"{spec.name}-{version}.lock"):
        if marker.exists() and lib.is_dir():
            try:
                recorded = json.loads(marker.read_text()).get("pom_sha256")
            except (OSError, ValueError):
                recorded = None
            if recorded == pom_hash and any(lib.glob(f"{spec.marker_jar}*.jar")):
                return lib
        mvn = shutil.which("mvn")
        if not mvn:
            raise RuntimeError("mvn (Maven 3.x) not found on PATH; needed once to resolve jars")
        home.mkdir(parents=True, exist_ok=True)
        pom = home / "pom.xml"  # a copy: Maven may write target/ next to the POM
        pom.write_bytes(pom_bytes)
        staging = home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        log = home / "maven.log"
        _say(f"resolving {name} {version} from Maven Central ...", progress, end=" ")
        started = time.monotonic()
        rc = _copy_dependencies(mvn, pom, staging, log)
        if rc != 0:
            _say("FAILED", progress)
            raise RuntimeError(
                f"resolving {name} {version} failed (mvn exit {rc}); last lines of {log}:\n" + _tail(log)
            )
        jars = sorted(staging.glob("*.jar"))
        if not any(j.name.startswith(spec.marker_jar) for j in jars):
            raise RuntimeError(f"{spec.marker_jar}*.jar missing from resolved classpath {staging}")
        size = sum(j.stat().st_size for j in jars)
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        marker.write_text(json.dumps({"pom_sha256": pom_hash, "version": version, "jars": len(jars)}) + "\n")
        _say(
            f"done in {time.monotonic() - started:.0f} s ({len(jars)} jars, {size >> 20} MB)",
            progress,
        )
        return lib


# ----------------------------------------------------------------------- processes
