"""``idempotent admin``: deduplication settings and checker state of a broker.

The verbs go through the :class:`~idempotent.api.BrokerAPI` surface, so that they work on a
backend URL (a broker opened in this process) and on a broker server (``idem://host:port``).
The URL comes from ``--url`` or ``$IDEMPOTENT_URL`` (see ``docs/operations.md``). ``stats``
and ``describe-producers`` only read: on a backend URL they open it read-only.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs

from idempotent.broker.broker import BrokerConfig, validate_topic
from idempotent.core.topics import canonical_namespace, canonical_topic
from idempotent.core.values import PartitionStats

from ..api import BrokerAPI
from ..errors import InvalidTopicError
from .common import (
    SERVER_SCHEMES,
    URL_ENV,
    CliError,
    Subcommands,
    add_connect_timeout,
    connect_options,
    int_type,
    open_read_only,
    partition_count,
    topic_type,
)
from .formatting import format_stats, format_table, iso, stats_dict

_POLICY_CHOICES = ("strict", "monotonic", "clear")


@attrs.frozen
class AdminTarget:
    """What ``set-deduplication`` changes: a topic, a namespace, or the broker-wide default."""

    kind: str  # "topic", "namespace" or "broker"
    name: str | None

    def describe(self) -> str:
        if self.kind == "broker":
            return "broker default"
        if self.kind == "namespace":
            return "root namespace" if self.name == "" else f"namespace {self.name!r}"
        return f"topic {self.name!r}"

    def keywords(self) -> dict[str, str]:
        """The ``topic=`` / ``namespace=`` keyword of ``set_deduplication`` and ``set_policy``."""
        return {} if self.name is None else {self.kind: self.name}


def parse_admin_target(text: str | None) -> AdminTarget:
    """The target of ``set-deduplication``: a topic, or a namespace when it ends with ``/``.

    A topic's namespace is the part of its name before its last ``/`` (``tenant/ns/orders``
    is in namespace ``tenant/ns``, ``orders`` in the root namespace ``""``), as
    :func:`idempotent.core.types.namespace_of` defines. So ``tenant/ns/`` names the namespace
    ``tenant/ns``, ``/`` the root namespace, anything else a topic; None is the broker-wide
    default. Names follow :func:`idempotent.core.topics.canonical_topic` and
    :func:`~idempotent.core.topics.canonical_namespace`: ``persistent://public/default/orders``
    is the topic ``orders``, ``public/default/`` the root namespace.

    Raises:
        InvalidTopicError: the topic or namespace name is not valid.
    """
    if text is None:
        return AdminTarget("broker", None)
    if text == "/":
        return AdminTarget("namespace", "")
    if text.endswith("/"):
        try:
            name = canonical_namespace(text[:-1])
        except InvalidTopicError:
            raise InvalidTopicError(
                f"invalid namespace {text!r}: a namespace is a topic name prefix ending in '/', like 'tenant/ns/'"
            ) from None
        return AdminTarget("namespace", name)
    return AdminTarget("topic", canonical_topic(text))


def _policy_type(text: str) -> str:
    if text not in _POLICY_CHOICES:
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}: use strict, monotonic or clear")
    return text


def add_parser(commands: Subcommands) -> None:
    """Add ``idempotent admin`` and its verbs to the subcommands."""
    admin = commands.add_parser(
        "admin",
        help="deduplication settings and producer state of a broker",
        description="Change deduplication settings and inspect the checker state of a broker. "
        f"The broker is --url, else ${URL_ENV}: a broker server (idem://host:port) or a backend "
        "URL (sqlite:///..., kafka://..., pulsar://...). stats and describe-producers only read; "
        "on a backend URL they open it read-only, never taking a partition over from a running broker.",
    )
    admin.add_argument("--url", metavar="URL", help=f"the broker (default: ${URL_ENV})")
    verbs = admin.add_subparsers(dest="admin_command", metavar="ADMIN_COMMAND", required=True)

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", metavar="URL", default=argparse.SUPPRESS, help=f"the broker (default: ${URL_ENV})")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        add_connect_timeout(parser)

    dedup = verbs.add_parser(
        "set-deduplication",
        help="switch deduplication or set the sequence policy of a topic, a namespace, or the broker",
        description="Switch deduplication on or off, or set the sequence policy, for a topic, a "
        "namespace (a name ending in '/': 'tenant/ns/' is the namespace of 'tenant/ns/orders', "
        "'/' the root namespace of names without '/'), or with --broker the broker-wide default. "
        "The most specific setting applies: topic, then namespace, then broker, then the "
        "broker's configuration. --clear removes a setting so that the next level applies.",
    )
    dedup.add_argument("target", metavar="TOPIC|NAMESPACE/", nargs="?", help="a topic, or a namespace ending in '/'")
    dedup.add_argument("--broker", action="store_true", help="change the broker-wide default instead")
    switch = dedup.add_mutually_exclusive_group()
    switch.add_argument(
        "--enable", dest="dedup", action="store_const", const="enable", help="check duplicates and gaps"
    )
    switch.add_argument(
        "--disable",
        dest="dedup",
        action="store_const",
        const="disable",
        help="accept every well-formed batch (no duplicate or gap check)",
    )
    switch.add_argument("--clear", dest="dedup", action="store_const", const="clear", help="remove the setting")
    dedup.add_argument(
        "--policy",
        type=_policy_type,
        metavar="strict|monotonic|clear",
        help="sequence policy: strict (a gap is refused), monotonic (gaps allowed), clear (remove the setting)",
    )
    dedup.add_argument(
        "--allow-unknown",
        action="store_true",
        help="configure a topic that does not exist yet (it applies once the topic is created)",
    )
    common(dedup)
    dedup.set_defaults(handler=cmd_admin_set_deduplication)

    stats = verbs.add_parser(
        "stats",
        help="deduplication status, policy, producers and snapshot state of a topic",
        description="Show a topic's deduplication status and policy and, per partition: ready or "
        "recovering, log position, snapshot position and age, and every producer's id, name, "
        "epoch, last sequence and last offset.",
    )
    stats.add_argument("topic", metavar="TOPIC", type=topic_type)
    common(stats)
    stats.set_defaults(handler=cmd_admin_stats)

    producers = verbs.add_parser(
        "describe-producers",
        help="the producers a topic's partitions track",
        description="List the producers each partition of a topic tracks: id, name, epoch, last "
        "sequence, last offset and the time of its last stored record.",
    )
    producers.add_argument("topic", metavar="TOPIC", type=topic_type)
    producers.add_argument("--partition", metavar="P", type=int_type(0, "--partition"), help="only this partition")
    common(producers)
    producers.set_defaults(handler=cmd_admin_describe_producers)


def admin_url(args: argparse.Namespace) -> str:
    """The broker URL of an admin command: ``--url``, else ``$IDEMPOTENT_URL``.

    Raises:
        CliError: neither is set.
    """
    url: str | None = getattr(args, "url", None) or os.environ.get(URL_ENV)
    if not url:
        raise CliError(f"no broker URL: give --url URL or set {URL_ENV}")
    return url


def _require_database(url: str) -> None:
    """Refuse a ``sqlite://`` URL whose file does not exist (opening it would create it)."""
    if urlsplit(url).scheme == "sqlite":
        from idempotent.adapters.sqlite.backend import parse_sqlite_url

        path, _ = parse_sqlite_url(url)
        if not os.path.exists(path):
            raise CliError(f"no database file {path!r} (from {url})")


