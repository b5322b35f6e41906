"""``tra_dask.array_api``: the Array API standard's namespace over :class:`tra_dask.Array`
(what ``x.__array_namespace__()`` returns); the functions live in
:mod:`tra_dask.frontend.array_api`."""

from .frontend.array_api import *  # noqa: F401,F403
from .frontend.array_api import __all__  # noqa: F401
