"""Pictures of plans and placements: networkx graphs, matplotlib (or graphviz)
drawings, site grids, and the HTML that notebooks show."""

from __future__ import annotations

import html

import numpy as np
from .units import fmt_bytes as _fmt_bytes

__all__ = ["to_networkx", "visualize", "site_grid", "visualize_sites", "relation_html", "plan_html", "futures_html"]


def to_networkx(plan):
    """The plan as a ``networkx.DiGraph``: one node per IA operator (attributes ``op``,
    ``params``, ``placement``, ``keys``, ``tuples``, ``floats_moved``,
    ``peak_bytes``) and an edge from each input to its consumer carrying the floats
    the consumer moved (``floats_moved``, nonzero into a Broadcast/Shuffle)."""
    import networkx as nx

    cost = plan.cost
    g = nx.DiGraph()
    ids = {}
    for i, node in enumerate(plan.nodes):
        nc = cost.nodes[node]
        ids[node] = f"n{i}"
        g.add_node(f"n{i}", op=node._op if node._op != "source" else "Source", label=node.label,
                   params=node._fmt_params(), placement=repr(node.placement), keys=nc.keys, tuples=nc.tuples,
                   floats_moved=int(nc.floats_moved), peak_bytes=int(nc.peak_bytes_per_site.max()),
                   output=node in plan.outputs)
    for node in plan.nodes:
        for child in node.children:
            g.add_edge(ids[child], ids[node], floats_moved=int(cost.nodes[node].floats_moved))
    return g


def _levels(g):
    """Depth of each node from the sources (for a layered drawing)."""
    import networkx as nx

    depth = {}
    for n in nx.topological_sort(g):
        preds = list(g.predecessors(n))
        depth[n] = 1 + max((depth[p] for p in preds), default=-1)
    return depth


def visualize(plan, filename: str | None = None, format: str | None = None):
    """Draw the plan: graphviz when the ``graphviz`` package and ``dot`` are there,
    else matplotlib.  With ``filename`` (``.png``/``.svg``/``.pdf``) write it and
    return the name; else return the matplotlib figure.  In an SVG each operator is
    an element with id ``tra-node-<i>``."""
    g = to_networkx(plan)
    depth = _levels(g)
    width = {}
    pos = {}
    for n in sorted(g.nodes, key=lambda n: (depth[n], n)):
        row = depth[n]
        pos[n] = (width.get(row, 0), -row)
        width[row] = width.get(row, 0) + 1
    import matplotlib

    if filename is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    cols = max(width.values()) if width else 1
    fig, ax = plt.subplots(figsize=(max(6, 3.2 * cols), 1.3 * (max(depth.values(), default=0) + 1) + 1))
    for u, v, d in g.edges(data=True):
        (x0, y0), (x1, y1) = pos[u], pos[v]
        ax.annotate("", xy=(x1, y1 - 0.22), xytext=(x0, y0 + 0.22),
                    arrowprops=dict(arrowstyle="->", color="#c33" if d["floats_moved"] else "#888",
                                    lw=1 + 2 * bool(d["floats_moved"])))
    for i, (n, d) in enumerate(g.nodes(data=True)):
        x, y = pos[n]
        moved = f"\nmoved {d['floats_moved']:,}" if d["floats_moved"] else ""
        head = d['label'] if d['op'] == 'Source' else d['op']
        text = f"{head}\n{d['placement']}  {d['keys']}/{d['tuples']} tuples{moved}"
        box = FancyBboxPatch((x - 0.45, y - 0.22), 0.9, 0.44, boxstyle="round,pad=0.02",
                             fc="#eef6ee" if d["op"] in ("Broadcast", "Shuffle") else "#eef2fb",
                             ec="#c33" if d["floats_moved"] else "#456")
        box.set_gid(f"tra-node-{n[1:]}")
        ax.add_patch(box)
        ax.text(x, y, text, ha="center", va="center", fontsize=7)
    ax.set_xlim(-0.6, cols - 0.4)
    ax.set_ylim(-(max(depth.values(), default=0)) - 0.5, 0.5)
    ax.axis("off")
    c = plan.cost
    ax.set_title(f"{plan.sites} sites, {c.floats_moved:,} floats moved ({c.model}); "
                 + ("; ".join(plan.strategies()) or "compiled plan"), fontsize=9)
    if filename is None:
        return fig
    fig.savefig(filename, format=format, bbox_inches="tight")
    plt.close(fig)
    return filename


