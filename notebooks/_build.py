"""Writes the notebooks (without outputs) from the cells below: python notebooks/_build.py"""

import hashlib
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent


def nb(name, cells):
    book = nbf.v4.new_notebook()
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    book.cells = [nbf.v4.new_markdown_cell(c[3:].strip()) if c.startswith("md:") else nbf.v4.new_code_cell(c.strip())
                  for c in cells]
    for i, cell in enumerate(book.cells):  # stable ids: rebuilding changes only what changed
        cell.id = hashlib.sha1(f"{name}/{i}".encode()).hexdigest()[:8]
    nbf.write(book, HERE / f"{name}.ipynb")


# The cluster starts in a cell of its own (with a warm-up run: workers import tra_dask,
# the scheduler plugin registers), so no timed cell includes the start-up.
CLUSTER = """# the cluster, in a cell of its own: its start-up is part of no timing below
from tra_dask.runtime import embedded_client

client = embedded_client(2)   # a LocalCluster on 127.0.0.1: 2 single-threaded worker processes
w = td.from_numpy(np.ones((4, 4)), chunks=(2, 2), name="warm-up")
warm_up = td.aggregate(td.join(w, w, (1,), (0,), "matmul"), (0, 2), "add")   # a small matmul
assert np.allclose(td.submit(warm_up, client=client).to_numpy(), 4 * np.ones((4, 4)))   # untimed
client"""


nb("01-quickstart", [
    """md: # tra_dask quickstart: TRA expression → plan → futures → result

A tensor is a relation of `(key, chunk)` pairs. We write `A @ B` in the tensor relational
algebra, look at the plan the optimizer picks, run it on an embedded Dask cluster
(127.0.0.1 only) and check the result against numpy.""",
    """import numpy as np
import tra_dask as td
from tra_dask.programs import matmul

rng = np.random.default_rng(0)
a, b = rng.normal(size=(600, 400)), rng.normal(size=(400, 300))
A = td.from_numpy(a, chunks=(200, 100), name="A")
B = td.from_numpy(b, chunks=(100, 150), name="B")
C = matmul(A, B)   # aggregate(join(A, B, (1,), (0,), "matmul"), (0, 2), "add")
C                  # the relation's exact type, no data touched""",
    """assert C.frontier == (3, 2) and C.input.ntuples == 3 * 4 * 2
# the reference evaluator (in this process) is the oracle
assert np.allclose(td.to_numpy(C), a @ b)""",
    """plan = td.optimize(C, sites=2)
plan   # explain tree: operators, placements, tuples, floats moved; the alternatives it considered""",
    """md: Start the cluster in a cell of its own, so that its start-up is not counted in the
cells below. `td.submit(..., sites=2)` with no client starts this same embedded
`LocalCluster` (two single-threaded worker processes on 127.0.0.1) on first use.""",
    CLUSTER,
    """assert plan.cost.floats_moved <= plan.compiled.cost.floats_moved
rf = td.submit(C, client=client)   # futures, one per output chunk, every task pinned to its site's worker
rf""",
    """result = rf.to_numpy()
assert np.allclose(result, a @ b)
print("bytes moved between workers: predicted", rf.plan.cost.bytes_moved, "measured", rf.transfers())
assert rf.transfers() == rf.plan.cost.bytes_moved
print(rf.dashboard_link)""",
    """out = td.compute(td.transform(C, "relu"), client=client)   # with a progress bar
assert np.allclose(td.to_numpy(C, out), np.maximum(a @ b, 0))""",
])

