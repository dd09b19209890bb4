"""The framing of the broker wire protocol, without I/O (see ``docs/protocol.md``).

A connection carries *frames*: a 4-byte big-endian unsigned length ``N`` followed by ``N``
bytes of one MessagePack value, an array whose first element is the frame's kind
(:data:`REQUEST`, :data:`RESPONSE`, :data:`ERROR`). :class:`FrameDecoder` splits a byte
stream into frame bodies; :func:`frame`, :func:`pack`, :func:`encode_request` and
:func:`encode_response` make frames. Re-exported by :mod:`idempotent.core.protocol`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

import msgpack

#: Default largest frame body (bytes) either side accepts; the server announces its own.
DEFAULT_MAX_FRAME: Final = 16 * 1024 * 1024
#: Frame kinds (first element of every frame).
REQUEST: Final = 0
RESPONSE: Final = 1
ERROR: Final = 2

#: The length prefix of a frame.
LENGTH: Final = struct.Struct(">I")


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length."""
    return LENGTH.pack(len(body)) + body


def pack(value: Any) -> bytes:
    """One MessagePack value as a complete frame."""
    return frame(msgpack.packb(value, use_bin_type=True))


class FrameTooLarge(NamedTuple):
    """The peer announced a frame over the limit; the stream cannot be trusted any more."""

    length: int
    limit: int


class FrameDecoder:
    """Splits a byte stream into frame bodies. Feed it whatever arrives; it keeps partial frames.

    After a :class:`FrameTooLarge` event it yields nothing more (the connection must close).
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._broken = False

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes | FrameTooLarge]:
        """Add received bytes; return the frames completed by them, in order. ``data`` is
        not kept (a reader may pass a view of a buffer it reuses)."""
        if self._broken:
            return []
        if not self._buffer:  # nothing held back: split ``data`` itself, keep only its tail
            return self._split(data)
        buffer = self._buffer
        buffer += data
        out: list[bytes | FrameTooLarge] = []
        start = 0
        end = len(buffer)
        with memoryview(buffer) as view:  # one copy per frame (a bytearray slice would add one)
            while end - start >= 4:
                (length,) = LENGTH.unpack_from(buffer, start)
                if length > self.max_frame:
                    self._broken = True
                    out.append(FrameTooLarge(length, self.max_frame))
                    break
                if end - start - 4 < length:
                    break
                out.append(bytes(view[start + 4 : start + 4 + length]))
                start += 4 + length
        if self._broken:  # the view is released: the buffer may be resized again
            buffer.clear()
        elif start:
            del buffer[:start]
        return out

    def _split(self, data: bytes | bytearray | memoryview) -> list[bytes | FrameTooLarge]:
        out: list[bytes | FrameTooLarge] = []
        start = 0
        with memoryview(data) as view:
            end = len(view)
            while end - start >= 4:
                (length,) = LENGTH.unpack_from(view, start)
                if length > self.max_frame:
                    self._broken = True
                    out.append(FrameTooLarge(length, self.max_frame))
                    return out
                if end - start - 4 < length:
                    break
                out.append(bytes(view[start + 4 : start + 4 + length]))
                start += 4 + length
            if start < end:
                self._buffer += view[start:]
        return out


def encode_request(correlation_id: int, op: str, args: Mapping[str, Any]) -> bytes:
    """A complete request frame."""
    return pack([REQUEST, correlation_id, op, dict(args)])


def encode_response(correlation_id: int, result: Mapping[str, Any]) -> bytes:
    """A complete response frame."""
    return pack([RESPONSE, correlation_id, dict(result)])


__all__ = [
    "DEFAULT_MAX_FRAME",
    "ERROR",
    "LENGTH",
    "REQUEST",
    "RESPONSE",
    "FrameDecoder",
    "FrameTooLarge",
    "encode_request",
    "encode_response",
    "frame",
    "pack",
]