def site_grid(node) -> np.ndarray:
    """For a physical node with 2-d (or 1-d) keys: a grid over the frontier whose
    cells hold the site of each key (-1: no such key; -2: on several sites)."""
    t, lay = node.type, node.layout
    if t.arity not in (1, 2):
        raise ValueError(f"site_grid draws key arity 1 or 2, {node.label} has {t.arity}")
    shape = t.frontier if t.arity == 2 else (1, t.frontier[0])
    grid = np.full(shape, -1, dtype=np.int64)
    for r, s in zip(lay.rows.tolist(), lay.sites.tolist()):
        k = tuple(t.keys[r].tolist())
        idx = k if t.arity == 2 else (0, k[0])
        grid[idx] = s if grid[idx] in (-1, s) else -2
    return grid


def visualize_sites(node, filename: str | None = None):
    """Which key is on which site, as a colour grid (one colour per site)."""
    import matplotlib

    if filename is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    grid = site_grid(node)
    fig, ax = plt.subplots(figsize=(1 + 0.4 * grid.shape[1], 1 + 0.4 * grid.shape[0]))
    ax.imshow(np.ma.masked_less(grid, 0), cmap="tab10", vmin=0, vmax=9)
    for (i, j), s in np.ndenumerate(grid):
        ax.text(j, i, "*" if s == -2 else ("" if s < 0 else str(s)), ha="center", va="center", fontsize=8)
    ax.set_xlabel("key dim 1" if grid.shape[0] > 1 else "key dim 0")
    ax.set_title(f"{node.label}: site of each key", fontsize=9)
    if filename is None:
        return fig
    fig.savefig(filename, bbox_inches="tight")
    plt.close(fig)
    return filename


# -- notebook HTML -----------------------------------------------------------------

def relation_html(rel) -> str:
    t = rel.type
    shapes = ", ".join(str(s) for s in t.shapes[:6]) + (" …" if len(t.shapes) > 6 else "")
    rows = [("relation", html.escape(rel.label)), ("key arity", t.arity), ("tuples", f"{t.ntuples:,}"),
            ("frontier", t.frontier), ("continuous", t.is_continuous), ("chunk shapes", shapes),
            ("dtype", t.dtype), ("bytes", f"{t.nbytes:,} ({_fmt_bytes(t.nbytes)})")]
    body = "".join(f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>{v}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def plan_html(plan) -> str:
    alts = ""
    if plan.alternatives:
        rows = "".join(
            f"<tr><td>{i + 1}</td><td>{html.escape('; '.join(a.strategies()) or '-')}</td>"
            f"<td>{a.cost.floats_moved:,}</td><td>{_fmt_bytes(a.cost.peak_bytes_per_site.max())}</td>"
            f"<td>{a.cost.flops_balance:.2f}</td></tr>"
            for i, a in enumerate(plan.alternatives[:10]))
        alts = ("<p>alternatives considered (first 10):</p><table><tr><th>#</th><th>strategy</th>"
                f"<th>floats moved</th><th>peak/site</th><th>balance</th></tr>{rows}</table>")
    return f"<pre>{html.escape(plan.explain())}</pre>{alts}"


def futures_html(rf) -> str:
    per = {w: {} for w in rf.lowered.workers}
    for key, fut in rf.items():
        w = rf.lowered.planned.get(fut.key, "elsewhere")
        per.setdefault(w, {})
        per[w][fut.status] = per[w].get(fut.status, 0) + 1
    rows = "".join(
        f"<tr><td>{i}</td><td>{html.escape(w)}</td><td>{html.escape(', '.join(f'{k}: {v}' for k, v in sorted(st.items())) or '-')}</td></tr>"
        for i, (w, st) in enumerate(per.items()))
    link = rf.dashboard_link
    linkhtml = f"<p><a href='{html.escape(link)}' target='_blank'>tra_dask dashboard page</a></p>" if link else ""
    return (f"<p>RelationFutures <b>{html.escape(rf.node.label)}</b>: {len(rf)} chunks on "
            f"{len(rf.lowered.workers)} sites</p><table><tr><th>site</th><th>worker</th><th>result chunks</th></tr>"
            f"{rows}</table>{linkhtml}")
