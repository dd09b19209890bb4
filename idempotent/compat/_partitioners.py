"""librdkafka's built-in partitioners, for the confluent-kafka drop-in.

Each maps a key to a partition exactly as librdkafka's ``partitioner`` setting of the same
name does (``consistent``: CRC32; ``murmur2``: the Java client's murmur2, so keyed records
land where Kafka's Java producer puts them; ``fnv1a``: Sarama's FNV-1a), so that a topic fed by
the drop-in and by native clients keeps one key on one partition.
"""

from __future__ import annotations

import zlib

_MASK = 0xFFFFFFFF


def _check(key: object, partition_count: object) -> None:
    if not isinstance(key, bytes | bytearray):
        raise TypeError(f"key must be bytes, not {type(key).__name__}")
    if not isinstance(partition_count, int) or isinstance(partition_count, bool):
        raise TypeError(f"partition_count must be int, not {type(partition_count).__name__}")
    if partition_count <= 0:
        raise ValueError("partition_count must be > 0")


def murmur2_hash(data: bytes) -> int:
    """The 32-bit murmur2 hash of Kafka's Java client (seed ``0x9747b28c``), unsigned."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & _MASK
        k ^= k >> 24
        k = (k * m) & _MASK
        h = ((h * m) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[whole + 2] << 16
    if rest >= 2:
        h ^= data[whole + 1] << 8
    if rest >= 1:
        h ^= data[whole]
        h = (h * m) & _MASK
    h ^= h >> 13
    h = (h * m) & _MASK
    h ^= h >> 15
    return h


def fnv1a_hash(data: bytes) -> int:
    """librdkafka's FNV-1a: 32-bit, then the absolute value of it as a signed int, unsigned."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & _MASK
    if h >= 2**31:  # negative as int32: take the absolute value (INT32_MIN stays itself)
        h = (2**32 - h) & _MASK
    return h


def consistent(key: bytes, partition_count: int) -> int:
    """CRC32 of the key modulo the partition count (librdkafka's ``consistent``).

    Raises:
        TypeError: key not bytes, or partition_count not int.
        ValueError: partition_count is not positive.
    """
    _check(key, partition_count)
    return zlib.crc32(key) % partition_count


def murmur2(key: bytes, partition_count: int) -> int:
    """Kafka's murmur2 of the key, positive, modulo the partition count (``murmur2``).

    Raises:
        TypeError: key not bytes, or partition_count not int.
        ValueError: partition_count is not positive.
    """
    _check(key, partition_count)
    return (murmur2_hash(bytes(key)) & 0x7FFFFFFF) % partition_count


def fnv1a(key: bytes, partition_count: int) -> int:
    """FNV-1a of the key modulo the partition count (librdkafka's ``fnv1a``).

    Raises:
        TypeError: key not bytes, or partition_count not int.
        ValueError: partition_count is not positive.
    """
    _check(key, partition_count)
    return fnv1a_hash(bytes(key)) % partition_count
