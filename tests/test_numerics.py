"""Bit-exact tests of dash_ref.arithmetic.numerics: views, rounding, ULPs, the fp32 add contract."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_ref.arithmetic.numerics import (
    NAN_DISTANCE,
    bf16_bits,
    bits_bf16,
    bits_f32,
    bits_float,
    bits_fp16,
    cpu_keeps_subnormals,
    f32_bits,
    float_bits,
    float_format,
    flush_subnormals_f32,
    fp16_bits,
    fp32_add_rne,
    round_f32_to,
    ulp,
    ulp_distance,
    ulp_error,
    unit_roundoff,
)

LOW = (torch.bfloat16, torch.float16)
LOW_IDS = ["bf16", "fp16"]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_f32_bits(n: int, seed: int) -> torch.Tensor:
    """float32 values with uniformly drawn sign, biased exponent (0..255) and fraction."""
    g = gen(seed)
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64)
    exp = torch.randint(0, 256, (n,), generator=g, dtype=torch.int64)
    frac = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int64)
    return bits_f32((sign << 31) | (exp << 23) | frac)


def all_values(dtype: torch.dtype) -> torch.Tensor:
    """Every one of the 65536 bf16/fp16 bit patterns."""
    return bits_float(torch.arange(1 << 16, dtype=torch.int64), dtype)


def positive_finite(dtype: torch.dtype) -> torch.Tensor:
    """All finite non-negative values of a 16-bit format, ascending."""
    fmt = float_format(dtype)
    return bits_float(torch.arange(0, fmt.inf_bits, dtype=torch.int64), dtype)


def f32_neighbours(x: torch.Tensor) -> torch.Tensor:
    """x together with its fp32 predecessor and successor in magnitude (same sign)."""
    b = f32_bits(x).to(torch.int64)
    return torch.cat([x, bits_f32(b - 1), bits_f32(b + 1)])


def adversarial_f32(dtype: torch.dtype) -> torch.Tensor:
    """Exact ties of every adjacent pair of the target, +-1 fp32 ulp around them, specials."""
    pos = positive_finite(dtype).float()
    ties = (pos[:-1] + pos[1:]) / 2  # exact in fp32: one bit more than the target needs
    fmt = float_format(dtype)
    beyond = torch.tensor([2.0 ** (fmt.emax + 1)], dtype=torch.float64)
    overflow_tie = ((pos[-1].double() + beyond) / 2).float()  # first value that rounds to inf
    assert float(overflow_tie.double() - (pos[-1].double() + beyond) / 2) == 0
    special = torch.tensor(
        [0.0, math.inf, 2.0**-149, 2.0**-126, 2.0**-126 - 2.0**-149, 3.4028234663852886e38],
        dtype=torch.float32,
    )
    mags = torch.cat([pos, f32_neighbours(ties), f32_neighbours(overflow_tie), special])
    mags = mags[~torch.isnan(mags)]
    return torch.cat([mags, -mags])


def nan_patterns() -> torch.Tensor:
    frac = torch.tensor([1, 2, 0x1FFF, 0x2000, 0xFFFF, 0x3FFFFF, 0x400000, 0x7FFFFF])
    b = (0xFF << 23) | frac
    return bits_f32(torch.cat([b, b | (1 << 31)]))


def assert_same_float(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal bits where b is not NaN; NaN exactly where b is NaN."""
    assert a.dtype == b.dtype
    nan = torch.isnan(b)
    assert torch.equal(torch.isnan(a), nan)
    assert torch.equal(float_bits(a)[~nan], float_bits(b)[~nan])


