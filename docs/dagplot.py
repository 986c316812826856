"""DAG pictures: tasks at their earliest start times, dQ-order edges, the critical path.

Nodes come from :func:`dash_ref.model.dag.build_dag` (sync model: a worker computes, then
reduces, visit after visit); times from :meth:`~dash_ref.model.dag.DAG.start_times`. In the sync
model an edge from one reduce to another is always a dQ-order edge.
"""

from __future__ import annotations

from matplotlib.patches import Rectangle

from dash_ref.model.dag import COMPUTE, DAG, REDUCE
from dash_ref.model.gantt import COLORS

CP_COLOR = "red"


def dq_edges(dag: DAG) -> list[tuple[int, int]]:
    """The reduce -> reduce edges of a sync-model DAG: its dQ-order edges."""
    return [(u, v) for u, outs in enumerate(dag.succ) for v in outs
            if dag.tasks[u].kind == REDUCE and dag.tasks[v].kind == REDUCE]


def draw_dag(ax, dag: DAG, edges: list[tuple[int, int]] | None = None,
             edge_colors: list[str] | None = None, critical: bool = True,
             labels: bool = True) -> None:
    """Every task as a box on its worker's row at its earliest start; ``edges`` as arrows
    from the end of ``u`` to the start of ``v`` (default: the dQ-order edges)."""
    start = dag.start_times()
    cp = dag.critical_path() if critical else None
    on_path = set(cp.nodes) if cp else set()
    path_edges = set(zip(cp.nodes, cp.nodes[1:])) if cp else set()
    for n, t in enumerate(dag.tasks):
        red = n in on_path
        ax.add_patch(Rectangle((start[n], t.worker - 0.3), t.weight, 0.6,
                               facecolor=COLORS[t.kind], edgecolor=CP_COLOR if red else "white",
                               linewidth=1.6 if red else 0.5, zorder=2))
        if labels and t.kind == COMPUTE:
            ax.text(start[n] + t.weight / 2, t.worker, f"{t.i},{t.j}", ha="center",
                    va="center", fontsize=6, zorder=3, color="white")
    edges = dq_edges(dag) if edges is None else edges
    colors = edge_colors or [CP_COLOR if (u, v) in path_edges else "#555555" for u, v in edges]
    for (u, v), color in zip(edges, colors, strict=True):
        tu, tv = dag.tasks[u], dag.tasks[v]
        ax.annotate("", xy=(start[v], tv.worker), xytext=(start[u] + tu.weight, tu.worker),
                    arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.0,
                                "shrinkA": 0, "shrinkB": 0,
                                "connectionstyle": "arc3,rad=-0.15"}, zorder=4)
    workers = max(t.worker for t in dag.tasks) + 1
    ax.set_ylim(workers - 0.4, -0.6)
    ax.set_yticks(range(workers))
    ax.set_yticklabels([f"w{w}" for w in range(workers)], fontsize=7)
    end = max(s + t.weight for s, t in zip(start, dag.tasks, strict=True))
    ax.set_xlim(-0.1, end + 0.1)
    ax.tick_params(labelsize=7)
