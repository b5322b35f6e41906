"""Einsum subscripts: parsing and checking (before anything runs), and the contraction
order.

``parse`` turns numpy's subscript language (implicit or explicit output, ``...``,
repeated indices, size-1 broadcasting) into one letter per axis of every operand and
of the output, checking ranks and extents and naming the operand, the index and
what would be valid.  ``interleaved`` reads numpy's other form,
``einsum(op0, sublist0, op1, sublist1, ..., [sublist_out])``.  ``check_optimize``
checks an ``optimize=`` argument (a strategy, numpy's True/False, or a path in
opt_einsum's or numpy's format) against the number of operands.
``contraction_paths`` asks opt_einsum (a well-kept library: its
``optimal``/``dp``/``greedy`` path finders) for candidate contraction orders; the
front-end costs each candidate through the optimizer and keeps the fastest.

An index is one character of a string, but not only a letter: the letters are
what a user writes, and :func:`symbol` gives as many more as are needed (for the
axes of ``tensordot`` and ``...``; no alphabet limits them).
"""

from __future__ import annotations

import string

__all__ = ["parse", "interleaved", "check_optimize", "contraction_paths", "left_to_right", "symbol"]

_LETTERS = string.ascii_letters


def symbol(i: int) -> str:
    """Index number ``i`` as one character: the 52 letters, then characters from
    ``chr(192)`` on (as opt_einsum's ``get_symbol``; never ``,``, ``-``, ``>`` or ``.``).

    >>> symbol(0), symbol(51), symbol(52)
    ('a', 'Z', 'À')
    """
    if i < 52:
        return _LETTERS[i]
    i += 140
    return chr(i + 2048 if i >= 0xD800 else i)  # (past the surrogates)


def _fresh(used, n: int) -> list:
    """``n`` indices not in ``used``: capitals first, then small letters, then symbols."""
    out, k = [], 0
    pool = string.ascii_uppercase + string.ascii_lowercase
    while len(out) < n:
        c = pool[k] if k < 52 else symbol(k)
        if c not in used:
            out.append(c)
        k += 1
    return out


def _sublist(sub, what: str) -> str:
    """A numpy sublist (ints in 0..51 and at most one Ellipsis) as a subscript term;
    0..25 are ``A``-``Z`` and 26..51 ``a``-``z``, as numpy maps them (so the implicit
    output is in numeric order)."""
    import numpy as np

    if isinstance(sub, np.ndarray) and sub.ndim == 1:
        sub = sub.tolist()
    if not isinstance(sub, (list, tuple, range)):
        raise TypeError(f"einsum: {what} must be a list of ints in 0..51 and at most one Ellipsis, got "
                        f"{type(sub).__name__} {sub!r:.60}")
    term = ""
    for v in sub:
        if v is Ellipsis:
            if "..." in term:
                raise ValueError(f"einsum: {what} {list(sub)!r} has more than one Ellipsis")
            term += "..."
        elif isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and 0 <= v < 52:
            term += chr(ord("A") + int(v)) if v < 26 else chr(ord("a") + int(v) - 26)
        else:
            raise ValueError(f"einsum: {what} {list(sub)!r} holds {v!r}; a sublist holds ints in 0..51 and at most "
                             f"one Ellipsis")
    return term


def interleaved(args: tuple):
    """``(subscripts, operands)`` from numpy's interleaved form
    ``(op0, sublist0, op1, sublist1, ..., [sublist_out])``.

    >>> interleaved(("x", [0, 1], "y", [1, 2], [0, 2]))
    ('AB,BC->AC', ['x', 'y'])
    >>> interleaved(("x", [Ellipsis, 0]))
    ('...A', ['x'])
    """
    args = tuple(args)
    if len(args) < 2:
        raise ValueError("einsum: the interleaved form is einsum(op0, sublist0, op1, sublist1, ..., [sublist_out]); "
                         "give a sublist after each operand (or a subscripts string first)")
    out = None
    if len(args) % 2:
        args, out = args[:-1], _sublist(args[-1], "the output sublist")
    ops = list(args[0::2])
    terms = [_sublist(sub, f"the sublist of operand {i}") for i, sub in enumerate(args[1::2])]
    return ",".join(terms) + ("" if out is None else "->" + out), ops