def open_admin(url: str, *, write: bool, connect_timeout: float | None = None) -> BrokerAPI:
    """The broker handle of an admin command.

    A broker server is connected to. A backend URL is opened in this process: read-only
    (:func:`open_read_only`) unless ``write``; a ``sqlite://`` file must exist either way.

    Raises:
        CliError: a missing sqlite file.
        ConfigError: bad URL.
        BackendUnavailableError: the broker or backend cannot be reached.
    """
    from .. import connect

    options = connect_options(url, connect_timeout)
    if urlsplit(url).scheme in SERVER_SCHEMES:
        return connect(url, **options)
    if not write:
        return open_read_only(url, connect_timeout)
    _require_database(url)
    return connect(url, BrokerConfig(auto_create_topics=False, maintenance_interval=0), **options)


def cmd_admin_set_deduplication(args: argparse.Namespace) -> int:
    """``idempotent admin set-deduplication``: change a deduplication or policy setting."""
    if args.broker and args.target is not None:
        raise CliError("give a TOPIC, a NAMESPACE/ or --broker, not both")
    if not args.broker and args.target is None:
        raise CliError("give a TOPIC, a NAMESPACE/ (ending in '/'), or --broker for the broker-wide default")
    if args.dedup is None and args.policy is None:
        raise CliError("nothing to change: give --enable, --disable or --clear, and/or --policy")
    target = parse_admin_target(args.target)
    url = admin_url(args)
    broker = open_admin(url, write=True, connect_timeout=args.connect_timeout)
    try:
        if target.kind == "topic" and not args.allow_unknown and target.name not in broker.topics():
            known = ", ".join(sorted(broker.topics())) or "none"
            raise CliError(
                f"unknown topic {target.name!r} in {broker.url} (topics: {known}); give --allow-unknown to "
                "configure a topic before it is created, or end a namespace with '/'"
            )
        changes: dict[str, str] = {}
        if args.dedup is not None:
            enabled = {"enable": True, "disable": False, "clear": None}[args.dedup]
            broker.set_deduplication(enabled, **target.keywords())
            changes["deduplication"] = {"enable": "enabled", "disable": "disabled", "clear": "cleared"}[args.dedup]
        if args.policy is not None:
            broker.set_policy(None if args.policy == "clear" else args.policy, **target.keywords())
            changes["policy"] = "cleared" if args.policy == "clear" else args.policy
    finally:
        broker.close()
    if args.json:
        print(json.dumps({"target": target.kind, "name": target.name, **changes}))
    else:
        text = ", ".join(f"{what} {how}" for what, how in changes.items())
        print(f"{target.describe()}: {text}")
    return 0


