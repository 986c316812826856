"""Packed batches (variable lengths) on the CPU: the problem, its schedules and their model.

A packed :class:`Problem` carries one query and one key length per sequence
(``seqlens_q``, ``seqlens_k``); each sequence is tiled from its own first row and masked
with its own lengths. Every schedule covers it; the portable ones (and ``lpt``) give each
sequence the visit and dQ orders it has alone (packing invariance). A rectangular problem
is unchanged: its schedules, fingerprints, tables, model makespans and emulator bits are
those of the code before packed batches (``tests/data/rectangular_baseline.json``).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_ref import (
    NAMES,
    PORTABLE,
    RAGGED,
    Problem,
    ScheduleError,
    build_schedule,
    critical_path,
    resolve_name,
    simulate,
)
from dash_ref.model.dag import build_dag
from dash_ref.schedules.schedule import GROUP_FILL
from verify.strategies import packed_problems

DATA = Path(__file__).parent / "data" / "rectangular_baseline.json"
EVERY = (*NAMES, *RAGGED)
INVARIANT = (*PORTABLE, *RAGGED)

# a ragged batch with an empty query side, an empty key side, length 1, S_q != S_k both
# ways and lengths off the tile multiples
RAGGED_Q = (37, 0, 1, 64, 20, 90)
RAGGED_K = (50, 9, 1, 64, 0, 33)


def ragged(mask: str = "causal", heads: int = 4, heads_kv: int = 2, bm: int = 16,
           bn: int = 16) -> Problem:
    return Problem.packed(RAGGED_Q, RAGGED_K, heads, heads_kv, 16, mask, bm, bn)


# ---------------------------------------------------------------------------------------
# an independent statement of the rules, for expected values
# ---------------------------------------------------------------------------------------
def sees(mask: str, r: int, c: int, s_q: int, s_k: int) -> bool:
    """docs/design.md section 2: row r sees key c (causal: iff c <= r + S_k - S_q)."""
    return 0 <= r < s_q and 0 <= c < s_k and (mask == "full" or c <= r + s_k - s_q)


def brute_active(mask, s_q, s_k, bm, bn, i, j) -> bool:
    return any(sees(mask, r, c, s_q, s_k) for r in range(i * bm, (i + 1) * bm)
               for c in range(j * bn, (j + 1) * bn))


def brute_pairs(p: Problem) -> set[tuple[int, int, int, int]]:
    """Every active (b, h, i, j) of the batch, from the rule and the lengths alone."""
    out = set()
    lengths = (zip(p.seqlens_q, p.seqlens_k) if p.seqlens_q is not None
               else [(p.seqlen_q, p.seqlen_k)] * p.batch)
    for b, (s_q, s_k) in enumerate(lengths):
        for i in range(math.ceil(s_q / p.block_m)):
            for j in range(math.ceil(s_k / p.block_n)):
                if brute_active(p.mask, s_q, s_k, p.block_m, p.block_n, i, j):
                    out |= {(b, h, i, j) for h in range(p.heads)}
    return out


# ---------------------------------------------------------------------------------------
# the problem
# ---------------------------------------------------------------------------------------
BAD = [
    (dict(seqlens_q=(4, 5)), ValueError, "Problem.seqlens_q was given alone"),
    (dict(seqlens_k=(4, 5)), ValueError, "Problem.seqlens_k was given alone"),
    (dict(seqlens_q=(4, 5, 6), seqlens_k=(4, 5, 6)), ValueError,
     "Problem.seqlens_q has 3 lengths, Problem.batch is 2"),
    (dict(seqlens_q=(4, 6), seqlens_k=(4,)), ValueError,
     "Problem.seqlens_k has 1 lengths, Problem.batch is 2"),
    (dict(seqlens_q=(4, 6), seqlens_k=(6, -1)), ValueError,
     r"Problem.seqlens_k\[1\] must be >= 0, got -1"),
    (dict(seqlens_q=(4, 5.0), seqlens_k=(4, 6)), TypeError,
     r"Problem.seqlens_q\[1\] must be an int"),
    (dict(seqlens_q=(True, 6), seqlens_k=(4, 6)), TypeError,
     r"Problem.seqlens_q\[0\] must be an int"),
    (dict(seqlens_q=6, seqlens_k=(4, 6)), TypeError,
     "Problem.seqlens_q must be a sequence of ints"),
    (dict(seqlens_q="46", seqlens_k=(4, 6)), TypeError, "Problem.seqlens_q must be a sequence"),
    (dict(seqlens_q=(), seqlens_k=()), ValueError, "Problem.seqlens_q must hold at least one"),
    (dict(seqlens_q=(4, 5), seqlens_k=(4, 6)), ValueError,
     r"Problem.seqlen_q \(6\) must be the longest of Problem.seqlens_q \(5\)"),
    (dict(seqlens_q=(4, 6), seqlens_k=(4, 5)), ValueError,
     r"Problem.seqlen_k \(6\) must be the longest of Problem.seqlens_k \(5\)"),
]


@pytest.mark.parametrize("extra, error, says", BAD, ids=[b[2][:40] for b in BAD])
def test_a_bad_packed_problem_is_refused_in_one_line_that_names_the_argument(extra, error, says):
    with pytest.raises(error, match=says) as info:
        Problem(2, 2, 2, 6, 6, 16, "causal", 16, 16, **extra)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("call, error, says", [
    (lambda: Problem.packed((3, 4), (3,), 2, 2, 16), ValueError,
     "Problem.seqlens_k has 1 lengths, Problem.seqlens_q 2"),
    (lambda: Problem.packed([], [], 2, 2, 16), ValueError,
     "Problem.seqlens_q must hold at least one length"),
    (lambda: Problem.packed((3, -4), (3, 4), 2, 2, 16), ValueError,
     r"Problem.seqlens_q\[1\] must be >= 0"),
    (lambda: Problem.packed((3, 4), (3, 4), 3, 2, 16), ValueError,
     r"Problem.heads \(3\) must be a multiple of Problem.heads_kv \(2\)"),
    (lambda: Problem.packed((3, 4), (3, 4), 2, 2, 16, "sliding"), ValueError, "Problem.mask"),
])
def test_the_packed_constructor_refuses_in_one_line_too(call, error, says):
    with pytest.raises(error, match=says) as info:
        call()
    assert "\n" not in str(info.value)


def test_the_packed_constructor_fills_batch_and_maxima_and_keeps_tuples():
    p = Problem.packed([37, 0, 1], np.array([50, 9, 1]), 4, 2, 16, "causal", 16, 32)
    assert (p.batch, p.seqlen_q, p.seqlen_k) == (3, 37, 50)
    assert p.seqlens_q == (37, 0, 1) and p.seqlens_k == (50, 9, 1)
    assert all(type(x) is int for x in p.seqlens_q + p.seqlens_k)
    assert p == Problem(3, 4, 2, 37, 50, 16, "causal", 16, 32, (37, 0, 1), (50, 9, 1))
    assert hash(p) == hash(Problem.packed((37, 0, 1), (50, 9, 1), 4, 2, 16, "causal", 16, 32))
    assert p.is_packed and not Problem(3, 4, 2, 37, 50, 16).is_packed


def test_what_is_one_sequences_on_a_rectangular_problem_is_refused_on_a_packed_one():
    p = ragged()
    for name, instead in (("chain_rows", "chain_rows_of"), ("tile_cols", "tile_cols_of"),
                          ("num_pairs", "num_pairs_of"), ("causal_offset", "causal_offset_of")):
        with pytest.raises(ValueError, match=f"Problem.{name} is one sequence's.*{instead}"):
            getattr(p, name)
    with pytest.raises(IndexError, match="b=6"):
        p.seqlen_q_of(6)
    with pytest.raises(IndexError, match="b=-1"):
        p.n_kv_of(-1)
    assert not p.active(0, 0, 6)


@settings(max_examples=40, deadline=None)
@given(p=packed_problems(max_elements=200_000, max_len=300))
def test_per_sequence_views_follow_the_rule_with_each_sequences_own_lengths(p):
    bm, bn, H = p.block_m, p.block_n, p.heads
    counter = 0
    for b, (s_q, s_k) in enumerate(zip(p.seqlens_q, p.seqlens_k)):
        assert (p.seqlen_q_of(b), p.seqlen_k_of(b)) == (s_q, s_k)
        n_q, n_kv = math.ceil(s_q / bm), math.ceil(s_k / bn)
        assert (p.n_q_of(b), p.n_kv_of(b)) == (n_q, n_kv)
        assert p.causal_offset_of(b) == s_k - s_q
        assert p.sequence(b) == Problem(1, H, p.heads_kv, s_q, s_k, p.head_dim, p.mask, bm, bn)
        for i in range(n_q):
            assert p.rows(i, b) == range(i * bm, min(i * bm + bm, s_q))
        for j in range(n_kv):
            assert p.cols(j, b) == range(j * bn, min(j * bn + bn, s_k))
        active = {(i, j) for i in range(n_q + 1) for j in range(n_kv + 1)
                  if brute_active(p.mask, s_q, s_k, bm, bn, i, j)}
        assert {(i, j) for i in range(n_q + 1) for j in range(n_kv + 1)
                if p.active(i, j, b)} == active
        assert p.chain_rows_of(b) == tuple(
            tuple(i for i in range(n_q) if (i, j) in active) for j in range(n_kv))
        assert p.tile_cols_of(b) == tuple(
            tuple(j for j in range(n_kv) if (i, j) in active) for i in range(n_q))
        assert p.num_pairs_of(b) == len(active)
        assert p.q_tile_base(b) == counter
        for h in range(H):
            for i in range(n_q):
                assert p.q_tile_index(b, h, i) == counter
                counter += 1
    assert p.num_q_tiles == counter == p.q_tile_base(p.batch)
    assert p.num_visits == len(brute_pairs(p))
    starts = [sum(p.seqlens_q[:b]) for b in range(p.batch + 1)]
    assert p.cu_seqlens_q == tuple(starts) and p.total_q == sum(p.seqlens_q)
    assert p.cu_seqlens_k == tuple(sum(p.seqlens_k[:b]) for b in range(p.batch + 1))
    assert p.flops_forward() == sum(p.sequence(b).flops_forward() for b in range(p.batch))


@pytest.mark.parametrize("shape", [(2, 3, 1, 37, 70, 16, "causal", 16, 32),
                                   (3, 2, 2, 64, 64, 16, "full", 16, 16)])
def test_a_rectangular_problem_views_every_sequence_alike(shape):
    p = Problem(*shape)
    assert p.seqlens_q is None and p.seqlens_k is None and not p.is_packed
    for b in range(p.batch):
        assert (p.seqlen_q_of(b), p.seqlen_k_of(b)) == (p.seqlen_q, p.seqlen_k)
        assert (p.n_q_of(b), p.n_kv_of(b)) == (p.n_q, p.n_kv)
        assert p.chain_rows_of(b) == p.chain_rows and p.tile_cols_of(b) == p.tile_cols
        assert p.rows(1, b) == p.rows(1) and p.cols(1, b) == p.cols(1)
        for h, i in itertools.product(range(p.heads), range(p.n_q)):
            assert p.q_tile_index(b, h, i) == (b * p.heads + h) * p.n_q + i
    assert p.num_q_tiles == p.batch * p.heads * p.n_q
    assert p.cu_seqlens_q == tuple(b * p.seqlen_q for b in range(p.batch + 1))


# ---------------------------------------------------------------------------------------
# rectangular problems are unchanged
# ---------------------------------------------------------------------------------------
def test_rectangular_problems_give_what_the_code_before_packed_batches_gave():
    """Schedules (every name, several worker counts), fingerprints, the six kernel tables,
    describe(), DAG and simulator makespans, and emulator bits in every arithmetic: hashes
    written by the code of the commit named in the file (see rectangular_baseline.py)."""
    from rectangular_baseline import measure

    want = json.loads(DATA.read_text())
    got = measure()
    assert got["problems"] == want["problems"]
    assert set(got["schedules"]) == set(want["schedules"])
    for key, entry in want["schedules"].items():
        assert got["schedules"][key] == entry, key
    for key, entry in want["emulated"].items():
        assert got["emulated"][key] == entry, key


def test_the_extra_table_q_tile_base_is_filled_for_rectangular_problems_too():
    p = Problem(3, 2, 2, 70, 40, 16, "causal", 16, 16)
    t = build_schedule(p, "naive", 4).to_tables()
    assert t.q_tile_base.dtype == np.int32
    assert t.q_tile_base.tolist() == [b * 2 * 5 for b in range(4)]
    assert "q_tile_base" not in t.as_dict() and "q_tile_base" in t.as_dict(extra=True)
    assert t.nbytes(extra=True) == t.nbytes() + 4 * 4


# ---------------------------------------------------------------------------------------
# schedules on packed problems
# ---------------------------------------------------------------------------------------
def check_tables(s) -> None:
    """The kernel tables of ``s``, against its chains and dQ orders, with dQ tiles numbered
    sequence by sequence (docs/design.md section 2)."""
    p = s.problem
    t = s.to_tables()
    chains = [c for _, c in s.chains()]
    assert t.chain_bhj.tolist() == [[c.b, c.h, c.j] for c in chains]
    assert t.visit_q.tolist() == [i for c in chains for i in c.visits]
    number = {}
    for b in range(p.batch):
        for h in range(p.heads):
            for i in range(p.n_q_of(b)):
                number[(b, h, i)] = len(number)
    assert t.dq_count.shape == (len(number),)
    assert t.q_tile_base.tolist() == [
        sum(p.heads * math.ceil(x / p.block_m) for x in p.seqlens_q[:b])
        for b in range(p.batch + 1)]
    k = 0
    for c in chains:
        for i in c.visits:
            order = s.dq_orders[(c.b, c.h, i)]
            if order is None:
                assert t.visit_rank[k] == -1
            else:
                assert order[t.visit_rank[k]] == c.j
            k += 1
    for key, n in number.items():
        order = s.dq_orders[key]
        want = len(p.tile_cols_of(key[0])[key[2]]) if order is None else len(order)
        assert t.dq_count[n] == want


@settings(max_examples=25, deadline=None)
@given(p=packed_problems(max_elements=200_000, max_len=300), workers=st.integers(1, 20))
def test_every_schedule_covers_a_packed_problem_validly(p, workers):
    pairs = brute_pairs(p)
    for name in EVERY:
        s = build_schedule(p, name, workers).validate()
        visited = [(c.b, c.h, i, c.j) for _, c in s.chains() for i in c.visits]
        assert sorted(visited) == sorted(pairs), name
        assert {(c.b, c.h, c.j) for _, c in s.chains()} == {
            (b, h, j) for b in range(p.batch) for h in range(p.heads)
            for j in range(math.ceil(p.seqlens_k[b] / p.block_n))}
        tiles = {(b, h, i) for b in range(p.batch) for h in range(p.heads)
                 for i in range(math.ceil(p.seqlens_q[b] / p.block_m))}
        assert set(s.dq_orders) == tiles
        check_tables(s)
        assert "packed: seqlens_q=" in s.describe()


def test_a_schedule_that_breaks_a_packed_rule_is_refused_by_name():
    import dataclasses

    from dash_ref import Chain

    p = ragged()
    s = build_schedule(p, "naive", 3)
    workers = [list(w) for w in s.workers]
    c = workers[0][0]
    # a visit past the end of the chain's own sequence (b=0 has 3 Q tiles, b=5 has 6)
    assert c.b == 0
    workers[0][0] = Chain(c.b, c.h, c.j, (*c.visits, 5))
    broken = dataclasses.replace(s, workers=tuple(tuple(w) for w in workers))
    with pytest.raises(ScheduleError, match=r"visits tile \(i=5, j=0\), which is masked or out"):
        broken.validate()
    # a chain of a KV tile the sequence does not have (b=4 has no keys)
    workers = [list(w) for w in s.workers]
    workers[0].append(Chain(4, 0, 0, ()))
    broken = dataclasses.replace(s, workers=tuple(tuple(w) for w in workers))
    with pytest.raises(ScheduleError, match=r"chain \(b=4, h=0, j=0\) is outside the problem"):
        broken.validate()


def test_a_packed_fingerprint_names_the_lengths():
    a = build_schedule(ragged(), "naive", 4).fingerprint()
    moved = Problem.packed(RAGGED_Q[::-1], RAGGED_K[::-1], 4, 2, 16, "causal", 16, 16)
    assert build_schedule(moved, "naive", 4).fingerprint() != a
    # the same maxima, the same batch, other lengths
    other = Problem.packed((37, 1, 0, 64, 20, 90), RAGGED_K, 4, 2, 16, "causal", 16, 16)
    assert build_schedule(other, "naive", 4).fingerprint() != a


# ---------------------------------------------------------------------------------------
# packing invariance
# ---------------------------------------------------------------------------------------
def assert_sequence_orders_are_its_own(s, name, workers):
    """Chain (b, h, j) and tile (b, h, i) of ``s`` have the orders of chain (0, h, j) and
    tile (0, h, i) of the sequence built alone."""
    p = s.problem
    for b in range(p.batch):
        alone = build_schedule(p.sequence(b), name, workers)
        for h in range(p.heads):
            for j in range(p.n_kv_of(b)):
                assert s.chain(b, h, j).visits == alone.chain(0, h, j).visits, (name, b, h, j)
            for i in range(p.n_q_of(b)):
                assert s.dq_order(b, h, i) == alone.dq_order(0, h, i), (name, b, h, i)


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("name", INVARIANT)
def test_a_portable_schedule_gives_each_sequence_the_orders_it_has_alone(name, mask):
    p = ragged(mask, bm=16, bn=32)
    prints = set()
    for workers in (1, 3, 7, 66, 132):
        s = build_schedule(p, name, workers).validate()
        assert_sequence_orders_are_its_own(s, name, workers)
        prints.add(s.fingerprint())
    assert len(prints) == 1  # portable: one fingerprint for every worker count


@settings(max_examples=15, deadline=None)
@given(p=packed_problems(max_elements=200_000, max_len=300), workers=st.integers(1, 40),
       name=st.sampled_from(INVARIANT), data=st.data())
def test_permuting_and_repacking_the_sequences_moves_their_orders_with_them(p, workers, name,
                                                                            data):
    order = data.draw(st.permutations(range(p.batch)))
    moved = Problem.packed([p.seqlens_q[b] for b in order], [p.seqlens_k[b] for b in order],
                           p.heads, p.heads_kv, p.head_dim, p.mask, p.block_m, p.block_n)
    a, b_ = build_schedule(p, name, workers), build_schedule(moved, name, workers)
    assert_sequence_orders_are_its_own(b_, name, workers)
    for new, old in enumerate(order):
        for h in range(p.heads):
            for j in range(p.n_kv_of(old)):
                assert b_.chain(new, h, j).visits == a.chain(old, h, j).visits
            for i in range(p.n_q_of(old)):
                assert b_.dq_order(new, h, i) == a.dq_order(old, h, i)


# ---------------------------------------------------------------------------------------
# lpt
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_lpt_is_deadlock_free_on_every_worker_count_up_to_an_h200(mask):
    p = ragged(mask, heads=2, heads_kv=1, bm=16, bn=32)
    for workers in range(1, 133):
        s = build_schedule(p, "lpt", workers).validate()  # raises on a possible deadlock
        simulate(s, "sync", 1.0, 0.5, handoff_latency=0.25)  # and the simulator finishes


def launch_groups(s) -> dict[tuple[int, int], int]:
    """An independent statement of the head groups (``GROUP_FILL``'s comment): the heads by
    visits, descending, ties by ``(b, h)``; a group closes at ``GROUP_FILL * W`` chains."""
    p = s.problem
    heads = [(b, h) for b in range(p.batch) for h in range(p.heads)]
    visits = {bh: sum(len(c.visits) for _, c in s.chains() if (c.b, c.h) == bh)
              for bh in heads}
    out, group, chains = {}, 0, 0
    for bh in sorted(heads, key=lambda bh: (-visits[bh], bh)):
        out[bh] = group
        chains += sum(1 for _, c in s.chains() if (c.b, c.h) == bh)
        if chains >= GROUP_FILL * s.num_workers:
            group, chains = group + 1, 0
    return out


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_lpt_launches_head_group_by_group_longest_chains_first_in_descendings_orders(mask):
    p = Problem.packed(RAGGED_Q * 3, RAGGED_K * 3, 4, 2, 16, mask, 16, 16)
    s = build_schedule(p, "lpt", 3)
    groups = launch_groups(s)
    assert 1 < len(set(groups.values())) < p.batch * p.heads  # groups of several heads
    for chains in s.workers:  # greedy placement keeps the launch order on every worker
        keys = [(groups[c.b, c.h], -len(c.visits)) for c in chains]
        assert keys == sorted(keys)
    first = [c for c in (w[0] for w in s.workers)]
    longest = max(len(c.visits) for _, c in s.chains())
    assert all(groups[c.b, c.h] == 0 for c in first) and len(first[0].visits) == longest
    for _, c in s.chains():
        assert list(c.visits) == sorted(c.visits, reverse=True)
    d = build_schedule(p, "descending", 3)
    assert s.fingerprint() == d.fingerprint() and s.dq_orders == d.dq_orders  # the bits
    assert resolve_name("lpt", p, portable=True) == "lpt"


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_in_one_head_group_lpt_is_placed_as_interleaved(mask):
    p = Problem(2, 3, 3, 96, 128, 16, mask, 16, 32)  # 24 chains: one group on 7 workers
    lpt, inter = build_schedule(p, "lpt", 7), build_schedule(p, "interleaved", 7)
    assert set(launch_groups(lpt).values()) == {0}
    assert [[(c.b, c.h, c.j) for c in w] for w in lpt.workers] == [
        [(c.b, c.h, c.j) for c in w] for w in inter.workers]


def test_lpt_is_not_yet_among_the_names_the_kernels_enumerate():
    assert "lpt" in RAGGED and "lpt" not in NAMES and "lpt" not in PORTABLE
    with pytest.raises(ValueError, match="choose from 'auto', atomic, .*, lpt"):
        resolve_name("bogus", ragged())


# ---------------------------------------------------------------------------------------
# the DAG model and the simulator
# ---------------------------------------------------------------------------------------
costs = st.tuples(st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.0, 0.25, 1.0, 2.5]))


@settings(max_examples=20, deadline=None)
@given(p=packed_problems(max_elements=200_000, max_len=300), workers=st.integers(1, 16),
       cr=costs, partial=st.booleans())
def test_the_simulator_and_the_critical_path_agree_on_packed_problems(p, workers, cr, partial):
    c, r = cr
    for name in EVERY:
        s = build_schedule(p, name, workers)
        for model in ("sync", "async"):
            dag = build_dag(s, model, c, r, partial)
            cp = dag.critical_path()
            assert simulate(s, model, c, r, partial).makespan == pytest.approx(
                cp.length, abs=1e-9), (name, model)
            for u, v in itertools.pairwise(cp.nodes):
                assert v in dag.succ[u]
        staged = critical_path(s, "async", c, r, staging=2).length
        assert simulate(s, "async", c, r, staging=2).makespan == pytest.approx(staged, abs=1e-9)


def test_partial_weights_are_each_sequences_own_fractions():
    p = ragged("causal")
    s = build_schedule(p, "naive", 3)
    dag = build_dag(s, "sync", 1.0, 0.0, partial=True)
    for t in dag.tasks:
        if t.kind != "compute":
            continue
        s_q, s_k = p.seqlens_q[t.b], p.seqlens_k[t.b]
        seen = sum(sees("causal", r, col, s_q, s_k) for r in range(t.i * 16, t.i * 16 + 16)
                   for col in range(t.j * 16, t.j * 16 + 16))
        assert t.weight == seen / 256
