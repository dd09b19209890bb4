"""The native clients' partitioners, for the drop-ins.

librdkafka's built-in partitioners for the confluent-kafka drop-in: each maps a key to a
partition exactly as librdkafka's ``partitioner`` setting of the same name does
(``consistent``: CRC32; ``murmur2``: the Java client's murmur2, so keyed records land where
Kafka's Java producer puts them; ``fnv1a``: Sarama's FNV-1a), and :func:`librdkafka_partition`
applies librdkafka's rules for messages without a key. pulsar-client's default routing of
keyed messages for the pulsar drop-in: :func:`pulsar_partition`. So a topic fed by a drop-in
and by native clients keeps one key on one partition.
"""

from __future__ import annotations

import zlib

_MASK = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF

#: librdkafka's ``partitioner`` values
PARTITIONERS = ("consistent_random", "consistent", "random", "murmur2", "murmur2_random", "fnv1a", "fnv1a_random")


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


def librdkafka_partition(partitioner: str, key: bytes | None, partition_count: int) -> int | None:
    """The partition librdkafka's ``partitioner`` gives a message with ``key`` when the
    application names none, or None when librdkafka picks one at random instead: always for
    ``random``; for a message without a key (``key`` None) with ``murmur2_random`` and
    ``fnv1a_random``; for one without a key or with an empty key with ``consistent_random``.
    ``consistent``, ``murmur2`` and ``fnv1a`` hash a missing key as an empty one (so all such
    messages go to one partition), as librdkafka does.

    Raises:
        ValueError: an unknown partitioner.
    """
    if partitioner not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {partitioner!r}")
    if (
        partitioner == "random"
        or (key is None and partitioner in ("murmur2_random", "fnv1a_random"))
        or (not key and partitioner == "consistent_random")
    ):
        return None
    data = key or b""
    if partitioner.startswith("murmur2"):
        return (murmur2_hash(data) & 0x7FFFFFFF) % partition_count
    if partitioner.startswith("fnv1a"):
        return fnv1a_hash(data) % partition_count
    return zlib.crc32(data) % partition_count


def librdkafka_sticky(partitioner: str, key: bytes | None, linger: float) -> bool:
    """Whether librdkafka gives a message it partitions at random (see
    :func:`librdkafka_partition`) its topic's *sticky* partition, one random partition kept
    for ``sticky.partitioning.linger.ms``, rather than a random partition of its own: for a
    message without a key (or with an empty one under ``consistent_random``) when the linger
    (``linger``, in any unit) is positive."""
    return linger > 0 and (key is None or (not key and partitioner == "consistent_random"))


def _mulx(x: int, y: int) -> int:
    product = x * y
    return (product & _MASK64) ^ (product >> 64)


def boost_string_hash(data: bytes) -> int:
    """``boost::hash<std::string>`` of Boost 1.81 and later on a 64-bit platform (the hash
    pulsar-client's C++ library routes keyed messages with by default), unsigned 64-bit."""
    q, k = 0x9E3779B97F4A7C15, 0xDF442D22CE4859B9
    n, at = len(data), 0
    w = _mulx(q, k)  # the seed is 0
    h = w ^ n
    while n >= 8:
        w = (w + q) & _MASK64
        h ^= _mulx((int.from_bytes(data[at : at + 8], "little") + w) & _MASK64, k)
        at, n = at + 8, n - 8
    if n >= 4:
        low = int.from_bytes(data[at : at + 4], "little")
        high = int.from_bytes(data[at + n - 4 : at + n], "little")
        last = high << ((n - 4) * 8) | low
    elif n >= 1:
        x1, x2 = (n - 1) & 2, n >> 1
        last = data[at + x1] << (x1 * 8) | data[at + x2] << (x2 * 8) | data[at]
    else:
        last = 0
    w = (w + q) & _MASK64
    h ^= _mulx((last + w) & _MASK64, k)
    return _mulx((h + w) & _MASK64, k)


def pulsar_partition(partition_key: str | None, partition_count: int) -> int | None:
    """The partition pulsar-client's default routing (``RoundRobinDistribution`` with the
    C++ library's default ``BoostHash``) gives a message with ``partition_key``, or None when
    it has no key (None or empty: pulsar-client sets no key then), which routing spreads round
    robin instead. A topic of one partition (or not partitioned) always gets 0.

    Raises:
        ValueError: partition_count is not positive.
    """
    if partition_count <= 0:
        raise ValueError("partition_count must be > 0")
    if partition_count == 1:
        return 0
    if not partition_key:
        return None
    return (boost_string_hash(partition_key.encode()) & 0x7FFFFFFF) % partition_count
