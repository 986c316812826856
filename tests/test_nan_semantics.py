"""NaN and infinity: the emulator and the float64 reference propagate them as PyTorch's SDPA.

A NaN (or an infinite score) in a row's inputs makes that row's output and LSE NaN, and
reaches the gradients that sum over it; rows and heads it does not touch stay finite. A
row that sees no key is the one convention of our own: O = 0, LSE = -inf, zero gradients.
"""

from __future__ import annotations

import math

import pytest
import torch

from dash_ref import Problem, build_schedule
from dash_ref.emulate import emulate
from verify.compare import compare
from verify.demo import random_inputs
from verify.reference import attention_f64

P = Problem(1, 2, 1, 40, 40, 16, "full", 16, 16)


def sdpa_nan_masks(q, k, v, do, causal):
    """Where fp32 SDPA (math, CPU) gives NaN in O, dQ, dK, dV."""
    qf, kf, vf = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    o = torch.nn.functional.scaled_dot_product_attention(
        qf, kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1), is_causal=causal)
    o.backward(do.float().transpose(1, 2))
    return [x.transpose(1, 2).isnan() for x in (o.detach(), qf.grad, kf.grad, vf.grad)]


def poisoned(poison: str):
    q, k, v, do = random_inputs(P, torch.bfloat16, seed=3)
    if poison == "nan_q":
        q[0, 21, 1, 5] = math.nan
    elif poison == "inf_k":
        k[0, 7, 0, 2] = math.inf
    else:
        v[0, 30, 0, 9] = math.nan
    return q, k, v, do


def emulated(q, k, v, do, causal):
    p = Problem(1, 2, 1, 40, 40, 16, "causal" if causal else "full", 16, 16)
    fwd, bwd = emulate(build_schedule(p, "shift", 2), q, k, v, do)
    return fwd, (fwd.o, bwd.dq, bwd.dk, bwd.dv)


@pytest.mark.parametrize("poison", ["nan_q", "inf_k", "nan_v"])
def test_full_mask_nan_pattern_is_sdpas(poison):
    """Every element takes part: the emulator's NaNs are exactly fp32 SDPA's (math)."""
    q, k, v, do = poisoned(poison)
    want = sdpa_nan_masks(q, k, v, do, causal=False)
    assert any(m.any() for m in want) and not all(m.all() for m in want)  # not vacuous
    _, got = emulated(q, k, v, do, causal=False)
    for name, w, x in zip(("O", "dQ", "dK", "dV"), want, got):
        assert torch.equal(x.isnan(), w), name


@pytest.mark.parametrize("poison", ["nan_q", "inf_k"])
def test_causal_nan_pattern_is_sdpas_where_the_poison_is_visible(poison):
    """The poisoned element is seen by the rows it reaches: the same NaNs as SDPA again."""
    q, k, v, do = poisoned(poison)
    want = sdpa_nan_masks(q, k, v, do, causal=True)
    _, (o, dq, dk, dv) = emulated(q, k, v, do, causal=True)
    assert torch.equal(o.isnan(), want[0]) and torch.equal(dq.isnan(), want[1])


def test_masked_tiles_take_no_part_masked_elements_of_active_tiles_do():
    """NaN in V at key 30: SDPA's math backend multiplies it by every row's zero weight; the
    tile emulation (like the kernels) multiplies it only inside the active tiles of key 30."""
    q, k, v, do = poisoned("nan_v")
    o = emulated(q, k, v, do, causal=True)[1][0]
    rows_nan = o.isnan().any(-1).any(-1)[0]
    assert rows_nan[16:].all() and not rows_nan[:16].any()  # tile 0 never meets key 30
    assert sdpa_nan_masks(q, k, v, do, causal=True)[0].any(-1).any(-1)[0].all()


@pytest.mark.parametrize("poison", ["nan_q", "inf_k", "nan_v"])
@pytest.mark.parametrize("causal", [False, True])
def test_reference_output_nan_pattern_is_sdpas(poison, causal):
    q, k, v, do = poisoned(poison)
    want = sdpa_nan_masks(q, k, v, do, causal)
    ref = attention_f64(q, k, v, do, causal)
    assert torch.equal(ref.o.isnan(), want[0])
    assert torch.equal(ref.dq.isnan().any(-1), want[1].any(-1))


def test_a_nan_row_is_nan_not_zero():
    q, k, v, do = poisoned("nan_q")
    fwd, (o, dq, _, _) = emulated(q, k, v, do, causal=False)
    assert o[0, 21, 1].isnan().all() and math.isnan(float(fwd.lse2[0, 21, 1]))
    assert not o[0, 20].isnan().any() and not o[0, 21, 0].isnan().any()


def test_rows_that_see_no_key_are_zero_not_nan():
    p = Problem(1, 1, 1, 40, 24, 16, "causal", 16, 16)  # S_q > S_k: 16 rows see no key
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=4)
    fwd, bwd = emulate(build_schedule(p, "naive", 2), q, k, v, do)
    ref = attention_f64(q, k, v, do, True)
    for x in (fwd.o, bwd.dq, ref.o, ref.dq):
        assert not x.isnan().any() and (x[0, :16] == 0).all()
    assert (fwd.lse2[0, :16] == -math.inf).all()


def test_a_comparison_that_differs_only_by_a_nan_says_nan():
    a = torch.randn(2, 8, 1, 4, generator=torch.Generator().manual_seed(5))
    b = a.clone()
    b[0, 3, 0, 1] = math.nan
    report = compare("dQ", a, b)
    assert report.differing == 1 and report.nan == 1 and report.max_ulp is None
    assert "largest distance NaN" in str(report) and "-1 ulp" not in str(report)
    b[1, 2, 0, 0] = torch.nextafter(a[1, 2, 0, 0], torch.tensor(math.inf))
    report = compare("dQ", a, b)
    assert report.max_ulp == 1 and "1 of them with a NaN" in str(report)
