"""A packed batch's query rows in the CuTe backward's tile-major order.

The packed CuTe backward numbers its dQ tiles (and their semaphores) by
:meth:`dash_ref.Problem.q_tile_index` and reads ``LSE2`` and ``D`` tile by tile in that
order: a sequence's rows may start anywhere in the ``(H, total_q)`` buffers, where a tile's
1-D bulk copy would be misaligned or run into the next sequence. :func:`tile_table` says,
once per problem, where each tile's rows lie in the packed layout; the Triton kernels that
move rows between the two orders read it, one program per tile, with no index tensors and
no synchronisation with the host:

* :func:`tile_stats` (:func:`dash_tile_stats_kernel`) gathers ``LSE2`` and ``D`` into
  contiguous ``(num_q_tiles, BM)`` buffers, 0 past each sequence's end (those slots are
  masked in the kernel);
* :func:`dash_cuda.backends.cute.finish_dq.finish_dq_packed` rounds the staged dQ tiles
  into the packed dQ rows.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from dash_cuda.triton_launch import launch
from dash_ref import Problem

_tables: dict[tuple[Problem, str], torch.Tensor] = {}
_TABLES_CACHE = 64


def tile_table(problem: Problem, device: torch.device) -> torch.Tensor:
    """int32 ``(num_q_tiles, 3)``: row ``q_tile_index(b, h, i)`` holds that tile's first
    packed query row ``cu_seqlens_q[b] + i * BM``, its number of rows ``min(BM, S_q(b) - i *
    BM)`` and its head ``h``. Built once per problem and device."""
    key = (problem, str(device))
    hit = _tables.get(key)
    if hit is not None:
        return hit
    p, bm = problem, problem.block_m
    table = np.zeros((p.num_q_tiles, 3), dtype=np.int32)
    for b in range(p.batch):
        n_q, first, sq = p.n_q_of(b), p.cu_seqlens_q[b], p.seqlen_q_of(b)
        starts = np.arange(n_q, dtype=np.int64) * bm
        for h in range(p.heads):
            at = p.q_tile_index(b, h, 0)  # a head's tiles are numbered in a row
            table[at:at + n_q, 0] = first + starts
            table[at:at + n_q, 1] = np.minimum(bm, sq - starts)
            table[at:at + n_q, 2] = h
    out = torch.from_numpy(table).to(device)
    if len(_tables) >= _TABLES_CACHE:
        _tables.clear()
    _tables[key] = out
    return out


@triton.jit
def tile_place(TILES, t):
    """Row ``t`` of :func:`tile_table`: ``(first packed row, int64; rows, int32; head,
    int64)``."""
    first = tl.load(TILES + 3 * t).to(tl.int64)
    count = tl.load(TILES + 3 * t + 1)
    head = tl.load(TILES + 3 * t + 2).to(tl.int64)
    return first, count, head


@triton.jit(do_not_specialize=["stride_row", "stride_head"])
def dash_tile_stats_kernel(LSE2, DELTA, LSE2_TILES, DELTA_TILES, TILES, stride_row,
                           stride_head, BM: tl.constexpr):
    """Program ``t`` copies tile ``t``'s rows of ``LSE2`` and ``D`` (one set of strides)
    into slots ``t * BM ..`` of the tile-major buffers, 0 in the slots past its sequence's
    end: a copy, so every value keeps its bits."""
    t = tl.program_id(0)
    first, count, head = tile_place(TILES, t)
    r = tl.arange(0, BM)
    inside = r < count
    at = head * stride_head + (first + r) * stride_row
    slots = t.to(tl.int64) * BM + r
    tl.store(LSE2_TILES + slots, tl.load(LSE2 + at, mask=inside, other=0.0))
    tl.store(DELTA_TILES + slots, tl.load(DELTA + at, mask=inside, other=0.0))


def tile_stats(lse2: torch.Tensor, delta: torch.Tensor, problem: Problem
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``(total_q, H)`` fp32 ``LSE2`` and ``D`` (one set of strides) as the packed
    kernel reads them: contiguous tile-major ``(num_q_tiles, BM)``, 0 past each sequence's
    end."""
    if lse2.stride() != delta.stride():
        raise ValueError("tile_stats reads LSE2 and D with one set of strides")
    shape = (problem.num_q_tiles, problem.block_m)
    lse2_tiles = torch.empty(shape, device=lse2.device, dtype=torch.float32)
    delta_tiles = torch.empty_like(lse2_tiles)
    if problem.num_q_tiles:
        launch(dash_tile_stats_kernel, (problem.num_q_tiles,), (
            lse2, delta, lse2_tiles, delta_tiles, tile_table(problem, lse2.device),
            lse2.stride(0), lse2.stride(1)), dict(BM=problem.block_m))
    return lse2_tiles, delta_tiles
