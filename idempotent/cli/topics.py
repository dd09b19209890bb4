"""``idempotent topics``: list, describe, create and delete topics, on every broker URL.

``list`` and ``describe`` only read (a backend URL is opened read-only, so they may run next
to a writer); ``create`` and ``delete`` change the broker: on a backend URL through a broker
opened in this process, on ``idem://`` through the broker server (which needs the admin role
where authorization is on). ``memory://`` lives in one process: a command sees a new, empty
store, and what it creates is gone when it exits (it says so).

``describe`` also says how the topic is replicated: on Kafka each partition's leader, replicas
and in-sync replicas (ISR) and the topic's ``min.insync.replicas``; on Pulsar the BookKeeper
ensemble and quorums of its namespace (the same for every partition); elsewhere a line saying
what keeps the copies (see :data:`REPLICATION_NOTES`).

Settings (``--config KEY=VALUE``) are the project's topic-level settings: ``deduplication``
(``true``/``false``) and ``policy`` (``strict``/``monotonic``), as ``idempotent admin
set-deduplication`` sets them.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from idempotent.broker.broker import BrokerConfig
from idempotent.core.checker import Policy
from idempotent.core.values import PartitionStats

from .. import connect
from ..api import BrokerAPI
from ..backend import DescribesReplicas, TopicReplicas
from ..errors import ProducerError
from .common import (
    SERVER_SCHEMES,
    CliError,
    Subcommands,
    add_connect_timeout,
    connect_options,
    err,
    int_type,
    open_read_only,
    partition_count,
    topic_type,
)
from .formatting import format_table

#: The settings ``--config`` takes, with what each accepts.
CONFIG_KEYS = {"deduplication": ("true", "false"), "policy": ("strict", "monotonic")}
#: what ``describe`` says of the copies of a topic where the backend does not list replicas
REPLICATION_NOTES = {
    "sqlite": "one copy, in the SQLite file",
    "memory": "one copy, in this process's memory",
    "idem": "not known through a broker server: describe the backend URL it serves",
}
_NOTE_SCHEMES = {"idems": "idem"}
MEMORY_NOTE = (
    "note: memory:// lives in this process only: this command saw a new, empty store, and what it created is gone now"
)


def _config_type(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key = key.strip()
    if key not in CONFIG_KEYS:
        known = ", ".join(f"{k}={'|'.join(v)}" for k, v in CONFIG_KEYS.items())
        raise argparse.ArgumentTypeError(
            f"unknown setting {key!r}: topics take {known} (a backend's own topic settings are set with its tools)"
        )
    value = value.strip().lower()
    if value not in CONFIG_KEYS[key]:
        raise argparse.ArgumentTypeError(f"{key} takes {' or '.join(CONFIG_KEYS[key])}, not {value!r}")
    return key, value


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent topics`` and its verbs to the subcommands."""
    topics = commands.add_parser(
        "topics",
        help="list, describe, create or delete topics",
        description="List, describe, create or delete the topics of a broker URL (sqlite:///, kafka://, "
        "pulsar://, idem://, idems://; memory:// lives in one process only).",
    )
    verbs = topics.add_subparsers(dest="topics_command", metavar="TOPICS_COMMAND", required=True)

    listing = verbs.add_parser(
        "list",
        help="every topic: partitions, end offsets, deduplication and policy",
        description="List every topic with its partition count, its partitions' end offsets (the "
        "offset the next record gets: on Kafka, transaction markers take offsets too; on Pulsar, "
        "offsets are packed message ids), its deduplication switch and its sequence policy.",
    )
    listing.add_argument("url", metavar="URL")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connect_timeout(listing)
    listing.set_defaults(handler=cmd_topics_list)

    describe = verbs.add_parser(
        "describe",
        help="a topic's partitions: end offsets, snapshots, producers; its settings",
        description="Describe a topic: deduplication and policy, and per partition the end offset, "
        "the snapshot position and the producers tracked.",
    )
    describe.add_argument("url", metavar="URL")
    describe.add_argument("topic", metavar="TOPIC", type=topic_type)
    describe.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_connect_timeout(describe)
    describe.set_defaults(handler=cmd_topics_describe)

    create = verbs.add_parser(
        "create",
        help="create a topic",
        description="Create a topic with --partitions partitions (an existing topic with the same "
        "count is left as it is; with another count it is refused), then apply --config settings.",
    )
    create.add_argument("url", metavar="URL")
    create.add_argument("topic", metavar="TOPIC", type=topic_type)
    create.add_argument(
        "--partitions", metavar="N", type=int_type(1, "--partitions"), default=1, help="partition count (default 1)"
    )
    create.add_argument(
        "--config",
        metavar="KEY=VALUE",
        type=_config_type,
        action="append",
        default=[],
        help="a topic setting: deduplication=true|false, policy=strict|monotonic (repeatable)",
    )
    add_connect_timeout(create)
    create.set_defaults(handler=cmd_topics_create)

    delete = verbs.add_parser(
        "delete",
        help="delete a topic with its records (needs --yes)",
        description="Delete a topic: its records, checker state, snapshots and topic settings. "
        "Producers keep their ids. Refused without --yes.",
    )
    delete.add_argument("url", metavar="URL")
    delete.add_argument("topic", metavar="TOPIC", type=topic_type)
    delete.add_argument("--yes", action="store_true", help="really delete it")
    add_connect_timeout(delete)
    delete.set_defaults(handler=cmd_topics_delete)


