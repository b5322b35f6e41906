"""Einsum subscripts: parsing and checking (before anything runs), and the contraction
order.

``parse`` turns numpy's subscript language (implicit or explicit output, ``...``,
repeated indices, size-1 broadcasting) into one letter per axis of every operand and
of the output, checking ranks and extents and naming the operand, the index and
what would be valid.  ``contraction_paths`` asks opt_einsum (a well-kept library:
its ``optimal``/``dp``/``greedy`` path finders) for candidate pairwise orders; the
front-end costs each candidate through the optimizer and keeps the fastest.
"""

from __future__ import annotations

import string

__all__ = ["parse", "contraction_paths"]

_LETTERS = string.ascii_letters


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
    fresh = [c for c in string.ascii_uppercase + string.ascii_lowercase if c not in used]
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
    ell = "".join(fresh[:n_ell])
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


def contraction_paths(inputs: list[str], output: str, sizes: dict) -> list[tuple]:
    """Candidate pairwise contraction orders (opt_einsum ``contract_path`` format:
    a tuple of position pairs over a shrinking operand list), distinct, best
    (by opt_einsum's flop count) first."""
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
    left = tuple((0, 1) for _ in range(len(inputs) - 1))  # left to right, as written
    if left not in paths:
        paths.append(left)
    return paths
