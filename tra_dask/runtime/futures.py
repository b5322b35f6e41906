"""``RelationFutures``: the result of a submission."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import dask
import numpy as np
from distributed import Client

from .dashboard import TraScheduler, _set_measured, page_link
from ..kernels import device_module, to_host
from ..logical import ClusterSource, flatten_outputs, to_numpy
from ..lowering import Lowered
from ..optimizer import Plan
from ..types import RelationType
from .cluster import (WorkersLeft, _FetchFromCluster, _Vanished, _check_client, _wait_done, _who_has, cancel_safely,
                      run_on_workers, watched, workers_info)
from ..logical.evaluate import assemble, grid_extents
from ..viz import futures_html
from .device import gather_device
from .gather import gather

MAX_RECOVERIES = 5


class Submission:
    """What one submission ran, shared by its outputs: enough to run it again.

    Recovery (a watcher in the client, not a scheduler plugin: the client holds what a
    re-plan needs — the plan, in-process data, the optimizer — and every wait on a
    plan's results goes through :func:`~tra_dask.runtime.cluster._wait_done`, which
    notices a pinned worker that left or froze).  :meth:`recover` first resumes
    (:func:`~tra_dask.runtime.resume.resume`): results and intermediate chunks still in
    memory on surviving workers are kept, and only what the missing results need runs
    again, the lost sites' tasks spread over the workers there are now (a worker that
    joined counts).  Where that cannot be done (an input that is an earlier result
    which was itself planned again) it plans the expression again whole on those
    workers: data still on the cluster stays where it is (a fixed placement of the new
    plan), in-process data is sent again, ``from_function`` chunks are made again,
    dask-array blocks Dask itself recomputes, and results of earlier submissions that
    were lost recover first (the same way).  Either way the outputs' futures are
    replaced in place, so the user's ``rf`` objects resolve to the exact result."""

    def __init__(self, plan: Plan, client: Client, kw: dict, lowered: Lowered | None = None):
        self.plan, self.client, self.kw = plan, client, dict(kw)
        self.outputs: list = []
        self.history: list = []  # (time, message) per recovery
        self.generations: list = [lowered] if lowered is not None else []  # each lowering that ran

    def recover(self, error: WorkersLeft) -> None:
        """Run the submission again on the workers there are (see the class docstring);
        more workers lost meanwhile (a recovery's own scatter or plan meeting another
        loss) are recovered from too, so only a ``RuntimeError`` (no workers left, gave
        up) or the user's own error leaves here, never ``WorkersLeft``."""
        for attempt in range(MAX_RECOVERIES):
            try:
                return self._recover(error)
            except (WorkersLeft, _Vanished) as again:  # another loss while recovering: recover from both
                gone = set(error.gone) | set(getattr(again, "gone", ()))
                error = WorkersLeft(f"{again} (while recovering from: {error})", gone)
                time.sleep(0.2)
        raise RuntimeError(f"{error} — gave up after {MAX_RECOVERIES} tries to recover") from error

    def _recover(self, error: WorkersLeft) -> None:
        from .resident import refresh_sources
        from .resume import resume
        from .submit import _flatten_futures, submit

        if len(self.history) >= MAX_RECOVERIES:
            raise RuntimeError(f"{error} — gave up after {len(self.history)} recoveries") from error
        how = dask.config.get("tra-dask.recovery", "resume")
        if how not in ("resume", "replan"):
            raise ValueError(f"dask config tra-dask.recovery is {how!r}; it must be 'resume' (run the unfinished "
                             f"part again, the default) or 'replan' (plan the whole expression again)")
        if how == "resume" and self.generations and self.outputs and resume(self, error):
            return
        if self.plan.expr is None:
            raise RuntimeError(f"{error}; this plan was built by hand, so it cannot be planned again on the "
                               f"remaining workers: re-submit it") from error
        expr = refresh_sources(self.plan.expr, self.client)
        for attempt in range(5):  # the worker list may change while we plan (more may leave)
            workers = sorted(set(workers_info(self.client)) - set(error.gone))
            if not workers:
                raise RuntimeError(f"{error}; no workers are left to run it on") from error
            try:
                new = submit(expr, self.client, workers, **self.kw)
                break
            except (_Vanished, WorkersLeft) as e:
                if attempt == 4:
                    raise RuntimeError(f"{error}; planning it again failed 5 times as workers kept "
                                       f"leaving: {e}") from e
                time.sleep(0.2)
        olds, news = _flatten_futures(self.plan.rebuild(self.outputs))[0], _flatten_futures(new)[0]
        if len(olds) != len(news) or len(flatten_outputs(expr)[0]) != len(news):
            raise RuntimeError(f"{error}; re-planning gave another number of outputs (a bug)") from error
        stale = [f for rf in olds for f in rf._futures.values() if f.key in rf.lowered.graph_keys()]
        sub = news[0]._submission
        sub.history = self.history + [(time.time(), f"{error}; planned again on {len(workers)} worker(s)")]
        for old, fresh in zip(olds, news):
            extra = {k: v for k, v in old.__dict__.items() if k not in fresh.__dict__}
            old.__dict__.clear()
            old.__dict__.update(fresh.__dict__, **extra)
        sub.outputs = olds
        try:
            cancel_safely(self.client, stale)  # tasks pinned to the lost workers
        except Exception:
            pass


