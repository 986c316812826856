"""Specification of the Hopper tensor-core model (dash_ref.arithmetic.tensorcore) and its test set.

Expected values are worked out by hand from the rules in the module docstring (or from exact
integer/rational arithmetic), never by calling the model, or are outputs measured on an H200
(``benchmarks/results/mma_validation/mismatches.txt``).  ``u`` below is ``2^-23``, the fp32
unit in the last place of numbers in ``[1, 2)``.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
import torch

from dash_ref.arithmetic.tensorcore import (
    CANDIDATES,
    HOPPER,
    MMA_SIM,
    MMAConfig,
    mma,
    mma_bits,
    mma_k16,
)
from scripts.mma_cases import DEFAULT_COUNT, FAMILIES, allocate, generate

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
    # bf16: the zero product 0 * 2^127 takes no part, so E = -10 (from C) and C stays whole:
    # 2^-10 + 2^-20 + 2^-33 is an fp32 number.  Counted at -126 + 127 = 1 (MMA-Sim), E = 1,
    # the grid is 2^-24 and C loses its 2^-33.
    a, b, c = [0.0, 1.0], [2.0**127, 2.0**-20], 2.0**-10 + 2.0**-33
    assert dot(a, b, c).item() == 2.0**-10 + 2.0**-20 + 2.0**-33
    assert dot(a, b, c, config=MMA_SIM).item() == 2.0**-10 + 2.0**-20
    # fp16: 0 * 2^15 changes nothing in either reading (-126 + 15 is far below 2^-10); counted
    # at fp16's own minimum (-14) it would give E = 1 and cut C = 2^-12 + 2^-33 to 2^-12
    a, b, c = [0.0, 1.0], [2.0**15, 2.0**-10], 2.0**-12 + 2.0**-33
    assert dot(a, b, c, FP16).item() == 2.0**-10 + 2.0**-12 + 2.0**-33
    assert dot(a, b, c, FP16, config=MMA_SIM).item() == 2.0**-10 + 2.0**-12 + 2.0**-33
    fmin = CANDIDATES["zero_format_min"]
    assert dot(a, b, c, FP16, config=fmin).item() == 2.0**-10 + 2.0**-12


def test_fp16_zero_products_over_a_small_accumulator():
    # the one place where the readings differ for fp16: every product zero, one against
    # 2^15, and C = 2^-120 (1 + 2^-23).  Zeros left out: E = -120, C passes whole.  Counted
    # at -126 + 15 = -111 (MMA-Sim): the grid is 2^-136 and C's last bit 2^-143 is cut.
    c = 2.0**-120 * (1 + 2.0**-23)
    assert dot([0.0] * 16, [2.0**15] * 16, c, FP16).item() == c
    assert dot([0.0] * 16, [2.0**15] * 16, c, FP16, config=MMA_SIM).item() == 2.0**-120


def test_alignment_exponent_floor():
    # sixteen products 2^-152 with C = +0: the zero C takes no part, E = max(-152, -133) =
    # -133, the grid is 2^-158 and the sum 2^-148 is exact.  MMA-Sim's zero C at -126 puts
    # the grid at 2^-151, and every product truncates to 0.
    a, b = [2.0**-76] * 16, [2.0**-76] * 16
    assert dot(a, b, 0.0).item() == 2.0**-148
    assert out_bits(dot(a, b, 0.0, config=MMA_SIM)) == 0
    # an empty accumulator (c=None): no term in the model, a +0 term at -126 for MMA-Sim
    at = torch.tensor([a], dtype=BF16)
    bt = torch.tensor([b], dtype=BF16).T
    assert mma(at, bt).item() == 2.0**-148
    assert out_bits(mma(at, bt, config=MMA_SIM)) == 0
    assert mma(at, bt, config=CANDIDATES["accumulator_absent"]).item() == 2.0**-148
    # 2^-140 - 2^-160: on the 2^-158 grid the small product is cut (toward zero) and the
    # result is 2^-140 exactly.  Without the floor (E = -140, grid 2^-165) it stays, and the
    # sum rounds toward zero to 2^-140 - 2^-149.
    a, b = [2.0**-70, -(2.0**-80)], [2.0**-70, 2.0**-80]
    assert dot(a, b, 0.0).item() == 2.0**-140
    assert dot(a, b, 0.0, config=CANDIDATES["zero_exclude"]).item() == 2.0**-140 - 2.0**-149
    # the floor is -133, not -134 or -132: 2^-140 - 2^-159 (grid 2^-158: cut; a floor of
    # -134 keeps it) and 2^-140 - 2^-158 (kept; a floor of -132 cuts it)
    a, b = [2.0**-70, -(2.0**-80)], [2.0**-70, 2.0**-79]
    assert dot(a, b, 0.0).item() == 2.0**-140
    assert dot(a, b, 0.0, config=CANDIDATES["floor_m134"]).item() == 2.0**-140 - 2.0**-149
    a, b = [2.0**-70, -(2.0**-79)], [2.0**-70, 2.0**-79]
    assert dot(a, b, 0.0).item() == 2.0**-140 - 2.0**-149
    assert dot(a, b, 0.0, config=CANDIDATES["floor_m132"]).item() == 2.0**-140


def test_a_sum_that_rounds_to_zero_is_positive():
    # -2^-152 (+ 0): on the 2^-158 grid the sum is -2^-152, below the smallest fp32
    # subnormal, and rounds toward zero to a zero: +0, not -0
    assert out_bits(dot([-(2.0**-76)], [2.0**-76], 0.0)) == 0x00000000
    assert out_bits(dot([-(2.0**-76)], [2.0**-76], -0.0)) == 0x00000000
    signed = CANDIDATES["zero_exclude_floor_m133"]  # the model but for this rule
    assert out_bits(dot([-(2.0**-76)], [2.0**-76], 0.0, config=signed)) == 0x80000000
    # above the fp32 range's bottom nothing changes: -1.5 * 2^-149 rounds to -2^-149
    assert out_bits(dot([-1.5 * 2.0**-74], [2.0**-75], 0.0)) == 0x80000001


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
# outputs measured on an H200 (bf16, tl.dot; benchmarks/results/mma_validation/)
# ---------------------------------------------------------------------------------------
# Elements where the H200 departed from MMA-Sim's reading: A's row and B's column (bf16 bits,
# k ascending), C (fp32 bits; None: tl.dot from a zero accumulator, the first instruction
# without C), the H200's output and MMA-Sim's prediction.  k16: one mma.sync.m16n8k16;
# k64: four wgmma.m64nNk16 chained in ascending k.  Every product lies below 2^-126, most
# below 2^-149.  MMA-Sim lets the zero C in at -126, which sets the grid to 2^-151 and
# truncates the products there; the H200 keeps them on the 2^-158 grid of E = -133.  In the
# two zero results the sum is a negative multiple of 2^-158 above -2^-149 (e.g. tile 2253
# (5, 2): the largest product -1.18 * 2^-151, the sum about -0.82 * 2^-151), which rounds
# toward zero to a zero: the H200 writes +0, not -0.
MEASURED = [  # (kernel, tile, row, col, A row, B column, C or None, H200 bits, MMA-Sim bits)
    ("k16", 2253, 5, 2,
      "1bda 9be4 200a 122f 985f 96b4 95ea 9854 000e 8c81 8512 0040 a146 1b96 0cf0 1f52",
      "839a 86f7 84b8 1e59 8485 1376 1997 8003 817c 00bb 999a 0871 1244 1453 87bb 81c2",
     "80000000", 0x00000000, 0x80000000),
    ("k16", 2256, 7, 4,
      "9cd6 15dc 1c66 9473 98d9 8e5a 1f09 9583 990d 1759 0dd5 9086 18da 1ea5 9a6b 9092",
      "1ba4 1257 8cef 97e0 8028 8d60 89ce 8e0d 1f57 9d89 8971 0f43 0045 9b33 1db3 9f62",
     "80000000", 0x800009db, 0x800009da),
    ("k16", 2308, 1, 0,
      "9c84 9cc0 9cb4 1c85 1c92 1c8b 1cb6 9cf6 8076 1cf5 1ced 1cb1 9cc9 9cee 1c8e 9cf0",
      "1c93 9cfc 1cba 1ce9 9c8d 1c8e 9cfc 9c87 0040 1ca4 1cf4 1c9f 9c99 1c8a 1ca7 9c8b",
     "80000000", 0x000017b2, 0x000017b1),
    ("k16_noacc", 2253, 9, 7,
      "9418 90ef 1100 0057 0001 a1b5 8006 8066 1253 9798 81c5 0c1b 0b59 0266 8007 82b6",
      "1399 a232 0e43 0058 0f07 0a3b 09c8 0d09 97c3 1c1e 0c4c 081f 802d 0031 098f 11e2",
     None, 0x00000000, 0x80000000),
    ("k16_noacc", 2256, 0, 14,
      "0b30 8066 111a 965f 1738 1540 9f0e 0063 0b14 09d5 8ca8 94a1 1619 9c00 1748 1570",
      "1282 9915 126f 9ef4 900d 10f3 96df 9962 0d29 164c 0bbf 0cdc 8aca 8d1d 9212 8006",
     None, 0x0000000b, 0x0000000a),
    ("k64", 61, 22, 2,
      "9c99 a1e3 9d31 177c 13d5 007c 146d a168 a124 12db 11d8 980a 0046 1fe6 178b 9368 "
      "8019 9cf5 17de 9570 a335 22b7 21f3 2254 191d 9d41 1f06 22b6 006b 92d5 a233 165e "
      "9e4c 18d0 1cdc 23b2 001e 926f 968e 92ee 18f1 1ce2 961f a4f7 247b 9fa1 933f 21a4 "
      "190a 9220 981b 0056 9d73 118a 8018 a0b1 1e51 1789 1130 1474 805e 96d6 1121 806d",
      "0008 90ef 1db4 9e17 a016 1b80 1901 99c8 0035 93b5 94cd 10cb 996b 1e72 003f 17ef "
      "959e 1ec9 912f a39f 95e4 1561 9ed6 1f65 153c a18c 9559 1aad 19a2 1fe3 9e65 1ca3 "
      "971a 22f8 a0cb 978d 18c3 9b23 9307 a24c 91e2 9ac6 130c 948f 8060 0034 16c4 174a "
      "22e2 919d 98f8 004d 12d7 1daf 0036 1b28 1db0 1712 1638 18f3 a364 9dc7 a4a3 241d",
     "00000000", 0x0237bf51, 0x0237bf52),
    ("k64", 62, 1, 51,
      "1623 9387 9567 1838 1c9b 9337 95f5 1422 141c 166c 0056 9b70 960b 1296 9cd6 92a5 "
      "9a74 1a4f 150f 1800 14f9 94f6 8040 1e7d 9207 95ad 1f78 1a77 9a1d 1820 0039 95bd "
      "1326 1be6 1e79 9c54 1a00 9df7 1954 962d 16e1 1edc 131b 1d79 964d 996c 9df5 1caf "
      "937d 1dbd 1663 15f0 1aaa 12bb 945d 149f 9320 1dcf 9d18 9e66 0019 1519 1e9c 187c",
      "1e6b 9520 8018 9b5a 1642 9bd2 1505 166f 1b22 15c2 124d 800d 9969 9b6d 0044 93ec "
      "96cc 1d35 1666 9907 993e 007b 1a7f 9c5a 174a 8054 1244 9608 1abd 143b 98f1 9802 "
      "95ab 92de 1346 0052 195f 9370 9ce0 9837 1e87 1801 004b 19f2 1a22 940f 1999 17b4 "
      "95da 1db8 17d4 807b 1c14 9313 19d0 8004 1699 1f5d 16cd 9260 95b8 9e8b 8028 1910",
     "80000001", 0x0002f430, 0x0002f42f),
    ("k64_noacc", 61, 8, 23,
      "0072 9f6a 18fb 0066 1759 9be9 9215 964e 194b 2028 12b4 1c77 1e00 90bc 14f8 9dba "
      "1b29 9ac3 805b 9ad6 8075 1cd0 9e95 9c82 1f1b 194e 1c22 131d 1760 1bb3 1204 217b "
      "1583 93ff 99c9 9ec9 92ee 8049 1d1b 9672 1a0d 179b 1723 916f 2428 121e 9eaa 9253 "
      "1eae a3f9 1437 9a07 17c5 1284 9970 9cd2 0005 237b 1ab1 1c7b 99bd 95c4 9a22 1e88",
      "8073 9370 91cd a0e6 000c 807e 22ef 1943 1cc4 9569 9748 1683 1500 24f2 22dc 9132 "
      "9eca 90d4 2357 9eff 92a6 17c4 1283 9849 1b89 a108 2058 1bff a139 9a0c 9fcd 1919 "
      "94d6 9bb4 993b a15c 9fab 9f3d 9385 2220 0026 9614 1e29 964b 1188 9851 90e9 a33e "
      "9631 96f4 1e85 2298 22ee 805b 91c4 9e89 1fbe 18a8 9868 1e21 9b84 2160 9ad6 1bf4",
     None, 0x00add822, 0x00add821),
]


def _measured(kernel, a_row, b_col, c, config):
    a = np.array([[[int(x, 16) for x in a_row.split()]]], np.uint16)
    b = np.array([[int(x, 16) for x in b_col.split()]], np.uint16).T[None]
    cb = None if c is None else np.array([[[int(c, 16)]]], np.uint32)
    assert a.shape[2] == b.shape[1] == (16 if kernel.startswith("k16") else 64)
    return int(mma_bits(a, b, cb, "bf16", config=config)[0, 0, 0])


@pytest.mark.parametrize("case", MEASURED, ids=lambda r: f"{r[0]}-{r[1]}-{r[2]}-{r[3]}")
def test_measured_h200_outputs(case):
    kernel, _tile, _row, _col, a_row, b_col, c, h200, mma_sim = case
    assert _measured(kernel, a_row, b_col, c, HOPPER) == h200
    assert _measured(kernel, a_row, b_col, c, MMA_SIM) == mma_sim  # the old reading, kept
    if h200 == 0:  # the model but for the sign of a rounded zero gives -0
        signed = CANDIDATES["zero_exclude_floor_m133"]
        assert _measured(kernel, a_row, b_col, c, signed) == 0x80000000


def test_measured_zero_results_are_negative_sums():
    # the +0 outputs above are not exact zeros: the sum of the products is negative and
    # smaller than 2^-149 in magnitude
    for kernel, _t, _r, _c, a_row, b_col, _acc, h200, _ in MEASURED:
        if h200 != 0:
            continue
        a = torch.tensor([int(x, 16) for x in a_row.split()], dtype=torch.int32)
        b = torch.tensor([int(x, 16) for x in b_col.split()], dtype=torch.int32)
        a = a.to(torch.int16).view(BF16).double()
        b = b.to(torch.int16).view(BF16).double()
        exact = sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b))
        assert -Fraction(2) ** -149 < exact < 0, kernel


# ---------------------------------------------------------------------------------------
# fp16: the refined reading against MMA-Sim's
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,count", [((16, 16, 16), 400), ((64, 64, 64), 28)])
def test_fp16_outputs_unchanged_by_the_refined_reading(shape, count):
    # fp16 products neither underflow nor lose to a zero's exponent, so the model and
    # MMA-Sim's reading give the same bits on the test set, with and without C, except where
    # every product of a k-step is zero and a small normal C faces a zero times a large
    # partner (rows the zero_huge family plants for the H200 to decide): there the model
    # passes C through whole
    cases = generate("fp16", count=count, seed=0, shape=shape)
    zero = lambda x: (x & 0x7FFF) == 0  # noqa: E731
    all_zero = np.ones(cases.c_bits.shape, bool)
    for k0 in range(0, shape[2], 16):  # every product of every k-step zero
        za, zb = zero(cases.a_bits[:, :, k0:k0 + 16]), zero(cases.b_bits[:, k0:k0 + 16])
        all_zero &= np.all(za[:, :, :, None] | zb[:, None, :, :], axis=2)
    for c in (cases.c_bits, None):
        new = mma_bits(cases.a_bits, cases.b_bits, c, "fp16", config=HOPPER)
        old = mma_bits(cases.a_bits, cases.b_bits, c, "fp16", config=MMA_SIM)
        diff = new != old
        assert not (diff & ~all_zero).any()
        if c is not None:
            assert diff.any() and np.array_equal(new[diff], c[diff])
            assert (cases.family[np.nonzero(diff)[0]] == FAMILIES.index("zero_huge")).all()
        else:
            assert not diff.any()


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
        return -126  # MMA-Sim: a zero operand or accumulator counts as -126
    return max(math.frexp(abs(x))[1] - 1, emin)


def _reference(arow: list[float], bcol: list[float], c: float, emin: int,
               mma_sim: bool = False) -> int:
    """The module docstring's rules, one element at a time, in rational arithmetic: zero
    terms left out of ``E``, ``E >= -133``, a zero result ``+0``; or (``mma_sim``) zeros
    at ``-126``, no floor, a negative sum that rounds to zero ``-0``."""
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
    floor = [] if mma_sim else [-133]  # and zero terms left out
    e_max = max([e for v, e in terms if mma_sim or v != 0] + floor)
    grid = Fraction(2) ** (e_max - 25)
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
    if kept == 0 and not mma_sim:
        return 0
    if kept >= Fraction(2) ** 128:
        return INF_BITS | (0x80000000 if total < 0 else 0)
    return bits32(float(kept) if total > 0 else -float(kept))


@pytest.mark.parametrize("reading", ["hopper", "mma_sim"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_model_matches_scalar_rules_on_every_family(dtype, reading):
    cases = generate(dtype, count=6 * len(FAMILIES), seed=11)
    got = mma_bits(cases.a_bits, cases.b_bits, cases.c_bits, dtype,
                   config=CANDIDATES[reading])
    a, b, c = cases.tensors()
    a, b, c = a.double().numpy(), b.double().numpy(), c.double().numpy()
    emin = -126 if dtype == "bf16" else -14
    picks = np.random.default_rng(5).integers(0, 16, (len(cases), 8, 2))
    for t in range(len(cases)):
        for i, j in picks[t]:
            want = _reference(list(a[t, i]), list(b[t, :, j]), float(c[t, i, j]), emin,
                              reading == "mma_sim")
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
