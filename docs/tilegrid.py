"""Tile-pair grids: the picture of section 2 and the schedule grids of section 3.

A grid has one cell per tile pair ``(i, j)``: rows are Q tiles ``i``, columns KV tiles
``j``. Everything shown is read from a :class:`~dash_ref.schedules.schedule.Schedule`: which worker
visits a pair, at which step of that worker's program, and the rank of ``j`` in the dQ
order of tile ``i``.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.patches import FancyBboxPatch, Rectangle

from dash_ref import Problem, Schedule

from .plot import MASKED, figure, save, worker_color


def visit_table(s: Schedule) -> dict[tuple[int, int, int, int], tuple[int, int]]:
    """``{(b, h, i, j): (worker, step)}``; ``step`` counts the visits of one worker's program."""
    table, steps = {}, [0] * s.num_workers
    for w, c in s.chains():
        for i in c.visits:
            table[(c.b, c.h, i, c.j)] = (w, steps[w])
            steps[w] += 1
    return table


def _cell(ax, i: int, j: int, color: str, **kw) -> None:
    ax.add_patch(Rectangle((j, i), 1, 1, facecolor=color, edgecolor=kw.pop("edge", "white"),
                           linewidth=kw.pop("lw", 1.0), **kw))


def _frame(ax, p: Problem, fontsize: int = 7) -> None:
    ax.set_xlim(0, p.n_kv)
    ax.set_ylim(p.n_q, 0)
    ax.set_aspect("equal")
    ax.set_xticks([j + 0.5 for j in range(p.n_kv)])
    ax.set_xticklabels([f"j={j}" for j in range(p.n_kv)], fontsize=fontsize)
    ax.set_yticks([i + 0.5 for i in range(p.n_q)])
    ax.set_yticklabels([f"i={i}" for i in range(p.n_q)], fontsize=fontsize)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def draw_grid(ax, s: Schedule, b: int = 0, h: int = 0, fontsize: int = 7) -> None:
    """One head of a schedule: each active cell in its worker's colour, labelled
    ``w<worker>:<step>`` (who visits it, when) and ``r<rank>`` (its place in dQ order)."""
    p = s.problem
    where = visit_table(s)
    for i in range(p.n_q):
        rank = s.dq_rank(b, h, i)
        for j in range(p.n_kv):
            if not p.active(i, j):
                _cell(ax, i, j, MASKED)
                continue
            w, step = where[(b, h, i, j)]
            _cell(ax, i, j, worker_color(w))
            ax.text(j + 0.5, i + 0.36, f"w{w}:{step}", ha="center", va="center",
                    fontsize=fontsize)
            ax.text(j + 0.5, i + 0.72, f"r{rank[j]}" if rank else "r?", ha="center",
                    va="center", fontsize=fontsize, color="#444444")
    _frame(ax, p, fontsize)


