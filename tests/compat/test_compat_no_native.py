"""The drop-ins without the native clients: installed without extras into a fresh venv (no
confluent-kafka, no pulsar-client), both import and produce on ``sqlite://``, and a feature that
needs a native client says which extra installs it.

The same install runs without a C compiler (``CC`` names a command that fails): the optional
compiled Kafka write path (``setup.py``) is left out with a warning and the install succeeds.

The install takes about 6 s here (a venv without pip of its own, filled by this interpreter's
pip with ``--python``; the dependencies come from pip's cache or PyPI)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: run inside the venv: what it has, then both drop-ins on sqlite://, then the messages of
#: the features that need the native clients
SCRIPT = textwrap.dedent(
    """
    import importlib.util
    import sys

    work = sys.argv[1]
    absent = [name for name in ("confluent_kafka", "pulsar", "_pulsar") if importlib.util.find_spec(name)]
    assert not absent, f"native clients installed: {absent}"
    # no compiler at install: the optional extension was left out, the package is whole
    assert importlib.util.find_spec("idempotent._kafka_write") is None, "the extension was built"

    import idempotent
    from idempotent.compat import confluent_kafka
    from idempotent.compat import pulsar

    assert idempotent.__file__.startswith(sys.prefix), idempotent.__file__
    url = f"sqlite:///{work}/drop-ins.db"

    reports = []
    producer = confluent_kafka.Producer({"idempotent.broker.url": url, "transactional.id": "kafka-app"})
    for i in range(3):
        producer.produce("kafka-topic", key=b"k", value=f"k{i}".encode(), on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(120) == 0, "messages left after flush"
    assert reports == [None, None, None], reports

    client = pulsar.Client(url)
    sender = client.create_producer("pulsar-topic", producer_name="pulsar-app")
    ids = [sender.send(f"p{i}".encode()) for i in range(3)]
    sender.close()
    reader = client.create_reader("pulsar-topic", pulsar.MessageId.earliest)
    read = [reader.read_next(30_000) for _ in range(3)]
    assert [m.data() for m in read] == [b"p0", b"p1", b"p2"], read
    assert [m.message_id() for m in read] == ids
    client.close()

    with idempotent.Reader(url, "kafka-topic") as reader:
        records = iter(reader)
        values = [next(records).value for _ in range(3)]
    assert values == [b"k0", b"k1", b"k2"], values

    assert issubclass(pulsar.InvalidConfiguration, ValueError)
    assert issubclass(pulsar.InvalidConfiguration, pulsar.PulsarException)

    def refused(call, extra):
        try:
            call()
        except ImportError as exc:
            assert f"idempotent[{extra}]" in str(exc), exc
            return
        raise AssertionError(f"{call} did not raise ImportError")

    refused(lambda: confluent_kafka.Consumer, "kafka")
    refused(lambda: __import__("idempotent.compat.confluent_kafka.admin"), "kafka")
    refused(lambda: confluent_kafka.Producer({"bootstrap.servers": "127.0.0.1:1"}), "kafka")
    refused(lambda: pulsar.ConsumerType, "pulsar")
    refused(lambda: pulsar.Client("pulsar://127.0.0.1:1"), "pulsar")
    try:
        idempotent.Producer("kafka://127.0.0.1:1", "native-less")
    except idempotent.ConfigError as exc:
        assert "idempotent[kafka]" in str(exc), exc
    else:
        raise AssertionError("a kafka:// producer opened without confluent-kafka")
    print("drop-ins ok")
    """
)


def _copy_sources(target: Path) -> Path:
    """The files ``pip install`` needs, copied (so that its build writes nothing here)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("idempotent", "adapters"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, target / name)
    return target


def _run(command: list[str], timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


@pytest.mark.timeout(900)
def test_drop_ins_import_and_produce_without_native_clients(tmp_path: Path) -> None:
    source = _copy_sources(tmp_path / "src")
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    has_pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, check=False)
    if has_pip.returncode == 0:  # fill a venv without pip of its own from this interpreter's pip
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], 120)
        install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-v", str(source)]
    else:
        _run([sys.executable, "-m", "venv", str(venv)], 300)
        install = [str(python), "-m", "pip", "install", "-v", str(source)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IDEMPOTENT_", "PYTHON"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # a machine without a C compiler: every compile the extension's build starts fails
    done = _run(install, 600, env={**env, "CC": "false", "LDSHARED": "false"})
    assert "building 'idempotent._kafka_write'" in done.stdout + done.stderr, "the extension's build did not start"
    script = tmp_path / "drop_ins.py"
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    done = _run([str(python), "-I", str(script), str(work)], 300, env=env, cwd=work)
    assert done.stdout.strip().endswith("drop-ins ok"), done.stdout
