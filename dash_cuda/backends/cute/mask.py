"""The visibility rule of the CuTe kernels, written once for the forward and the backward.

The CPU's rule is :class:`dash_ref.Mask` (:meth:`~dash_ref.Mask.keys`): query row ``r`` sees
key ``c`` iff ``c < S_k`` and, with ``diagonal = r + S_k - S_q`` (bottom-right aligned),

* ``"causal"``: ``c <= diagonal``;
* ``"window"`` (FlashAttention's ``window_size=(left, right)``):
  ``diagonal - left <= c <= diagonal + right``.

A kernel receives the mask's kind as a compile-time constant, so a full mask compiles to no
diagonal comparison and a causal one to one. A window's extents are run-time ``Int32``
arguments (one compiled kernel serves every window), as :func:`extents` writes them: a side
that is unbounded (``-1``) becomes one that reaches past every key, so that a window always
compares both sides and never tests for ``-1``.

The kernels ask the rule in a tile's local coordinates, as bounds that move with the tile,
so that one comparison per element and bound remains:

* ``keys_left``: keys of the tile before ``S_k`` (``S_k - first key``);
* ``rows_left``: queries of the tile before ``S_q`` (``S_q - first query``), where a kernel
  must not let rows past ``S_q`` contribute (the backward; the forward's stores clip them);
* ``diagonal``: ``first query + S_k - S_q - first key``, so that local key ``k`` is visible
  to local query ``q`` iff ``k - q <= diagonal`` (causal), or
  ``diagonal - left <= k - q <= diagonal + right`` (window, ``window = (left, right)``).

These are plain functions of DSL values (or Python ints), run while a kernel is traced: the
``kind`` test is Python.
"""

from __future__ import annotations

KINDS = ("full", "causal", "window")


def extents(rule, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """Host side: a ``"window"`` :class:`dash_ref.Mask`'s ``(left, right)`` as the kernels
    take them. A side of ``-1`` (unbounded), or one that long, is ``S_q + S_k``: row ``r <
    S_q`` then sees keys from ``r - 2 S_q < 0`` to ``r + 2 S_k > S_k``, i.e. that side hides
    no key, as ``-1`` says; the value also keeps every local bound inside an ``Int32``."""
    if rule.kind != "window":
        raise ValueError(f"extents belong to a 'window' mask, not {rule.kind!r}")
    reach = seqlen_q + seqlen_k
    return tuple(reach if side < 0 else min(side, reach) for side in (rule.left, rule.right))


def visible(kind: str, key, query, keys_left, diagonal, rows_left=None, window=None):
    """Whether local ``(key, query)`` is visible: ``key < keys_left``, ``query < rows_left``
    (when given) and, causal, ``key - query <= diagonal``, or, window (``window = (left,
    right)``, :func:`extents`), ``diagonal - left <= key - query <= diagonal + right``."""
    seen = key < keys_left
    if rows_left is not None:
        seen = seen & (query < rows_left)
    if kind == "causal":
        seen = seen & (key - query <= diagonal)
    if kind == "window":
        left, right = window
        seen = seen & (key - query <= diagonal + right) & (key - query >= diagonal - left)
    return seen


def needs_mask(kind: str, keys_left, diagonal, block_n: int, rows_left=None,
               block_m: int | None = None, window=None):
    """Whether any element of a ``block_m x block_n`` tile is invisible: it reaches past
    ``S_k`` (or ``S_q``, when ``rows_left`` is given) or, causal, a key lies after some
    query's diagonal (the tile's top row, ``query = 0``, sees keys up to ``diagonal``); a
    window also hides keys left of the bottom row's first (``query = block_m - 1`` sees
    keys from ``diagonal + block_m - 1 - left``)."""
    ragged = keys_left < block_n
    if rows_left is not None:
        ragged = ragged | (rows_left < block_m)
    if kind == "causal":
        ragged = ragged | (diagonal < block_n - 1)
    if kind == "window":
        left, right = window
        ragged = ragged | (diagonal + right < block_n - 1) | (diagonal - left + block_m - 1 > 0)
    return ragged


def keys_seen(kind: str, row_end, seqlen_q, seqlen_k, window=None):
    """How many keys rows before ``row_end`` can see at most: ``S_k``, or, causal, the
    keys of row ``row_end - 1`` (``row_end + S_k - S_q``), window ``row_end + S_k - S_q +
    right`` (not clipped to ``[0, S_k]``)."""
    if kind == "causal":
        return row_end + seqlen_k - seqlen_q
    if kind == "window":
        return row_end + seqlen_k - seqlen_q + window[1]
    return seqlen_k


def first_key(kind: str, row, seqlen_q, seqlen_k, window=None):
    """The first key that row ``row`` (or any row after it) can see: 0, or, window,
    ``row + S_k - S_q - left`` (not clipped to ``[0, S_k]``)."""
    if kind == "window":
        return row + seqlen_k - seqlen_q - window[0]
    return 0


__all__ = ["KINDS", "extents", "first_key", "keys_seen", "needs_mask", "visible"]
