"""The kernel side of :func:`dash_ref.arithmetic.exp2.exp2_fma`: ``2^x`` from fp32 operations only.

A shared Triton helper (as :mod:`dash_cuda.tile_io`): the Triton backward and the small
kernels of :mod:`dash_cuda.prepost` take it in ``exact`` mode.

The backward's ``exact`` mode calls :func:`exp2_fma` instead of ``tl.math.exp2``
(``ex2.approx.ftz.f32``, whose bits no CPU can reproduce). Each line below is one step of
the sequence written down in :mod:`dash_ref.arithmetic.exp2`, in the same order; the coefficients
are read from :data:`dash_ref.arithmetic.exp2.COEFFS`, so there is one copy of them. The steps are
``max.f32``/``min.f32`` (exact), ``cvt.rni`` (exact), ``sub.f32`` (exact here), seven
``fma.rn.f32`` (one rounding each) and integer operations on the bits: nothing a compiler
may contract or reorder, and nothing with ``.ftz`` (kernels in ``exact`` mode are built
with ``enable_fp_fusion=False`` as well, so a multiply and an add are never fused unless a
``tl.fma`` says so).
"""

from __future__ import annotations

import struct

import triton
import triton.language as tl
from triton.language.extra import libdevice

from dash_ref.arithmetic.exp2 import COEFFS


def _f32(bits: int) -> float:
    """The fp32 value of a bit pattern, as the Python float (exact) Triton will splat."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


C1 = tl.constexpr(_f32(COEFFS[0]))
C2 = tl.constexpr(_f32(COEFFS[1]))
C3 = tl.constexpr(_f32(COEFFS[2]))
C4 = tl.constexpr(_f32(COEFFS[3]))
C5 = tl.constexpr(_f32(COEFFS[4]))
C6 = tl.constexpr(_f32(COEFFS[5]))
C7 = tl.constexpr(_f32(COEFFS[6]))


@triton.jit
def exp2_fma(x):
    """``2^x`` for an fp32 tensor, bit for bit :func:`dash_ref.arithmetic.exp2.exp2_fma`."""
    # 1-3: clamp so that n fits an int32 and +-inf become ordinary; split x = n + f
    xc = tl.minimum(tl.maximum(x, -127.0), 128.0)
    n = libdevice.rint(xc)  # nearest integer, ties to even
    f = xc - n  # exact: |f| <= 1/2
    # 4: 2^f on [-1/2, 1/2] by Horner, one rounding per step
    p = tl.fma(C7, f, C6)
    p = tl.fma(p, f, C5)
    p = tl.fma(p, f, C4)
    p = tl.fma(p, f, C3)
    p = tl.fma(p, f, C2)
    p = tl.fma(p, f, C1)
    p = tl.fma(p, f, 1.0)
    # 5-6: scale by 2^n on the exponent bits (exact); below 2^-126 flush to +0, above: +inf
    ni = n.to(tl.int32)
    pb = p.to(tl.int32, bitcast=True)
    e = (pb >> 23) + ni
    out = (pb + (ni << 23)).to(tl.float32, bitcast=True)
    out = tl.where(e <= 0, 0.0, out)
    out = tl.where(e >= 255, float("inf"), out)
    # 7: NaN in, NaN out (max.f32 above replaced it by -127)
    return tl.where(x != x, x, out)


@triton.jit
def _exp2_fma_kernel(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs, mask=offs < N)
    tl.store(Y + offs, exp2_fma(x), mask=offs < N)


def exp2_fma_cuda(x, out=None):
    """:func:`exp2_fma` applied on the GPU to a float32 CUDA tensor.

    The kernel's own ``exp2``, callable from the host, e.g. to compare it with
    :func:`dash_ref.arithmetic.exp2.exp2_fma` on any set of inputs. Writes into ``out`` (contiguous,
    the shape of ``x``) when given, else into a new tensor.
    """
    import torch

    if x.dtype != torch.float32 or x.device.type != "cuda":
        raise TypeError(f"exp2_fma_cuda takes a float32 CUDA tensor, got {x.dtype} on "
                        f"{x.device}")
    x = x.contiguous()
    if out is None:
        out = torch.empty_like(x)
    if out.shape != x.shape or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous float32 tensor shaped like x")
    n = x.numel()
    _exp2_fma_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024, enable_fp_fusion=False)
    return out
