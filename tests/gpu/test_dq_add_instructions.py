"""The dQ add instructions, measured on crafted fp32 pairs: rounding and subnormal handling.

Each backend's ``[dq_add]`` is one hardware fp32 addition whose rounding the contract states
(``docs/design.md`` section 5): the CuTe kernel's TMA bulk reduce-add keeps subnormals, the
Triton kernel's ``red.global.add.f32`` flushes them. Replay against whole backward runs
shows the flag only where partials happen to be subnormal; here a one-warp kernel adds
crafted partials (ties to even, subnormal inputs and results, signed zeros, overflow) into
crafted accumulators with the very PTX helpers the kernels use, and the bits are compared
with ``dash_ref``'s ``dq_add`` under the backend's recorded flag.
"""

# (no "from __future__ import annotations": CuTe DSL evaluates the kernel's annotations
# where they are written, inside adder())
import functools

import pytest
import torch

from dash_ref.arithmetic.steps import dq_add

N = 1024  # elements per launch: a multiple of 128 (one warp, 16-byte vectors)
TINY = 2.0**-126  # the smallest normal fp32

#: (acc, partial, the IEEE round-to-nearest-even sum) written out by hand, not computed
TIES = [
    (1.0, 2.0**-24, 1.0),  # halfway between 1 and 1 + 2^-23: to even (1)
    (1.0 + 2.0**-23, 2.0**-24, 1.0 + 2.0**-22),  # halfway: to even (up)
    (-1.0, -(2.0**-24), -1.0),
    (-(1.0 + 2.0**-23), -(2.0**-24), -(1.0 + 2.0**-22)),
    (1.0, 2.0**-24 + 2.0**-47, 1.0 + 2.0**-23),  # just above halfway: up
    (3.0, -(2.0**-23), 3.0),  # halfway below 3 (spacing 2^-22): to even (3)
]
#: pairs whose sum or inputs are subnormal, signed zeros, and overflow
SPECIAL = [
    (2.0**-140, 2.0**-141),  # subnormal + subnormal
    (2.0**-149, 2.0**-149),  # the smallest subnormals
    (1.5 * TINY, -1.25 * TINY),  # normal + normal = subnormal
    (2.0**-130, TINY),  # subnormal + normal
    (-(2.0**-135), 0.0),  # subnormal accumulator, zero partial
    (0.0, -0.0), (-0.0, -0.0), (-0.0, 0.0), (-0.0, -(2.0**-140)),
    (1.25, -1.25),  # exact cancellation: +0
    (3.0e38, 3.0e38), (-3.0e38, -3.0e38),  # overflow to +-inf
    (float("inf"), -1.0e38),
]


def crafted(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The hand-made pairs, then fresh random pairs: close magnitudes (long carries), far
    ones (sticky bits), and tiny ones near the subnormal range."""
    gen = torch.Generator().manual_seed(seed)
    pairs = [(a, b) for a, b, _ in TIES] + SPECIAL
    rest = N - len(pairs)
    third = rest // 3

    def spread(n, lo, hi):
        mant = 1 + torch.rand(n, generator=gen, dtype=torch.float64)
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0).double()
        exp = torch.randint(lo, hi, (n,), generator=gen).double()
        return sign * mant * torch.exp2(exp)

    acc = torch.cat([torch.tensor([a for a, _ in pairs], dtype=torch.float64),
                     spread(third, -20, 20), spread(third, -20, 20),
                     spread(rest - 2 * third, -150, -118)]).float()
    part = torch.cat([torch.tensor([b for _, b in pairs], dtype=torch.float64),
                      -acc[len(pairs):len(pairs) + third].double()
                      * (1 + spread(third, -24, -8).abs()),
                      spread(third, -60, 20), spread(rest - 2 * third, -150, -118)]).float()
    return acc, part


@functools.cache
def adder():
    """The one-warp kernel's launcher, ``launch(acc, part, how)``: ``acc += part``
    elementwise by ``how``: ``"bulk"`` (one TMA bulk reduce-add of the whole buffer from
    shared memory) or ``"red"`` (scalar ``red.global.add.f32``)."""
    import cutlass
    import cutlass.cute as cute
    import cutlass.memory
    from cutlass import Float32

    from dash_cuda.backends.cute.ptx import bulk_reduce_add_f32, red_add_f32

    @cute.kernel
    def kernel(m_acc: cute.Tensor, m_part: cute.Tensor, how: cutlass.Constexpr):
        lane, _, _ = cute.arch.thread_idx()

        @cute.struct
        class Storage:
            buf: cute.struct.Align[cute.struct.MemRange[Float32, N], 128]

        s = cutlass.memory.SmemAllocator().allocate(Storage).buf.get_tensor(
            cute.make_layout(N))
        for k in cutlass.range_constexpr(N // 32):
            s[k * 32 + lane] = m_part[k * 32 + lane]
        if cutlass.const_expr(how == "bulk"):
            # the staged values were written by the generic proxy; the bulk add reads them
            # through the async proxy
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_warp()
            if lane == 0:
                bulk_reduce_add_f32(m_acc.iterator, s.iterator, N * 4)
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=False)
        else:
            for k in cutlass.range_constexpr(N // 32):
                red_add_f32(m_acc.iterator + (k * 32 + lane), s[k * 32 + lane])

    @cute.jit
    def launch(m_acc: cute.Tensor, m_part: cute.Tensor, how: cutlass.Constexpr):
        kernel(m_acc, m_part, how).launch(grid=[1, 1, 1], block=[32, 1, 1])

    return launch


def run_adds(instruction: str, acc: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    """``acc + part`` by ``instruction`` on the GPU (see :func:`adder`)."""
    from cutlass.cute.runtime import from_dlpack

    out = acc.cuda().contiguous()
    adder()(from_dlpack(out, assumed_align=16),
            from_dlpack(part.cuda().contiguous(), assumed_align=16), instruction)
    torch.cuda.synchronize()
    return out.cpu()


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32)


@pytest.fixture(scope="module")
def cutlass_here():
    pytest.importorskip("cutlass")
    from dash_cuda.backends import get_backend

    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("instruction, backend", [("bulk", "cute"), ("red", "triton")])
@pytest.mark.parametrize("seed", [0, 1])
def test_dq_add_rounds_as_the_backend_records(cutlass_here, instruction, backend, seed):
    """Every crafted sum has the bits of ``dq_add`` under the backend's subnormal flag (and
    not under the other flag: the pairs tell the two apart)."""
    from dash_cuda.backends import get_backend

    flush = get_backend(backend).dq_add_flushes_subnormals
    acc, part = crafted(seed)
    got = run_adds(instruction, acc, part)
    want = dq_add(acc, part, flush_subnormals=flush)
    other = dq_add(acc, part, flush_subnormals=not flush)
    assert not torch.equal(bits(want), bits(other))
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    mismatch = (bits(got) != bits(want)) & ~nan
    assert not mismatch.any(), (
        f"{int(mismatch.sum())} sums differ, first: {acc[mismatch][:3].tolist()} + "
        f"{part[mismatch][:3].tolist()} = {got[mismatch][:3].tolist()}, "
        f"expected {want[mismatch][:3].tolist()}")


@pytest.mark.parametrize("instruction", ["bulk", "red"])
def test_dq_add_ties_go_to_even(cutlass_here, instruction):
    """The hand-written halfway cases round to the even neighbour."""
    acc, part = crafted(0)
    got = run_adds(instruction, acc, part)
    want = torch.tensor([s for _, _, s in TIES], dtype=torch.float32)
    assert torch.equal(bits(got[:len(TIES)]), bits(want))
