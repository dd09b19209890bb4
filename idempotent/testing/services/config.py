"""Configuration: a broker's workdir and the files rendered into it from the templates in
``conf/`` (Kafka's ``server.properties`` and storage format, Pulsar's ``standalone.conf`` and
its metadata clean-up), and the command-line arguments that go with them.

Part of the services helpers of :mod:`idempotent.testing.services`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import pathlib
import shutil
import string
import subprocess
from collections.abc import Mapping

from idempotent.testing.services.maven import _java, _tail
from idempotent.testing.services.state import _CONF_DIR, _HOST, _MARKER


def _render(template: str, target: pathlib.Path, values: Mapping[str, object]) -> None:
    text = (_CONF_DIR / template).read_text()
    target.write_text(string.Template(text).substitute({k: str(v) for k, v in values.items()}))


def _kafka_cluster_id() -> str:
    while True:  # Kafka's Uuid.randomUuid() also rejects ids starting with '-'
        cid = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _log4j() -> str:
    """The JVM option that points Kafka and Pulsar at the services' log4j2 configuration."""
    return f"-Dlog4j2.configurationFile={_CONF_DIR / 'log4j2.properties'}"


def _storage_format(lib: pathlib.Path, props: pathlib.Path, cluster_id: str) -> list[str]:
    """The command (a short JVM) that formats the data directory ``props`` names for the
    Kafka cluster ``cluster_id``; a directory formatted already is left as it is."""
    return [
        _java(),
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        _log4j(),
        "-cp",
        f"{lib}/*",
        "kafka.tools.StorageTool",
        "format",
        "-c",
        str(props),
        "-t",
        cluster_id,
        "--ignore-formatted",
    ]


def _prepare_kafka(
    lib: pathlib.Path, workdir: pathlib.Path, ports: Mapping[str, int], log: pathlib.Path
) -> tuple[list[str], list[str]]:
    data = workdir / "data"
    props = workdir / "server.properties"
    _render("kafka-server.properties", props, {**ports, "data_dir": data})
    if not (data / "meta.properties").exists():
        fmt = _storage_format(lib, props, _kafka_cluster_id())
        with log.open("ab") as out:
            rc = subprocess.run(
                fmt,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=workdir,
                check=False,
            ).returncode
        if rc != 0:
            raise RuntimeError(f"kafka storage format failed (exit {rc}):\n{_tail(log)}")
    return [_log4j()], [str(props)]


def _prepare_pulsar(
    lib: pathlib.Path, workdir: pathlib.Path, ports: Mapping[str, int], log: pathlib.Path
) -> tuple[list[str], list[str]]:
    from idempotent.testing.certs import make_certs

    conf = workdir / "standalone.conf"
    tls = make_certs(workdir / "tls", hosts=(_HOST, "localhost"), rsa=True, days=365)
    files = {"tls_cert": tls.server_cert, "tls_key": tls.server_key, "tls_ca": tls.ca_cert}
    _render("pulsar-standalone.conf", conf, {**ports, **files})
    metadata = workdir / "data" / "metadata"
    if metadata.is_dir():
        _pulsar_metadata_cleanup(lib, metadata, log)
    args = [
        "--config",
        str(conf),
        "--metadata-dir",
        str(metadata),
        "--bookkeeper-dir",
        str(workdir / "data" / "standalone" / "bookkeeper"),
        "--bookkeeper-port",
        str(ports["bookie_port"]),
        "--no-functions-worker",
        "--no-stream-storage",
        "--advertised-address",
        _HOST,
    ]
    return [_log4j()], args


def _pulsar_metadata_cleanup(lib: pathlib.Path, metadata: pathlib.Path, log: pathlib.Path) -> None:
    """Delete stale ephemeral nodes left in the RocksDB metadata store by a previous JVM
    (see conf/PulsarMetadataCleanup.java for why). Compiled once into the cache."""
    source = _CONF_DIR / "PulsarMetadataCleanup.java"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    classes = lib.parent / f"helper-{digest}"
    java = _java()
    javac = pathlib.Path(java).with_name("javac")
    if not (classes / "PulsarMetadataCleanup.class").exists() and javac.exists():
        staging = lib.parent / f"helper-{digest}.tmp-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        compiled = subprocess.run(
            [str(javac), "-nowarn", "-cp", f"{lib}/*", "-d", str(staging), str(source)],
            capture_output=True,
            check=False,
        )
        if compiled.returncode == 0:
            with contextlib.suppress(OSError):  # another process may have won the race
                staging.rename(classes)
        shutil.rmtree(staging, ignore_errors=True)
    common = ["-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
    if (classes / "PulsarMetadataCleanup.class").exists():
        cmd = [java, *common, "-cp", f"{classes}:{lib}/*", "PulsarMetadataCleanup", str(metadata)]
    else:  # no javac: single-file source launch (slower: compiles in memory each time)
        cmd = [java, *common, "-cp", f"{lib}/*", str(source), str(metadata)]
    with log.open("ab") as out:
        out.write(b"--- idempotent: removing stale ephemeral metadata ---\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False).returncode
    if rc != 0:
        raise RuntimeError(f"pulsar metadata cleanup failed (exit {rc}):\n{_tail(log)}")


def _check_wipeable(workdir: pathlib.Path) -> None:
    """Raise ValueError unless workdir is absent, empty or was created by us."""
    if not workdir.exists():
        return
    if not workdir.is_dir():
        raise ValueError(f"workdir {workdir} exists and is not a directory")
    if not (workdir / _MARKER).exists() and any(workdir.iterdir()):
        raise ValueError(f"refusing to wipe {workdir}: not empty and not created by idempotent.testing.services")


def _prepare_workdir(workdir: pathlib.Path, fresh: bool) -> None:
    if fresh and workdir.exists():
        _check_wipeable(workdir)
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / _MARKER).write_text("created by idempotent.testing.services; wiped by up()\n")
