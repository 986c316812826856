"""Specification of the Hopper tensor-core model (dash_ref.tensorcore) and its test set.

Expected values are worked out by hand from the rules in the module docstring (or from exact
integer/rational arithmetic), never by calling the model.  ``u`` below is ``2^-23``, the
fp32 unit in the last place of numbers in ``[1, 2)``.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from dash_ref.tensorcore import CANDIDATES, HOPPER, MMAConfig, mma, mma_bits, mma_k16
from verify.mma_cases import DEFAULT_COUNT, FAMILIES, allocate, generate

BF16, FP16, F32 = torch.bfloat16, torch.float16, torch.float32
NAN_BITS = 0x7FFFFFFF
INF_BITS = 0x7F800000


def bits32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32_of(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


def dot(a: list[float], b: list[float], c: float, dtype=BF16, config: MMAConfig = HOPPER,
        k: int = 16) -> torch.Tensor:
    """One output element: row ``a`` times column ``b`` (zero-padded to ``k``) plus ``c``."""
    a = list(a) + [0.0] * (k - len(a))
    b = list(b) + [0.0] * (k - len(b))
    at = torch.tensor([a], dtype=torch.float64).to(dtype)
    bt = torch.tensor([b], dtype=torch.float64).to(dtype).T
    assert np.array_equal(at.double().flatten().numpy(), a, equal_nan=True)
    assert np.array_equal(bt.double().flatten().numpy(), b, equal_nan=True)
    ct = torch.tensor([[c]], dtype=F32)
    return mma_k16(at, bt, ct, config=config)[0, 0]


def out_bits(x: torch.Tensor) -> int:
    return int(x.view(torch.int32).item()) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------
# exact cases
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_small_integers_are_exact(dtype):
    gen = np.random.default_rng(7)
    a = gen.integers(-8, 9, (5, 16, 16))
    b = gen.integers(-8, 9, (5, 16, 16))
    c = gen.integers(-1000, 1001, (5, 16, 16))
    exact = np.einsum("tmk,tkn->tmn", a, b) + c  # Python-int exact; |.| < 2^24
    d = mma_k16(torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype),
                torch.tensor(c, dtype=F32))
    assert torch.equal(d, torch.tensor(exact, dtype=F32))


def test_powers_of_two_are_exact():
    a = [2.0**k for k in range(16)]
    b = [2.0**-k for k in range(16)]
    assert dot(a, b, 0.5).item() == 16.5
    assert dot(a, [-x for x in b], 16.0).item() == 0.0


def test_batch_dimensions_broadcast():
    a = torch.ones(3, 1, 4, 16, dtype=BF16)
    b = torch.ones(2, 16, 5, dtype=BF16)
    c = torch.arange(5, dtype=F32).expand(4, 5)
    d = mma(a, b, c)
    assert d.shape == (3, 2, 4, 5)
    assert torch.equal(d, (16 + torch.arange(5, dtype=F32)).expand(3, 2, 4, 5))


# ---------------------------------------------------------------------------------------
# truncation: where the model departs from exact rounding, predictably
# ---------------------------------------------------------------------------------------
def test_terms_below_the_25th_fractional_bit_vanish():
    # C = 1 sets E = 0; sixteen products 2^-26 each sit below the 2^-25 grid: all cut to 0.
    d = dot([2.0**-13] * 16, [2.0**-13] * 16, 1.0)
    assert d.item() == 1.0
    assert 1.0 + 16 * 2.0**-26 == 1.0 + 2.0**-22  # the exact sum is an fp32 number, not kept


def test_the_25th_fractional_bit_is_kept_the_26th_is_not():
    # four products 2^-25 survive (+2^-23), eight products 2^-26 do not: 1 + u, not 1 + 2u
    a = [2.0**-12] * 4 + [2.0**-13] * 8
    b = [2.0**-13] * 4 + [2.0**-13] * 8
    assert dot(a, b, 1.0).item() == 1.0 + 2.0**-23
    # with 24 fractional bits the 2^-25 products vanish too; with 26 the 2^-26 ones stay
    assert dot(a, b, 1.0, config=CANDIDATES["fraction_bits_24"]).item() == 1.0
    assert dot(a, b, 1.0, config=CANDIDATES["fraction_bits_26"]).item() == 1.0 + 2.0**-22


def test_final_rounding_is_toward_zero():
    # 1 + 3 * 2^-24 = 1 + 1.5u: toward zero 1 + u (nearest-even would give 1 + 2u)
    a, b = [2.0**-12] * 3, [2.0**-12] * 3
    assert dot(a, b, 1.0).item() == 1.0 + 2.0**-23
    assert dot(a, b, 1.0, config=CANDIDATES["final_rne"]).item() == 1.0 + 2.0**-22
    assert dot(a, b, -1.0).item() == -1.0 + 3 * 2.0**-24  # below 1 the ulp is 2^-24: exact
    assert dot([-x for x in a], b, -1.0).item() == -(1.0 + 2.0**-23)


def test_aligned_terms_are_truncated_by_magnitude():
    # C = 1, one product -2^-30: its magnitude truncates to 0, result 1 (a floor, i.e.
    # two's-complement truncation, would give 1 - 2^-25 and then 1 - 2^-24)
    assert dot([-(2.0**-15)], [2.0**-15], 1.0).item() == 1.0
    assert dot([2.0**-15], [2.0**-15], -1.0).item() == -1.0
    assert dot([-(2.0**-15)], [2.0**-15], 1.0,
               config=CANDIDATES["align_floor"]).item() == 1.0 - 2.0**-24


def test_accumulator_takes_part_in_the_alignment():
    # C = 2^10 sets E = 10 and the grid to 2^-15; sixteen products 1.5 * 2^-16 each cut to 0.
    # Exactly, 1024 + 24 * 2^-16 = 1024 + 1.5 * 2^-12 is an fp32 number.
    d = dot([1.5 * 2.0**-8] * 16, [2.0**-8] * 16, 1024.0)
    assert d.item() == 1024.0


def test_product_exponent_is_the_sum_of_input_exponents():
    # 1.5 * 1.5 = 2.25 counts with exponent 0 (not renormalised to 1): the grid is 2^-25,
    # so fifteen products 2^-25 survive: 2.25 + 15 * 2^-25, toward zero on the 2^-22 grid.
    a = [1.5] + [2.0**-12] * 15
    b = [1.5] + [2.0**-13] * 15
    assert dot(a, b, 0.0).item() == 2.25 + 2.0**-22


def test_carry_into_the_next_binade():
    # C just below 2: 2 - u, plus two products u/2 + u/2 = u exactly gives 2
    assert dot([2.0**-12] * 2, [2.0**-12] * 2, 2.0 - 2.0**-23).item() == 2.0
    # sixteen products 3.9375 (= 1.96875 * 2, top of the range) add up past 2^5
    d = dot([1.96875] * 16, [2.0] * 16, 0.0)
    assert d.item() == 63.0


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_half_precision_operands_alike(dtype):
    # 2^-12 is normal in both formats; same truncation and rounding as above
    assert dot([2.0**-12] * 3, [2.0**-12] * 3, 1.0, dtype).item() == 1.0 + 2.0**-23


# ---------------------------------------------------------------------------------------
# zeros, subnormals, specials
# ---------------------------------------------------------------------------------------
def test_exact_zero_is_positive():
    assert out_bits(dot([-0.0] * 16, [0.0] * 16, -0.0)) == 0x00000000  # all terms -0
    assert out_bits(dot([1.0, -1.0], [3.0, 3.0], -0.0)) == 0x00000000
    assert out_bits(dot([1.0], [1.0], -1.0)) == 0x00000000
    assert out_bits(dot([-1.0], [1.0], 1.0)) == 0x00000000
    assert out_bits(dot([-0.0] * 16, [0.0] * 16, -0.0,
                        config=CANDIDATES["exact_zero_ieee"])) == 0x80000000


def test_subnormal_inputs():
    # bf16 0x0001 = 2^-133 (subnormal) times 2^100 = 2^-33, exactly
    a = torch.tensor([[1] + [0] * 15], dtype=torch.int16).view(BF16)
    assert a[0, 0].item() == 2.0**-133
    b = torch.zeros(16, 1, dtype=BF16)
    b[0, 0] = 2.0**100
    assert mma_k16(a, b, torch.zeros(1, 1)).item() == 2.0**-33
    # fp16 0x0001 = 2^-24 (subnormal) times 2^-10 = 2^-34
    a16 = torch.tensor([[1] + [0] * 15], dtype=torch.int16).view(FP16)
    b16 = torch.zeros(16, 1, dtype=FP16)
    b16[0, 0] = 2.0**-10
    assert mma_k16(a16, b16, torch.zeros(1, 1)).item() == 2.0**-34


def test_subnormal_results():
    # 1.5 * 2^-149 toward zero is the smallest fp32 subnormal
    assert out_bits(dot([1.5 * 2.0**-74], [2.0**-75], 0.0)) == 0x00000001
    # 2^-130 (a bf16 subnormal) * 8 = 2^-127, an fp32 subnormal, exact
    assert out_bits(dot([2.0**-130], [8.0], 0.0)) == 0x00400000
    # a subnormal C passes through unchanged when nothing else is there
    assert out_bits(dot([], [], f32_of(0x00000123))) == 0x00000123


def test_zero_operand_exponent():
    # bf16: 0 * 2^127 counts with exponent -126 + 127 = 1, so E = 1 and the grid is 2^-24:
    # C = 2^-10 + 2^-33 loses its 2^-33, the product 2^-20 stays.  Leaving zeros out
    # (E = -10) keeps C whole: 2^-10 + 2^-20 + 2^-33 is an fp32 number.
    a, b, c = [0.0, 1.0], [2.0**127, 2.0**-20], 2.0**-10 + 2.0**-33
    assert dot(a, b, c).item() == 2.0**-10 + 2.0**-20
    expect = 2.0**-10 + 2.0**-20 + 2.0**-33
    assert dot(a, b, c, config=CANDIDATES["zero_exclude"]).item() == expect
    # fp16: a zero operand counts as -126, so 0 * 2^15 changes nothing; counted at fp16's
    # own minimum (-14) it would give E = 1 and cut C = 2^-12 + 2^-33 to 2^-12
    a, b, c = [0.0, 1.0], [2.0**15, 2.0**-10], 2.0**-12 + 2.0**-33
    assert dot(a, b, c, FP16).item() == 2.0**-10 + 2.0**-12 + 2.0**-33
    fmin = CANDIDATES["zero_format_min"]
    assert dot(a, b, c, FP16, config=fmin).item() == 2.0**-10 + 2.0**-12


def test_products_below_the_accumulator_floor():
    # sixteen products 2^-152 with C = +0: the zero C counts with exponent -126, the grid is
    # 2^-151 and every product truncates to 0.  Without that floor the sum is 2^-148.
    a, b = [2.0**-76] * 16, [2.0**-76] * 16
    assert out_bits(dot(a, b, 0.0)) == 0
    assert dot(a, b, 0.0, config=CANDIDATES["zero_exclude"]).item() == 2.0**-148
    assert dot(a, b, 0.0, config=CANDIDATES["zero_exclude_floor_m133"]).item() == 2.0**-148
    # an empty accumulator (c=None) is a +0 term by default, or no term at all
    at = torch.tensor([a], dtype=BF16)
    bt = torch.tensor([b], dtype=BF16).T
    assert out_bits(mma(at, bt)) == 0
    assert mma(at, bt, config=CANDIDATES["accumulator_absent"]).item() == 2.0**-148


def test_infinities_and_nans():
    inf = math.inf
    assert out_bits(dot([inf], [2.0], 1.0)) == INF_BITS
    assert out_bits(dot([inf], [-2.0], 1.0)) == 0x80000000 | INF_BITS
    assert out_bits(dot([1.0], [1.0], -inf)) == 0x80000000 | INF_BITS
    assert out_bits(dot([inf], [0.0], 1.0)) == NAN_BITS  # 0 * inf
    assert out_bits(dot([inf, -inf], [1.0, 1.0], 0.0)) == NAN_BITS
    assert out_bits(dot([-inf], [1.0], inf)) == NAN_BITS
    assert out_bits(dot([math.nan], [1.0], 0.0)) == NAN_BITS
    assert out_bits(dot([1.0], [1.0], f32_of(0xFFC00123))) == NAN_BITS  # any payload


def test_overflow():
    # 2^127 * 2 = 2^128 is beyond fp32: +inf (the published models; IEEE RZ would saturate)
    assert out_bits(dot([2.0**127], [2.0], 0.0)) == INF_BITS
    assert dot([2.0**127], [2.0], 0.0, config=CANDIDATES["overflow_saturate"]).item() == \
        f32_of(0x7F7FFFFF)
    # two products 2^128 that cancel exactly still set E = 128: C = 1 is cut away, result +0
    assert out_bits(dot([2.0**127, 2.0**127], [2.0, -2.0], 1.0)) == 0


# ---------------------------------------------------------------------------------------
# chaining k16 steps
# ---------------------------------------------------------------------------------------
def test_chaining_order_and_step():
    # block 1: 1 + 3 * 2^-24 -> 1 + u (toward zero); block 2 adds 2^-24: 1 + 1.5u -> 1 + u.
    # Descending: block 2 first gives 2^-24, then block 1: 1 + 4 * 2^-24 = 1 + 2u exactly.
    # One fused 32-term step: also 1 + 2u.
    a = torch.zeros(1, 32, dtype=BF16)
    b = torch.zeros(32, 1, dtype=BF16)
    a[0, 0], b[0, 0] = 1.0, 1.0
    a[0, 1:4], b[1:4, 0] = 2.0**-12, 2.0**-12
    a[0, 16], b[16, 0] = 2.0**-12, 2.0**-12
    assert mma(a, b).item() == 1.0 + 2.0**-23
    assert mma(a, b, order="descending").item() == 1.0 + 2.0**-22
    assert mma(a, b, k_step=32).item() == 1.0 + 2.0**-22
    with pytest.raises(ValueError):
        mma(a[:, :24], b[:24])
    with pytest.raises(ValueError):
        mma_k16(a, b, torch.zeros(1, 1))


def test_zero_padding_is_exact():
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(4, 8, 20, generator=gen).to(BF16)
    b = torch.randn(4, 20, 8, generator=gen).to(BF16)
    c = torch.randn(4, 8, 8, generator=gen)
    pa = torch.cat([a, torch.zeros(4, 8, 12, dtype=BF16)], dim=2)
    pb = torch.cat([b, torch.zeros(4, 12, 8, dtype=BF16)], dim=1)
    d = mma(pa, pb, c)
    # the last block holds 4 real columns and 12 zero ones: the same bits as one fused step
    # over just the 4 real products
    first = mma_k16(pa[..., :16], pb[:, :16], c)
    assert torch.equal(d, mma(a[..., 16:], b[:, 16:], first, k_step=4))


# ---------------------------------------------------------------------------------------
# the vectorised model against a scalar rendering of the written rules
# ---------------------------------------------------------------------------------------
def _lead_exp(x: float, emin: int) -> int:
    if x == 0:
        return -126  # a zero operand or accumulator counts as -126
    return max(math.frexp(abs(x))[1] - 1, emin)


def _reference(arow: list[float], bcol: list[float], c: float, emin: int) -> int:
    """The module docstring's rules, one element at a time, in rational arithmetic."""
    nan = math.isnan(c)
    pinf, ninf = c == math.inf, c == -math.inf
    for x, y in zip(arow, bcol):
        if math.isnan(x) or math.isnan(y) or (math.isinf(x) and y == 0) or \
                (x == 0 and math.isinf(y)):
            nan = True
        elif math.isinf(x) or math.isinf(y):
            positive = math.copysign(1, x) * math.copysign(1, y) > 0
            pinf, ninf = pinf or positive, ninf or not positive
    if nan or (pinf and ninf):
        return NAN_BITS
    if pinf or ninf:
        return INF_BITS | (0x80000000 if ninf else 0)
    terms = [(Fraction(x) * Fraction(y), _lead_exp(x, emin) + _lead_exp(y, emin))
             for x, y in zip(arow, bcol)]
    terms.append((Fraction(c), _lead_exp(c, -126)))
    grid = Fraction(2) ** (max(e for _, e in terms) - 25)
    total = sum((1 if v > 0 else -1) * math.floor(abs(v) / grid) * grid for v, _ in terms)
    if total == 0:
        return 0
    mag = abs(total)
    lead = mag.numerator.bit_length() - mag.denominator.bit_length()
    while Fraction(2) ** lead > mag:
        lead -= 1
    while Fraction(2) ** (lead + 1) <= mag:
        lead += 1
    quantum = Fraction(2) ** max(lead - 23, -149)
    kept = math.floor(mag / quantum) * quantum
    if kept >= Fraction(2) ** 128:
        return INF_BITS | (0x80000000 if total < 0 else 0)
    return bits32(float(kept) if total > 0 else -float(kept))


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_model_matches_scalar_rules_on_every_family(dtype):
    cases = generate(dtype, count=6 * len(FAMILIES), seed=11)
    got = mma_bits(cases.a_bits, cases.b_bits, cases.c_bits, dtype)
    a, b, c = cases.tensors()
    a, b, c = a.double().numpy(), b.double().numpy(), c.double().numpy()
    emin = -126 if dtype == "bf16" else -14
    picks = np.random.default_rng(5).integers(0, 16, (len(cases), 8, 2))
    for t in range(len(cases)):
        for i, j in picks[t]:
            want = _reference(list(a[t, i]), list(b[t, :, j]), float(c[t, i, j]), emin)
            assert int(got[t, i, j]) == want, (dtype, FAMILIES[cases.family[t]], t, i, j)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_chained_model_matches_scalar_rules(dtype):
    cases = generate(dtype, count=len(FAMILIES), seed=12, shape=(64, 64, 64))
    got = mma_bits(cases.a_bits, cases.b_bits, cases.c_bits, dtype)
    a, b, c = cases.tensors()
    a, b, c = a.double().numpy(), b.double().numpy(), c.double().numpy()
    emin = -126 if dtype == "bf16" else -14
    picks = np.random.default_rng(6).integers(0, 64, (len(cases), 3, 2))
    for t in range(len(cases)):
        for i, j in picks[t]:
            acc = float(c[t, i, j])
            for k0 in range(0, 64, 16):  # four k16 steps, ascending
                acc = f32_of(_reference(list(a[t, i, k0:k0 + 16]), list(b[t, k0:k0 + 16, j]),
                                        acc, emin))
            assert int(got[t, i, j]) == bits32(acc) or (math.isnan(acc) and
                                                        int(got[t, i, j]) == NAN_BITS)


