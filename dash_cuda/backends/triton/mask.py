"""The mask in the Triton kernels: which keys a query row sees, written once for this backend.

Both kernels take the mask's *kind* as the compile-time constant ``MASK``, one of
:data:`dash_ref.schedules.mask.MASKS` (``"full"``, ``"causal"``), and the lengths and the
causal offset ``S_k - S_q`` as runtime arguments. :func:`visible` is the element rule, the
one the backward's scores and the forward's masked KV tiles ask; :func:`key_range` is the
range of keys a forward Q tile walks, derived from it. Both restate the CPU's one rule,
:class:`dash_ref.Mask` (``dash_ref/schedules/mask.py``), which the schedules' active tile
pairs, the emulator and the references ask: query row ``r`` sees key ``c`` iff ``r < S_q``,
``c < S_k`` and, for ``causal``, ``c <= r + S_k - S_q`` (bottom-right aligned).

A row's visible keys are one contiguous range, as on the CPU. A sliding window would be a
third kind whose left and right extents are runtime arguments of these helpers (a first
visible key as well as a last one); the kernels pass ``MASK`` through without looking at it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _check_kind(MASK: tl.constexpr):
    tl.static_assert(MASK == "full" or MASK == "causal", "MASK is 'full' or 'causal'")


@triton.jit
def visible(rows, cols, S_Q, S_K, CAUSAL_OFFSET, MASK: tl.constexpr):
    """Which elements ``(row, key)`` of a score tile exist and are unmasked.

    ``rows`` and ``cols`` are query-row and key indices shaped to broadcast against each
    other (``rows[:, None], cols[None, :]`` for a tile with queries as rows,
    ``rows[None, :], cols[:, None]`` for the backward's transposed tiles);
    ``CAUSAL_OFFSET`` is ``S_k - S_q``. ``S_Q=None`` leaves out ``r < S_q``, for a caller
    that never stores rows past ``S_q`` (the forward).
    """
    _check_kind(MASK)
    seen = cols < S_K
    if S_Q is not None:
        seen = seen & (rows < S_Q)
    if MASK == "causal":
        seen = seen & (cols <= rows + CAUSAL_OFFSET)
    return seen


@triton.jit
def key_range(pid_m, S_K, CAUSAL_OFFSET, BM: tl.constexpr, BN: tl.constexpr,
              MASK: tl.constexpr):
    """The keys Q tile ``pid_m`` (rows ``pid_m * BM`` onwards) walks, as ``(dense, hi)``.

    Keys ``[0, hi)`` are seen by some row of the tile: up to the last row's last visible
    key, the rule of :func:`visible` at row ``(pid_m + 1) * BM - 1``. Keys ``[0, dense)``
    are whole ``BN``-key tiles that every row sees (a multiple of ``BN``, up to the first
    row's last visible key), so they need no element mask.
    """
    _check_kind(MASK)
    hi = S_K
    dense = (S_K // BN) * BN
    if MASK == "causal":
        hi = tl.maximum(tl.minimum(S_K, (pid_m + 1) * BM + CAUSAL_OFFSET), 0)
        dense = tl.minimum(dense, tl.maximum(pid_m * BM + CAUSAL_OFFSET + 1, 0) // BN * BN)
    return dense, hi
