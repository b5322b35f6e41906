"""Every notebook runs headlessly, its cells check their results, its charts render as
images, and the cluster starts in a cell of its own before anything runs on it."""

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))

# a cell that draws a chart
DRAWS = re.compile(r"\bplt\.|\.subplots\(|\.visualize\(|\bvisualize_sites\(")
# a cell that starts or connects to a cluster; one that runs on it or times something
STARTS = re.compile(r"\bembedded_client\(|\bClient\(|\bLocalCluster\(")
RUNS = re.compile(r"\btd\.(submit|compute)\(|\bperf_counter\(|\btime\.time\(|%%?time")
TIMES = re.compile(r"\bperf_counter\(|\btime\.time\(|%%?time")


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_there_are_four_notebooks():
    assert [p.stem for p in NOTEBOOKS] == ["01-quickstart", "02-matmul-plans", "03-ffnn", "04-real-cluster"]


def test_the_chart_notebooks_draw_charts():
    drawn = {p.stem for p in NOTEBOOKS if any(DRAWS.search(c.source) for c in code_cells(nbformat.read(p, 4)))}
    assert {"02-matmul-plans", "03-ffnn"} <= drawn


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cluster_starts_in_its_own_cell_before_anything_is_timed(path):
    """Cell timings (and the timings a notebook measures) must not include the
    cluster's start-up: the cluster starts (or is connected to) in a cell that times
    nothing (a warm-up run there is fine: its line says "warm"), before any cell that runs on it or times
    anything, and every later run goes to that client."""
    cells = [c.source for c in code_cells(nbformat.read(path, 4))]
    uses = [i for i, s in enumerate(cells) if RUNS.search(s) or STARTS.search(s)]
    if not uses:
        pytest.skip("uses no cluster")
    starts = [i for i, s in enumerate(cells) if STARTS.search(s)]
    assert starts, f"{path.stem}: runs on a cluster it starts implicitly; start it in a cell of its own"
    first = starts[0]
    assert not TIMES.search(cells[first]), f"{path.stem}: the cell that starts the cluster times something"
    work = [line.strip() for line in cells[first].splitlines() if RUNS.search(line) and "warm" not in line]
    assert not work, f"{path.stem}: the cell that starts the cluster also runs {work} (only a warm-up belongs there)"
    early = [cells[i].splitlines()[0] for i in uses if i < first]
    assert not early, f"{path.stem}: cells run or time before the cluster is started: {early}"
    implicit = [line.strip() for s in cells for line in s.splitlines()
                if re.search(r"\btd\.(submit|compute)\(", line) and "client=" not in line]
    assert not implicit, f"{path.stem}: a run that may start another cluster (pass client=): {implicit}"


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    return output.get("data", {}).get("text/plain", "")


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_its_checks_hold(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in code_cells(nb)), "commit notebooks without outputs"
    assert sum("assert" in c.source for c in code_cells(nb)) >= 2
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in code_cells(nb) for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    for i, cell in enumerate(code_cells(nb)):
        first = cell.source.splitlines()[0]
        images = [o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
        if DRAWS.search(cell.source):
            assert images, f"{path.stem} cell {i} ({first!r}) draws a chart but shows no image/png"
            assert len(set(images)) == len(images), f"{path.stem} cell {i} ({first!r}) shows its chart twice"
        # a figure's text stand-in, with no image beside it, means the chart did not render
        bare = [_text(o)[:60] for o in cell.outputs
                if "<Figure size" in _text(o) and "image/png" not in o.get("data", {})]
        assert not bare, f"{path.stem} cell {i} ({first!r}) shows {bare} instead of a chart"
