"""Section 3: the schedules on a small causal and a small full problem.

Gantt charts from the event simulator, tile grids from the schedules, the DAG with its
critical path, and the lemma ``depth(u) <= depth(v)`` on the chains of real schedules.
"""

from __future__ import annotations

from pathlib import Path

from dash_ref import BANDED, NAMES, Problem, build_schedule, save_gantt, simulate
from dash_ref.model.dag import REDUCE, build_dag, depth_condition, edge_keeps_critical_path

from .dagplot import draw_dag
from .plot import figure, save
from .tilegrid import draw_schedule_grids, draw_tile_picture

N, BLOCK, D = 4, 128, 64  # tiles per side, tile rows, head dim
C, R = 1.0, 0.5  # cost of a compute stage and of a dQ reduce
HEADS = 2  # m in the closed forms
WORKERS = N


def problem(mask: str, heads: int = HEADS, n: int = N) -> Problem:
    return Problem(1, heads, heads, n * BLOCK, n * BLOCK, D, mask, BLOCK, BLOCK)


CLOSED_FORMS = {  # from the dash_ref.model.dag docstring: sync model, n workers, m heads
    ("full", "naive"): lambda n, m, c, r: m * n * (c + r) + (n - 1) * r,
    ("full", "shift"): lambda n, m, c, r: m * n * (c + r),
    ("causal", "descending"): lambda n, m, c, r: m * (n + 1) * (c + r) / 2 + (n - 1) * r,
    ("causal", "symmetric_shift"): lambda n, m, c, r: m * (n + 1) * (c + r) / 2,
}


#: the sliding-window figures: a causal window two tiles wide on a problem twice as long
WINDOW_N, WINDOW = 2 * N, (2 * BLOCK, 0)
WINDOW_NAMES = ("naive", "descending", "symmetric_shift", *BANDED)


def window_problem() -> Problem:
    """A causal sliding window of ``WINDOW[0]`` keys on ``WINDOW_N`` tiles per side."""
    n = WINDOW_N * BLOCK
    return Problem(1, HEADS, HEADS, n, n, D, "causal", BLOCK, BLOCK, window_size=WINDOW)


def window_figures(gantt_path: Path, grid_path: Path) -> dict:
    """The band's schedules in the simulator (Gantt, critical paths outlined) and as tile
    grids; makespans and the lower bound ``max(work / W, longest chain)``."""
    p = window_problem()
    results, critical, numbers = [], [], {}
    schedules = [build_schedule(p, name, WORKERS).validate() for name in WINDOW_NAMES]
    for s in schedules:
        res = simulate(s, "sync", C, R)
        dag = build_dag(s, "sync", C, R)
        cp = dag.critical_path()
        assert cp.length == res.makespan, (s.name, cp.length, res.makespan)
        results.append(res)
        critical.append(dag.path_keys(cp))
        numbers[f"sched.window.{s.name}.makespan"] = res.makespan
        numbers[f"sched.window.{s.name}.idle_pct"] = 100 * res.idle_fraction
    chains = [len(p.chain_rows[j]) for j in range(p.n_kv)]
    numbers["sched.window.n"] = WINDOW_N
    numbers["sched.window.tiles"] = WINDOW[0] // BLOCK
    numbers["sched.window.bound"] = max(p.num_pairs * p.heads_total * (C + R) / WORKERS,
                                        max(chains) * (C + R))
    save_gantt(results, gantt_path, critical)
    draw_schedule_grids(schedules, grid_path)
    return numbers


def gantt(mask: str, path: Path) -> dict:
    """All schedules of one mask in the simulator, critical paths outlined; makespans."""
    p = problem(mask)
    results, critical, numbers = [], [], {}
    for name in NAMES:
        s = build_schedule(p, name, WORKERS).validate()
        res = simulate(s, "sync", C, R)
        dag = build_dag(s, "sync", C, R)
        cp = dag.critical_path()
        assert cp.length == res.makespan, (name, cp.length, res.makespan)
        results.append(res)
        critical.append(dag.path_keys(cp))
        numbers[f"sched.{mask}.{name}.makespan"] = res.makespan
        numbers[f"sched.{mask}.{name}.idle_pct"] = 100 * res.idle_fraction
        numbers[f"sched.{mask}.{name}.fingerprint"] = s.fingerprint()
        form = CLOSED_FORMS.get((mask, name))
        if form is not None:
            numbers[f"sched.{mask}.{name}.closed_form"] = form(N, HEADS, C, R)
    save_gantt(results, path, critical)
    return numbers


