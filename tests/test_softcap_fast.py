"""The fast and exact arithmetics' softcap (the CuTe kernels' steps; the Triton backward's
with ``exact=True``), on the CPU.

``tanh(y) = 1 - 2 / (1 + e^(2y))``, each step one rounding the CPU reproduces: fast with
``e^(2y)`` and the reciprocal from the MUFU models, exact with ``exp2_fma`` and a correctly
rounded division. Here their accuracy against float64 ``tanh``, their gradient ``4 r (1 -
r)``, and the emulation they feed, held to the float64 bounds of the whole attention.
"""

from __future__ import annotations

import math

import pytest
import torch

from dash_ref import EXACT, FAST, IEEE, Problem, build_schedule
from dash_ref.arithmetic import steps
from dash_ref.emulate import emulate

SCALE = 1.0 / math.sqrt(128)


def scores(n=1 << 18, seed=0):
    """Raw fp32 products over the range attention meets: mostly small, a tail to +-600,
    exact zeros and the values where the cap saturates."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * 40
    x[:1000] = torch.randn(1000, generator=gen) * 600
    x[1000:1010] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e4, -1e4, 3e38, -3e38, 2e-45,
                                 -2e-45])
    return x.float()


@pytest.mark.parametrize("cap", [50.0, 30.0, 5.0])
def test_the_fast_capped_scores_are_within_eight_ulps_of_the_cap_of_float64_tanh(cap):
    x = scores()
    got, r = steps.softcap(FAST, x, SCALE, cap)
    exact = cap * torch.tanh(x.double() * SCALE / cap)
    err = (got.double() - exact).abs()
    ulp_cap = 2.0 ** (math.floor(math.log2(cap)) - 23)
    assert err.max() <= 8 * ulp_cap, float(err.max() / ulp_cap)  # measured: 5.0 - 6.8
    assert bool((got.abs() <= cap).all()) and torch.isfinite(got).all()
    assert bool(((r >= 0) & (r <= 1)).all())
    # saturation and sign: the far tails give the cap exactly, zero gives +-0 or one ulp
    assert got[1006] == cap and got[1007] == -cap
    assert float(got[1000].abs()) <= ulp_cap


@pytest.mark.parametrize("cap", [50.0, 30.0, 5.0])
def test_the_exact_capped_scores_are_within_four_ulps_of_the_cap_of_float64_tanh(cap):
    """The exact form's error is that of ``exp2_fma``, the division and the cancellation of
    ``1 - 2 r`` alone: within 4 ulps of the cap (measured 2.3 - 3.2), half the fast form's
    bound, and its gradient within ``2^-21`` (measured 4.2 - 5.3 * 2^-24)."""
    x = scores()
    got, r = steps.softcap(EXACT, x, SCALE, cap)
    exact = cap * torch.tanh(x.double() * SCALE / cap)
    ulp_cap = 2.0 ** (math.floor(math.log2(cap)) - 23)
    assert (got.double() - exact).abs().max() <= 4 * ulp_cap
    assert got[1006] == cap and got[1007] == -cap and bool(torch.isfinite(got).all())
    p = torch.rand(x.shape, generator=torch.Generator().manual_seed(2))
    t = torch.tanh(x.double() * SCALE / cap)
    slope = steps.softcap_grad(EXACT, p, r).double() - p.double() * (1 - t * t)
    assert slope.abs().max() <= 2.0 ** -21
    fast, _ = steps.softcap(FAST, x, SCALE, cap)
    assert not torch.equal(got, fast)  # the exact and fast forms are other roundings


@pytest.mark.parametrize("cap", [50.0, 5.0])
def test_the_fast_gradient_is_four_r_one_minus_r_close_to_one_minus_tanh_squared(cap):
    x = scores(seed=1)
    _, r = steps.softcap(FAST, x, SCALE, cap)
    p = torch.rand(x.shape, generator=torch.Generator().manual_seed(2))
    got = steps.softcap_grad(FAST, p, r)
    t = torch.tanh(x.double() * SCALE / cap)
    want = p.double() * (1 - t * t)
    assert ((got.double() - want).abs() <= 2.0 ** -20).all()  # measured: 13 * 2^-24
    assert bool((got >= 0).all()) and bool((got <= p).all())


def test_ieee_and_fast_cap_differently_and_ieee_keeps_its_own_steps():
    x = scores(n=4096, seed=3)
    fast, _ = steps.softcap(FAST, x, SCALE, 50.0)
    ieee, t = steps.softcap(IEEE, x, SCALE, 50.0)
    assert not torch.equal(fast, ieee)
    assert torch.equal(ieee, torch.tensor(50.0) * steps.tanh_f32(x * torch.tensor(SCALE) /
                                                                 torch.tensor(50.0)))
    assert torch.equal(t, steps.tanh_f32(x * torch.tensor(SCALE) / torch.tensor(50.0)))


@pytest.mark.parametrize("causal", [False, True])
def test_the_fast_emulation_with_softcap_is_within_the_float64_bound(causal):
    from verify.reference import attention_f64, grad_checks

    gen = torch.Generator().manual_seed(11)
    b, s_q, s_k, h, h_kv, d = 1, 190, 150, 4, 2, 64
    q = (torch.randn(b, s_q, h, d, generator=gen) * 3).bfloat16()  # scores the cap bends
    k = (torch.randn(b, s_k, h_kv, d, generator=gen) * 3).bfloat16()
    v, do = (torch.randn(b, s, hh, d, generator=gen).bfloat16() for s, hh in ((s_k, h_kv),
                                                                             (s_q, h)))
    p = Problem(b, h, h_kv, s_q, s_k, d, "causal" if causal else "full", 64, 128)
    fwd, bwd = emulate(build_schedule(p, "descending", 8), q, k, v, do, arithmetic="fast",
                       softcap=20.0)
    ref = attention_f64(q, k, v, do, causal, softcap=20.0)
    got = {"o": fwd.o, "dq": bwd.dq, "dk": bwd.dk, "dv": bwd.dv}
    for name, check in grad_checks(got, ref, q.dtype).items():
        assert check.ok, (name, check)
    # the cap matters: the uncapped reference rejects the output
    plain = attention_f64(q, k, v, do, causal)
    assert not grad_checks({"o": fwd.o}, plain, q.dtype)["o"].ok
