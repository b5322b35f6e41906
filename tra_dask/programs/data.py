"""Deterministic synthetic inputs, made chunk by chunk where they are needed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..logical import FromFunction, from_function
from ..types import normalize_chunks


@dataclass(frozen=True)
class UniformChunks:
    """Chunk loader: U(-1, 1) values seeded by ``(seed, *key)``, so any process makes
    the same chunk for the same key (a picklable value: equal loaders are one source)."""

    shape: tuple
    chunks: tuple
    seed: int
    dtype: str

    def __call__(self, key):
        ext = tuple(min(c, n - k * c) for k, c, n in zip(key, self.chunks, self.shape))
        rng = np.random.default_rng([self.seed, *key])
        return rng.uniform(-1.0, 1.0, size=ext).astype(self.dtype, copy=False)


def random_uniform(shape, chunks, *, seed: int = 0, dtype="float64", name: str | None = None) -> FromFunction:
    """A relation of U(-1, 1) chunks made lazily by :class:`UniformChunks`.

    >>> r = random_uniform((5, 4), 2, seed=1)
    >>> r.frontier, r.chunk_shape((2, 1))
    ((3, 2), (1, 2))
    """
    shape = tuple(int(n) for n in shape)
    chunks = normalize_chunks(chunks, shape, where=f"random_uniform {name or ''}".rstrip())
    dtype = np.dtype(dtype)
    return from_function(UniformChunks(shape, chunks, int(seed), dtype.str), shape, chunks, dtype, name=name)
