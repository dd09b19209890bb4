"""pulsar-client's consumers and readers as the drop-in passes them through on a Pulsar URL,
with messages that show the properties the application set.

On a Pulsar service URL, ``Client.subscribe`` and ``Client.create_reader`` (and their asyncio
forms) return pulsar-client's own ``Consumer`` and ``Reader``. The Pulsar backend stores, with
the first message of each batch, the batch's identity as properties (``idem.pid``,
``idem.epoch``, ``idem.seq``, ``idem.count``), and sometimes ``idem.headers`` or ``idem.key``
(see :mod:`idempotent.adapters.pulsar.messages`). The messages these consumers and readers hand
out (``receive``, ``batch_receive``, ``read_next``, and the ``message_listener`` and
``reader_listener`` callbacks) are pulsar-client's ``Message`` objects whose ``properties()``
leaves those out, so a message sent through the drop-in reads back through the drop-in with the
properties its application gave it. Everything else about them (``data()``, ``message_id()``,
acknowledging them) is pulsar-client's.

Cost: a class is set on each message handed out (no copy, nothing else per message);
``properties()`` filters only when asked. pulsar-client's own consumers, and other Pulsar
clients, still see the ``idem.*`` properties (docs/migration.md, "What plain consumers see").
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.cache
def _classes() -> dict[type, type]:
    """pulsar-client's ``Message``, ``Consumer`` and ``Reader`` (and the asyncio ``Consumer``
    and ``Reader``, where pulsar-client has them), each mapped to the subclass the drop-in
    hands out; made once, when first needed."""
    import pulsar

    from idempotent.adapters.pulsar.messages import application_properties

    class Message(pulsar.Message):  # type: ignore[misc]
        __doc__ = pulsar.Message.__doc__

        def properties(self) -> dict[str, str]:
            """The properties the application set (without the drop-in's ``idem.*`` ones)."""
            return application_properties(super().properties())

    def handed(message: Any) -> Any:
        message.__class__ = Message
        return message

    class Consumer(pulsar.Consumer):  # type: ignore[misc]
        __doc__ = pulsar.Consumer.__doc__

        def receive(self, timeout_millis: int | None = None) -> Any:
            return handed(super().receive(timeout_millis))

        def batch_receive(self) -> list[Any]:
            return [handed(message) for message in super().batch_receive()]

    class Reader(pulsar.Reader):  # type: ignore[misc]
        __doc__ = pulsar.Reader.__doc__

        def read_next(self, timeout_millis: int | None = None) -> Any:
            return handed(super().read_next(timeout_millis))

    made: dict[type, type] = {pulsar.Message: Message, pulsar.Consumer: Consumer, pulsar.Reader: Reader}
    try:
        import pulsar.asyncio as native_asyncio
    except ImportError:  # a pulsar-client without asyncio classes
        native_asyncio = None
    if native_asyncio is not None:

        class AsyncConsumer(native_asyncio.Consumer):  # type: ignore[misc]
            __doc__ = native_asyncio.Consumer.__doc__

            async def receive(self) -> Any:
                return handed(await super().receive())

        class AsyncReader(native_asyncio.Reader):  # type: ignore[misc]
            __doc__ = native_asyncio.Reader.__doc__

            async def read_next(self) -> Any:
                return handed(await super().read_next())

        made[native_asyncio.Consumer] = AsyncConsumer
        made[native_asyncio.Reader] = AsyncReader
    for native, subclass in made.items():
        subclass.__name__, subclass.__qualname__, subclass.__module__ = (
            native.__name__,
            native.__qualname__,
            native.__module__,
        )
    return made


def shown(value: Any) -> Any:
    """``value`` as the drop-in hands it out: a pulsar-client ``Message`` whose
    ``properties()`` leave out the ``idem.*`` ones, or a ``Consumer`` or ``Reader`` (or an
    asyncio one) whose messages are so. The same object, its class set to the drop-in's
    subclass of its pulsar-client class; an object of another class is returned untouched."""
    subclass = _classes().get(type(value))
    if subclass is not None:
        value.__class__ = subclass
    return value


def listening(listener: Any) -> Any:
    """A ``message_listener`` or ``reader_listener`` for pulsar-client that calls ``listener``
    with the message as the drop-in hands it out (None stays None)."""
    if listener is None:
        return None

    def called(source: Any, message: Any) -> Any:
        return listener(source, shown(message))

    return called


def subscribed(subscribe: Any, *args: Any, **kwargs: Any) -> Any:
    """Call pulsar-client's ``Client.subscribe`` (or its asyncio form) with its
    ``message_listener``, wherever it is given, wrapped by :func:`listening`.

    Raises:
        TypeError: the arguments do not fit ``subscribe``'s signature (as pulsar-client says).
        pulsar.PulsarException, ValueError: as pulsar-client raises them.
    """
    bound = inspect.signature(subscribe).bind(*args, **kwargs)
    if bound.arguments.get("message_listener") is not None:
        bound.arguments["message_listener"] = listening(bound.arguments["message_listener"])
    return subscribe(*bound.args, **bound.kwargs)
