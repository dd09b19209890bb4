"""Brokers shared by the drop-in producers of one process.

An application written for confluent-kafka or pulsar-client may create several producers (or
clients) with the same broker URL and never close them. Opening one broker per producer would
fail for ``sqlite://`` (one writer per file) and waste resources elsewhere, so producers opened
from the same URL in one process share one broker, which is closed when the last of them is
closed (or garbage collected).

It also passes the rest of the native modules through: names and submodules that the drop-ins
do not replace come from the installed ``confluent_kafka`` or ``pulsar``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

from ..api import BrokerAPI

_LOCK = threading.Lock()
_BROKERS: dict[tuple[str, str], tuple[BrokerAPI, int]] = {}


def _key(url: str, options: Mapping[str, Any] | None) -> tuple[str, str]:
    """Producers share a broker when they name the same URL with the same backend options
    (options holding objects, such as a Pulsar ``authentication``, match only themselves)."""
    return url, repr(sorted((options or {}).items()))


def acquire(url: str, options: Mapping[str, Any] | None = None) -> BrokerAPI:
    """Return the process's broker for ``url`` (opened with the backend ``options``, keyword
    arguments of :func:`idempotent.connect`), opening it on first use.

    Raises:
        ConfigError: bad URL or option (nothing opened).
        BackendUnavailableError: the backend could not be opened.
    """
    from ..connection import connect

    key = _key(url, options)
    with _LOCK:
        entry = _BROKERS.get(key)
        if entry is None:
            broker = connect(url, **(options or {}))
            _BROKERS[key] = (broker, 1)
            return broker
        _BROKERS[key] = (entry[0], entry[1] + 1)
        return entry[0]


def release(url: str, options: Mapping[str, Any] | None = None) -> None:
    """Give back one reference; the broker is closed when the last one is returned."""
    key = _key(url, options)
    with _LOCK:
        entry = _BROKERS.get(key)
        if entry is None:
            return
        broker, refs = entry
        if refs > 1:
            _BROKERS[key] = (broker, refs - 1)
            return
        del _BROKERS[key]
    broker.close()


# -- passed-through producers -------------------------------------------------------------------

_WARNED: set[str] = set()


def warn_passed_through(logger: str, name: str, package: str) -> None:
    """A WARNING on ``logger``, once per process, that ``name`` is a native producer class
    passed through, which gives no exactly-once (docs/migration.md lists them)."""
    import logging

    with _LOCK:
        if name in _WARNED:
            return
        _WARNED.add(name)
    logging.getLogger(logger).warning(
        "%s is %s's own producer, passed through: the records it sends are not stored exactly once "
        "(docs/migration.md, 'Passed through: no exactly-once')",
        name,
        package,
    )


# -- the rest of the native modules ------------------------------------------------------------

#: the extra of this project that installs each native module
EXTRAS = {"confluent_kafka": "kafka", "pulsar": "pulsar"}


def missing_native(native_name: str, what: str) -> ImportError:
    """The error for ``what`` (a feature, a name or a submodule), which needs the native
    module ``native_name`` when it is not installed: an ImportError naming the extra."""
    top = native_name.split(".", 1)[0]
    package = top.replace("_", "-") if top != "pulsar" else "pulsar-client"
    extra = EXTRAS.get(top, top)
    return ImportError(f"{what} needs {package}, which is not installed: pip install 'idempotent[{extra}]'", name=top)


def native(name: str) -> types.ModuleType | None:
    """The installed native module ``name`` (``confluent_kafka``, ``pulsar``), or None when it
    is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def passed_through(native_module: str, name: str) -> Any:
    """``name`` of the installed native module ``native_module`` (``confluent_kafka.aio``,
    ``pulsar.asyncio``), for the ``__getattr__`` of a drop-in module that replaces part of it.

    Raises:
        AttributeError: a name that starts with ``__``, or one the native module does not have.
        ImportError: the native module is not installed (the message names the extra).
    """
    if name.startswith("__"):
        raise AttributeError(name)
    module = native(native_module)
    if module is None:
        raise missing_native(native_module, f"{native_module}.{name} (passed through)")
    return getattr(module, name)


