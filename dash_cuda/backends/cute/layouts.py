"""What both CuTe kernels (forward and backward) share: tensor views, shared-memory layouts,
register views of accumulators, and the warpgroup GEMM."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync, warpgroup

# Warp roles of both kernels: warpgroup 0 loads (and, in the backward, writes dQ) on few
# registers; warpgroups 1 and 2 compute on many (setmaxnreg moves registers between them).
NUM_THREADS = 384
MATH_THREADS = 256
PRODUCER_REGS = 24
MATH_REGS = 240


def bshd_as_sdhb(ptr: cute.Pointer, seqlen, heads, batch, head_dim: int, strides: tuple
                 ) -> cute.Tensor:
    """A ``(B, S, H, d)`` tensor with strides ``(b, s, h, 1)`` viewed as ``(S, d, H, B)``: the
    mode order TMA tiles ``(rows, d)`` boxes of one head in."""
    return cute.make_tensor(ptr, cute.make_layout(
        (seqlen, head_dim, heads, batch), stride=(strides[1], 1, strides[2], strides[0])))


def tma_tiles(atom: cute.CopyAtom, smem: cute.Tensor, gmem: cute.Tensor
              ) -> tuple[cute.Tensor, cute.Tensor]:
    """``(smem, gmem)`` partitioned for ``atom``'s TMA copies by one CTA (no multicast): the
    first two modes of each, the box, become one; the modes after it index stages or tiles."""
    return cpasync.tma_partition(atom, 0, cute.make_layout(1), cute.group_modes(smem, 0, 2),
                                 cute.group_modes(gmem, 0, 2))


def smem_layout(dtype, rows: int, cols: int, stages: int | None, *, mn_major: bool = False):
    """A swizzled (rows, cols[, stages]) shared-memory layout that wgmma and TMA both accept.

    Row-major tiles (``cols`` contiguous) use 128-byte-swizzled K-major atoms of 64 columns;
    the columns are cut into 64-wide blocks that each hold every row. The same bytes then
    also read as a valid MN-major operand of the transposed tile, which is how K, Q and dO
    serve both as K-major operands (S, dP) and as MN-major ones (dQ, dK, dV).
    ``mn_major`` makes ``rows`` the contiguous dimension instead (used for dS).
    """
    kind = (warpgroup.SmemLayoutAtomKind.MN_SW128 if mn_major
            else warpgroup.SmemLayoutAtomKind.K_SW128)
    atom = warpgroup.make_smem_layout_atom(kind, dtype)
    shape = (rows, cols) if stages is None else (rows, cols, stages)
    order = (0, 1) if stages is None else (0, 1, 2)
    return cute.tile_to_shape(atom, shape, order=order)


def transposed(t: cute.Tensor) -> cute.Tensor:
    """View of ``t`` with its first two modes swapped (same memory)."""
    shape = (t.shape[1], t.shape[0], *t.shape[2:])
    order = (1, 0, *range(2, cute.rank(t)))
    return cute.composition(t, cute.make_ordered_layout(shape, order=order))


def acc_as_operand_a(acc: cute.Tensor, dtype, storage: cute.Pointer | None = None
                     ) -> tuple[cute.Tensor, cute.Tensor]:
    """A 16-bit register A operand that aliases an fp32 accumulator's element order.

    For wgmma, the A fragment of an m64 x k16 block held in registers has the same
    thread/element map as the fp32 accumulator of an m64 x n16 block, so the accumulator
    ((2, 2, N / 8), 1, 1) re-read as ((2, 2, 2), 1, N / 16) is the operand. Returns
    (operand, operand viewed with the accumulator's layout) so that the caller can fill it;
    both over ``storage`` (registers of ``dtype`` the caller filled) when given, else over
    fresh registers.
    """
    n8 = acc.shape[0][2]
    shape = ((2, 2, 2), 1, n8 // 2)
    if storage is None:
        storage = cute.make_rmem_tensor(shape, dtype).iterator
    return (cute.make_tensor(storage, cute.make_layout(shape)),
            cute.make_tensor(storage, acc.layout))


@cute.jit
def gemm(tiled_mma: cute.TiledMma, acc: cute.Tensor, a_frag: cute.Tensor, b_frag: cute.Tensor,
         zero_init: cutlass.Constexpr[bool]) -> None:
    """One warpgroup GEMM over the K blocks of the fragments: issued and committed as one
    wgmma group, not waited for (``warpgroup.wait_group`` does)."""
    warpgroup.fence()
    # a fresh atom per call: its ACCUMULATE field is set here, and a field set inside one
    # loop or branch cannot be read in another
    atom = cute.make_mma_atom(tiled_mma.op)
    for kb in cutlass.range_constexpr(cute.size(a_frag, mode=[2])):
        atom.set(warpgroup.Field.ACCUMULATE, not zero_init or kb != 0)
        cute.gemm(atom, acc, a_frag[None, None, kb], b_frag[None, None, kb], acc)
    warpgroup.commit_group()


__all__ = ["MATH_REGS", "MATH_THREADS", "NUM_THREADS", "PRODUCER_REGS", "acc_as_operand_a",
           "bshd_as_sdhb", "gemm", "smem_layout", "tma_tiles", "transposed"]
