"""Which keys each query row sees: the one visibility rule every CPU component calls.

A :class:`Mask` is a value: its ``kind`` and, for a sliding window, its extents. Every kind
is bottom-right aligned (the diagonal of row ``r`` is key ``r + S_k - S_q``):

- ``"full"``: every key;
- ``"causal"``: key ``c`` iff ``c <= r + S_k - S_q``;
- ``"window"`` (FlashAttention's ``window_size=(left, right)``): key ``c`` iff
  ``r + S_k - S_q - left <= c <= r + S_k - S_q + right``, a side of ``-1`` dropping its
  inequality; ``Mask("window", left, 0)`` is a causal sliding window.

Always intersected with ``0 <= c < S_k``. A row's visible keys are one contiguous range,
:meth:`Mask.keys`, and that method is the rule: everything else (the element mask of a
tile, whether a tile pair is active, how many elements it has) is derived from the range,
here and nowhere else. Per-sequence lengths replace ``S_q`` and ``S_k`` by a sequence's own.

Each rule has one value: :meth:`Mask.of` maps the public arguments ``causal`` and
``window_size`` to it as FlashAttention does (``hopper/flash_api.cpp``, ``mha_fwd``:
``if (is_causal) window_size_right = 0``, then ``is_causal = window_size_left < 0 &&
window_size_right == 0``): ``causal=True`` makes the window ``(left, 0)``; ``(-1, -1)`` is
no window; ``(-1, 0)`` is the causal mask. A ``"window"`` mask with those extents is
refused, so two equal rules never compare unequal. FlashAttention's host code also
replaces ``left >= S_k - 1`` and ``right >= S_q - 1`` by ``-1``; by the rule above such a
side hides no key anyway, so this rule needs no such step (FlashAttention-2's older
``right >= S_k`` replacement does change the rule when ``S_q > S_k + 1``; this one does not
follow it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import boolean, choice, window

#: the values of ``Problem.mask`` (the public ``causal=`` flag); a window is a field of its own
MASKS = ("full", "causal")
#: the kinds of :class:`Mask`
KINDS = ("full", "causal", "window")


@dataclass(frozen=True)
class Mask:
    """The mask of an attention problem (see the module docstring).

    ``left`` and ``right`` are the window's extents (``-1``: unbounded on that side); they
    belong to ``kind="window"`` and stay ``-1`` for the other kinds.
    """

    kind: str = "full"
    left: int = -1
    right: int = -1

    def __post_init__(self) -> None:
        choice("mask", self.kind, KINDS)
        left, right = window("Mask(left, right)", (self.left, self.right))
        if self.kind != "window":
            if (left, right) != (-1, -1):
                raise ValueError(f"Mask.left and Mask.right belong to kind='window', not "
                                 f"{self.kind!r} (Mask.of(causal, window_size) makes a window)")
            return
        if (left, right) == (-1, -1):
            raise ValueError("Mask('window', -1, -1) bounds no side: that rule is "
                             "Mask('full')")
        if (left, right) == (-1, 0):
            raise ValueError("Mask('window', -1, 0) is the causal rule: Mask('causal')")

    @classmethod
    def of(cls, causal: bool, window_size: tuple[int, int] | None = (-1, -1)) -> Mask:
        """The mask of the public ``causal=`` and ``window_size=`` arguments, as
        FlashAttention reads them (module docstring): with ``causal`` the window is
        ``(left, 0)``."""
        boolean("causal", causal)
        left, right = window("window_size", window_size)
        if causal:
            right = 0
        if (left, right) == (-1, -1):
            return cls("full")
        if (left, right) == (-1, 0):
            return cls("causal")
        return cls("window", left, right)

    @property
    def window_size(self) -> tuple[int, int]:
        """The rule as FlashAttention's ``window_size`` (full ``(-1, -1)``, causal ``(-1, 0)``)."""
        if self.kind == "full":
            return (-1, -1)
        if self.kind == "causal":
            return (-1, 0)
        return (self.left, self.right)

    def keys(self, row: int, seqlen_q: int, seqlen_k: int) -> range:
        """The keys query row ``row`` sees: the rule (module docstring).

        An empty range keeps its place: it starts where the row's keys would start, clipped
        to ``[0, S_k]`` (a causal row above the diagonal: ``range(0)``)."""
        if self.kind == "full":
            return range(seqlen_k)
        diagonal = row + seqlen_k - seqlen_q
        if self.kind == "causal":
            return range(max(0, min(seqlen_k, diagonal + 1)))
        first = 0 if self.left < 0 else min(seqlen_k, max(0, diagonal - self.left))
        stop = seqlen_k if self.right < 0 else min(seqlen_k, max(0, diagonal + self.right + 1))
        return range(first, max(first, stop))

    def visible(self, rows: range, cols: range, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
        """Boolean ``(len(rows), len(cols))``: which elements of a block are unmasked."""
        seen = [self.keys(r, seqlen_q, seqlen_k) for r in rows]
        first = torch.tensor([k.start for k in seen], dtype=torch.long)[:, None]
        stop = torch.tensor([k.stop for k in seen], dtype=torch.long)[:, None]
        c = torch.arange(cols.start, cols.stop)[None, :]
        return (c >= first) & (c < stop)

    def unmasked(self, rows: range, cols: range, seqlen_q: int, seqlen_k: int) -> int:
        """How many elements of the block ``rows x cols`` are unmasked."""
        total = 0
        for r in rows:
            seen = self.keys(r, seqlen_q, seqlen_k)
            total += max(0, min(seen.stop, cols.stop) - max(seen.start, cols.start))
        return total

    def any_visible(self, rows: range, cols: range, seqlen_q: int, seqlen_k: int) -> bool:
        """Whether any element of the block is unmasked (the tile pair is *active*).

        Both ends of a row's keys never move left as the row goes down, and before the
        clipping to ``[0, S_k)`` consecutive rows' keys overlap (a window moves one key per
        row and holds at least one), so the rows that see a key are consecutive and
        together see one range: from the first row's first key to the last row's last one.
        """
        if not rows or not cols:
            return False
        start = self.keys(rows[0], seqlen_q, seqlen_k).start
        stop = self.keys(rows[-1], seqlen_q, seqlen_k).stop
        return start < stop and stop > cols.start and start < cols.stop
