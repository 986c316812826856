"""The visibility rule of the CuTe kernels, written once for the forward and the backward.

The CPU's rule is :class:`dash_ref.Mask`: query row ``r`` sees key ``c`` iff ``c < S_k``
and, for a causal mask (bottom-right aligned), ``c <= r + S_k - S_q``. A kernel receives the
mask's kind as a compile-time constant (``"full"`` or ``"causal"``); a kind with extents (a
sliding window's left and right) would take them as run-time arguments here.

The kernels ask the rule in a tile's local coordinates, as bounds that move with the tile,
so that one comparison per element remains:

* ``keys_left``: keys of the tile before ``S_k`` (``S_k - first key``);
* ``rows_left``: queries of the tile before ``S_q`` (``S_q - first query``), where a kernel
  must not let rows past ``S_q`` contribute (the backward; the forward's stores clip them);
* ``diagonal``: ``first query + S_k - S_q - first key``, so that local key ``k`` is visible
  to local query ``q`` iff ``k - q <= diagonal``.

These are plain functions of DSL values, run while a kernel is traced: the ``kind`` test is
Python, so a full mask compiles to no diagonal comparison at all.
"""

from __future__ import annotations

KINDS = ("full", "causal")


def visible(kind: str, key, query, keys_left, diagonal, rows_left=None):
    """Whether local ``(key, query)`` is visible: ``key < keys_left``, ``query < rows_left``
    (when given) and, causal, ``key - query <= diagonal``."""
    seen = key < keys_left
    if rows_left is not None:
        seen = seen & (query < rows_left)
    if kind == "causal":
        seen = seen & (key - query <= diagonal)
    return seen


def needs_mask(kind: str, keys_left, diagonal, block_n: int, rows_left=None,
               block_m: int | None = None):
    """Whether any element of a ``block_m x block_n`` tile is invisible: it reaches past
    ``S_k`` (or ``S_q``, when ``rows_left`` is given) or, causal, a key lies after some
    query's diagonal (the tile's top row, ``query = 0``, sees keys up to ``diagonal``)."""
    ragged = keys_left < block_n
    if rows_left is not None:
        ragged = ragged | (rows_left < block_m)
    if kind == "causal":
        ragged = ragged | (diagonal < block_n - 1)
    return ragged


def keys_seen(kind: str, row_end, seqlen_q, seqlen_k):
    """How many keys rows before ``row_end`` can see at most: ``S_k``, or, causal, the
    keys of row ``row_end - 1`` (``row_end + S_k - S_q``, not clipped to ``[0, S_k]``)."""
    if kind == "causal":
        return row_end + seqlen_k - seqlen_q
    return seqlen_k


__all__ = ["KINDS", "keys_seen", "needs_mask", "visible"]