def cmd_admin_stats(args: argparse.Namespace) -> int:
    """``idempotent admin stats``: a topic's deduplication status and checker state."""
    validate_topic(args.topic)
    broker = open_admin(admin_url(args), write=False, connect_timeout=args.connect_timeout)
    try:
        count = partition_count(broker, args.topic)
        stats = broker.stats(args.topic)
    finally:
        broker.close()
    first = stats[0] if stats else None
    summary = {
        "topic": args.topic,
        "partitions": count,
        "deduplication": first.deduplication if first else None,
        "policy": first.policy if first else None,
        "ready": sum(1 for s in stats if s.status == "ready"),
        "recovering": sum(1 for s in stats if s.status == "recovering"),
    }
    if args.json:
        print(json.dumps({**summary, "partition_stats": [stats_dict(s) for s in stats]}, indent=2))
        return 0
    dedup = "on" if summary["deduplication"] else "off"
    print(
        f"topic {args.topic}: {count} partition(s), deduplication {dedup}, policy {summary['policy']}, "
        f"{summary['ready']} ready, {summary['recovering']} recovering"
    )
    for s in stats:
        print()
        print(format_stats(s))
    return 0


def producer_rows(stats: Sequence[PartitionStats], partition: int | None = None) -> list[dict[str, Any]]:
    """One row per producer and partition, as ``describe-producers`` prints them."""
    return [
        {
            "topic": s.topic,
            "partition": s.partition,
            "producer_id": p.producer_id,
            "producer_name": p.producer_name,
            "producer_epoch": p.producer_epoch,
            "last_sequence": p.last_sequence,
            "last_offset": p.last_offset,
            "last_timestamp": p.last_timestamp,
        }
        for s in stats
        if partition is None or s.partition == partition
        for p in s.producers
    ]


def cmd_admin_describe_producers(args: argparse.Namespace) -> int:
    """``idempotent admin describe-producers``: the producers each partition tracks."""
    validate_topic(args.topic)
    broker = open_admin(admin_url(args), write=False, connect_timeout=args.connect_timeout)
    try:
        count = partition_count(broker, args.topic)
        if args.partition is not None and args.partition >= count:
            raise CliError(f"topic {args.topic!r} has partitions 0..{count - 1}, not {args.partition}")
        rows = producer_rows(broker.stats(args.topic), args.partition)
    finally:
        broker.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        where = f"{args.topic}[{args.partition}]" if args.partition is not None else f"topic {args.topic}"
        print(f"no producers tracked on {where}")
        return 0
    header = ("PARTITION", "PRODUCER_ID", "NAME", "EPOCH", "LAST_SEQUENCE", "LAST_OFFSET", "LAST_TIMESTAMP")
    table = [
        (
            str(r["partition"]),
            str(r["producer_id"]),
            r["producer_name"] if r["producer_name"] is not None else "-",
            str(r["producer_epoch"]),
            str(r["last_sequence"]),
            str(r["last_offset"]),
            iso(r["last_timestamp"]),
        )
        for r in rows
    ]
    print("\n".join(format_table(header, table, left=frozenset({2, 6}))))
    return 0
