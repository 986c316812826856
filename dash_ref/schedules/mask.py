"""Which keys each query row sees: the one visibility rule every CPU component calls.

A :class:`Mask` is a value: its ``kind`` (``"full"`` or ``"causal"``, bottom-right aligned:
query row ``r`` sees key ``c`` iff ``c <= r + S_k - S_q``). A row's visible keys are
always one contiguous range, :meth:`Mask.keys`; everything else (the element mask of a
tile, whether a tile pair is active, how many elements it has) is derived from that range,
here and nowhere else. A sliding window adds a first visible key (``left``) and moves the
last one (``right``) in :meth:`Mask.keys` alone; per-sequence lengths replace ``S_q`` and
``S_k`` by a sequence's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import choice

MASKS = ("full", "causal")


@dataclass(frozen=True)
class Mask:
    """The mask of an attention problem (see the module docstring)."""

    kind: str = "full"

    def __post_init__(self) -> None:
        choice("mask", self.kind, MASKS)

    @classmethod
    def of(cls, causal: bool) -> Mask:
        """The mask of the public ``causal=`` argument."""
        return cls("causal" if causal else "full")

    def keys(self, row: int, seqlen_q: int, seqlen_k: int) -> range:
        """The keys query row ``row`` sees (empty for a causal row above the diagonal)."""
        if self.kind == "full":
            return range(seqlen_k)
        return range(max(0, min(seqlen_k, row + seqlen_k - seqlen_q + 1)))

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

        A row's visible keys never move left as the row goes down, so the block's rows see
        the keys from the first row's first one to the last row's last one.
        """
        if not rows or not cols:
            return False
        start = self.keys(rows[0], seqlen_q, seqlen_k).start
        stop = self.keys(rows[-1], seqlen_q, seqlen_k).stop
        return start < stop and stop > cols.start and start < cols.stop
