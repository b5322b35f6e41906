"""``RelationFutures``: the result of a submission."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from distributed import Client

from ..dashboard import TraScheduler, _set_measured, page_link
from ..logical import ClusterSource, to_numpy
from ..logical.nodes import toposort
from ..lowering import Lowered
from ..optimizer import Plan
from ..types import RelationType
from .cluster import _FetchFromCluster, _check_client, _wait_done

class RelationFutures(Mapping):
    """The result of a submission: ``{TRA key: distributed.Future}``.

    Also ``.plan`` (the plan it ran), ``.gather()``, ``.to_numpy()``,
    ``.to_dask_array()``, ``.transfers()`` (bytes measured moving between workers for
    this submission) and ``.ran_on()`` (which worker computed each task).  It can be
    the input of a later TRA expression: its chunks stay where they are.
    """

    def __init__(self, futures: dict, plan: Plan, node, client: Client, lowered: Lowered, started: float,
                 keepalive: dict, recorded: bool):
        self._futures = dict(sorted(futures.items()))
        self.plan, self.node, self.client, self.lowered = plan, node, client, lowered
        self.token = lowered.token
        self._started, self._keepalive, self._recorded = started, keepalive, recorded
        self._finished = None

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
        from ..viz import futures_html
        return futures_html(self)

    @property
    def dashboard_link(self) -> str | None:
        """This submission on the scheduler's tra_dask dashboard page."""
        link = page_link(self.client)
        return f"{link}#{self.token}" if link else None

    # -- waiting -----------------------------------------------------------
    def wait(self, timeout: float | None = None) -> "RelationFutures":
        """Wait until every chunk is computed.  Raises the first task error, or a
        clear error if a worker that the plan pins tasks to leaves the cluster."""
        _check_client(self.client)
        _wait_done(list(self._futures.values()), self.client, self.lowered.workers, timeout)
        if self._finished is None:
            self._finished = time.time()
        for f in self._futures.values():
            if f.status == "error":
                raise f.exception()
        self._keepalive.clear()  # the inputs may go now
        return self

    def gather(self) -> dict:
        """``{key: chunk}`` in this process."""
        self.wait()
        return self.client.gather(dict(self._futures))

    def to_numpy(self):
        return to_numpy(self.node, self.gather())

    # -- composition -------------------------------------------------------
    def __tra_relation__(self) -> ClusterSource:
        """This result as a source of a later TRA expression (its data stays put)."""
        client = self.client
        futs = self._futures
        return ClusterSource(
            tuple((k, f.key) for k, f in futs.items()), self.node.type, f"futures-{self.token}",
            _FetchFromCluster(client), keeper=self,
        )

    def to_dask_array(self):
        """A dask array backed by these futures (no data moves).  The keys must form
        one tensor's chunk grid."""
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph

        t = self.node.type
        if t.arity != t.rank or not t.is_continuous:
            raise ValueError(
                f"{self.label}: to_dask_array needs a continuous grid with key arity == chunk rank, "
                f"got arity {t.arity}, rank {t.rank}"
            )
        chunks = t.grid_extents()
        name = f"tra-array-{self.token}-{uuid.uuid4().hex[:6]}"
        layer = {(name,) + k: f for k, f in self._futures.items()}
        graph = HighLevelGraph.from_collections(name, layer, dependencies=())
        return da.Array(graph, name, chunks, dtype=t.dtype)

    # -- measurements ------------------------------------------------------
    def transfers(self) -> int:
        """Bytes that moved between workers for this submission, from the workers'
        transfer logs: transfers of this submission's keys (and of the cluster-resident
        inputs it read) between its start and its end.  Data sent to the client is not
        counted; another submission reading the same cluster-resident inputs at the
        same time would be."""
        self.wait()
        ours = self.lowered.graph_keys() | {k for d in self.lowered.scatter.values() for k in d}
        for node in toposort(self.plan.outputs):
            src = getattr(node, "source", None)
            if isinstance(src, ClusterSource):
                ours |= {k for _, k in src.dask_keys}
        workers = set(self.lowered.workers)
        since, until = self._started - 0.01, self._finished + 0.5

        def count(dask_worker, ours=ours, workers=workers, since=since, until=until):
            total = 0
            for e in dask_worker.transfer_outgoing_log:
                if e["who"] in workers and since <= e["start"] <= until:
                    total += sum(n for k, n in e["keys"].items() if k in ours)
            return total

        total = int(sum(self.client.run(count, workers=list(workers)).values()))
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

