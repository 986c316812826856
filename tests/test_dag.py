"""The DAG model, its critical path, the event simulator and the Gantt renderings.

The closed forms are docs/design.md section 4's (published); the placement assumptions under
which they hold are written in :mod:`dash_ref.model.dag`'s docstring and repeated here.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_ref import NAMES, Chain, Problem, ScheduleError, build_schedule
from dash_ref.model.dag import (
    COMPUTE,
    REDUCE,
    build_dag,
    critical_path,
    depth_condition,
    edge_keeps_critical_path,
    parallel_chains,
)
from dash_ref.model.gantt import save_gantt, text_timeline
from dash_ref.model.simulator import simulate


def square(n: int, m: int, mask: str, bm: int = 16, batch: int = 1) -> Problem:
    """``n`` Q tiles = ``n`` KV tiles, ``m`` heads (B = 1, H = m), BM = BN."""
    return Problem(batch, m, m, n * bm, n * bm, 64, mask, bm, bm)


def makespans(problem: Problem, name: str, workers: int, c: float, r: float,
              model: str = "sync", partial: bool = False) -> tuple[float, float]:
    s = build_schedule(problem, name, workers)
    return (critical_path(s, model, c, r, partial).length,
            simulate(s, model, c, r, partial).makespan)


# (c, r) pairs; powers of two and small integers keep every sum exact in floating point
COSTS = [(1.0, 1.0), (3.0, 1.0), (1.0, 3.0), (2.0, 0.5), (1.0, 0.0), (0.5, 0.25)]
COSTS_R_LE_C = [(c, r) for c, r in COSTS if r <= c]


# ---------------------------------------------------------------------------------------
# closed forms (sync model, n workers, m heads back to back, every tile costs c)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("c,r", COSTS)
def test_full_naive_closed_form(n: int, m: int, c: float, r: float) -> None:
    # any n, m, c, r: chain (h, j) on worker j, worker j starts j*r late
    expected = m * n * (c + r) + (n - 1) * r
    assert makespans(square(n, m, "full"), "naive", n, c, r) == (expected, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("c,r", COSTS)
def test_full_shift_closed_form(n: int, m: int, c: float, r: float) -> None:
    # any n, m, c, r: one head = one wave on n workers, nobody waits
    expected = m * n * (c + r)
    assert makespans(square(n, m, "full"), "shift", n, c, r) == (expected, expected)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("c,r", COSTS_R_LE_C)
def test_causal_descending_closed_form(n: int, m: int, c: float, r: float) -> None:
    # assumption: m even, r <= c (greedy zigzag placement: head 2t chain j on worker j,
    # head 2t+1 chain j on worker n-1-j)
    expected = m * (n + 1) * (c + r) / 2 + (n - 1) * r
    assert makespans(square(n, m, "causal"), "descending", n, c, r) == (expected, expected)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_causal_descending_two_heads_any_r(n: int) -> None:
    # with m = 2 the form holds for r > c too
    c, r = 1.0, 3.0
    expected = 2 * (n + 1) * (c + r) / 2 + (n - 1) * r
    assert makespans(square(n, 2, "causal"), "descending", n, c, r) == (expected, expected)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("m", [4, 6])
def test_causal_descending_needs_r_le_c_beyond_two_heads(n: int, m: int) -> None:
    # the assumption matters: with r > c each pair of heads after the first adds (n-1)(r-c)
    c, r = 1.0, 3.0
    form = m * (n + 1) * (c + r) / 2 + (n - 1) * r
    cp, sim = makespans(square(n, m, "causal"), "descending", n, c, r)
    assert cp == sim > form
    assert cp == form + (m // 2 - 1) * (n - 1) * (r - c)


@pytest.mark.parametrize("n", [2, 4, 6, 8])
@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize("c,r", COSTS)
def test_causal_symmetric_shift_closed_form(n: int, m: int, c: float, r: float) -> None:
    # assumption: n even (pairs j, n-1-j fold the triangle), m even (two heads per round)
    expected = m * (n + 1) * (c + r) / 2
    assert makespans(square(n, m, "causal"), "symmetric_shift", n, c, r) == (expected, expected)


@pytest.mark.parametrize("n", [2, 4, 6])
@pytest.mark.parametrize("m", [1, 3, 5])
def test_causal_symmetric_shift_odd_heads(n: int, m: int) -> None:
    # odd m: the last round carries one head on half the workers
    c, r = 2.0, 1.0
    expected = -(-m // 2) * (n + 1) * (c + r)
    assert makespans(square(n, m, "causal"), "symmetric_shift", n, c, r) == (expected, expected)


@settings(max_examples=25, deadline=None)
@given(half_n=st.integers(1, 5), batch=st.integers(1, 3), heads=st.integers(1, 4),
       c=st.sampled_from([1.0, 2.0, 0.5]), r=st.sampled_from([0.0, 0.25, 1.0, 4.0]),
       data=st.data())
def test_symmetric_shift_reaches_causal_lower_bound(half_n, batch, heads, c, r, data) -> None:
    # Lower bound: total work over W workers. Reached whenever the rounds are full, i.e.
    # W divides the number of folded pairs B*H*n/2 (n even), for any W, c, r.
    n = 2 * half_n
    pairs = batch * heads * half_n
    workers = data.draw(st.sampled_from([w for w in range(1, pairs + 1) if pairs % w == 0]))
    p = square(n, heads, "causal", batch=batch)
    total = batch * heads * n * (n + 1) / 2 * (c + r)
    cp, sim = makespans(p, "symmetric_shift", workers, c, r)
    assert cp == pytest.approx(total / workers) and sim == pytest.approx(total / workers)
    # and nothing beats the lower bound
    for name in NAMES:
        assert makespans(p, name, workers, c, r)[0] >= total / workers - 1e-9


# ---------------------------------------------------------------------------------------
# simulator == critical path, and model inequalities
# ---------------------------------------------------------------------------------------
@st.composite
def problems(draw, masks=("full", "causal")) -> Problem:
    bm = draw(st.sampled_from([16, 32]))
    bn = draw(st.sampled_from([16, 32]))
    heads_kv = draw(st.integers(1, 2))
    return Problem(
        batch=draw(st.integers(1, 2)),
        heads=heads_kv * draw(st.integers(1, 2)),
        heads_kv=heads_kv,
        seqlen_q=draw(st.integers(1, 6 * bm)),
        seqlen_k=draw(st.integers(1, 6 * bn)),
        head_dim=64,
        mask=draw(st.sampled_from(masks)),
        block_m=bm,
        block_n=bn,
    )


costs = st.tuples(st.sampled_from([0.5, 1.0, 2.0, 3.0]), st.sampled_from([0.0, 0.25, 1.0, 2.5]))


@settings(max_examples=40, deadline=None)
@given(problem=problems(), workers=st.integers(1, 16), cr=costs, partial=st.booleans())
def test_simulator_matches_critical_path(problem, workers, cr, partial) -> None:
    c, r = cr
    for name in NAMES:
        s = build_schedule(problem, name, workers)
        for model in ("sync", "async"):
            dag = build_dag(s, model, c, r, partial)
            cp = dag.critical_path()
            sim = simulate(s, model, c, r, partial)
            assert sim.makespan == pytest.approx(cp.length, abs=1e-9), (name, model)
            # the path is a real path of the DAG whose weights add up to its length
            for u, v in itertools.pairwise(cp.nodes):
                assert v in dag.succ[u]
            assert sum(dag.tasks[n].weight for n in cp.nodes) == pytest.approx(cp.length)
            # per-worker accounting: busy time is the work placed on the worker
            work = [0.0] * workers
            for t in dag.tasks:
                work[t.worker] += t.weight
            if model == "sync":
                assert sim.busy == pytest.approx(work)
            assert all(-1e-9 <= x <= sim.makespan + 1e-9 for x in sim.idle)
            assert 0.0 <= sim.idle_fraction <= 1.0


@settings(max_examples=25, deadline=None)
@given(problem=problems(), workers=st.integers(1, 16), cr=costs, staging=st.integers(1, 3))
def test_bounded_staging_lies_between_the_two_worker_models(problem, workers, cr, staging):
    """``async`` with ``s`` staging buffers: the simulator and the DAG agree; one buffer is
    the ``sync`` model; more buffers never slow a schedule; unbounded is the plain ``async``."""
    c, r = cr
    for name in NAMES:
        s = build_schedule(problem, name, workers)
        bounded = critical_path(s, "async", c, r, staging=staging).length
        assert simulate(s, "async", c, r, staging=staging).makespan == pytest.approx(
            bounded, abs=1e-9), name
        sync = critical_path(s, "sync", c, r).length
        free = critical_path(s, "async", c, r).length
        assert free - 1e-9 <= bounded <= sync + 1e-9
        more = critical_path(s, "async", c, r, staging=staging + 1).length
        assert more <= bounded + 1e-9
        if staging == 1:
            assert bounded == pytest.approx(sync, abs=1e-9)


@pytest.mark.parametrize("model, staging, error", [("sync", 2, ValueError),
                                                  ("async", 0, ValueError),
                                                  ("async", 1.5, TypeError)])
def test_staging_is_refused_where_it_means_nothing(model, staging, error) -> None:
    s = build_schedule(square(2, 1, "full"), "naive", 2)
    with pytest.raises(error, match="staging"):
        build_dag(s, model, 1.0, 1.0, staging=staging)
    with pytest.raises(error, match="staging"):
        simulate(s, model, 1.0, 1.0, staging=staging)


@settings(max_examples=30, deadline=None)
@given(problem=problems(), workers=st.integers(1, 16), cr=costs)
def test_model_inequalities(problem, workers, cr) -> None:
    c, r = cr
    naive = build_schedule(problem, "naive", workers)
    atomic = build_schedule(problem, "atomic", workers)  # same placement and visits, no waits
    for model in ("sync", "async"):
        assert critical_path(atomic, model, c, r).length <= critical_path(naive, model, c, r).length
    for name in NAMES:
        s = build_schedule(problem, name, workers)
        sync = critical_path(s, "sync", c, r).length
        # async only removes constraints: every async edge is implied by a sync path
        assert critical_path(s, "async", c, r).length <= sync + 1e-9
        # partial weights never exceed a full tile
        assert critical_path(s, "sync", c, r, partial=True).length <= sync + 1e-9


@settings(max_examples=60, deadline=None)
@given(problem=problems(masks=("full",)), workers=st.integers(1, 24), cr=costs,
       model=st.sampled_from(["sync", "async"]))
def test_shift_never_exceeds_naive_on_full_masks(problem, workers, cr, model) -> None:
    # idealized model (every tile costs c); assumption: every wave fits in the Q tiles
    p = problem
    if min(workers, p.n_kv) > p.n_q:
        workers = max(1, p.n_q)  # make the wave fit rather than discard the example
    c, r = cr
    shift = simulate(build_schedule(p, "shift", workers), model, c, r).makespan
    naive = simulate(build_schedule(p, "naive", workers), model, c, r).makespan
    assert shift <= naive + 1e-9


def test_shift_can_lose_when_a_wave_exceeds_the_q_tiles() -> None:
    # the assumption above is needed: n_q = 2 < wave of up to 4 chains
    p = Problem(1, 2, 2, 32, 64, 64, "full", 16, 16)
    assert makespans(p, "naive", 7, 1.0, 2.0) == (12.0, 12.0)
    assert makespans(p, "shift", 7, 1.0, 2.0) == (13.0, 13.0)


# ---------------------------------------------------------------------------------------
# DAG structure
# ---------------------------------------------------------------------------------------
def test_dag_edges_sync_and_async() -> None:
    p = square(2, 1, "full")
    s = build_schedule(p, "naive", 1)  # one worker: (j=0: i=0,1), (j=1: i=0,1)
    sync = build_dag(s, "sync", 2.0, 1.0)
    a = build_dag(s, "async", 2.0, 1.0)
    n = sync.node
    order = [(0, 0), (1, 0), (0, 1), (1, 1)]  # (i, j) in program order
    for d in (sync, a):
        assert len(d) == 8
        for i, j in order:
            assert n(REDUCE, 0, 0, i, j) in d.succ[n(COMPUTE, 0, 0, i, j)]
        for i in (0, 1):  # dQ order j ascending
            assert n(REDUCE, 0, 0, i, 1) in d.succ[n(REDUCE, 0, 0, i, 0)]
    for (i0, j0), (i1, j1) in itertools.pairwise(order):
        assert n(COMPUTE, 0, 0, i1, j1) in sync.succ[n(REDUCE, 0, 0, i0, j0)]
        assert n(COMPUTE, 0, 0, i1, j1) in a.succ[n(COMPUTE, 0, 0, i0, j0)]
        assert n(REDUCE, 0, 0, i1, j1) in a.succ[n(REDUCE, 0, 0, i0, j0)]
        assert n(COMPUTE, 0, 0, i1, j1) not in a.succ[n(REDUCE, 0, 0, i0, j0)]
    assert sync.num_edges == 4 + 3 + 2
    assert a.num_edges == 4 + 6 + 2
    assert sync.critical_path().length == 4 * 3.0
    assert a.critical_path().length == 4 * 2.0 + 1.0


def test_atomic_has_no_dq_edges() -> None:
    s = build_schedule(square(3, 1, "full"), "atomic", 3)
    d = build_dag(s, "sync", 1.0, 1.0)
    assert all(d.tasks[u].worker == d.tasks[v].worker for u, outs in enumerate(d.succ)
               for v in outs)
    assert d.critical_path().length == 3 * 2.0


def test_partial_weights_of_diagonal_tiles() -> None:
    bm = 16
    p = square(3, 1, "causal", bm=bm)
    d = build_dag(build_schedule(p, "naive", 3), "sync", 4.0, 1.0, partial=True)
    for t in d.tasks:
        if t.kind == COMPUTE:
            # diagonal tile of a square causal mask: BM (BM + 1) / 2 unmasked of BM^2
            want = 4.0 * (bm + 1) / (2 * bm) if t.i == t.j else 4.0
            assert t.weight == pytest.approx(want)
        else:
            assert t.weight == 1.0
    ragged = Problem(1, 1, 1, 24, 24, 64, "full", 16, 16)  # last row and column half-full
    d = build_dag(build_schedule(ragged, "naive", 2), "sync", 1.0, 0.0, partial=True)
    w = {(t.i, t.j): t.weight for t in d.tasks if t.kind == COMPUTE}
    assert w == {(0, 0): 1.0, (0, 1): 0.5, (1, 0): 0.5, (1, 1): 0.25}


def _cyclic_schedule():
    s = build_schedule(square(2, 1, "full"), "naive", 2)
    return dataclasses.replace(
        s,
        workers=((Chain(0, 0, 0, (0, 1)),), (Chain(0, 0, 1, (1, 0)),)),
        dq_orders={(0, 0, 0): (1, 0), (0, 0, 1): (0, 1)},
    )


def test_deadlock_is_detected_by_both() -> None:
    bad = _cyclic_schedule()
    with pytest.raises(ScheduleError, match="cycle"):
        build_dag(bad).critical_path()
    with pytest.raises(ScheduleError, match="deadlocked: 2 workers blocked"):
        simulate(bad)


def test_unknown_model_rejected() -> None:
    s = build_schedule(square(2, 1, "full"), "naive", 2)
    with pytest.raises(ValueError, match="model"):
        build_dag(s, "overlap")
    with pytest.raises(ValueError, match="model"):
        simulate(s, "overlap")


def test_build_is_fast_at_realistic_size() -> None:
    p = Problem(1, 32, 32, 32 * 128, 32 * 128, 128, "full", 128, 128)  # 32k visits
    s = build_schedule(p, "shift", 132)
    t0 = time.perf_counter()
    d = build_dag(s, "sync", 1.0, 0.5)
    cp = d.critical_path()
    elapsed = time.perf_counter() - t0
    assert len(d) == 2 * 32 * 32 * 32
    assert elapsed < 3.0, f"building and solving the DAG took {elapsed:.2f}s"
    # 1024 chains of 32 visits round-robin on 132 workers: 8 rounds, no waits
    assert cp.length == 8 * 32 * 1.5


# ---------------------------------------------------------------------------------------
# the lemma
# ---------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(weights=st.lists(st.integers(0, 5), min_size=1, max_size=6), copies=st.integers(2, 4),
       data=st.data())
def test_lemma_on_parallel_isomorphic_chains(weights, copies, data) -> None:
    dag = parallel_chains([float(w) for w in weights], copies)
    L = len(weights)
    pairs = [(u, v) for u, v in itertools.product(range(len(dag)), repeat=2) if u // L != v // L]
    for u, v in data.draw(st.lists(st.sampled_from(pairs), min_size=1, max_size=12)):
        # depth(u): end of u = sum of weights up to and including u on its chain;
        # depth(v): start of v = sum of weights before v on its chain
        depth_u = sum(weights[: u % L + 1])
        depth_v = sum(weights[: v % L])
        assert depth_condition(dag, u, v) == (depth_u <= depth_v)
        assert edge_keeps_critical_path(dag, u, v) == (depth_u <= depth_v)


def test_lemma_explains_shift_versus_naive() -> None:
    # Without dQ edges, n workers of a full-mask problem are parallel isomorphic chains
    # (c, r, c, r, ...). Shift's dQ edges all satisfy the lemma, so the critical path stays
    # m n (c + r); naive has edges that violate it (a reduce waiting on a reduce that ends
    # later than it could start), so it grows.
    n, m, c, r = 4, 2, 2.0, 1.0
    p = square(n, m, "full")
    for name, all_keep in (("shift", True), ("naive", False)):
        s = build_schedule(p, name, n)
        chains = build_dag(s, "sync", c, r, dq_edges=False)
        full = build_dag(s, "sync", c, r)
        base = chains.critical_path().length
        assert base == m * n * (c + r)
        dq_edges = [(u, v) for u, outs in enumerate(full.succ) for v in outs
                    if full.tasks[u].worker != full.tasks[v].worker]
        assert dq_edges
        ok = [depth_condition(chains, u, v) for u, v in dq_edges]
        assert all(ok) == all_keep
        for (u, v), keeps in zip(dq_edges, ok, strict=True):
            assert edge_keeps_critical_path(chains, u, v) == keeps
        assert (full.critical_path().length == base) == all_keep


# ---------------------------------------------------------------------------------------
# Gantt chart and text timeline
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["sync", "async"])
@pytest.mark.parametrize("width", [1, 17, 80])
def test_text_timeline_width(model: str, width: int) -> None:
    p = square(4, 2, "causal")
    res = simulate(build_schedule(p, "descending", 4), model, 1.0, 0.5)
    text = text_timeline(res, width=width)
    rows = [line for line in text.splitlines() if line.startswith("w")]
    assert len(rows) == (4 if model == "sync" else 8)
    for line in rows:
        bar = line[line.index("|") + 1:]
        assert bar.endswith("|") and len(bar) == width + 1
        assert set(bar[:-1]) <= set("#=~.")
    if width >= 17:
        assert any("#" in line for line in rows) and any("=" in line for line in rows)
    if model == "sync" and width == 80:
        assert any("~" in line for line in rows)  # descending waits on dQ semaphores


def test_text_timeline_shows_a_known_schedule() -> None:
    # one worker, 2 visits of c = 3, r = 1: "###=###=" at one column per time unit
    p = Problem(1, 1, 1, 32, 16, 64, "full", 16, 16)
    res = simulate(build_schedule(p, "naive", 1), "sync", 3.0, 1.0)
    row = next(line for line in text_timeline(res, width=8).splitlines() if line.startswith("w0"))
    assert row.endswith("|###=###=|")


def test_text_timeline_truncates_workers() -> None:
    res = simulate(build_schedule(square(4, 1, "full"), "naive", 40), "sync", 1.0, 1.0)
    text = text_timeline(res, width=10, max_workers=5)
    assert sum(line.startswith("w") for line in text.splitlines()) == 5
    assert "35 more workers" in text


def test_gantt_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    p = square(4, 2, "causal")
    results, crit = [], []
    for name in ("descending", "symmetric_shift"):
        s = build_schedule(p, name, 4)
        results.append(simulate(s, "sync", 1.0, 0.5))
        dag = build_dag(s, "sync", 1.0, 0.5)
        crit.append(dag.path_keys(dag.critical_path()))
    out = tmp_path / "gantt.png"
    save_gantt(results, out, critical=crit)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    single = tmp_path / "one.png"
    save_gantt(simulate(build_schedule(p, "naive", 4), "async", 1.0, 0.5), single)
    assert single.read_bytes()[:4] == b"\x89PNG"


def test_empty_problem() -> None:
    p = Problem(1, 1, 1, 0, 32, 64, "full", 16, 16)
    for name in NAMES:
        s = build_schedule(p, name, 3)
        assert critical_path(s).length == 0.0
        res = simulate(s)
        assert res.makespan == 0.0 and res.idle_fraction == 0.0
        assert text_timeline(res, width=5).count("|.....|") == 3


def test_random_costs_agree_exactly_enough() -> None:
    rng = random.Random(7)
    for _ in range(5):
        c, r = rng.uniform(0.1, 3.0), rng.uniform(0.0, 3.0)
        for name in NAMES:
            cp, sim = makespans(square(5, 3, "causal"), name, 4, c, r, partial=True)
            assert sim == pytest.approx(cp, rel=1e-12)
