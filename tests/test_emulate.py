"""Specification of the tile-level emulator (dash_ref.emulate)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_ref import DETERMINISTIC, NAMES, Problem, build_schedule
from dash_ref.emulate import emulate, forward, replay, visit_index
from verify.demo import random_inputs
from verify.highprec import grad_error_reports, reference_grads
from verify.reference import attention_f64, grad_checks

DTYPES = (torch.bfloat16, torch.float16)


def assert_within_bound(fwd, bwd, ref, dtype, label=""):
    got = {"dq": bwd.dq, "dk": bwd.dk, "dv": bwd.dv}
    if fwd is not None:
        got["o"] = fwd.o
    for name, c in grad_checks(got, ref, dtype).items():
        assert c.ok, f"{label} {name}: error {c.error:.3e} > allowed {c.allowed:.3e}"


SHAPES = [  # (B, H, H_kv, S_q, S_k, d, BM, BN)
    (1, 2, 2, 48, 48, 16, 16, 16),
    (2, 4, 2, 37, 70, 16, 16, 16),  # S_q < S_k, ragged tiles, GQA
    (1, 3, 1, 70, 37, 8, 16, 8),  # S_q > S_k: causal rows that see no key; MQA
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_schedule_meets_the_bound_against_float64(shape, mask, dtype):
    b, h, hk, sq, sk, d, bm, bn = shape
    p = Problem(b, h, hk, sq, sk, d, mask, bm, bn)
    q, k, v, do = random_inputs(p, dtype, seed=sq * 7 + sk)
    ref = attention_f64(q, k, v, do, causal=mask == "causal")
    for name in NAMES:
        fwd, bwd = emulate(build_schedule(p, name, 3), q, k, v, do)
        assert_within_bound(fwd, bwd, ref, dtype, name)


@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_schedule_meets_the_bound_against_mpmath(mask, dtype):
    p = Problem(1, 2, 1, 24, 20, 8, mask, 8, 8)
    q, k, v, do = random_inputs(p, dtype, seed=11)
    exact = reference_grads(q, k, v, do, causal=mask == "causal", dps=50)
    for name in NAMES:
        _, bwd = emulate(build_schedule(p, name, 2), q, k, v, do)
        for grad, rep in grad_error_reports(exact, bwd.dq, bwd.dk, bwd.dv).items():
            assert rep.passed, f"{name} {grad}: {rep}"


def test_forward_lse_is_base_two_and_rows_without_keys_are_empty():
    p = Problem(1, 1, 1, 20, 8, 8, "causal", 8, 8)  # rows 0..11 see no key
    q, k, v, _ = random_inputs(p, torch.bfloat16, seed=3)
    fwd = forward(q, k, v, causal=True, block_m=8, block_n=8)
    blind = slice(0, p.seqlen_q - p.seqlen_k)
    assert torch.isneginf(fwd.lse2[0, blind, 0]).all()
    assert torch.equal(fwd.o[0, blind], torch.zeros_like(fwd.o[0, blind]))
    s = torch.einsum("qd,kd->qk", q[0, :, 0].double(), k[0, :, 0].double()) / 8**0.5
    row = p.seqlen_q - 1  # the last row sees every key
    want = torch.logsumexp(s[row], 0) / torch.log(torch.tensor(2.0, dtype=torch.float64))
    assert abs(float(fwd.lse2[0, row, 0]) - float(want)) < 1e-5


# Seeded problems with eight KV tiles: orders must show in the bits.
ORDER_PROBLEMS = [Problem(1, 4, 4, 256, 256, 64, mask, 32, 32) for mask in ("full", "causal")]


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    bits = torch.int32 if a.dtype == torch.float32 else torch.int16
    return int((a.view(bits) != b.view(bits)).sum())


def test_summation_order_changes_the_bits_but_not_the_accuracy():
    """fp32 accumulators part in many elements; rounding to bf16 hides most, not all."""
    dq_parted = dkdv_parted = 0
    for p in ORDER_PROBLEMS:
        q, k, v, do = random_inputs(p, torch.bfloat16, seed=0)
        ref = attention_f64(q, k, v, do, causal=p.mask == "causal")
        out = {n: emulate(build_schedule(p, n, 4), q, k, v, do)[1]
               for n in ("naive", "shift", "descending")}
        naive = out["naive"]
        assert _bits_differ(naive.dq_acc, out["shift"].dq_acc) > naive.dq_acc.numel() // 10
        assert _bits_differ(naive.dk_acc, out["descending"].dk_acc) > naive.dk_acc.numel() // 10
        dq_parted += _bits_differ(naive.dq, out["shift"].dq)
        dkdv_parted += (_bits_differ(naive.dk, out["descending"].dk)
                        + _bits_differ(naive.dv, out["descending"].dv))
        for name, bwd in out.items():
            assert_within_bound(None, bwd, ref, torch.bfloat16, name)
    assert dq_parted, "naive and shift gave the same bf16 dQ on every problem"
    assert dkdv_parted, "ascending and descending visits gave the same bf16 dK and dV"


@pytest.mark.parametrize("name", DETERMINISTIC)
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_replay_of_own_partials_is_bit_exact(name, mask):
    p = Problem(2, 2, 1, 45, 33, 8, mask, 8, 16)
    q, k, v, do = random_inputs(p, torch.float16, seed=5)
    sched = build_schedule(p, name, 3)
    _, bwd = emulate(sched, q, k, v, do, return_partials=True)
    assert torch.equal(replay(sched, bwd.partials), bwd.dq_acc)
    assert torch.equal(bwd.dq_acc.view(torch.int32), replay(sched, bwd.partials).view(torch.int32))


def test_partials_do_not_depend_on_the_schedule():
    """A tile pair's partial is a function of its inputs; only the order of the sums moves."""
    p = Problem(1, 2, 2, 64, 64, 16, "causal", 16, 16)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=1)
    got = {}
    for name in ("naive", "symmetric_shift"):
        sched = build_schedule(p, name, 4)
        _, bwd = emulate(sched, q, k, v, do, return_partials=True)
        got[name] = {key: bwd.partials[v_] for key, v_ in visit_index(sched).items()}
    assert got["naive"].keys() == got["symmetric_shift"].keys()
    for key, tile in got["naive"].items():
        assert torch.equal(tile, got["symmetric_shift"][key]), key


