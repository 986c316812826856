"""``dash_cuda.triton_launch``'s key: a compiled kernel is reused only for arguments Triton
would specialize alike (``tests/gpu/test_triton_launch.py`` launches them)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from dash_cuda import triton_launch  # noqa: E402


def test_the_key_follows_tritons_specialization():
    """Alignment, dtype, 1 and multiples of 16 are told apart where Triton specializes on
    them; a do-not-specialize int only by its width."""
    spec = triton_launch._spec
    x = torch.empty(64, dtype=torch.float32)
    assert spec(x, True) != spec(x[1:], True) and spec(x, True) != spec(x.double(), True)
    assert len({spec(v, True) for v in (1, 16, 17)}) == 3
    assert spec(16, False) == spec(17, False) != spec(2**31, False)