def check_optimize(optimize, nops: int):
    """``optimize=`` as the front-end keeps it: ``"auto"`` (ours: opt_einsum's
    candidates costed), an opt_einsum strategy name, or a path (a tuple of steps,
    each a tuple of positions in the shrinking operand list whose result goes last).

    numpy's meanings are taken: True is ours, False the order written (left to
    right), and a path may start with ``"einsum_path"`` (numpy's format).  A path
    must name existing positions and leave one operand.

    >>> check_optimize(["einsum_path", (0, 1), (0, 1)], 3)
    ((0, 1), (0, 1))
    >>> check_optimize(False, 3)
    ((0, 1), (0, 1))
    """
    import numpy as np

    if optimize is True or (isinstance(optimize, str) and optimize == "auto"):
        return "auto"
    if optimize is False:
        return left_to_right(nops)
    if isinstance(optimize, str):
        from opt_einsum.paths import get_path_fn

        try:
            get_path_fn(optimize)
        except KeyError:
            raise ValueError(f"einsum: optimize={optimize!r} is not a strategy; valid: 'auto', True, False, a path, "
                             f"or an opt_einsum strategy ('optimal', 'dp', 'greedy', 'branch-2', ...)") from None
        return optimize
    if not isinstance(optimize, (list, tuple)):
        raise ValueError(f"einsum: optimize must be 'auto', True, False, an opt_einsum strategy or a path such as "
                         f"[(0, 1), (0, 1)], got {optimize!r}")
    steps = list(optimize)
    if steps and isinstance(steps[0], str):
        if steps[0] != "einsum_path":
            raise ValueError(f"einsum: optimize={optimize!r}: a path is a list of steps (tuples of operand "
                             f"positions), optionally after 'einsum_path' (numpy's format), not {steps[0]!r}")
        steps = steps[1:]
    left, path = nops, []
    for k, step in enumerate(steps):
        ok = isinstance(step, (list, tuple)) and len(step) > 0 and all(
            isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in step)
        if ok and all(0 <= i < left for i in step) and len(set(step)) == len(step):
            path.append(tuple(int(i) for i in step))
            left -= len(step) - 1
            continue
        raise ValueError(f"einsum: optimize path step {k} is {step!r}; with {left} operand(s) left a step is a "
                         f"tuple of distinct positions in 0..{left - 1}")
    if left != 1:
        raise ValueError(f"einsum: the optimize path {optimize!r} leaves {left} operands of {nops}; a path "
                         f"contracts them to one (e.g. {[(0, 1)] * (nops - 1)!r})")
    return tuple(path)


def _split(subscripts: str, nops: int):
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum: subscripts must be a string like 'ij,jk->ik', got {subscripts!r}")
    s = subscripts.replace(" ", "")
    if s.count("->") > 1:
        raise ValueError(f"einsum {subscripts!r}: '->' appears more than once")
    lhs, arrow, out = s.partition("->")
    ins = lhs.split(",")
    if len(ins) != nops:
        raise ValueError(
            f"einsum {subscripts!r}: {len(ins)} operand subscript(s) for {nops} operand(s); "
            f"give one comma-separated term per operand"
        )
    for term in ins + ([out] if arrow else []):
        bad = set(term.replace("...", "")) - set(_LETTERS)
        if bad or term.replace("...", "").count(".") or "." in term.replace("...", ""):
            raise ValueError(
                f"einsum {subscripts!r}: term {term!r} has invalid characters {sorted(bad) or ['.']}; "
                f"indices are letters a-z, A-Z and one '...' per term"
            )
        if term.count("...") > 1:
            raise ValueError(f"einsum {subscripts!r}: term {term!r} has more than one '...'")
    return ins, (out if arrow else None)


