"""The one topic naming rule of the project: every spelling of a topic maps to one stored name.

Every entry point that takes a topic (the broker, the broker server, :class:`Producer`,
:class:`Reader`, the command line, the Kafka and Pulsar drop-ins) passes it through
:func:`canonical_topic`, so that all of them accept the same spellings and mean the same
topic by them:

============================================  =========================
spelling                                      stored as
============================================  =========================
``orders``                                    ``orders``
``tenant/ns/orders`` (any depth of ``/``)     ``tenant/ns/orders``
``persistent://tenant/ns/orders``             ``tenant/ns/orders``
``public/default/orders``                     ``orders``
``persistent://public/default/orders``        ``orders``
============================================  =========================

Pulsar's default namespace ``public/default`` *is* the root namespace (``""``, the namespace
of names without ``/``), so a Pulsar short name (``orders``, which Pulsar reads as
``persistent://public/default/orders``) and a plain name of this project are the same topic.
:func:`canonical_namespace` applies the same rule to namespaces.

A stored name is 1-249 characters from ``A-Z a-z 0-9 . _ - /``, does not start with
``/`` and has no ``//``. ``non-persistent://`` and every other ``scheme://`` are refused: the
project stores every record.

Pure: no I/O. The result is cached, so calling it per record costs a dictionary lookup.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from idempotent.errors import InvalidTopicError

#: The scheme prefix of Pulsar's full topic names.
PERSISTENT: Final = "persistent://"
#: Pulsar's default namespace, which is this project's root namespace.
PULSAR_DEFAULT_NAMESPACE: Final = "public/default"
MAX_TOPIC_LENGTH: Final = 249

_NAME_RE = re.compile(r"^[A-Za-z0-9._\-/]{1,249}$")
_SPELLINGS = "'name', 'ns/name' or 'persistent://tenant/ns/name'"


def canonical_topic(topic: str) -> str:
    """The stored name of ``topic``, from any accepted spelling (see the module docstring).

    Raises:
        InvalidTopicError: not a str, or not a valid spelling of a topic name.
    """
    if not isinstance(topic, str):
        raise InvalidTopicError(f"invalid topic name {topic!r}: a topic name is a str")
    return _canonical(topic)


@functools.lru_cache(maxsize=4096)
def _canonical(topic: str) -> str:
    name = topic
    if "://" in topic:
        scheme, _, name = topic.partition("://")
        if scheme == "non-persistent":
            raise InvalidTopicError(f"invalid topic name {topic!r}: non-persistent topics are not supported")
        if scheme + "://" != PERSISTENT or name.count("/") != 2:
            raise InvalidTopicError(f"invalid topic name {topic!r}: use {_SPELLINGS}")
    head, sep, tail = name.rpartition("/")
    if sep and head == PULSAR_DEFAULT_NAMESPACE:
        name = tail
    if not _NAME_RE.match(name) or name.startswith("/") or "//" in name:
        raise InvalidTopicError(
            f"invalid topic name {topic!r}: use {_SPELLINGS}, with 1-{MAX_TOPIC_LENGTH} characters from "
            "letters, digits, '.', '_', '-', '/'"
        )
    return name


def canonical_namespace(namespace: str) -> str:
    """The stored name of a namespace: ``public/default`` is the root namespace ``""``.

    Raises:
        InvalidTopicError: not a valid namespace name (a topic name prefix, or ``""``).
    """
    if namespace == "" or namespace == PULSAR_DEFAULT_NAMESPACE:
        return ""
    if not isinstance(namespace, str):
        raise InvalidTopicError(f"invalid namespace {namespace!r}: a namespace is a str")
    try:
        return canonical_topic(namespace + "/x").rpartition("/")[0]
    except InvalidTopicError:
        raise InvalidTopicError(
            f"invalid namespace {namespace!r}: a namespace is a topic name prefix like 'tenant/ns'"
        ) from None
