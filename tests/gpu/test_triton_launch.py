"""``dash_cuda.triton_launch.launch``: the compiled kernel called directly gives what the
JIT's launch gives, bit for bit, for each specialization (aligned and misaligned tensors,
ints of 1, multiples of 16 and others), and a launch after the first of a key does not go
through the JIT."""

from __future__ import annotations

import pytest
import torch

from dash_cuda import triton_launch
from dash_cuda.prepost import dash_delta_kernel

pytestmark = pytest.mark.gpu


def delta_args(o, do, delta):
    return (o, do, delta, *o.stride()[:3], *do.stride()[:3], *delta.stride(), o.shape[2],
            o.shape[1])


@pytest.mark.parametrize("offset", [0, 8, 1])  # elements: aligned, aligned, misaligned
@pytest.mark.parametrize("seqlen", [1, 16, 37])
def test_a_direct_launch_gives_the_jits_bits(offset, seqlen):
    gen = torch.Generator(device="cuda").manual_seed(seqlen + offset)
    flat = torch.randn(2 * seqlen * 3 * 64 + offset, device="cuda", generator=gen).bfloat16()
    o = flat[offset:].view(2, seqlen, 3, 64)  # offset 1: not 16-byte aligned
    do = torch.randn(2, seqlen, 3, 64, device="cuda", generator=gen).bfloat16()
    want = torch.full((2, seqlen, 3), float("nan"), device="cuda")
    dash_delta_kernel[(1, 6)](*delta_args(o, do, want), BM=64, HEAD_DIM=64, PAIRWISE=True,
                              enable_fp_fusion=False)
    jit_runs = []
    real = dash_delta_kernel.run

    def counted(*a, **k):
        jit_runs.append(1)
        return real(*a, **k)

    dash_delta_kernel.run = counted
    try:
        for _ in range(3):
            got = torch.full_like(want, float("nan"))
            triton_launch.launch(dash_delta_kernel, (1, 6), *delta_args(o, do, got), BM=64,
                                 HEAD_DIM=64, PAIRWISE=True, enable_fp_fusion=False)
            assert torch.equal(got, want)
    finally:
        dash_delta_kernel.run = real
    assert len(jit_runs) <= 1  # the first launch of the key only

