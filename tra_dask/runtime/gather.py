"""Results brought to the client: straight from the workers that hold them.

``client.gather`` asks the scheduler to fetch the chunks and hand them on unless the
client was made with ``direct_to_workers=True`` (Dask's default: a client may not
reach the workers).  Every byte of the result then crosses two connections and is
held twice on the way; with a ``LocalCluster`` the scheduler lives in the client's
process, so both copies are made there, on the event loop the client reads with.
Fetched from the workers themselves, each worker's chunks come over one connection,
the workers' at once, into one buffer per chunk.

The law: the chunks gathered are the ones ``client.gather`` gives (the same
futures, through Dask's own gather with ``direct=True``; keys a worker no longer has
Dask fetches through the scheduler, as it does for any direct gather).  We go direct
only where the client surely reaches the workers — in-process workers, workers on a
loopback address or at the address the client itself has towards the scheduler —
or where the client says so (``Client(direct_to_workers=...)``: its choice is kept
either way).  The Dask config is not touched.
"""

from __future__ import annotations

from distributed import Client
from distributed.comm import get_address_host

__all__ = ["direct_to", "gather", "LAST"]

LAST: dict = {"direct": None, "chunks": 0}  # how the last result was gathered (for tests and benchmarks)

_LOOPBACK = ("127.", "::1", "localhost")


def direct_to(client: Client, workers) -> bool:
    """Whether ``client`` fetches results from ``workers`` itself (see the module doc)."""
    told = getattr(client, "direct_to_workers", None)
    if told is not None:
        return bool(told)
    try:
        own = client.scheduler_comm.comm.local_address
    except AttributeError:  # no connection (an asynchronous client being set up): Dask's way
        return False
    if own.startswith("inproc://"):
        return all(w.startswith("inproc://") for w in workers)
    here = get_address_host(own)
    hosts = [get_address_host(w) for w in workers if "://" in w and not w.startswith("inproc://")]
    return bool(workers) and len(hosts) == len(workers) and all(h.startswith(_LOOPBACK) or h == here
                                                                 for h in hosts)


def gather(client: Client, futures: dict, workers) -> dict:
    """``{key: chunk}`` of ``futures`` (``{key: Future}``) in this process, from
    ``workers`` directly where :func:`direct_to` says so."""
    direct = direct_to(client, workers)
    LAST.update(direct=direct, chunks=len(futures))
    return client.gather(futures, direct=direct)
