"""Row tiles in and out of a ``(S, d)`` slice: the Triton helpers every Triton kernel shares.

A tile is ``rows`` (a vector of row indices) by the whole head dim. Rows past ``n_rows`` are
read as zero and never written, which is how every kernel handles lengths that are not a
multiple of its tile. In a packed batch a sequence's slice starts at its first row
(:func:`sequence_rows`), and its rows are counted from there.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_tile(base, rows, n_rows, stride_s, HEAD_DIM: tl.constexpr):
    """Rows ``rows`` of a ``(S, d)`` slice (any row stride); rows past ``n_rows`` read 0."""
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = base + (rows[:, None] * stride_s + offs_d[None, :])
    return tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)


@triton.jit
def store_tile(base, rows, n_rows, stride_s, x, HEAD_DIM: tl.constexpr):
    """Store ``x`` into rows ``rows`` of a ``(S, d)`` slice, skipping rows past ``n_rows``."""
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = base + (rows[:, None] * stride_s + offs_d[None, :])
    tl.store(ptrs, x, mask=rows[:, None] < n_rows)


@triton.jit
def sequence_rows(CU_SEQLENS, b):
    """Where sequence ``b`` of a packed batch lies, from its int32 offsets
    ``CU_SEQLENS[b]``, ``CU_SEQLENS[b + 1]``: ``(first row, int64; number of rows, int32)``."""
    first = tl.load(CU_SEQLENS + b)
    length = tl.load(CU_SEQLENS + b + 1) - first
    return first.to(tl.int64), length