# -- views ------------------------------------------------------------------------------
def test_bit_views_round_trip() -> None:
    g = gen(1)
    u32 = torch.randint(-(1 << 31), 1 << 31, (4096,), generator=g, dtype=torch.int64)
    x = bits_f32(u32)
    assert x.dtype == torch.float32
    assert torch.equal(f32_bits(x).to(torch.int64), u32)
    assert torch.equal(f32_bits(bits_f32(u32 & 0xFFFFFFFF)), f32_bits(x))  # unsigned, mod 2**32
    assert torch.equal(f32_bits(bits_f32(u32.to(torch.int32))), f32_bits(x))
    u16 = torch.randint(-(1 << 15), 1 << 15, (4096,), generator=g, dtype=torch.int16)
    assert torch.equal(bf16_bits(bits_bf16(u16)), u16)
    assert torch.equal(fp16_bits(bits_fp16(u16)), u16)
    assert torch.equal(bf16_bits(bits_bf16(u16.to(torch.int64) & 0xFFFF)), u16)
    assert float(bits_f32(torch.tensor([0x3F800000]))[0]) == 1.0
    assert float(bits_bf16(torch.tensor([0x3F80]))[0]) == 1.0
    assert float(bits_fp16(torch.tensor([0x3C00]))[0]) == 1.0


def test_bit_views_reject_wrong_dtype() -> None:
    with pytest.raises(TypeError):
        f32_bits(torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError):
        bf16_bits(torch.ones(2, dtype=torch.float16))
    with pytest.raises(TypeError):
        bits_f32(torch.ones(2))


def test_unit_roundoff_and_formats() -> None:
    assert unit_roundoff(torch.bfloat16) == 2.0**-8
    assert unit_roundoff(torch.float16) == 2.0**-11
    assert unit_roundoff(torch.float32) == 2.0**-24
    assert unit_roundoff(torch.float64) == 2.0**-53
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        fmt = float_format(dt)
        assert fmt.max_finite == torch.finfo(dt).max
        assert fmt.min_normal == torch.finfo(dt).tiny
        assert fmt.min_subnormal == float(bits_float(torch.tensor([1]), dt)[0])
    with pytest.raises(TypeError):
        unit_roundoff(torch.int32)


# -- rounding ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_rne_matches_torch_on_random_bits(dtype: torch.dtype) -> None:
    x = random_f32_bits(1 << 19, seed=2)
    assert_same_float(round_f32_to(x, dtype), x.to(dtype))


@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_rne_matches_torch_on_ties_and_boundaries(dtype: torch.dtype) -> None:
    x = adversarial_f32(dtype)
    y = round_f32_to(x, dtype)
    assert_same_float(y, x.to(dtype))
    fmt = float_format(dtype)
    # the targets themselves are fixed points, incl. subnormals, max finite and signed zeros
    vals = all_values(dtype)
    assert_same_float(round_f32_to(vals.float(), dtype), vals)
    # overflow: max finite stays, its tie with 2**(emax+1) goes to inf (even), below it stays
    big = torch.tensor([fmt.max_finite, 2.0 ** (fmt.emax + 1)], dtype=torch.float64)
    tie = ((big[0] + big[1]) / 2).float()
    below = bits_f32(f32_bits(tie.reshape(1)) - 1)
    assert math.isinf(float(round_f32_to(tie.reshape(1), dtype)[0]))
    assert float(round_f32_to(below, dtype)[0]) == fmt.max_finite


@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_rne_subnormal_ranges(dtype: torch.dtype) -> None:
    fmt = float_format(dtype)
    g = gen(3)
    # fp32 subnormals (exponent field 0) and values around the target's subnormal range
    frac = torch.randint(0, 1 << 23, (1 << 16,), generator=g, dtype=torch.int64)
    sub32 = bits_f32(frac | (torch.randint(0, 2, frac.shape, generator=g) << 31))
    e = torch.randint(
        max(0, fmt.emin - fmt.frac_bits - 3 + 127), fmt.emin + 2 + 127, frac.shape, generator=g
    )
    near = bits_f32((e << 23) | frac)
    for x in (sub32, near, -near):
        assert_same_float(round_f32_to(x, dtype), x.to(dtype))
    # results really are subnormal for some of them
    y = round_f32_to(near, dtype)
    assert bool(((y != 0) & (y.float().abs() < fmt.min_normal)).any())


