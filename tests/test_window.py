"""Sliding windows (FlashAttention's ``window_size=(left, right)``) as a specification.

The rule, written here once and independently of ``dash_ref``: query row ``r`` of a sequence
with ``S_q`` queries and ``S_k`` keys sees key ``c`` iff ``0 <= c < S_k``,
``c >= r + S_k - S_q - left`` (unless ``left == -1``) and ``c <= r + S_k - S_q + right``
(unless ``right == -1``); ``causal=True`` makes ``right`` 0. Every view of ``dash_ref.Mask``
(its keys, element masks, counts, active tiles), the problem's tiles and every schedule
follow it; ``banded`` is deadlock-free and portable on bands and, in the DAG model, waits
for no hand-off; the emulator stays within the float64 and mpmath bounds, and a key no row
sees changes no bit.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_ref import BANDED, NAMES, PORTABLE, RAGGED, Mask, Problem, build_schedule
from dash_ref.emulate import backward, emulate, forward
from dash_ref.model import critical_path, simulate
from dash_ref.schedules.schedule import GROUP_FILL
from verify.highprec import error_bound, reference_grads
from verify.reference import (
    attention_f64,
    attention_f64_packed,
    grad_checks,
    packed_grad_checks,
)
from verify.strategies import window_sizes

EVERY = (*NAMES, *RAGGED, *BANDED)
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def sees(r: int, c: int, s_q: int, s_k: int, left: int, right: int, causal: bool) -> bool:
    """The rule, element by element (module docstring)."""
    if causal:
        right = 0
    diagonal = r + s_k - s_q
    return (0 <= c < s_k and (left == -1 or c >= diagonal - left)
            and (right == -1 or c <= diagonal + right))


def brute(s_q: int, s_k: int, left: int, right: int, causal: bool) -> torch.Tensor:
    return torch.tensor([[sees(r, c, s_q, s_k, left, right, causal) for c in range(s_k)]
                         for r in range(s_q)], dtype=torch.bool).reshape(s_q, s_k)


SHAPES = [(9, 9), (5, 13), (13, 5), (1, 1), (1, 7), (7, 1), (6, 0), (0, 6), (40, 40)]
WINDOWS = [(0, 0), (2, 0), (0, 3), (-1, 2), (3, -1), (4, 4), (1, 6), (50, 50), (0, -1),
           (-1, 0)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s_q, s_k", SHAPES)
def test_every_view_of_the_mask_is_the_rule(s_q, s_k, causal):
    for left, right in WINDOWS:
        m = Mask.of(causal, (left, right))
        want = brute(s_q, s_k, left, right, causal)
        for r in range(s_q):
            assert list(m.keys(r, s_q, s_k)) == [c for c in range(s_k) if want[r, c]]
        assert torch.equal(m.visible(range(s_q), range(s_k), s_q, s_k), want)
        for r0, r1, c0, c1 in itertools.product(range(0, s_q + 1, 3), range(0, s_q + 1, 2),
                                                range(0, s_k + 1, 3), range(0, s_k + 1, 2)):
            if r0 > r1 or c0 > c1:
                continue
            block = want[r0:r1, c0:c1]
            rows, cols = range(r0, r1), range(c0, c1)
            assert m.unmasked(rows, cols, s_q, s_k) == int(block.sum())
            assert m.any_visible(rows, cols, s_q, s_k) == bool(block.any())


@given(window=window_sizes(40, (4, 8)), causal=st.booleans(),
       s_q=st.integers(0, 40), s_k=st.integers(0, 40))
@settings(max_examples=150, deadline=None)
def test_drawn_windows_follow_the_rule(window, causal, s_q, s_k):
    m = Mask.of(causal, window)
    assert torch.equal(m.visible(range(s_q), range(s_k), s_q, s_k),
                       brute(s_q, s_k, *window, causal))


def test_one_value_per_rule_as_flash_attention_reads_the_arguments():
    assert Mask.of(False) == Mask.of(False, (-1, -1)) == Mask("full")
    assert Mask.of(True) == Mask.of(True, (-1, 5)) == Mask.of(False, (-1, 0)) == Mask("causal")
    assert Mask.of(True, (7, 3)) == Mask.of(False, (7, 0)) == Mask("window", 7, 0)
    assert Mask.of(False, (2, -1)) == Mask("window", 2, -1)
    assert Mask("window", 3, 4).window_size == (3, 4)
    assert Mask("causal").window_size == (-1, 0) and Mask("full").window_size == (-1, -1)
    # the problem keeps the same value: right = 0 under causal, and mask reads causal then
    p = Problem(1, 2, 2, 50, 60, 16, "full", 16, 16, window_size=(9, 0))
    assert p == Problem(1, 2, 2, 50, 60, 16, "causal", 16, 16, window_size=(9, 4))
    assert p.mask == "causal" and p.window_size == (9, 0)
    assert Problem(1, 2, 2, 50, 60, 16, "full", window_size=(-1, 0)) == Problem(
        1, 2, 2, 50, 60, 16, "causal")


def test_a_problem_without_a_window_reads_and_hashes_as_before():
    plain = Problem(2, 4, 2, 70, 90, 16, "causal", 16, 16)
    for same in (Problem(2, 4, 2, 70, 90, 16, "causal", 16, 16, window_size=(-1, -1)),
                 Problem(2, 4, 2, 70, 90, 16, "causal", 16, 16, None, None, None, 16)):
        assert same == plain and repr(same) == repr(plain) and "window" not in repr(same)
        assert build_schedule(same, "naive", 5).fingerprint() == build_schedule(
            plain, "naive", 5).fingerprint()
    windowed = Problem(2, 4, 2, 70, 90, 16, "causal", 16, 16, window_size=(30, 0))
    assert "window_size=(30, 0)" in repr(windowed)
    assert build_schedule(windowed, "naive", 5).fingerprint() != build_schedule(
        plain, "naive", 5).fingerprint()


@pytest.mark.parametrize("window, causal", [((10, 0), True), ((5, 5), False), ((-1, 3), False),
                                            ((20, -1), False), ((0, 0), False)])
def test_tiles_pairs_counts_and_flops_follow_the_rule(window, causal):
    s_q, s_k, bm, bn = 75, 61, 16, 8
    p = Problem(2, 3, 1, s_q, s_k, 16, "causal" if causal else "full", bm, bn,
                window_size=window)
    want = brute(s_q, s_k, *window, causal)
    for i, j in itertools.product(range(p.n_q), range(p.n_kv)):
        block = want[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
        assert p.active(i, j) == bool(block.any())
        assert p.unmasked(i, j) == int(block.sum())
    assert p.chain_rows == tuple(tuple(i for i in range(p.n_q)
                                       if want[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn].any())
                                 for j in range(p.n_kv))
    assert p.flops_forward() == 2 * 2 * 3 * (16 + 16) * int(want.sum())


BAD = [
    ((-2, 0), ValueError, r"window_size\[0\] must be >= 0, or -1"),
    ((0, -5), ValueError, r"window_size\[1\] must be >= 0, or -1"),
    ((1.5, 0), TypeError, r"window_size\[0\] must be an int"),
    ((True, 0), TypeError, r"window_size\[0\] must be an int"),
    ((0, False), TypeError, r"window_size\[1\] must be an int"),
    ((1, 2, 3), TypeError, "window_size must be a pair"),
    ("ab", TypeError, "window_size must be a pair"),
    (4, TypeError, "window_size must be a pair"),
]


@pytest.mark.parametrize("value, error, says", BAD)
def test_bad_windows_are_refused_in_one_line_naming_the_argument(value, error, says):
    q = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    for call, named in ((lambda: Mask.of(False, value), "window_size"),
                        (lambda: Problem(1, 1, 1, 8, 8, 8, window_size=value),
                         "Problem.window_size"),
                        (lambda: forward(q, q, q, window_size=value), "window_size")):
        with pytest.raises(error, match=says) as caught:
            call()
        assert "\n" not in str(caught.value) and str(caught.value).startswith(named)


@pytest.mark.parametrize("make, says", [
    (lambda: Mask("window", -1, -1), "is Mask\\('full'\\)"),
    (lambda: Mask("window", -1, 0), "Mask\\('causal'\\)"),
    (lambda: Mask("causal", 3, 0), "belong to kind='window'"),
    (lambda: Mask("window", 2, -3), ">= 0, or -1"),
    (lambda: Mask("sliding"), "mask must be one of"),
])
def test_mask_values_are_checked(make, says):
    with pytest.raises((ValueError, TypeError), match=says) as caught:
        make()
    assert "\n" not in str(caught.value)


# -- schedules on bands ------------------------------------------------------------------
BANDS = [(64, 64, (16, 0), True), (64, 64, (7, 9), False), (100, 37, (-1, 5), False),
         (37, 100, (30, -1), False), (90, 90, (0, 0), False), (50, 80, (200, 200), False),
         (130, 130, (40, 0), True), (33, 70, (5, 0), True)]


@pytest.mark.parametrize("name", EVERY)
def test_every_schedule_covers_a_band_without_deadlock(name):
    for s_q, s_k, window, causal in BANDS:
        for bm, bn in ((16, 16), (16, 8), (8, 32)):
            p = Problem(2, 3, 3, s_q, s_k, 8, "causal" if causal else "full", bm, bn,
                        window_size=window)
            for w in (1, 2, 5, 13, 40):
                build_schedule(p, name, w).validate()


@given(window=window_sizes(60, (8, 16)), causal=st.booleans(), s_q=st.integers(1, 90),
       s_k=st.integers(1, 90), workers=st.integers(1, 30), name=st.sampled_from(EVERY))
@settings(max_examples=60, deadline=None)
def test_drawn_bands_give_valid_schedules(window, causal, s_q, s_k, workers, name):
    p = Problem(1, 2, 1, s_q, s_k, 8, "causal" if causal else "full", 8, 16,
                window_size=window)
    build_schedule(p, name, workers).validate()


def test_every_schedule_covers_a_packed_batch_with_a_window():
    p = Problem.packed((37, 0, 1, 64, 20, 90), (50, 9, 1, 64, 0, 33), 4, 2, 16, "causal",
                       16, 16, window_size=(20, 0))
    for name in EVERY:
        for w in (1, 3, 17):
            build_schedule(p, name, w).validate()


def test_banded_is_portable_packing_invariant_and_adds_in_descendings_orders():
    p = Problem(2, 4, 2, 300, 260, 16, "full", 32, 16, window_size=(40, 25))
    prints = {build_schedule(p, "banded", w).fingerprint() for w in (1, 7, 66, 114, 132)}
    assert prints == {build_schedule(p, "descending", 9).fingerprint()}
    assert "banded" in BANDED and "banded" not in NAMES and "banded" not in PORTABLE
    q_lens, k_lens = (37, 0, 64, 90), (50, 9, 64, 33)
    packed = Problem.packed(q_lens, k_lens, 2, 1, 8, "causal", 16, 16, window_size=(21, 0))
    s = build_schedule(packed, "banded", 5)
    for b in range(packed.batch):
        alone = build_schedule(packed.sequence(b), "banded", 3)
        for j in range(packed.n_kv_of(b)):
            for h in range(2):
                assert s.chain(b, h, j).visits == alone.chain(0, h, j).visits
        for i in range(packed.n_q_of(b)):
            assert s.dq_order(b, 0, i) == alone.dq_order(0, 0, i)


def test_banded_launches_head_group_by_group_and_j_by_j_inside_a_group():
    """Placement only (the bits are descending's): the heads by work in groups of at least
    ``GROUP_FILL * W`` chains, one group after the other on every worker, and inside a
    group chain ``j`` of each of its heads before chain ``j + 1`` of any."""
    from test_varlen_problem import launch_groups

    p = Problem(3, 4, 2, 200, 200, 16, "causal", 16, 16, window_size=(40, 0))
    s = build_schedule(p, "banded", 5)
    assert sum(p.n_kv_of(b) for b in range(p.batch)) * p.heads > 2 * GROUP_FILL * 5
    groups = launch_groups(s)  # several groups, by the rule's independent statement
    assert len(set(groups.values())) > 2
    for chains in s.workers:
        keys = [(groups[c.b, c.h], c.j) for c in chains]
        assert keys == sorted(keys)
    assert {groups[c.b, c.h] for c in (w[0] for w in s.workers)} == {0}
    assert s.fingerprint() == build_schedule(p, "descending", 5).fingerprint()


def test_banded_waits_for_a_few_hand_offs_at_most_and_beats_its_peers_in_the_model():
    """d = 128 with the CuTe tiles, 16 heads, W = 132, the calibrated r / c and hand-off
    latency of ``benchmarks/results/model_vs_measured.json``: ``banded``'s makespan is its
    most loaded worker's work but for a few hand-offs (clipped chains started together),
    and it is faster than naive, descending and interleaved in the simulator."""
    fit = json.loads((RESULTS / "model_vs_measured.json").read_text())
    rho = fit["rho"]["128"]
    latency = sorted(x["latency_over_c"] for x in fit["latency"]
                     if x["d"] == 128 and 1024 <= x["S"] <= 4096)
    latency = latency[len(latency) // 2]
    for window, mask in (((1024, 0), "causal"), ((512, 512), "full")):
        p = Problem(1, 16, 16, 4096, 4096, 128, mask, 64, 128, window_size=window)
        s = build_schedule(p, "banded", 132).validate()
        load = max(sum(len(c.visits) for c in chains) for chains in s.workers) * (1 + rho)
        span = critical_path(s, "sync", 1.0, rho).length
        assert load - 1e-9 <= span <= load + 4 * rho + 1e-9
        mine = simulate(s, "sync", 1.0, rho, handoff_latency=latency).makespan
        assert mine <= load * 1.01
        for peer in ("naive", "descending", "interleaved"):
            theirs = simulate(build_schedule(p, peer, 132), "sync", 1.0, rho,
                              handoff_latency=latency).makespan
            assert mine < theirs, peer


def test_the_committed_model_table_has_banded_within_a_visit_of_its_load():
    """The DAG model has no cache, so what ``banded``'s head groups gain there is nothing
    and what they cost is a few waits: its critical path within one visit of its most
    loaded worker's work, and simulated within 1.5 % of that work and of the best of
    naive, descending and interleaved (on the H200 it is ahead of the ungrouped launch
    order by 0.5 - 9 %: ``benchmarks/results/experiments/head_groups.md``)."""
    report = json.loads((RESULTS / "model_window.json").read_text())
    assert {(r["S"], r["side"], r["window"]) for r in report["rows"]} == {
        (s, side, w) for s in (8192, 16384) for side in ("causal", "two-sided")
        for w in (256, 1024, 4096)}
    visit = 1 + report["r_over_c"]
    for r in report["rows"]:
        best_peer = min(r["sim"][n] for n in ("naive", "descending", "interleaved"))
        assert r["sim"]["banded"] <= best_peer * 1.015
        assert r["load"] - 1e-9 <= r["dag"]["banded"] <= r["load"] + visit
        assert r["sim"]["banded"] <= r["load"] * 1.015


# -- the emulator on bands -----------------------------------------------------------------
def inputs(b, s_q, s_k, h, h_kv, d, seed, dtype=torch.bfloat16, dv=None):
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    shapes = [(b, s_q, h, d), (b, s_k, h_kv, d), (b, s_k, h_kv, dv), (b, s_q, h, dv)]
    return [torch.randn(s, generator=g).to(dtype) for s in shapes]


CASES = [  # (B, S_q, S_k, H, H_kv, window, causal, schedule)
    (2, 45, 45, 2, 1, (12, 0), True, "banded"),
    (1, 37, 70, 4, 2, (9, 5), False, "naive"),
    (1, 70, 37, 2, 2, (-1, 6), False, "shift"),
    (2, 33, 50, 3, 1, (20, -1), False, "symmetric_shift"),
    (1, 40, 29, 2, 1, (0, 0), False, "lpt"),
]


@pytest.mark.parametrize("b, s_q, s_k, h, h_kv, window, causal, name", CASES)
def test_the_emulator_meets_the_float64_bound_on_windows(b, s_q, s_k, h, h_kv, window,
                                                          causal, name):
    q, k, v, do = inputs(b, s_q, s_k, h, h_kv, 16, seed=s_q * 7 + s_k)
    p = Problem(b, h, h_kv, s_q, s_k, 16, "causal" if causal else "full", 16, 16,
                window_size=window)
    fwd, bwd = emulate(build_schedule(p, name, 4), q, k, v, do)
    ref = attention_f64(q, k, v, do, causal, window_size=window)
    checks = grad_checks({"o": fwd.o, "dq": bwd.dq, "dk": bwd.dk, "dv": bwd.dv}, ref,
                         torch.bfloat16)
    assert all(c.ok for c in checks.values()), checks
    unseen = ~brute(s_q, s_k, *window, causal).any(-1)  # rows that see no key
    assert torch.equal(fwd.lse2[:, unseen], torch.full_like(fwd.lse2[:, unseen], -math.inf))
    assert not fwd.o[:, unseen].any() and not bwd.dq[:, unseen].any()


@pytest.mark.parametrize("arithmetic", ["ieee", "fast", "exact"])
def test_the_emulator_meets_the_mpmath_bound_on_a_window(arithmetic):
    q, k, v, do = inputs(1, 23, 29, 2, 1, 16, seed=11)
    p = Problem(1, 2, 1, 23, 29, 16, "full", 16, 16, window_size=(6, 3))
    _, bwd = emulate(build_schedule(p, "banded", 3), q, k, v, do, arithmetic=arithmetic)
    exact = reference_grads(q, k, v, do, window_size=(6, 3))
    for name in ("dq", "dk", "dv"):
        err = float((getattr(bwd, name).double() - getattr(exact, name)).norm())
        bound = error_bound(torch.bfloat16, name, exact.kappa[name], seqlen_q=23, seqlen_k=29,
                            head_dim=16, group=2)
        assert err <= bound * float(getattr(exact, name).norm()), name


@pytest.mark.parametrize("arithmetic", ["ieee", "fast", "exact"])
def test_a_key_no_row_sees_changes_no_bit(arithmetic):
    """Keys 0..11 are left of every row's window (S_q = 20, S_k = 40, causal window 8):
    new values there leave O, LSE2, dQ and the other keys' dK, dV bit for bit, and their
    own dK, dV zero."""
    q, k, v, do = inputs(1, 20, 40, 2, 2, 16, seed=5)
    p = Problem(1, 2, 2, 20, 40, 16, "causal", 16, 16, window_size=(8, 0))
    hidden = [c for c in range(40) if not brute(20, 40, 8, 0, True)[:, c].any()]
    assert hidden == list(range(12))
    s = build_schedule(p, "naive", 3)
    fa, ba = emulate(s, q, k, v, do, arithmetic=arithmetic)
    k2, v2 = k.clone(), v.clone()
    k2[:, hidden], v2[:, hidden] = 7.0, -3.0
    fb, bb = emulate(s, q, k2, v2, do, arithmetic=arithmetic)
    assert torch.equal(fa.o, fb.o) and torch.equal(fa.lse2, fb.lse2)
    assert torch.equal(ba.dq, bb.dq)
    assert torch.equal(ba.dk[:, 12:], bb.dk[:, 12:]) and torch.equal(ba.dv[:, 12:], bb.dv[:, 12:])
    assert not bb.dk[:, hidden].any() and not bb.dv[:, hidden].any()


def test_a_packed_batch_with_a_window_gives_each_sequence_its_own_bits_and_bound():
    q_lens, k_lens = (37, 0, 1, 50, 20), (50, 9, 1, 50, 0)
    p = Problem.packed(q_lens, k_lens, 2, 1, 16, "causal", 16, 16, window_size=(15, 0))
    g = torch.Generator().manual_seed(3)
    q, do = (torch.randn(p.total_q, 2, 16, generator=g).bfloat16() for _ in range(2))
    k, v = (torch.randn(p.total_k, 1, 16, generator=g).bfloat16() for _ in range(2))
    s = build_schedule(p, "banded", 4)
    fwd, bwd = emulate(s, q, k, v, do)
    ref = attention_f64_packed(q, k, v, do, q_lens, k_lens, True, window_size=(15, 0))
    for checks in packed_grad_checks({"o": fwd.o, "dq": bwd.dq, "dk": bwd.dk, "dv": bwd.dv},
                                     ref, torch.bfloat16):
        assert all(c.ok for c in checks.values()), checks
    cq, ck = p.cu_seqlens_q, p.cu_seqlens_k
    for b in range(p.batch):
        seq = p.sequence(b)
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        one = forward(q[rows][None], k[keys][None], v[keys][None], True, None, 16, 16,
                      window_size=(15, 0))
        assert torch.equal(one.o[0], fwd.o[rows]) and torch.equal(one.lse2[0], fwd.lse2[rows])
        alone = backward(build_schedule(seq, "banded", 2), q[rows][None], k[keys][None],
                         v[keys][None], one.o, one.lse2, do[rows][None])
        assert torch.equal(alone.dq[0], bwd.dq[rows])
        assert torch.equal(alone.dk[0], bwd.dk[keys]) and torch.equal(alone.dv[0], bwd.dv[keys])