def test_atomic_arrival_order_changes_dq():
    p = Problem(1, 2, 2, 64, 64, 16, "full", 16, 16)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=2)
    sched = build_schedule(p, "atomic", 4)
    runs = [emulate(sched, q, k, v, do, arrival_seed=s)[1].dq_acc for s in range(4)]
    assert any(_bits_differ(runs[0], r) for r in runs[1:])
    with pytest.raises(ValueError, match="no dQ order"):
        replay(sched, torch.zeros(len(visit_index(sched)), p.block_m, p.head_dim))


def test_emulator_rejects_bad_inputs():
    p = Problem(1, 2, 1, 16, 16, 8, "full", 8, 8)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=0)
    sched = build_schedule(p, "naive", 2)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        emulate(sched, q.float(), k.float(), v.float(), do)
    with pytest.raises(ValueError, match=r"q has shape \(1, 8, 2, 8\), the problem needs"):
        emulate(sched, q[:, :8], k, v, do[:, :8])


@settings(max_examples=25, deadline=None)
@given(
    mask=st.sampled_from(["full", "causal"]),
    s_q=st.integers(1, 20), s_k=st.integers(1, 20),
    bm=st.sampled_from([4, 8]), bn=st.sampled_from([4, 8]),
    group=st.sampled_from([1, 2]), name=st.sampled_from(DETERMINISTIC),
    workers=st.integers(1, 5), seed=st.integers(0, 2**16),
)
def test_fuzzed_shapes_match_float64_and_replay(mask, s_q, s_k, bm, bn, group, name, workers,
                                                seed):
    p = Problem(1, 2, 2 // group, s_q, s_k, 8, mask, bm, bn)
    q, k, v, do = random_inputs(p, torch.float16, seed)
    sched = build_schedule(p, name, workers).validate()
    _, bwd = emulate(sched, q, k, v, do, return_partials=True)
    ref = attention_f64(q, k, v, do, causal=mask == "causal")
    assert_within_bound(None, bwd, ref, torch.float16, name)
    assert torch.equal(replay(sched, bwd.partials), bwd.dq_acc)


def test_replay_can_flush_subnormals_like_global_atomics():
    p = Problem(1, 1, 1, 8, 16, 8, "full", 8, 8)
    sched = build_schedule(p, "naive", 1)
    gen = torch.Generator().manual_seed(9)
    partials = torch.randn(len(visit_index(sched)), 8, 8, generator=gen)
    partials[0, 0, 0], partials[1, 0, 0] = 2.0**-140, 2.0**-141  # fp32 subnormals
    kept = replay(sched, partials)
    flushed = replay(sched, partials, flush_subnormals=True)
    assert kept[0, 0, 0, 0] == 1.5 * 2.0**-140  # exact, kept
    assert flushed[0, 0, 0, 0] == 0.0  # both inputs flushed
    assert torch.equal(kept[0, 1:], flushed[0, 1:])  # normal values add alike
