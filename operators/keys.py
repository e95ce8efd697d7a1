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


@numba.njit(inline="always")
def _mix_block(h1: np.uint64, h2: np.uint64, k1: np.uint64, k2: np.uint64) -> tuple:
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
    return h1, h2


@numba.njit(inline="always")
def _tail_words(data: np.ndarray, tail: int, remainder: int) -> tuple:
    """The last ``remainder`` (< 16) bytes as two little-endian words, zero padded."""
    k1 = np.uint64(0)
    k2 = np.uint64(0)
    if tail + 16 <= data.shape[0]:
        # Fixed-trip loops compile to straight-line selects: no mispredicted loop exit per key
        # (variable key lengths made the byte loop the hash's main cost).
        for j in range(8):
            byte = np.uint64(data[tail + j]) if j < remainder else np.uint64(0)
            k1 |= byte << np.uint64(8 * j)
        for j in range(8):
            byte = np.uint64(data[tail + 8 + j]) if j + 8 < remainder else np.uint64(0)
            k2 |= byte << np.uint64(8 * j)
    else:
        for j in range(remainder):
            if j < 8:
                k1 |= np.uint64(data[tail + j]) << np.uint64(8 * j)
            else:
                k2 |= np.uint64(data[tail + j]) << np.uint64(8 * (j - 8))
    return k1, k2


@numba.njit(inline="always")
def _finish(
    h1: np.uint64, h2: np.uint64, k1: np.uint64, k2: np.uint64, remainder: int, length: int
) -> np.int64:
    if remainder > 8:
        k2 *= _C2
        k2 = _rotl64(k2, 33)
        k2 *= _C1
        h2 ^= k2
    if remainder > 0:
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


@numba.njit(inline="always")
def murmur3_x64_128_low(data: np.ndarray, start: int, end: int, seed: int) -> np.int64:
    """First 64 bits of MurmurHash3_x64_128(data[start:end], seed), as a signed integer."""
    length = end - start
    nblocks = length // 16
    h1 = np.uint64(seed & 0xFFFFFFFF)
    h2 = h1
    for i in range(nblocks):
        k1 = _read_u64(data, start + 16 * i)
        k2 = _read_u64(data, start + 16 * i + 8)
        h1, h2 = _mix_block(h1, h2, k1, k2)
    remainder = length & 15
    k1, k2 = _tail_words(data, start + 16 * nblocks, remainder)
    return _finish(h1, h2, k1, k2, remainder, length)


@numba.njit(inline="always")
def murmur3_x64_128_low_pair(
    data: np.ndarray, start: int, end: int, seed_a: int, seed_b: int
) -> tuple:
    """:func:`murmur3_x64_128_low` for two seeds at once, reading the key's bytes once."""
    length = end - start
    nblocks = length // 16
    a1 = np.uint64(seed_a & 0xFFFFFFFF)
    a2 = a1
    b1 = np.uint64(seed_b & 0xFFFFFFFF)
    b2 = b1
    for i in range(nblocks):
        k1 = _read_u64(data, start + 16 * i)
        k2 = _read_u64(data, start + 16 * i + 8)
        a1, a2 = _mix_block(a1, a2, k1, k2)
        b1, b2 = _mix_block(b1, b2, k1, k2)
    remainder = length & 15
    k1, k2 = _tail_words(data, start + 16 * nblocks, remainder)
    return (
        _finish(a1, a2, k1, k2, remainder, length),
        _finish(b1, b2, k1, k2, remainder, length),
    )


@numba.njit(cache=True)
def _hash_batch(data: np.ndarray, offsets: np.ndarray, seed: int) -> np.ndarray:
    n = offsets.shape[0] - 1
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        out[i] = murmur3_x64_128_low(data, offsets[i], offsets[i + 1], seed)
    return out


@numba.njit(cache=True)
def _hash_batch_pair(data: np.ndarray, offsets: np.ndarray, seed_a: int, seed_b: int) -> tuple:
    n = offsets.shape[0] - 1
    out_a = np.empty(n, dtype=np.int64)
    out_b = np.empty(n, dtype=np.int64)
    for i in range(n):
        out_a[i], out_b[i] = murmur3_x64_128_low_pair(
            data, offsets[i], offsets[i + 1], seed_a, seed_b
        )
    return out_a, out_b


@numba.njit(inline="always")
def _magnitude(v: np.int64) -> np.uint64:
    """|v| as uint64, exact also for -2^63 (where int64 abs overflows)."""
    return np.uint64(v) if v >= 0 else np.uint64(-(v + 1)) + np.uint64(1)


@numba.njit(cache=True)
def _decimal_lengths(values: np.ndarray) -> np.ndarray:
    lengths = np.empty(values.shape[0] + 1, dtype=np.int64)
    lengths[0] = 0
    for i in range(values.shape[0]):
        v = values[i]
        digits = 1 if v >= 0 else 2
        magnitude = _magnitude(v)
        while magnitude >= np.uint64(10):
            magnitude //= np.uint64(10)
            digits += 1
        lengths[i + 1] = lengths[i] + digits
    return lengths


