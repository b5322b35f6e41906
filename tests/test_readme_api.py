"""The API reference's "API at a glance" table (docs/api.md, moved there from the
README) agrees with the code's signatures.

Every call written in the table (a backticked ``name(args...)``, optionally ``-> Result``)
is looked up and checked against :func:`inspect.signature`:

* ``td.name(...)`` / ``tra_dask.a.b(...)`` / ``@td.kernel(...)``: that object;
* a bare ``name(...)``: first in the modules the row names (``tra_dask.physical``,
  ``tra_dask.keys``, ``td.programs.…``, ``tra_dask.viz.…``), then in ``tra_dask``;
* a method ``.name(...)``: on the class the row last named (``td.ClusterSpec(...)``, or
  the result of ``... -> Plan`` / ``-> RelationFutures``); ``plan.name(...)`` on
  :class:`tra_dask.Plan`; ``ClusterSpec.load(...)`` through ``td.ClusterSpec``.

For each parameter the table writes: it must exist (``*dims`` must be a ``*args``
parameter); ``param=value`` with a Python literal ``value`` must be exactly the code's
default (compared by value and type, so ``False`` is not ``0``); ``param=...`` or a
value that is not a literal (``shape="same" | "broadcast" | fn``) checks existence only;
a positional argument that is not a name (``td.from_chunks({key: array})``) is an example.
A function taking ``**kw`` that hands them on (``td.submit``, i.e. ``tra_dask.api.submit`` → ``tra_dask.runtime.submit``,
``td.compute`` → ``tra_dask.runtime.compute`` → ``tra_dask.runtime.submit``) is checked
along that chain: a parameter's default is the one of the first function in the chain
that names it.  Attributes without a call (``.type``, ``.cost``) are not checked.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest


API_DOC = Path(__file__).parents[1] / "docs" / "api.md"

# where a function's **kw go (documented in its docstring); checked in this order
DELEGATES = {
    "tra_dask.api.submit": "tra_dask.runtime.submit.submit",
    "tra_dask.api.compute": "tra_dask.runtime.submit.compute",
    "tra_dask.runtime.submit.compute": "tra_dask.runtime.submit.submit",
}
# objects the table calls methods on by a variable's name
OBJECTS = {"plan": "tra_dask.Plan"}
# the class a row's bare ".method()" calls mean when no earlier call in the row names one
ROW_CLASS = {"what a node knows": "tra_dask.Relation"}
# calls in the table that are examples or a user's function, not an API signature:
# span -> what is checked instead (an object that must exist), or None
EXAMPLES = {
    "fn(key) -> chunk": None,  # the user's chunk function for from_function
    "A.join(B, ...)": "tra_dask.Relation.join",  # "the same names as methods"
}

NAME = re.compile(r"^(?P<deco>@)?(?P<name>[A-Za-z_.][\w.]*)\(")


class Call:
    """A backticked ``[@]name(args) [-> ret]``; ``parse`` gives None for other spans."""

    def __init__(self, name: str, args: str, ret: str):
        self.name, self.args, self.ret = name, args, ret

    @classmethod
    def parse(cls, span: str):
        m = NAME.match(span)
        if not m:
            return None
        depth, start = 0, m.end() - 1
        for i in range(start, len(span)):  # the parenthesis that closes the argument list
            depth += {"(": 1, ")": -1}.get(span[i], 0)
            if depth == 0:
                break
        else:
            return None
        rest = span[i + 1:].strip()
        if rest and not rest.startswith("->"):
            return None
        return cls(m.group("name"), span[start + 1:i], rest[2:].strip())


def table_lines() -> list[str]:
    """The lines of the table under "## The API at a glance" (header and rule included)."""
    text = API_DOC.read_text()
    m = re.search(r"^## The API at a glance\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "docs/api.md has no '## The API at a glance' section"
    lines = []
    for line in m.group(1).splitlines():
        if line.startswith("|"):
            lines.append(line)
        elif lines:
            break  # the table ended
    return lines


def cells(line: str) -> list[str]:
    """A table line's cells; GitHub splits cells at every ``|`` not written ``\\|``, even
    inside backticks."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table_rows() -> list[tuple[str, str]]:
    """``[(row label, row text)]`` of the table."""
    rows = []
    for line in table_lines()[2:]:
        c = cells(line)
        if len(c) == 2:
            rows.append((c[0], c[1]))
    return rows


