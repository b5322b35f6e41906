"""The reference evaluator: TRA semantics on numpy, simple and obviously correct.

It is the oracle every later layer is tested against, so it favours plainness over
speed: dicts of ``{key: chunk}``, one small function per operator, and every result
checked against the type the node derived (a kernel whose declared type rule lies is
caught here, with its name).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from ..kernels import array_module, on_device_of
from .nodes import Aggregate, Concat, Filter, Join, Rekey, Relation, Tile, Transform, _fmt_keys, toposort
from .sources import ClusterSource, FromChunks, FromFunction, FromNumpy, Pieces, Source

__all__ = ["evaluate", "to_numpy", "check_integrity", "check_outputs", "flatten_outputs", "substitute"]

Chunks = dict


def flatten_outputs(expr) -> tuple[list[Relation], Callable[[list], Any]]:
    """The relations in ``expr`` (one relation, a tuple/list, or a dict of them) and a
    function that puts per-relation results back into the same structure."""
    if isinstance(expr, Relation):
        return [expr], lambda rs: rs[0]
    if isinstance(expr, (tuple, list)):
        items = list(expr)
        _check_all(items, "a tuple of outputs")
        return items, lambda rs: type(expr)(rs) if isinstance(expr, tuple) else list(rs)
    if isinstance(expr, dict):
        names = list(expr)
        _check_all([expr[n] for n in names], "a dict of outputs", names)
        return [expr[n] for n in names], lambda rs: dict(zip(names, rs))
    raise TypeError(
        f"expected a tensor relation, or a tuple or dict of them; got {type(expr).__name__}"
    )


def _check_all(items, what, names=None):
    for i, r in enumerate(items):
        if not isinstance(r, Relation):
            item = f"item {i}" if names is None else f"item {names[i]!r}"
            hint = ("; td.Arrays run one at a time or as a tuple of arrays (td.compute((x, y)))"
                    if type(r).__module__.startswith("tra_dask.") and names is not None else "")
            raise TypeError(f"{what}: {item} is a {type(r).__name__}, not a tensor relation{hint}")


def check_integrity(rel: Relation, role: str = "result") -> None:
    """Raise ``ValueError`` unless ``rel`` satisfies uniqueness and continuity (paper
    §3.2).  Intermediate relations may have holes; sources and results may not."""
    t = rel.type
    dup = t.duplicates()
    if dup:
        raise ValueError(f"{role} {rel.label}: duplicate keys {_fmt_keys(dup)}")
    if not t.is_continuous:
        raise ValueError(
            f"{role} {rel.label}: keys have holes below the frontier {t.frontier} (missing "
            f"{_fmt_keys(t.holes())}); a final tensor relation must be continuous (paper "
            f"§3.2). Rekey it onto a dense grid, or pass check=False to see the tuples anyway"
        )


def check_outputs(expr) -> None:
    """The check :func:`evaluate` runs on its outputs (:func:`check_integrity`), for the
    other ways of running an expression: ``td.submit``/``td.compute`` run it before
    planning, so a cluster never returns a result ``evaluate`` would reject (key sets
    are exact in the types: no data is needed).  ``expr``: a relation, a tuple/list/dict
    of them, or a :class:`~tra_dask.Plan` (its outputs); anything else is left to the
    caller's own checks."""
    if isinstance(expr, dict):
        items = list(expr.values())
    elif isinstance(expr, (tuple, list)):
        items = list(expr)
    elif not isinstance(expr, Relation) and isinstance(getattr(expr, "outputs", None), (tuple, list)):
        items = list(expr.outputs)  # a Plan: its physical outputs carry the same exact types
    else:
        items = [expr]
    for o in items:
        if isinstance(o, Relation) or (hasattr(o, "type") and hasattr(o, "label") and hasattr(o, "children")):
            check_integrity(o)


