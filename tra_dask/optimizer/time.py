"""The time model: a plan's predicted seconds on a :class:`ClusterSpec`.

It reads the one derivation of a plan's work (:mod:`tra_dask.physical.work`, through
the per-node costs of :mod:`.cost`): per node and site, the flops its kernels run,
and for a Broadcast/Shuffle the floats each site receives and sends; and the plan's
tasks.  Per node and site:

    seconds = flops / (rate of what the kernel does, on its chunks × threads)
            + bytes of the new arrays its kernel tasks make / new-memory bandwidth
            + (floats received + floats sent) × itemsize / link bandwidth

A node takes as long as its busiest site (its sites work side by side; one that
finishes early idles, which is how imbalance costs time).  The plan's makespan is

    submit_overhead + named + tasks × task_overhead
        + max(the longest path through the plan DAG of those node times,
              the busiest site's seconds summed over every node)
        + gather

where ``named`` is the client's hashing of the plan's in-process (numpy) inputs,
their bytes at ``hash_bandwidth``: every submission names in-process chunks by their
content, so that those the workers hold already are not sent again (2 x 80 MB
took 17 ms on the development VM, a third of a row dot's time), and
``gather`` is the results' way to the client when the call brings them there
(``spec.gathers``, :func:`gather_seconds`: ``td.compute`` does, ``td.submit`` does
not): every result's bytes at ``client_bandwidth`` (the client receives the workers'
chunks one after another on its one connection loop, so the sites do not add up),
and, for a result assembled into one array from more than one chunk, its bytes again
at ``assemble_bandwidth`` (the copy into a new array; a one-chunk result is handed
over as it came).

— a critical-path *stage* model: a node starts when its slowest input is done,
independent branches overlap — bounded below by the work each site must do one
thing after another: independent branches overlap only where they run on different
sites (two outputs that each recompute a shared forward pass on the same workers
take the sum, not the larger, of the two; measured on an FFNN step whose two
gradients each planned the 1000x59754x1000 product anew: 1.19 s predicted without
the bound, 1.39-1.50 s ran).  Tasks are charged for the whole plan, not per site:
the client lowers and submits every task and the scheduler dispatches them one by
one, which ``td.calibrate`` measures as a serial cost (a many-task plan on tiny
chunks is as slow on 3 workers as on 2).  We chose a stage model over a per-site
event simulation because the search can afford it per candidate (a sum of
memoised per-node terms) and because the lowered graph runs node by node on each
site.  It does not model a site starting the next node while another still works
on the previous one (pipelining), nor transfers sharing a link with computation.

The rates ``td.calibrate`` measures are those of a worker thread while one thread of
every worker of the host is busy.  Where a worker runs faster while the others of its
host idle — more threads than cores (``spec.cores``: 3 single-threaded workers on 2
cores), or rates measured alone (``spec.rates_alone``: single-threaded dgemm ran
21-24 GFLOP/s alone on the development VM's 2 cores and 8-10 each with two running) —
"its busiest site" is :func:`busiest`: the larger of that site's seconds with the host
to itself (at the rate alone of the node's kernel class) and the host's seconds all
together over its capacity (``ClusterSpec.shared_hosts`` has the factors): a worker
that idles gives its share to the others, so a node that keeps one worker of a host
busy runs at the rate alone, and one that keeps k of them busy in between.  Before
the rates alone a one-block 4200x280x4200 multiply on 2 workers was predicted
1.8-1.9x slower than the split plans and ran as fast or faster.  Without it the
model balanced the 16 products of an 8000x1000x8000 multiply 6/5/5 over 3 workers on
2 cores by moving 244 MiB where Dask's 8/4/4 moved 137 and ran 0.78 s to the balanced
plan's 0.84 s; in an A/B on a 3-worker table of 16 cases it chose differently in 4,
plans moving 1.4-2x the bytes that ran 0.98-1.28x the time of the plans chosen with it.

A site's transfers cost it for the bytes it sends *and* for those it receives: a
transfer between worker processes is work at both ends (serialising, copying through
the socket, allocating), on the cores the site's kernels use, so a site that sends
while it receives does not get both for free.  ``td.calibrate`` measures the link as a
plan's shuffle uses it (every worker sending one array while receiving one) and
counts both directions: a one-way copy alone then takes what it takes alone (1.7-3.1
GB/s between two of 3 workers on the development VM's 2 cores, where the ring's
both-ways rate read 1.2-2.2 GB/s), and a shuffle what the ring took.

Kernel classes, by what a kernel does (:func:`kernel_class`): ``"blas"`` for a GEMM
by its einsum ``subscripts`` (compute bound; the rate falls on small chunks, see
:class:`ClusterSpec`), ``"elementwise"`` for every other kernel (memory bound: an
elementwise kernel's flop count is one per element).  A contraction that is not a
GEMM (a row dot ``ij,ij->i``, an outer product, a matrix-vector product) runs at the
pace of memory: the elements its call touches — operands read, result written once —
at the elementwise rate, which counts an in-place add's three touches per element
(:func:`memory_bound_rate`; filed as BLAS by its name, a row dot was predicted 87%
fast), and a GEMM never faster than that (a product with a small contracted
dimension writes more than it computes).  An elementwise kernel that computes more
than memory's pace allows (``exp``, ``tanh``, ``sin``, ``x ** 2.5`` ...) counts its
elements at their cost in adds (:data:`ELEMENT_COST`, measured; :func:`element_cost`;
on the host only: a GPU's are memory bound).  Rates
are calibrated in float64; a float32 matmul runs at the spec's measured ``blas_float32``
multiple of the float64 rate (it was taken as 2: the float32 rows of the benchmarks
were over-predicted by 18-48% where their kernels ran 2.3x the float64 rate), other
matmuls at the float64 rate (complex64 at the float32 multiple, counted at 4 real
flops per complex multiply-add: ``kernels.flop_factor``); elementwise kernels at 8 /
itemsize times theirs (a narrower dtype faster, a complex128 one half as fast).
A kernel task's result is a new array (one per task: ``physical.work``'s task list),
made at the spec's ``fresh_bandwidth`` (``td.calibrate`` measures it: fast where
the worker reuses memory it freed, as slow as a transfer where every new array
faults its pages in on a virtual machine whose host hands out memory lazily).  That
is the only charge for making the result: the elementwise rate is calibrated on an
add into an array the worker has (``np.add(x, y, out=z)``).  Calibrated on an add
that allocates its result, the rate already paid for the new array and the term paid
again (an outer product, whose work is its result, was predicted 3.2x its time).
Loading a ``from_function`` chunk and scattering a ``from_numpy`` chunk count as
tasks only (the data is made or sent before a benchmark's clock starts).

On GPUs (``spec.gpu``: the plan's chunks are device arrays) the same terms take the
device's numbers: flops at the GPU's matmul rate for the dtype (lower on small
products) or its elementwise rate, new arrays at its memory bandwidth, a launch per
kernel task, and a move costs device → host at the sender, the link, and host →
device at the receiver (TCP between GPU workers stages through host memory): at the
rate ``td.calibrate`` measured for device arrays moved that way end to end
(``gpu.link``), or, without it, as the three terms added up.
One thread per worker drives a GPU, so ``threads`` does not multiply the rate;
workers that share a device (``gpu.sharing``) each get that share of its rates and
copies (all busy at once, as a balanced plan keeps them).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..kernels import Kernel, flop_factor
from ..physical import Broadcast, KeyArrayMap, LocalAggregate, LocalJoin, LocalMap, Shuffle
from ..physical.work import Fusion
from ..types import ArrayType
from .cluster import ClusterSpec
from .cost import Cost, chunk_bytes

__all__ = ["kernel_seconds", "kernel_class", "element_cost", "op_cost", "ELEMENT_COST", "contraction_class", "memory_bound_rate", "kernel_rate", "call_rate", "write_bandwidth",
           "plan_seconds", "makespan", "gather_seconds", "with_seconds", "node_seconds_per_site", "task_seconds", "fusion_for",
           "CHEAP_TASKS", "LATE_GRANULES"]

# A task that runs at most this many per-task overheads is cheap: the fusion pass
# (physical.work) may run it inside its reader although the reader waits for a
# transfer it could have run under — late by at most about what a task of its own
# costs.  Measured on the development VM: a 2000³ float64 multiply in 8x8x8 blocks
# on 2 workers (0.7 ms products, 0.6-0.8 ms per task) runs 0.42 s with its products
# fused into the sums (147 tasks) against 0.60 s without (392 tasks; best of 5,
# interleaved, same plan); fusing every late task regardless made the
# plans whose tasks run seconds up to 1.7x slower (their compute no longer hides
# their transfers).
CHEAP_TASKS = 2.0

# A reader that is at most 1/LATE_GRANULES of its site's work on its node (per worker
# thread) may take in tasks that wait for transfers (physical.work's fusion): the
# site has other readers to run while it waits.  Measured on the development VM (2
# workers x 1 thread, full-size benchmark multiplies, interleaved, best of 3, same
# plans).  First every late task fused, against cheap ones only: the 4000³ multiply's
# products fused into sums 8 to a site (4x4x4 blocks) 0.80-0.90x the time, 32 to a
# site (8x8x8) 0.64-0.82x, 8000x1000x8000 in 8x2x8 blocks 0.88-0.99x; into 2 sums to
# a site (1000x64000x1000, 2x16x2 blocks) 0.86x and 1.04x; into the one sum of each
# site (1x8x1 blocks) 1.66-1.78x.  Then this rule (4) against cheap ones only: 4x4x4
# 0.86-1.01x, 8x8x8 0.67-0.83x, 8x2x8 0.87-0.90x, 2x16x2 0.91-0.95x, 1x8x1 left alone;
# nearest neighbour 0.77-0.90x, FFNN speech 0.90-0.93x; 3 workers 0.70-0.96x.
LATE_GRANULES = 4


def contraction_class(subscripts: str) -> str:
    """The class of a contraction of chunks by what it does (its einsum
    ``subscripts``), not by its kernel's name: ``"blas"`` for a GEMM, batched or not —
    two operands, an index summed that both have, and on each side a kept index the
    other lacks (``ij,jk->ik``, ``ji,jk->ik``, ``bij,bjk->bik``: each element read
    takes part in many multiply-adds); ``"elementwise"`` (memory bound) for the rest:
    a row dot ``ij,ij->i``, a product then a sum, an outer product ``i,j->ij``, a
    matrix-vector product ``ij,j->i``, a one-operand sum (an element read takes part
    in one or two flops).

    >>> [contraction_class(s) for s in ("ij,jk->ik", "bij,bjk->bik", "ij,ij->i", "i,j->ij", "ij,j->i")]
    ['blas', 'blas', 'elementwise', 'elementwise', 'elementwise']
    """
    ins, out = subscripts.split("->")
    ins = ins.split(",")
    if len(ins) != 2 or any(len(set(s)) < len(s) for s in ins):
        return "elementwise"
    a, b = (set(s) for s in ins)
    kept = set(out)
    return "blas" if (a & b) - kept and (a - b) & kept and (b - a) & kept else "elementwise"


def kernel_class(kernel) -> str:
    """``"blas"`` when the kernel (or one stage of a composition) is a GEMM by its
    ``subscripts`` (:func:`contraction_class`); a kernel that carries none (a user's)
    by its name: ``matmul``, ``tensordot`` or ``dot`` at the start of a part of it;
    else ``"elementwise"``."""
    if not isinstance(kernel, Kernel):
        return "elementwise"
    for k in kernel.stages:
        if k.subscripts is not None:
            if contraction_class(k.subscripts) == "blas":
                return "blas"
        elif any(part.startswith(("matmul", "tensordot", "dot")) for part in k.name.split("∘")):
            return "blas"
    return "elementwise"


# What an elementwise operation costs per element, in in-place adds (the unit of the
# elementwise rate), where it is more than memory's pace: transcendental and other
# compute-bound functions.  numpy 2.4 on 4M float64 elements on the development VM
# (x86_64; an add 3.5 ms); unlisted operations (arithmetic, comparisons, casts,
# rounding, square, sign: 0.4-1.2 adds) cost one.  A cluster's own ``exp`` cost
# (``ClusterSpec.exp_cost``, calibrated) scales the table (another libm, other SIMD).
# Without it ``sum(exp(a) * b + c)`` was predicted at 37% of its time.
ELEMENT_COST = {
    "exp": 5.3, "log": 4.5, "log2": 4.7, "log10": 8.9, "exp2": 11.3, "expm1": 9.7, "log1p": 15.0,
    "sqrt": 1.4, "cbrt": 30.4, "sin": 12.7, "cos": 15.4, "tan": 12.2, "arcsin": 13.7, "arccos": 15.3,
    "arctan": 9.9, "sinh": 24.9, "cosh": 18.7, "tanh": 14.3, "arcsinh": 26.2, "arccosh": 8.0, "arctanh": 26.9,
    "deg2rad": 2.4, "rad2deg": 1.7, "pow": 14.8, "arctan2": 20.7, "hypot": 23.2, "logaddexp": 22.9,
    "logaddexp2": 22.7, "fmod": 16.3, "remainder": 12.1, "floor_divide": 24.3, "nextafter": 9.0,
}
_CHEAP_POWERS = (0, 1, 2, -1, 0.5)  # x ** c that numpy computes without pow


def op_cost(op: str, scalar=None, exp_cost: float = ELEMENT_COST["exp"]) -> float:
    """What elementwise ``op`` costs per element in in-place adds (:data:`ELEMENT_COST`,
    scaled by ``exp_cost``, what an ``exp`` costs on the cluster: ``td.calibrate``
    measures it; never under one add); ``scalar``: the exponent of ``x ** scalar`` (a
    square or a square root is cheap)."""
    if op not in ELEMENT_COST or (op == "pow" and scalar is not None and scalar in _CHEAP_POWERS):
        return 1.0
    return max(1.0, ELEMENT_COST[op] * (exp_cost / ELEMENT_COST["exp"]))


def _stage_cost(k, exp_cost: float) -> float:
    if k.name == "ufunc" and k.params:
        return op_cost(str(k.params[0]), exp_cost=exp_cost)
    if k.name.startswith("scalar_") and len(k.params) == 3:
        op, c, reflected = k.params
        return op_cost(op, None if reflected else c, exp_cost)
    if k.name.startswith("broadcast_"):
        return op_cost(k.name[len("broadcast_"):], exp_cost=exp_cost)
    return op_cost(k.name, exp_cost=exp_cost)


def element_cost(kernel, exp_cost: float = ELEMENT_COST["exp"]) -> float:
    """A kernel's cost per element counted, in in-place adds (:func:`op_cost`): its
    stages' mean (a composition's flops add its stages' elements).  Remembered on the
    kernel per ``exp_cost`` (the time model asks for it on every node it prices)."""
    if not isinstance(kernel, Kernel):
        return 1.0
    memo = kernel.__dict__.get("_element_cost")
    if memo is None:
        memo = {}
        object.__setattr__(kernel, "_element_cost", memo)
    got = memo.get(exp_cost)
    if got is None:
        stages = kernel.stages
        got = memo[exp_cost] = sum(_stage_cost(k, exp_cost) for k in stages) / len(stages)
    return got


def _call_shapes(node) -> list | None:
    """The chunk shapes one call of the node's kernel sees (its first, interior
    chunks), or None where a child has no chunk."""
    try:
        return [c.type.shapes[0] for c in node.children]
    except Exception:  # no chunk to read
        return None


def memory_bound_rate(kernel, shapes, dtype, elementwise: float) -> float | None:
    """Flops/s of one call of a contraction ``kernel`` on chunks of ``shapes`` that
    runs at the pace of memory: the elements it touches (its operands read once, its
    result written once) at the pace of an in-place add, which touches three per
    element it counts (the ``elementwise`` rate, already scaled for ``dtype``).  None
    where the kernel's type or flops rule cannot say."""
    try:
        ins = [ArrayType(tuple(s), np.dtype(dtype)) for s in shapes]
        out = kernel.out_type(*ins).shape
        flops = float(kernel.flops(*shapes)) * flop_factor(kernel, [dtype])
    except Exception:  # an opaque rule
        return None
    touched = sum(float(np.prod(s)) for s in shapes) + float(np.prod(out))
    if flops <= 0 or touched <= 0:
        return None
    return elementwise * 3 * flops / touched


