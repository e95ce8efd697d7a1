"""KeyBatch: hashes equal mmh3 (the reference Python binding of MurmurHash3) byte for byte."""

from __future__ import annotations

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.keys import KEY_ID_SEED, KeyBatch, choice_from_hash


def reference_hash(key: bytes, seed: int) -> int:
    return mmh3.hash64(key, seed, signed=True)[0]


def random_keys(seed: int, count: int, max_length: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(n)) for n in rng.integers(0, max_length + 1, count)]


# Every length class of MurmurHash3 x64 128: empty, tails of 1..15 bytes, whole 16-byte blocks,
# blocks plus tails, and keys long enough to take many blocks.
EDGE_KEYS = [b"", b"a", b"\x00", b"\xff" * 8, b"x" * 9, b"y" * 15, b"z" * 16, b"w" * 17]
EDGE_KEYS += [bytes(range(256)) * 4, b"q" * 10_000]


@pytest.mark.parametrize("seed", [0, 13, 17, 42, 2**31, 2**32 - 1])
def test_hash64_equals_mmh3_on_random_and_edge_keys(seed: int) -> None:
    keys = EDGE_KEYS + random_keys(seed=1, count=2000, max_length=80)
    batch = KeyBatch.from_bytes(keys)
    assert batch.hash64(seed).tolist() == [reference_hash(k, seed) for k in keys]


@given(st.lists(st.binary(max_size=64), max_size=40), st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_hash64_equals_mmh3_property(keys: list[bytes], seed: int) -> None:
    assert KeyBatch.from_bytes(keys).hash64(seed).tolist() == [
        reference_hash(k, seed) for k in keys
    ]


def test_last_key_near_buffer_end_is_hashed_from_its_own_bytes_only() -> None:
    # The tail reader takes a fast path only when 16 bytes remain in the buffer; a short last
    # key (and a batch that is a view into a bigger buffer) must take the careful path.
    big = KeyBatch.from_bytes([b"prefix-key", b"abc", b"tail"])
    part = big.slice(1, 3)
    assert part.hash64(13).tolist() == [reference_hash(b"abc", 13), reference_hash(b"tail", 13)]


def test_hash64_pair_equals_two_single_hashes_and_memoizes() -> None:
    keys = EDGE_KEYS + random_keys(seed=2, count=500, max_length=40)
    batch = KeyBatch.from_bytes(keys)
    first, second = batch.hash64_pair(13, 17)
    assert first.tolist() == [reference_hash(k, 13) for k in keys]
    assert second.tolist() == [reference_hash(k, 17) for k in keys]
    assert batch.hash64(13) is first and batch.hash64(17) is second
    again = batch.hash64_pair(13, 17)
    assert again[0] is first and again[1] is second
    same = batch.hash64_pair(5, 5)
    assert same[0].tolist() == same[1].tolist() == [reference_hash(k, 5) for k in keys]


def test_key_ids_are_the_seed_zero_hash() -> None:
    batch = KeyBatch.from_strings(["apple", "pear"])
    assert KEY_ID_SEED == 0
    assert batch.key_ids().tolist() == [reference_hash(b"apple", 0), reference_hash(b"pear", 0)]


def test_from_strings_encodes_utf8() -> None:
    batch = KeyBatch.from_strings(["é", "", "日本"])
    assert batch.to_list() == ["é".encode(), b"", "日本".encode()]
    assert batch.offsets.tolist() == [0, 2, 2, 8]


def test_from_ints_is_decimal_text_including_extremes() -> None:
    values = [0, 7, 10, -1, -12, 1234567890, 2**63 - 1, -(2**63) + 1, -(2**63)]
    batch = KeyBatch.from_ints(np.array(values, dtype=np.int64))
    assert batch.to_list() == [str(v).encode() for v in values]
    assert batch.hash64(13).tolist() == [reference_hash(str(v).encode(), 13) for v in values]


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_from_ints_property(values: list[int]) -> None:
    batch = KeyBatch.from_ints(np.array(values, dtype=np.int64))
    assert batch.to_list() == [str(v).encode() for v in values]


def test_slice_and_take_select_keys_and_carry_hashes() -> None:
    keys = [b"k%d" % i for i in range(10)] + [b"", b"long" * 20]
    batch = KeyBatch.from_bytes(keys)
    hashes = batch.hash64(17)
    part = batch.slice(3, 7)
    assert len(part) == 4 and part.to_list() == keys[3:7]
    assert part.hash64(17).tolist() == hashes[3:7].tolist()
    assert part.hash64(13).tolist() == [reference_hash(k, 13) for k in keys[3:7]]
    index = np.array([11, 0, 10, 0, 5])
    taken = batch.take(index)
    assert taken.to_list() == [keys[i] for i in index]
    assert taken.hash64(17).tolist() == hashes[index].tolist()
    assert taken.hash64(0).tolist() == [reference_hash(keys[i], 0) for i in index]
    assert len(batch.slice(4, 4)) == 0 and len(batch.take(np.array([], dtype=np.int64))) == 0


def test_batch_rejects_wrong_buffers() -> None:
    with pytest.raises(TypeError):
        KeyBatch(np.zeros(3, dtype=np.int8), np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError):
        KeyBatch(np.zeros(3, dtype=np.uint8), np.array([1, 3], dtype=np.int64))


@pytest.mark.parametrize(
    "n_workers", [1, 2, 3, 5, 6, 7, 10, 100, 12345, 2**21 - 1, 2**21, 2**21 + 1, 10**9]
)
def test_choice_from_hash_is_abs_mod(n_workers: int) -> None:
    rng = np.random.default_rng(n_workers)
    hashes = rng.integers(-(2**63), 2**63 - 1, 20_000, dtype=np.int64, endpoint=True)
    extremes = [-(2**63), -(2**63) + 1, 2**63 - 1, 0, -1, 1, -n_workers, n_workers]
    hashes = np.concatenate([hashes, np.array(extremes, dtype=np.int64)])
    # Java's Math.abs(Long.MIN_VALUE) overflows; we use |-2^63| = 2^63 (see the docstring).
    expected = [abs(int(h)) % n_workers for h in hashes]
    got = choice_from_hash(hashes, n_workers)
    assert got.dtype == np.int32
    assert got.tolist() == expected


def test_choice_from_hash_rejects_zero_workers() -> None:
    with pytest.raises(ValueError, match="workers"):
        choice_from_hash(np.array([1], dtype=np.int64), 0)
