"""A software ``exp2`` for fp32 that a GPU kernel and the CPU compute to the same bits.

``ex2.approx.ftz.f32`` (what ``tl.math.exp2`` becomes on sm_90) is an undocumented
approximation, so an emulator cannot reproduce its bits. :func:`exp2_fma` replaces it in the
backward's ``exact`` arithmetic: every step is an fp32 operation with one defined rounding
(or none), so a kernel that issues the same operations in the same order gets the same
bits. Its kernel twin is ``dash_cuda.exp2.exp2_fma``; on an H200 the two
agree bit for bit on 1.3 million inputs across the whole range, specials included
(``tests/gpu/test_cuda_exact.py``). The steps, for an fp32 input ``x``:

1. ``xc = min(max(x, -127.0), 128.0)`` (``max.f32``, ``min.f32``; exact). Clamping keeps
   ``n`` below in int32 range and makes ``-inf`` and ``+inf`` ordinary; a NaN is handled
   in step 7 (``max.f32`` would replace it by ``-127``).
2. ``n = rint(xc)``: nearest integer, ties to even (``cvt.rni.f32.f32``; Triton
   ``libdevice.rint``; exact).
3. ``f = xc - n`` (``sub.f32``): exact, ``|f| <= 1/2``.
4. Horner with fused multiply-adds (``fma.rn.f32``; ``tl.fma``), from :data:`COEFFS`
   (fp32 bit patterns, Taylor coefficients ``ln(2)^k / k!`` rounded to fp32):
   ``p = C7; p = fma(p, f, C6); p = fma(p, f, C5); ...; p = fma(p, f, C1);
   p = fma(p, f, 1.0)``. ``p`` is in ``[0.70, 1.42]``; no intermediate is subnormal
   unless ``f`` is, and then ``p == 1.0`` with or without flushing.
5. ``ni = int32(n)`` (``cvt.rzi.s32.f32``; exact), ``e = (bits(p) >> 23) + ni``, the
   biased exponent of ``p * 2^n``.
6. ``e <= 0``: ``+0`` (the result would be below ``2^-126``: flushed, as ``.ftz`` does);
   ``e >= 255``: ``+inf``; otherwise ``bits(p) + (ni << 23)`` reinterpreted as fp32
   (exact scaling by ``2^n``).
7. ``x != x`` (NaN): the result is ``x``.

Hence ``exp2(-inf) = +0``, ``exp2(+inf) = +inf``, ``exp2(k) = 2^k`` exactly for integers
``k`` in ``[-126, 127]`` (``f = 0`` gives ``p = 1``), results below ``2^-126`` are ``+0``
(where the exact value is just below ``2^-126`` but ``p`` rounds up to ``1.0`` the result
is ``2^-126``), and inputs ``>= 128`` give ``+inf``. Measured error on ``[-126, 0]``
(tests): below 1 ulp of fp32, against float64 ``exp2``.
"""

from __future__ import annotations

import torch

from .numerics import bits_f32, f32_bits, fma_f32

__all__ = ["COEFFS", "exp2_fma"]

#: fp32 bit patterns of ``C1 .. C7``, ``Ck = fp32(ln(2)^k / k!)``.
COEFFS: tuple[int, ...] = (
    0x3F317218,  # ln2        0.693147182464599609375
    0x3E75FDF0,  # ln2^2/2    0.24022650718688964844
    0x3D635847,  # ln2^3/6    0.055504109710454940796
    0x3C1D955B,  # ln2^4/24   0.0096181286498904228210
    0x3AAEC3FF,  # ln2^5/120  0.0013333557872101664543
    0x39218489,  # ln2^6/720  0.00015403529687318950891
    0x377FE5FE,  # ln2^7/5040 0.000015252733646775595844
)

_F32 = torch.float32


def _coeff(bits: int) -> torch.Tensor:
    return bits_f32(torch.tensor(bits, dtype=torch.int64))


def exp2_fma(x: torch.Tensor) -> torch.Tensor:
    """``2^x`` for fp32 ``x``, by the fixed sequence of fp32 operations in the module docstring."""
    if x.dtype != _F32:
        raise TypeError(f"exp2_fma takes float32, got {x.dtype}")
    xc = x.clamp(min=-127.0, max=128.0)  # NaN stays NaN here; step 7 restores it anyway
    n = torch.round(xc)  # half to even, like cvt.rni
    f = xc - n
    p = _coeff(COEFFS[-1]).expand_as(f)
    for bits in reversed(COEFFS[:-1]):
        p = fma_f32(p, f, _coeff(bits))
    p = fma_f32(p, f, torch.ones((), dtype=_F32))
    ni = torch.nan_to_num(n).to(torch.int32)
    pb = f32_bits(p.contiguous())
    e = (pb >> 23) + ni
    out = bits_f32(pb + (ni << 23))
    out = torch.where(e <= 0, torch.zeros((), dtype=_F32), out)
    out = torch.where(e >= 255, torch.full((), float("inf"), dtype=_F32), out)
    return torch.where(torch.isnan(x), x, out)
