"""Functions that run inside worker tasks.  Module-level and small, so that tasks
pickle by reference; kernels receive chunks in their own array module, numpy chunks
aligned (:func:`~tra_dask.kernels.aligned`)."""

from __future__ import annotations

import contextlib
import functools

from ..kernels import aligned, array_module, on_device_of
from ..logical.evaluate import check_chunk


def identity(x):
    """A transfer: the task runs on the destination worker, so dask moves ``x`` there."""
    return x


@contextlib.contextmanager
def _noted(where: str, key):
    """A user's kernel or loader raising inside: its own exception, with a note of
    where it ran, as the in-process evaluator adds (the note travels to the client)."""
    try:
        yield
    except Exception as e:
        if hasattr(e, "add_note"):  # Python >= 3.11
            e.add_note(f"tra_dask: while evaluating {where} (chunk {key}, on a worker)")
        raise


def apply(fn, params, check, *chunks):
    """A kernel call; its output checked against the plan's type (``check``: shape,
    dtype, node, kernel, key) so that a kernel that lies about its output fails
    here, naming itself, rather than assembling a wrong result."""
    with _noted(check[2], check[4]):
        out = fn(*on_device_of(aligned(chunks)), *params)
    return check_chunk(out, *check)


def fold(fn, params, check, *chunks):
    """One group of a local aggregation, folded left in key order (checked as ``apply``)."""
    with _noted(check[2], check[4]):
        out = functools.reduce(lambda a, b: fn(*on_device_of(aligned((a, b))), *params), chunks)
    return check_chunk(out, *check)


DEFERRED = "tra-dask:deferred"  # marks a fused computation handed to fold_deferred as data


def fold_deferred(fn, params, check, *items):
    """:func:`fold` of a group some of whose inputs are computations fused into it:
    such an input is ``[DEFERRED, key, func, *args]`` (``key``: the fused task's; an
    argument may be one again, for a chain), made only when it is folded in — so
    while an input is made the fold holds only its running result, not the inputs
    before it (a site's partial products of a contraction are not all alive at
    once)."""
    acc = None
    for item in items:
        (x,) = aligned((made(item),))
        with _noted(check[2], check[4]):
            acc = x if acc is None else fn(*on_device_of((acc, x)), *params)
        del x
    return check_chunk(acc, *check)


def made(item):
    """The value of a :func:`fold_deferred` input: a deferred computation run (its
    deferred arguments first), anything else as it is."""
    if type(item) is list and item and item[0] == DEFERRED:
        func, args = item[2], item[3:]
        if func is fold_deferred:  # a fold within: it makes its own inputs one at a time
            return fold_deferred(*args)
        return func(*(made(a) for a in args))
    return item


def concat(axis, *chunks):
    chunks = on_device_of(chunks)
    return array_module(*chunks).concatenate(chunks, axis=axis)


def tile_slice(x, dim, start, stop):
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, stop)
    return x[tuple(idx)]


def load(fn, key, shape, dtype, name):
    """Make a ``from_function`` chunk on its site and check it against its type."""
    with _noted(name, key):
        chunk = fn(key)
    got_shape, got_dtype = tuple(getattr(chunk, "shape", ())), getattr(chunk, "dtype", None)
    if got_shape != shape or str(got_dtype) != dtype:
        raise ValueError(
            f"from_function {name}: fn({key}) returned a chunk of shape {got_shape} and dtype "
            f"{got_dtype}; expected shape {shape} and dtype {dtype}"
        )
    return chunk
