"""The documentation's examples run as written, and their claims hold: the README's
example, and docs/getting-started.md's two (moved there from the README)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
GETTING_STARTED = ROOT / "docs" / "getting-started.md"
# docs whose python blocks need what the suite's machines may lack (a GPU), run elsewhere
NOT_RUN_HERE = {"gpu.md"}  # tests/test_gpu.py runs its workloads where a GPU is present


def _claims(block: str) -> str:
    """The code with every "expr   # True" line (a claim) turned into an assert."""
    lines = []
    for line in block.splitlines():
        m = re.match(r"^(?P<indent>\s*)(?P<expr>[^#\s][^#]*?)\s+#\s*(?:[^:]*:\s*)?True\b.*$", line)
        lines.append(f"{m.group('indent')}assert {m.group('expr')}" if m else line)
    return "\n".join(lines)


def _block(text: str, heading: str) -> str:
    """The first ```python block after ``heading``."""
    m = re.search(re.escape(heading) + r".*?```python\n(.*?)```", text, re.S)
    assert m, f"no python block after {heading!r}"
    return m.group(1)


def test_claims_are_asserts():
    code = _claims("x = 1\nx == 1   # True\n    y == 2  # True: why\nz  # not a claim\n")
    assert code.splitlines() == ["x = 1", "assert x == 1", "    assert y == 2", "z  # not a claim"]


@pytest.mark.cluster
def test_readme_example_runs(tmp_path):
    """The README's example (td.einsum on numpy arrays), run as the script it says it is:
    the embedded cluster starts under ``if __name__ == "__main__":`` and closes at exit."""
    text = README.read_text()
    code = _block(text, "## An example")
    assert "td.einsum(" in code and 'if __name__ == "__main__":' in code
    assert len(code.splitlines()) <= 25, "the README's example is meant to be short"
    script = tmp_path / "readme_example.py"
    script.write_text(_claims(code) + "\n    assert out.shape == (2000,)\n    print('README example: ok')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0 and "README example: ok" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.cluster
def test_short_example_runs():
    """docs/getting-started.md's relation-level example (the README's "A short example" before)."""
    code = _block(GETTING_STARTED.read_text(), "## A short example")
    ns: dict = {}
    exec(compile(_claims(code), "docs/getting-started.md", "exec"), ns)
    assert ns["C"].type.ntuples == 16 and ns["C"].input.ntuples == 48 and ns["C"].nbytes == 4_000_000


@pytest.mark.cluster
def test_array_example_runs():
    """docs/getting-started.md's first example (td.einsum and @ on numpy and dask arrays)
    runs as written."""
    text = GETTING_STARTED.read_text()
    assert text.index("## Arrays in, arrays out") < text.index("## A short example")
    code = _block(text, "## Arrays in, arrays out")
    ns: dict = {}
    try:
        exec(compile(_claims(code), "docs/getting-started.md", "exec"), ns)
    finally:
        if "client" in ns and ns["client"].cluster is not None:
            ns["client"].cluster.close()
    assert ns["out"].shape == (2000,)


def test_every_python_block_in_the_docs_is_run():
    """No example in README.md or docs/ goes untested: every ```python block is one of
    those the tests above run."""
    run = {_block(README.read_text(), "## An example"),
           _block(GETTING_STARTED.read_text(), "## A short example"),
           _block(GETTING_STARTED.read_text(), "## Arrays in, arrays out")}
    found = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        if path.name in NOT_RUN_HERE:
            continue
        found += [(path.name, b) for b in re.findall(r"```python\n(.*?)```", path.read_text(), re.S)]
    assert len(found) == len(run) == 3
    untested = [name for name, b in found if b not in run]
    assert not untested, f"python blocks no test runs, in: {untested}"