def spans(text: str) -> list[str]:
    return [s.replace("\\|", "|").strip() for s in re.findall(r"`([^`]+)`", text)]


def resolve(path: str):
    """The object at a dotted path (``td.`` means ``tra_dask.``), or None."""
    parts = path.split(".")
    if parts[0] == "td":
        parts[0] = "tra_dask"
    if parts[0] != "tra_dask":
        return None
    obj = importlib.import_module("tra_dask")
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ImportError:
                return None
    return obj


def qualname(obj) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def split_args(args: str) -> list[str]:
    """Top-level comma-separated arguments (brackets and quotes respected)."""
    out, depth, quote, cur = [], 0, None, ""
    for ch in args:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def chain(obj) -> list:
    """The callables whose signatures together make ``obj``'s (following **kw)."""
    out = [obj]
    while qualname(out[-1]) in DELEGATES:
        mod, _, name = DELEGATES[qualname(out[-1])].rpartition(".")
        out.append(getattr(importlib.import_module(mod), name))
    return out


def params(obj) -> list[tuple[object, dict]]:
    """``[(callable, {name: Parameter})]`` along ``obj``'s chain (self left out)."""
    out = []
    for f in chain(obj):
        sig = inspect.signature(f)
        out.append((f, {n: p for n, p in sig.parameters.items() if n != "self"}))
    return out


def literal(value: str):
    """The table's default as a Python value, or ``NotImplemented`` when it is not a
    literal (``...``, ``[...]``, ``"a" | fn``): then only the parameter's existence counts."""
    if "..." in value:
        return NotImplemented
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return NotImplemented


def same(a, b) -> bool:
    return type(a) is type(b) and a == b


def check_call(row: str, span: str, target, where: str) -> list[str]:
    """Problems with one call ``span`` of ``row`` whose object is ``target``."""
    m = Call.parse(span)
    problems = []
    span = f"{m.name}(...)" if len(span) > 40 else span
    if not callable(target):
        return [f"row {row!r}, `{span}`: {where} is not callable"]
    try:
        sigs = params(target)
    except (TypeError, ValueError):
        return [f"row {row!r}, `{span}`: no signature for {where}"]
    named = " -> ".join(qualname(f) for f, _ in sigs)
    for arg in split_args(m.args):
        if arg == "...":
            continue
        if arg.startswith("**"):
            if not any(p.kind is p.VAR_KEYWORD for _, ps in sigs for p in ps.values()):
                problems.append(f"row {row!r}, `{span}`: the table writes {arg} but {named} takes no **kwargs")
            continue
        if arg.startswith("*"):
            name = arg[1:]
            found = [ps[name] for _, ps in sigs if name in ps]
            if not found or found[0].kind is not inspect.Parameter.VAR_POSITIONAL:
                problems.append(f"row {row!r}, `{span}`: parameter *{name}: the table lists it, "
                                f"but {named} has no *{name}")
            continue
        name, eq, value = arg.partition("=")
        name, value = name.strip(), value.strip()
        if not eq and not name.isidentifier():
            continue  # an example value (`td.from_chunks({key: array})`), not a parameter's name
        found = [(f, ps[name]) for f, ps in sigs if name in ps]
        if not found:
            problems.append(f"row {row!r}, `{span}`: parameter {name}: the table lists it"
                            f"{' with default ' + value if eq else ''}, but {named} has no such parameter "
                            f"(it has: {', '.join(n for _, ps in sigs for n in ps)})")
            continue
        f, p = found[0]
        if not eq:
            continue
        want = literal(value)
        if want is NotImplemented:
            continue
        if p.default is inspect.Parameter.empty:
            problems.append(f"row {row!r}, `{span}`: parameter {name}: table default {value}, "
                            f"but {qualname(f)} has no default for it")
        elif not same(want, p.default):
            problems.append(f"row {row!r}, `{span}`: parameter {name}: table default {value}, "
                            f"code default {p.default!r} ({qualname(f)})")
    ret = m.ret
    if ret.isidentifier() and resolve(f"td.{ret}") is None:
        problems.append(f"row {row!r}, `{span}`: returns {ret}, which is not tra_dask.{ret}")
    return problems


