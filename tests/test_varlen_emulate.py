"""The emulator on packed batches (FlashAttention's varlen layout) as a specification.

Tensors are ``(total, H, d)`` with the sequences one after another (the problem's lengths
imply ``cu_seqlens``); ``LSE2`` is ``(total_q, H)``. Each sequence is computed in its own
coordinates, so under a packing-invariant schedule (``dash_ref.PORTABLE``, ``lpt``) a
packed call gives every sequence bit for bit what the batch-1 call on that sequence alone
gives, whatever the other sequences and their order, in every arithmetic. Any schedule
meets the float64 reference's bound on every sequence.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_ref import NAMES, PORTABLE, RAGGED, Problem, build_schedule
from dash_ref.emulate import backward, emulate, forward, replay, visible
from verify.reference import attention_f64_packed, grad_checks, packed_grad_checks
from verify.strategies import Case, packed_cases

INVARIANT = (*PORTABLE, *RAGGED)
OUTPUTS = ("o", "lse2", "dq", "dk", "dv", "dq_acc", "dk_acc", "dv_acc")
KEY_SIDE = ("dk", "dv", "dk_acc", "dv_acc")

# empty query side, empty key side, length 1, S_q != S_k both ways, off the tile multiples
RAGGED_Q = (37, 0, 1, 64, 20, 90)
RAGGED_K = (50, 9, 1, 64, 0, 33)


def ragged(mask: str, heads: int = 2, heads_kv: int = 1) -> Problem:
    return Problem.packed(RAGGED_Q, RAGGED_K, heads, heads_kv, 16, mask, 16, 16)


def inputs(p: Problem, seed: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, ...]:
    """Fresh standard-normal packed ``q, k, v, do``."""
    gen = torch.Generator().manual_seed(seed)

    def draw(rows: int, heads: int) -> torch.Tensor:
        return torch.randn(rows, heads, p.head_dim, generator=gen).to(dtype)

    return (draw(p.total_q, p.heads), draw(p.total_k, p.heads_kv),
            draw(p.total_k, p.heads_kv), draw(p.total_q, p.heads))


def rows_of(p: Problem, b: int, name: str, x: torch.Tensor) -> torch.Tensor:
    """Sequence ``b``'s rows of a packed output."""
    cu = p.cu_seqlens_k if name in KEY_SIDE else p.cu_seqlens_q
    return x[cu[b]:cu[b + 1]]


def alone(p: Problem, b: int, tensors) -> tuple[torch.Tensor, ...]:
    """Sequence ``b``'s inputs as fresh ``(1, S, H, d)`` tensors of their own."""
    q, k, v, do = tensors
    return tuple(rows_of(p, b, n, x).clone().unsqueeze(0)
                 for n, x in (("q", q), ("dk", k), ("dv", v), ("do", do)))


def outputs(fwd, bwd) -> dict[str, torch.Tensor]:
    return {"o": fwd.o, "lse2": fwd.lse2, **{n: getattr(bwd, n) for n in OUTPUTS[2:]}}


def assert_each_sequence_has_its_batch_1_bits(p, name, workers, tensors, arithmetic):
    got = outputs(*emulate(build_schedule(p, name, workers), *tensors, arithmetic=arithmetic))
    for b in range(p.batch):
        seq = p.sequence(b)
        want = outputs(*emulate(build_schedule(seq, name, 3), *alone(p, b, tensors),
                                arithmetic=arithmetic))
        for n in OUTPUTS:
            assert torch.equal(rows_of(p, b, n, got[n]), want[n][0]), (name, arithmetic, b, n)


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("name", INVARIANT)
@pytest.mark.parametrize("arithmetic", ["ieee", "exact", "fast"])
def test_a_packed_call_gives_every_sequence_the_bits_of_its_batch_1_call(arithmetic, name,
                                                                         mask):
    p = ragged(mask)
    assert_each_sequence_has_its_batch_1_bits(p, name, 5, inputs(p, seed=len(name)),
                                              arithmetic)


@settings(max_examples=12, deadline=None)
@given(case=packed_cases(max_elements=30_000, schedules=INVARIANT, dtypes=("bf16", "fp16")),
       workers=st.integers(1, 9), data=st.data())
def test_permuting_and_repacking_the_sequences_keeps_every_sequences_bits(case, workers, data):
    p = case.problem
    tensors = case.tensors()
    order = data.draw(st.permutations(range(p.batch)))
    moved = Problem.packed([p.seqlens_q[b] for b in order], [p.seqlens_k[b] for b in order],
                           p.heads, p.heads_kv, p.head_dim, p.mask, p.block_m, p.block_n)
    sides = ("dq", "dk", "dk", "dq")  # q and do on the query side, k and v on the key side
    repacked = tuple(torch.cat([rows_of(p, b, side, x) for b in order])
                     for side, x in zip(sides, tensors))
    before = outputs(*emulate(build_schedule(p, case.schedule, workers), *tensors))
    after = outputs(*emulate(build_schedule(moved, case.schedule, workers + 1), *repacked))
    for new, old in enumerate(order):
        for n in OUTPUTS:
            assert torch.equal(rows_of(moved, new, n, after[n]), rows_of(p, old, n, before[n]))


