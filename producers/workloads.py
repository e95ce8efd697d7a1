"""Seeded, reproducible key streams: the workloads of the five papers, named by a one-line spec.

Layer: workloads (pure, above operators). A spec is ``name:key=value,...``; :func:`parse` turns
it into a :class:`Workload` whose :meth:`~Workload.keys` is the stream as a
:class:`~operators.keys.KeyBatch` in arrival order (integer keys as their decimal text, what
the live producers send). Every workload reports ``p1``, its top key's probability (the PKG
paper's Table I). Workloads: ``zipf``, ``lognormal`` (PKG's LN1/LN2), ``drift``
(``mode=switch|rotate|fluctuate``: FISH's switch, rotating ranks, Fang et al.'s fluctuation),
``words`` (wordfreq's offline list), ``file`` (one key per line); their parameters and the
choices where a paper is silent: docs/schemes.md#workloads.
Long because: the five generators share one spec parser and registry, and a module split off
would fall outside the ``producers.workloads`` layer whose purity import-linter checks.

Example:
    >>> workload = parse("zipf:z=1.0,keys=4,n=8,seed=1")
    >>> round(workload.p1, 4)  # 1 / (1 + 1/2 + 1/3 + 1/4)
    0.48
    >>> workload.keys().to_list()
    [b'2', b'4', b'1', b'4', b'1', b'1', b'3', b'1']
    >>> parse("zipf:z=-1")
    Traceback (most recent call last):
    ...
    producers.workloads.WorkloadError: zipf: z must be >= 0, got -1.0
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import numba
import numpy as np

from operators.keys import KeyBatch, choice_from_hash
from operators.params import split_assignments
from operators.schemes.hashing import FIRST_SEED


class WorkloadError(ValueError):
    """A workload spec is wrong; the message is one line meant for the user (CLI exit code 2)."""


# --- spec values ---------------------------------------------------------------------------


def _as_int(name: str, text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{name} must be an integer, got {text!r}") from None
    if not math.isfinite(value) or value != int(value):
        raise WorkloadError(f"{name} must be an integer, got {text!r}")
    return int(value)


def _as_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise WorkloadError(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise WorkloadError(f"{name} must be finite, got {text!r}")
    return value


def _as_str(name: str, text: str) -> str:
    if not text:
        raise WorkloadError(f"{name} must not be empty")
    return text


def _as_fractions(name: str, text: str) -> tuple[float, ...]:
    """``0.25/0.5/0.75``: several positions in a spec whose items are already comma-separated."""
    return tuple(_as_float(name, part) for part in text.split("/"))


def _format(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(str(v) for v in value)
    return str(value)


# --- sampling helpers ------------------------------------------------------------------------


#: Uniforms drawn at a time: bounds the temporary memory (32 MB) however long the stream; the
#: draws are the same as one ``rng.random(n)``.
SAMPLE_CHUNK = 1 << 22


def zipf_probabilities(z: float, keys: int) -> np.ndarray:
    """``p_r = r^-z / H(keys, z)`` for ranks r = 1..keys (index 0 is the hottest key)."""
    weights = np.arange(1, keys + 1, dtype=np.float64) ** -z
    return weights / weights.sum()


def sample_indices(probabilities: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` i.i.d. indices drawn by inverse CDF: one uniform and one binary search per record."""
    cdf = np.cumsum(probabilities)
    cdf /= cdf[-1]
    out = np.empty(n, dtype=np.int64)
    for start in range(0, n, SAMPLE_CHUNK):
        stop = min(n, start + SAMPLE_CHUNK)
        out[start:stop] = np.searchsorted(cdf, rng.random(stop - start), side="right")
    np.minimum(out, probabilities.shape[0] - 1, out=out)
    return out