class RelationFutures(Mapping):
    """The result of a submission: ``{TRA key: distributed.Future}``.

    Also ``.plan`` (the plan it ran), ``.gather()``, ``.to_numpy()``,
    ``.to_dask_array()``, ``.transfers()`` (bytes measured moving between workers for
    this submission) and ``.ran_on()`` (which worker computed each task).  It can be
    the input of a later TRA expression: its chunks stay where they are.

    It is a Dask collection (already persisted: its graph is its futures), so Dask's
    own calls work on it: ``distributed.wait(rf)``, ``distributed.progress(rf)``,
    ``futures_of(rf)``, ``dask.compute(rf)`` / ``client.compute(rf)`` /
    ``rf.compute()`` (``{TRA key: ndarray}``, as ``rf.gather()``), ``dask.persist(rf)``
    / ``client.persist(rf)`` (the same futures: the data is already in cluster
    memory).  ``client.gather`` gathers plain containers of futures only (as for any
    Dask collection): ``client.gather(dict(rf))``.  With no default client (the
    embedded cluster) Dask's calls run on ``rf.client``.
    """

    def __init__(self, futures: dict, plan: Plan, node, client: Client, lowered: Lowered, started: float,
                 keepalive: dict, recorded: bool, submission: Submission | None = None):
        self._futures = dict(sorted(futures.items()))
        self.plan, self.node, self.client, self.lowered = plan, node, client, lowered
        self.token = lowered.token
        self._started, self._keepalive, self._recorded = started, keepalive, recorded
        self._finished = None
        self._submission = submission or Submission(plan, client, {})

    # -- Mapping -----------------------------------------------------------
    def __getitem__(self, key):
        return self._futures[key]

    def __iter__(self):
        return iter(self._futures)

    def __len__(self):
        return len(self._futures)

    @property
    def type(self) -> RelationType:
        return self.node.type

    @property
    def label(self) -> str:
        return f"futures({self.node.label})"

    def __repr__(self):
        states = {}
        for f in self._futures.values():
            states[f.status] = states.get(f.status, 0) + 1
        return f"<RelationFutures {self.node.label}: {len(self)} chunks {states} on {len(self.lowered.workers)} sites>"

    def _repr_html_(self) -> str:
        return futures_html(self)

    @property
    def dashboard_link(self) -> str | None:
        """This submission on the scheduler's tra_dask dashboard page."""
        link = page_link(self.client)
        return f"{link}#{self.token}" if link else None

    # -- waiting -----------------------------------------------------------
    def wait(self, timeout: float | None = None) -> "RelationFutures":
        """Wait until every chunk is computed.  Raises the first task error.  If a
        worker that the plan pins tasks to leaves the cluster or stops answering, the
        submission is planned again on the workers there are and run (see
        :class:`Submission`; ``.recoveries`` says what happened): this object's
        futures are replaced, so take ``rf[key]`` futures after ``wait()``."""
        _check_client(self.client)
        while True:
            try:
                _wait_done(list(self._futures.values()), self.client, self.lowered.workers, timeout)
                break
            except WorkersLeft as e:
                self._submission.recover(e)
        if self._finished is None:
            self._finished = time.time()
        for f in self._futures.values():
            if f.status == "error":
                raise f.exception()
        self._keepalive.clear()  # the inputs may go now
        return self

    @property
    def recoveries(self) -> list:
        """``(time, what happened)`` for each time this submission was planned again."""
        return list(self._submission.history)

    def gather(self) -> dict:
        """``{key: chunk}`` in this process (a worker lost while the chunks travel
        here is recovered from, as in :meth:`wait`)."""
        while True:
            self.wait()
            try:
                if self.plan.on_device:  # cupy chunks on this host's GPUs: device to device (runtime.device)
                    got = watched(self._gather_device, self.client, self.lowered.workers)
                    if got is not None:
                        return got
                return watched(lambda: gather(self.client, dict(self._futures), self.lowered.workers), self.client,
                               self.lowered.workers)
            except WorkersLeft as e:
                self._submission.recover(e)

    def _gather_device(self) -> dict | None:
        futs = dict(self._futures)
        who = watched(lambda: _who_has(self.client, [f.key for f in futs.values()]), self.client,
                      self.lowered.workers)
        return gather_device(self.client, futs, {k: ws[0] for k, ws in who.items() if ws})

    def to_numpy(self):
        """The chunks gathered and assembled here as one numpy array (cupy chunks are
        copied to the host; :meth:`ArrayFutures.assembled` keeps them cupy)."""
        return to_host(to_numpy(self.node, self.gather()))

    # -- composition -------------------------------------------------------
    def __tra_relation__(self) -> ClusterSource:
        """This result as a source of a later TRA expression (its data stays put)."""
        client = self.client
        futs = self._futures
        return ClusterSource(
            tuple((k, f.key) for k, f in futs.items()), self.node.type, f"futures-{self.token}",
            _FetchFromCluster(client), keeper=self, on_device=self.plan.on_device,
        )

    def to_dask_array(self):
        """A dask array backed by these futures (no data moves).  The keys must form
        one tensor's chunk grid: key dim d indexes array dim d; array dims past the
        key arity are one chunk (a reduction's ``()`` key is a one-chunk array)."""
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph

        chunks = grid_extents(self.node, f"{self.label}.to_dask_array()")
        pad = (0,) * (len(chunks) - self.type.arity)
        name = f"tra-array-{self.token}-{uuid.uuid4().hex[:6]}"
        # the layer reads this object's futures when Dask reads it: a dask array taken
        # before a recovery gives the recovered chunks after it (it also keeps this
        # object, and with it the means to recover, alive)
        graph = HighLevelGraph.from_collections(name, _LiveChunks(self, name, pad), dependencies=())
        return da.Array(graph, name, chunks, dtype=self.type.dtype, meta=self._meta(len(chunks)))

    def _meta(self, ndim: int):
        """An empty array of the chunks' own module (dask's ``meta``): cupy when the
        plan's data was on the device, else numpy."""
        xp = device_module() if self.plan.on_device else np
        return xp.empty((0,) * ndim, dtype=self.type.dtype)

    # -- the Dask collection protocol -------------------------------------
    def _layer(self) -> str:
        return f"tra-futures-{self.token}-{self.node.label}"

    def __dask_graph__(self):
        from dask.highlevelgraph import HighLevelGraph

        return HighLevelGraph.from_collections(
            self._layer(), {f.key: f for f in self._futures.values()}, dependencies=())

    def __dask_layers__(self):
        return (self._layer(),)

    def __dask_keys__(self) -> list:
        return [f.key for f in self._futures.values()]

    def __dask_tokenize__(self):
        return (type(self).__name__, self.token, tuple(f.key for f in self._futures.values()))

    @property
    def __dask_scheduler__(self):
        """The client this ran on (Dask uses the default client first if there is one)."""
        return self.client.get

    @staticmethod
    def __dask_optimize__(dsk, keys, **kwargs):
        return dsk  # pinned tasks: no graph optimisation (it would lose placement)

    def __dask_postcompute__(self):
        return _chunks_by_key, (tuple(self._futures),)

    def __dask_postpersist__(self):
        return self._rebuild, ()

    def _rebuild(self, dsk, *args, rename=None):
        """After persist: the same chunks, as the futures Dask hands back where it
        made new ones (``client.persist``), else these (they are in memory already)."""
        from distributed import Future

        futs = {k: dsk[f.key] if isinstance(dsk.get(f.key), Future) else f for k, f in self._futures.items()}
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, _futures=futs)
        return new

    def compute(self, **kwargs) -> dict:
        """``{TRA key: chunk}`` in this process (as ``dask.compute(self)[0]``)."""
        import dask

        return dask.compute(self, **kwargs)[0]

    def persist(self, **kwargs) -> "RelationFutures":
        """Itself: its chunks are already in cluster memory."""
        return self

    # -- measurements ------------------------------------------------------
    def transfers(self) -> int:
        """Bytes that moved between workers for this submission (all its outputs:
        one plan, ``plan.cost.bytes_moved``), from the workers'
        transfer logs: between its start and its end, every transfer of a key to a
        worker where one of this submission's tasks reads that key (its own
        intermediates, its scattered chunks, the cluster-resident inputs it read).
        Data sent to the client is not counted, nor a transfer of the same key to a
        worker where none of its tasks read it (another submission's); another
        submission reading the same input on the same worker at the same time would
        be, and so would a later one's that ran before this submission's first
        ``wait()`` returned (its end: call ``wait()`` before submitting again to read
        each alone).  Times are the workers' own clocks.  After a recovery: the first run's and
        the recovery's transfers, as the surviving workers logged them.  The logs are
        read under the liveness watch: a worker that stopped answering is removed from
        the cluster, and its log is lost with it, as a lost worker's."""
        outs = [o for o in self._submission.outputs if isinstance(o, RelationFutures)] or [self]
        for o in outs:  # the outputs of one submission share its plan: its window ends with the last
            o.wait()
        lows = self._submission.generations or [self.lowered]  # after a recovery: every part that ran
        reads: dict = {}  # worker -> the keys this submission's tasks there read
        for low in lows:
            for w, tasks in low.layers.items():
                mine = reads.setdefault(w, set())
                for t in tasks.values():
                    mine |= t.dependencies
        reads = {w: keys for w, keys in reads.items() if keys}
        live = set(workers_info(self.client))  # a lost worker's log is lost with it
        since, until = self._started, max(o._finished for o in outs)

        def count(dask_worker, reads=reads, since=since, until=until, asked=time.time()):
            # "middle" is on the worker's own clock; "start"/"stop" are shifted by its
            # estimate of the scheduler's clock offset, which a busy host gets wrong by
            # tens of ms (measured: an earlier submission's transfers logged 5-40 ms
            # after this one's start that the receiving worker had before it).  Every
            # transfer this submission made was logged before its results were done
            # (client clock: ``until``); a worker whose clock runs ahead of the client's
            # logs it later by as much — what this call's arrival says, at most 0.5 s —
            # and a later submission's transfers are logged after it
            until = until + min(max(time.time() - asked, 0.0), 0.5) + 0.01
            total = 0
            for e in dask_worker.transfer_outgoing_log:
                wanted = reads.get(e["who"])
                if wanted and since <= e.get("middle", e["start"]) <= until:
                    total += sum(n for k, n in e["keys"].items() if k in wanted)
            return total

        planned = {w for low in lows for w in low.workers}
        for attempt in range(3):  # a sender that stops answering is removed: its log is lost with it
            try:
                total = int(sum(run_on_workers(self.client, count, sorted(live & planned)).values()))
                break
            except WorkersLeft as e:
                if attempt == 2:
                    raise RuntimeError(f"{e}; gave up reading the transfer logs as workers kept leaving") from e
                live = set(workers_info(self.client)) - set(e.gone)
        if self._recorded:
            try:
                self.client.run_on_scheduler(_set_measured, token=self.token, nbytes=total)
            except Exception:
                pass
        return total

    def ran_on(self) -> dict:
        """``{dask key: worker}`` for every task of this submission that the
        scheduler saw finish (empty if the scheduler cannot load tra_dask)."""
        self.wait()
        if not self._recorded:
            return {}
        keys = self.lowered.graph_keys()

        def grab(dask_scheduler, keys=keys):
            plugin = dask_scheduler.plugins.get(TraScheduler.name)
            return {} if plugin is None else {k: plugin.ran[k] for k in keys if k in plugin.ran}

        return self.client.run_on_scheduler(grab)

    def planned_on(self) -> dict:
        """``{dask key: worker}`` as the plan pinned them."""
        return {k: w for k, w in self.lowered.planned.items() if k in self.lowered.graph_keys()}