@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_specials(dtype: torch.dtype) -> None:
    fmt = float_format(dtype)
    x = torch.tensor([0.0, -0.0, math.inf, -math.inf], dtype=torch.float32)
    for rounding in ("rne", "rtz"):
        for flush in (False, True):
            assert_same_float(round_f32_to(x, dtype, rounding, flush), x.to(dtype))
            y = round_f32_to(nan_patterns(), dtype, rounding, flush)
            assert bool(torch.isnan(y).all())
            b = float_bits(y).to(torch.int64) & 0xFFFF
            quiet = fmt.inf_bits | (1 << (fmt.frac_bits - 1))
            assert bool(((b & quiet) == quiet).all())  # quiet NaN, whatever the payload


def rtz_reference(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Truncation from torch's RNE: step one value toward zero where RNE rounded away."""
    y = x.to(dtype)
    away = y.double().abs() > x.double().abs()
    mag = float_bits(y).to(torch.int64) & 0x7FFF
    sign = float_bits(y).to(torch.int64) & 0x8000
    stepped = bits_float(sign | (mag - 1), dtype)
    return torch.where(away, stepped, y)


@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_rtz(dtype: torch.dtype) -> None:
    x = torch.cat([random_f32_bits(1 << 18, seed=4), adversarial_f32(dtype)])
    y = round_f32_to(x, dtype, rounding="rtz")
    assert_same_float(y, rtz_reference(x, dtype))
    finite = torch.isfinite(x)
    assert bool(torch.isfinite(y[finite]).all())  # truncation never overflows
    ok = ~torch.isnan(x)
    assert bool((y[ok].double().abs() <= x[ok].double().abs()).all())


def flush_reference(x: torch.Tensor, dtype: torch.dtype, rounding: str) -> torch.Tensor:
    """Flush fp32 subnormal inputs, round, flush subnormal results (all via torch)."""
    fmt = float_format(dtype)
    xf = torch.where(x.abs() < 2.0**-126, torch.copysign(torch.zeros_like(x), x), x)
    y = xf.to(dtype) if rounding == "rne" else rtz_reference(xf, dtype)
    tiny = (y.float().abs() < fmt.min_normal) & (y != 0)
    return torch.where(tiny, torch.copysign(torch.zeros_like(y), y), y)


@pytest.mark.parametrize("rounding", ["rne", "rtz"])
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_flush_subnormals(dtype: torch.dtype, rounding: str) -> None:
    x = torch.cat([random_f32_bits(1 << 16, seed=5), adversarial_f32(dtype)])
    y = round_f32_to(x, dtype, rounding, flush_subnormals=True)
    assert_same_float(y, flush_reference(x, dtype, rounding))
    fmt = float_format(dtype)
    nz = (y != 0) & ~torch.isnan(y)
    assert bool((y[nz].float().abs() >= fmt.min_normal).all())
    # the largest subnormal rounds up to min normal under RNE and survives the flush
    top = torch.tensor([fmt.min_normal * (1 - 2.0**-30)], dtype=torch.float32)
    if rounding == "rne" and float(top[0]) < fmt.min_normal:
        assert float(round_f32_to(top, dtype, "rne", True)[0]) == fmt.min_normal


def test_round_rejects_bad_arguments() -> None:
    x = torch.ones(3)
    with pytest.raises(TypeError):
        round_f32_to(x.double(), torch.bfloat16)
    with pytest.raises(TypeError):
        round_f32_to(x, torch.float32)
    with pytest.raises(ValueError):
        round_f32_to(x, torch.bfloat16, rounding="up")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(width=32, allow_nan=False), min_size=2, max_size=16),
    st.sampled_from(LOW),
    st.sampled_from(["rne", "rtz"]),
)
def test_rounding_is_monotone_and_close(vals: list[float], dtype: torch.dtype, rnd: str) -> None:
    x = torch.tensor(sorted(vals), dtype=torch.float32)
    y = round_f32_to(x, dtype, rnd).double()
    assert bool((y[1:] >= y[:-1]).all())
    fin = torch.isfinite(y) & (x.abs() <= float_format(dtype).max_finite)
    err = (y[fin] - x.double()[fin]).abs()
    limit = ulp(x.double()[fin], dtype) * (0.5 if rnd == "rne" else 1.0)
    assert bool((err <= limit).all())


