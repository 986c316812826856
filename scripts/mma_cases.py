"""A seeded test set of tensor-core tiles to check :mod:`dash_ref.arithmetic.tensorcore` on a GPU.

``generate(dtype, count, seed, shape)`` builds ``count`` tiles ``D = A @ B + C`` with
``A [M, K]``, ``B [K, N]`` in bf16 or fp16 and ``C [M, N]`` in fp32, as raw bit patterns,
split over case *families* (:data:`FAMILIES`) in fixed proportions (:data:`WEIGHTS`).  Each
family draws from its own NumPy ``PCG64`` stream keyed by ``(seed, dtype, family, shape)``,
so a family's tiles depend only on those and on how many it gets.

=================  =======================================================================
family             what it stresses
=================  =======================================================================
``normal``         ``N(0, 1)`` operands and accumulators (a quarter with ``C = 0``)
``scaled``         per-tile power-of-two scales; attention-like rows in ``[0, 1)``
``wide_exp``       exponents spread over most of the format's range, some subnormal
``cancel``         exact and near cancellation between products, and against ``C``
``subnormal``      subnormal inputs, fp32-subnormal accumulators and results
``signed_zero``    ``±0`` operands and accumulators, sums that are exactly zero
``mixed_mag``      one dominant term per row, the rest 8 to 40 binades below
``ties``           terms at half an ulp of ``C`` and at the truncation boundary
``trunc_sign``     small terms of the sign opposite to ``C`` (truncation of negatives)
``carry``          sums that cross a power of two; products with significand >= 2 on top
``zero_huge``      zero operands facing huge partners (where a zero's exponent matters);
                   fp16: some rows of zero products only, over a small normal ``C``
``tiny``           every product below ``2^-126`` (bf16) or at the bottom of fp16
``special``        ``±inf``, NaN, ``0 * inf``
``overflow``       products and sums beyond the fp32 range
=================  =======================================================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

FAMILIES = (
    "normal", "scaled", "wide_exp", "cancel", "subnormal", "signed_zero", "mixed_mag",
    "ties", "trunc_sign", "carry", "zero_huge", "tiny", "special", "overflow",
)
#: Relative share of each family (percent).
WEIGHTS = {
    "normal": 14, "scaled": 8, "wide_exp": 10, "cancel": 9, "subnormal": 8, "signed_zero": 5,
    "mixed_mag": 8, "ties": 8, "trunc_sign": 6, "carry": 6, "zero_huge": 5, "tiny": 5,
    "special": 4, "overflow": 4,
}
#: Tiles of the default set, per input dtype (each dtype alone exceeds 10,000).
DEFAULT_COUNT = 10240
DTYPES = ("bf16", "fp16")
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class _Fmt:
    name: str
    p: int  # fraction bits
    bias: int
    field_max: int  # all-ones exponent field (inf/NaN)
    width: int

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def emax(self) -> int:
        return self.field_max - 1 - self.bias


_FMT = {"bf16": _Fmt("bf16", 7, 127, 0xFF, 16), "fp16": _Fmt("fp16", 10, 15, 0x1F, 16)}
_F32 = _Fmt("fp32", 23, 127, 0xFF, 32)


@dataclass(frozen=True)
class MMACases:
    """Tiles as raw bits: ``a_bits [T, M, K]`` and ``b_bits [T, K, N]`` (``uint16``),
    ``c_bits [T, M, N]`` (``uint32``), ``family [T]`` (index into :data:`FAMILIES`)."""

    dtype: str
    seed: int
    a_bits: np.ndarray
    b_bits: np.ndarray
    c_bits: np.ndarray
    family: np.ndarray

    def __len__(self) -> int:
        return int(self.a_bits.shape[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(M, N, K)``."""
        _, m, k = self.a_bits.shape
        return m, int(self.b_bits.shape[2]), k

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``A``, ``B`` in the input dtype and ``C`` in fp32, as CPU tensors (bits preserved)."""
        dt = TORCH_DTYPE[self.dtype]
        a = torch.from_numpy(self.a_bits.view(np.int16).copy()).view(dt)
        b = torch.from_numpy(self.b_bits.view(np.int16).copy()).view(dt)
        c = torch.from_numpy(self.c_bits.view(np.int32).copy()).view(torch.float32)
        return a, b, c

    def counts(self) -> dict[str, int]:
        return {name: int((self.family == i).sum()) for i, name in enumerate(FAMILIES)}

    def fingerprint(self) -> str:
        """SHA-256 over the dtype, shape and every bit of the set."""
        h = hashlib.sha256(f"{self.dtype}:{self.a_bits.shape}:{self.b_bits.shape}".encode())
        for arr in (self.a_bits, self.b_bits, self.c_bits, self.family):
            h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest()


def allocate(count: int) -> dict[str, int]:
    """Tiles per family: proportional to :data:`WEIGHTS`, largest remainders first, every
    family at least one tile when ``count >= len(FAMILIES)``."""
    total = sum(WEIGHTS.values())
    if count >= len(FAMILIES):
        base = {f: 1 for f in FAMILIES}
        rest = count - len(FAMILIES)
    else:
        base = {f: 0 for f in FAMILIES}
        rest = count
    exact = {f: rest * WEIGHTS[f] / total for f in FAMILIES}
    alloc = {f: base[f] + int(exact[f]) for f in FAMILIES}
    left = count - sum(alloc.values())
    order = sorted(FAMILIES, key=lambda f: (-(exact[f] - int(exact[f])), FAMILIES.index(f)))
    for f in order[:left]:
        alloc[f] += 1
    return alloc


def generate(dtype: str = "bf16", count: int = DEFAULT_COUNT, seed: int = 0,
             shape: tuple[int, int, int] = (16, 16, 16)) -> MMACases:
    """The seeded test set: ``count`` tiles of ``shape = (M, N, K)`` for ``dtype``."""
    if dtype not in _FMT:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    m, n, k = shape
    if min(m, n, k) < 2:
        raise ValueError(f"shape {shape}: every dimension must be at least 2")
    fmt = _FMT[dtype]
    parts_a, parts_b, parts_c, parts_f = [], [], [], []
    for i, (name, t) in enumerate(allocate(count).items()):
        if t == 0:
            continue
        rng = np.random.default_rng([seed, DTYPES.index(dtype), i, m, n, k])
        a, b, c = _BUILDERS[name](rng, t, (m, n, k), fmt)
        assert a.shape == (t, m, k) and b.shape == (t, k, n) and c.shape == (t, m, n), name
        parts_a.append(a.astype(np.uint16))
        parts_b.append(b.astype(np.uint16))
        parts_c.append(c.astype(np.uint32))
        parts_f.append(np.full(t, i, dtype=np.int16))
    return MMACases(dtype, seed, np.concatenate(parts_a), np.concatenate(parts_b),
                    np.concatenate(parts_c), np.concatenate(parts_f))


# ---------------------------------------------------------------------------------------
# encoding helpers (all vectorised; int64 in, bit patterns out)
# ---------------------------------------------------------------------------------------
def _enc(fmt: _Fmt, sign, exp, frac) -> np.ndarray:
    """Bits of ``(-1)^sign * (1 + frac/2^p) * 2^exp``; below the normal range the significand
    is shifted into a subnormal (low bits dropped), above it the largest finite is used."""
    sign = np.asarray(sign, np.int64)
    exp = np.asarray(exp, np.int64)
    frac = np.asarray(frac, np.int64) & ((1 << fmt.p) - 1)
    field = exp + fmt.bias
    sub = field < 1
    shift = np.clip(1 - field, 0, 62)
    sub_frac = ((1 << fmt.p) | frac) >> shift
    field = np.clip(field, 1, fmt.field_max - 1)
    big = exp > fmt.emax
    frac = np.where(big, (1 << fmt.p) - 1, frac)
    bits = (sign << (fmt.width - 1)) | np.where(sub, sub_frac, (field << fmt.p) | frac)
    return bits.astype(np.uint32 if fmt.width == 32 else np.uint16)


def _from_float(fmt: _Fmt, x: np.ndarray) -> np.ndarray:
    """Round float64 values to ``fmt`` (through fp32, round to nearest even) and give bits."""
    t = torch.from_numpy(np.asarray(x, np.float64)).to(torch.float32)
    if fmt.width == 32:
        return t.view(torch.int32).numpy().view(np.uint32)
    return t.to(TORCH_DTYPE[fmt.name]).view(torch.int16).numpy().view(np.uint16)


def _rand(rng, fmt: _Fmt, size, exp_lo, exp_hi, frac_bits: int | None = None,
          sign=None) -> np.ndarray:
    """Random values with unbiased exponents uniform in ``[exp_lo, exp_hi]`` (broadcast),
    random fractions (only the top ``frac_bits`` of them when given) and signs."""
    lo = np.asarray(exp_lo, np.int64)
    hi = np.asarray(exp_hi, np.int64)
    exp = lo + np.floor(rng.random(size) * (hi - lo + 1)).astype(np.int64)
    if frac_bits is None:
        frac = rng.integers(0, 1 << fmt.p, size)
    else:
        keep = min(frac_bits, fmt.p)
        frac = rng.integers(0, 1 << keep, size) << (fmt.p - keep)
    if sign is None:
        sign = rng.integers(0, 2, size)
    return _enc(fmt, sign, exp, frac)


def _subnormal(rng, fmt: _Fmt, size) -> np.ndarray:
    """Random nonzero subnormals of ``fmt`` with random signs."""
    frac = rng.integers(1, 1 << fmt.p, size)
    return ((rng.integers(0, 2, size) << (fmt.width - 1)) | frac).astype(
        np.uint32 if fmt.width == 32 else np.uint16)


def _zeros(rng, fmt: _Fmt, size) -> np.ndarray:
    """``±0`` with random signs."""
    return (rng.integers(0, 2, size) << (fmt.width - 1)).astype(
        np.uint32 if fmt.width == 32 else np.uint16)


def _mix(rng, choices: list[np.ndarray], probs: list[float]) -> np.ndarray:
    """Element-wise choice among equally shaped arrays."""
    pick = rng.choice(len(choices), size=choices[0].shape, p=np.asarray(probs) / sum(probs))
    out = choices[0].copy()
    for i in range(1, len(choices)):
        out = np.where(pick == i, choices[i], out)
    return out


def _tile(x: np.ndarray, shape) -> np.ndarray:
    """Per-tile parameters ``[T]`` broadcast against ``shape = (T, ...)``."""
    return np.asarray(x).reshape((-1,) + (1,) * (len(shape) - 1))


def _exact_sum(a_bits, b_bits, c_bits, fmt: _Fmt) -> np.ndarray:
    """``A @ B + C`` in float64 (close to exact for these magnitudes), for building cases."""
    dt = TORCH_DTYPE[fmt.name]
    a = torch.from_numpy(a_bits.view(np.int16).copy()).view(dt).double()
    b = torch.from_numpy(b_bits.view(np.int16).copy()).view(dt).double()
    c = torch.from_numpy(c_bits.view(np.int32).copy()).view(torch.float32).double()
    return (a @ b + c).numpy()


# ---------------------------------------------------------------------------------------
# families: each returns (a_bits [T,M,K], b_bits [T,K,N], c_bits [T,M,N])
# ---------------------------------------------------------------------------------------
def _normal(rng, t, shape, fmt):
    m, n, k = shape
    a = _from_float(fmt, rng.standard_normal((t, m, k)))
    b = _from_float(fmt, rng.standard_normal((t, k, n)))
    c = rng.standard_normal((t, m, n)) * 4
    c = np.where(_tile(rng.random(t) < 0.25, c.shape), 0.0, c)
    return a, b, _from_float(_F32, c)


def _scaled(rng, t, shape, fmt):
    m, n, k = shape
    span = 40 if fmt.name == "bf16" else 5
    sa, sb, sc = (rng.integers(-span, span + 1, t) for _ in range(3))
    attn = rng.random(t) < 0.3  # rows of probabilities, like P in attention
    a = rng.standard_normal((t, m, k)) * 2.0 ** _tile(sa, (t, m, k))
    a = np.where(_tile(attn, a.shape), rng.random((t, m, k)), a)
    b = rng.standard_normal((t, k, n)) * 2.0 ** _tile(sb, (t, k, n))
    c = rng.standard_normal((t, m, n)) * 2.0 ** _tile(sc + sa + sb, (t, m, n))
    return _from_float(fmt, a), _from_float(fmt, b), _from_float(_F32, c)


def _wide_exp(rng, t, shape, fmt):
    m, n, k = shape
    lo_all, hi_all = fmt.emin - fmt.p, fmt.emax
    # most tiles keep the products inside the fp32 range; a fifth may reach beyond it
    full = rng.random(t) < 0.2
    top = np.where(full, hi_all, min(hi_all, 63))
    centre = lo_all + np.floor(rng.random(t) * (top - lo_all + 1)).astype(np.int64)
    spread = rng.integers(0, (hi_all - lo_all) // 4 + 1, t)
    lo = _tile(np.clip(centre - spread, lo_all, top), (t, 1, 1))
    hi = _tile(np.clip(centre + spread, lo_all, top), (t, 1, 1))
    a = _rand(rng, fmt, (t, m, k), lo, hi)
    b = _rand(rng, fmt, (t, k, n), lo, hi)
    a = _mix(rng, [a, _subnormal(rng, fmt, a.shape)], [0.9, 0.1])
    b = _mix(rng, [b, _subnormal(rng, fmt, b.shape)], [0.9, 0.1])
    c_lo = np.clip(2 * lo - 8, -149, 127)
    c_hi = np.clip(2 * hi + 8, -149, 127)
    c = _rand(rng, _F32, (t, m, n), c_lo, c_hi)
    c = _mix(rng, [c, _subnormal(rng, _F32, c.shape), _zeros(rng, _F32, c.shape)],
             [0.8, 0.1, 0.1])
    return a, b, c


def _cancel(rng, t, shape, fmt):
    m, n, k = shape
    h = k // 2
    a = _from_float(fmt, rng.standard_normal((t, m, k)))
    b = _from_float(fmt, rng.standard_normal((t, k, n)))
    kind = rng.integers(0, 3, t)
    # kind 0: A = [X, -X'] and B = [Y; Y], X' = X nudged by a unit in the last place here and there
    a0 = a.copy()
    a0[:, :, h:2 * h] = a[:, :, :h] ^ np.uint16(0x8000)
    nudge = (rng.random((t, m, h)) < 0.1) * rng.choice(np.array([-1, 1]), (t, m, h))
    finite = (a0[:, :, h:2 * h] & 0x7FFF) > 0
    a0[:, :, h:2 * h] = (a0[:, :, h:2 * h].astype(np.int64) + nudge * finite).astype(np.uint16)
    b0 = b.copy()
    b0[:, h:2 * h, :] = b[:, :h, :]
    if k % 2:
        a0[:, :, -1] = 0
    # kind 2: one exactly cancelling pair per row on top of small terms
    small = _from_float(fmt, rng.standard_normal((t, m, k)) * 2.0**-12)
    a2 = small.copy()
    a2[:, :, 0] = a[:, :, 0]
    a2[:, :, 1] = a[:, :, 0] ^ np.uint16(0x8000)
    b2 = b.copy()
    b2[:, 1, :] = b[:, 0, :]
    sel_a = _tile(kind, a.shape)
    sel_b = _tile(kind, b.shape)
    a = np.where(sel_a == 0, a0, np.where(sel_a == 2, a2, a))
    b = np.where(sel_b == 0, b0, np.where(sel_b == 2, b2, b))
    zero_c = np.zeros((t, m, n), np.uint32)
    # kind 1 (and half of the others): C = -fp32(A @ B) nudged, so C cancels the products
    against = _from_float(_F32, -_exact_sum(a, b, zero_c, fmt))
    jitter = rng.integers(-3, 4, (t, m, n))
    nonzero = (against & 0x7FFFFFFF) > 0
    against = (against.astype(np.int64) + jitter * nonzero).astype(np.uint32)
    use_against = _tile((kind == 1) | (rng.random(t) < 0.5), (t, m, n))
    c = np.where(use_against, against, _mix(rng, [zero_c, _zeros(rng, _F32, zero_c.shape)],
                                            [1, 1]))
    return a, b, c


def _subnormal_family(rng, t, shape, fmt):
    m, n, k = shape
    if fmt.name == "bf16":
        partner = (-20, 8)
        c_normal = (-126, -116)
    else:
        partner = (-14, 15)
        c_normal = (-40, -10)
    a = _mix(rng, [_subnormal(rng, fmt, (t, m, k)),
                   _rand(rng, fmt, (t, m, k), fmt.emin, fmt.emin + 6),
                   _rand(rng, fmt, (t, m, k), *partner)], [0.5, 0.25, 0.25])
    b = _mix(rng, [_subnormal(rng, fmt, (t, k, n)),
                   _rand(rng, fmt, (t, k, n), *partner)], [0.3, 0.7])
    c = _mix(rng, [_subnormal(rng, _F32, (t, m, n)), _zeros(rng, _F32, (t, m, n)),
                   _rand(rng, _F32, (t, m, n), *c_normal)], [0.4, 0.2, 0.4])
    return a, b, c


def _signed_zero(rng, t, shape, fmt):
    m, n, k = shape
    kind = rng.integers(0, 3, t)
    vals_a = _rand(rng, fmt, (t, m, k), -3, 3, frac_bits=2)
    vals_b = _rand(rng, fmt, (t, k, n), -3, 3, frac_bits=2)
    # kind 0: mostly signed zeros, a few values
    a0 = _mix(rng, [_zeros(rng, fmt, (t, m, k)), vals_a], [0.7, 0.3])
    b0 = _mix(rng, [_zeros(rng, fmt, (t, k, n)), vals_b], [0.7, 0.3])
    # kind 1: all zeros; every product has the same sign per tile, C = ±0
    sa = _tile(rng.integers(0, 2, t), (t, m, k)).astype(np.uint16) << 15
    sb = _tile(rng.integers(0, 2, t), (t, k, n)).astype(np.uint16) << 15
    a1 = np.broadcast_to(sa, (t, m, k)).astype(np.uint16)
    b1 = np.broadcast_to(sb, (t, k, n)).astype(np.uint16)
    # kind 2: nonzero products that cancel exactly: A = [x, -x, ±0 ...], B rows 0 and 1 equal
    a2 = _zeros(rng, fmt, (t, m, k))
    a2[:, :, 0] = vals_a[:, :, 0]
    a2[:, :, 1] = vals_a[:, :, 0] ^ np.uint16(0x8000)
    b2 = vals_b.copy()
    b2[:, 1, :] = b2[:, 0, :]
    a = np.where(_tile(kind, a0.shape) == 0, a0, np.where(_tile(kind, a0.shape) == 1, a1, a2))
    b = np.where(_tile(kind, b0.shape) == 0, b0, np.where(_tile(kind, b0.shape) == 1, b1, b2))
    c = _mix(rng, [_zeros(rng, _F32, (t, m, n)), _rand(rng, _F32, (t, m, n), -3, 3)], [0.8, 0.2])
    return a, b, c


def _mixed_mag(rng, t, shape, fmt):
    m, n, k = shape
    if fmt.name == "bf16":
        e0 = _tile(rng.integers(-40, 41, t), (t, 1, 1))
        gap = (8, 40)
    else:
        e0 = _tile(rng.integers(-2, 8, t), (t, 1, 1))
        gap = (4, 12)
    big_a = _rand(rng, fmt, (t, m, k), e0, e0)
    d = rng.integers(gap[0], gap[1] + 1, (t, m, k))
    small_a = _rand(rng, fmt, (t, m, k), e0 - d, e0 - d)
    dominant = rng.integers(0, k, (t, m, 1)) == np.arange(k)[None, None, :]
    a = np.where(dominant, big_a, small_a)
    b = _rand(rng, fmt, (t, k, n), -2, 2)
    c_off = rng.integers(-45, 6, (t, m, n))
    c = _rand(rng, _F32, (t, m, n), np.clip(e0 + c_off, -149, 127), np.clip(e0 + c_off, -149, 127))
    return a, b, c


def _split_exp(fmt: _Fmt, e):
    """Two exponents inside ``fmt`` whose sum is ``e`` (``e`` within the product range)."""
    ea = np.clip(e // 2, fmt.emin, fmt.emax)
    eb = e - ea
    fix = np.clip(eb, fmt.emin, fmt.emax) - eb
    return ea - fix, eb + fix


def _ties(rng, t, shape, fmt):
    m, n, k = shape
    lo, hi = (-60, 60) if fmt.name == "bf16" else (3, 12)
    e = _tile(rng.integers(lo, hi + 1, t), (t, 1, k))
    off = rng.choice(np.array([23, 24, 24, 24, 25, 25, 26, 27, 30]), (t, 1, k))
    ea, eb = _split_exp(fmt, e - off)  # [t, 1, k]: the same offsets on every row
    frac_a = rng.choice(np.array([0, 1 << (fmt.p - 1)]), (t, m, k))  # significand 1 or 1.5
    a = _enc(fmt, rng.integers(0, 2, (t, m, k)), np.broadcast_to(ea, (t, m, k)), frac_a)
    # B is a power of two per row k, so every product a_k b_k is (1 or 1.5) * 2^(e - off_k)
    eb = np.broadcast_to(np.swapaxes(eb, 1, 2), (t, k, n))
    sign_b = rng.integers(0, 2, (t, k, n)) * (rng.random((t, 1, 1)) < 0.5)
    b = _enc(fmt, sign_b, eb, np.zeros((t, k, n), np.int64))
    ec = np.broadcast_to(e[:, :, :1], (t, m, n))
    low = rng.integers(0, 4, (t, m, n))  # ulp pattern of C: the bits under test
    c_frac = rng.integers(0, 1 << 20, (t, m, n)) << 3 | low
    c = _enc(_F32, rng.integers(0, 2, (t, m, n)), ec, c_frac)
    # a third of the tiles: only one or two tie-makers per row, the rest zero
    sparse = _tile(rng.random(t) < 0.33, (t, m, k)) & (rng.random((t, m, k)) < 0.85)
    a = np.where(sparse, np.uint16(0), a)
    return a, b, c


def _trunc_sign(rng, t, shape, fmt):
    m, n, k = shape
    lo, hi = (-50, 50) if fmt.name == "bf16" else (2, 12)
    e = _tile(rng.integers(lo, hi + 1, t), (t, m, n))
    c_sign = rng.integers(0, 2, (t, m, n))
    c = _enc(_F32, c_sign, e, rng.integers(0, 1 << 23, (t, m, n)))
    c = np.where(_tile(rng.random(t) < 0.15, c.shape), np.uint32(0), c)
    ec = e[:, :, :1]  # [t, m, 1]
    off = rng.integers(20, 46 if fmt.name == "bf16" else 30, (t, m, k))
    ea, eb_want = _split_exp(fmt, np.broadcast_to(ec, (t, m, k)) - off)
    opposite = 1 - c_sign[:, :, :1]  # products against C's sign (per row: C's first column)
    sign_a = np.where(rng.random((t, m, k)) < 0.8, opposite, rng.integers(0, 2, (t, m, k)))
    a = _enc(fmt, sign_a, ea, rng.integers(0, 1 << fmt.p, (t, m, k)))
    # B: per row k the exponent that row 0 of A wants, modest spread
    eb = np.clip(eb_want[:, 0, :][:, :, None] + rng.integers(-1, 2, (t, k, n)), fmt.emin, fmt.emax)
    b = _enc(fmt, np.zeros((t, k, n), np.int64), eb, rng.integers(0, 1 << fmt.p, (t, k, n)))
    big = rng.random(t) < 0.25  # some tiles: C = 0 and one big product per row instead
    a_big = _enc(fmt, 1 - sign_a[:, :, :1], np.broadcast_to(ec - eb[:, :1, :1], (t, m, 1)),
                 rng.integers(0, 1 << fmt.p, (t, m, 1)))
    a[:, :, :1] = np.where(_tile(big, (t, m, 1)), a_big, a[:, :, :1])
    c = np.where(_tile(big, c.shape), np.uint32(0), c)
    return a, b, c


def _carry(rng, t, shape, fmt):
    m, n, k = shape
    lo, hi = (-50, 50) if fmt.name == "bf16" else (2, 12)
    e = _tile(rng.integers(lo, hi + 1, t), (t, 1, 1))
    kind = rng.integers(0, 3, t)
    # kinds 0/1: C just below 2^(e+1) (or exactly 2^e), small terms of one sign cross it
    j = rng.integers(1, 9, (t, m, n))
    c_up = _enc(_F32, np.zeros((t, m, n), np.int64), e, (1 << 23) - j)
    c_down = _enc(_F32, np.zeros((t, m, n), np.int64), e, np.zeros((t, m, n), np.int64))
    off = rng.integers(21, 28, (t, m, k))
    ea, eb_want = _split_exp(fmt, np.broadcast_to(e, (t, m, k)) - off)
    a_up = _enc(fmt, np.zeros((t, m, k), np.int64), ea, rng.integers(0, 1 << fmt.p, (t, m, k)))
    a_down = a_up | np.uint16(0x8000)
    b_small = _enc(fmt, np.zeros((t, k, n), np.int64),
                   np.broadcast_to(eb_want[:, 0, :][:, :, None], (t, k, n)),
                   np.zeros((t, k, n), np.int64))
    # kind 2: a product with significand >= 2 (a, b in [1.5, 2)) on top, terms at 2^(e-25)
    top = np.zeros((t, m, k), bool)
    top[:, :, 0] = True
    big_a = _enc(fmt, np.zeros((t, m, k), np.int64), np.zeros((t, m, k), np.int64),
                 rng.integers(1 << (fmt.p - 1), 1 << fmt.p, (t, m, k)))
    ea2, eb2 = _split_exp(fmt, np.full((t, m, k), -25 - int(rng.integers(0, 2))))
    tiny_a = _enc(fmt, rng.integers(0, 2, (t, m, k)) * (rng.random((t, 1, 1)) < 0.5), ea2,
                  rng.integers(0, 1 << fmt.p, (t, m, k)))
    a_top = np.where(top, big_a, tiny_a)
    b_top = _enc(fmt, np.zeros((t, k, n), np.int64),
                 np.broadcast_to(eb2[:, 0, :][:, :, None], (t, k, n)),
                 np.zeros((t, k, n), np.int64))
    b_top[:, 0, :] = _enc(fmt, np.zeros((t, n), np.int64), np.zeros((t, n), np.int64),
                          rng.integers(1 << (fmt.p - 1), 1 << fmt.p, (t, n)))
    c_top = _enc(_F32, np.zeros((t, m, n), np.int64), np.full((t, m, n), -25),
                 rng.integers(0, 1 << 23, (t, m, n)))
    sel_a = _tile(kind, (t, m, k))
    sel_b = _tile(kind, (t, k, n))
    sel_c = _tile(kind, (t, m, n))
    a = np.where(sel_a == 0, a_up, np.where(sel_a == 1, a_down, a_top))
    b = np.where(sel_b == 2, b_top, b_small)
    c = np.where(sel_c == 0, c_up, np.where(sel_c == 1, c_down, c_top))
    return a, b, c


def _zero_huge(rng, t, shape, fmt):
    m, n, k = shape
    if fmt.name == "bf16":
        huge, mid, c_rng = (100, 127), (-20, 0), (-35, -5)
    else:
        huge, mid, c_rng = (12, 15), (-8, 0), (-24, -2)
    a = _rand(rng, fmt, (t, m, k), *mid)
    zero_col = rng.random((t, 1, k)) < 0.3
    zero_col[:, :, 0] = True
    a = np.where(zero_col & (rng.random((t, m, k)) < 0.8), _zeros(rng, fmt, (t, m, k)), a)
    b = _rand(rng, fmt, (t, k, n), *mid)
    b_huge = _rand(rng, fmt, (t, k, n), *huge)
    b = np.where(np.swapaxes(zero_col, 1, 2), b_huge, b)
    c = _rand(rng, _F32, (t, m, n), *c_rng)
    c = _mix(rng, [c, _zeros(rng, _F32, c.shape)], [0.85, 0.15])
    if fmt.name == "fp16":
        # a quarter of the tiles: row 0 of A all zero (every product of that row zero, some
        # against huge partners) and a small normal C below it, whose last bits a zero
        # counted at exponent -126 + 15 would cut; drawn last, so the rest is unchanged
        pick = rng.random(t) < 0.25
        row_zero = _zeros(rng, fmt, (t, k))
        c_low = _rand(rng, _F32, (t, n), -126, -113)
        a[:, 0, :] = np.where(pick[:, None], row_zero, a[:, 0, :])
        c[:, 0, :] = np.where(pick[:, None], c_low, c[:, 0, :])
    return a, b, c


def _tiny(rng, t, shape, fmt):
    m, n, k = shape
    if fmt.name == "bf16":
        a = _rand(rng, fmt, (t, m, k), -100, -64)
        b = _rand(rng, fmt, (t, k, n), -100, -64)
        # some tiles: every product exactly 2^-152, 2^-150 or 2^-140, all positive
        equal = rng.random(t) < 0.25
        pe = rng.choice(np.array([-152, -150, -140]), t)
        ea = _tile(pe // 2, (t, m, k))
        eb = _tile(pe - pe // 2, (t, k, n))
        a = np.where(_tile(equal, a.shape), _enc(fmt, 0, np.broadcast_to(ea, a.shape), 0), a)
        b = np.where(_tile(equal, b.shape), _enc(fmt, 0, np.broadcast_to(eb, b.shape), 0), b)
        c_small = _rand(rng, _F32, (t, m, n), -126, -120)
    else:
        a = _mix(rng, [_subnormal(rng, fmt, (t, m, k)),
                       _rand(rng, fmt, (t, m, k), -14, -10)], [0.5, 0.5])
        b = _mix(rng, [_subnormal(rng, fmt, (t, k, n)),
                       _rand(rng, fmt, (t, k, n), -14, -10)], [0.5, 0.5])
        c_small = _rand(rng, _F32, (t, m, n), -70, -30)
    c = _mix(rng, [np.zeros((t, m, n), np.uint32), _zeros(rng, _F32, (t, m, n)),
                   _subnormal(rng, _F32, (t, m, n)), c_small], [0.35, 0.15, 0.25, 0.25])
    return a, b, c


def _special(rng, t, shape, fmt):
    m, n, k = shape
    a = _from_float(fmt, rng.standard_normal((t, m, k)))
    b = _from_float(fmt, rng.standard_normal((t, k, n)))
    c = _from_float(_F32, rng.standard_normal((t, m, n)))
    inf = fmt.field_max << fmt.p

    def specials(size, f: _Fmt):
        inf_bits = f.field_max << f.p
        payload = rng.integers(1, 1 << f.p, size)
        sign = rng.integers(0, 2, size) << (f.width - 1)
        nan = sign | inf_bits | payload
        dtype = np.uint32 if f.width == 32 else np.uint16
        return (sign | inf_bits).astype(dtype), nan.astype(dtype)

    a_inf, a_nan = specials((t, m, k), fmt)
    b_inf, b_nan = specials((t, k, n), fmt)
    c_inf, c_nan = specials((t, m, n), _F32)
    a = _mix(rng, [a, a_inf, a_nan, _zeros(rng, fmt, a.shape)], [0.85, 0.06, 0.03, 0.06])
    b = _mix(rng, [b, b_inf, b_nan, _zeros(rng, fmt, b.shape)], [0.85, 0.06, 0.03, 0.06])
    c = _mix(rng, [c, c_inf, c_nan], [0.9, 0.07, 0.03])
    # half the tiles: a clean 0 * inf in column/row 0 and otherwise finite values
    clean = rng.random(t) < 0.5
    a_c = _from_float(fmt, rng.standard_normal((t, m, k)))
    b_c = _from_float(fmt, rng.standard_normal((t, k, n)))
    a_c[:, :, 0] = np.where(rng.random((t, m)) < 0.5, np.uint16(0), np.uint16(inf))
    b_c[:, 0, :] = np.where(rng.random((t, n)) < 0.5, np.uint16(0), np.uint16(inf))
    a = np.where(_tile(clean, a.shape), a_c, a)
    b = np.where(_tile(clean, b.shape), b_c, b)
    return a, b, c


def _overflow(rng, t, shape, fmt):
    m, n, k = shape
    if fmt.name == "bf16":
        a = _rand(rng, fmt, (t, m, k), 60, 127, sign=np.zeros((t, m, k), np.int64))
        b = _rand(rng, fmt, (t, k, n), -10, 10)
        same = rng.random(t) < 0.5
        b = np.where(_tile(same, b.shape), b & np.uint16(0x7FFF), b)
        # a product beyond fp32 cancelled by its negation, plus a C it swamps
        pair = rng.random(t) < 0.3
        a[:, :, 1] = np.where(_tile(pair, (t, m)), a[:, :, 0], a[:, :, 1])
        b[:, 1, :] = np.where(_tile(pair, (t, n)), b[:, 0, :] ^ np.uint16(0x8000), b[:, 1, :])
    else:
        a = _rand(rng, fmt, (t, m, k), 10, 15)
        b = _rand(rng, fmt, (t, k, n), 10, 15)
    c = _mix(rng, [_rand(rng, _F32, (t, m, n), 120, 127),
                   _rand(rng, _F32, (t, m, n), -5, 5)], [0.5, 0.5])
    return a, b, c


_BUILDERS = {
    "normal": _normal, "scaled": _scaled, "wide_exp": _wide_exp, "cancel": _cancel,
    "subnormal": _subnormal_family, "signed_zero": _signed_zero, "mixed_mag": _mixed_mag,
    "ties": _ties, "trunc_sign": _trunc_sign, "carry": _carry, "zero_huge": _zero_huge,
    "tiny": _tiny, "special": _special, "overflow": _overflow,
}
