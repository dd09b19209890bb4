"""The deduplication switches and sequence policies in force on one broker.

:class:`BrokerSettings` keeps a copy of the settings stored in the backend's metadata half
(:class:`~idempotent.backend.MetadataStore`: ``load_settings``, ``save_setting``) and
answers per topic with the pure rules of :mod:`idempotent.core.settings` (topic, then namespace,
then broker, then the broker's config). A change made here is stored first, then applied; a
reload (:meth:`BrokerSettings.refresh`, every maintenance interval) adopts changes other
processes stored, unless a change was made here meanwhile.

A :class:`~idempotent.broker.broker.Broker` and a producer's own
:class:`~idempotent.broker.direct.DirectBroker` each keep theirs in one.

Lock: the lock given in (``Broker._lock``; a DirectBroker gives one of the settings' own) is
held around every change and around the backend call of ``set``; reads of the copy take no
lock (one dict read).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from idempotent.backend import MetadataStore
from idempotent.core.checker import Policy
from idempotent.core.settings import DEDUP, POLICY, deduplication_in_force, policy_in_force, setting_key
from idempotent.errors import ProducerError


class BrokerSettings:
    """The settings of one broker, cached from its backend.

    Args:
        store: the backend's metadata half.
        lock: the broker's lock.
        deduplication, policy: the broker's defaults (``BrokerConfig``).

    Raises:
        BackendUnavailableError: the settings could not be read.
    """

    def __init__(self, store: MetadataStore, lock: threading.RLock, deduplication: bool, policy: Policy) -> None:
        self._store = store
        self._lock = lock
        self._default_deduplication = deduplication
        self._default_policy = policy
        self._settings = dict(store.load_settings())
        #: changes made here (and replacements): a reload under way when one is made is dropped
        self._changes = 0

    def set(self, kind: str, value: str | None, topic: str | None, namespace: str | None) -> None:
        """Store a setting at one level (a topic, a namespace, or neither: the broker), then
        apply it; ``value`` None removes it.

        Raises:
            ConfigError: both a topic and a namespace.
            InvalidTopicError: a bad topic or namespace spelling.
            BackendUnavailableError: it could not be stored; nothing changed here.
        """
        key = setting_key(kind, topic, namespace)
        with self._lock:
            self._store.save_setting(key, value)
            self._changes += 1
            if value is None:
                self._settings.pop(key, None)
            else:
                self._settings[key] = value

    def clear_topic(self, topic: str) -> None:
        """Remove the topic-level settings of ``topic`` (a stored name), in the backend first (a
        deleted topic's switches must not apply to a topic created again under its name).

        Raises:
            BackendUnavailableError: one could not be removed; those removed before stay removed.
        """
        with self._lock:
            for kind in (DEDUP, POLICY):
                key = setting_key(kind, topic, None)
                if key in self._settings:
                    self._store.save_setting(key, None)
                    self._settings.pop(key, None)
                    self._changes += 1

    def refresh(self) -> bool:
        """Reload the settings from the backend (outside the lock: it may be a network call).

        Returns:
            False when the backend could not be read; the settings in force are kept.
        """
        return self.reload() is None

    def reload(self) -> ProducerError | None:
        """:meth:`refresh`, returning the error that kept the backend from being read (None
        when the settings were read)."""
        with self._lock:
            changes = self._changes
        try:
            loaded = dict(self._store.load_settings())
        except ProducerError as exc:
            return exc
        with self._lock:
            if changes == self._changes:  # else a change made here meanwhile is newer: keep it
                self._settings = loaded
        return None

    def replace(self, settings: Mapping[str, str]) -> None:
        """Use ``settings``, read from the backend just now (the broker became its writer)."""
        with self._lock:
            self._settings = dict(settings)
            self._changes += 1

    def deduplication(self, topic: str) -> bool:
        """Whether the checker rejects duplicates and gaps on ``topic`` (a stored name)."""
        return deduplication_in_force(self._settings, topic, self._default_deduplication)

    def policy(self, topic: str) -> Policy:
        """The sequence policy in force on ``topic`` (a stored name)."""
        return policy_in_force(self._settings, topic, self._default_policy)
