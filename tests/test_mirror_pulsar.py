"""Plain Pulsar topics as a mirror source (``pulsar+native://``): message ids as offsets."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
import uuid

import pytest

from idempotent.errors import ConfigError
from idempotent.mirror.pulsar import full_topic, pack_message_id, unpack_offset
from idempotent.testing.services import ServiceInfo


def test_message_ids_pack_into_ordered_offsets() -> None:
    ids = [(0, 0, -1), (0, 0, 1), (0, 1, 0), (5, 0, 0), (5, 2**18 - 1, 4095), (2**33 - 1, 0, 0)]
    packed = [pack_message_id(*i) for i in ids]
    assert packed == sorted(packed) and len(set(packed)) == len(packed)
    assert packed[-1] < 2**63
    assert unpack_offset(pack_message_id(12, 34, 5)) == (12, 34, 5)
    for bad in [(2**33, 0, 0), (0, 2**18, 0), (0, 0, 2**12), (-1, 0, 0)]:
        with pytest.raises(ConfigError, match="does not fit"):
            pack_message_id(*bad)


def test_short_topic_names_are_in_public_default() -> None:
    assert full_topic("orders") == "persistent://public/default/orders"
    assert full_topic("persistent://t/n/x") == "persistent://t/n/x"


def _create(admin_url: str, topic: str, partitions: int) -> None:
    request = urllib.request.Request(
        f"{admin_url}/admin/v2/persistent/public/default/{topic}/partitions", data=b"%d" % partitions, method="PUT"
    )
    request.add_header("Content-Type", "application/json")
    urllib.request.urlopen(request, timeout=30).read()


_LOG_PROBE = """
import logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger().addHandler(Keep())
logging.getLogger("idempotent.mirror.pulsar").setLevel(logging.INFO)
from idempotent.mirror import open_source
source = open_source(sys.argv[1])
reader = source.open_partition(sys.argv[2], 0, -1, None)
reader.poll(10, 0.5)
reader.close()
source.close()
mine = [r for r in records if r.name == "idempotent.mirror.pulsar"]
print(len(mine), min((r.levelname for r in mine), default="-"))
"""


@pytest.mark.pulsar
def test_pulsar_client_lines_of_the_source_go_to_python_logging(pulsar_service: ServiceInfo) -> None:
    """Regression: the source client's C++ log lines went straight to the process's output."""
    assert pulsar_service.admin_url is not None
    topic = f"pl-{uuid.uuid4().hex[:8]}"
    _create(pulsar_service.admin_url, topic, 1)
    source = f"pulsar+native://{pulsar_service.bootstrap.split('://')[1]}?admin_url={pulsar_service.admin_url}"
    out = subprocess.run([sys.executable, "-c", _LOG_PROBE, source, topic], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    *before, last = out.stdout.splitlines()
    output = "\n".join(before) + out.stderr
    assert "ClientConnection" not in output and "INFO" not in output, output
    count, level = last.split()
    assert int(count) >= 1 and level == "INFO"
