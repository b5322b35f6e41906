"""A description of the cluster a plan runs on: what the time model needs.

:class:`ClusterSpec` holds, per site (one Dask worker): memory, threads, the rate of
each kernel class, and the bandwidth between two workers (within one host, and
between hosts where they differ); and for the whole cluster, the fixed cost of a
submission and the cost of each task (client-side lowering, the scheduler, the
worker's dispatch: in practice a serial pipeline, so it is charged per task of the
whole plan).  The defaults are honest for a laptop-class machine (measured on the
2-core development VM); :func:`tra_dask.calibrate` measures a real cluster.

Kernel classes: ``"blas"`` (a GEMM: compute-bound, rate in flops/s, lower on small
chunks: ``rate(n) = peak / (1 + blas_half_size / n)`` for a product of about n×n×n)
and ``"elementwise"`` (everything else: memory-bound, rate in elements/s of an add
into an array the worker has — ``Kernel.flops`` of an elementwise kernel is one per
element; a new array it makes is priced at ``fresh_bandwidth``).

A spec is a small JSON file (:meth:`ClusterSpec.save`, :meth:`ClusterSpec.load`), so
a user can calibrate once and reuse it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

__all__ = ["ClusterSpec", "GpuSpec", "DEFAULT_RATES"]

# measured on the development VM (2 cores, OpenBLAS, one thread per worker, two
# workers): ~30-40 GFLOP/s float64 matmul at 512, ~1 G elements/s for numpy add;
# worker-to-worker transfers 0.5-1.5 GB/s; ~0.5 ms per task and ~30 ms per submission
# end to end (td.calibrate's fit)
DEFAULT_RATES = {"blas": 4e10, "elementwise": 1e9}

GATHERS = (None, "chunks", "array")  # ClusterSpec.gathers: what a call does with the results


def _positive(where: str, name: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v > 0) or math.isinf(v):
        raise ValueError(f"{where}: {name} must be a positive, finite number, got {v!r}")
    return float(v)


@dataclass(frozen=True)
class GpuSpec:
    """What the time model knows about the GPU each site computes on (one device per
    worker, as ``dask cuda worker`` and ``LocalCUDACluster`` run them).

    ``memory``: device bytes per site — the hard limit of a plan whose chunks live on
    the device.  ``blas``: matmul flops/s by dtype name (``{"float32": ...,
    "float64": ...}``; a dtype not named runs at the slowest named rate);
    ``blas_half_size``: the product size n (of n×n×n) at half that rate (a GPU needs
    far larger products than a CPU core to reach its peak).  ``elementwise``:
    float64 elements/s of an elementwise kernel (memory bound: narrower dtypes move
    that many more).  ``launch``: seconds a kernel task costs on the device beyond
    the worker's task overhead (launches, synchronising).  ``to_host``,
    ``from_host``: bytes/s between device and host memory — a transfer between two
    GPU workers over TCP goes device → host → network → host → device.  The rates
    are a whole device's; ``sharing`` workers share each device (several workers on
    one GPU), and each gets its share while all are busy.  ``link``: bytes/s a
    worker moves device arrays to and from other workers, sent plus received,
    measured end to end (``td.calibrate``'s ring of device arrays: the copies through
    host memory at both ends and the network, as they overlap); None prices a move
    as the host link plus ``to_host`` at the sender and ``from_host`` at the
    receiver.  ``name``: the device's name."""

    memory: float
    blas: dict
    elementwise: float
    to_host: float
    from_host: float
    blas_half_size: float = 1024.0
    launch: float = 2e-5
    name: str = "GPU"
    sharing: int = 1
    link: float | None = None

    def __post_init__(self):
        where = "GpuSpec"
        for f in ("memory", "elementwise", "to_host", "from_host", "launch"):
            object.__setattr__(self, f, _positive(where, f, getattr(self, f)))
        if self.link is not None:
            object.__setattr__(self, "link", _positive(where, "link", self.link))
        if isinstance(self.blas_half_size, bool) or not isinstance(self.blas_half_size, (int, float)) or not (
                0 <= self.blas_half_size < float("inf")):
            raise ValueError(f"{where}: blas_half_size must be a finite number >= 0, got {self.blas_half_size!r}")
        object.__setattr__(self, "blas_half_size", float(self.blas_half_size))
        if isinstance(self.sharing, bool) or not isinstance(self.sharing, int) or self.sharing < 1:
            raise ValueError(f"{where}: sharing must be an int >= 1 (workers per device), got {self.sharing!r}")
        if not isinstance(self.blas, dict) or not self.blas:
            raise TypeError(f"{where}: blas must be a non-empty dict {{dtype name: flops/s}}, got {self.blas!r}")
        import numpy as np

        rates = {}
        for k, v in self.blas.items():
            try:
                name = np.dtype(k).name
            except TypeError:
                raise ValueError(f"{where}: blas names {k!r}, not a dtype; valid: 'float32', 'float64', ...") from None
            rates[name] = _positive(where, f"blas[{k!r}]", v)
        object.__setattr__(self, "blas", rates)

    def __hash__(self):
        return hash((self.memory, tuple(sorted(self.blas.items())), self.elementwise, self.to_host, self.from_host,
                     self.blas_half_size, self.launch, self.name, self.sharing, self.link))

    def blas_rate(self, dtype) -> float:
        """Peak matmul flops/s for ``dtype`` (the slowest named rate for a dtype not named)."""
        import numpy as np

        return self.blas.get(np.dtype(dtype).name, min(self.blas.values()))

    def __repr__(self):
        rates = ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in self.blas.items())
        return (f"GpuSpec({self.name}: {self.memory / 2**30:.0f} GiB, matmul {rates} (half rate at "
                f"n={self.blas_half_size:.0f}), elementwise {self.elementwise:.3g}/s, to/from host "
                f"{self.to_host / 1e9:.3g}/{self.from_host / 1e9:.3g} GB/s, launch {self.launch * 1e6:.0f} us"
                f"{'' if self.sharing == 1 else f', {self.sharing} workers per device'}"
                f"{'' if self.link is None else f', device to device between workers {self.link / 1e9:.3g} GB/s'})")


