"""``tra_dask.array_api``: the Array API standard's namespace over :class:`tra_dask.Array`
— the module :mod:`tra_dask.frontend.array_api` itself (this name is an alias of it,
so ``x.__array_namespace__() is tra_dask.array_api``)."""

import sys

from .frontend import array_api as _namespace

sys.modules[__name__] = _namespace
