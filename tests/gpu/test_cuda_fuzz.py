"""The shape fuzzer on the GPU kernels: float64 accuracy, L1 replay and L2 on drawn shapes."""

from __future__ import annotations

import pytest
import torch

from dash_ref import Problem
from verify.fuzz import check, fuzz
from verify.impls import get_impl
from verify.strategies import Case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("schedule", ["shift", "symmetric_shift"])
def test_fuzz_finds_nothing_in_the_kernels(backend, schedule):
    result = fuzz(f"dash-{backend}:{schedule}", budget=25, max_elements=60_000,
                  progress=False, head_dims=(64, 128))
    assert result.ok, result.failure and (result.failure.message, result.reproducer())
    assert result.examples == 25


def test_fuzz_finds_nothing_in_the_exact_kernels():
    # every drawn case is also emulated on the CPU in the exact arithmetic (L2)
    result = fuzz("dash-exact:auto", budget=8, max_elements=12_000, progress=False,
                  head_dims=(32, 64))
    assert result.ok, result.failure and (result.failure.message, result.reproducer())
    assert result.examples == 8


def test_check_runs_the_l1_replay(backend):
    impl = get_impl(f"dash-{backend}:descending")
    assert impl.bitwise is not None
    case = Case(Problem(1, 4, 2, 200, 333, 64, "causal", 64, 128), "bf16", "descending", 7)
    assert check(impl, case).ok
