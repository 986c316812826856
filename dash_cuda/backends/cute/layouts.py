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


#: K-major swizzle atoms by their width in bytes, widest first
_K_ATOMS = ((128, "K_SW128"), (64, "K_SW64"), (32, "K_SW32"))


def atom_columns(cols: int, elem_bytes: int, block_cols: int | None = None) -> int:
    """Columns of the K-major swizzle atom :func:`smem_layout` tiles a row-major tile with:
    the widest (128, 64 or 32 bytes) that divides ``block_cols`` (default ``cols``), the
    narrowest column block an MMA takes of the tile as an MN-major operand, which must
    start on an atom. d = 64, 128: 64 columns of 16-bit values; d = 96: 32, or 16 where two
    warpgroups split the 96 columns in halves of 48. A TMA box is one atom wide, so a tile
    moves as ``cols // atom_columns(...)`` boxes."""
    width = (cols if block_cols is None else block_cols) * elem_bytes
    for atom_bytes, _ in _K_ATOMS:
        if width % atom_bytes == 0:
            return atom_bytes // elem_bytes
    raise ValueError(f"{cols} columns (blocks of {block_cols}) of {elem_bytes}-byte values "
                     "are not a whole number of 32-byte swizzle atoms")


def smem_layout(dtype, rows: int, cols: int, stages: int | None, *, mn_major: bool = False,
                block_cols: int | None = None):
    """A swizzled (rows, cols[, stages]) shared-memory layout that wgmma and TMA both accept.

    Row-major tiles (``cols`` contiguous) use the K-major atoms of :func:`atom_columns`; the
    columns are cut into atom-wide blocks that each hold every row. The same bytes then also
    read as a valid MN-major operand of the transposed tile, which is how K, Q and dO serve
    both as K-major operands (S, dP) and as MN-major ones (dQ, dK, dV).
    ``mn_major`` makes ``rows`` the contiguous dimension instead (used for dS).
    """
    if mn_major:
        kind = warpgroup.SmemLayoutAtomKind.MN_SW128
    else:
        elem_bytes = dtype.width // 8
        atom_bytes = atom_columns(cols, elem_bytes, block_cols) * elem_bytes
        kind = getattr(warpgroup.SmemLayoutAtomKind, dict(_K_ATOMS)[atom_bytes])
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
           "atom_columns",
           "bshd_as_sdhb", "gemm", "smem_layout", "tma_tiles", "transposed"]
