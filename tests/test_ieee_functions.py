"""Specification of the IEEE arithmetic's exp2 and log2: correctly rounded fp32, so that the
IEEE and exact forwards give the same bits on every host (torch's fp32 routines do not)."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from dash_ref.arithmetic.steps import exp2_rn, log2_rn

F32 = torch.float32


def _nearest_f32(value: mpmath.mpf) -> np.float32:
    """The fp32 nearest to ``value`` (a transcendental value is never a tie)."""
    guess = np.float32(float(value))
    candidates = (np.nextafter(guess, np.float32(-np.inf)), guess,
                  np.nextafter(guess, np.float32(np.inf)))
    return min(candidates, key=lambda c: abs(mpmath.mpf(float(c)) - value))


def _fp32_samples(low: float, high: float, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=gen, dtype=torch.float64) * (high - low) + low).to(F32)


def _mp_exp2(v):
    return mpmath.power(2, v)


def _mp_log2(v):
    return mpmath.log(v, 2)


@pytest.mark.parametrize("fn, mp_fn, x", [
    (exp2_rn, _mp_exp2, _fp32_samples(-125.0, 127.0, 3000, 1)),
    (exp2_rn, _mp_exp2, _fp32_samples(-1.0, 0.0, 3000, 2)),  # P's range
    (log2_rn, _mp_log2, exp2_rn(_fp32_samples(-120.0, 120.0, 3000, 3))),  # every binade
    (log2_rn, _mp_log2, _fp32_samples(1.0, 4096.0, 3000, 4)),  # a row sum's range
], ids=["exp2", "exp2_unit", "log2", "log2_rowsum"])
def test_the_ieee_exp2_and_log2_are_correctly_rounded(fn, mp_fn, x):
    got = fn(x)
    assert got.dtype == F32
    with mpmath.workprec(120):
        want = [_nearest_f32(mp_fn(mpmath.mpf(float(v)))) for v in x.tolist()]
    assert torch.equal(got, torch.tensor(np.array(want, dtype=np.float32)))


def test_exact_values_and_limits():
    x = torch.tensor([0.0, -0.0, 1.0, -3.0, 10.0, -float("inf"), float("inf"), -200.0],
                     dtype=F32)
    want = torch.tensor([1.0, 1.0, 2.0, 0.125, 1024.0, 0.0, float("inf"), 0.0], dtype=F32)
    assert torch.equal(exp2_rn(x), want)
    y = torch.tensor([1.0, 2.0, 0.5, 2.0 ** -140, 0.0, float("inf")], dtype=F32)
    assert torch.equal(log2_rn(y), torch.tensor([0.0, 1.0, -1.0, -140.0, -float("inf"),
                                                 float("inf")], dtype=F32))
    assert torch.isnan(log2_rn(torch.tensor([-1.0, float("nan")]))).all()