# -- ULPs -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_ulp_is_spacing_of_every_value(dtype: torch.dtype) -> None:
    fmt = float_format(dtype)
    pos = positive_finite(dtype)
    nxt = bits_float(float_bits(pos).to(torch.int64) + 1, dtype).double()
    spacing = nxt - pos.double()
    spacing[-1] = 2.0 ** (fmt.emax - fmt.frac_bits)  # above max finite: same binade spacing
    got = ulp(pos, dtype)
    assert torch.equal(got, spacing)
    assert torch.equal(ulp(-pos, dtype), spacing)
    # a value strictly inside an interval has the spacing of its binade
    mid = (pos[:-1].double() + nxt[:-1]) / 2
    assert torch.equal(ulp(mid, dtype), spacing[:-1])
    assert float(ulp(torch.tensor([0.0]), dtype)[0]) == fmt.min_subnormal
    inf_nan = ulp(torch.tensor([math.inf, -math.inf, math.nan]), dtype)
    assert math.isinf(float(inf_nan[0])) and math.isinf(float(inf_nan[1]))
    assert math.isnan(float(inf_nan[2]))


def test_ulp_float32_and_float64() -> None:
    x = random_f32_bits(1 << 14, seed=6)
    x = x[torch.isfinite(x)]
    b = f32_bits(x.abs()).to(torch.int64)
    nxt = bits_f32(b + 1).double()
    ok = torch.isfinite(nxt)
    assert torch.equal(ulp(x, torch.float32)[ok], (nxt - x.abs().double())[ok])
    y = torch.tensor([1.0, 2.0**-1074, 0.0, 3.0, 2.0**-1022], dtype=torch.float64)
    want = torch.tensor(
        [2.0**-52, 2.0**-1074, 2.0**-1074, 2.0**-51, 2.0**-1074], dtype=torch.float64
    )
    assert torch.equal(ulp(y, torch.float64), want)


@pytest.mark.parametrize("dtype", [*LOW, torch.float32], ids=[*LOW_IDS, "fp32"])
def test_ulp_distance(dtype: torch.dtype) -> None:
    fmt = float_format(dtype)
    if fmt.bits == 16:
        vals = all_values(dtype)
        vals = vals[~torch.isnan(vals)]
    else:
        vals = random_f32_bits(1 << 14, seed=7)
        vals = vals[~torch.isnan(vals)]
    # neighbours are one step apart, also across zero and into infinity
    b = float_bits(vals).to(torch.int64)
    mag = b & ((1 << (fmt.bits - 1)) - 1)
    inner = (mag < fmt.inf_bits) & (vals >= 0)
    up = bits_float(b[inner] + 1, dtype)
    assert bool((ulp_distance(vals[inner], up) == 1).all())
    assert bool((ulp_distance(up, vals[inner]) == 1).all())
    z = bits_float(torch.tensor([0, 1 << (fmt.bits - 1)]), dtype)
    assert int(ulp_distance(z[:1], z[1:])[0]) == 0
    tiny = bits_float(torch.tensor([1]), dtype)
    assert int(ulp_distance(tiny, -tiny)[0]) == 2
    # additive along the number line
    g = gen(8)
    idx = torch.randint(0, vals.numel(), (3, 2000), generator=g)
    a, m, c = (vals[i] for i in idx)
    a, m, c = torch.sort(torch.stack([a.double(), m.double(), c.double()]), dim=0).values.to(dtype)
    assert torch.equal(ulp_distance(a, c), ulp_distance(a, m) + ulp_distance(m, c))
    nan = torch.tensor([math.nan], dtype=dtype)
    assert int(ulp_distance(nan, z[:1])[0]) == NAN_DISTANCE
    assert int(ulp_distance(z[:1], nan)[0]) == NAN_DISTANCE


def test_ulp_distance_dtype_argument() -> None:
    a = torch.tensor([1.0, 1.0 + 2.0**-7], dtype=torch.float64)
    assert torch.equal(ulp_distance(a[:1], a[1:], torch.bfloat16), torch.tensor([1]))
    assert torch.equal(ulp_distance(a[:1], a[1:], torch.float16), torch.tensor([8]))
    with pytest.raises(ValueError):
        ulp_distance(torch.tensor([1.0 + 2.0**-9]), a[:1], torch.bfloat16)
    with pytest.raises(TypeError):
        ulp_distance(a, a, torch.float64)