class _LiveChunks(Mapping):
    """The graph layer of :meth:`RelationFutures.to_dask_array`: ``{(name, *index):
    Future}`` read from the result's current futures each time Dask reads it, so that
    the futures a recovery put in place are the ones a dask array made before it
    computes from."""

    def __init__(self, rf: RelationFutures, name: str, pad: tuple):
        self.rf, self.name, self.pad = rf, name, pad

    def _key(self, k) -> tuple:
        return (self.name,) + k + self.pad

    def __getitem__(self, key):
        n = len(key) - 1 - len(self.pad)
        if not (isinstance(key, tuple) and key[0] == self.name and n >= 0 and key[1 + n:] == self.pad):
            raise KeyError(key)
        return self.rf._futures[key[1:1 + n]]

    def __iter__(self):
        return (self._key(k) for k in self.rf._futures)

    def __len__(self):
        return len(self.rf._futures)

    def __contains__(self, key):
        try:
            self[key]
        except (KeyError, TypeError):
            return False
        return True

    def __reduce__(self):  # pickled (sent anywhere) as the plain mapping of now
        return dict, (dict(self),)


def _chunks_by_key(results, keys) -> dict:
    """``__dask_postcompute__``: ``{TRA key: chunk}`` (runs where Dask finalises: it
    must pickle, so it is a function of the keys only)."""
    return dict(zip(keys, results))