def draw_schedule_grids(schedules: list[Schedule], path: Path, per_row: int = 2) -> Path:
    """Every head ``(b, h)`` of every schedule, ``per_row`` schedules side by side."""
    p = schedules[0].problem
    heads = [(b, h) for b in range(p.batch) for h in range(p.heads)]
    rows = -(-len(schedules) // per_row)
    cols = per_row * len(heads)
    cell = 0.62
    fig = figure(0.3 + cols * (p.n_kv * cell + 0.55), 0.8 + rows * (p.n_q * cell + 0.85))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for k, s in enumerate(schedules):
        for m, (b, h) in enumerate(heads):
            ax = axes[k // per_row, (k % per_row) * len(heads) + m]
            ax.axis("on")
            draw_grid(ax, s, b, h)
            ax.set_title(f"{s.name}, head {h}" + (f" (b={b})" if p.batch > 1 else ""),
                         fontsize=8, loc="left")
    rule = f"window {p.window_size}" if p.is_windowed else f"{p.mask} mask"
    fig.suptitle(f"{rule}, n_q = n_kv = {p.n_q}, {p.heads} heads, "
                 f"{schedules[0].num_workers} workers.\nCell (i, j): w<worker>:<step in that "
                 "worker's program>, and r<rank of j in the dQ order of row i> (r? = arrival "
                 "order)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return save(fig, path)


def draw_tile_picture(s: Schedule, chain_j: int, row_i: int, path: Path) -> Path:
    """Section 2: which sums a register holds (a column) and which cross workers (a row)."""
    p = s.problem
    where = visit_table(s)
    chain = s.chain(0, 0, chain_j)
    fig = figure(9.5, 6.2)
    ax = fig.subplots()
    for i in range(p.n_q):
        for j in range(p.n_kv):
            color = "white" if p.active(i, j) else MASKED
            _cell(ax, i, j, color, edge="#999999", lw=0.8)
            if p.active(i, j) and not p.is_dense(i, j):
                ax.text(j + 0.95, i + 0.1, "partly\nmasked", fontsize=6, ha="right",
                        va="top", color="#777777")
    col = "#9ecae1"
    for step, i in enumerate(chain.visits):
        _cell(ax, i, chain_j, col, edge="#3182bd", lw=1.5, alpha=0.8)
        ax.text(chain_j + 0.5, i + 0.5, f"visit {step}", ha="center", va="center", fontsize=8)
    row = "#fdae6b"
    for j in p.tile_cols[row_i]:
        w, step = where[(0, 0, row_i, j)]
        _cell(ax, row_i, j, row, edge="#e6550d", lw=1.5, alpha=0.6)
        ax.text(j + 0.5, row_i + 0.82, f"worker {w}", ha="center", va="center", fontsize=7,
                color="#a63603")
    # the register accumulator under the column, the global accumulator right of the row
    ax.add_patch(FancyBboxPatch((chain_j + 0.05, p.n_q + 0.35), 0.9, 0.5,
                                boxstyle="round,pad=0.05", facecolor=col, edgecolor="#3182bd"))
    ax.text(chain_j + 0.5, p.n_q + 0.6, f"dK_{chain_j}, dV_{chain_j}", ha="center",
            va="center", fontsize=8)
    ax.annotate("", xy=(chain_j + 0.5, p.n_q + 0.33), xytext=(chain_j + 0.5, p.n_q - 0.1),
                arrowprops={"arrowstyle": "->", "color": "#3182bd", "lw": 1.5})
    ax.text(chain_j + 1.1, p.n_q + 0.6,
            f"registers of one worker: added in the chain's visit order\n"
            f"({', '.join(f'i={i}' for i in chain.visits)}): fixed by the program",
            va="center", fontsize=8, color="#08519c")
    ax.add_patch(FancyBboxPatch((p.n_kv + 0.4, row_i + 0.2), 1.1, 0.6,
                                boxstyle="round,pad=0.05", facecolor=row, edgecolor="#e6550d"))
    ax.text(p.n_kv + 0.95, row_i + 0.5, f"dQacc_{row_i}", ha="center", va="center", fontsize=8)
    last = max(p.tile_cols[row_i]) + 1
    ax.annotate("", xy=(p.n_kv + 0.35, row_i + 0.5), xytext=(last + 0.02, row_i + 0.5),
                arrowprops={"arrowstyle": "->", "color": "#e6550d", "lw": 1.5})
    ax.text(p.n_kv + 0.4, row_i + 1.25,
            f"global memory (fp32): {len(p.tile_cols[row_i])} partials\nfrom "
            f"{len({where[(0, 0, row_i, j)][0] for j in p.tile_cols[row_i]})} workers. "
            "Their order:\natomics: whoever arrives first;\nDASH: a fixed rank per j",
            fontsize=8, va="top", color="#a63603")
    ax.set_xlim(-0.1, p.n_kv + 2.9)
    ax.set_ylim(p.n_q + 1.1, -0.1)
    ax.set_aspect("equal")
    ax.set_xticks([j + 0.5 for j in range(p.n_kv)])
    ax.set_xticklabels([f"j={j}" for j in range(p.n_kv)], fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(p.n_q)])
    ax.set_yticklabels([f"i={i}" for i in range(p.n_q)], fontsize=8)
    ax.tick_params(length=0)
    ax.xaxis.tick_top()
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"causal mask, {p.n_q} Q tiles x {p.n_kv} KV tiles of one head: grey pairs "
                 "are masked and skipped", fontsize=9, loc="left", pad=22)
    fig.tight_layout()
    return save(fig, path)