def _kernel_of(node):
    if isinstance(node, (LocalJoin, LocalAggregate)):
        return node.kernel
    if isinstance(node, LocalMap) and isinstance(node.op, KeyArrayMap):
        return node.op.kernel
    return None


def node_seconds_per_site(nc, spec: ClusterSpec) -> np.ndarray:
    """Seconds each site spends on one node (see the module doc); ``nc`` is its
    :class:`~tra_dask.optimizer.cost.NodeCost`."""
    node = nc.node
    out = np.zeros(node.nsites)
    gpu = spec.gpu
    if _kernel_of(node) is not None:
        out += kernel_seconds(node, nc.flops_per_site, nc.made_per_site, nc.tasks_per_site, spec,
                              threads=1 if gpu else spec.threads)
    elif nc.flops_per_site is not None and nc.flops_per_site.any():
        out += nc.flops_per_site / (kernel_rate(node, spec) * (1 if gpu else spec.threads))
    if isinstance(node, (Broadcast, Shuffle)) and nc.recv_per_site is not None:
        item = node.type.dtype.itemsize
        link = (nc.recv_per_site + nc.send_per_site) * item  # both ends work
        if gpu is not None and gpu.link is not None:  # device arrays moved end to end, as calibrated
            out += link / gpu.link
        else:
            out += link / spec.link_bandwidth
            if gpu is not None:  # device -> host at the sender, host -> device at the receiver
                out += (nc.send_per_site * item / gpu.to_host + nc.recv_per_site * item / gpu.from_host) * gpu.sharing
    return out