@numba.njit(cache=True)
def _decimal_encode(values: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    for i in range(values.shape[0]):
        v = values[i]
        pos = offsets[i + 1] - 1
        magnitude = _magnitude(v)
        while True:
            out[pos] = np.uint8(48) + np.uint8(magnitude % np.uint64(10))
            magnitude //= np.uint64(10)
            pos -= 1
            if magnitude == np.uint64(0):
                break
        if v < 0:
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

    @classmethod
    def concat(cls, batches: Sequence[KeyBatch]) -> KeyBatch:
        """The keys of ``batches`` one after another, in one new batch.

        >>> KeyBatch.concat([KeyBatch.from_strings(["a"]), KeyBatch.from_strings(["bc"])]).to_list()
        [b'a', b'bc']
        """
        if not batches:
            return cls.from_bytes([])
        data = np.concatenate([b.data for b in batches])
        lengths = np.concatenate([np.diff(b.offsets) for b in batches])
        offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
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

    def hash64_pair(self, seed_a: int, seed_b: int) -> tuple[np.ndarray, np.ndarray]:
        """``(hash64(seed_a), hash64(seed_b))``, computed in one pass over the bytes if neither
        is memoized yet (PKG's two candidates then cost about 1.3 hashes instead of 2)."""
        if seed_a in self._hashes or seed_b in self._hashes or seed_a == seed_b:
            return self.hash64(seed_a), self.hash64(seed_b)
        first, second = _hash_batch_pair(self.data, self.offsets, seed_a, seed_b)
        self._hashes[seed_a] = first
        self._hashes[seed_b] = second
        return first, second

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


@numba.njit(inline="always")
def probe_slot(
    slot_keys: np.ndarray, occupancy: np.ndarray, free: int, key: np.int64, slot: np.int64
) -> np.int64:
    """From ``slot`` on, the slot of an open-addressing table (linear probing, power-of-two
    size) that holds ``key``, or the first free one; ``occupancy[s] == free`` marks a free slot.
    The compiled per-key tables of PoTC, lossy counting and Fang's key counter share it."""
    mask = slot_keys.shape[0] - 1
    while occupancy[slot] != free and slot_keys[slot] != key:
        slot = (slot + 1) & mask
    return slot


#: Largest W for which :func:`abs_mod` takes its division-free path (see there).
_FAST_MOD_LIMIT = 1 << 21


@numba.njit(inline="always")
def mod_constants(n_workers: int) -> tuple:
    """``(2^32 mod W, 1/W)``: what :func:`abs_mod` needs, computed once per batch."""
    if n_workers > _FAST_MOD_LIMIT:
        return np.int64(-1), 0.0
    return np.int64((1 << 32) % n_workers), 1.0 / n_workers


@numba.njit(inline="always")
def abs_mod(h: np.int64, n_workers: int, two32_mod: np.int64, inverse: float) -> np.int64:
    """``|h| mod W`` exactly as :func:`choice_from_hash`, for use inside compiled kernels.

    A 64-bit division costs more than the rest of PKG's routing together, so for
    ``W <= 2^21`` the magnitude ``x = hi·2^32 + lo`` is first folded to
    ``y = hi·(2^32 mod W) + lo < 2^53`` (same residue, exact in a double), then
    ``y - floor(y/W)·W`` is computed with one float multiply; the float quotient is off by at
    most one, which the final correction fixes.
    """
    magnitude = np.uint64(h) if h >= 0 else np.uint64(-(h + 1)) + np.uint64(1)
    if two32_mod < 0:
        return np.int64(magnitude % np.uint64(n_workers))
    folded = np.int64(magnitude >> np.uint64(32)) * two32_mod + np.int64(
        magnitude & np.uint64(0xFFFFFFFF)
    )
    residue = folded - np.int64(np.float64(folded) * inverse) * n_workers
    if residue < 0:
        residue += n_workers
    elif residue >= n_workers:
        residue -= n_workers
    return residue


@numba.njit(cache=True)
def _choices(hashes: np.ndarray, n_workers: int) -> np.ndarray:
    two32_mod, inverse = mod_constants(n_workers)
    out = np.empty(hashes.shape[0], dtype=np.int32)
    for i in range(hashes.shape[0]):
        out[i] = abs_mod(hashes[i], n_workers, two32_mod, inverse)
    return out


def choice_from_hash(hashes: np.ndarray, n_workers: int) -> np.ndarray:
    """Worker ``|h| mod W`` per hash, as Storm's original PKG does with Guava's ``asLong()``.

    ``|Long.MIN_VALUE|`` overflows to itself in Java, and Java's ``%`` keeps the dividend's sign,
    so for that one value Java yields a negative index (Storm would throw); we use 2^63 mod W
    instead. Everything else matches Java bit for bit.
    """
    if int(n_workers) < 1:
        raise ValueError(f"number of workers must be >= 1, got {n_workers}")
    return _choices(np.ascontiguousarray(hashes, dtype=np.int64).ravel(), int(n_workers))
