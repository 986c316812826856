"""The FAST arithmetic: the CuTe kernels' default, as dash_ref computes it on the CPU.

Bit-exactness against the GPU is shown by the H200 captures (``tests/test_capture.py``)
and on the GPU (``tests/gpu/test_cuda_fast_l2.py``); these are the properties the
emulation must have on its own.
"""

from __future__ import annotations

import pytest
import torch

from dash_ref import FAST
from dash_ref.arithmetic import mufu, steps
from dash_ref.arithmetic.numerics import fma_f32
from dash_ref.emulate import forward


def inputs(s_q=150, s_k=200, h=2, h_kv=1, d=64, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, s, heads, d, generator=gen).to(dtype)
                 for s, heads in ((s_q, h), (s_k, h_kv), (s_k, h_kv), (s_q, h)))


@pytest.mark.parametrize("causal", [False, True])
def test_the_query_tile_height_changes_no_bit(causal):
    q, k, v, _ = inputs()
    runs = [forward(q, k, v, causal, 0.125, bm, 128, arithmetic="fast") for bm in (64, 128, 192)]
    for r in runs[1:]:
        assert torch.equal(r.o, runs[0].o) and torch.equal(r.lse2, runs[0].lse2)


def test_the_fast_forward_is_close_to_ieee_and_not_equal():
    q, k, v, _ = inputs(seed=1)
    fast = forward(q, k, v, True, None, 128, 128, arithmetic="fast")
    ieee = forward(q, k, v, True, None, 128, 128)
    assert not torch.equal(fast.lse2, ieee.lse2)  # MUFU, sum order: other bits
    assert (fast.lse2 - ieee.lse2).abs().max() < 1e-5
    assert (fast.o.float() - ieee.o.float()).abs().max() < 2e-2  # a bf16 ulp or so


def test_each_thread_sums_its_own_columns_in_register_order():
    # thread t holds columns 8k + 2t and 8k + 2t + 1; put one large value and many small
    # ones in thread 1's columns only: adding from +0 in register order loses the small ones
    p = torch.zeros(1, 16)
    p[0, 2] = 2.0**24
    p[0, 3] = 1.0
    p[0, 10] = 1.0
    sums = steps.quad_sums(p, 16)
    assert sums.tolist() == [[0.0, 2.0**24, 0.0, 0.0]]  # (2^24 + 1) + 1 rounds back twice
    p[0, 2] = 0.0
    p[0, 11] = 2.0**24  # the large one last: 1 + 1 = 2 survives, then 2^24 + 2
    assert steps.quad_sums(p, 16).tolist() == [[0.0, 2.0**24 + 2, 0.0, 0.0]]


def test_a_negative_scale_runs_as_the_kernel_host_does():
    q, k, v, _ = inputs(seed=2)
    neg = forward(q, k, v, False, -0.2, 128, 128, arithmetic="fast")
    pos = forward(-q, k, v, False, 0.2, 128, 128, arithmetic="fast")
    assert torch.equal(neg.o, pos.o) and torch.equal(neg.lse2, pos.lse2)


def test_exact_has_no_forward():
    q, k, v, _ = inputs()
    with pytest.raises(ValueError, match="forward"):
        forward(q, k, v, arithmetic="exact")


def test_the_fast_probabilities_are_mufu_of_one_fma_and_not_exact_modes():
    gen = torch.Generator().manual_seed(4)
    s = torch.randn(64, 128, generator=gen) * 8
    lse2 = torch.randn(64, generator=gen) * 4 + 10
    c = steps.scale_log2(0.125)
    visible = torch.rand(64, 128, generator=gen) < 0.9
    p = steps.softmax_p(FAST, s, c, lse2, visible)
    want = mufu.ex2_approx_ftz(fma_f32(s, c, -lse2[:, None]))
    assert torch.equal(p, torch.where(visible, want, torch.zeros(())))
    other = steps.softmax_p(steps.EXACT, s, c, lse2, visible)
    assert 0.2 < (p != other).float().mean() < 0.8  # another exp2: other bits, often
    assert FAST.flush_dq_adds is False and FAST.delta_order == "pairwise"
