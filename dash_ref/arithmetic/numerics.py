"""Exact rounding helpers on raw bits: the arithmetic contract of the emulator, written down.

Everything here works on whole tensors with integer bit arithmetic (``torch.int64``), never
with per-element Python loops, and never relies on the host's floating-point rounding
except where a function says so (:func:`fp32_add_rne`).

Formats (``p`` = stored fraction bits, ``u = 2**-(p+1)`` the unit roundoff)::

    dtype      bits  exp  p   bias  min normal  min subnormal  max finite          u
    bfloat16    16    8   7   127   2**-126     2**-133        (2-2**-7)  * 2**127  2**-8
    float16     16    5  10    15   2**-14      2**-24         (2-2**-10) * 2**15   2**-11
    float32     32    8  23   127   2**-126     2**-149        (2-2**-23) * 2**127  2**-24
    float64     64   11  52  1023   2**-1022    2**-1074       (2-2**-52) * 2**1023 2**-53

Bit views
    :func:`f32_bits` / :func:`bits_f32` (float32 <-> int32), :func:`bf16_bits` /
    :func:`bits_bf16` and :func:`fp16_bits` / :func:`bits_fp16` (<-> int16), and the generic
    :func:`float_bits` / :func:`bits_float`. Views reinterpret memory; nothing is rounded.

Rounding fp32 to bf16/fp16 (:func:`round_f32_to`)
    The fp32 input is exact; the result is the target value chosen by the rounding rule:

    - ``"rne"`` (round to nearest, ties to even): the representable value nearest to ``x``;
      on a tie (``x`` exactly halfway between two neighbours) the one whose last fraction
      bit is 0. Magnitudes at or above ``max_finite + ulp(max_finite) / 2`` (the midpoint
      to the next binade, which is a tie that goes to the even neighbour ``2**(emax+1)``)
      become infinity. This is what ``Tensor.to(torch.bfloat16 / torch.float16)`` does.
    - ``"rtz"`` (round toward zero, truncation): the representable value of largest
      magnitude not above ``|x|``, with the sign of ``x``; finite inputs never become
      infinite (they saturate at ``max_finite``).

    Both rules keep the sign (``-0.0`` stays ``-0.0``, a negative value that rounds to zero
    gives ``-0.0``), produce subnormal results of the target format when ``|x|`` is below
    its min normal (gradual underflow), map ``+-inf`` to ``+-inf``, and map every NaN (quiet
    or signalling, any payload) to the canonical quiet NaN of the target (``0x7FC0`` for
    bf16, ``0x7E00`` for fp16). With ``flush_subnormals=True`` an fp32 subnormal input is
    first replaced by a zero of the same sign, and a result that is subnormal *after*
    rounding becomes a zero of the same sign (a value that rounds up to the min normal is
    kept): the flush-to-zero behaviour of the ``.ftz`` instruction variants.

ULPs (:func:`ulp`, :func:`ulp_distance`, :func:`ulp_error`)
    ``ulp(x, dtype)`` is the spacing of the format's numbers in the binade of ``|x|``:
    ``2**(e - p)`` for ``2**e <= |x| < 2**(e+1)`` with ``e >= emin``, and the subnormal
    spacing ``2**(emin - p)`` for ``|x| < 2**emin`` (including zero). At a power of two the
    spacing *above* it is used. Beyond ``max_finite`` the formula continues unchanged.
    ``ulp_distance(a, b)`` counts steps between two values of the format: the bits are
    mapped to ordered integers (``+m`` for sign 0, ``-m`` for sign 1, ``m`` the magnitude
    bits), so ``+0`` and ``-0`` are both 0, adjacent values are 1 apart and infinity is one
    step beyond ``max_finite``. A pair with a NaN gives :data:`NAN_DISTANCE` (``-1``).
    ``ulp_error(x, exact)`` is ``|x - exact| / ulp(exact)`` in float64: 0.5 at most for a
    correctly rounded (RNE) result, below 1 for a faithful one.

fp32 accumulation (:func:`fp32_add_rne`, :func:`flush_subnormals_f32`)
    The dQ accumulation of the backward is a sequence of fp32 additions in a fixed order.
    The contract is IEEE 754 binary32 addition, round to nearest even, subnormal inputs
    and results kept (gradual underflow); that is what a float32 ``+`` on PyTorch's CPU
    does as long as ``torch.set_flush_denormal(False)`` (the default) is in effect, which
    :func:`cpu_keeps_subnormals` checks. Global fp32 atomics on NVIDIA GPUs flush
    subnormal inputs and results to zero instead; ``fp32_add_rne(..., flush_subnormals=True)``
    models that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "NAN_DISTANCE",
    "FloatFormat",
    "bf16_bits",
    "bits_bf16",
    "bits_f32",
    "bits_float",
    "bits_fp16",
    "cpu_keeps_subnormals",
    "f32_bits",
    "float_bits",
    "float_format",
    "flush_subnormals_f32",
    "fp16_bits",
    "fma_f32",
    "fp32_add_rne",
    "round_f32_to",
    "ulp",
    "ulp_distance",
    "ulp_error",
    "unit_roundoff",
]

#: What :func:`ulp_distance` returns for a pair in which either value is NaN.
NAN_DISTANCE = -1

ROUNDINGS = ("rne", "rtz")


@dataclass(frozen=True)
class FloatFormat:
    """Parameters of a binary floating-point format (``p`` = stored fraction bits)."""

    dtype: torch.dtype
    int_dtype: torch.dtype
    bits: int
    exp_bits: int
    frac_bits: int

    @property
    def bias(self) -> int:
        """Exponent bias ``2**(exp_bits-1) - 1``."""
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number, ``1 - bias``."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number, ``bias``."""
        return self.bias

    @property
    def inf_bits(self) -> int:
        """Magnitude bits of infinity (all exponent bits set, fraction 0)."""
        return ((1 << self.exp_bits) - 1) << self.frac_bits

    @property
    def qnan_bits(self) -> int:
        """Bits of the canonical quiet NaN (positive, top fraction bit set)."""
        return self.inf_bits | (1 << (self.frac_bits - 1))

    @property
    def max_finite(self) -> float:
        """Largest finite value, ``(2 - 2**-p) * 2**emax``."""
        return (2.0 - 2.0**-self.frac_bits) * 2.0**self.emax

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, ``2**emin``."""
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        """Smallest positive subnormal value, ``2**(emin - p)``."""
        return 2.0 ** (self.emin - self.frac_bits)


_FORMATS = {
    torch.float64: FloatFormat(torch.float64, torch.int64, 64, 11, 52),
    torch.float32: FloatFormat(torch.float32, torch.int32, 32, 8, 23),
    torch.bfloat16: FloatFormat(torch.bfloat16, torch.int16, 16, 8, 7),
    torch.float16: FloatFormat(torch.float16, torch.int16, 16, 5, 10),
}


def float_format(dtype: torch.dtype) -> FloatFormat:
    """The :class:`FloatFormat` of ``dtype`` (float64, float32, bfloat16 or float16)."""
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise TypeError(f"unsupported floating-point dtype {dtype}") from None


def unit_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff ``u = 2**-(p+1)``: bound on the relative error of one RNE rounding."""
    return 2.0 ** -(float_format(dtype).frac_bits + 1)