def write_bandwidth(spec: ClusterSpec) -> float:
    """Bytes/s at which a kernel's results are written as new arrays: the spec's
    ``fresh_bandwidth`` on the host; on a GPU, its memory bandwidth (cupy's pool reuses
    freed device memory), which its elementwise rate measures (an add reads two
    float64s and writes one per element)."""
    return spec.fresh_bandwidth if spec.gpu is None else spec.gpu.elementwise * 24 / spec.gpu.sharing


def kernel_rate(node, spec: ClusterSpec) -> float:
    """Flops (elements) per second per thread of the node's kernel on its chunks."""
    # rates are for float64: a float32 matmul runs at the spec's multiple of it
    # (td.calibrate measures it: 2.3-2.5x on the development VM), other matmuls at the
    # float64 rate (numpy has no BLAS for integers or float16: not faster, and not
    # measured); elementwise kernels move narrower items that many times faster.  On a
    # GPU: matmul at the device's rate for the dtype, lower on small products
    # (gpu.blas_half_size), elementwise kernels at its float64 rate times 8 / itemsize
    return call_rate(_kernel_of(node), _call_shapes(node), node.type.dtype, spec)


def call_rate(kernel, shapes, dtype, spec: ClusterSpec) -> float:
    """Flops (elements) per second per thread of one call of ``kernel`` on chunks of
    ``shapes`` making ``dtype`` (on the spec's GPU when it has one): the time model's
    rate, which the front-end's chunking estimate shares."""
    cls = kernel_class(kernel)
    if spec.gpu is not None:
        gpu = spec.gpu
        return _rate(kernel, cls, shapes, dtype, gpu.blas_rate(_real_dtype(dtype)) / gpu.sharing,
                     gpu.elementwise / gpu.sharing, 1.0, gpu.blas_half_size)
    rate = _rate(kernel, cls, shapes, dtype, spec.rates["blas"], spec.rates["elementwise"],
                 spec.blas_float32 if dtype in (np.float32, np.complex64) else 1.0, spec.blas_half_size)
    return rate / element_cost(kernel, spec.exp_cost) if cls != "blas" else rate


