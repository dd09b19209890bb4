"""Deduplication and policy settings: how they are keyed and which one is in force.

Settings are stored by the backend as plain ``key -> value`` strings, one level each: a
topic (``dedup:topic:orders``), a namespace (``dedup:ns:tenant/ns``) or the broker
(``dedup:broker``); the same for ``policy``. The most specific level set wins. Every broker
handle (the shared :class:`~idempotent.broker.broker.Broker` and a producer's own
:class:`~idempotent.broker.direct.DirectBroker`) reads them the same way, from here. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from idempotent.core.checker import Policy
from idempotent.core.topics import canonical_namespace, canonical_topic
from idempotent.core.types import namespace_of
from idempotent.errors import ConfigError

#: the kinds of settings
DEDUP = "dedup"
POLICY = "policy"


def setting_key(kind: str, topic: str | None, namespace: str | None) -> str:
    """The stored key of a setting at one level (a topic, a namespace, or neither: the broker).

    Raises:
        ConfigError: both a topic and a namespace.
        InvalidTopicError: a bad topic or namespace spelling.
    """
    if topic is not None and namespace is not None:
        raise ConfigError("give a topic or a namespace, not both")
    if topic is not None:
        return f"{kind}:topic:{canonical_topic(topic)}"
    if namespace is not None:
        return f"{kind}:ns:{canonical_namespace(namespace)}"
    return f"{kind}:broker"


def resolve(settings: Mapping[str, str], kind: str, topic: str) -> str | None:
    """The setting ``kind`` in force on ``topic`` (a stored name): topic, namespace, broker."""
    for key in (f"{kind}:topic:{topic}", f"{kind}:ns:{namespace_of(topic)}", f"{kind}:broker"):
        value = settings.get(key)
        if value is not None:
            return value
    return None


def deduplication_in_force(settings: Mapping[str, str], topic: str, default: bool) -> bool:
    """Whether the checker rejects duplicates and gaps on ``topic`` (a stored name)."""
    value = resolve(settings, DEDUP, topic)
    return default if value is None else value == "1"


def policy_in_force(settings: Mapping[str, str], topic: str, default: Policy) -> Policy:
    """The sequence policy in force on ``topic`` (a stored name)."""
    value = resolve(settings, POLICY, topic)
    return default if value is None else Policy(value)


def policy_value(policy: Policy | str | None) -> str | None:
    """The stored value of a policy setting (None clears it).

    Raises:
        ConfigError: unknown policy.
    """
    if policy is None:
        return None
    try:
        return Policy(policy).value
    except ValueError:
        raise ConfigError(f"unknown policy {policy!r}: use 'strict' or 'monotonic'") from None


def dedup_value(enabled: bool | None) -> str | None:
    """The stored value of a deduplication setting (None clears it)."""
    return None if enabled is None else ("1" if enabled else "0")


__all__ = [
    "DEDUP",
    "POLICY",
    "dedup_value",
    "deduplication_in_force",
    "policy_in_force",
    "policy_value",
    "resolve",
    "setting_key",
]
