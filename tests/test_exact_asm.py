"""What the compiler makes of the arithmetic contract, read off the sm_90 SASS.

The kernels are compiled for sm_90 on the CPU (Triton and its bundled ``ptxas`` and
``cuobjdump``; no GPU), so these run wherever Triton's NVIDIA backend is installed and are
skipped elsewhere. They pin the assumptions the emulator's ``hopper`` arithmetic rests on;
``tests/gpu/test_cuda_exact.py`` then checks the bits themselves.
"""

from __future__ import annotations

import functools
import re

import pytest

pytest.importorskip("triton")
inspect_asm = pytest.importorskip("dash_cuda.backends.triton.inspect_asm")

try:
    from triton import knobs

    HAVE_TOOLS = bool(knobs.nvidia.cuobjdump.path) and bool(knobs.nvidia.ptxas.path)
except Exception:  # noqa: BLE001 - any failure to locate the tools means "skip"
    HAVE_TOOLS = False
pytestmark = pytest.mark.skipif(not HAVE_TOOLS, reason="needs Triton's NVIDIA tools")

Variant = inspect_asm.Variant


@functools.cache
def backward_asm(head_dim: int, exact: bool, window: tuple[int, int] | None = None
                 ) -> tuple[str, str]:
    kernel = inspect_asm.compile_backward(Variant(head_dim, exact=exact, window=window))
    return kernel.asm["ptx"], inspect_asm.sass_of(kernel)


@functools.cache
def delta_asm(head_dim: int, exact: bool) -> tuple[str, str]:
    kernel = inspect_asm.compile_delta(head_dim, exact)
    return kernel.asm["ptx"], inspect_asm.sass_of(kernel)


def n(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


FADD, FFMA = r"\bFADD\b", r"\bFFMA\b"
FTZ_ARITH = inspect_asm.SASS_FTZ_ARITH


# the causal kernels at both tile shapes, and a sliding window's (MASK="window", its extents
# runtime integers: the window only adds integer compares, no floating-point step)
KERNELS = [(64, None), (128, None), (64, (256, 0))]
KERNEL_IDS = ["d64", "d128", "d64-window"]


@pytest.mark.parametrize("head_dim, window", KERNELS, ids=KERNEL_IDS)
def test_default_backward_accumulates_dv_and_dk_inside_the_mma(head_dim, window):
    _, sass = backward_asm(head_dim, False, window)
    exps = n(r"\bMUFU\.EX2\b", sass)
    assert exps > 0
    # one FFMA (S * scale_log2 - LSE2) and one FADD (dP - D) per score element, nothing more:
    # adding dV_j or dK_j after a fresh MMA would take (BN * d / 256) FADDs per thread each
    assert n(FFMA, sass) == exps
    assert n(FADD, sass) == exps
    assert n(FTZ_ARITH, sass) == 0


@pytest.mark.parametrize("head_dim, window", KERNELS, ids=KERNEL_IDS)
def test_exact_backward_runs_the_software_exp2(head_dim, window):
    ptx, sass = backward_asm(head_dim, True, window)
    _, default_sass = backward_asm(head_dim, False, window)
    elements = n(r"\bMUFU\.EX2\b", default_sass)
    assert n(r"\bMUFU\.EX2\b", sass) == 0
    assert n(r"\bFRND\b", sass) == elements  # rint, once per score element
    assert n(FFMA, sass) == 8 * elements  # fma(S, scale_log2, -LSE2) + 7 Horner steps
    assert n(FTZ_ARITH, sass) == 0  # no flushing anywhere
    # with fusion off every fp32 add, sub and mul is emitted with an explicit rounding
    # mode, which ptxas may not contract
    assert n(r"(?<![.\w])(?:add|sub|mul)\.f32\b", ptx) == 0  # (not the atomics)
    assert n(r"\b(?:sub|mul)\.rn\.f32\b", ptx) > 0
    # the same tensor-core instructions as the default kernel: same MMAs, same chaining
    hgmma = r"\bHGMMA\.[A-Z0-9x.]+"
    assert sorted(re.findall(hgmma, sass)) == sorted(re.findall(hgmma, default_sass))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_exact_d_sum_is_not_contracted(head_dim):
    _, default_sass = delta_asm(head_dim, False)
    assert n(FFMA, default_sass) > 0  # the default sum fuses products into its adds ...
    ptx, sass = delta_asm(head_dim, True)
    assert n(FFMA, sass) == 0  # ... the exact one rounds every product, then adds
    assert n(r"\bmul\.rn\.f32\b", ptx) > 0 and n(r"\badd\.rn\.f32\b", ptx) > 0
    assert n(FTZ_ARITH, sass) == 0


def test_the_window_kernel_has_the_causal_kernels_floating_point_steps():
    """A window changes which elements are masked, not how one is computed: the same
    exponentials, FMAs, adds, roundings and MMAs as the causal kernel, default and exact."""
    names = (r"\bMUFU\.EX2\b", FFMA, FADD, r"\bFMUL\b", r"\bFRND\b",
             r"\bHGMMA\.[A-Z0-9x.]+", r"\bF2FP\.[A-Z0-9.]+", r"\bREDG\.[A-Z0-9.]+")
    for exact in (False, True):
        _, causal = backward_asm(64, exact)
        _, window = backward_asm(64, exact, (256, 0))
        for pattern in names:
            assert n(pattern, window) == n(pattern, causal), (exact, pattern)
