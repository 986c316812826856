"""Specification tests for schedules (docs/design.md sections 2-3): validity, orders, tables."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dash_ref.schedules.schedule as sched
from dash_ref import NAMES, Chain, Problem, ScheduleError, build_schedule

# ---------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------


@st.composite
def problems(draw, masks=("full", "causal"), min_tiles: int = 1) -> Problem:
    """Small problems: S = 1, S not a multiple of the tile, S_q != S_k, GQA, MQA.

    ``min_tiles`` bounds ``n_q`` and ``n_kv`` from below.
    """
    bm = draw(st.sampled_from([16, 32]))
    bn = draw(st.sampled_from([16, 32]))
    lo_q, lo_k = (min_tiles - 1) * bm + 1, (min_tiles - 1) * bn + 1
    heads_kv = draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    return Problem(
        batch=draw(st.integers(1, 2)),
        heads=heads_kv * group,
        heads_kv=heads_kv,
        seqlen_q=draw(st.one_of(st.just(lo_q), st.integers(lo_q, 7 * bm))),
        seqlen_k=draw(st.one_of(st.just(lo_k), st.integers(lo_k, 7 * bn))),
        head_dim=64,
        mask=draw(st.sampled_from(masks)),
        block_m=bm,
        block_n=bn,
    )


def square(n: int, m: int, mask: str, bm: int = 16, batch: int = 1) -> Problem:
    return Problem(batch, m, m, n * bm, n * bm, 64, mask, bm, bm)


EDGE_CASES = [
    Problem(1, 1, 1, 1, 1, 64, "causal", 16, 16),        # S = 1
    Problem(1, 2, 1, 17, 17, 64, "causal", 16, 16),      # S not a multiple of the tile, GQA
    Problem(1, 1, 1, 40, 100, 64, "causal", 16, 16),     # S_q < S_k
    Problem(1, 1, 1, 100, 40, 64, "causal", 16, 16),     # S_q > S_k: rows that see no key
    Problem(2, 4, 1, 33, 81, 64, "full", 32, 16),        # MQA, odd n_kv, ragged both
    Problem(1, 3, 3, 16, 160, 64, "full", 16, 16),       # n_q = 1, much smaller than a wave
    Problem(1, 2, 2, 0, 48, 64, "full", 16, 16),         # S_q = 0
]


# ---------------------------------------------------------------------------------------
# validity of every built schedule
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("problem", EDGE_CASES, ids=lambda p: f"{p.seqlen_q}x{p.seqlen_k}")
@pytest.mark.parametrize("workers", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("name", NAMES)
def test_edge_cases_are_valid(problem: Problem, workers: int, name: str) -> None:
    s = build_schedule(problem, name, workers)
    assert s.validate() is s
    # atomic has no fixed order, unless there is nothing to add (S_q = 0: no dQ tile)
    assert s.deterministic == (name != "atomic" or problem.n_q == 0)


@settings(max_examples=40, deadline=None)
@given(problem=problems(), workers=st.integers(1, 24))
def test_drawn_shapes_are_valid(problem: Problem, workers: int) -> None:
    for name in NAMES:
        s = build_schedule(problem, name, workers).validate()
        # coverage recomputed here from the mask definition, independent of Problem.active
        p = problem
        visited = sorted((c.b, c.h, i, c.j) for _, c in s.chains() for i in c.visits)
        expected = sorted(
            (b, h, i, j)
            for b, h, i, j in itertools.product(range(p.batch), range(p.heads),
                                                range(p.n_q), range(p.n_kv))
            if _active(p, i, j)
        )
        assert visited == expected, name
        assert len(s.workers) == workers


def _active(p: Problem, i: int, j: int) -> bool:
    """Any unmasked element in tile pair (i, j), by brute force over elements."""
    rows = range(i * p.block_m, min((i + 1) * p.block_m, p.seqlen_q))
    cols = range(j * p.block_n, min((j + 1) * p.block_n, p.seqlen_k))
    if p.mask == "full":
        return bool(rows) and bool(cols)
    return any(c <= r + p.seqlen_k - p.seqlen_q for r in rows for c in cols)


# ---------------------------------------------------------------------------------------
# validate() rejects broken schedules, naming the offending tile
# ---------------------------------------------------------------------------------------
P4 = square(4, 1, "full")


def _with_workers(s, workers):
    return dataclasses.replace(s, workers=tuple(tuple(w) for w in workers))


def test_rejects_missing_pair() -> None:
    s = build_schedule(P4, "naive", 4)
    workers = [list(w) for w in s.workers]
    c = workers[2][0]
    workers[2][0] = Chain(c.b, c.h, c.j, c.visits[:-1])  # drop the visit of i = 3
    with pytest.raises(ScheduleError, match=r"tile \(b=0, h=0, i=3, j=2\) is active but never"):
        _with_workers(s, workers).validate()


def test_rejects_duplicate_visit() -> None:
    s = build_schedule(P4, "naive", 4)
    workers = [list(w) for w in s.workers]
    c = workers[1][0]
    workers[1][0] = Chain(c.b, c.h, c.j, (*c.visits, 2))
    with pytest.raises(ScheduleError, match=r"tile \(b=0, h=0, i=2, j=1\) is visited twice"):
        _with_workers(s, workers).validate()


def test_rejects_chain_run_twice() -> None:
    s = build_schedule(P4, "naive", 2)
    workers = [list(w) for w in s.workers]
    workers[1].append(workers[0][0])
    with pytest.raises(ScheduleError, match=r"chain \(b=0, h=0, j=0\) is run twice"):
        _with_workers(s, workers).validate()


def test_rejects_masked_visit() -> None:
    p = square(3, 1, "causal")
    s = build_schedule(p, "naive", 3)
    workers = [list(w) for w in s.workers]
    c = workers[2][0]  # chain j = 2 sees only i = 2
    workers[2][0] = Chain(c.b, c.h, c.j, (0, *c.visits))
    with pytest.raises(ScheduleError, match=r"visits tile \(i=0, j=2\), which is masked"):
        _with_workers(s, workers).validate()


def test_rejects_dq_order_missing_a_partial() -> None:
    s = build_schedule(P4, "naive", 4)
    dq = dict(s.dq_orders)
    dq[(0, 0, 1)] = (0, 1, 3)
    with pytest.raises(ScheduleError, match=r"tile \(b=0, h=0, i=1\).*missing j=\[2\]"):
        dataclasses.replace(s, dq_orders=dq).validate()


def test_rejects_dq_order_with_repeat() -> None:
    s = build_schedule(P4, "naive", 4)
    dq = dict(s.dq_orders)
    dq[(0, 0, 2)] = (0, 1, 1, 2, 3)
    with pytest.raises(ScheduleError, match=r"tile \(b=0, h=0, i=2\).*repeated j=\[1\]"):
        dataclasses.replace(s, dq_orders=dq).validate()


def test_rejects_cyclic_wait_across_workers() -> None:
    # w0 runs chain j=0 over i = 0, 1; w1 runs chain j=1 over i = 1, 0. Tile 0 adds j=1
    # first, tile 1 adds j=0 first: each worker's first visit waits on the other's second.
    p = square(2, 1, "full")
    s = build_schedule(p, "naive", 2)
    bad = dataclasses.replace(
        s,
        workers=((Chain(0, 0, 0, (0, 1)),), (Chain(0, 0, 1, (1, 0)),)),
        dq_orders={(0, 0, 0): (1, 0), (0, 0, 1): (0, 1)},
    )
    with pytest.raises(ScheduleError, match=r"deadlock.*\(b=0,h=0,i=[01],j=[01]\)"):
        bad.validate()


def test_rejects_wait_on_own_later_work() -> None:
    # One worker runs chain j=0 then chain j=1, but tile 0 wants j=1's partial first.
    p = Problem(1, 1, 1, 16, 32, 64, "full", 16, 16)  # n_q = 1, n_kv = 2
    s = build_schedule(p, "naive", 1)
    bad = dataclasses.replace(s, dq_orders={(0, 0, 0): (1, 0)})
    with pytest.raises(ScheduleError, match=r"cycle of waits through 2 tiles.*i=0,j=[01]"):
        bad.validate()


def test_rejects_order_decided_at_run_time() -> None:
    s = build_schedule(P4, "shift", 4)
    dq = dict(s.dq_orders)
    dq[(0, 0, 2)] = None  # "whatever order the atomics arrive in"
    with pytest.raises(ScheduleError, match=r"dQ tile \(b=0, h=0, i=2\) of deterministic "
                                            r"schedule 'shift' has no fixed order"):
        dataclasses.replace(s, dq_orders=dq).validate()


def test_rejects_builder_whose_output_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def flaky(p: Problem, workers: int):
        calls.append(1)
        s = sched._naive(p, workers)
        if len(calls) % 2:  # every other build reverses one dQ order: a timing-dependent builder
            dq = dict(s.dq_orders)
            dq[(0, 0, 1)] = tuple(reversed(dq[(0, 0, 1)]))
            s = dataclasses.replace(s, dq_orders=dq)
        return s

    monkeypatch.setitem(sched.BUILDERS, "naive", flaky)
    s = sched.BUILDERS["naive"](P4, 4)
    with pytest.raises(ScheduleError, match="not a pure function.*building it again"):
        s.validate()
    assert len(calls) == 2


def test_rejects_wrong_worker_count() -> None:
    s = build_schedule(P4, "naive", 4)
    with pytest.raises(ScheduleError, match="worker lists for num_workers=5"):
        dataclasses.replace(s, num_workers=5).validate()


# ---------------------------------------------------------------------------------------
# fingerprints
# ---------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(problem=problems(), workers=st.integers(1, 20))
def test_fingerprint_stable_across_builds(problem: Problem, workers: int) -> None:
    for name in NAMES:
        a = sched.BUILDERS[name](problem, workers)  # uncached: two independent builds
        b = sched.BUILDERS[name](problem, workers)
        assert a is not b
        assert a.fingerprint() == b.fingerprint()
        assert a.workers == b.workers and a.dq_orders == b.dq_orders
    assert sched.BUILDERS["atomic"](problem, workers).fingerprint() == "nondeterministic"


@settings(max_examples=30, deadline=None)
@given(problem=problems(masks=("full",), min_tiles=2), workers=st.integers(2, 20))
def test_fingerprint_tells_naive_from_shift(problem: Problem, workers: int) -> None:
    # With one Q tile, or one worker, shift rotates nothing and adds dQ in naive's order:
    # equal fingerprints are then correct (same bits). Otherwise the orders differ.
    assert problem.n_kv >= 2 and problem.n_q >= 2
    naive = build_schedule(problem, "naive", workers)
    shift = build_schedule(problem, "shift", workers)
    assert naive.fingerprint() != shift.fingerprint()


def test_fingerprint_same_when_orders_agree() -> None:
    p = Problem(1, 2, 2, 16, 64, 64, "full", 16, 16)  # n_q = 1
    naive, shift = build_schedule(p, "naive", 4), build_schedule(p, "shift", 4)
    assert naive.fingerprint() == shift.fingerprint()


def test_fingerprint_ignores_placement_but_not_shape() -> None:
    p = square(4, 2, "causal")
    a = build_schedule(p, "descending", 3)
    b = build_schedule(p, "descending", 5)  # greedy placement differs, orders do not
    assert a.workers != b.workers
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != build_schedule(square(4, 2, "full"), "descending", 3).fingerprint()


# ---------------------------------------------------------------------------------------
# kernel tables
# ---------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(problem=problems(), workers=st.integers(1, 20), name=st.sampled_from(NAMES))
def test_tables_layout(problem: Problem, workers: int, name: str) -> None:
    p = problem
    s = build_schedule(p, name, workers)
    t = s.to_tables()
    arrays = t.as_dict()
    assert all(a.dtype == np.int32 for a in arrays.values())
    chains = [c for _, c in s.chains()]
    C, V, T = len(chains), sum(len(c.visits) for c in chains), p.batch * p.heads * p.n_q
    assert p.batch * p.heads * p.num_pairs == V
    # offsets
    assert t.worker_offsets.shape == (workers + 1,)
    assert t.worker_offsets[0] == 0 and t.worker_offsets[-1] == C
    assert np.all(np.diff(t.worker_offsets) == [len(w) for w in s.workers])
    assert t.chain_bhj.shape == (C, 3)
    assert t.chain_bhj.tolist() == [[c.b, c.h, c.j] for c in chains]
    assert t.chain_offsets.shape == (C + 1,) and t.chain_offsets[0] == 0
    assert np.all(np.diff(t.chain_offsets) == [len(c.visits) for c in chains])
    assert t.visit_q.tolist() == [i for c in chains for i in c.visits]
    # ranks against the dQ orders
    assert t.dq_count.shape == (T,)
    k = 0
    seen: dict[int, list[int]] = {}
    for c in chains:
        for i in c.visits:
            rank = int(t.visit_rank[k])
            order = s.dq_orders[(c.b, c.h, i)]
            if order is None:
                assert rank == -1
            else:
                assert order[rank] == c.j
            seen.setdefault((c.b * p.heads + c.h) * p.n_q + i, []).append(rank)
            k += 1
    assert k == V
    for tile in range(T):
        ranks = sorted(seen.get(tile, []))
        assert t.dq_count[tile] == len(ranks)
        if name != "atomic":
            assert ranks == list(range(len(ranks)))  # every semaphore value taken once
    # size O(pairs): exactly W + 1 + 3C + C + 1 + 2V + T int32 entries
    assert t.nbytes() == 4 * (workers + 1 + 3 * C + C + 1 + 2 * V + T)


# ---------------------------------------------------------------------------------------
# visit and dQ orders as docs/design.md section 3 defines them
# ---------------------------------------------------------------------------------------
def _rows(p: Problem, j: int) -> list[int]:
    return [i for i in range(p.n_q) if _active(p, i, j)]


def _cols(p: Problem, i: int) -> list[int]:
    return [j for j in range(p.n_kv) if _active(p, i, j)]


@settings(max_examples=30, deadline=None)
@given(problem=problems(), workers=st.integers(1, 20))
def test_greedy_family_orders(problem: Problem, workers: int) -> None:
    p = problem
    for name in ("atomic", "naive", "spt", "descending"):
        s = build_schedule(p, name, workers)
        for _, c in s.chains():
            rows = _rows(p, c.j)
            assert list(c.visits) == (rows[::-1] if name == "descending" else rows), name
        for (_, _, i), order in s.dq_orders.items():
            if name == "atomic":
                assert order is None
            else:
                cols = _cols(p, i)
                assert list(order) == (cols[::-1] if name == "spt" else cols), name
    # launch order: naive/descending start with j = 0, spt with the last KV tile (b, h) = 0
    if p.n_kv:
        assert build_schedule(p, "naive", workers).workers[0][0].j == 0
        assert build_schedule(p, "descending", workers).workers[0][0].j == 0
        assert build_schedule(p, "spt", workers).workers[0][0].j == p.n_kv - 1


def test_greedy_placement_is_list_scheduling() -> None:
    # causal n = 4, two heads, 4 workers: head 0 chain j on worker j (lengths 4 3 2 1);
    # head 1 chain j on the worker free first, n - 1 - j: the zigzag.
    s = build_schedule(square(4, 2, "causal"), "descending", 4)
    assert [[(c.h, c.j) for c in w] for w in s.workers] == [
        [(0, 0), (1, 3)], [(0, 1), (1, 2)], [(0, 2), (1, 1)], [(0, 3), (1, 0)]
    ]


@settings(max_examples=40, deadline=None)
@given(problem=problems(masks=("full",)), workers=st.integers(1, 20))
def test_shift_full_mask_orders(problem: Problem, workers: int) -> None:
    p = problem
    s = build_schedule(p, "shift", workers)
    # launch index k in (b, h, j) order; round k // W; wave = chains of one head in a round
    k_of = {(b, h, j): (b * p.heads + h) * p.n_kv + j
            for b in range(p.batch) for h in range(p.heads) for j in range(p.n_kv)}
    for w, c in s.chains():
        k = k_of[(c.b, c.h, c.j)]
        assert w == k % workers  # round-robin placement
        wave = [j for j in range(p.n_kv) if k_of[(c.b, c.h, j)] // workers == k // workers]
        r = c.j - wave[0]
        assert list(c.visits) == [(r + s_) % p.n_q for s_ in range(p.n_q)]
        assert len(wave) <= workers
    # dQ order: earlier rounds first; within a round by the step the chain visits i
    for (b, h, i), order in s.dq_orders.items():
        keys = []
        for j in order:
            c = s.chain(b, h, j)
            keys.append((k_of[(b, h, j)] // workers, c.visits.index(i), k_of[(b, h, j)]))
        assert keys == sorted(keys)


def test_shift_no_two_chains_share_a_tile_at_a_step() -> None:
    # wave size <= n_q: at each step the chains of a wave touch distinct dQ tiles
    p = Problem(1, 3, 3, 6 * 16, 5 * 16, 64, "full", 16, 16)
    s = build_schedule(p, "shift", 4)
    for w_round in range(3):
        chains = [ch[w_round] for ch in s.workers if len(ch) > w_round]
        for step in range(p.n_q):
            touched = [(c.b, c.h, c.visits[step]) for c in chains]
            assert len(touched) == len(set(touched))


@pytest.mark.parametrize("n", [2, 4, 6, 8])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_symmetric_shift_folds_the_triangle(n: int, m: int) -> None:
    p = square(n, m, "causal")
    s = build_schedule(p, "symmetric_shift", n)
    for chains in s.workers:
        assert len(chains) % 2 == 0
        for long, short in zip(chains[::2], chains[1::2], strict=True):
            assert (long.b, long.h) == (short.b, short.h)
            assert long.j + short.j == n - 1 and long.j < short.j
            assert len(long.visits) + len(short.visits) == n + 1
            assert list(short.visits) == sorted(short.visits, reverse=True)
    # at each step the workers of one round touch distinct dQ tiles of a head
    rounds = -(-m * n // 2 // n)
    for rnd in range(rounds):
        items = [ch[2 * rnd:2 * rnd + 2] for ch in s.workers if len(ch) > 2 * rnd]
        for step in range(n + 1):
            touched = []
            for long, short in items:
                seq = [(long.b, long.h, i) for i in long.visits + short.visits]
                touched.append(seq[step])
            assert len(touched) == len(set(touched))