def row_calls(row: str, text: str):
    """``[(span, object or None, where)]`` for every call in a row, resolved in context."""
    names = spans(row) + spans(text)
    modules = []  # the modules the row names, for bare names
    for s in names:
        head = Call.parse(s).name.rpartition(".")[0] if Call.parse(s) else s
        for cand in (s, head):
            if re.fullmatch(r"(td|tra_dask)(\.\w+)+", cand) and inspect.ismodule(resolve(cand)):
                modules.append(resolve(cand).__name__)
    cls = resolve(ROW_CLASS[row]) if row in ROW_CLASS else None
    out = []
    for s in spans(text):
        m = Call.parse(s)
        if not m:
            continue
        name = m.name
        if s in EXAMPLES:
            out.append((s, resolve(EXAMPLES[s]) if EXAMPLES[s] else "skip", EXAMPLES[s] or "a user's function"))
            continue
        if name.startswith((".",)):
            where = f"{qualname(cls)}{name}" if cls is not None else f"(no class in this row){name}"
            target = getattr(cls, name[1:], None) if cls is not None else None
        elif name.split(".")[0] in ("td", "tra_dask"):
            where, target = name, resolve(name)
        elif name.split(".")[0] in OBJECTS:
            head, _, rest = name.partition(".")
            where = f"{OBJECTS[head]}.{rest}"
            target = resolve(where)
        else:
            target, where = None, f"tra_dask.{name} (or in {', '.join(modules) or 'no module named in the row'})"
            for mod in [*modules, "tra_dask"]:
                target = resolve(f"{mod}.{name}")
                if target is not None:
                    where = f"{mod}.{name}"
                    break
        out.append((s, target, where))
        # what later ".method()" spans of this row are called on
        ret = m.ret
        if ret.isidentifier() and inspect.isclass(resolve(f"td.{ret}")):
            cls = resolve(f"td.{ret}")
        elif inspect.isclass(target):
            cls = target
    return out


ROWS = table_rows()


def test_the_table_is_there_and_read():
    lines = table_lines()
    assert len(lines) > 10 and set(lines[1]) <= set("|-: "), "the API table has no header"
    broken = [line[:80] for line in lines if len(cells(line)) != 2]
    assert not broken, f"API table rows that do not have two cells (an unescaped | ?): {broken}"
    labels = [r for r, _ in ROWS]
    for expected in ("sources", "operators", "results", "plans", "optimizer", "cluster", "runtime", "pictures"):
        assert expected in labels, f"no row {expected!r} in the API table (rows: {labels})"
    calls = [c for r, t in ROWS for c in row_calls(r, t)]
    assert len(calls) >= 40, f"only {len(calls)} calls read from the API table"
    defaults = sum("=" in a and "..." not in a for s, _, _ in calls for a in split_args(Call.parse(s).args))
    assert defaults >= 15, f"only {defaults} documented defaults read from the API table"


@pytest.mark.parametrize("row,text", ROWS, ids=[r for r, _ in ROWS])
def test_api_table_row_matches_the_code(row, text):
    problems = []
    for span, target, where in row_calls(row, text):
        if target == "skip":
            continue
        if target is None:
            problems.append(f"row {row!r}, `{span}`: the table names {where}, which does not exist")
            continue
        if span not in EXAMPLES:
            problems += check_call(row, span, target, where)
    assert not problems, "the API table (docs/api.md) disagrees with the code:\n  " + "\n  ".join(problems)