# ---------------------------------------------------------------------------------------
# the test set
# ---------------------------------------------------------------------------------------
def test_allocation():
    alloc = allocate(DEFAULT_COUNT)
    assert DEFAULT_COUNT >= 10_000 and sum(alloc.values()) == DEFAULT_COUNT
    assert set(alloc) == set(FAMILIES) and min(alloc.values()) >= 400
    small = allocate(len(FAMILIES))
    assert all(v == 1 for v in small.values())
    assert sum(allocate(5).values()) == 5


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_test_set_is_seeded_and_complete(dtype):
    one = generate(dtype, count=700, seed=4)
    two = generate(dtype, count=700, seed=4)
    other = generate(dtype, count=700, seed=5)
    assert one.fingerprint() == two.fingerprint() != other.fingerprint()
    assert len(one) == 700 and one.shape == (16, 16, 16)
    assert one.counts() == allocate(700)
    a, b, c = one.tensors()
    assert a.dtype == {"bf16": BF16, "fp16": FP16}[dtype] and c.dtype == F32
    assert np.array_equal(a.view(torch.int16).numpy().view(np.uint16), one.a_bits)

    frac_bits, exp_mask = (7, 0xFF) if dtype == "bf16" else (10, 0x1F)
    fam = {name: one.family == i for i, name in enumerate(FAMILIES)}

    def field(x):
        return (x.astype(np.int64) >> frac_bits) & exp_mask

    sub_a = (field(one.a_bits) == 0) & ((one.a_bits & ((1 << frac_bits) - 1)) > 0)
    assert sub_a[fam["subnormal"]].mean() > 0.3
    c_sub = ((one.c_bits >> 23) & 0xFF == 0) & (one.c_bits & 0x7FFFFF > 0)
    assert c_sub[fam["subnormal"]].any()
    assert (one.a_bits[fam["signed_zero"]] == 0x8000).any()
    assert (one.c_bits[fam["signed_zero"]] == 0x80000000).any()
    special = field(one.a_bits) == exp_mask
    assert special[fam["special"]].any() and not special[~fam["special"]].any()
    assert ((one.c_bits >> 23) & 0xFF == 0xFF)[fam["special"]].any()
    zero_a = (one.a_bits & 0x7FFF) == 0
    assert zero_a[fam["zero_huge"]].mean() > 0.1
    if dtype == "bf16":
        prods = np.abs(a.double().numpy()[fam["tiny"]]).max() * \
            np.abs(b.double().numpy()[fam["tiny"]]).max()
        assert prods < 2.0**-126  # every product of the tiny family is below 2^-126


def test_test_set_of_64_tiles():
    cases = generate("bf16", count=64, seed=0, shape=(64, 64, 64))
    assert cases.a_bits.shape == (64, 64, 64) and cases.c_bits.shape == (64, 64, 64)
    d = mma_bits(cases.a_bits, cases.b_bits, cases.c_bits, "bf16")
    assert d.shape == (64, 64, 64) and d.dtype == np.uint32
