"""The mask in the Triton kernels: which keys a query row sees, written once for this backend.

Both kernels take the mask's *kind* as the compile-time constant ``MASK``, one of
:data:`dash_ref.schedules.mask.KINDS` (``"full"``, ``"causal"``, ``"window"``), and the
lengths, the causal offset ``S_k - S_q`` and, for a window, its extents ``WINDOW_LEFT``,
``WINDOW_RIGHT`` (``-1``: unbounded on that side) as runtime arguments, so one compiled
kernel serves every window. :func:`visible` is the element rule, the one the backward's
scores and the forward's masked KV tiles ask; :func:`key_range` is the range of keys a
forward Q tile walks, derived from it. Both restate the CPU's one rule,
:class:`dash_ref.Mask` (``dash_ref/schedules/mask.py``), which the schedules' active tile
pairs, the emulator and the references ask: with the diagonal ``r + S_k - S_q`` of query
row ``r`` (bottom-right aligned), the row sees key ``c`` iff ``r < S_q``, ``c < S_k`` and,
for ``causal``, ``c <= diagonal``; for ``window``, ``diagonal - left <= c <= diagonal +
right``, a side of ``-1`` dropping its inequality.

A row's visible keys are one contiguous range, as on the CPU, and both of its ends never
move left as the row goes down. The extents of ``"full"`` and ``"causal"`` are None (Triton
drops them), so those kinds compile exactly as they did before windows existed.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _check_kind(MASK: tl.constexpr):
    tl.static_assert(MASK == "full" or MASK == "causal" or MASK == "window",
                     "MASK is 'full', 'causal' or 'window'")


@triton.jit
def _clip(x, S_K):
    """``x`` clipped to ``[0, S_k]``, as :meth:`dash_ref.Mask.keys` clips a row's ends."""
    return tl.minimum(tl.maximum(x, 0), S_K)


@triton.jit
def visible(rows, cols, S_Q, S_K, CAUSAL_OFFSET, WINDOW_LEFT, WINDOW_RIGHT,
            MASK: tl.constexpr):
    """Which elements ``(row, key)`` of a score tile exist and are unmasked.

    ``rows`` and ``cols`` are query-row and key indices shaped to broadcast against each
    other (``rows[:, None], cols[None, :]`` for a tile with queries as rows,
    ``rows[None, :], cols[:, None]`` for the backward's transposed tiles);
    ``CAUSAL_OFFSET`` is ``S_k - S_q``. ``S_Q=None`` leaves out ``r < S_q``, for a caller
    that never stores rows past ``S_q`` (the forward). ``WINDOW_LEFT``, ``WINDOW_RIGHT``:
    the window's extents (``MASK == "window"`` only; None otherwise).
    """
    _check_kind(MASK)
    seen = cols < S_K
    if S_Q is not None:
        seen = seen & (rows < S_Q)
    if MASK == "causal":
        seen = seen & (cols <= rows + CAUSAL_OFFSET)
    if MASK == "window":
        # keys are never negative and already below S_k: Mask.keys' clipping of the
        # range's ends to [0, S_k] changes no element
        diagonal = rows + CAUSAL_OFFSET
        seen = seen & ((WINDOW_LEFT < 0) | (cols >= diagonal - WINDOW_LEFT))
        seen = seen & ((WINDOW_RIGHT < 0) | (cols <= diagonal + WINDOW_RIGHT))
    return seen


@triton.jit
def key_range(pid_m, S_K, CAUSAL_OFFSET, WINDOW_LEFT, WINDOW_RIGHT, BM: tl.constexpr,
              BN: tl.constexpr, MASK: tl.constexpr):
    """The keys Q tile ``pid_m`` (rows ``pid_m * BM`` onwards) walks, as
    ``(lo, dense_lo, dense_hi, hi)``, ``lo <= dense_lo <= dense_hi <= hi``.

    Keys ``[lo, hi)`` hold every key some row of the tile sees: ``lo`` is the first row's
    first visible key rounded down to a multiple of ``BN`` (KV tiles stay aligned), ``hi``
    the last row's (row ``(pid_m + 1) * BM - 1``) last visible key + 1, the rule of
    :func:`visible`. Keys ``[dense_lo, dense_hi)`` are whole ``BN``-key tiles that every
    row of the tile sees (from the last row's first visible key rounded up to the first
    row's last one rounded down, as both ends only move right), so they need no element
    mask; the keys on either side of them do. When no whole tile is seen by every row,
    ``dense_lo = dense_hi = hi``. ``"full"`` and ``"causal"`` start at key 0: their
    ``lo`` and ``dense_lo`` are the constant 0.
    """
    _check_kind(MASK)
    lo = 0
    dense_lo = 0
    hi = S_K
    dense_hi = (S_K // BN) * BN
    if MASK == "causal":
        hi = tl.maximum(tl.minimum(S_K, (pid_m + 1) * BM + CAUSAL_OFFSET), 0)
        dense_hi = tl.minimum(dense_hi,
                              tl.maximum(pid_m * BM + CAUSAL_OFFSET + 1, 0) // BN * BN)
    if MASK == "window":
        first_diagonal = pid_m * BM + CAUSAL_OFFSET  # of the tile's first row
        last_diagonal = first_diagonal + BM - 1  # of its last row
        # a side of -1 keeps the kind's bound of the "full" mask (key 0, S_k)
        unbounded_left = WINDOW_LEFT < 0
        lo = tl.where(unbounded_left, 0, _clip(first_diagonal - WINDOW_LEFT, S_K) // BN * BN)
        dense_lo = tl.where(unbounded_left, 0,
                            (_clip(last_diagonal - WINDOW_LEFT, S_K) + BN - 1) // BN * BN)
        unbounded_right = WINDOW_RIGHT < 0
        hi = tl.where(unbounded_right, hi, _clip(last_diagonal + WINDOW_RIGHT + 1, S_K))
        dense_hi = tl.where(unbounded_right, dense_hi,
                            _clip(first_diagonal + WINDOW_RIGHT + 1, S_K) // BN * BN)
        # no whole tile that every row sees: the masked walk covers [lo, hi) alone
        no_dense = dense_hi <= dense_lo
        dense_lo = tl.where(no_dense, hi, dense_lo)
        dense_hi = tl.where(no_dense, hi, dense_hi)
    return lo, dense_lo, dense_hi, hi