class ArrayFutures(RelationFutures):
    """The result of submitting a :class:`td.Array`: a :class:`RelationFutures` whose
    chunks form one array, so Dask's calls give that array — ``dask.compute(r)``,
    ``client.compute(r)``, ``r.compute()`` and ``numpy.asarray(r)`` return an ndarray
    (``r.gather()`` still gives the chunks by key).

    It is also an array operand that stays on the workers: ``r + 1``, ``r.T``,
    ``r @ w``, ``r.sum(axis=0)``, ``r[:, None]``, ``numpy.tanh(r)``,
    ``numpy.concatenate([r, r])`` build a lazy :class:`td.Array` over these futures
    (:attr:`array`, as ``td.from_array(r)``): its chunks are read where they are.  A
    numpy ufunc or function never gathers it silently (``numpy.asarray(r)`` and
    ``r.compute()`` do, as asked).  As a Mapping it keeps its keys: ``r[(i, j)]`` with
    a tuple of ints is the future of chunk ``(i, j)``, ``len(r)`` the number of chunks
    and ``iter(r)`` the chunk keys; any other index (an int, slices, ``None``,
    ``...``) indexes the array.
    """

    __array_priority__ = 60  # above td.Array's: numpy hands mixed operations to this class first

    @property
    def array(self):
        """A lazy :class:`td.Array` over these futures (nothing moves; ``td.from_array(self)``)."""
        from ..frontend.array import from_array  # (the front-end sits above the runtime: imported when used)

        return from_array(self)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __getitem__(self, key):
        if isinstance(key, tuple) and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in key):
            try:
                return self._futures[key]
            except KeyError:
                raise KeyError(f"{key}: not a chunk key of this result (its keys: {list(self._futures)[:4]}...); "
                               f"a tuple of ints is a chunk's future here: for an element use "
                               f"r.array[{', '.join(map(str, key))}]") from None
        return self.array[key]

    def __contains__(self, key):
        try:
            return key in self._futures
        except TypeError:
            return False

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return getattr(ufunc, method)(*_as_arrays(inputs), **_as_arrays(kwargs))

    def __array_function__(self, func, types, args, kwargs):
        return func(*_as_arrays(args), **_as_arrays(kwargs))

    def __array_namespace__(self, api_version=None):
        return self.array.__array_namespace__(api_version)

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._set_extents()

    def _set_extents(self) -> None:
        self._extents = grid_extents(self.node, f"{self.label} as an array")

    @classmethod
    def of(cls, rf: RelationFutures) -> "ArrayFutures":
        """``rf`` itself, as an array result (its class changed in place, not copied:
        a copy would keep its futures when a recovery replaces ``rf``'s).  The
        runtime makes array results as ArrayFutures from the start
        (``runtime.submit._run(..., array=True)``)."""
        if not isinstance(rf, cls):
            rf.__class__ = cls
            rf._set_extents()
        return rf

    @property
    def shape(self) -> tuple:
        return tuple(int(sum(e)) for e in self._extents)

    @property
    def dtype(self):
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self._extents)

    def __repr__(self):
        return f"<ArrayFutures {self.shape} {self.dtype}: {len(self)} chunks on {len(self.lowered.workers)} sites>"

    def __dask_postcompute__(self):
        return _assembled, (tuple(self._futures), self._extents, str(self.dtype))

    def __array__(self, dtype=None, copy=None):
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype)

    def assembled(self):
        """The result gathered here as one array in its chunks' own module (numpy, or
        cupy for cupy chunks: no copy to the host), as ``dask.compute`` gives it."""
        got = self.gather()
        if len(got) == 1 and not _shared_with_worker(self.client):  # the one chunk is the array: no copy
            (only,) = got.values()
            if tuple(only.shape) == self.shape and only.dtype == self.dtype and getattr(only.flags, "writeable", True):
                return only
        return _assembled(list(got.values()), tuple(got), self._extents, str(self.dtype))