def _open_writer(url: str, connect_timeout: float, *, create: bool) -> BrokerAPI:
    """A broker that may change ``url``: the server of an ``idem://`` URL, else one opened here
    (a ``sqlite://`` file is created only by ``create``)."""
    options = connect_options(url, connect_timeout)
    if urlsplit(url).scheme in SERVER_SCHEMES:
        return connect(url, **options)
    if not create:
        open_read_only(url, connect_timeout).close()  # refuses a missing sqlite file, with the reason
    return connect(url, BrokerConfig(auto_create_topics=False, maintenance_interval=0), **options)


def _memory_note(url: str) -> None:
    if urlsplit(url).scheme == "memory":
        err(MEMORY_NOTE)


def _summary(broker: BrokerAPI, topic: str, count: int, stats: Sequence[PartitionStats]) -> dict[str, Any]:
    ends = [broker.end_offset(topic, p) for p in range(count)]
    first = stats[0] if stats else None
    return {
        "topic": topic,
        "partitions": count,
        "end_offsets": ends,
        "deduplication": first.deduplication if first else None,
        "policy": first.policy if first else None,
    }


def _replication(broker: BrokerAPI, url: str, topic: str) -> tuple[TopicReplicas | None, str | None]:
    """How ``topic`` is replicated: its replicas where the backend lists them (Kafka), else a
    note saying what keeps its copies.

    Raises:
        BackendUnavailableError: the backend did not answer.
    """
    backend = getattr(broker, "backend", None)
    backend = getattr(backend, "inner", backend)  # (a read-only wrapper's backend)
    if isinstance(backend, DescribesReplicas):
        replicas = backend.describe_replicas(topic)
        if replicas is not None and not replicas.partitions:  # no per-partition copies (Pulsar)
            return None, replicas.note
        return replicas, None if replicas is None else replicas.note
    scheme = urlsplit(url).scheme
    return None, REPLICATION_NOTES.get(_NOTE_SCHEMES.get(scheme, scheme))


def _ids(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids) or "-"


def _on_off(value: object) -> str:
    return "-" if value is None else ("on" if value else "off")


def cmd_topics_list(args: argparse.Namespace) -> int:
    """``idempotent topics list``: every topic, its partitions, end offsets and settings.

    A topic whose checkers cannot be built (a topic made by another tool whose messages
    cannot be read, such as an encrypted one) is listed without its settings (``-``), and a
    line on stderr says why; the other topics are listed as usual."""
    broker = open_read_only(args.url, args.connect_timeout)
    rows = []
    try:
        for name, count in sorted(broker.topics().items()):
            try:
                stats = broker.stats(name)
            except ProducerError as exc:
                err(f"topic {name}: its settings could not be read ({type(exc).__name__}: {exc})")
                stats = []
            rows.append(_summary(broker, name, count, stats))
    finally:
        broker.close()
    if args.json:
        print(json.dumps(rows, indent=2))
    elif rows:
        header = ("TOPIC", "PARTITIONS", "DEDUPLICATION", "POLICY", "END_OFFSETS")
        table = [
            (
                r["topic"],
                str(r["partitions"]),
                _on_off(r["deduplication"]),
                str(r["policy"]),
                ",".join(str(end) for end in r["end_offsets"]),
            )
            for r in rows
        ]
        print("\n".join(format_table(header, table, left=frozenset({0, 2, 3, 4}))))
    else:
        print(f"no topics in {args.url}")
    _memory_note(args.url)
    return 0