@dataclass(frozen=True)
class ClusterSpec:
    """What the time model knows about a cluster (module doc).

    ``sites``: workers.  ``memory_per_site``: bytes.  ``bandwidth``: bytes/s a
    worker moves to and from workers on other hosts, sent plus received (the time
    model charges a site both); ``bandwidth_local``: within one host (default:
    ``bandwidth``).  ``hosts``: the host of each site (default: all on one host).
    ``rates``: kernel class -> peak rate per thread, in float64; ``blas_half_size``: the
    product size n (of n×n×n) at which a matmul runs at half its peak;
    ``blas_float32``: a float32 matmul's rate over a float64 one's (2 in theory: twice
    the numbers per SIMD register; 2.4 measured on the development VM's OpenBLAS).
    ``fresh_bandwidth``: bytes/s at which a kernel's results are written as new
    arrays (into memory the worker freed before, or fresh pages if its allocator
    returns freed memory to the OS; the default is an ordinary machine's).
    ``task_overhead``: seconds per task of a plan, ``submit_overhead``: seconds per
    submission.  ``client_bandwidth``: bytes/s at which results come from the
    workers into the client (fetched, received, deserialised), ``assemble_bandwidth``:
    bytes/s at which the client copies gathered chunks into one new array.
    ``hash_bandwidth``: bytes/s at which the client names the plan's in-process
    (numpy) inputs on every submission — it hashes them, so that chunks the workers
    hold already are not sent again and changed ones are.
    ``gathers``: what the call does with the plan's results — None (they stay on the
    workers: ``td.submit``), ``"chunks"`` (gathered: ``td.compute`` of a relation) or
    ``"array"`` (gathered and assembled into one array: ``td.compute`` of a
    ``td.Array``); the time model adds their way to the client (:meth:`gathering`
    sets it; it is a property of the call, not of the cluster, and is not saved).  ``threads``: per worker.  ``cores``: the cores of each host, which its
    workers' threads share (None: a core per thread).  Where a host runs more threads
    than it has cores (3 single-threaded workers on 2 cores), the measured rates and
    bandwidths are those a worker thread gets while one thread of every worker of its
    host is busy (what ``td.calibrate`` measures), and a worker runs faster while
    others idle: the time model sees it (:attr:`shared_hosts`,
    :mod:`tra_dask.optimizer.time`).  ``gpu``: a :class:`GpuSpec` when every site
    computes on a GPU and the plan's chunks live there (the runtime sets it for plans
    over cupy data on GPU workers, and leaves it None for host data); its memory is
    then the limit per site (:attr:`memory_budget`).  ``source``: where the numbers
    come from.  ``rates_alone``: kernel class -> rate per thread of a worker whose
    host's other workers idle, where that is faster than ``rates`` (those of every
    worker busy at once, which ``td.calibrate`` measures both ways: single-threaded
    dgemm ran 21-24 GFLOP/s alone on the development VM and 8-10 each with two
    running); a class not named (or None) runs as fast alone as the host's cores
    allow (``cores``; the rates themselves where every thread has a core).  The time
    model prices a node's site by how many of its host's workers are busy during that
    node (:attr:`shared_hosts`)."""

    sites: int
    memory_per_site: float = 4e9
    bandwidth: float = 4.5e8
    bandwidth_local: float | None = None
    hosts: tuple | None = None
    rates: dict = field(default_factory=lambda: dict(DEFAULT_RATES))
    task_overhead: float = 5e-4
    submit_overhead: float = 0.03
    blas_half_size: float = 32.0
    blas_float32: float = 2.0
    fresh_bandwidth: float = 4e9
    threads: int = 1
    cores: int | None = None
    gpu: GpuSpec | None = None
    source: str = "defaults (a laptop-class machine)"
    rates_alone: dict | None = None
    client_bandwidth: float = 1e9
    assemble_bandwidth: float = 2e9
    gathers: str | None = None
    hash_bandwidth: float = 8e9
    exp_cost: float = 5.3

    def __post_init__(self):
        where = "ClusterSpec"
        if isinstance(self.sites, bool) or not isinstance(self.sites, int) or self.sites < 1:
            raise ValueError(f"{where}: sites must be an int >= 1, got {self.sites!r}")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise ValueError(f"{where}: threads must be an int >= 1, got {self.threads!r}")
        if self.cores is not None and (isinstance(self.cores, bool) or not isinstance(self.cores, int)
                                       or self.cores < 1):
            raise ValueError(f"{where}: cores must be an int >= 1 (each host's cores) or None (a core per "
                             f"thread), got {self.cores!r}")
        for name in ("memory_per_site", "bandwidth", "task_overhead", "submit_overhead", "fresh_bandwidth",
                     "blas_float32", "client_bandwidth", "assemble_bandwidth", "hash_bandwidth", "exp_cost"):
            object.__setattr__(self, name, _positive(where, name, getattr(self, name)))
        if isinstance(self.blas_half_size, bool) or not isinstance(self.blas_half_size, (int, float)) or not (
                0 <= self.blas_half_size < float("inf")):
            raise ValueError(f"{where}: blas_half_size must be a finite number >= 0, got {self.blas_half_size!r}")
        object.__setattr__(self, "blas_half_size", float(self.blas_half_size))
        local = self.bandwidth if self.bandwidth_local is None else self.bandwidth_local
        object.__setattr__(self, "bandwidth_local", _positive(where, "bandwidth_local", local))
        if self.gathers not in GATHERS:
            raise ValueError(f"{where}: gathers must be one of {GATHERS}, got {self.gathers!r}")
        rates = dict(DEFAULT_RATES)
        if not isinstance(self.rates, dict):
            raise TypeError(f"{where}: rates must be a dict {{kernel class: rate}}, got {self.rates!r}")
        for k, v in self.rates.items():
            if k not in DEFAULT_RATES:
                raise ValueError(f"{where}: unknown kernel class {k!r} in rates; valid: {', '.join(DEFAULT_RATES)}")
            rates[k] = _positive(where, f"rates[{k!r}]", v)
        object.__setattr__(self, "rates", rates)
        if self.rates_alone is not None:
            if not isinstance(self.rates_alone, dict):
                raise TypeError(f"{where}: rates_alone must be a dict {{kernel class: rate}} or None, "
                                f"got {self.rates_alone!r}")
            alone = {}
            for k, v in self.rates_alone.items():
                if k not in DEFAULT_RATES:
                    raise ValueError(f"{where}: unknown kernel class {k!r} in rates_alone; valid: "
                                     f"{', '.join(DEFAULT_RATES)}")
                alone[k] = _positive(where, f"rates_alone[{k!r}]", v)
            object.__setattr__(self, "rates_alone", alone)
        hosts = (0,) * self.sites if self.hosts is None else tuple(self.hosts)
        if len(hosts) != self.sites:
            raise ValueError(f"{where}: hosts names {len(hosts)} sites' hosts; the cluster has {self.sites} sites")
        object.__setattr__(self, "hosts", hosts)
        if isinstance(self.gpu, dict):  # (a saved spec)
            object.__setattr__(self, "gpu", GpuSpec(**self.gpu))
        if self.gpu is not None and not isinstance(self.gpu, GpuSpec):
            raise TypeError(f"{where}: gpu must be a td.GpuSpec or None, got {type(self.gpu).__name__}")

    @property
    def memory_budget(self) -> float:
        """Bytes a plan may hold per site: its share of the device's memory when the
        plan computes on GPUs (the smaller of it and the host's), else
        ``memory_per_site``."""
        return (self.memory_per_site if self.gpu is None
                else min(self.memory_per_site, self.gpu.memory / self.gpu.sharing))

    def gathering(self, how: str | None = "array") -> "ClusterSpec":
        """This cluster for a call that brings the results to the client as ``how``
        says (``gathers``: None, ``"chunks"`` or ``"array"``)."""
        return self if self.gathers == how else dataclasses.replace(self, gathers=how)

    def on_host(self) -> "ClusterSpec":
        """This cluster for a plan whose chunks live in host memory (no GPU terms)."""
        return self if self.gpu is None else dataclasses.replace(self, gpu=None)

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:  # a spec keys the time model's memo of every node it costs: hashed once
            h = hash((self.sites, self.memory_per_site, self.bandwidth, self.bandwidth_local, self.hosts,
                      tuple(sorted(self.rates.items())), self.task_overhead, self.submit_overhead,
                      self.blas_half_size, self.blas_float32, self.fresh_bandwidth, self.threads, self.cores,
                      self.gpu, tuple(sorted((self.rates_alone or {}).items())), self.client_bandwidth,
                      self.assemble_bandwidth, self.gathers, self.hash_bandwidth, self.exp_cost))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):  # the hash is per process (str hashes are salted): not pickled
        return {k: v for k, v in self.__dict__.items() if k not in ("_hash", "_shared")}

    @property
    def shared_hosts(self) -> tuple:
        """The hosts whose workers run faster while others of the host idle, each as
        ``(its sites, alone, together)``: ``sites`` an index array; a site's seconds
        at the spec's rates times ``alone[cls]`` is what it takes on a node whose
        kernels are of class ``cls`` (``alone[None]``: any other node) with the host
        to itself, the host's summed seconds times ``together`` what they take
        sharing it — a host's workers share its capacity, and a busy one takes what
        the idle ones leave, up to its rate alone.  The rates are those of one
        thread per worker busy at once (per-thread rate ``R·min(1, C/W)`` for a
        per-core rate ``R``, ``W`` workers, ``C`` cores), so with ``T`` threads per
        worker ``together = min(1, C/W)·T/min(W·T, C)`` (``1/W`` where every thread
        has a core) and, where the rate alone was not measured, ``alone =
        min(1, C/W)·T/min(T, C)`` (3 one-thread workers on 2 cores: 2/3 and 1/3);
        where it was (``rates_alone``), ``alone[cls] = rates[cls] /
        rates_alone[cls]``.  Empty where no worker runs faster alone."""
        return self._sharing()[0]

    @property
    def unshared_sites(self):
        """Index array of the sites not on a :attr:`shared_hosts` host."""
        return self._sharing()[1]

    def _sharing(self) -> tuple:
        got = self.__dict__.get("_shared")
        if got is None:
            import numpy as np

            groups: list = []
            by_host: dict = {}
            for i, h in enumerate(self.hosts):
                by_host.setdefault(h, []).append(i)
            t = self.threads
            measured = {k: self.rates[k] / v for k, v in (self.rates_alone or {}).items() if v > self.rates[k]}
            for sites in by_host.values():
                w = len(sites)
                c = w * t if self.cores is None else self.cores
                if w * t <= c and not (w > 1 and measured):
                    continue
                calibrated = min(1.0, c / w)
                cores = calibrated * t / min(t, c)
                alone = {None: cores, **{k: measured.get(k, cores) for k in self.rates}}
                groups.append((np.array(sites), alone, calibrated * t / min(w * t, c)))
            taken = {int(i) for sites, _, _ in groups for i in sites}
            got = (tuple(groups), np.array([i for i in range(self.sites) if i not in taken], dtype=int))
            object.__setattr__(self, "_shared", got)
        return got

    @property
    def single_host(self) -> bool:
        return len(set(self.hosts)) == 1

    @property
    def link_bandwidth(self) -> float:
        """The bandwidth a transfer between two sites gets (the slower of the two
        kinds of link when the sites span hosts)."""
        return self.bandwidth_local if self.single_host else min(self.bandwidth, self.bandwidth_local)

    def with_sites(self, sites: int) -> "ClusterSpec":
        """The same machines' rates for another number of sites (one new host each
        beyond the known ones)."""
        extra = max(0, sites - len(self.hosts))
        if all(isinstance(h, int) for h in self.hosts):
            first = max(self.hosts, default=-1) + 1
            new = tuple(range(first, first + extra))
        else:
            new = tuple(f"new host {i}" for i in range(extra))
        return dataclasses.replace(self, sites=sites, hosts=self.hosts[:sites] + new)

    # -- a small file ------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["hosts"] = list(self.hosts)
        del d["gathers"]  # (the call's, not the cluster's)
        return d

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path) -> "ClusterSpec":
        with open(path) as f:
            d = json.load(f)
        if not isinstance(d, dict) or "sites" not in d:
            raise ValueError(f"{path}: not a saved ClusterSpec (a JSON object with 'sites', 'bandwidth', ...)")
        known = {f.name for f in dataclasses.fields(cls)}
        extra = set(d) - known
        if extra:
            raise ValueError(f"{path}: unknown ClusterSpec fields {sorted(extra)}; valid: {sorted(known)}")
        if d.get("hosts") is not None:
            d["hosts"] = tuple(d["hosts"])
        return cls(**d)

    def __repr__(self):
        r = ", ".join(f"{k} {v:.3g}/s" for k, v in self.rates.items())
        alone = ", ".join(f"{k} {v:.3g}/s" for k, v in (self.rates_alone or {}).items())
        return (f"ClusterSpec({self.sites} sites x {self.threads} thread(s), {self.memory_per_site / 2**30:.1f} GiB "
                f"each, link {self.link_bandwidth / 1e9:.2f} GB/s, {r} (blas half rate at n={self.blas_half_size:.0f}, "
                f"float32 x{self.blas_float32:.2g}), "
                f"new arrays written at {self.fresh_bandwidth / 1e9:.2g} GB/s, "
                f"{self.task_overhead * 1e3:.2f} ms/task + {self.submit_overhead * 1e3:.0f} ms/submission, "
                f"results to the client at {self.client_bandwidth / 1e9:.2g} GB/s (assembled at "
                f"{self.assemble_bandwidth / 1e9:.2g} GB/s), in-process inputs named at "
                f"{self.hash_bandwidth / 1e9:.2g} GB/s, exp {self.exp_cost:.2g} adds"
                f"{'' if self.gathers is None else f', gathering the results as {self.gathers}'}"
                f"{'' if self.cores is None else f', {self.cores} cores per host'}"
                f"{'' if not self.rates_alone else ', alone ' + alone}"
                f"{'' if self.gpu is None else f', on {self.gpu!r}'}; "
                f"{self.source})")