def _shared_with_worker(client) -> bool:
    """Whether chunks gathered by ``client`` may be the workers' own objects (workers
    in this process, ``inproc://``): handing one out would let a caller change the
    cluster's copy."""
    return str(getattr(client.scheduler, "address", "")).startswith("inproc://")


def _assembled(results, keys, extents, dtype):
    """``__dask_postcompute__`` of an array result: the assembled array."""
    return assemble(dict(zip(keys, results)), extents, dtype)


def _as_arrays(x):
    """``x`` with every :class:`ArrayFutures` in it (in lists, tuples and dicts) as its
    lazy array (:attr:`ArrayFutures.array`)."""
    if isinstance(x, ArrayFutures):
        return x.array
    if isinstance(x, (list, tuple)):
        return type(x)(_as_arrays(v) for v in x)
    if isinstance(x, dict):
        return {k: _as_arrays(v) for k, v in x.items()}
    return x


def _delegate(name: str):
    def method(self, *args, **kwargs):
        return getattr(self.array, name)(*_as_arrays(args), **_as_arrays(kwargs))

    method.__name__ = name
    method.__doc__ = f"``td.from_array(self).{name}(...)``: a lazy td.Array over these futures (no data moves)."
    return method


# the operators and array methods of td.Array, each building a lazy td.Array over the futures
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__matmul__",
              "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__", "__lshift__",
              "__rlshift__", "__rshift__", "__rrshift__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__",
              "__neg__", "__pos__", "__abs__", "__invert__", "transpose", "sum", "prod", "mean", "std", "var", "max",
              "min", "any", "all", "argmin", "argmax", "reshape", "ravel", "flatten", "squeeze", "astype", "dot",
              "conj", "conjugate"):
    setattr(ArrayFutures, _name, _delegate(_name))
for _name in ("T", "mT", "real", "imag"):
    setattr(ArrayFutures, _name, property(lambda self, _n=_name: getattr(self.array, _n),
                                          doc=f"``td.from_array(self).{_name}``: lazy, over these futures."))
ArrayFutures.__hash__ = None  # (a Mapping, and == is elementwise: not hashable, as RelationFutures)
