"""The README's example runs as written, and its claims hold."""

import re
from pathlib import Path


def test_readme_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"## A short example\s+```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {}
    exec(compile(_claims(code), "README.md", "exec"), ns)
    assert ns["C"].type.ntuples == 16 and ns["C"].input.ntuples == 48 and ns["C"].nbytes == 4_000_000


def _claims(block: str) -> str:
    """The code with every "expr   # True" line (a claim) turned into an assert."""
    lines = []
    for line in block.splitlines():
        m = re.match(r"^(?P<expr>[^#]+?)\s+#\s*(?:[^:]*:\s*)?True\b.*$", line)
        lines.append(f"assert {m.group('expr')}" if m else line)
    return "\n".join(lines)


def test_readme_array_example_runs():
    """The first example (td.einsum and @ on numpy and dask arrays) runs as written."""
    text = (Path(__file__).parents[1] / "README.md").read_text()
    assert text.index("## Arrays in, arrays out") < text.index("## A short example")
    code = re.search(r"## Arrays in, arrays out.*?```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {}
    try:
        exec(compile(_claims(code), "README.md", "exec"), ns)
    finally:
        if "client" in ns and ns["client"].cluster is not None:
            ns["client"].cluster.close()
    assert ns["out"].shape == (2000,)