def _rate(kernel, cls: str, shapes, dtype, blas: float, elementwise: float, blas_multiple: float,
          half: float) -> float:
    """A call's flops/s (module doc): a kernel that names its contraction
    (``Kernel.subscripts``) is priced by what it does — a memory-bound one by the
    elements it touches, a GEMM at the BLAS rate of its size but never faster than its
    elements can be touched (a product with a small contracted dimension writes more
    than it computes); other kernels at their class's rate."""
    base = elementwise * _narrow(dtype)
    contraction = isinstance(kernel, Kernel) and kernel.subscripts is not None and shapes is not None
    memory = memory_bound_rate(kernel, shapes, dtype, base) if contraction else None
    if cls != "blas":
        return memory or base
    # (complex64: cgemm's real flops run at sgemm's rate; its flops count 4 per multiply-add)
    peak = blas * blas_multiple
    if half and shapes is not None:
        try:  # one call's product size n (of n x n x n) on the first (interior) chunk shapes
            n = max(float(kernel.flops(*shapes)) / 2, 1.0) ** (1 / 3)
            peak = peak / (1 + half / n)
        except Exception:  # an opaque shape rule: the peak
            pass
    return min(peak, memory) if memory else peak


def _narrow(dtype) -> float:
    """An elementwise kernel's rate multiple for ``dtype`` against float64's: 8 /
    itemsize (memory bound; from 2 to 16 bytes: a complex128 element moves twice a
    float64's bytes, a float16 one is not faster than an int16 one)."""
    return 8 / max(min(np.dtype(dtype).itemsize, 16), 2)


