"""A bit-exact CPU model of Hopper tensor-core arithmetic (bf16/fp16 inputs, fp32 accumulate).

One tensor-core step with ``K = 16`` (``wgmma.m64nNk16`` or ``mma.sync.m16n8k16`` on sm_90)
computes every output element as **one fused sum** of its 16 exact products and the fp32
accumulator ``C``:

1. *Decode.* Every input is ``s * 2^e`` with an integer significand.  A normal bf16/fp16
   value has ``e`` = its unbiased exponent and ``1 <= s < 2``; a subnormal keeps the
   format's minimum exponent (bf16 ``-126``, fp16 ``-14``) and ``s < 1``.  ``C`` decodes
   the same way as fp32 (subnormals at ``-126``).
2. *Exact products.* ``a_k * b_k = (s_a s_b) * 2^(e_a + e_b)``, kept exactly: the product
   significand lies in ``[0, 4)`` (up to 16 bits for bf16, 22 for fp16) and the product
   exponent is the plain sum ``e_a + e_b``; products are *not* renormalised.
3. *Alignment.* ``E = max`` of the exponents of the nonzero products and of a nonzero
   ``C`` (``C`` takes part), and of ``-133`` (:data:`MIN_ALIGN_EXPONENT`): a zero product
   (``0 * x`` for any finite ``x``) and a zero ``C`` take no part (:data:`ZERO_EXPONENT`),
   and ``E`` never drops below ``-133``, however small the terms.  Every term is scaled to
   ``2^E`` and cut to :data:`FRACTION_BITS` ``= 25`` fractional bits, i.e. to a multiple of
   ``2^(E - 25)`` (at least ``2^-158``), by truncating its magnitude (toward zero, sign
   kept).  Bits shifted out are lost; a term ``2^(E - 26)`` or smaller vanishes.
4. *Sum.* The 17 truncated terms are added exactly (no bit is lost at the top: the sum may
   carry into higher binades).
5. *Normalise and round.* The sum is normalised and rounded **toward zero** into fp32
   (:data:`FINAL_ROUNDING`), with gradual underflow (fp32 subnormal results exist, on the
   ``2^-149`` grid).  A result beyond the fp32 range becomes ``±inf``.  A zero result is
   ``+0``: an exact zero whatever the signs of the zero terms, and a nonzero sum below
   ``2^-149`` that rounds to zero whatever its sign (:data:`ROUNDED_ZERO`).
6. *Specials.* NaN anywhere, ``0 * inf``, or ``+inf`` meeting ``-inf`` gives the canonical
   NaN ``0x7FFFFFFF`` (:data:`NAN_BITS`); otherwise an infinite product or ``C`` gives that
   infinity.  Finite products never overflow (the products of two bf16 values are exact, up
   to ``2^256``); only the final result can.

A product with ``K > 16`` is a *chain* of such steps: ``tl.dot`` on Hopper issues one k16
instruction per 16 columns of ``A`` in ascending ``k``, each taking the previous result as
its ``C`` (:func:`mma`; the step and the order are explicit parameters).  Triton's lowering
shows it: ``mma.sync.m16n8k16`` (tiles too small for wgmma) in a loop over ``k`` updating the
accumulator registers, ``wgmma.m64nNk16`` in ascending ``k`` with the running accumulator.
When the accumulator is a zero constant, the first ``wgmma`` runs without ``C``; since a
zero ``C`` takes no part in the maximum, that equals a ``+0`` term
(:attr:`MMAConfig.empty_accumulator` only matters for readings that let zeros in).

Sources.  The parameters are those of two published, hardware-validated models:

* P. Xie, Y. Wang, F. Yang, M. Yang, "MMA-Sim: Bit-Accurate Reference Model of Tensor Cores
  and Matrix Cores", arXiv:2511.10909 (2025), code github.com/microsoft/MMA-Sim: Hopper
  ``wgmma``/``mma`` with f16/bf16 inputs and f32 output is one truncated fused dot-add over
  the instruction's whole ``K`` with 25 fractional bits, products at exponent
  ``e_a + e_b``, sign-magnitude truncation of each aligned term, round-toward-zero
  conversion to fp32 with subnormal output, zero operands at exponent ``-126``, canonical
  NaN ``0x7FFFFFFF``.
* F. A. Khattak, M. Mikaitis, "Accurate Models of NVIDIA Tensor Cores", arXiv:2512.07004
  (2025), code github.com/north-numerical-computing/MATLAB-tensor-core: H100 fp16/bf16 to
  fp32 as a 16-term fused multiply-add with 2 extra alignment bits beyond fp32's 23 (= 25
  fractional bits), unnormalised products, truncated alignment, final round-toward-zero,
  subnormal inputs and outputs supported.

The two models agree on everything above except where exponents come from zero terms:
Khattak and Mikaitis leave zero products and a zero ``C`` out of the maximum and floor it at
``-133``; MMA-Sim lets them in at ``-126`` (:data:`MMA_SIM`).  The difference shows only
when a zero meets a huge partner (bf16 ``0 * 2^127`` has exponent ``+1``) or when every term
is below ``2^-126``.

Measurement.  ``scripts/validate_mma.py`` compared the model with ``tl.dot`` on an H200
(``benchmarks/results/mma_validation/``; ``mma.sync.m16n8k16`` for 16x16 tiles,
``wgmma.m64nNk16`` for 64-row tiles, with and without a loaded ``C``): fp16 matched every
output under both readings, which agree on that test set; for bf16 the MMA-Sim reading missed
tens of thousands of outputs with products below the fp32 range.  Zeros left out with
``E >= -133`` explained all but the outputs where a negative sum rounds to zero: the
hardware writes ``+0`` there (1093 of 2.6 million outputs for ``mma.sync`` with ``C``, 4222
without, 2 of a million for ``wgmma`` without ``C``).  With that, the rules above reproduce
every output recorded in ``mismatches.txt``, for both instructions, and for every kernel
every alternative's mismatch count recomputed against them equals the count measured;
floors of ``-131``, ``-132``, ``-134``, ``-135`` or none do not.  ``mma.sync`` and ``wgmma``
follow the same rules.  fp16 products can neither underflow nor lose to a zero's exponent
unless every product is zero, so for fp16 the two readings differ only when all products
are zero and a small normal ``C`` faces a zero times a large partner (the ``zero_huge``
family holds such outputs for the next run). ``scripts/validate_wgmma.py`` ran the same
families through the ``wgmma`` forms of the CuTe kernels (A from registers or shared
memory, K- or MN-major operands, N = 48, 64, 96 and 128): no mismatch in 230,129,664 outputs
(``benchmarks/results/mma_validation/wgmma/``).  :data:`CANDIDATES` names the readings and the
other alternatives the script scores.

Everything is vectorised NumPy ``int64`` arithmetic on the raw bit patterns: significands
of at most 24 bits, alignment shifts saturated at 63, and sums below ``2^33``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

__all__ = [
    "ALIGN_ROUNDING",
    "CANDIDATES",
    "FINAL_ROUNDING",
    "FRACTION_BITS",
    "HOPPER",
    "K_STEP",
    "MIN_ALIGN_EXPONENT",
    "MMA_SIM",
    "NAN_BITS",
    "ROUNDED_ZERO",
    "ZERO_EXPONENT",
    "MMAConfig",
    "fused_dot_add_bits",
    "mma",
    "mma_bits",
    "mma_k16",
]

#: Fractional bits kept, relative to the largest term exponent, when terms are aligned.
FRACTION_BITS = 25
#: How an aligned term loses the bits beyond :data:`FRACTION_BITS`: ``"rz"`` truncates the
#: magnitude (sign kept); ``"rd"`` would floor the signed value (two's complement).
ALIGN_ROUNDING = "rz"
#: Rounding of the normalised sum into fp32: ``"rz"`` (toward zero) or ``"rne"``.
FINAL_ROUNDING = "rz"
#: Exponent a zero term brings to the maximum: ``"exclude"`` (zero products and a zero ``C``
#: do not take part), ``"fp32_min"`` (a zero operand or ``C`` counts as ``-126``, MMA-Sim's
#: reading), or ``"format_min"`` (a zero operand counts as its own format's minimum
#: exponent, ``-14`` for fp16).
ZERO_EXPONENT = "exclude"
#: Lower bound on the alignment exponent ``E`` (``None``: no bound beyond the terms').
MIN_ALIGN_EXPONENT: int | None = -133
#: Sign of a nonzero sum that rounds to zero: ``"positive"`` (``+0``) or ``"signed"``
#: (``-0`` for a negative sum, as IEEE round-toward-zero would give).
ROUNDED_ZERO = "positive"
#: Columns of ``A`` per tensor-core instruction for bf16/fp16 on Hopper.
K_STEP = 16
#: Bits of the NaN the tensor core writes.
NAN_BITS = 0x7FFFFFFF

_NEG = -(1 << 20)  # exponent of a term that takes no part in the maximum
_CHUNK_TERMS = 1 << 21  # products materialised at once


@dataclass(frozen=True)
class MMAConfig:
    """The parameters of one k-step; :data:`HOPPER` is the model, the rest are alternatives."""

    fraction_bits: int = FRACTION_BITS
    align_rounding: str = ALIGN_ROUNDING
    final_rounding: str = FINAL_ROUNDING
    zero_exponent: str = ZERO_EXPONENT
    min_align_exponent: int | None = MIN_ALIGN_EXPONENT
    normalise_subnormal_inputs: bool = False  # True: a subnormal input is renormalised first
    overflow: str = "inf"  # "inf" or "saturate" (largest finite fp32, as IEEE RZ would)
    empty_accumulator: str = "zero"  # c=None: "zero" (a +0 C term) or "absent" (no C term)
    exact_zero: str = "positive"  # "positive" (+0 always) or "ieee" (-0 iff all terms are -0)
    rounded_zero: str = ROUNDED_ZERO  # a nonzero sum rounded to 0: "positive" or "signed"
    nan_bits: int = NAN_BITS

    def __post_init__(self) -> None:
        checks = {
            "align_rounding": (self.align_rounding, ("rz", "rd")),
            "final_rounding": (self.final_rounding, ("rz", "rne")),
            "zero_exponent": (self.zero_exponent, ("fp32_min", "format_min", "exclude")),
            "overflow": (self.overflow, ("inf", "saturate")),
            "exact_zero": (self.exact_zero, ("positive", "ieee")),
            "empty_accumulator": (self.empty_accumulator, ("zero", "absent")),
            "rounded_zero": (self.rounded_zero, ("signed", "positive")),
        }
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"{name}={value!r}: expected one of {allowed}")
        if not 0 <= self.fraction_bits <= 30:
            raise ValueError(f"fraction_bits={self.fraction_bits}: expected 0..30")


#: The model of Hopper (H100/H200) for bf16/fp16 inputs with fp32 accumulation, for both
#: ``mma.sync`` and ``wgmma`` (measured on an H200; module docstring).
HOPPER = MMAConfig()
#: MMA-Sim's reading (this module's default before the H200 measurement): zeros enter the
#: maximum at ``-126``, no floor on ``E``, a negative sum that rounds to zero gives ``-0``.
MMA_SIM = MMAConfig(zero_exponent="fp32_min", min_align_exponent=None, rounded_zero="signed")

#: Alternative readings, for the GPU validation to tell apart: the older readings of where
#: zeros and tiny terms go (relative to :data:`MMA_SIM`), then one rule changed in the model.
CANDIDATES: dict[str, MMAConfig] = {
    "hopper": HOPPER,
    "mma_sim": MMA_SIM,
    "zero_format_min": replace(MMA_SIM, zero_exponent="format_min"),
    "zero_exclude": replace(MMA_SIM, zero_exponent="exclude"),
    # the model but for the sign of a rounded zero:
    "zero_exclude_floor_m133": replace(MMA_SIM, zero_exponent="exclude", min_align_exponent=-133),
    "accumulator_absent": replace(MMA_SIM, empty_accumulator="absent"),
    "zero_fp32_min": replace(HOPPER, zero_exponent="fp32_min"),
    "floor_m132": replace(HOPPER, min_align_exponent=-132),
    "floor_m134": replace(HOPPER, min_align_exponent=-134),
    "fraction_bits_24": replace(HOPPER, fraction_bits=24),
    "fraction_bits_26": replace(HOPPER, fraction_bits=26),
    "align_floor": replace(HOPPER, align_rounding="rd"),
    "final_rne": replace(HOPPER, final_rounding="rne"),
    "subnormal_inputs_normalised": replace(HOPPER, normalise_subnormal_inputs=True),
    "overflow_saturate": replace(HOPPER, overflow="saturate"),
    "exact_zero_ieee": replace(HOPPER, exact_zero="ieee"),
}


@dataclass(frozen=True)
class _Format:
    name: str
    frac_bits: int
    exp_mask: int
    bias: int

    @property
    def emin(self) -> int:
        return 1 - self.bias


_FORMATS = {
    torch.bfloat16: _Format("bf16", 7, 0xFF, 127),
    torch.float16: _Format("fp16", 10, 0x1F, 15),
}
_FORMAT_BY_NAME = {f.name: f for f in _FORMATS.values()}


def _format(dtype: torch.dtype | str) -> _Format:
    if isinstance(dtype, str):
        if dtype not in _FORMAT_BY_NAME:
            raise TypeError(f"input format {dtype!r}: expected 'bf16' or 'fp16'")
        return _FORMAT_BY_NAME[dtype]
    if dtype not in _FORMATS:
        raise TypeError(f"input dtype {dtype}: expected torch.bfloat16 or torch.float16")
    return _FORMATS[dtype]


# ---------------------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------------------
@dataclass
class _Decoded:
    sign: np.ndarray  # int64 0/1
    sig: np.ndarray  # int64 integer significand, value = sig * 2^(exp - frac_bits)
    exp: np.ndarray  # int64 exponent of the leading significand position
    zero: np.ndarray  # bool
    inf: np.ndarray  # bool
    nan: np.ndarray  # bool


def _decode(bits: np.ndarray, frac_bits: int, exp_mask: int, bias: int, width: int,
            normalise: bool = False) -> _Decoded:
    b = bits.astype(np.int64) & ((1 << width) - 1)
    sign = (b >> (width - 1)) & 1
    field = (b >> frac_bits) & exp_mask
    frac = b & ((1 << frac_bits) - 1)
    special = field == exp_mask
    normal = field > 0
    sig = np.where(normal, frac | (1 << frac_bits), frac)
    exp = np.where(normal, field - bias, 1 - bias)
    zero = (field == 0) & (frac == 0)
    if normalise:  # a subnormal becomes 1.f * 2^e with e below the format's minimum
        sub = (field == 0) & ~zero
        lead = np.frexp(frac.astype(np.float64))[1] - 1  # position of the leading 1
        shift = np.where(sub, frac_bits - lead, 0)
        sig = np.where(sub, frac << shift, sig)
        exp = np.where(sub, exp - shift, exp)
    return _Decoded(sign, np.where(special, 0, sig), exp, zero,
                    special & (frac == 0), special & (frac != 0))


def _as_bits(x: torch.Tensor) -> np.ndarray:
    view = torch.int32 if x.dtype == torch.float32 else torch.int16
    return x.detach().cpu().contiguous().view(view).numpy()


# ---------------------------------------------------------------------------------------
# one fused k-step on raw bits
# ---------------------------------------------------------------------------------------
def fused_dot_add_bits(a_bits: np.ndarray, b_bits: np.ndarray, c_bits: np.ndarray | None,
                       fmt: str, config: MMAConfig = HOPPER) -> np.ndarray:
    """One fused step on raw bits: ``a_bits [B, M, K]``, ``b_bits [B, K, N]`` (16-bit patterns
    of ``fmt``, ``'bf16'`` or ``'fp16'``), ``c_bits [B, M, N]`` (fp32 patterns) give the fp32
    patterns ``[B, M, N]`` (``uint32``).  All ``K`` products form one sum with ``C``;
    ``c_bits=None`` means no ``C`` term at all (not even a zero's exponent)."""
    f = _format(fmt)
    a_bits = np.asarray(a_bits)
    b_bits = np.asarray(b_bits)
    nb, m, k = a_bits.shape
    n = b_bits.shape[2]
    present = c_bits is not None
    c_bits = np.asarray(c_bits) if present else np.zeros((nb, m, n), np.uint32)
    if b_bits.shape != (nb, k, n) or c_bits.shape != (nb, m, n):
        raise ValueError(f"shapes {a_bits.shape}, {b_bits.shape}, {c_bits.shape} do not chain")
    out = np.empty((nb, m, n), dtype=np.uint32)
    step = max(1, _CHUNK_TERMS // max(1, m * n * k))
    for lo in range(0, nb, step):
        hi = min(nb, lo + step)
        out[lo:hi] = _fused_chunk(a_bits[lo:hi], b_bits[lo:hi], c_bits[lo:hi], f, config,
                                  present)
    return out


def _fused_chunk(a_bits: np.ndarray, b_bits: np.ndarray, c_bits: np.ndarray, f: _Format,
                 cfg: MMAConfig, c_present: bool = True) -> np.ndarray:
    norm = cfg.normalise_subnormal_inputs
    a = _decode(a_bits, f.frac_bits, f.exp_mask, f.bias, 16, norm)
    b = _decode(np.swapaxes(b_bits, 1, 2), f.frac_bits, f.exp_mask, f.bias, 16, norm)
    c = _decode(c_bits, 23, 0xFF, 127, 32)

    def pair(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # [B,M,K] x [B,N,K] -> [B,M,N,K]
        return x[:, :, None, :], y[:, None, :, :]

    # exact products: significand sig_a*sig_b with 2*frac_bits fractional bits, exponent e_a+e_b
    sa, sb = pair(a.sign, b.sign)
    p_sign = sa ^ sb
    ma, mb = pair(a.sig, b.sig)
    p_sig = ma * mb
    ea, eb = pair(a.exp, b.exp)
    p_exp = ea + eb
    za, zb = pair(a.zero, b.zero)
    p_zero = za | zb

    # specials
    ia, ib = pair(a.inf, b.inf)
    na, nb_ = pair(a.nan, b.nan)
    p_nan = na | nb_ | (ia & zb) | (za & ib)
    p_inf = (ia | ib) & ~p_nan
    pos_inf = np.any(p_inf & (p_sign == 0), axis=-1) | (c.inf & (c.sign == 0))
    neg_inf = np.any(p_inf & (p_sign == 1), axis=-1) | (c.inf & (c.sign == 1))
    is_nan = np.any(p_nan, axis=-1) | c.nan | (pos_inf & neg_inf)
    is_inf = (pos_inf | neg_inf) & ~is_nan
    p_sig = np.where(p_inf | p_nan, 0, p_sig)

    # exponents that enter the maximum
    if cfg.zero_exponent == "exclude":
        p_key = np.where(p_zero, _NEG, p_exp)
        c_key = np.where(c.zero, _NEG, c.exp)
    else:
        if cfg.zero_exponent == "fp32_min" and f.emin != -126:
            zexp = -126  # a zero operand counts as -126 whatever its format
            ea2 = np.where(za, zexp, ea)
            eb2 = np.where(zb, zexp, eb)
            p_key = ea2 + eb2
        else:
            p_key = p_exp
        c_key = c.exp
    if not c_present:
        c_key = np.full_like(c.exp, _NEG)
    e_max = np.maximum(p_key.max(axis=-1), c_key)
    if cfg.min_align_exponent is not None:
        e_max = np.maximum(e_max, cfg.min_align_exponent)

    # align to multiples of 2^(e_max - F) and truncate
    fb = cfg.fraction_bits
    lsb = e_max - fb  # exponent of the last kept bit
    p_shift = lsb[..., None] - (p_exp - 2 * f.frac_bits)
    c_shift = lsb - (c.exp - 23)
    p_val = _align(p_sig, p_sign, p_shift, cfg.align_rounding)
    c_val = _align(c.sig, c.sign, c_shift, cfg.align_rounding)
    total = p_val.sum(axis=-1) + c_val  # exact: |total| < 17 * 2^27

    d = _to_fp32_bits(total, lsb, cfg)
    if cfg.exact_zero == "ieee":
        all_neg_zero = np.all(p_zero & (p_sign == 1), axis=-1) & c.zero & (c.sign == 1)
        if not c_present:
            all_neg_zero = np.all(p_zero & (p_sign == 1), axis=-1)
        d = np.where((total == 0) & all_neg_zero, np.uint32(0x80000000), d)
    inf_bits = np.where(pos_inf, np.uint32(0x7F800000), np.uint32(0xFF800000))
    d = np.where(is_inf, inf_bits, d)
    d = np.where(is_nan, np.uint32(cfg.nan_bits), d)
    return d.astype(np.uint32)


def _align(sig: np.ndarray, sign: np.ndarray, shift: np.ndarray, mode: str) -> np.ndarray:
    """``±sig * 2^-shift`` cut to an integer: magnitude truncated (``rz``) or floored (``rd``)."""
    right = np.clip(shift, 0, 63)
    left = np.clip(-shift, 0, 40)  # only ever up to 11 for a nonzero term
    if mode == "rz":
        mag = np.where(shift >= 0, sig >> right, sig << left)
        return np.where(sign == 1, -mag, mag)
    signed = np.where(sign == 1, -sig, sig)
    return np.where(shift >= 0, signed >> right, signed << left)  # arithmetic shift floors


def _to_fp32_bits(total: np.ndarray, lsb: np.ndarray, cfg: MMAConfig) -> np.ndarray:
    """``total * 2^lsb`` (exact integers) normalised and rounded into fp32 bit patterns."""
    mag = np.abs(total)
    length = np.frexp(mag.astype(np.float64))[1]  # bit length; exact since mag < 2^53
    lead = lsb + length - 1  # exponent of the leading bit
    quantum = np.maximum(lead - 23, -149)  # spacing of fp32 numbers at that exponent
    drop = np.clip(quantum - lsb, 0, 62)
    kept = mag >> drop
    if cfg.final_rounding == "rne":
        rest = mag - (kept << drop)
        half = np.where(drop > 0, np.left_shift(1, np.maximum(drop - 1, 0)), 1)
        up = (drop > 0) & ((rest > half) | ((rest == half) & ((kept & 1) == 1)))
        kept = kept + up
    scale = np.where(drop > 0, quantum, lsb).astype(np.int64)
    scale = np.where(mag == 0, 0, scale)
    value = np.ldexp(kept.astype(np.float64), scale.astype(np.int32))  # exact in float64
    big = value > np.float64(np.finfo(np.float32).max)
    if cfg.overflow == "saturate" and cfg.final_rounding == "rz":
        value = np.where(big, np.float64(np.finfo(np.float32).max), value)
    else:
        value = np.where(big, np.inf, value)
    negative = (total < 0) & ((value != 0) | (cfg.rounded_zero == "signed"))
    value = np.where(negative, -value, value)
    return value.astype(np.float32).view(np.uint32)


# ---------------------------------------------------------------------------------------
# torch-facing API
# ---------------------------------------------------------------------------------------
def _prepare(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None):
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}")
    _format(a.dtype)
    if a.dim() < 2 or b.dim() < 2:
        raise ValueError("a and b need at least two dimensions")
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2:
        raise ValueError(f"a has K={k} but b has K={k2}")
    if c is not None:
        if c.dtype != torch.float32:
            raise TypeError(f"c must be float32, got {c.dtype}")
        if c.dim() < 2 or tuple(c.shape[-2:]) != (m, n):
            raise ValueError(f"c has shape {tuple(c.shape)}, expected [..., {m}, {n}]")
    c_batch = c.shape[:-2] if c is not None else ()
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2], c_batch)
    ab = np.broadcast_to(_as_bits(a), (*batch, m, k)).reshape(-1, m, k)
    bb = np.broadcast_to(_as_bits(b), (*batch, k, n)).reshape(-1, k, n)
    cb = None
    if c is not None:
        cb = np.broadcast_to(_as_bits(c), (*batch, m, n)).reshape(-1, m, n)
    return ab, bb, cb, tuple(batch), (m, n, k)


