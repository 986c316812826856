"""Row tiles in and out of a ``(S, d)`` slice: the Triton helpers every Triton kernel shares.

A tile is ``rows`` (a vector of row indices) by the whole head dim, padded to
:func:`padded` columns (a Triton tile's sizes are powers of two; d = 96 is held as 128).
Rows past ``n_rows`` and padding columns are read as zero and never written, which is how
every kernel handles lengths that are not a multiple of its tile. In a packed batch a
sequence's slice starts at its first row (:func:`sequence_rows`), and its rows are counted
from there.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.constexpr_function
def padded(head_dim):
    """Columns of a tile of ``head_dim``: the next power of two."""
    return triton.next_power_of_2(head_dim)


@triton.jit
def _inside(rows, n_rows, HEAD_DIM: tl.constexpr):
    """Which elements of a tile lie in the slice: rows below ``n_rows``, columns below
    ``HEAD_DIM`` (no column test where the tile has no padding)."""
    inside = rows[:, None] < n_rows
    if padded(HEAD_DIM) != HEAD_DIM:
        inside = inside & (tl.arange(0, padded(HEAD_DIM))[None, :] < HEAD_DIM)
    return inside


@triton.jit
def load_tile(base, rows, n_rows, stride_s, HEAD_DIM: tl.constexpr):
    """Rows ``rows`` of a ``(S, d)`` slice (any row stride), ``(len(rows), padded(d))``;
    rows past ``n_rows`` and padding columns read 0."""
    offs_d = tl.arange(0, padded(HEAD_DIM))
    ptrs = base + (rows[:, None] * stride_s + offs_d[None, :])
    return tl.load(ptrs, mask=_inside(rows, n_rows, HEAD_DIM), other=0.0)


@triton.jit
def store_tile(base, rows, n_rows, stride_s, x, HEAD_DIM: tl.constexpr):
    """Store ``x`` (``(len(rows), padded(d))``) into rows ``rows`` of a ``(S, d)`` slice,
    skipping rows past ``n_rows`` and padding columns."""
    offs_d = tl.arange(0, padded(HEAD_DIM))
    ptrs = base + (rows[:, None] * stride_s + offs_d[None, :])
    tl.store(ptrs, x, mask=_inside(rows, n_rows, HEAD_DIM))


@triton.jit
def sequence_rows(CU_SEQLENS, b):
    """Where sequence ``b`` of a packed batch lies, from its int32 offsets
    ``CU_SEQLENS[b]``, ``CU_SEQLENS[b + 1]``: ``(first row, int64; number of rows, int32)``."""
    first = tl.load(CU_SEQLENS + b)
    length = tl.load(CU_SEQLENS + b + 1) - first
    return first.to(tl.int64), length
