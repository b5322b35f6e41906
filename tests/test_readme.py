"""The README's example runs as written, and its claims hold."""

import re
from pathlib import Path


def test_readme_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"## A short example\s+```python\n(.*?)```", text, re.S).group(1)
    lines = []
    for line in code.splitlines():
        # "expr   # True" lines are claims: assert them
        m = re.match(r"^(?P<expr>[^#]+?)\s+#\s*(?:[^:]*:\s*)?True\s*$", line)
        lines.append(f"assert {m.group('expr')}" if m else line)
    ns: dict = {}
    exec(compile("\n".join(lines), "README.md", "exec"), ns)
    assert ns["C"].type.ntuples == 16 and ns["C"].input.ntuples == 48 and ns["C"].nbytes == 4_000_000
