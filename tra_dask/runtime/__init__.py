"""The runtime: run plans on Dask clusters and hand back futures.

``td.submit`` compiles a TRA expression (or takes a Plan), lowers it to a pinned
graph for the client's workers, scatters in-process source chunks straight to their
sites, sends the graph and returns a :class:`RelationFutures` per output.  With no
client, an embedded ``LocalCluster`` on 127.0.0.1 is started (one single-threaded
worker process per site; the dashboard on 127.0.0.1 only) and closed at exit.
"""

from __future__ import annotations

from .cluster import _CONFIG, _check_client, _resolve, _wait_done, _who_has, embedded_client, spawn_config, worker_config, workers_info  # noqa: F401
from .futures import ArrayFutures, RelationFutures
from .resident import drop_scattered, from_dask_array
from .submit import compute, plan_for, submit

__all__ = ["submit", "compute", "plan_for", "RelationFutures", "ArrayFutures", "from_dask_array", "embedded_client", "drop_scattered"]