def dag_figure(path: Path) -> dict:
    """The DAG of four schedules at earliest start times, the critical path in red."""
    cases = [("full", "naive", 1), ("full", "shift", 1),
             ("causal", "descending", HEADS), ("causal", "symmetric_shift", HEADS)]
    fig = figure(12, 9)
    axes = fig.subplots(len(cases), 1)
    numbers = {}
    for ax, (mask, name, heads) in zip(axes, cases, strict=True):
        dag = build_dag(build_schedule(problem(mask, heads), name, WORKERS), "sync", C, R)
        length = dag.critical_path().length
        numbers[f"dag.{mask}.{name}.h{heads}.critical_path"] = length
        draw_dag(ax, dag)
        ax.set_title(f"{name}, {mask} mask, {heads} head{'s' if heads > 1 else ''}: "
                     f"critical path {length:g}", fontsize=9, loc="left")
    axes[-1].set_xlabel(f"time (compute c = {C:g}: blue boxes labelled i,j; "
                        f"reduce r = {R:g}: orange; arrows: dQ-order edges; red: critical path)",
                        fontsize=8)
    fig.tight_layout()
    save(fig, path)
    return numbers


def lemma(path: Path) -> dict:
    """The dQ edges of ``naive`` and ``shift`` added to their workers' independent chains.

    With one head on ``n`` workers each worker runs one chain of ``n`` visits: parallel
    isomorphic chains. Each dQ edge ``u -> v`` is tested alone on those chains with
    :func:`depth_condition` and :func:`edge_keeps_critical_path` (the lemma says they
    agree); then all edges are added and the critical path measured.
    """
    fig = figure(12, 5.4)
    axes = fig.subplots(2, 1)
    numbers = {}
    agree = total = 0
    for ax, name in zip(axes, ("naive", "shift"), strict=True):
        s = build_schedule(problem("full", 1), name, WORKERS)
        chains = build_dag(s, "sync", C, R, dq_edges=False)
        edges, colors, holds = [], [], 0
        for (b, h, i), order in sorted(s.dq_orders.items()):
            for j0, j1 in zip(order, order[1:]):
                u, v = chains.node(REDUCE, b, h, i, j0), chains.node(REDUCE, b, h, i, j1)
                ok = depth_condition(chains, u, v)
                agree += ok == edge_keeps_critical_path(chains, u, v)
                total += 1
                holds += ok
                edges.append((u, v))
                colors.append("#2ca02c" if ok else "#d62728")
        full = chains.copy()
        for u, v in edges:
            full.add_edge(u, v)
        base_len, full_len = chains.critical_path().length, full.critical_path().length
        numbers.update({f"lemma.{name}.edges": len(edges), f"lemma.{name}.holds": holds,
                        f"lemma.{name}.chains_cp": base_len,
                        f"lemma.{name}.with_edges_cp": full_len})
        draw_dag(ax, chains, edges, colors, critical=False)
        ax.set_title(f"{name}: {holds} of {len(edges)} dQ edges satisfy depth(u) <= depth(v) "
                     f"(green; red: violated). Critical path {base_len:g} without them, "
                     f"{full_len:g} with them", fontsize=9, loc="left")
    numbers["lemma.agree"] = agree
    numbers["lemma.total"] = total
    axes[-1].set_xlabel("time on the independent chains (no dQ edges): an edge that points "
                        "back in time must delay v", fontsize=8)
    fig.tight_layout()
    save(fig, path)
    return numbers


def run(out: Path) -> tuple[dict, dict]:
    """Numbers and figures of sections 2 and 3."""
    numbers: dict = {"sched.n": N, "sched.heads": HEADS, "sched.workers": WORKERS,
                     "sched.c": C, "sched.r": R}
    pic = build_schedule(Problem(1, 1, 1, 5 * BLOCK, 5 * BLOCK, D, "causal", BLOCK, BLOCK),
                         "naive", 5)
    draw_tile_picture(pic, chain_j=1, row_i=3, path=out / "tiles-causal.png")
    for mask in ("full", "causal"):
        numbers.update(gantt(mask, out / f"gantt-{mask}.png"))
        schedules = [build_schedule(problem(mask), n, WORKERS) for n in NAMES]
        draw_schedule_grids(schedules, out / f"grid-{mask}.png")
    numbers.update(window_figures(out / "gantt-window.png", out / "grid-window.png"))
    numbers.update(dag_figure(out / "dag-critical-path.png"))
    numbers.update(lemma(out / "lemma.png"))
    figs = {"tiles-causal.png": "tile pairs, chains and dQ rows",
            "gantt-full.png": "Gantt, full mask", "gantt-causal.png": "Gantt, causal mask",
            "grid-full.png": "tile grids, full mask", "grid-causal.png": "tile grids, causal",
            "gantt-window.png": "Gantt, causal sliding window",
            "grid-window.png": "tile grids, causal sliding window",
            "dag-critical-path.png": "DAG and critical path", "lemma.png": "the lemma"}
    return numbers, figs
