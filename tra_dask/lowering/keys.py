"""The Dask keys of a lowered plan — one format, written by the lowering and read by
recovery and the dashboard.

A task of operator ``i`` (its position in the plan's lowering order) of a submission
``token`` computing the node's tuple ``j`` is ``(f"{op}-{i}-{token}", j)``; its
*stem* ``f"{op}-{i}"`` names that operator in every lowering of the plan (a recovery
lowers it again under a new token).  A chunk sent from this process is
``(f"tra-data-{array tag}-{content token}", worker, *tra key)``.

>>> name = task_name("join", 3, "ab12")
>>> name, stem(name), with_token(name, "cd34")
('join-3-ab12', 'join-3', 'join-3-cd34')
"""

from __future__ import annotations

import re

__all__ = ["task_name", "stem", "with_token", "data_key", "is_tra_key", "is_data_key"]

_TASK = re.compile(r"^[A-Za-z_]+-\d+-[0-9a-f]{10}$")  # a task name with a submission token (10 hex digits)


def task_name(op: str, index: int, token: str) -> str:
    """The key name of operator ``index``'s tasks in the submission ``token``."""
    return f"{op}-{index}-{token}"


def stem(name: str) -> str:
    """A task name without its submission's token (an operator's tasks in every
    lowering; an array's chunks for a data key)."""
    return name.rsplit("-", 1)[0]


def with_token(name: str, token: str) -> str:
    """The same operator's task name in the submission ``token``."""
    return f"{stem(name)}-{token}"


def data_key(tag: str, content: str, worker: str, tra_key: tuple) -> tuple:
    """The key of an in-process chunk sent to ``worker``: named by the array it is cut
    from (``tag``), its content, the worker and its place."""
    return (f"tra-data-{tag}-{content}", worker) + tuple(int(v) for v in tra_key)


def is_tra_key(key) -> bool:
    """Whether a Dask key is one of a lowered plan's (a task or a chunk sent from a
    client)."""
    return is_data_key(key) or (isinstance(key, tuple) and len(key) >= 2 and isinstance(key[0], str)
                                and _TASK.match(key[0]) is not None)


def is_data_key(key) -> bool:
    """Whether a Dask key is a chunk a client sent (:func:`data_key`): data that
    stays on the cluster between submissions, not a task's result.

    >>> is_data_key(data_key("x", "ab", "tcp://w:1", (0, 1))), is_data_key((task_name("join", 3, "ab12cd34ef"), 0))
    (True, False)
    """
    return isinstance(key, tuple) and len(key) >= 2 and isinstance(key[0], str) and key[0].startswith("tra-data-")