def _real_dtype(dtype) -> np.dtype:
    """A complex dtype's real part (its matmul runs at that real dtype's flop rate)."""
    dtype = np.dtype(dtype)
    return np.empty(0, dtype).real.dtype if dtype.kind == "c" else dtype


def kernel_seconds(node, flops, made, tasks, spec: ClusterSpec, threads: int = 1):
    """Seconds of a node's kernel work — THE formula, per task (:func:`task_seconds`)
    and per site (:func:`node_seconds_per_site`, summed over a site's tasks): ``flops``
    at the kernel's rate over ``threads`` worker threads, the ``made`` bytes of its new
    arrays at the new-memory bandwidth, and on a GPU a launch per task (each kernel
    task launches and waits on the device).  Arguments are arrays (per task or per
    site) or None (nothing counted)."""
    out = 0.0
    if flops is not None and flops.any():
        out = out + flops / (kernel_rate(node, spec) * threads)
    if made is not None:
        out = out + made / write_bandwidth(spec)
    if spec.gpu is not None and tasks is not None:
        out = out + tasks * spec.gpu.launch
    return out


def task_seconds(w, spec: ClusterSpec) -> np.ndarray:
    """Seconds each task of a node's work (:class:`~tra_dask.physical.work.NodeWork`)
    runs on one worker thread: :func:`kernel_seconds` of one task."""
    made, flops = chunk_bytes(w.node, w.task_tuple), w.task_flops
    n = len(made)
    if n > 1 and made.strides == (0,) and flops.strides == (0,):  # every task alike: one value, as a view
        one = kernel_seconds(w.node, flops[:1], made[:1], np.ones(1), spec)
        return np.broadcast_to(float(np.asarray(one).reshape(-1)[0]), (n,))
    return kernel_seconds(w.node, flops, made, np.ones(n), spec)