def evaluate(expr, *, check: bool = True):
    """Evaluate a TRA expression in this process with numpy; ``{key tuple: chunk}``.

    ``expr`` may be one relation, a tuple/list or a dict of relations: shared
    subexpressions (structurally equal nodes) are evaluated once.  With ``check``,
    every output must satisfy the integrity constraints.

    >>> import numpy as np, tra_dask as td
    >>> A = td.from_numpy(np.arange(4.0).reshape(2, 2), 1)
    >>> td.evaluate(td.aggregate(A, (), "add"))
    {(): array([[6.]])}
    """
    outputs, rebuild = flatten_outputs(expr)
    if check:
        for o in outputs:
            check_integrity(o)
    memo: dict[Relation, Chunks] = {}
    for node in toposort(outputs):
        try:
            memo[node] = _check_result(node, _EVAL[type(node)](node, *(memo[c] for c in node.children)))
        except Exception as e:  # a user's kernel or loader failed: its own error, and where it ran
            if hasattr(e, "add_note"):  # Python >= 3.11
                e.add_note(f"tra_dask: while evaluating {node.label}")
            raise
    return rebuild([dict(memo[o]) for o in outputs])


def _check_result(node: Relation, out: Chunks) -> Chunks:
    t = node.type
    if len(out) != t.ntuples or any(k not in out for k in t.key_list()):
        raise RuntimeError(f"{node.label}: evaluated keys differ from the derived key set (a bug)")
    kernel = getattr(node, "kernel", None)
    for key, shape in t.chunk_shapes().items():
        check_chunk(out[key], shape, str(t.dtype), node.label, kernel, key)
    return out


def check_chunk(chunk, shape: tuple, dtype: str, where: str, kernel, key):
    """``chunk`` if it has the ``shape`` and ``dtype`` its type says, else a
    RuntimeError naming the node, the kernel and the key (the evaluator's check;
    the lowering runs the same one inside every kernel task on the workers)."""
    got_shape, got_dtype = tuple(getattr(chunk, "shape", ())), getattr(chunk, "dtype", None)
    if got_shape != tuple(shape) or str(got_dtype) != dtype:
        raise RuntimeError(
            f"{where}: chunk {key} came out with shape {got_shape} and dtype {got_dtype} but the "
            f"type rule{f' of kernel {kernel!r}' if kernel is not None else ''} says {tuple(shape)} "
            f"and {dtype}; fix the kernel's declared shape/dtype"
        )
    return chunk


def _eval_source(node: Source) -> Chunks:
    return {k: node.load(k) for k in node.keys}


def _eval_aggregate(node: Aggregate, inp: Chunks) -> Chunks:
    groups: dict = defaultdict(list)
    for key in sorted(inp):
        groups[tuple(key[d] for d in node.group_by)].append(inp[key])
    return {g: functools.reduce(node.kernel, chunks) for g, chunks in groups.items()}


def _eval_join(node: Join, left: Chunks, right: Chunks) -> Chunks:
    by_join_key: dict = defaultdict(list)
    for rk, ra in right.items():
        by_join_key[tuple(rk[d] for d in node.right_on)].append((rk, ra))
    rest = node.right_rest
    out = {}
    for lk, la in left.items():
        for rk, ra in by_join_key.get(tuple(lk[d] for d in node.left_on), ()):
            out[lk + tuple(rk[d] for d in rest)] = node.kernel(la, ra)
    return out


def _eval_rekey(node: Rekey, inp: Chunks) -> Chunks:
    out = {}
    for key, a in inp.items():
        new = node.key_fn(key)
        for nk in new if node.key_fn.multiplicity > 1 else [new]:
            out[nk] = a
    return out


def _eval_filter(node: Filter, inp: Chunks) -> Chunks:
    return {k: a for k, a in inp.items() if node.pred(k)}


def _eval_transform(node: Transform, inp: Chunks) -> Chunks:
    return {k: node.kernel(a) for k, a in inp.items()}


def _eval_tile(node: Tile, inp: Chunks) -> Chunks:
    d, size = node.tile_dim, node.tile_size
    out = {}
    for key, a in inp.items():
        for t, start in enumerate(range(0, a.shape[d], size)):
            idx = [slice(None)] * a.ndim
            idx[d] = slice(start, start + size)
            out[key + (t,)] = a[tuple(idx)]
    return out


def _eval_concat(node: Concat, inp: Chunks) -> Chunks:
    kd = node.key_dim
    groups: dict = defaultdict(list)
    for key in sorted(inp, key=lambda k: k[kd]):
        groups[key[:kd] + key[kd + 1 :]].append(inp[key])
    out = {}
    for g, chunks in groups.items():
        chunks = on_device_of(tuple(chunks))
        out[g] = array_module(*chunks).concatenate(chunks, axis=node.array_dim)
    return out