def test_one_packed_sequence_has_the_bits_of_the_rectangular_problem():
    rect = Problem(1, 2, 1, 70, 45, 16, "causal", 16, 16)
    packed = Problem.packed((70,), (45,), 2, 1, 16, "causal", 16, 16)
    q, k, v, do = inputs(packed, seed=3)
    for name in INVARIANT:
        got = outputs(*emulate(build_schedule(packed, name, 4), q, k, v, do))
        want = outputs(*emulate(build_schedule(rect, name, 4), *(x.unsqueeze(0) for x in
                                                                  (q, k, v, do))))
        for n in OUTPUTS:
            assert torch.equal(got[n], want[n][0]), (name, n)


# ---------------------------------------------------------------------------------------
# accuracy: every schedule, every sequence, against float64
# ---------------------------------------------------------------------------------------
def assert_within_bound(p, fwd, bwd, tensors, dtype):
    ref = attention_f64_packed(*tensors, p.seqlens_q, p.seqlens_k, p.mask == "causal")
    got = {"o": fwd.o, "dq": bwd.dq, "dk": bwd.dk, "dv": bwd.dv}
    for b, checks in enumerate(packed_grad_checks(got, ref, dtype)):
        for n, c in checks.items():
            assert c.ok, f"sequence {b} {n}: error {c.error:.3e} > allowed {c.allowed:.3e}"
    for n, c in grad_checks(got, ref, dtype).items():
        assert c.ok, f"whole batch {n}: error {c.error:.3e} > allowed {c.allowed:.3e}"


@settings(max_examples=12, deadline=None)
@given(case=packed_cases(max_elements=30_000, schedules=(*NAMES, *RAGGED)),
       workers=st.integers(1, 9))
def test_every_schedule_meets_the_float64_bound_on_every_packed_sequence(case, workers):
    p = case.problem
    tensors = case.tensors()
    fwd, bwd = emulate(build_schedule(p, case.schedule, workers), *tensors, arrival_seed=5)
    assert_within_bound(p, fwd, bwd, tensors, case.torch_dtype)


@pytest.mark.parametrize("arithmetic", ["exact", "fast"])
def test_the_kernels_arithmetics_meet_the_bound_on_a_ragged_batch(arithmetic):
    p = ragged("causal", heads=4, heads_kv=2)
    tensors = inputs(p, seed=17, dtype=torch.float16)
    fwd, bwd = emulate(build_schedule(p, "shift", 4), *tensors, arithmetic=arithmetic)
    assert_within_bound(p, fwd, bwd, tensors, torch.float16)


# ---------------------------------------------------------------------------------------
# layout, replay and refusals
# ---------------------------------------------------------------------------------------
def test_packed_lse2_is_total_q_by_heads_and_rows_without_keys_are_empty():
    p = ragged("causal")
    q, k, v, _ = inputs(p, seed=2)
    fwd = forward(q, k, v, causal=True, block_m=16, block_n=16, seqlens_q=p.seqlens_q,
                  seqlens_k=p.seqlens_k)
    assert fwd.lse2.shape == (p.total_q, p.heads) and fwd.lse2.dtype == torch.float32
    assert fwd.o.shape == q.shape
    cu_q, cu_k = p.cu_seqlens_q, p.cu_seqlens_k
    for b, (s_q, s_k) in enumerate(zip(RAGGED_Q, RAGGED_K)):
        blind = max(0, s_q - s_k) if s_k else s_q  # causal rows above the diagonal
        rows = slice(cu_q[b], cu_q[b] + blind)
        assert torch.isneginf(fwd.lse2[rows]).all()
        assert torch.equal(fwd.o[rows], torch.zeros_like(fwd.o[rows]))
        if s_q > blind:  # the last row sees every key of its own sequence, no other
            r = cu_q[b + 1] - 1
            s = q[r, 0].double() @ k[cu_k[b]:cu_k[b + 1], 0].double().T / math.sqrt(16)
            want = float(torch.logsumexp(s, 0)) / math.log(2)
            assert abs(float(fwd.lse2[r, 0]) - want) < 1e-5