def parse(subscripts: str, shapes: list[tuple]):
    """``(inputs, output, sizes)``: one letter per axis of each operand (ellipses
    expanded to fresh letters), the output letters, and each letter's extent.

    Size-1 axes broadcast against a larger extent of the same index (as numpy
    does); a letter whose every axis has extent 1 has extent 1.

    >>> parse("ij,jk", [(2, 3), (3, 4)])
    (['ij', 'jk'], 'ik', {'i': 2, 'j': 3, 'k': 4})
    >>> parse("...j,j->...", [(5, 2, 3), (3,)])[:2]
    (['ABj', 'j'], 'AB')
    """
    ins, out = _split(subscripts, len(shapes))
    used = set("".join(ins) + (out or ""))
    # ellipsis: right-aligned broadcast dims, one fresh letter per dim of the widest
    n_ell = 0
    for i, (term, shape) in enumerate(zip(ins, shapes)):
        named = len(term.replace("...", ""))
        if "..." in term:
            if len(shape) < named:
                raise ValueError(
                    f"einsum {subscripts!r}: operand {i} has shape {shape} (rank {len(shape)}) but "
                    f"{term!r} names {named} axes besides '...'"
                )
            n_ell = max(n_ell, len(shape) - named)
        elif len(shape) != named:
            raise ValueError(
                f"einsum {subscripts!r}: operand {i} has shape {shape} (rank {len(shape)}) but its "
                f"subscript {term!r} names {named} axes; give one letter per axis"
            )
    ell = "".join(_fresh(used, n_ell))
    expanded = []
    for term, shape in zip(ins, shapes):
        if "..." in term:
            k = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ell[n_ell - k:] if k else "")
        expanded.append(term)
    sizes: dict = {}
    where: dict = {}
    for i, (term, shape) in enumerate(zip(expanded, shapes)):
        for c in set(term):  # a diagonal: numpy broadcasts across operands, never within one
            ext = {int(n) for t, n in zip(term, shape) if t == c}
            if len(ext) > 1:
                raise ValueError(
                    f"einsum {subscripts!r}: index {c!r} is repeated in operand {i} (shape {shape}) with "
                    f"extents {sorted(ext)}; a repeated index takes a diagonal, so its axes need one extent"
                )
    for i, (term, shape) in enumerate(zip(expanded, shapes)):
        for c, n in zip(term, shape):
            n = int(n)
            if c not in sizes or sizes[c] == 1:
                sizes[c], where[c] = n, i
            elif n != sizes[c] and n != 1:
                raise ValueError(
                    f"einsum {subscripts!r}: index {c!r} has extent {sizes[c]} in operand {where[c]} "
                    f"but {n} in operand {i} (shape {shape}); an index has one extent (or 1, which "
                    f"broadcasts)"
                )
    if out is None:  # numpy's implicit output: ellipsis dims, then letters seen once, sorted
        counts = {c: "".join(expanded).count(c) for c in set("".join(expanded))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        if "..." in out:
            out = out.replace("...", ell)
        elif n_ell and any(sizes[c] != 1 for c in ell):
            raise ValueError(
                f"einsum {subscripts!r}: the inputs have '...' dims of extents "
                f"{[sizes[c] for c in ell]} but the output names no '...'; add '...' to the output"
            )
        for c in out:
            if c not in sizes:
                valid = "".join(sorted(set("".join(ins).replace(".", ""))))
                raise ValueError(
                    f"einsum {subscripts!r}: output index {c!r} appears in no input; valid output "
                    f"indices: {valid!r}"
                )
        dup = sorted({c for c in out if out.count(c) > 1})
        if dup:
            raise ValueError(f"einsum {subscripts!r}: output index {dup[0]!r} appears twice; an output "
                             f"index appears once")
    return expanded, out, sizes


def left_to_right(n: int) -> tuple:
    """The path that contracts ``n`` operands left to right, as written: the first
    two, then their result (which opt_einsum's format puts last) with the next.

    >>> left_to_right(4)
    ((0, 1), (0, 2), (0, 1))
    """
    return tuple([(0, 1)] + [(0, m - 1) for m in range(n - 1, 1, -1)]) if n > 1 else ()


def contraction_paths(inputs: list[str], output: str, sizes: dict) -> list[tuple]:
    """Candidate contraction orders (opt_einsum ``contract_path`` format: a tuple of
    steps of positions over a shrinking operand list; a step may be one operand,
    ``dp``'s reductions, or more than two), distinct, best (by opt_einsum's flop
    count) first."""
    import opt_einsum

    if len(inputs) < 2:
        return [()]
    eq = ",".join(inputs) + "->" + output
    shapes = [tuple(sizes[c] for c in t) for t in inputs]
    finders = ["optimal", "dp", "greedy"] if len(inputs) <= 5 else ["dp", "greedy", "random-greedy"]
    paths: list = []
    for f in finders:
        try:
            path, _ = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=f)
        except Exception:  # a finder that cannot handle this case is simply not a candidate
            continue
        path = tuple(tuple(int(i) for i in step) for step in path)
        if path not in paths:
            paths.append(path)
    left = left_to_right(len(inputs))  # as written
    if left not in paths:
        paths.append(left)
    return paths