def mma_bits(a_bits: np.ndarray, b_bits: np.ndarray, c_bits: np.ndarray | None, fmt: str,
             k_step: int = K_STEP, order: str = "ascending",
             config: MMAConfig = HOPPER) -> np.ndarray:
    """:func:`mma` on raw bit patterns (``[B, M, K]``, ``[B, K, N]``, ``[B, M, N]`` fp32 bits
    or ``None`` for an empty accumulator); returns fp32 bit patterns ``[B, M, N]``
    (``uint32``)."""
    a_bits = np.asarray(a_bits)
    b_bits = np.asarray(b_bits)
    nb, m, k = a_bits.shape
    n = b_bits.shape[2]
    if k_step <= 0 or k % k_step:
        raise ValueError(f"K={k} is not a multiple of k_step={k_step}; pad A and B with zeros")
    if order not in ("ascending", "descending"):
        raise ValueError(f"order={order!r}: expected 'ascending' or 'descending'")
    if c_bits is not None:
        acc = np.asarray(c_bits)
    elif config.empty_accumulator == "absent":
        acc = None  # the first step has no C term
    else:
        acc = np.zeros((nb, m, n), np.uint32)
    starts = list(range(0, k, k_step))
    if order == "descending":
        starts.reverse()
    if not starts:
        return np.zeros((nb, m, n), np.uint32) if acc is None else acc
    for k0 in starts:
        acc = fused_dot_add_bits(a_bits[:, :, k0:k0 + k_step], b_bits[:, k0:k0 + k_step, :],
                                 acc, fmt, config)
    return acc


