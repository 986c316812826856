"""The FAST arithmetic: the CuTe kernels' default, as dash_ref computes it on the CPU.

Bit-exactness against the GPU is shown by the H200 captures (``tests/test_capture.py``)
and on the GPU (``tests/gpu/test_cuda_fast_l2.py``); these are the properties the
emulation must have on its own.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dash_ref import EXACT, FAST
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


# -- learnable sinks in the fast forward (the CuTe forward folds them into each row) --------
def _sinks(heads, seed=3):
    gen = torch.Generator().manual_seed(seed)
    sink = torch.randn(heads, generator=gen) * 2
    sink[0], sink[-1] = 12.0, -12.0  # far above and far below the scores
    return sink


@pytest.mark.parametrize("causal", [False, True])
def test_the_fast_forward_with_sinks_is_within_the_float64_bound(causal):
    from verify.reference import attention_f64, grad_checks

    q, k, v, do = inputs(s_q=190, s_k=150, h=4, h_kv=2, seed=7)
    sink = _sinks(4)
    got = forward(q, k, v, causal, None, 128, 128, arithmetic="fast", learnable_sink=sink)
    ref = attention_f64(q, k, v, do, causal, learnable_sink=sink)
    check = grad_checks({"o": got.o}, ref, q.dtype)["o"]
    assert check.ok, check
    # the sinks matter: the reference without them rejects the output
    assert not grad_checks({"o": got.o}, attention_f64(q, k, v, do, causal), q.dtype)["o"].ok


def test_rows_that_see_no_key_get_the_sink_as_lse2_and_zero_output():
    q, k, v, _ = inputs(s_q=200, s_k=130, h=2, h_kv=2, seed=8)  # causal rows 0 .. 69 see none
    sink = torch.tensor([0.5, -3.0])
    got = forward(q, k, v, True, None, 128, 128, arithmetic="fast", learnable_sink=sink)
    unseen = slice(0, 70)
    assert torch.equal(got.o[:, unseen], torch.zeros_like(got.o[:, unseen]))
    assert torch.equal(got.lse2[:, unseen], steps.sink_logit(sink).expand(1, 70, 2))
    assert torch.isfinite(got.lse2[:, 70:]).all()


def test_a_very_negative_sink_gives_the_no_sink_bits_and_a_mild_one_does_not():
    q, k, v, _ = inputs(seed=9)
    plain = forward(q, k, v, True, None, 128, 128, arithmetic="fast")
    low = forward(q, k, v, True, None, 128, 128, arithmetic="fast",
                  learnable_sink=torch.full((2,), -1e4))
    assert torch.equal(low.o, plain.o) and torch.equal(low.lse2, plain.lse2)
    mild = forward(q, k, v, True, None, 128, 128, arithmetic="fast",
                   learnable_sink=torch.zeros(2))
    assert not torch.equal(mild.lse2, plain.lse2)


def test_the_fast_sink_step_sums_the_rows_threads_then_rescales_by_mufu():
    """``fwd_sink`` of the fast forward on hand-made row state: one sum of the four partial
    sums, then the MUFU exp2 of the sink's and the old maximum's distances to the new one."""
    m = torch.tensor([1.5, -float("inf"), 30.0])
    ell = torch.tensor([[1.0, 0.25, 0.5, 2.0**-30], [0.0] * 4, [1.0, 1.0, 1.0, 1.0]])
    acc = torch.ones(3, 5)
    s2 = torch.tensor(4.0)
    m_new, ell_new, acc_new = steps.fwd_sink(FAST, m, ell, acc, s2)
    assert m_new.tolist() == [4.0, 4.0, 30.0]
    total = (ell[:, 0] + ell[:, 1]) + (ell[:, 2] + ell[:, 3])
    alpha = mufu.ex2_approx_ftz(m - m_new)
    want = fma_f32(total, alpha, mufu.ex2_approx_ftz(s2 - m_new))
    assert torch.equal(ell_new[:, 0], want) and not ell_new[:, 1:].any()
    assert alpha[1] == 0 and want[1] == 1.0  # a row that saw no key: l = 1 from the sink
    assert torch.equal(acc_new, acc * alpha[:, None])
    bare = replace(EXACT, name="bare", features=())  # an arithmetic that models neither
    with pytest.raises(ValueError, match="^softcap is emulated in .* only, not 'bare'"):
        steps.require_feature(bare, "softcap")


@pytest.mark.parametrize("d, dv", [(256, 256), (192, 128)])
def test_the_wide_cute_tiles_are_emulated_within_the_float64_bound(d, dv):
    """The CuTe kernels' tiles at head dims 192 and 256 (64 x 64 backward tiles, 64-key
    forward tiles: what a GPU run's L2 check replays) in the fast arithmetic, GQA, causal."""
    from dash_cuda.backends.cute.config import backward_config, forward_block_n
    from dash_ref import Problem, build_schedule
    from dash_ref.emulate import backward
    from verify.reference import attention_f64, grad_checks

    gen = torch.Generator().manual_seed(7)
    q, k = (torch.randn(1, 130, h, d, generator=gen).bfloat16() for h in (2, 1))
    v, do = (torch.randn(1, 130, h, dv, generator=gen).bfloat16() for h in (1, 2))
    cfg = backward_config(d, "causal", head_dim_v=dv)
    assert (cfg.block_m, cfg.block_n, cfg.split) == (64, 64, "dims")
    f = forward(q, k, v, True, None, 128, forward_block_n(d), arithmetic="fast")
    p = Problem(1, 2, 1, 130, 130, d, "causal", cfg.block_m, cfg.block_n, head_dim_v=dv)
    r = backward(build_schedule(p, "auto", 4), q, k, v, f.o, f.lse2, do, arithmetic="fast")
    ref = attention_f64(q, k, v, do, causal=True)
    checks = grad_checks(dict(o=f.o, dq=r.dq, dk=r.dk, dv=r.dv), ref, torch.bfloat16)
    assert all(c.ok for c in checks.values()), checks
    assert not grad_checks({"dv": r.dv.flip(-1)}, ref, torch.bfloat16)["dv"].ok  # can fail