def cmd_topics_describe(args: argparse.Namespace) -> int:
    """``idempotent topics describe``: a topic's settings and, per partition, its end offset,
    snapshot position and producers; how it is replicated (on Kafka each partition's leader,
    replicas and ISR)."""
    broker = open_read_only(args.url, args.connect_timeout)
    try:
        count = partition_count(broker, args.topic)
        stats = sorted(broker.stats(args.topic), key=lambda s: s.partition)
        summary = _summary(broker, args.topic, count, stats)
        replicas, note = _replication(broker, args.url, args.topic)
    finally:
        broker.close()
    placed = {} if replicas is None else {r.partition: r for r in replicas.partitions}
    partitions: list[dict[str, Any]] = [
        {
            "partition": s.partition,
            "end_offset": summary["end_offsets"][s.partition],
            "status": s.status,
            "snapshot_position": s.snapshot_position,
            "producers": len(s.producers),
        }
        for s in stats
    ]
    for p in partitions:
        where = placed.get(p["partition"])
        if where is not None:
            p.update(leader=where.leader, replicas=list(where.replicas), isr=list(where.isr))
    replication: dict[str, Any] = {"note": note}
    if replicas is not None:
        replication.update(
            min_insync_replicas=replicas.min_insync_replicas,
            min_insync_source=replicas.min_insync_source,
            under_replicated=[r.partition for r in replicas.partitions if len(r.isr) < len(r.replicas)],
        )
    if args.json:
        print(json.dumps({**summary, "partition_details": partitions, "replication": replication}, indent=2))
        return 0
    print(
        f"topic {args.topic}: {count} partition(s), "
        f"deduplication {_on_off(summary['deduplication'])}, policy {summary['policy']}"
    )
    header: tuple[str, ...] = ("PARTITION", "END_OFFSET", "STATUS", "SNAPSHOT_AT", "PRODUCERS")
    if placed:
        header += ("LEADER", "REPLICAS", "ISR")
    table = [
        (
            str(p["partition"]),
            str(p["end_offset"]),
            str(p["status"]),
            "-" if p["snapshot_position"] < 0 else str(p["snapshot_position"]),
            str(p["producers"]),
            *((str(p.get("leader", -1)), _ids(p.get("replicas", ())), _ids(p.get("isr", ()))) if placed else ()),
        )
        for p in partitions
    ]
    print("\n".join(format_table(header, table, left=frozenset({2}))))
    if replicas is not None:
        insync = replicas.min_insync_replicas
        source = {"topic": "set on the topic", "broker": "the brokers' default"}.get(replicas.min_insync_source or "")
        print(f"min.insync.replicas: {'not known' if insync is None else insync}{f' ({source})' if source else ''}")
        lagging = replication["under_replicated"]
        if lagging:
            print(f"under-replicated partitions (fewer in sync than replicas): {_ids(lagging)}")
    elif note is not None:
        print(f"replicas: {note}")
    return 0


def cmd_topics_create(args: argparse.Namespace) -> int:
    """``idempotent topics create``: create a topic and apply its settings."""
    settings = dict(args.config)
    broker = _open_writer(args.url, args.connect_timeout, create=True)
    try:
        existed = args.topic in broker.topics()
        broker.create_topic(args.topic, args.partitions)
        if "deduplication" in settings:
            broker.set_deduplication(settings["deduplication"] == "true", topic=args.topic)
        if "policy" in settings:
            broker.set_policy(Policy(settings["policy"]), topic=args.topic)
    finally:
        broker.close()
    what = "topic exists" if existed else "created topic"
    extra = "".join(f", {key} {value}" for key, value in settings.items())
    print(f"{what} {args.topic} with {args.partitions} partition(s) in {args.url}{extra}")
    _memory_note(args.url)
    return 0


def cmd_topics_delete(args: argparse.Namespace) -> int:
    """``idempotent topics delete``: delete a topic, only with ``--yes``."""
    broker = _open_writer(args.url, args.connect_timeout, create=False)
    try:
        count = partition_count(broker, args.topic)
        ends = [broker.end_offset(args.topic, p) for p in range(count)]
        what = f"{count} partition(s), end offsets {','.join(str(end) for end in ends)}"
        if not args.yes:
            raise CliError(
                f"not deleting topic {args.topic!r} ({what}) without --yes: "
                "its records and checker state would be gone for good; add --yes to delete it"
            )
        broker.delete_topic(args.topic)
    finally:
        broker.close()
    print(f"deleted topic {args.topic} ({what}) from {args.url}")
    _memory_note(args.url)
    return 0
