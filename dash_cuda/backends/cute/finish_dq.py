"""The CuTe backward's dQ epilogue: ``dQ = rnd(dQacc * scale)`` from its staged tiles.

The CuTe backward keeps dQacc as fp32 tiles in the order its MMA threads stage them
(:func:`dash_cuda.backends.cute.bwd_kernel.staging_coords`); :func:`finish_dq_tiles`
(:func:`dash_dq_tiles_kernel`) rounds them into the row-major ``(B, S_q, H, d)`` dQ, step
``epilogue``: one fp32 multiply, one RNE cast; :func:`finish_dq_packed`
(:func:`dash_dq_packed_tiles_kernel`) does the same for a packed batch, each tile into the
packed rows its sequence holds (:mod:`.packed_rows`). Written in Triton (row-wise work where warp
specialization buys nothing), so this backend needs Triton as well as CuTe DSL. Every
program writes every element it owns, so the output needs no clearing beforehand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dash_cuda.tile_io import store_tile
from dash_cuda.triton_launch import launch

from .config import HEAD_DIMS, backward_config
from .packed_rows import tile_place, tile_table


@triton.jit
def staged_to_rows(tile, BM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A tile of ``BM * HEAD_DIM`` fp32 values in staging order as a row-major ``(BM,
    HEAD_DIM)`` tile (:func:`dash_cuda.backends.cute.bwd_kernel.staging_coords`; ``(BM,
    HEAD_DIM)`` is ``(128, 64)`` or ``(64, 128)``): a reshape and a permute, no index table.

    Position p of a tile is p = 4096 w + 512 g + 4 tid + v: register 4 g + v (g < 8, v < 4)
    of math thread tid < 128 of warpgroup w < 2. With tid = 32 warp + 4 lq + lr (lane = 4 lq
    + lr) and v = 2 vh + vl, that is p = 4096 w + 512 g + 128 warp + 16 lq + 4 lr + 2 vh +
    vl: the dims (w, g, warp, lq, lr, vh, vl) = (2, 8, 4, 8, 4, 2, 2), outermost first. The
    wgmma m64n64 accumulator puts that register at row 16 warp + 8 vh + lq = (warp, vh, lq)
    and column 8 g + 2 lr + vl = (g, lr, vl) of warpgroup w's 64 x 64 block, which is rows
    64 w .. (BM = 128: row (w, warp, vh, lq)) or columns 64 w .. (BM = 64: column (w, g,
    lr, vl)). Row-major order is those dims permuted.
    """
    tile = tl.reshape(tile, [2, 8, 4, 8, 4, 2, 2])
    if BM == 128:  # (w, warp, vh, lq) x (g, lr, vl)
        return tl.reshape(tl.permute(tile, [0, 2, 5, 3, 1, 4, 6]), [BM, HEAD_DIM])
    # BM == 64: (warp, vh, lq) x (w, g, lr, vl)
    return tl.reshape(tl.permute(tile, [2, 5, 3, 0, 1, 4, 6]), [BM, HEAD_DIM])


@triton.jit
def chunk_to_rows(chunk):
    """One register group of a staged tile, 512 values (``g`` fixed in
    :func:`staged_to_rows`'s dims), as the ``(64, 8)`` block it holds: rows ``(warp, vh,
    lq)``, columns ``(lr, vl)``."""
    chunk = tl.reshape(chunk, [4, 8, 4, 2, 2])
    return tl.reshape(tl.permute(chunk, [0, 3, 1, 2, 4]), [64, 8])