nb("02-matmul-plans", [
    """md: # Three ways to multiply matrices: BMM, CMM, RMM

The optimizer reaches the broadcast (BMM), cross-product (CMM) and replication/3-D (RMM)
plans from the paper's single compiled plan. We run the best plan of each kind on the
embedded cluster and compare predicted and measured bytes and the time.""",
    """%matplotlib inline
import time
import numpy as np
import matplotlib.pyplot as plt
import tra_dask as td
from tra_dask.programs import matmul, random_uniform

X = random_uniform((800, 3200), (200, 800), seed=1, name="X")   # a common large dim
Y = random_uniform((3200, 800), (800, 200), seed=2, name="Y")
C = matmul(X, Y)
plan = td.optimize(C, sites=2)
best = {}
for p in [plan, *plan.alternatives]:
    kind = p.strategies()[0].split(" ")[0] if p.strategies() else None
    if kind in ("BMM", "CMM", "RMM") and (kind not in best or p.cost.floats_moved < best[kind].cost.floats_moved):
        best[kind] = p
assert set(best) == {"BMM", "CMM", "RMM"}
{k: p.cost.floats_moved for k, p in best.items()}""",
    CLUSTER,
    """reference = td.to_numpy(X) @ td.to_numpy(Y)
rows = []
for kind, p in sorted(best.items()):
    t0 = time.perf_counter()
    rf = td.submit(p, client=client).wait()
    wall = time.perf_counter() - t0
    assert np.allclose(rf.to_numpy(), reference)
    assert rf.transfers() == p.cost.bytes_moved
    rows.append((kind, p.cost.bytes_moved, rf.transfers(), wall))
rows""",
    """kinds = [r[0] for r in rows]
x = np.arange(len(rows))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.bar(x - 0.2, [r[1] / 2**20 for r in rows], 0.4, label="predicted", color="#bbb")
ax1.bar(x + 0.2, [r[2] / 2**20 for r in rows], 0.4, label="measured", color="#47a")
ax1.set_xticks(x, kinds); ax1.set_ylabel("MiB moved between workers")
ax1.set_ylim(0, 1.3 * max(max(r[1], r[2]) for r in rows) / 2**20); ax1.legend(loc="upper center", ncol=2)
ax2.bar(kinds, [r[3] for r in rows], color=["#4a7", "#47a", "#a74"])
ax2.set_ylabel("seconds (cluster already up)")
fig.suptitle(f"chosen: {plan.strategies()[0]}")
fig.tight_layout()
plt.show()""",
    """chosen = plan.strategies()[0].split(" ")[0]
assert best[chosen].cost.floats_moved == min(p.cost.floats_moved for p in best.values())""",
])

nb("03-ffnn", [
    """md: # FFNN training step: data- vs model-parallel

For a two-layer network (X: N×D, W1: D×H, W2: H×L) broadcasting the weights (data
parallelism) moves about D·H floats per site; broadcasting the data (model parallelism)
about N·D. As the hidden layer H grows the optimizer switches: here is the crossover in
the paper's terms — floats moved (`objective="bytes"`, the paper's cost model; the
default objective, predicted time, also counts per-task overheads, which dominate at
these toy sizes) —, keys only (nothing is computed), then one real SGD step on the
cluster.""",
    """%matplotlib inline
import numpy as np
import matplotlib.pyplot as plt
import tra_dask as td
from tra_dask.programs import ffnn_sgd_step


class NoData:
    def __call__(self, key):
        raise AssertionError("planning never loads data")


def src(shape, blocks, name):
    return td.from_function(NoData(), shape, tuple(-(-n // b) for n, b in zip(shape, blocks)), "float32", name=name)


N, D, L = 2000, 200, 10
rows = []
for H in (100, 300, 1000, 3000, 10000):
    step = ffnn_sgd_step(src((N, D), (4, 2), "X"), src((N, L), (4, 1), "Y"), src((D, H), (2, 4), "W1"),
                         src((H, L), (4, 1), "W2"), 0.1)
    plan = td.optimize(step, sites=4, cost_model="paper", objective="bytes")
    first = plan.strategies()[0]
    rows.append((H, plan.cost.floats_moved, "data-parallel" if "data-parallel" in first else
                 "model-parallel" if "model-parallel" in first else first))
rows""",
    """kinds = [r[2] for r in rows]
assert kinds[0] == "data-parallel" and kinds[-1] == "model-parallel"   # the crossover
fig, ax = plt.subplots(figsize=(6, 3))
for kind, colour in (("data-parallel", "#47a"), ("model-parallel", "#a74")):
    pts = [(h, c) for h, c, k in rows if k == kind]
    if pts:
        ax.loglog(*zip(*pts), "o-", color=colour, label=kind)
ax.set_xlabel("hidden units H"); ax.set_ylabel("floats moved (chosen plan)"); ax.legend()
plt.show()""",
    CLUSTER,
    """rng = np.random.default_rng(0)
n, d, h, l = 64, 20, 30, 5
x, y = rng.normal(size=(n, d)), np.eye(l)[rng.integers(0, l, n)]
w1, w2 = rng.normal(size=(d, h)) * 0.3, rng.normal(size=(h, l)) * 0.3
W1_new, W2_new = ffnn_sgd_step(td.from_numpy(x, (16, 10)), td.from_numpy(y, (16, 5)),
                               td.from_numpy(w1, (10, 15)), td.from_numpy(w2, (15, 5)), 0.5)
r1, r2 = td.compute((W1_new, W2_new), client=client)
e1, e2 = td.evaluate((W1_new, W2_new))
assert np.allclose(td.to_numpy(W1_new, r1), td.to_numpy(W1_new, e1))
assert np.allclose(td.to_numpy(W2_new, r2), td.to_numpy(W2_new, e2))
assert not np.allclose(td.to_numpy(W1_new, r1), w1)   # it did take a step""",
])

