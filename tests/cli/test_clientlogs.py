"""idempotent.runtime.native_logs: no librdkafka ``%N|`` line and no Pulsar C++ client line reaches
stderr (or stdout) directly, from the clients the project opens: the adapters, the CLI, and
the clients the drop-ins pass through, also those a program leaves open at exit."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
import textwrap
import urllib.parse
import uuid
from typing import Any

import pytest

from idempotent.runtime import native_logs as clientlogs

#: librdkafka's own console format: ``%<syslog level>|<time>|<facility>|<client>| text``
LIBRDKAFKA_LINE = re.compile(r"^%\d\|", re.MULTILINE)
#: the Pulsar C++ client's console format: ``2024-01-01 12:00:00.000 INFO  [thread] File:line | text``
PULSAR_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARN|ERROR)\s+\[\d+\]", re.MULTILINE)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _python(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *argv], capture_output=True, text=True, timeout=120
    )


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "idempotent", *argv], capture_output=True, text=True, timeout=180)


def _assert_no_client_lines(done: subprocess.CompletedProcess[str]) -> None:
    for stream in (done.stderr, done.stdout):
        assert not LIBRDKAFKA_LINE.search(stream), stream[-3000:]
        assert not PULSAR_LINE.search(stream), stream[-3000:]


def test_passed_through_kafka_clients_print_nothing_of_librdkafkas() -> None:
    """A Consumer and an AdminClient of the confluent-kafka drop-in, pointed at a closed port:
    librdkafka fails to connect and says so, into Python logging only; a program that
    configures logging sees the lines there."""
    script = """
        import logging, sys
        from idempotent.compat import confluent_kafka
        from idempotent.compat.confluent_kafka.admin import AdminClient
        if sys.argv[2] == "configured":
            logging.basicConfig(level=logging.INFO, format="logged %(name)s %(message)s")
        seen = []
        class Seen(logging.Handler):
            def emit(self, record):
                seen.append(record.getMessage())
        logging.getLogger("idempotent.clients.librdkafka").addHandler(Seen())
        consumer = confluent_kafka.Consumer({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}", "group.id": "g"})
        for _ in range(40):  # until librdkafka has failed to connect and said so
            consumer.poll(0.5)
            if any("Connection refused" in line for line in seen):
                break
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{sys.argv[1]}"})
        admin.poll(0.5)
        print("done")  # both left open: they end with the process
    """
    port = str(_closed_port())
    quiet = _python(script, port, "quiet")
    assert quiet.returncode == 0 and quiet.stdout == "done\n", quiet.stderr
    _assert_no_client_lines(quiet)
    assert quiet.stderr == ""  # nothing configured: nothing printed
    configured = _python(script, port, "configured")
    _assert_no_client_lines(configured)
    assert (
        "logged idempotent.clients.librdkafka FAIL" in configured.stderr and "Connection refused" in configured.stderr
    )


@pytest.mark.kafka
def test_cli_commands_on_kafka_print_no_client_lines(kafka_service: Any) -> None:
    url = kafka_service.url
    topic = f"quiet-{uuid.uuid4().hex[:6]}"
    for argv in (
        ["produce", url, topic, "--generate", "200", "--partitions", "2", "--no-progress"],
        ["tail", url, topic],
        ["tail", f"kafka+native://{kafka_service.bootstrap}", topic.replace("/", "."), "--count", "3"],
        ["stats", url, topic],
        ["topics", "describe", url, topic],
        ["topics", "delete", url, topic, "--yes"],
    ):
        done = _cli(*argv)
        assert done.returncode == 0, (argv, done.stderr)
        _assert_no_client_lines(done)
        assert done.stderr == "", (argv, done.stderr)


@pytest.mark.pulsar
def test_pulsar_clients_print_nothing_of_the_cpp_clients(pulsar_service: Any) -> None:
    url = f"{pulsar_service.url}?{urllib.parse.urlencode({'admin_url': pulsar_service.admin_url})}"
    topic = f"quiet-{uuid.uuid4().hex[:6]}"
    # the drop-in's subscribe() opens a real pulsar.Client; the program leaves it open
    script = """
        import sys
        from idempotent.compat import pulsar
        client = pulsar.Client(sys.argv[1])
        consumer = client.subscribe(sys.argv[2], "sub")
        try:
            consumer.receive(300)
        except Exception as exc:  # pulsar-client's own Timeout: the consumer is pulsar-client's
            print(type(exc).__name__)
    """
    done = _python(script, url, topic + "-subscribed")
    assert done.returncode == 0 and done.stdout == "Timeout\n", done.stderr
    _assert_no_client_lines(done)
    assert done.stderr == ""
    for argv in (
        ["produce", url, topic, "--generate", "100", "--no-progress"],
        ["tail", url, topic, "--count", "3"],
        ["topics", "list", url],
        ["stats", url, topic],
    ):
        done = _cli(*argv)
        assert done.returncode == 0, (argv, done.stderr)
        _assert_no_client_lines(done)
        assert done.stderr == "", (argv, done.stderr)
    # a plain topic, read by the mirror's Pulsar source: with pulsar-client's Python logger, 4 of
    # 12 runs aborted at exit ("terminate called without an active exception"); 8 runs here
    plain = f"pulsar+native://{pulsar_service.bootstrap.removeprefix('pulsar://')}?admin_url={pulsar_service.admin_url}"
    assert _cli("produce", url, topic + "-source", "--generate", "5", "--no-progress").returncode == 0
    for _ in range(8):
        done = _cli("tail", plain, f"{topic}-source", "--count", "2")
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert len(done.stdout.splitlines()) == 2
    verbose = _cli("-vv", "tail", url, topic, "--count", "1")  # -vv: the client's INFO lines, through logging
    assert verbose.returncode == 0, verbose.stderr
    _assert_no_client_lines(verbose)
    assert "idempotent.clients.pulsar INFO" in verbose.stderr


def test_routed_classes_keep_a_logger_the_user_gave() -> None:
    class Native:
        def __init__(self, config: dict[str, Any], **kwargs: Any) -> None:
            self.config, self.kwargs = config, kwargs

    routed = clientlogs.routed_kafka_class(Native)
    assert routed is clientlogs.routed_kafka_class(Native) and routed.__name__ == "Native"
    assert routed({"a": 1}).config == {"a": 1, "logger": clientlogs.LIBRDKAFKA_LOG}  # type: ignore[attr-defined]
    mine = logging.getLogger("mine")
    assert routed({"logger": mine}).config == {"logger": mine}  # type: ignore[attr-defined]
    assert routed({"a": 1}, logger=mine).config == {"a": 1}  # type: ignore[attr-defined]
    assert clientlogs.kafka_config({"logger": mine})["logger"] is mine


def test_the_pulsar_relay_leaves_no_file_behind(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each client's log file is unlinked once the client has opened it, and removed when the
    client cannot be made; its lines reach the logger given."""
    import glob
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    target = logging.getLogger("test.relay")
    target.setLevel(logging.INFO)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    target.addHandler(Keep())
    opened: list[Any] = []

    class FakeClient:
        def close(self) -> None:
            pass

    def client(url: str, *, logger: Any, **options: Any) -> Any:
        with open(logger.log_file, "a") as handle:  # what pulsar-client's FileLogger does
            handle.write("2024-01-01 12:00:00.000 WARN  [1] ClientImpl:1 | first line\n")
        opened.append(logger)
        return FakeClient()

    clientlogs.open_pulsar_client(client, "pulsar://h:1", log_to=target)
    assert glob.glob(str(tmp_path / "idempotent-pulsar-*")) == []  # unlinked, still open for both ends
    clientlogs.drain_pulsar_logs()
    assert [(r.levelname, r.getMessage()) for r in records] == [("WARNING", "ClientImpl:1 | first line")]

    def broken(url: str, **options: Any) -> Any:
        raise RuntimeError("cannot")

    with pytest.raises(RuntimeError):
        clientlogs.open_pulsar_client(broken, "pulsar://h:1", log_to=target)
    assert glob.glob(str(tmp_path / "idempotent-pulsar-*")) == []
