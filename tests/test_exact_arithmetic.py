"""Specification of the emulator's exact arithmetic: fma_f32, exp2_fma, arithmetic="exact"."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from dash_ref import DETERMINISTIC, Problem, build_schedule
from dash_ref.arithmetic.exp2 import COEFFS, exp2_fma
from dash_ref.arithmetic.numerics import fma_f32, ulp
from dash_ref.arithmetic.steps import EXACT, delta
from dash_ref.emulate import emulate, replay
from verify.demo import random_inputs
from verify.reference import attention_f64, grad_checks

F32 = torch.float32


# ---------------------------------------------------------------------------------------
# fma_f32 against exact rational arithmetic
# ---------------------------------------------------------------------------------------
def _f32(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bits, dtype=np.uint32).view(np.int32)).view(F32)


def _round_f32(x: Fraction, zero_sign: float) -> float:
    """``x`` rounded to fp32, nearest even, subnormals kept; a zero gets ``zero_sign``."""
    if x == 0:
        return math.copysign(0.0, zero_sign)
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    n, rem = divmod(a, quantum)
    if rem > quantum / 2 or (rem == quantum / 2 and n % 2 == 1):
        n += 1
    v = n * quantum
    out = math.inf if v >= Fraction(2) ** 128 else float(v)
    return math.copysign(out, x)


def _fma_exact(a: float, b: float, c: float) -> float:
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    # an exact zero is -0 only for (-0) + (-0); otherwise +0 (round to nearest)
    neg_zero_product = (a == 0 or b == 0) and math.copysign(1.0, a) * math.copysign(1.0, b) < 0
    neg_zero_c = c == 0 and math.copysign(1.0, c) < 0
    return _round_f32(exact, -1.0 if neg_zero_product and neg_zero_c else 1.0)


def _random_finite(rng: np.random.Generator, n: int, exp_lo: int = 0, exp_hi: int = 254
                   ) -> np.ndarray:
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    expo = rng.integers(exp_lo, exp_hi + 1, n, dtype=np.uint32) << 23
    frac = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    return sign | expo | frac


def _fma_cases() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(2024)
    n = 600
    a, b, c = [], [], []
    # any finite values, and values whose product is comparable to c
    for lo, hi in ((0, 254), (100, 154), (0, 20), (230, 254)):
        a.append(_random_finite(rng, n, lo, hi))
        b.append(_random_finite(rng, n, lo, hi))
        c.append(_random_finite(rng, n, lo, hi))
    # product ~ c: cancellation (c = -fp32(a*b), perturbed by a few ulps)
    aa, bb = _random_finite(rng, n, 100, 154), _random_finite(rng, n, 100, 154)
    prod = (_f32(aa).double() * _f32(bb).double()).float().numpy().view(np.uint32)
    cc = (prod ^ np.uint32(1 << 31)) + rng.integers(-3, 4, n).astype(np.uint32)
    a.append(aa)
    b.append(bb)
    c.append(cc)
    # subnormal c, tiny products (results around and below 2^-126)
    a.append(_random_finite(rng, n, 40, 80))
    b.append(_random_finite(rng, n, 40, 80))
    c.append(rng.integers(0, 1 << 23, n, dtype=np.uint32) | (rng.integers(0, 2, n, dtype=np.uint32)
                                                             << 31))
    # subnormal operands
    a.append(rng.integers(0, 1 << 23, n, dtype=np.uint32))
    b.append(_random_finite(rng, n, 120, 180))
    c.append(_random_finite(rng, n, 0, 30))
    out = [_f32(np.concatenate(x)) for x in (a, b, c)]
    # ties after a float64 sum: a*b = +-ulp(c)/2 * (1 - 2^-2k); naive double rounding fails
    ta, tb, tc = [], [], []
    for k in range(15, 24):
        for cv in (1.0 + 2.0**-23, 1.0, 3.0 - 2.0**-22, 1.5 * 2.0**-100, 2.0**-125 + 2.0**-149):
            half = 2.0 ** (math.frexp(cv)[1] - 1 - 24) if cv >= 2.0**-126 else 2.0**-150
            for sa in (1.0, -1.0):
                for sc in (1.0, -1.0):
                    ta.append(sa * half * (1 + 2.0**-k) * 2.0**60)
                    tb.append((1 - 2.0**-k) * 2.0**-60)
                    tc.append(sc * cv)
    # overflow boundary: the midpoint between the largest finite value and 2^128
    mx = float(np.finfo(np.float32).max)
    ta += [mx, mx, 2.0**64, -(2.0**64), 2.0**127]
    tb += [1.0, -1.0, 2.0**64 * (1 - 2.0**-24), 2.0**64 * (1 - 2.0**-24), 2.0]
    tc += [2.0**103 * (1 - 2.0**-20), -(2.0**103), 2.0**103, -(2.0**103), -(2.0**127)]
    # signed zeros and exact cancellation
    ta += [0.0, -0.0, 0.0, 1.5, -1.5, 2.0**-149]
    tb += [-1.0, 1.0, 1.0, 2.0, 2.0, -(2.0**-149)]
    tc += [-0.0, -0.0, -0.0, -3.0, 3.0, -0.0]
    extra = [torch.tensor(x, dtype=torch.float64).float() for x in (ta, tb, tc)]
    return tuple(torch.cat([o, e]) for o, e in zip(out, extra, strict=True))


def test_fma_f32_matches_exact_rational_arithmetic_bit_for_bit():
    a, b, c = _fma_cases()
    got = fma_f32(a, b, c)
    want = torch.tensor([_fma_exact(x, y, z) for x, y, z in
                         zip(a.tolist(), b.tolist(), c.tolist(), strict=True)],
                        dtype=torch.float64).float()
    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero().flatten()
    assert bad.numel() == 0, [(a[i].item(), b[i].item(), c[i].item(), got[i].item(),
                               want[i].item()) for i in bad[:5]]


def test_fma_f32_fixes_double_rounding_at_ties():
    # exact a*b + c = 1 + 2^-23 + 2^-24 - 2^-70: just below the midpoint, so 1 + 2^-23
    a = torch.tensor(2.0**-24 * (1 + 2.0**-23), dtype=F32)
    b = torch.tensor(1 - 2.0**-23, dtype=F32)
    c = torch.tensor(1 + 2.0**-23, dtype=F32)
    assert (a.double() * b.double() + c.double()).float() == 1 + 2.0**-22  # rounding twice
    assert fma_f32(a, b, c) == 1 + 2.0**-23
    assert fma_f32(a, b, c) != a * b + c  # one rounding is not two


def test_fma_f32_specials():
    inf, nan = math.inf, math.nan
    out = fma_f32(torch.tensor([inf, 0.0, 1.0, inf, 2.0]), torch.tensor([2.0, inf, 1.0, 1.0, 3.0]),
                  torch.tensor([1.0, 1.0, nan, -inf, -inf]))
    assert out[0] == inf and torch.isnan(out[1:4]).all() and out[4] == -inf
    assert fma_f32(2.0**-149, 0.5, 0.0) == 0.0  # a tie at the bottom goes to even (zero)
    assert fma_f32(3 * 2.0**-149, 0.5, 0.0) == 2 * 2.0**-149


# ---------------------------------------------------------------------------------------
# exp2_fma
# ---------------------------------------------------------------------------------------
def test_exp2_fma_within_one_ulp_on_the_softmax_range():
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([torch.linspace(-126, 0, 400_001, dtype=torch.float64).float(),
                   -126 * torch.rand(400_000, generator=gen),
                   -torch.rand(200_000, generator=gen)])
    got = exp2_fma(x)
    exact = torch.exp2(x.double())
    err = (got.double() - exact).abs() / ulp(exact, F32)
    assert float(err.max()) <= 1.0  # the kernel's target is 2 ulp; measured ~0.86


def test_exp2_fma_against_mpmath():
    mpmath.mp.dps = 40
    rng = np.random.default_rng(7)
    xs = np.concatenate([-126 * rng.random(300), -rng.random(100) * 1e-3]).astype(np.float32)
    got = exp2_fma(torch.from_numpy(xs))
    for x, g in zip(xs.tolist(), got.tolist(), strict=True):
        e = mpmath.power(2, mpmath.mpf(x))
        u = float(ulp(torch.tensor(float(e), dtype=torch.float64), F32))
        assert float(abs(mpmath.mpf(g) - e)) <= 1.0 * u, x


def test_exp2_fma_special_values_and_flushing():
    x = torch.tensor([-math.inf, math.inf, math.nan, 0.0, -0.0, 1e-40, -126.0, -126.6, -127.0,
                      -200.0, 127.0, 128.0, 1e30])
    y = exp2_fma(x)
    assert y[0] == 0 and y[0].view(torch.int32) == 0  # +0
    assert y[1] == math.inf and torch.isnan(y[2])
    assert y[3] == 1 and y[4] == 1 and y[5] == 1
    assert y[6] == 2.0**-126 and y[7] == 0 and y[8] == 0 and y[9] == 0
    assert y[10] == 2.0**127 and y[11] == math.inf and y[12] == math.inf
    ints = torch.arange(-126, 128, dtype=F32)
    assert torch.equal(exp2_fma(ints), torch.exp2(ints.double()).float())
    near = torch.linspace(-130, -120, 100_001, dtype=torch.float64).float()
    low = exp2_fma(near)
    assert bool(((low == 0) | (low >= 2.0**-126)).all())  # no subnormal results


def _f32_of_bits(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _exp2_by_the_docstring(x: float) -> float:
    """The documented sequence, step by step in Python scalars (fma from exact rationals)."""
    if x != x:
        return x
    xc = min(max(x, -127.0), 128.0)
    n = float(round(xc))  # Python's round is half to even
    f = xc - n  # exact
    p = _f32_of_bits(COEFFS[-1])
    for bits in reversed(COEFFS[:-1]):
        p = _fma_exact(p, f, _f32_of_bits(bits))
    p = _fma_exact(p, f, 1.0)
    pb = struct.unpack("<I", struct.pack("<f", p))[0]
    e = (pb >> 23) + int(n)
    if e <= 0:
        return 0.0
    if e >= 255:
        return math.inf
    return _f32_of_bits(pb + (int(n) << 23))


def test_exp2_fma_is_the_documented_sequence():
    rng = np.random.default_rng(11)
    xs = np.concatenate([-130 * rng.random(150), rng.random(20) * 130 - 2,
                         [-0.5, 0.5, -1.5, 2.5, -126.5, -127.5, 127.5]]).astype(np.float32)
    got = exp2_fma(torch.from_numpy(xs)).tolist()
    want = [_exp2_by_the_docstring(float(x)) for x in xs]
    assert got == want


# ---------------------------------------------------------------------------------------
# ordered D
# ---------------------------------------------------------------------------------------
def test_exact_delta_is_an_ascending_pairwise_tree():
    vals = [1.0, 2.0**-24, 2.0**-24, 2.0**-24, -1.0, 2.0**-24, 2.0**-24, 2.0**-24, 3.0]
    for d in (8, 9):  # a power of two, and an odd one that carries its last element
        do = torch.tensor(vals[:d], dtype=torch.bfloat16).view(1, 1, 1, d)
        o = torch.ones(1, 1, 1, d, dtype=torch.bfloat16)
        x = [torch.tensor(v, dtype=F32) for v in vals[:d]]
        while len(x) > 1:
            x = [x[m] + x[m + 1] for m in range(0, len(x) - 1, 2)] + x[len(x) // 2 * 2:]
        got = delta(EXACT, o, do)
        assert got.shape == (1, 1, 1) and got.view(torch.int32).item() == x[0].view(
            torch.int32).item()
    # order matters here: left to right loses all three small terms before -1.0 to 1.0
    # (3 * 2^-24), the tree loses one of them (1 + 2^-24 ties to 1)
    assert delta(EXACT, o[..., :8], do[..., :8]).item() == 5 * 2.0**-24


# ---------------------------------------------------------------------------------------
# the backward in exact arithmetic
# ---------------------------------------------------------------------------------------
SHAPES = [  # (B, H, H_kv, S_q, S_k, d, BM, BN)
    (1, 2, 2, 48, 48, 16, 16, 16),
    (1, 4, 2, 37, 70, 16, 16, 16),  # S_q < S_k, ragged tiles, GQA
    (1, 3, 1, 70, 37, 8, 16, 8),  # S_q > S_k: causal rows that see no key; MQA; d, BN < 16
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", ["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_backward_meets_the_bound_against_float64(shape, mask, dtype):
    b, h, hk, sq, sk, d, bm, bn = shape
    p = Problem(b, h, hk, sq, sk, d, mask, bm, bn)
    q, k, v, do = random_inputs(p, dtype, seed=sq * 7 + sk)
    ref = attention_f64(q, k, v, do, causal=mask == "causal")
    for name in ("naive", "symmetric_shift"):
        _, bwd = emulate(build_schedule(p, name, 3), q, k, v, do, arithmetic="exact")
        got = {"dq": bwd.dq, "dk": bwd.dk, "dv": bwd.dv}
        for grad, c in grad_checks(got, ref, dtype).items():
            assert c.ok, f"{name} {grad}: error {c.error:.3e} > allowed {c.allowed:.3e}"


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_exact_replay_of_own_partials_is_bit_exact(name):
    p = Problem(2, 2, 1, 45, 33, 16, "causal", 16, 16)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=5)
    sched = build_schedule(p, name, 3)
    _, bwd = emulate(sched, q, k, v, do, return_partials=True, arithmetic="exact")
    again = replay(sched, bwd.partials, flush_subnormals=True)
    assert torch.equal(again.view(torch.int32), bwd.dq_acc.view(torch.int32))


def test_exact_and_ieee_arithmetic_give_different_bits_and_exact_is_deterministic():
    p = Problem(1, 2, 2, 64, 64, 32, "causal", 16, 16)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=8)
    sched = build_schedule(p, "shift", 4)
    _, ieee = emulate(sched, q, k, v, do)
    _, exa = emulate(sched, q, k, v, do, arithmetic="exact")
    _, exa2 = emulate(sched, q, k, v, do, arithmetic="exact")
    for acc in ("dq_acc", "dk_acc", "dv_acc", "dq", "dk", "dv"):
        assert torch.equal(getattr(exa, acc), getattr(exa2, acc)), acc
    for acc in ("dq_acc", "dk_acc", "dv_acc"):
        assert not torch.equal(getattr(exa, acc), getattr(ieee, acc)), acc


def test_exact_padding_of_head_dim_and_tiles_is_exact():
    """Zero columns in d leave every bit alone: what lets d = 8 stand for the kernel's 16."""
    p8 = Problem(1, 1, 1, 20, 24, 8, "full", 16, 16)
    q, k, v, do = random_inputs(p8, torch.float16, seed=4)
    p16 = Problem(1, 1, 1, 20, 24, 16, "full", 16, 16)

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, torch.zeros_like(t)], -1)

    s8, s16 = build_schedule(p8, "naive", 1), build_schedule(p16, "naive", 1)
    _, b8 = emulate(s8, q, k, v, do, softmax_scale=0.25, arithmetic="exact")
    _, b16 = emulate(s16, pad(q), pad(k), pad(v), pad(do), softmax_scale=0.25,
                     arithmetic="exact")
    for acc in ("dq_acc", "dk_acc", "dv_acc"):
        assert torch.equal(getattr(b8, acc), getattr(b16, acc)[..., :8]), acc


def test_unknown_arithmetic_is_rejected():
    p = Problem(1, 1, 1, 8, 8, 8, "full", 8, 8)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="arithmetic"):
        emulate(build_schedule(p, "naive", 1), q, k, v, do, arithmetic="approx")