def split_lines(buffer: bytes | np.ndarray) -> KeyBatch:
    """One key per ``\\n``-terminated line (the newline stripped, nothing else; a last line
    without newline counts; a trailing newline does not add an empty key)."""
    data = np.frombuffer(buffer, dtype=np.uint8) if isinstance(buffer, bytes) else buffer
    newlines = np.flatnonzero(data == 10)
    ends = newlines if data.size and data[-1] == 10 else np.append(newlines, data.size)
    if data.size == 0:
        ends = np.empty(0, dtype=np.int64)
    offsets = np.zeros(ends.size + 1, dtype=np.int64)
    # Key i occupies data[ends[i-1]+1 : ends[i]]; removing the newlines shifts it left by i.
    offsets[1:] = ends - np.arange(ends.size)
    keep = np.ones(data.size, dtype=bool)
    keep[newlines] = False
    return KeyBatch(np.ascontiguousarray(data[keep]), offsets)


# --- the workloads ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload(abc.ABC):
    """A reproducible stream of ``n`` keys. Subclasses are frozen dataclasses of their params."""

    name: ClassVar[str]
    #: spec parameter -> converter from the spec's text (the valid parameters, in order).
    converters: ClassVar[dict[str, Callable[[str, str], Any]]]
    #: spec parameter -> field, where they differ (``keys`` would shadow :meth:`keys`).
    renamed: ClassVar[dict[str, str]] = {"keys": "n_keys"}

    @classmethod
    def from_params(cls, raw: dict[str, str]) -> Workload:
        unknown = sorted(set(raw) - set(cls.converters))
        if unknown:
            raise WorkloadError(
                f"{cls.name}: unknown parameter(s) {', '.join(unknown)}; "
                f"valid: {', '.join(cls.converters)}"
            )
        values = {
            cls.renamed.get(key, key): cls.converters[key](f"{cls.name}: {key}", text)
            for key, text in raw.items()
        }
        return cls(**values)

    @property
    def spec(self) -> str:
        """The canonical spec: ``parse(w.spec) == w``."""
        spec_name = {field: key for key, field in self.renamed.items()}
        items = [
            f"{spec_name.get(f.name, f.name)}={_format(getattr(self, f.name))}"
            for f in fields(self)
            if getattr(self, f.name) is not None
        ]
        return f"{self.name}:{','.join(items)}"

    @property
    @abc.abstractmethod
    def records(self) -> int:
        """How many keys :meth:`keys` returns."""

    @property
    @abc.abstractmethod
    def p1(self) -> float:
        """Probability of the most frequent key (PKG Table I's p1)."""

    @abc.abstractmethod
    def keys(self) -> KeyBatch:
        """The whole stream, in arrival order; the same batch for the same parameters."""

    def _check(self, condition: bool, message: str) -> None:
        if not condition:
            raise WorkloadError(f"{self.name}: {message}")


class _IntegerWorkload(Workload):
    """A workload whose keys are integers (sent as their decimal text)."""

    @abc.abstractmethod
    def ints(self) -> np.ndarray:
        """The stream as ``int64`` keys."""

    def keys(self) -> KeyBatch:
        return KeyBatch.from_ints(self.ints())


