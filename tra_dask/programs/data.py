"""Deterministic synthetic inputs, made chunk by chunk where they are needed."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from ..logical import FromFunction, from_function
from ..types import check_extents, normalize_chunks
from ..frontend import from_region


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
    where = f"random_uniform {name or ''}".rstrip()
    shape = check_extents(shape, where)
    chunks = normalize_chunks(chunks, shape, where=where)
    dtype = np.dtype(dtype)
    return from_function(UniformChunks(shape, chunks, int(seed), dtype.str), shape, chunks, dtype, name=name)


_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / the golden ratio: splitmix64's increment


@dataclass(frozen=True)
class UniformRegion:
    """Region loader of U(-1, 1) values that do not depend on the chunking: element
    ``i`` (its row-major index in ``shape``) is splitmix64's output function applied
    to ``i + (seed + 1) * 0x9E3779B97F4A7C15`` (mod 2**64), so any region of the
    array is the same whatever blocks cut it and wherever they are made (a picklable
    value for :func:`tra_dask.from_region`).  Float dtypes only.

    >>> u = UniformRegion((4, 6), seed=3)
    >>> bool((u((slice(1, 3), slice(2, 5))) == u((slice(0, 4), slice(0, 6)))[1:3, 2:5]).all())
    True
    """

    shape: tuple
    seed: int = 0
    dtype: str = "float64"

    def __post_init__(self):
        object.__setattr__(self, "shape", check_extents(self.shape, "UniformRegion"))
        object.__setattr__(self, "seed", operator.index(self.seed))  # an int (a float seed is a mistake)
        if np.dtype(self.dtype).kind != "f":
            raise TypeError(f"UniformRegion: U(-1, 1) values need a float dtype, not {np.dtype(self.dtype)}")

    def __call__(self, region):
        shape = tuple(r.stop - r.start for r in region)
        z = np.empty(shape, dtype=np.uint64)  # the row-major index of each element, then mixed in place
        z[...] = np.uint64((self.seed + 1) * _GOLDEN % 2**64)
        stride = 1
        for a in range(len(self.shape) - 1, -1, -1):
            r = region[a]
            axis = np.arange(r.start, r.stop, dtype=np.uint64) * np.uint64(stride)
            z += axis.reshape((-1,) + (1,) * (len(self.shape) - 1 - a))
            stride *= int(self.shape[a])
        t = np.empty_like(z)
        with np.errstate(over="ignore"):
            for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
                np.right_shift(z, np.uint64(shift), out=t)
                z ^= t
                z *= np.uint64(mult)
            np.right_shift(z, np.uint64(31), out=t)
            z ^= t
        del t
        z >>= np.uint64(11)  # 53 random bits: u = z / 2**53 in [0, 1), the value 2u - 1
        out = np.asarray(z, dtype=np.float64)
        del z
        out *= 2.0 ** -52
        out -= 1.0
        return out.astype(self.dtype, copy=False)


def uniform_array(shape, *, seed: int = 0, dtype="float64", chunks="auto", name: str | None = None):
    """A :class:`td.Array` of U(-1, 1) values made on the workers (:class:`UniformRegion`),
    its chunking chosen with the plan (``chunks="auto"``) or given.

    >>> x = uniform_array((5, 4), seed=1)
    >>> x.shape, x.dtype
    ((5, 4), dtype('float64'))
    """
    shape = check_extents(shape, f"uniform_array {name or ''}".rstrip())
    dtype = np.dtype(dtype)
    return from_region(UniformRegion(shape, seed, dtype.str), shape, dtype, chunks=chunks,
                       name=name or f"uniform[{'x'.join(map(str, shape))} {dtype}]")
