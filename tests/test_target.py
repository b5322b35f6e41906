"""The planning context is data: a frozen Target and named search options
(tra_dask.optimizer.target), taken by td.optimize as one value each."""

import dataclasses

import numpy as np
import pytest

import tra_dask as td
from tra_dask.optimizer.target import SEARCH_OPTIONS, SearchOptions, Target
from tra_dask.programs import matmul


def _expr():
    return matmul(td.from_numpy(np.ones((40, 40)), 10, name="A"), td.from_numpy(np.ones((40, 40)), 10, name="B"))


def test_target_and_options_are_frozen_values():
    t = Target(4, cluster=td.ClusterSpec(8), memory_limit="1MB")
    assert t.cluster.sites == 4 and t.memory_limit == 1e6 and t.placements == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.sites = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        SEARCH_OPTIONS["auto"].beam = 1
    assert t == Target(4, cluster=td.ClusterSpec(4), memory_limit=1e6) and hash(t) == hash(t.replace())
    assert t.replace(sites=2).cluster.sites == 2


def test_a_target_plans_as_its_keywords_do():
    e = _expr()
    spec = td.ClusterSpec(3, task_overhead=0.02)
    by_target = td.optimize(e, Target(3, cluster=spec, cost_model="paper", placements={"A": "all"}))
    by_keywords = td.optimize(e, sites=3, cluster=spec, cost_model="paper", placements={"A": "all"})
    assert by_target.outputs == by_keywords.outputs
    assert (by_target.cost.seconds, by_target.cost.floats_moved) == (by_keywords.cost.seconds, by_keywords.cost.floats_moved)
    assert by_target.cost_model == "paper" and by_target.sites == 3


def test_named_search_options():
    e = _expr()
    assert set(SEARCH_OPTIONS) >= {"auto", "quick", "full"} and SEARCH_OPTIONS["quick"].beam == 2
    quick = td.optimize(e, 4, options="quick")
    mine = SearchOptions("mine", beam=2, bound_rounds=2, least_traffic=False)  # quick's fields, another name
    assert td.optimize(e, 4, options=mine).outputs == quick.outputs
    # a keyword overrides the named options' field: a budget of one rewrite cuts the search short
    assert td.optimize(e, 4, options="quick", budget=1).search.truncated


def test_bad_planning_context_is_refused_early():
    e = _expr()
    with pytest.raises(ValueError, match="unknown search options 'fast'; valid: 'auto', 'quick', 'narrow', 'full'"):
        td.optimize(e, 2, options="fast")
    with pytest.raises(ValueError, match="memory_limit given with a Target"):
        td.optimize(e, Target(2), memory_limit="1GB")
    with pytest.raises(ValueError, match="sites given twice"):
        td.optimize(e, 2, sites=3)
    with pytest.raises(TypeError, match="needs a target"):
        td.optimize(e)
    with pytest.raises(ValueError, match="unknown cost_model 'floats'"):
        Target(2, cost_model="floats")
    with pytest.raises(TypeError, match="cluster must be a td.ClusterSpec"):
        Target(2, cluster={"sites": 2})
    with pytest.raises(ValueError, match="beam must be an int >= 1"):
        SearchOptions("bad", beam=0)
    with pytest.raises(ValueError, match="rounds must be an int >= 1"):
        SearchOptions("bad", rounds=0)
    with pytest.raises(ValueError, match="bound_rounds must be an int >= 1"):
        SearchOptions("bad", bound_rounds=0.5)
    with pytest.raises(ValueError, match="least_traffic must be True or False"):
        SearchOptions("bad", least_traffic=1)