@triton.jit
def store_staged_tile(DQ_ACC, t, DQ, rows, n_rows, stride_s, softmax_scale,
                      BM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Tile ``t`` of the accumulator, ``rnd(tile * softmax_scale)`` (one fp32 multiply, one
    RNE cast), into rows ``rows`` of the ``(S, d)`` slice ``DQ``; rows past ``n_rows`` are
    not written.

    ``(BM, HEAD_DIM)`` = (128, 64) or (64, 128): the whole tile in contiguous 16-byte
    loads, made row-major by :func:`staged_to_rows` (Triton moves the values through shared
    memory). (64, 96) and (64, 192) (not powers of two, which a Triton tile must be) and
    (64, 256) (a whole tile would be 128 fp32 registers a thread): each warpgroup's
    ``HEAD_DIM / 16`` register groups one by one, each a ``(64, 8)`` block at columns
    ``(HEAD_DIM / 2) w + 8 g`` (:func:`chunk_to_rows`).
    """
    first = DQ_ACC + t.to(tl.int64) * (BM * HEAD_DIM)
    if (BM * HEAD_DIM) & (BM * HEAD_DIM - 1) == 0 and HEAD_DIM <= 128:
        tile = staged_to_rows(tl.load(first + tl.arange(0, BM * HEAD_DIM)), BM, HEAD_DIM)
        dq = (tile * softmax_scale).to(DQ.dtype.element_ty)
        store_tile(DQ, rows, n_rows, stride_s, dq, HEAD_DIM)
    else:
        tl.static_assert(BM == 64)
        for w in tl.static_range(2):
            for g in tl.static_range(HEAD_DIM // 16):
                chunk = tl.load(first + (w * (BM * HEAD_DIM // 2) + g * 512)
                                + tl.arange(0, 512))
                dq = (chunk_to_rows(chunk) * softmax_scale).to(DQ.dtype.element_ty)
                cols = w * (HEAD_DIM // 2) + g * 8 + tl.arange(0, 8)
                tl.store(DQ + rows[:, None] * stride_s + cols[None, :], dq,
                         mask=rows[:, None] < n_rows)


@triton.jit(do_not_specialize=["H", "S_Q", "N_Q"])
def dash_dq_tiles_kernel(
    DQ_ACC, DQ,
    stride_dqb, stride_dqs, stride_dqh,
    H, S_Q, N_Q, softmax_scale,
    BM: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """``dQ = rnd(dQacc * scale)`` from tiles in staging order: tile ``t = (b * H + h) * N_Q
    + i`` is ``BM * HEAD_DIM`` contiguous fp32 values (:func:`store_staged_tile`); program
    ``t`` writes whole rows of dQ."""
    t = tl.program_id(0)
    bh = (t // N_Q).to(tl.int64)
    b, h = bh // H, bh % H
    rows = (t % N_Q) * BM + tl.arange(0, BM)
    store_staged_tile(DQ_ACC, t, DQ + b * stride_dqb + h * stride_dqh, rows, S_Q, stride_dqs,
                      softmax_scale, BM, HEAD_DIM)


@triton.jit(do_not_specialize=["stride_dqs", "stride_dqh"])
def dash_dq_packed_tiles_kernel(
    DQ_ACC, DQ, TILES,
    stride_dqs, stride_dqh, softmax_scale,
    BM: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    """A packed batch's ``dQ = rnd(dQacc * scale)``: tile ``t`` (``Problem.q_tile_index``
    numbering) into the packed rows :func:`.packed_rows.tile_table` places it at; rows
    past its sequence's end land nowhere."""
    t = tl.program_id(0)
    first, count, head = tile_place(TILES, t)
    rows = first + tl.arange(0, BM)
    store_staged_tile(DQ_ACC, t, DQ + head * stride_dqh, rows, first + count, stride_dqs,
                      softmax_scale, BM, HEAD_DIM)


def finish_dq_packed(dq_acc: torch.Tensor, dq: torch.Tensor, softmax_scale: float,
                     problem) -> None:
    """A packed batch's ``dQ = rnd(dQacc * scale)`` from its ``(num_q_tiles, BM * d)``
    staged tiles into packed ``(total_q, H, d)`` rows (:func:`dash_dq_packed_tiles_kernel`:
    the same one fp32 multiply and RNE cast per element as :func:`dash_dq_tiles_kernel`)."""
    if problem.num_q_tiles == 0:
        return
    _check_tile_shape(problem.block_m, problem.head_dim)
    launch(dash_dq_packed_tiles_kernel, (problem.num_q_tiles,), (
        dq_acc, dq, tile_table(problem, dq.device), dq.stride(0), dq.stride(1), softmax_scale),
        dict(BM=problem.block_m, HEAD_DIM=problem.head_dim))


#: (BM, d) of the staged tiles the kernels know the order of: the backward's, one per head
#: dim (both masks tile alike)
TILE_SHAPES = tuple((backward_config(d, "full").block_m, d) for d in HEAD_DIMS)


def _check_tile_shape(block_m: int, head_dim: int) -> None:
    if (block_m, head_dim) not in TILE_SHAPES:
        known = ", ".join(f"{b} x {d}" for b, d in TILE_SHAPES)
        raise ValueError(f"staged dQ tiles are {known}, not {block_m} x {head_dim}")


def finish_dq_tiles(dq_acc: torch.Tensor, dq: torch.Tensor, softmax_scale: float,
                    block_m: int) -> None:
    """``dQ = rnd(dQacc * scale)`` from ``(B * H * n_q, BM * d)`` tiles in staging order.

    The order is :func:`dash_cuda.backends.cute.bwd_kernel.staging_coords`, which the
    kernel knows (``(BM, d)``: one of :data:`TILE_SHAPES`). Rows past ``S_q`` are not
    written.
    """
    kernel, grid, args, named, options = finish_dq_launch(dq_acc, dq, softmax_scale, block_m)
    launch(kernel, grid, args, named, **options)


def finish_dq_launch(dq_acc: torch.Tensor, dq: torch.Tensor, softmax_scale: float,
                     block_m: int) -> tuple:
    """``(kernel, grid, args, named, options)`` of :func:`finish_dq_tiles`'s launch."""
    batch, seqlen_q, heads, head_dim = dq.shape
    _check_tile_shape(block_m, head_dim)
    return dash_dq_tiles_kernel, (dq_acc.shape[0],), (
        dq_acc, dq, dq.stride(0), dq.stride(1), dq.stride(2),
        heads, seqlen_q, dq_acc.shape[0] // (batch * heads), softmax_scale), dict(
        BM=block_m, HEAD_DIM=head_dim), {}