# -- bit views --------------------------------------------------------------------------
def float_bits(x: torch.Tensor) -> torch.Tensor:
    """Reinterpret a float tensor as the signed integer of its width (no rounding)."""
    fmt = float_format(x.dtype)
    return x.view(fmt.int_dtype)


def bits_float(u: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret integer bits as ``dtype``; wider integers are taken modulo ``2**bits``."""
    fmt = float_format(dtype)
    if u.is_floating_point() or u.is_complex() or u.dtype == torch.bool:
        raise TypeError(f"expected an integer tensor, got {u.dtype}")
    if u.element_size() * 8 == fmt.bits and u.dtype != fmt.int_dtype:
        u = u.view(fmt.int_dtype)  # e.g. uint16 / uint32 of the right width
    if u.dtype != fmt.int_dtype:
        if fmt.bits == 64:
            u = u.to(torch.int64)
        else:
            w = u.to(torch.int64) & ((1 << fmt.bits) - 1)
            u = torch.where(w >= (1 << (fmt.bits - 1)), w - (1 << fmt.bits), w)
            u = u.to(fmt.int_dtype)
    return u.view(dtype)


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int32 bit pattern."""
    _expect(x, torch.float32)
    return x.view(torch.int32)


def bits_f32(u: torch.Tensor) -> torch.Tensor:
    """int32 (or uint32 / int64 taken modulo 2**32) bit pattern -> float32."""
    return bits_float(u, torch.float32)


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """bfloat16 -> int16 bit pattern."""
    _expect(x, torch.bfloat16)
    return x.view(torch.int16)


def bits_bf16(u: torch.Tensor) -> torch.Tensor:
    """int16 (or wider, taken modulo 2**16) bit pattern -> bfloat16."""
    return bits_float(u, torch.bfloat16)


def fp16_bits(x: torch.Tensor) -> torch.Tensor:
    """float16 -> int16 bit pattern."""
    _expect(x, torch.float16)
    return x.view(torch.int16)


def bits_fp16(u: torch.Tensor) -> torch.Tensor:
    """int16 (or wider, taken modulo 2**16) bit pattern -> float16."""
    return bits_float(u, torch.float16)


def _expect(x: torch.Tensor, dtype: torch.dtype) -> None:
    if x.dtype != dtype:
        raise TypeError(f"expected a {dtype} tensor, got {x.dtype}")


def _unsigned_bits(x: torch.Tensor) -> torch.Tensor:
    """Bits of a 16- or 32-bit float as a non-negative int64."""
    fmt = float_format(x.dtype)
    return x.view(fmt.int_dtype).to(torch.int64) & ((1 << fmt.bits) - 1)


# -- rounding ---------------------------------------------------------------------------
def round_f32_to(
    x: torch.Tensor,
    dtype: torch.dtype,
    rounding: str = "rne",
    flush_subnormals: bool = False,
) -> torch.Tensor:
    """Round float32 ``x`` to bfloat16 or float16 on raw bits (rules in the module docstring).

    ``rounding`` is ``"rne"`` (round to nearest, ties to even; bit-identical to
    ``x.to(dtype)`` except for NaN payloads) or ``"rtz"`` (toward zero). With
    ``flush_subnormals`` subnormal inputs and subnormal results become signed zeros.
    """
    _expect(x, torch.float32)
    if dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"round_f32_to targets bfloat16 or float16, got {dtype}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    fmt = float_format(dtype)
    p = fmt.frac_bits

    u = _unsigned_bits(x)
    sign = u >> 31
    a = u & 0x7FFFFFFF
    e32 = a >> 23
    frac = a & 0x7FFFFF
    if flush_subnormals:
        frac = torch.where(e32 == 0, torch.zeros_like(frac), frac)
    # |x| = sig * 2**(e_eff - 150), sig including the implicit bit for normal inputs.
    sig = torch.where(e32 > 0, frac | (1 << 23), frac)
    e_eff = e32.clamp(min=1)
    # Biased target exponent if the result is normal; below 1 the result is subnormal and
    # is counted in units of the target's subnormal spacing, i.e. shifted further right.
    et = e_eff - 127 + fmt.bias
    shift = ((23 - p) + (1 - et).clamp(min=0)).clamp(max=40)  # sig < 2**24: >= 25 is all gone
    q = sig >> shift
    if rounding == "rne":
        rem = sig & ((torch.ones_like(shift) << shift) - 1)
        half = torch.ones_like(shift) << (shift - 1)
        q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(torch.int64)
    # A carry out of the fraction (q == 2**(p+1), or 2**p from the subnormal range) moves
    # into the exponent field by itself.
    mag = ((et - 1).clamp(min=0) << p) + q
    overflow_to = fmt.inf_bits if rounding == "rne" else fmt.inf_bits - 1
    mag = torch.where(mag >= fmt.inf_bits, torch.full_like(mag, overflow_to), mag)
    mag = torch.where(a == 0x7F800000, torch.full_like(mag, fmt.inf_bits), mag)
    if flush_subnormals:
        mag = torch.where(mag < (1 << p), torch.zeros_like(mag), mag)
    out = (sign << 15) | mag
    out = torch.where(a > 0x7F800000, torch.full_like(out, fmt.qnan_bits), out)
    return bits_float(out, dtype)


def flush_subnormals_f32(x: torch.Tensor) -> torch.Tensor:
    """Replace every float32 subnormal in ``x`` by a zero of the same sign (bits only)."""
    b = f32_bits(x)
    sign_only = b & torch.tensor(-(1 << 31), dtype=torch.int32)
    return bits_f32(torch.where((b & 0x7F800000) == 0, sign_only, b))


def fp32_add_rne(a: torch.Tensor, b: torch.Tensor, flush_subnormals: bool = False) -> torch.Tensor:
    """IEEE binary32 ``a + b``, round to nearest even, the dQ accumulation step.

    This is PyTorch's own float32 addition: on the CPU it is IEEE round-to-nearest-even with
    subnormal inputs and results kept, provided flush-denormal mode is off (the default;
    see :func:`cpu_keeps_subnormals`). ``flush_subnormals=True`` models NVIDIA global fp32
    atomics, which flush subnormal inputs and results to signed zero.
    """
    _expect(a, torch.float32)
    _expect(b, torch.float32)
    if not flush_subnormals:
        return a + b
    return flush_subnormals_f32(flush_subnormals_f32(a) + flush_subnormals_f32(b))


def cpu_keeps_subnormals() -> bool:
    """True if float32 arithmetic on the CPU currently produces subnormals (no FTZ/DAZ)."""
    tiny = torch.tensor([2.0**-126, 2.0**-140], dtype=torch.float32)
    r = tiny * torch.tensor([0.5, 1.0], dtype=torch.float32)
    return bool(r[0] == 2.0**-127) and bool(r[1] != 0)


# -- ULPs -------------------------------------------------------------------------------
def _pow2_f64(k: torch.Tensor) -> torch.Tensor:
    """Exact ``2.0**k`` in float64 for integer ``k`` in [-1074, 1023], built from bits."""
    normal = (k + 1023).clamp(min=0) << 52
    sub = torch.ones_like(k) << (k + 1074).clamp(min=0, max=51)
    return torch.where(k >= -1022, normal, sub).view(torch.float64)


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` in the binade of ``|x|`` (float64; subnormal spacing near zero).

    ``x`` is any real tensor, read as float64. inf gives inf, NaN gives NaN.
    """
    fmt = float_format(dtype)
    ax = x.detach().to(torch.float64).abs()
    _, e = torch.frexp(ax)  # ax = m * 2**e with 0.5 <= m < 1, so 2**(e-1) <= ax < 2**e
    e = e.to(torch.int64) - 1
    e = torch.where(ax == 0, torch.full_like(e, fmt.emin), e.clamp(min=fmt.emin))
    out = _pow2_f64((e - fmt.frac_bits).clamp(min=-1074, max=1023))
    out = torch.where(torch.isinf(ax), ax, out)
    return torch.where(torch.isnan(ax), ax, out)


def _exactly_as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if x.dtype == dtype:
        return x
    y = x.to(dtype)
    back = y.to(x.dtype)
    if not bool(((back == x) | (torch.isnan(x) & torch.isnan(back))).all()):
        raise ValueError(f"values are not exactly representable in {dtype}")
    return y


def ulp_distance(
    a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Number of steps between ``a`` and ``b`` among the values of ``dtype`` (int64).

    ``dtype`` defaults to ``a.dtype`` (bfloat16, float16 or float32); inputs of another
    dtype must be exactly representable in it (else ``ValueError``). ``+0`` and ``-0`` are
    the same point; infinity is one step beyond ``max_finite``; a pair involving a NaN gives
    :data:`NAN_DISTANCE`. The result is symmetric and additive along the number line.
    """
    dtype = a.dtype if dtype is None else dtype
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"ulp_distance supports bfloat16, float16 and float32, got {dtype}")
    a = _exactly_as(a, dtype)
    b = _exactly_as(b, dtype)
    a, b = torch.broadcast_tensors(a, b)
    fmt = float_format(dtype)
    mask = (1 << (fmt.bits - 1)) - 1

    def ordered(v: torch.Tensor) -> torch.Tensor:
        w = _unsigned_bits(v)
        m = w & mask
        return torch.where((w >> (fmt.bits - 1)) == 1, -m, m)

    d = (ordered(a) - ordered(b)).abs()
    nan = torch.isnan(a) | torch.isnan(b)
    return torch.where(nan, torch.full_like(d, NAN_DISTANCE), d)


def ulp_error(x: torch.Tensor, exact_f64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Elementwise ``|x - exact| / ulp(exact, dtype)`` in float64."""
    exact = exact_f64.detach().to(torch.float64)
    diff = (x.detach().to(torch.float64) - exact).abs()
    return diff / ulp(exact, dtype)


# -- fused multiply-add -----------------------------------------------------------------
def fma_f32(a: torch.Tensor | float, b: torch.Tensor | float, c: torch.Tensor | float
            ) -> torch.Tensor:
    """IEEE binary32 ``a * b + c`` with one round to nearest even (``fma.rn.f32``), elementwise.

    Inputs broadcast; Python floats must be exact fp32 values. Subnormal inputs and results
    are kept (no ``.ftz``); an exact zero result is ``+0`` unless ``a * b`` and ``c`` are
    both ``-0`` (IEEE); infinities behave as IEEE says; a NaN result is some NaN (the GPU
    writes ``0x7FFFFFFF``, the CPU need not).

    Method: ``a * b`` is exact in float64 (48 significand bits, exponents in [-298, 256]);
    ``s = fl64(a*b + c)`` and its error ``t`` come from an error-free TwoSum, so the exact
    sum is ``s + t``. Rounding ``s`` to fp32 is correct except when ``s`` lies exactly
    halfway between two fp32 neighbours (fp32 midpoints are float64 values, so ``s`` cannot
    lie across one from the exact sum); there, a nonzero ``t`` decides the side.
    """
    a, b, c = (x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)
               for x in (a, b, c))
    for x in (a, b, c):
        _expect(x, torch.float32)
    a, b, c = torch.broadcast_tensors(a, b, c)
    p = a.double() * b.double()
    c64 = c.double()
    s = p + c64
    bb = s - p  # TwoSum (Knuth): t = (p - (s - bb)) + (c - bb), exact without overflow
    t = (p - (s - bb)) + (c64 - bb)
    t = torch.where(torch.isfinite(s), t, torch.zeros_like(t))
    r = s.to(torch.float32)
    # an fp32 overflow is "rounding to 2^128"; treat it as that virtual neighbour
    big = torch.tensor(2.0**128, dtype=torch.float64)
    r64 = torch.where(torch.isinf(r) & torch.isfinite(s), torch.copysign(big, s), r.double())
    d = s - r64  # exact: r is the fp32 value nearest to s
    toward = torch.where(d > 0, torch.tensor(math.inf), torch.tensor(-math.inf)).float()
    other = torch.nextafter(r, toward)  # the fp32 neighbour on the other side of s
    tie = (d != 0) & ((r64 + other.double()) * 0.5 == s)
    flip = tie & (t != 0) & ((t > 0) == (d > 0))
    return torch.where(flip, other, r)