@pytest.mark.parametrize("name", ["lpt", "shift", "atomic"])
def test_replay_adds_packed_partials_in_dq_order_at_each_sequences_rows(name):
    """L1 on the CPU: every dQacc tile is +0 plus its partials in the tile's dQ order (for
    atomic: the arrival order given), one fp32 addition at a time, at its sequence's rows."""
    p = ragged("full")
    s = build_schedule(p, name, 3)
    _, bwd = emulate(s, *inputs(p, seed=9), return_partials=True, arrival_seed=4)
    where = {}
    for _, c in s.chains():
        for i in c.visits:
            where[(c.b, c.h, i, c.j)] = len(where)
    orders = dict(s.dq_orders)
    if not s.deterministic:  # an arrival order of our own: the tile's j descending
        orders = {key: p.tile_cols_of(key[0])[key[2]][::-1] for key in s.dq_orders}
    want = torch.zeros(p.total_q, p.heads, p.head_dim)
    for (b, h, i), order in orders.items():
        first = p.cu_seqlens_q[b] + i * p.block_m
        n = min(p.block_m, p.seqlens_q[b] - i * p.block_m)
        tile = torch.zeros(n, p.head_dim)
        for j in order:
            tile = tile + bwd.partials[where[(b, h, i, j)], :n]
        want[first:first + n, h] = tile
    got = replay(s, bwd.partials, arrival=None if s.deterministic else orders)
    assert torch.equal(got, want)
    if s.deterministic:
        assert torch.equal(bwd.dq_acc, want)


def test_the_element_mask_of_a_packed_tile_uses_its_own_sequences_lengths():
    p = ragged("causal")
    for b, (s_q, s_k) in enumerate(zip(RAGGED_Q, RAGGED_K)):
        rows, cols = range(0, min(16, s_q)), range(0, min(16, s_k))
        want = torch.tensor([[c <= r + s_k - s_q for c in cols] for r in rows],
                            dtype=torch.bool).reshape(len(rows), len(cols))
        assert torch.equal(visible(p, rows, cols, b), want), b


def test_an_empty_batch_and_empty_sequences_give_empty_outputs():
    p = Problem.packed((0, 0), (0, 5), 2, 2, 16, "full", 16, 16)
    q, k, v, do = inputs(p, seed=1)
    fwd, bwd = emulate(build_schedule(p, "lpt", 2), q, k, v, do)
    assert fwd.o.shape == (0, 2, 16) and fwd.lse2.shape == (0, 2)
    assert bwd.dq.shape == (0, 2, 16) and bwd.dk.shape == (5, 2, 16)
    assert torch.equal(bwd.dk, torch.zeros_like(bwd.dk))


@pytest.mark.parametrize("call, error, says", [
    (lambda q, k, v, do, p: forward(q, k, v, seqlens_q=p.seqlens_q), ValueError,
     "seqlens_q and seqlens_k go together"),
    (lambda q, k, v, do, p: forward(q.unsqueeze(0), k, v, seqlens_q=p.seqlens_q,
                                    seqlens_k=p.seqlens_k), ValueError,
     r"q must have 3 dims \(total, H, d\)"),
    (lambda q, k, v, do, p: forward(q, k[1:], v[1:], seqlens_q=p.seqlens_q,
                                    seqlens_k=p.seqlens_k), ValueError,
     r"k has shape \(156, 1, 16\), the packed problem needs \(157, 1, 16\)"),
    (lambda q, k, v, do, p: forward(q, k, v, seqlens_q=(1, 2), seqlens_k=(1,)), ValueError,
     "Problem.seqlens_k has 1 lengths, Problem.seqlens_q 2"),
    (lambda q, k, v, do, p: backward(build_schedule(p, "lpt", 2), q, k, v, q,
                                     torch.zeros(p.heads, p.total_q), do), ValueError,
     r"lse2 has shape \(2, 212\), the packed problem needs \(212, 2\)"),
    (lambda q, k, v, do, p: backward(build_schedule(p, "lpt", 2), q.unsqueeze(0), k, v, q,
                                     torch.zeros(p.total_q, p.heads), do), ValueError,
     r"q has shape \(1, 212, 2, 16\), the packed problem needs \(212, 2, 16\)"),
])
def test_bad_packed_inputs_are_refused_by_name(call, error, says):
    p = ragged("causal")
    with pytest.raises(error, match=says) as info:
        call(*inputs(p, seed=0), p)
    assert "\n" not in str(info.value)


def test_a_packed_case_draws_the_packed_layout_and_names_its_lengths_on_the_command_line():
    p = ragged("full")
    case = Case(p, "fp16", "lpt", 3)
    q, k, v, do = case.tensors()
    assert q.shape == (p.total_q, 2, 16) and k.shape == (p.total_k, 1, 16)
    assert q.dtype == torch.float16 and do.shape == q.shape and v.shape == k.shape
    assert not torch.equal(q[:5], torch.zeros_like(q[:5]))
    flags = case.flags()
    assert flags.startswith(f"--seqlens-q {','.join(map(str, p.seqlens_q))} "
                            f"--seqlens-k {','.join(map(str, p.seqlens_k))} ")
    assert "--batch" not in flags and "--seqlen-q" not in flags