class _Alias(importlib.abc.Loader):
    """Loads a submodule of a drop-in as the native module's submodule itself."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _RoutedModule(types.ModuleType):
    """A drop-in's submodule that reads every name from the native submodule through
    ``route`` (which gives client classes the project's logger, see
    :mod:`idempotent.runtime.native_logs`)."""

    def __init__(self, name: str, native_module: types.ModuleType, route: Callable[[Any], Any]) -> None:
        super().__init__(name, native_module.__doc__)
        self._native_module = native_module
        self._route = route
        for attribute in ("__all__", "__file__"):
            if hasattr(native_module, attribute):
                setattr(self, attribute, getattr(native_module, attribute))
        if hasattr(native_module, "__path__"):  # a package: its submodules pass through too
            self.__path__: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._route(getattr(self._native_module, name))

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._native_module)))


class _Passthrough(importlib.abc.MetaPathFinder):
    """Resolves ``<drop-in>.<sub>`` (``idempotent.compat.confluent_kafka.admin``) to the
    native ``<native>.<sub>`` (``confluent_kafka.admin``), so that an application's
    ``from confluent_kafka.admin import AdminClient`` keeps working once its import line
    names the drop-in."""

    def __init__(
        self,
        drop_in: str,
        native_name: str,
        route: Callable[[Any], Any] | None = None,
        own: Mapping[str, str] | None = None,
    ) -> None:
        self._prefix = drop_in + "."
        self._native = native_name
        self._route = route
        #: submodules the drop-in has its own module for (``aio``: its asyncio producer)
        self._own = dict(own or {})

    def find_spec(
        self, fullname: str, path: object = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self._prefix):
            return None
        sub = fullname[len(self._prefix) :]
        if sub in self._own:
            own = importlib.import_module(self._own[sub])
            return importlib.machinery.ModuleSpec(fullname, _Alias(own))
        try:
            module = importlib.import_module(self._native + "." + sub)
        except ImportError:
            if not sub.startswith("_") and native(self._native) is None:
                raise missing_native(self._native, f"{fullname} (passed through from {self._native}.{sub})") from None
            return None
        if self._route is not None:
            module = _RoutedModule(fullname, module, self._route)
        return importlib.machinery.ModuleSpec(fullname, _Alias(module))


def pass_through_submodules(
    drop_in: str, native_name: str, route: Callable[[Any], Any] | None = None, own: Mapping[str, str] | None = None
) -> None:
    """Let ``import <drop_in>.<sub>`` import ``<native_name>.<sub>`` (once per drop-in); with
    ``route``, every name of such a submodule is read through it (see :class:`_RoutedModule`).
    ``own`` maps submodules the drop-in replaces (``"aio"``) to its own modules."""
    with _LOCK:
        for finder in sys.meta_path:
            if isinstance(finder, _Passthrough) and finder._prefix == drop_in + ".":
                return
        sys.meta_path.append(_Passthrough(drop_in, native_name, route, own))


def native_attribute(drop_in: str, native_name: str, name: str, route: Callable[[Any], Any] | None = None) -> Any:
    """``name`` from the installed native module, for a drop-in module's ``__getattr__``;
    through ``route`` when given (the drop-ins give client classes the project's logger,
    see :mod:`idempotent.runtime.native_logs`).

    Raises:
        ImportError: the native module is not installed (the message names the extra that
            installs it); AttributeError instead for a name that starts with ``_``.
        AttributeError: the native module has no such name.
    """
    if name.startswith("__"):
        raise AttributeError(name)
    module = native(native_name)
    if module is None:
        missing = missing_native(
            native_name, f"{native_name}.{name} (passed through: {drop_in} itself covers producing only)"
        )
        if name.startswith("_"):  # what tools probe for (hasattr), not an application's name
            raise AttributeError(str(missing))
        raise missing
    try:
        value = getattr(module, name)
    except AttributeError:
        raise AttributeError(
            f"module {native_name!r} (passed through by {drop_in}) has no attribute {name!r}"
        ) from None
    return value if route is None else route(value)