@pytest.mark.parametrize("dtype", LOW, ids=LOW_IDS)
def test_ulp_error(dtype: torch.dtype) -> None:
    x = random_f32_bits(1 << 16, seed=9)
    fmt = float_format(dtype)
    x = x[torch.isfinite(x) & (x.abs() <= fmt.max_finite)]
    y = round_f32_to(x, dtype)
    e = ulp_error(y, x.double(), dtype)
    assert float(e.max()) <= 0.5
    assert float(e.max()) > 0.49
    t = round_f32_to(x, dtype, "rtz")
    assert float(ulp_error(t, x.double(), dtype).max()) < 1.0
    vals = positive_finite(dtype)[1:-1]
    nxt = bits_float(float_bits(vals).to(torch.int64) + 1, dtype)
    assert bool((ulp_error(nxt, vals.double(), dtype) == 1).all())
    assert bool((ulp_error(vals, vals.double(), dtype) == 0).all())
    mid = (vals.double() + nxt.double()) / 2
    assert bool((ulp_error(vals, mid, dtype) == 0.5).all())


# -- fp32 accumulation contract ---------------------------------------------------------
def test_flush_subnormals_f32() -> None:
    x = random_f32_bits(1 << 16, seed=10)
    y = flush_subnormals_f32(x)
    b, c = f32_bits(x), f32_bits(y)
    sub = (b & 0x7F800000) == 0
    assert bool(sub.any()) and bool((~sub).any())
    assert torch.equal(c[~sub], b[~sub])
    assert torch.equal(c[sub], b[sub] & torch.tensor(-(1 << 31), dtype=torch.int32))


def exact_sum_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b rounded once to fp32 from the exact sum (checked exact in float64 by TwoSum)."""
    a64, b64 = a.double(), b.double()
    s = a64 + b64
    bb = s - a64
    err = (a64 - (s - bb)) + (b64 - bb)
    assert bool((err == 0).all()), "float64 sum not exact: widen nothing, pick closer exponents"
    return s.float()


def close_pairs(n: int, seed: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 pairs with biased exponents in [lo, hi) (including 0: subnormals) and both signs."""
    g = gen(seed)

    def draw() -> torch.Tensor:
        e = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64)
        f = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int64)
        s = torch.randint(0, 2, (n,), generator=g, dtype=torch.int64)
        return bits_f32((s << 31) | (e << 23) | f)

    return draw(), draw()


def test_fp32_add_is_rne_with_subnormals() -> None:
    assert cpu_keeps_subnormals()
    results = []
    for seed, (lo, hi) in enumerate([(0, 4), (0, 25), (100, 125), (200, 228), (1, 28)]):
        a, b = close_pairs(1 << 15, seed + 20, lo, hi)
        got = fp32_add_rne(a, b)
        assert torch.equal(f32_bits(got), f32_bits(exact_sum_f32(a, b)))
        results.append(got)
    got = torch.cat(results)
    sub = (got != 0) & (got.abs() < 2.0**-126)
    assert int(sub.sum()) > 1000  # subnormal results were produced and kept
    # the overflow boundary and exact cancellation (+0 under RNE)
    m = torch.tensor([3.4028234663852886e38, 1.0], dtype=torch.float32)
    assert torch.equal(f32_bits(fp32_add_rne(m, -m)), torch.zeros(2, dtype=torch.int32))
    assert math.isinf(float(fp32_add_rne(m[:1], m[:1])[0]))


def test_fp32_add_flush_model() -> None:
    a, b = close_pairs(1 << 14, 30, 0, 3)
    got = fp32_add_rne(a, b, flush_subnormals=True)
    want = flush_subnormals_f32(exact_sum_f32(flush_subnormals_f32(a), flush_subnormals_f32(b)))
    assert torch.equal(f32_bits(got), f32_bits(want))
    assert bool(((got == 0) | (got.abs() >= 2.0**-126)).all())
    assert bool((got != 0).any())