def fusion_for(spec: ClusterSpec) -> Fusion:
    """The fusion pass's view of a cluster: its threads per worker, cheap tasks as
    :data:`CHEAP_TASKS` per-task overheads of :func:`task_seconds`, and readers that
    take in late tasks as :data:`LATE_GRANULES` or more to their site."""
    return Fusion(spec.threads, functools.partial(task_seconds, spec=spec), CHEAP_TASKS * spec.task_overhead,
                  LATE_GRANULES)


def plan_seconds(cost: Cost, spec: ClusterSpec) -> tuple[float, dict]:
    """``(makespan, {node: seconds of its busiest site})`` for a costed plan (see
    the module doc; the makespan includes the submission and per-task overheads)."""
    if spec.sites != cost.sites:
        spec = spec.with_sites(cost.sites)
    per_node, finish, on_site = _walk(cost, spec)
    return _makespan(cost, spec, max(finish.values(), default=0.0), on_site), per_node


def _walk(cost: Cost, spec: ClusterSpec) -> tuple:
    """``({node: seconds of its busiest site}, {node: when it finishes}, seconds per
    site)``: the plan's nodes in plan order (children before parents), each starting
    when its last child finishes."""
    per_node: dict = {}
    finish: dict = {}
    on_site = np.zeros(cost.sites)  # every node's vector has one entry per site of the plan
    for node, nc in cost.nodes.items():
        t, v = _memo_seconds(nc, spec)
        per_node[node] = t
        finish[node] = t + max((finish[c] for c in node.children if c in finish), default=0.0)
        on_site += v
    return per_node, finish, on_site