@dataclass(frozen=True)
class Zipf(_IntegerWorkload):
    """Zipf's law over ``keys`` keys: key ``r`` (1-based rank) has probability ∝ ``r^-z``.

    ``z = 0`` is uniform. Gedik uses z = 1 over 10^6 keys (§5.1), Fang et al. z = 0.85
    (Table 2); PKG's WP (p1 = 9.32%) and TW (2.67%) are matched by choosing ``z`` so
    that ``p1 = 1 / H(keys, z)`` is close (see :func:`zipf_exponent_for_p1`).
    """

    name: ClassVar[str] = "zipf"
    converters: ClassVar = {"z": _as_float, "keys": _as_int, "n": _as_int, "seed": _as_int}
    z: float = 1.0
    n_keys: int = 100_000
    n: int = 1_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        self._check(self.z >= 0, f"z must be >= 0, got {self.z}")
        self._check(self.n >= 1, f"n must be >= 1, got {self.n}")
        self._check(self.n_keys >= 1, f"keys must be >= 1, got {self.n_keys}")

    @property
    def records(self) -> int:
        return self.n

    def probabilities(self) -> np.ndarray:
        return zipf_probabilities(self.z, self.n_keys)

    @property
    def p1(self) -> float:
        return float(self.probabilities()[0])

    def ints(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return sample_indices(self.probabilities(), self.n, rng) + 1


def zipf_exponent_for_p1(p1: float, keys: int) -> float:
    """The ``z`` whose Zipf over ``keys`` keys has top-key probability ``p1`` (bisection).

    Example:
        >>> z = zipf_exponent_for_p1(0.0932, 100_000)  # PKG's WP
        >>> round(float(zipf_probabilities(z, 100_000)[0]), 4)
        0.0932
    """
    if not 1.0 / keys < p1 < 1.0:
        raise WorkloadError(f"zipf: p1 must lie in (1/keys, 1), got {p1}")
    low, high = 0.0, 1.0
    while zipf_probabilities(high, keys)[0] < p1:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        if zipf_probabilities(middle, keys)[0] < p1:
            low = middle
        else:
            high = middle
    return (low + high) / 2


#: PKG Table I: "μ₁=1.789, σ₁=2.366; μ₂=2.245, σ₂=1.133".
LOGNORMAL_PRESETS: dict[str, tuple[float, float]] = {"ln1": (1.789, 2.366), "ln2": (2.245, 1.133)}


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class LogNormal(_IntegerWorkload):
    """PKG's synthetic LN1/LN2: each record's key is ``round(X)``, ``X ~ LogNormal(mu, sigma)``.

    PKG §V-A does not say how log-normal draws become keys; rounding each draw reproduces
    Table I to the digit (why: docs/schemes.md#workloads). ``p1`` is exact, from the normal CDF.
    """

    name: ClassVar[str] = "lognormal"
    converters: ClassVar = {
        "preset": _as_str,
        "mu": _as_float,
        "sigma": _as_float,
        "n": _as_int,
        "seed": _as_int,
    }
    preset: str | None = None
    mu: float | None = None
    sigma: float | None = None
    n: int = 10_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.preset is not None:
            self._check(
                self.preset.lower() in LOGNORMAL_PRESETS,
                f"unknown preset {self.preset!r}; valid: {', '.join(LOGNORMAL_PRESETS)}",
            )
            self._check(
                self.mu is None and self.sigma is None, "give either preset or mu and sigma"
            )
        else:
            self._check(
                self.mu is not None and self.sigma is not None,
                "give preset=ln1|ln2, or both mu and sigma",
            )
        self._check(self.parameters[1] > 0, f"sigma must be > 0, got {self.parameters[1]}")
        self._check(self.n >= 1, f"n must be >= 1, got {self.n}")

    @property
    def parameters(self) -> tuple[float, float]:
        """``(mu, sigma)`` of ``ln X``."""
        if self.preset is not None:
            return LOGNORMAL_PRESETS[self.preset.lower()]
        return float(self.mu), float(self.sigma)  # type: ignore[arg-type]

    @property
    def records(self) -> int:
        return self.n

    @property
    def p1(self) -> float:
        mu, sigma = self.parameters
        # round(X) = k  <=>  X in [k - 1/2, k + 1/2) (k = 0: [0, 1/2)). X's density is unimodal,
        # so a width-1 bin entirely on one side of the mode e^(mu - σ²) is beaten by its
        # neighbour towards the mode: the largest bin is within 2 of the mode, or k = 0.
        mode = round(min(math.exp(mu - sigma**2), 2.0**52))
        ks = np.unique(np.clip(np.arange(mode - 2, mode + 3), 0, None))
        ks = np.union1d(ks, [0]).astype(np.float64)
        upper = _normal_cdf((np.log(ks + 0.5) - mu) / sigma)
        lower = np.zeros_like(upper)
        lower[ks > 0] = _normal_cdf((np.log(ks[ks > 0] - 0.5) - mu) / sigma)
        return float(np.max(upper - lower))

    def ints(self) -> np.ndarray:
        mu, sigma = self.parameters
        rng = np.random.default_rng(self.seed)
        return np.rint(rng.lognormal(mu, sigma, self.n)).astype(np.int64)


@numba.njit(cache=True)
def _fluctuate(
    probabilities: np.ndarray,
    task: np.ndarray,
    target: float,
    first: np.ndarray,
    second: np.ndarray,
    moved: float,
    before: np.ndarray,
    after: np.ndarray,
) -> tuple[int, float]:
    """Swap ``probabilities[first[i]] <-> probabilities[second[i]]`` whenever the two keys sit
    on different tasks and the swap increases the load moved, ½·Σ|after − before|, until
    that reaches ``target``; returns (pairs examined, load moved)."""
    for i in range(first.shape[0]):
        if moved >= target:
            return i, moved
        a = first[i]
        b = second[i]
        ta = task[a]
        tb = task[b]
        if ta == tb:
            continue
        delta = probabilities[b] - probabilities[a]  # task ta gains delta, tb loses it
        old = abs(after[ta] - before[ta]) + abs(after[tb] - before[tb])
        new = abs(after[ta] + delta - before[ta]) + abs(after[tb] - delta - before[tb])
        if new - old <= 1e-12:  # no real gain (rounding noise of a neutral swap)
            continue
        after[ta] += delta
        after[tb] -= delta
        moved += 0.5 * (new - old)
        probabilities[a], probabilities[b] = probabilities[b], probabilities[a]
    return first.shape[0], moved


@dataclass(frozen=True)
class Drift(_IntegerWorkload):
    """A Zipf stream whose hot keys change over time. Three constructions (``mode``):

    ``switch`` (FISH §6.1): after the first ``at`` fraction of the stream the rank -> key map
    shifts by ``shift`` (default K/2); ``rotate``: every ``every`` records it shifts by
    ``shift`` ranks (default 1); ``fluctuate`` (Fang et al. §5.3): at each of ``intervals``
    interval starts, frequencies are swapped between key-grouping instances until the load
    moved reaches ``f`` times the average instance load. The rules we chose where the papers
    lost theirs: docs/schemes.md#workloads. The mode's defaults are filled in, so
    :attr:`spec` names the stream exactly.
    """

    name: ClassVar[str] = "drift"
    converters: ClassVar = {
        "mode": _as_str,
        "z": _as_float,
        "keys": _as_int,
        "n": _as_int,
        "seed": _as_int,
        "at": _as_fractions,
        "shift": _as_int,
        "every": _as_int,
        "f": _as_float,
        "intervals": _as_int,
        "workers": _as_int,
    }
    mode: str = "switch"
    z: float = 1.0
    n_keys: int = 100_000
    n: int = 1_000_000
    seed: int = 0
    at: tuple[float, ...] | None = None
    shift: int | None = None
    every: int | None = None
    f: float | None = None
    intervals: int | None = None
    workers: int | None = None

    _MODE_PARAMS: ClassVar[dict[str, set[str]]] = {
        "switch": {"at", "shift"},
        "rotate": {"every", "shift"},
        "fluctuate": {"f", "intervals", "workers"},
    }

    def __post_init__(self) -> None:
        self._check(
            self.mode in self._MODE_PARAMS,
            f"unknown mode {self.mode!r}; valid: {', '.join(self._MODE_PARAMS)}",
        )
        foreign = [
            p
            for modes in self._MODE_PARAMS.values()
            for p in sorted(modes - self._MODE_PARAMS[self.mode])
            if getattr(self, p) is not None
        ]
        self._check(not foreign, f"mode={self.mode} takes no {', '.join(sorted(set(foreign)))}")
        self._check(self.z >= 0, f"z must be >= 0, got {self.z}")
        self._check(self.n >= 1, f"n must be >= 1, got {self.n}")
        self._check(self.n_keys >= 1, f"keys must be >= 1, got {self.n_keys}")
        if self.at is not None:
            self._check(all(0 < a < 1 for a in self.at), f"at must lie in (0, 1), got {self.at}")
        if self.every is not None:
            self._check(self.every >= 1, f"every must be >= 1, got {self.every}")
        if self.f is not None:
            self._check(self.f >= 0, f"f must be >= 0, got {self.f}")
        if self.intervals is not None:
            self._check(self.intervals >= 1, f"intervals must be >= 1, got {self.intervals}")
        if self.workers is not None:
            self._check(self.workers >= 1, f"workers must be >= 1, got {self.workers}")
        # The mode's defaults become explicit, so that ``spec`` names the stream exactly.
        defaults: dict[str, Any] = {
            "switch": {"at": (0.8,), "shift": self.n_keys // 2},
            "rotate": {"every": max(1, self.n // 10), "shift": 1},
            "fluctuate": {"f": 1.0, "intervals": 10, "workers": 10},
        }[self.mode]
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)

    @property
    def records(self) -> int:
        return self.n

    @property
    def p1(self) -> float:
        """Top-key probability at any instant (drift moves keys, not the rank distribution)."""
        return float(zipf_probabilities(self.z, self.n_keys)[0])

    def ints(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        probabilities = zipf_probabilities(self.z, self.n_keys)
        if self.mode == "fluctuate":
            return self._fluctuating(rng) + 1
        ranks = sample_indices(probabilities, self.n, rng)
        position = np.arange(self.n, dtype=np.int64)
        if self.mode == "switch":
            points = np.array(sorted(self.at), dtype=np.float64)  # type: ignore[arg-type]
            switches = np.searchsorted(
                np.ceil(points * self.n).astype(np.int64), position, side="right"
            )
        else:
            switches = position // self.every  # type: ignore[operator]
        return (ranks + switches * self.shift) % self.n_keys + 1

    def interval_bounds(self) -> np.ndarray:
        """``mode=fluctuate``: stream positions where the intervals start (and the end, n)."""
        return np.linspace(0, self.n, self.intervals + 1).round().astype(np.int64)  # type: ignore[operator]

    def interval_probabilities(self) -> list[np.ndarray]:
        """``mode=fluctuate``: each interval's key probabilities (index r is key r + 1), the
        ground truth the records of that interval are drawn from."""
        self._check(self.mode == "fluctuate", "interval_probabilities needs mode=fluctuate")
        n_tasks: int = self.workers  # type: ignore[assignment]
        rate: float = self.f  # type: ignore[assignment]
        ids = KeyBatch.from_ints(np.arange(1, self.n_keys + 1, dtype=np.int64))
        task = choice_from_hash(ids.hash64(FIRST_SEED), n_tasks).astype(np.int64)
        target = rate / n_tasks
        # Swaps draw from their own generator, so the records' draws are those of the
        # stationary Zipf with the same seed (f = 0 gives exactly that stream).
        rng = np.random.default_rng([self.seed, 1])
        probabilities = zipf_probabilities(self.z, self.n_keys)
        out = [probabilities.copy()]
        for _ in range(1, self.intervals):  # type: ignore[arg-type]
            if rate > 0 and n_tasks > 1:
                before = np.bincount(task, weights=probabilities, minlength=n_tasks)
                after = before.copy()
                cdf = np.cumsum(probabilities)
                moved, tried = 0.0, 0
                while moved < target and tried < max(20 * self.n_keys, 1 << 20):
                    first = np.minimum(
                        np.searchsorted(cdf, rng.random(65536) * cdf[-1], side="right"),
                        self.n_keys - 1,
                    )
                    second = rng.integers(0, self.n_keys, first.shape[0])
                    used, moved = _fluctuate(
                        probabilities, task, target, first, second, moved, before, after
                    )
                    tried += used
            out.append(probabilities.copy())
        return out

    def _fluctuating(self, rng: np.random.Generator) -> np.ndarray:
        bounds = self.interval_bounds()
        out = np.empty(self.n, dtype=np.int64)
        for i, probabilities in enumerate(self.interval_probabilities()):
            out[bounds[i] : bounds[i + 1]] = sample_indices(
                probabilities, int(bounds[i + 1] - bounds[i]), rng
            )
        return out


@dataclass(frozen=True)
class Words(Workload):
    """Words drawn from wordfreq's offline frequency list (a real, Zipf-like distribution).

    The vocabulary is the ``keys`` most frequent words of ``lang`` (all of them by default;
    321k for English, whose top word "the" has p1 ≈ 5.4%), ties ordered alphabetically so the
    stream is reproducible; each record is a word drawn with its wordfreq frequency.
    """

    name: ClassVar[str] = "words"
    converters: ClassVar = {"lang": _as_str, "keys": _as_int, "n": _as_int, "seed": _as_int}
    lang: str = "en"
    n_keys: int | None = None
    n: int = 1_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        import wordfreq

        available = sorted(wordfreq.available_languages())
        self._check(
            self.lang in available, f"unknown lang {self.lang!r}; valid: {', '.join(available)}"
        )
        self._check(
            self.n_keys is None or self.n_keys >= 1, f"keys must be >= 1, got {self.n_keys}"
        )
        self._check(self.n >= 1, f"n must be >= 1, got {self.n}")

    @property
    def records(self) -> int:
        return self.n

    def vocabulary(self) -> tuple[list[str], np.ndarray]:
        """The words, most frequent first, and their probabilities."""
        import wordfreq

        ranked = sorted(
            wordfreq.get_frequency_dict(self.lang).items(), key=lambda kv: (-kv[1], kv[0])
        )
        if self.n_keys is not None:
            ranked = ranked[: self.n_keys]
        frequencies = np.array([f for _, f in ranked], dtype=np.float64)
        return [w for w, _ in ranked], frequencies / frequencies.sum()

    @property
    def p1(self) -> float:
        return float(self.vocabulary()[1][0])

    def keys(self) -> KeyBatch:
        words, probabilities = self.vocabulary()
        rng = np.random.default_rng(self.seed)
        return KeyBatch.from_strings(words).take(sample_indices(probabilities, self.n, rng))


@dataclass(frozen=True)
class File(Workload):
    """Replay of a file with one key per line (the newline stripped, nothing else).

    ``n`` keeps only the first ``n`` lines. ``p1`` is the empirical top-key frequency.
    """

    name: ClassVar[str] = "file"
    converters: ClassVar = {"path": _as_str, "n": _as_int}
    path: str = ""
    n: int | None = None

    def __post_init__(self) -> None:
        self._check(bool(self.path), "path is required")
        self._check(Path(self.path).is_file(), f"no such file: {self.path}")
        self._check(self.n is None or self.n >= 1, f"n must be >= 1, got {self.n}")

    @property
    def records(self) -> int:
        return len(self.keys())

    @property
    def p1(self) -> float:
        keys = self.keys()
        _, counts = np.unique(keys.key_ids(), return_counts=True)
        return float(counts.max() / len(keys))

    def keys(self) -> KeyBatch:
        batch = split_lines(Path(self.path).read_bytes())
        if self.n is not None and self.n < len(batch):
            batch = batch.slice(0, self.n)
        if len(batch) == 0:
            raise WorkloadError(f"file: {self.path} holds no keys")
        return batch


#: The stream ``skewer produce`` and ``skewer demo`` write unless told otherwise.
DEFAULT_WORKLOAD = "zipf:z=1.2,keys=100000,seed=0"

#: Workload name -> class: the valid names of a spec.
WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls for cls in (Zipf, LogNormal, Drift, Words, File)
}


def parse(spec: str) -> Workload:
    """The workload a ``name:key=value,...`` spec describes; :class:`WorkloadError` if wrong."""
    name, _, rest = spec.strip().partition(":")
    cls = WORKLOADS.get(name.strip())
    if cls is None:
        raise WorkloadError(
            f"unknown workload {name.strip()!r}; valid workloads: {', '.join(WORKLOADS)}"
        )
    try:
        raw = split_assignments(rest.split(",") if rest.strip() else [])
    except ValueError as error:
        raise WorkloadError(f"{cls.name}: {error}") from None
    return cls.from_params(raw)