_EVAL: dict[type, Callable[..., Chunks]] = {
    Aggregate: _eval_aggregate,
    Join: _eval_join,
    Rekey: _eval_rekey,
    Filter: _eval_filter,
    Transform: _eval_transform,
    Tile: _eval_tile,
    Concat: _eval_concat,
}


def _register_sources():
    # (a cluster source's chunks are fetched by the function the runtime gave it)
    for cls in (FromNumpy, FromChunks, FromFunction, ClusterSource, Pieces):
        _EVAL[cls] = _eval_source


_register_sources()


def grid_extents(rel: Relation, where: str) -> tuple:
    """The chunk extents along each array dim of ``rel`` as one tensor (dask-style
    ``chunks``): key dim d indexes array dim d; array dims past the key arity are
    not split.  A ValueError naming ``where`` unless the keys form such a grid."""
    check_integrity(rel)
    t = rel.type
    if t.arity > t.rank:
        raise ValueError(
            f"{where}: key arity {t.arity} exceeds chunk rank {t.rank}; it needs one key "
            f"dim per leading array dim (rekey or concat first)"
        )
    shapes = np.array([t.shapes[i] for i in t.shape_ids], dtype=np.int64).reshape(t.ntuples, t.rank)
    out = []
    for d in range(t.rank):
        if d < t.arity:
            ext = []
            for v in range(t.frontier[d]):
                e = np.unique(shapes[t.keys[:, d] == v, d])
                if len(e) != 1:
                    raise ValueError(
                        f"{where}: chunks with key dim {d} = {v} have extents {e.tolist()} along "
                        f"array dim {d}; they do not form one tensor's grid"
                    )
                ext.append(int(e[0]))
            out.append(tuple(ext))
        else:
            e = np.unique(shapes[:, d])
            if len(e) != 1:
                raise ValueError(f"{where}: chunks differ in extent along unsplit array dim {d}: {e.tolist()}")
            out.append((int(e[0]),))
    return tuple(out)


def to_numpy(rel: Relation, chunks: Chunks | None = None):
    """Assemble ``rel`` into one array.  Its keys must form a tensor's chunk grid:
    key dim d indexes array dim d (array dims past the key arity are not split).

    >>> import numpy as np, tra_dask as td
    >>> x = np.arange(30.0).reshape(5, 6)
    >>> bool((td.to_numpy(td.from_numpy(x, (2, 4))) == x).all())
    True
    """
    extents = grid_extents(rel, f"to_numpy({rel.label})")
    return assemble(evaluate(rel) if chunks is None else chunks, extents, rel.type.dtype)


def assemble(chunks: Chunks, extents: tuple, dtype):
    """One array from ``{key: chunk}`` on the grid ``extents`` (:func:`grid_extents`)."""
    offsets = [np.r_[0, np.cumsum(e)] for e in extents]
    xp = array_module(*chunks.values())  # cupy if any chunk is on the device (on_device_of's rule)
    out = xp.empty(tuple(int(sum(e)) for e in extents), dtype=dtype)
    for key, a in chunks.items():
        out[tuple(slice(int(offsets[d][v]), int(offsets[d][v + 1])) for d, v in enumerate(key))] = xp.asarray(a)
    return out


def substitute(expr, mapping: dict):
    """``expr`` with the relations in ``mapping`` (old -> new, same type) replaced,
    everywhere they occur; a tuple/dict of relations keeps its structure."""
    outputs, rebuild = flatten_outputs(expr)
    new: dict = {}
    for node in toposort(outputs):
        if node in mapping:
            repl = mapping[node]
            repl = repl.__tra_relation__() if hasattr(repl, "__tra_relation__") else repl
            if repl.type != node.type:
                raise ValueError(f"substitute: {repl.label} does not have the type of {node.label}")
            new[node] = repl
        elif node.children and any(new[c] is not c for c in node.children):
            import dataclasses

            new[node] = dataclasses.replace(node, **dict(zip(node._children, (new[c] for c in node.children))))
        else:
            new[node] = node
    return rebuild([new[o] for o in outputs])


def on_device(expr) -> bool:
    """Whether any source of ``expr`` (a relation, or a tuple/dict of them) holds GPU
    (cupy) chunks: its plan then computes on the device (:class:`ClusterSpec`'s
    ``gpu``)."""
    return any(getattr(n, "device", False) for n in toposort(flatten_outputs(expr)[0]) if isinstance(n, Source))
