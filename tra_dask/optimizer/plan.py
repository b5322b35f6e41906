"""A physical plan: the IA nodes that produce the results, their cost, and an
explanation that reads like a query plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..node import canonical, toposort
from .cost import COST_MODELS, Cost, plan_cost
from ..units import fmt_bytes as _fmt_bytes
from ..physical import LocalAggregate, Shuffle
from .rules import classify, is_pure_rekey
from .bounds import plan_lower_bound
from ..viz import plan_html, to_networkx, visualize
from ..physical.nodes import PSource
from ..physical.work import plan_work

__all__ = ["Plan", "Stage", "COST_MODELS"]


def _fmt_seconds(t: float) -> str:
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


@dataclass(frozen=True)
class Stage:
    """One named step of :func:`~tra_dask.optimize` (``plan.stages``): the plan it
    produced (None when it produced none), how long it took and what it did."""

    name: str
    plan: "Plan | None"
    seconds: float
    note: str = ""

    def __repr__(self):
        return f"<Stage {self.name}: {self.seconds:.3f} s; {self.note}>"


class Plan:
    """The IA plan for one or several results.

    Attributes
    ----------
    outputs : tuple of PNode
        One physical node per result.
    sites : int
    cost_model : "exact" or "paper"
    expr : the TRA expression it implements (None for a hand-built plan)
    """

    def __init__(self, outputs, rebuild: Callable | None = None, sites: int | None = None,
                 cost_model: str = "exact", expr=None, *, cost: Cost | None = None, compiled=None,
                 search=None, alternatives=(), stages=(), fusion=None, work=None):
        self.outputs = tuple(canonical(outputs))  # equal nodes are one object: one set of arrays
        self.rebuild = rebuild or (lambda rs: rs[0] if len(rs) == 1 else tuple(rs))
        self.sites = sites if sites is not None else self.outputs[0].nsites
        if cost_model not in COST_MODELS:
            raise ValueError(f"unknown cost_model {cost_model!r}; valid: {', '.join(COST_MODELS)}")
        for o in self.outputs:
            if o.layout.partial:
                raise ValueError(
                    f"plan output {o.label} holds partial aggregates; finish it with a Shuffle and a "
                    f"LocalAggregate"
                )
        bad = {o.nsites for o in self.outputs} - {self.sites}
        if bad:
            raise ValueError(f"plan for {self.sites} sites has outputs placed on {sorted(bad)} sites")
        self.cost_model = cost_model
        self.expr = expr
        self._cost: Cost | None = cost
        self._compiled = compiled               # td.optimize: the paper's initial plan (or how to make it)
        self.search = search                    # td.optimize: the search's report
        # td.optimize: the other plans considered, cheapest first (or how to make them: a reused plan's)
        self._alternatives = alternatives if callable(alternatives) else tuple(alternatives)
        self.stages = tuple(stages)             # td.optimize: compile, search, (replay,) check
        self.fusion = fusion                    # physical.work.Fusion: the workers' threads, which tasks are cheap
        self._work = work                       # physical.work's derivation, made when first read
        self._frozen = True

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"a Plan is immutable once built (tried to set {name!r})")
        object.__setattr__(self, name, value)

    @property
    def compiled(self) -> "Plan | None":
        """The paper's initial plan for the expression (td.optimize; made when first
        read if the search planned on a sketch)."""
        c = self._compiled
        if callable(c) and not isinstance(c, Plan):
            c = c()
            object.__setattr__(self, "_compiled", c)
        return c

    @property
    def alternatives(self) -> tuple:
        """The other plans the search considered, cheapest first (td.optimize)."""
        a = self._alternatives
        if callable(a):
            a = tuple(a())
            object.__setattr__(self, "_alternatives", a)
        return a

    def _alternatives_count(self) -> int:
        """How many :attr:`alternatives` there are, without making them where the
        pending ones can count themselves (fusing each costs ms; explain only counts)."""
        a = self._alternatives
        return len(a) if hasattr(a, "__len__") else len(self.alternatives)  # (a plain callable: made)

    def stage(self, name: str) -> Stage:
        """The stage called ``name`` (see :attr:`stages`)."""
        for st in self.stages:
            if st.name == name:
                return st
        valid = ", ".join(st.name for st in self.stages) or "none (not made by td.optimize)"
        raise ValueError(f"this plan has no stage {name!r}; its stages: {valid}")

    @property
    def on_device(self) -> bool:
        """Whether its sources hold GPU (cupy) chunks: the plan computes on the device."""
        got = self.__dict__.get("_on_device")
        if got is None:  # (read on every gather of its results: walked once)
            got = any(isinstance(n, PSource) and n.source.device for n in self.nodes)
            object.__setattr__(self, "_on_device", got)
        return got

    @property
    def nodes(self) -> list:
        """Every node, children first, each once."""
        return toposort(self.outputs)

    @property
    def work(self):
        """What the plan runs (:func:`tra_dask.physical.work.plan_work`: tasks, sites,
        transfers, fusion) — shared by its cost and its lowering."""
        if self._work is None:
            object.__setattr__(self, "_work", plan_work(self.outputs, fusion=self.fusion))
        return self._work

    @property
    def cost(self) -> Cost:
        if self._cost is None:
            cost = plan_cost(self.outputs, self.cost_model).with_fused(len(self.work.into))
            object.__setattr__(self, "_cost", cost)
        return self._cost

    def strategies(self) -> list[str]:
        """The recognised strategies of the plan's contractions (BMM/CMM/RMM,
        data-/model-parallel), in plan order."""
        def under_move(n):
            return n.input.input if isinstance(n.input, Shuffle) else n.input

        inner = set()  # the folds below a contraction's last (pre-aggregation, a tree's levels) are named with it
        for n in self.nodes:
            if isinstance(n, LocalAggregate):
                below = under_move(n)
                while is_pure_rekey(below):
                    below = under_move(below)
                if isinstance(below, LocalAggregate):
                    inner.add(below)
        return [s for s in (classify(n) for n in self.nodes if n not in inner) if s]

    def with_stage(self, stage: Stage) -> "Plan":
        """This plan with ``stage`` recorded before its own stages (a step that ran
        before the optimizer, like the array front-end's choice of chunking)."""
        return Plan(self.outputs, self.rebuild, self.sites, self.cost_model, self.expr, cost=self._cost,
                    compiled=self._compiled, search=self.search, alternatives=self._alternatives,
                    stages=(stage,) + self.stages, fusion=self.fusion, work=self._work)

    def with_cost_model(self, model: str) -> "Plan":
        """The same plan costed under another cost model."""
        return Plan(self.outputs, self.rebuild, self.sites, model, self.expr, fusion=self.fusion, work=self._work)

    def explain(self, stage: str | None = None) -> str:
        """An indented tree, outputs at the top; per line the operator and its
        parameters, placement, tuples (keys / physical), floats moved and peak MB per
        site.  A shared node is printed once and referred to after.  ``stage``: the
        plan one of :attr:`stages` produced instead (``"compile"``, ``"search"``, …)."""
        if stage is not None:
            st = self.stage(stage)
            head = f"stage {st.name} ({st.seconds:.3f} s): {st.note}"
            return head if st.plan is None else head + "\n" + st.plan.explain()
        c = self.cost
        flops = c.flops_per_site
        lines = [
            f"Plan on {self.sites} site(s), cost model {c.model!r}: {len(self.nodes)} nodes",
            f"  floats moved {c.floats_moved:,} ({_fmt_bytes(c.bytes_moved)}); peak "
            f"{_fmt_bytes(c.peak_bytes_per_site.max())}/site; flops/site max {flops.max():.3g}, "
            f"mean {flops.mean():.3g} (balance {c.flops_balance:.2f})",
        ]
        if c.seconds is not None:
            lines.append(f"  predicted time {_fmt_seconds(c.seconds)} (task overhead + the longer of the critical "
                         f"path of per-node times and the busiest site's total: kernels + transfers)")
        chunking = [st for st in self.stages if st.name == "chunking"]
        if chunking:
            lines.append(f"  chunking: {chunking[0].note} ({chunking[0].seconds:.2f} s)")
        lines += [f"  traffic: {st.note}" for st in self.stages if st.name == "traffic"]
        strategies = self.strategies()
        if strategies:
            lines.append("  strategy: " + "; ".join(strategies))
        if self.search is not None:
            r = self.search
            sk = getattr(r, "sketch", None)
            if sk:
                lines.append(
                    f"  planned on a sketch: blocks / {sk['factor']:.2f} along long dims, largest relation "
                    f"{sk['tuples']:,} tuples (here {sk['full_tuples']:,}); {sk['replayed']} sketch plans "
                    f"replayed at full size and costed exactly"
                )
            base = self.compiled.cost.floats_moved if isinstance(self._compiled, Plan) else None
            lines.append(
                f"  search: {r.candidates} candidate plans, {r.rewrites} rewrites"
                + (" (budget exhausted: best found so far)" if r.truncated else "")
                + f"; {self._alternatives_count()} alternatives kept"
                + (f"; compiled plan moves {base:,} floats" if base is not None else "")
            )
        shown: set = set()

        def walk(root, depth0):  # depth first, children in order (a stack: chains of any length)
            todo = [(root, depth0)]
            while todo:
                node, depth = todo.pop()
                if one(node, depth):
                    todo.extend((ch, depth + 1) for ch in reversed(node.children))

        def one(node, depth) -> bool:
            pad = "  " * (depth + 1)
            nc = c.nodes[node]
            if node in shown:
                lines.append(f"{pad}^ {node.label} (shared, shown above)")
                return False
            shown.add(node)
            params = node._fmt_params()
            head = node._op if node._op != "source" else f"Source {node.label}"
            if params:
                head += f"({params})"
            free = "" if node._op != "source" else (" free" if node.free else " fixed")
            secs = "" if c.node_seconds is None else f"  time={_fmt_seconds(c.node_seconds[node])}"
            lines.append(
                f"{pad}{head}  [{node.placement!r}{free}]  tuples={nc.keys}/{nc.tuples}  "
                f"moved={nc.floats_moved:,}  peak={_fmt_bytes(nc.peak_bytes_per_site.max())}/site{secs}"
            )
            return True

        for i, o in enumerate(self.outputs):
            if len(self.outputs) > 1:
                lines.append(f"  output {i}:")
            walk(o, 1 if len(self.outputs) > 1 else 0)
        bound = plan_lower_bound(self)  # one two-operand contraction: its traffic against the lower bound
        if bound is not None:
            per_site = c.floats_moved / self.sites
            what = (f"  communication lower bound for {bound['spec']} (b, m, k, n = "
                    f"{', '.join(map(str, bound['dims']))}; Al Daas et al. 2022): ")
            if bound["total"]:
                lines.append(what + f"{bound['per_site']:,.0f} floats per site; this plan moves {per_site:,.0f} "
                             f"per site, {bound['ratio']:.2f}x the bound (a plan with balanced flops cannot be under 1x)")
            else:
                lines.append(what + f"0 (nothing need move); this plan moves {per_site:,.0f} floats per site")
        return "\n".join(lines)

    def __repr__(self):
        return f"<Plan: {len(self.outputs)} output(s), {self.sites} site(s), {len(self.nodes)} nodes>"

    def _repr_pretty_(self, p, cycle):  # IPython
        p.text(self.explain())

    def _repr_html_(self) -> str:
        return plan_html(self)

    def to_networkx(self):
        """The plan as a networkx DiGraph (see :func:`tra_dask.viz.to_networkx`)."""
        return to_networkx(self)

    def visualize(self, filename: str | None = None, format: str | None = None):
        """Draw the plan (matplotlib); write ``filename`` if given (see :func:`tra_dask.viz.visualize`)."""
        return visualize(self, filename, format)
