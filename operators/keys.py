"""Batches of keys as the routing core sees them, and the hashes every scheme derives from them.

A key is a byte string (what a Kafka record carries). A :class:`KeyBatch` stores ``n`` keys the
way Arrow stores a binary column: one flat ``uint8`` buffer and ``n + 1`` offsets, so compiled
code can hash millions of keys without touching Python objects.

Hashing is MurmurHash3 x64 128-bit over the key bytes, keeping the first 64 bits as a signed
little-endian integer -- exactly ``mmh3.hash64(key, seed, signed=True)[0]`` and Guava's
``Hashing.murmur3_128(seed).hashBytes(key).asLong()``, which is what the PKG authors' code and
Storm's original ``PartialKeyGrouping`` used (seeds 13 and 17). Hashes are memoized per seed,
so a scheme that asks twice pays once.

Example:
    >>> batch = KeyBatch.from_strings(["apple", "pear"])
    >>> import mmh3
    >>> int(batch.hash64(13)[0]) == mmh3.hash64(b"apple", 13, signed=True)[0]
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numba
import numpy as np

_C1 = np.uint64(0x87C37B91114253D5)
_C2 = np.uint64(0x4CF5AD432745937F)
_FMIX1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX2 = np.uint64(0xC4CEB9FE1A85EC53)

#: Seed of the fingerprint that identifies a key in routing tables and sketches. 64 bits keep
#: collisions negligible (about n^2 / 2^65: 3e-6 for 10^7 distinct keys).
KEY_ID_SEED = 0


@numba.njit(inline="always")
def _rotl64(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@numba.njit(inline="always")
def _fmix64(k: np.uint64) -> np.uint64:
    k ^= k >> np.uint64(33)
    k *= _FMIX1
    k ^= k >> np.uint64(33)
    k *= _FMIX2
    k ^= k >> np.uint64(33)
    return k


@numba.njit(inline="always")
def _read_u64(data: np.ndarray, pos: int) -> np.uint64:
    value = np.uint64(0)
    for j in range(8):
        value |= np.uint64(data[pos + j]) << np.uint64(8 * j)
    return value


@numba.njit
def murmur3_x64_128_low(data: np.ndarray, start: int, end: int, seed: int) -> np.int64:
    """First 64 bits of MurmurHash3_x64_128(data[start:end], seed), as a signed integer."""
    length = end - start
    nblocks = length // 16
    h1 = np.uint64(seed & 0xFFFFFFFF)
    h2 = h1
    for i in range(nblocks):
        k1 = _read_u64(data, start + 16 * i)
        k2 = _read_u64(data, start + 16 * i + 8)
        k1 *= _C1
        k1 = _rotl64(k1, 31)
        k1 *= _C2
        h1 ^= k1
        h1 = _rotl64(h1, 27)
        h1 += h2
        h1 = h1 * np.uint64(5) + np.uint64(0x52DCE729)
        k2 *= _C2
        k2 = _rotl64(k2, 33)
        k2 *= _C1
        h2 ^= k2
        h2 = _rotl64(h2, 31)
        h2 += h1
        h2 = h2 * np.uint64(5) + np.uint64(0x38495AB5)
    tail = start + 16 * nblocks
    remainder = length & 15
    if remainder > 8:
        k2 = np.uint64(0)
        for j in range(remainder - 1, 7, -1):
            k2 ^= np.uint64(data[tail + j]) << np.uint64(8 * (j - 8))
        k2 *= _C2
        k2 = _rotl64(k2, 33)
        k2 *= _C1
        h2 ^= k2
    if remainder > 0:
        k1 = np.uint64(0)
        for j in range(min(remainder, 8) - 1, -1, -1):
            k1 ^= np.uint64(data[tail + j]) << np.uint64(8 * j)
        k1 *= _C1
        k1 = _rotl64(k1, 31)
        k1 *= _C2
        h1 ^= k1
    h1 ^= np.uint64(length)
    h2 ^= np.uint64(length)
    h1 += h2
    h2 += h1
    h1 = _fmix64(h1)
    h2 = _fmix64(h2)
    h1 += h2
    return np.int64(h1)


@numba.njit(cache=True)
def _hash_batch(data: np.ndarray, offsets: np.ndarray, seed: int) -> np.ndarray:
    n = offsets.shape[0] - 1
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        out[i] = murmur3_x64_128_low(data, offsets[i], offsets[i + 1], seed)
    return out


@numba.njit(cache=True)
def _decimal_lengths(values: np.ndarray) -> np.ndarray:
    lengths = np.empty(values.shape[0] + 1, dtype=np.int64)
    lengths[0] = 0
    for i in range(values.shape[0]):
        v = values[i]
        digits = 1 if v >= 0 else 2
        v = abs(v)
        while v >= 10:
            v //= 10
            digits += 1
        lengths[i + 1] = lengths[i] + digits
    return lengths


@numba.njit(cache=True)
def _decimal_encode(values: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    for i in range(values.shape[0]):
        v = values[i]
        end = offsets[i + 1]
        pos = end - 1
        negative = v < 0
        v = abs(v)
        while True:
            out[pos] = 48 + v % 10
            v //= 10
            pos -= 1
            if v == 0:
                break
        if negative:
            out[pos] = 45


class KeyBatch:
    """``n`` byte-string keys in one flat buffer; hashes are computed lazily and memoized.

    Build one with :meth:`from_bytes`, :meth:`from_strings` or :meth:`from_ints` (integer keys
    become their decimal ASCII text, so key 42 hashes exactly like the string ``"42"`` would in
    Storm or in the live pipeline).
    """

    __slots__ = ("_hashes", "data", "offsets")

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        if data.dtype != np.uint8 or offsets.dtype != np.int64:
            raise TypeError("KeyBatch needs uint8 data and int64 offsets")
        if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0:
            raise ValueError("offsets must be 1-D, start at 0 and hold n + 1 entries")
        self.data = data
        self.offsets = offsets
        self._hashes: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    def __getitem__(self, index: int) -> bytes:
        return self.data[self.offsets[index] : self.offsets[index + 1]].tobytes()

    def __repr__(self) -> str:
        return f"KeyBatch(n={len(self)}, bytes={self.data.shape[0]})"

    @classmethod
    def from_bytes(cls, keys: Sequence[bytes] | Iterable[bytes]) -> KeyBatch:
        keys = list(keys)
        lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
        offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.frombuffer(b"".join(keys), dtype=np.uint8).copy()
        return cls(data, offsets)

    @classmethod
    def from_strings(cls, keys: Iterable[str]) -> KeyBatch:
        return cls.from_bytes([k.encode("utf-8") for k in keys])

    @classmethod
    def from_ints(cls, keys: np.ndarray) -> KeyBatch:
        values = np.ascontiguousarray(keys, dtype=np.int64)
        offsets = _decimal_lengths(values)
        data = np.empty(offsets[-1], dtype=np.uint8)
        _decimal_encode(values, offsets, data)
        return cls(data, offsets)

    def slice(self, start: int, stop: int) -> KeyBatch:
        """Keys ``start:stop`` as a new batch sharing this one's buffer (hashes are sliced too)."""
        base = self.offsets[start]
        part = KeyBatch(self.data[base : self.offsets[stop]], self.offsets[start : stop + 1] - base)
        for seed, hashes in self._hashes.items():
            part._hashes[seed] = hashes[start:stop]
        return part

    def take(self, index: np.ndarray) -> KeyBatch:
        """The keys at ``index`` (in that order), e.g. the records one source receives."""
        index = np.asarray(index, dtype=np.int64)
        lengths = self.offsets[index + 1] - self.offsets[index]
        offsets = np.zeros(index.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.empty(offsets[-1], dtype=np.uint8)
        _gather(self.data, self.offsets, index, offsets, data)
        part = KeyBatch(data, offsets)
        for seed, hashes in self._hashes.items():
            part._hashes[seed] = hashes[index]
        return part

    def hash64(self, seed: int) -> np.ndarray:
        """``int64`` array: first 64 bits of MurmurHash3 x64 128 of each key with ``seed``."""
        cached = self._hashes.get(seed)
        if cached is None:
            cached = _hash_batch(self.data, self.offsets, seed)
            self._hashes[seed] = cached
        return cached

    def key_ids(self) -> np.ndarray:
        """A 64-bit fingerprint per key: the identity used by sketches and routing tables."""
        return self.hash64(KEY_ID_SEED)

    def to_list(self) -> list[bytes]:
        return [self[i] for i in range(len(self))]


@numba.njit(cache=True)
def _gather(
    data: np.ndarray,
    offsets: np.ndarray,
    index: np.ndarray,
    out_offsets: np.ndarray,
    out: np.ndarray,
) -> None:
    for i in range(index.shape[0]):
        src = offsets[index[i]]
        dst = out_offsets[i]
        for j in range(out_offsets[i + 1] - dst):
            out[dst + j] = data[src + j]


def choice_from_hash(hashes: np.ndarray, n_workers: int) -> np.ndarray:
    """Worker ``|h| mod W`` per hash, as Storm's original PKG does with Guava's ``asLong()``.

    ``|Long.MIN_VALUE|`` overflows to itself in Java, and Java's ``%`` keeps the dividend's sign,
    so for that one value Java yields a negative index (Storm would throw); we use 2^63 mod W
    instead. Everything else matches Java bit for bit.
    """
    magnitude = np.abs(hashes.astype(np.int64)).view(np.uint64)
    return (magnitude % np.uint64(n_workers)).astype(np.int32)