def mma_k16(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None,
            config: MMAConfig = HOPPER) -> torch.Tensor:
    """One Hopper tensor-core step: ``a [..., M, 16]``, ``b [..., 16, N]`` (both bf16 or both
    fp16), ``c [..., M, N]`` fp32 (``None``: an empty accumulator) give ``D = A @ B + C`` as fp32
    ``[..., M, N]``, every element one fused sum of 16 exact products and ``C`` (module
    docstring).  Batch dimensions broadcast."""
    if a.shape[-1] != 16:
        raise ValueError(f"mma_k16 needs K=16, got K={a.shape[-1]}; use mma() to chain")
    return mma(a, b, c, k_step=16, config=config)


def mma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, k_step: int = K_STEP,
        order: str = "ascending", config: MMAConfig = HOPPER) -> torch.Tensor:
    """``D = A @ B + C`` as a chain of fused k-steps, the way ``tl.dot`` runs on Hopper.

    ``K`` is split into blocks of ``k_step`` columns (16 for bf16/fp16 on Hopper), taken in
    ``order`` (``tl.dot`` goes ``"ascending"``); each block is one fused step whose ``C`` is
    the previous block's fp32 result, starting from ``c``.  ``c=None`` is an empty
    accumulator, by default a ``+0`` term (:attr:`MMAConfig.empty_accumulator`; ``tl.dot``
    from a zero accumulator issues its first ``wgmma`` without ``C``).  ``K`` must be
    a multiple of ``k_step``.  Padding ``A`` *and* ``B`` with zero columns/rows is exact:
    a ``0 * 0`` product takes no part in the alignment exponent (under the readings that let
    zeros in, its exponent is at most ``-252``), so it never raises it (only a ``-0``
    accumulator passing through an all-zero block turns ``+0``).
    Inputs may live on any device; the result is a CPU fp32 tensor.
    """
    ab, bb, cb, batch, (m, n, _) = _prepare(a, b, c)
    out = mma_bits(ab, bb, cb, _format(a.dtype).name, k_step, order, config)
    return torch.from_numpy(out.view(np.int32).reshape(*batch, m, n).copy()).view(torch.float32)