def makespan(cost: Cost, spec: ClusterSpec) -> float:
    """``plan_seconds(cost, spec)[0]``, from the path terms of the subplans a search's
    cost is made of where it is (:attr:`Cost.parts`), remembered per spec: the search
    ranks thousands of candidates that share their subplans."""
    if spec.sites != cost.sites:
        spec = spec.with_sites(cost.sites)
    _, longest, on_site = _path(cost, spec)
    return _makespan(cost, spec, longest, on_site)


def _path(cost: Cost, spec: ClusterSpec) -> tuple:
    """``(finish of the last node, the latest finish, seconds per site)`` of a plan in
    plan order: the critical path and the sites' totals of :func:`plan_seconds`."""
    got = cost.seconds_memo.get(spec)
    if got is None:
        if cost.parts:  # the root is last, over its children's subplans (in child order)
            t, v = _memo_seconds(next(reversed(cost.nodes.values())), spec)
            below = [_path(c, spec) for c in cost.parts]
            last = t + max((b[0] for b in below), default=0.0)
            got = (last, max([last] + [b[1] for b in below]), v + sum(b[2] for b in below))
        else:
            _, finish, on_site = _walk(cost, spec)
            got = (next(reversed(finish.values()), 0.0), max(finish.values(), default=0.0), on_site)
        cost.seconds_memo[spec] = got
    return got


def _makespan(cost: Cost, spec: ClusterSpec, longest: float, on_site: np.ndarray) -> float:
    path = max(longest, busiest(on_site, spec))
    return (spec.submit_overhead + cost.named / spec.hash_bandwidth + cost.tasks * spec.task_overhead + path
            + gather_seconds(cost.results, spec))


def gather_seconds(results, spec: ClusterSpec) -> float:
    """Seconds to bring ``results`` (``(bytes, chunks)`` of each) to the client, as
    ``spec.gathers`` says the call does (none when it does not: see the module doc)."""
    if spec.gathers is None:
        return 0.0
    seconds = 0.0
    for nbytes, chunks in results:
        seconds += nbytes / spec.client_bandwidth
        if spec.gathers == "array" and chunks > 1:
            seconds += nbytes / spec.assemble_bandwidth
    return seconds


def _memo_seconds(nc, spec: ClusterSpec) -> tuple[float, np.ndarray]:
    """A node's seconds (its busiest site's) and each site's, remembered on its
    NodeCost per spec (costs are shared between the many candidate plans the
    search ranks)."""
    memo = nc.seconds_memo
    t = memo.get(spec)
    if t is None:
        v = node_seconds_per_site(nc, spec)
        kernel = _kernel_of(nc.node)
        t = memo[spec] = (busiest(v, spec, None if kernel is None else kernel_class(kernel)), v)
    return t


def busiest(v: np.ndarray, spec: ClusterSpec, cls="any") -> float:
    """Seconds until every site is done with work ``v`` (seconds per site at the
    spec's rates, those of every worker of a host busy at once): the busiest site's —
    except on a host whose workers run faster while others idle
    (``spec.shared_hosts``: more threads than cores, or rates measured alone), where it
    is the larger of its busiest site's seconds at the rate alone (of kernel class
    ``cls``; None: a node without a kernel; ``"any"``: the fastest of them, for a
    bound over many nodes) and all its sites' seconds sharing the host.  With every
    site equally busy that is the busiest site's seconds; an idle site gives its
    share to the others (3 workers on 2 cores: 8/4/4 products of a multiply take as
    long as 6/5/5; on 2 cores where dgemm ran 2.3x as fast alone, one busy worker
    takes half the seconds of two)."""
    shared = spec.shared_hosts
    if not shared:
        return float(v.max(initial=0.0))
    t = float(v[spec.unshared_sites].max(initial=0.0))
    for sites, alone, together in shared:
        on = v[sites]
        a = min(alone.values()) if cls == "any" else alone.get(cls, alone[None])
        t = max(t, float(on.max()) * a, float(on.sum()) * together)
    return t


def with_seconds(cost: Cost, spec: ClusterSpec) -> Cost:
    """``cost`` with its predicted ``seconds`` and ``node_seconds`` filled in."""
    if cost.seconds is not None:
        return cost
    total, per = plan_seconds(cost, spec)
    return dataclasses.replace(cost, seconds=total, node_seconds=per)
