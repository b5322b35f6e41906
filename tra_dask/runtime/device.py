"""Device results brought to the client without a trip through host memory.

A result whose chunks are cupy arrays on workers of this machine's GPUs is gathered
through CUDA IPC: each worker copies its chunks into device buffers of their own
(``cudaMalloc``, not cupy's pool, so a buffer's IPC handle points at its first byte),
synchronises, and sends the handles (64 bytes each); the client opens each handle,
copies the chunk device to device into an array of its own, closes it, and the
workers free their buffers.  Over TCP the same chunk would go device → host → socket
→ host → device.

The law: the chunks gathered are equal to those ``client.gather`` gives, or this
path is not taken — it needs the client and the worker on one host, in two processes,
and the worker's device visible here; otherwise, and on any error, the caller gathers
over the network (:func:`gather_device` returns None and says why in :data:`LAST`).
"""

from __future__ import annotations

import math
import os
import platform
import uuid

from ..kernels import is_device

__all__ = ["gather_device", "LAST"]

LAST: dict = {"path": None, "why": ""}  # how the last device result was gathered (for tests and benchmarks)


def _uuid(cupy, device_id: int) -> str:
    return bytes(cupy.cuda.runtime.getDeviceProperties(device_id)["uuid"]).hex()


def _export(keys, token: str, dask_worker=None):
    """Run on a worker: IPC handles of the chunks under ``keys``, each copied into a
    buffer of its own kept under ``token`` until :func:`_release`; None if one is not
    a cupy array (held on the host, or spilled)."""
    import cupy

    chunks = [dask_worker.data[k] for k in keys]
    if not all(is_device(c) for c in chunks):
        return None
    buffers, out = [], {}
    for k, c in zip(keys, chunks):
        c = cupy.ascontiguousarray(c)
        mem = cupy.cuda.memory.Memory(max(c.nbytes, 1))
        cupy.ndarray(c.shape, c.dtype, cupy.cuda.MemoryPointer(mem, 0))[...] = c
        buffers.append(mem)
        out[k] = (bytes(cupy.cuda.runtime.ipcGetMemHandle(mem.ptr)), tuple(c.shape), c.dtype.str)
    cupy.cuda.runtime.deviceSynchronize()  # the copies are done before the client reads them
    held = dask_worker.__dict__.setdefault("_tra_ipc", {})
    held[token] = buffers
    return {"host": platform.node(), "pid": os.getpid(), "device": _uuid(cupy, cupy.cuda.Device().id),
            "chunks": out}


def _release(token: str, dask_worker=None) -> None:
    """Run on a worker: free the buffers :func:`_export` kept under ``token``."""
    dask_worker.__dict__.get("_tra_ipc", {}).pop(token, None)


def _local_devices(cupy) -> dict:
    return {_uuid(cupy, i): i for i in range(cupy.cuda.runtime.getDeviceCount())}


def gather_device(client, futures: dict, holders: dict) -> dict | None:
    """``{key: chunk}`` of ``futures`` (``{key: Future}``, finished, cupy chunks;
    ``holders``: ``{dask key: a worker that holds it}``) through CUDA IPC, or None when
    this path does not apply (:data:`LAST` says why)."""
    try:
        import cupy

        here = _local_devices(cupy)
    except Exception as e:  # no cupy or no device in this process
        return _no(f"no device here ({type(e).__name__})")
    by_worker: dict = {}
    for key, f in futures.items():
        w = holders.get(f.key)
        if w is None:
            return _no(f"no worker holds {f.key!r}")
        by_worker.setdefault(w, []).append(key)
    token = uuid.uuid4().hex
    out = {}
    try:
        for w, keys in by_worker.items():
            got = client.run(_export, [futures[k].key for k in keys], token, workers=[w])[w]
            if got is None:
                return _no(f"worker {w} holds host chunks")
            if got["host"] != platform.node() or got["pid"] == os.getpid() or got["device"] not in here:
                return _no(f"worker {w} is not another process on this host's devices")
            with cupy.cuda.Device(here[got["device"]]):
                for k in keys:
                    handle, shape, dtype = got["chunks"][futures[k].key]
                    nbytes = max(int(cupy.dtype(dtype).itemsize * math.prod(shape)), 1)
                    ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
                    try:
                        src = cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(
                            cupy.cuda.memory.UnownedMemory(ptr, nbytes, None), 0))
                        out[k] = src.copy()
                        cupy.cuda.runtime.deviceSynchronize()
                    finally:
                        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
    except Exception as e:  # anything unexpected: the network path instead
        return _no(f"{type(e).__name__}: {e}")
    finally:
        try:
            client.run(_release, token, workers=list(by_worker))
        except Exception:  # a worker that left: its buffers went with it
            pass
    LAST.update(path="ipc", why="")
    return out


def _no(why: str):
    LAST.update(path="network", why=why)
    return None