nb("04-real-cluster", [
    """md: # A real cluster: `dask scheduler` and `dask worker` from the shell

The cell below starts what you would type in a shell (`dask scheduler --host 127.0.0.1
--dashboard-address 127.0.0.1:0 --scheduler-file …` and two `dask worker --scheduler-file …
--host 127.0.0.1 --dashboard-address 127.0.0.1:0`: Dask listens on every interface unless
told, so each process gets `--host` and each dashboard its address on 127.0.0.1), then we
connect, run a TRA program, open the tra_dask page of the dashboard, and shut the cluster
down. (`tests/test_real_cluster.py` runs that cell and checks that nothing listens beyond
127.0.0.1.)""",
    """import atexit, json, os, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path

dask_cmd = str(Path(sys.executable).with_name("dask"))
tmp = Path(tempfile.mkdtemp())
sched_file = tmp / "scheduler.json"
env = dict(os.environ, DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH="1000000")
procs = [subprocess.Popen([dask_cmd, "scheduler", "--host", "127.0.0.1", "--port", "0",
                           "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
for _ in range(600):
    if sched_file.exists():
        break
    time.sleep(0.1)
procs += [subprocess.Popen([dask_cmd, "worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
                            "--nthreads", "1", "--dashboard-address", "127.0.0.1:0"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
atexit.register(lambda: [p.kill() for p in procs if p.poll() is None])   # if the kernel stops early
json.loads(sched_file.read_text())["address"]""",
    """from distributed import Client

client = Client(scheduler_file=str(sched_file), timeout=60)   # connect, in a cell of its own
client.wait_for_workers(2, timeout=60)
client""",
    """import numpy as np
import tra_dask as td
from tra_dask.programs import matmul, random_uniform

X = random_uniform((400, 400), 100, seed=1, name="X")
rf = td.submit(matmul(X, X), client=client)
assert np.allclose(rf.to_numpy(), td.to_numpy(X) @ td.to_numpy(X))
print("measured", rf.transfers(), "predicted", rf.plan.cost.bytes_moved)
rf.dashboard_link""",
    """page = urllib.request.urlopen(rf.dashboard_link.split("#")[0], timeout=10).read().decode()
assert rf.token in page and "LocalAggregate" in page and f"{rf.plan.cost.bytes_moved:,}" in page
print(page[page.index("<h2"):page.index("<h2") + 300])""",
    """client.shutdown()   # stops the scheduler and the workers we started
client.close()
for p in procs:
    p.wait(timeout=30)
assert all(p.returncode is not None for p in procs)""",
])
