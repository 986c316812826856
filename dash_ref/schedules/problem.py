"""The shape of one attention problem and its tiling.

A :class:`Problem` fixes everything a schedule depends on: batch ``B``, query heads ``H``,
key/value heads ``H_kv``, lengths ``S_q`` and ``S_k``, head dim ``d``, the mask and the tile
sizes ``BM`` (query rows) and ``BN`` (key rows). Causal masks are bottom-right aligned:
query row ``r`` sees key ``c`` iff ``c <= r + S_k - S_q``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .._checks import choice, integer
from .mask import MASKS, Mask


@dataclass(frozen=True)
class Problem:
    """An attention problem: sizes, mask and tiles (``B, H, H_kv, S_q, S_k, d, mask, BM, BN``)."""

    batch: int
    heads: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    mask: str = "full"
    block_m: int = 128
    block_n: int = 128

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "heads_kv", "head_dim", "block_m", "block_n"):
            integer(f"Problem.{name}", getattr(self, name), minimum=1)
        for name in ("seqlen_q", "seqlen_k"):
            integer(f"Problem.{name}", getattr(self, name), minimum=0)
        if self.heads % self.heads_kv:
            raise ValueError(
                f"Problem.heads ({self.heads}) must be a multiple of Problem.heads_kv "
                f"({self.heads_kv})"
            )
        choice("Problem.mask", self.mask, MASKS)

    # -- tiling -------------------------------------------------------------------------
    @property
    def n_q(self) -> int:
        """Number of query tiles, ``ceil(S_q / BM)``."""
        return -(-self.seqlen_q // self.block_m)

    @property
    def n_kv(self) -> int:
        """Number of key/value tiles, ``ceil(S_k / BN)``."""
        return -(-self.seqlen_k // self.block_n)

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 for MHA, ``H`` for MQA)."""
        return self.heads // self.heads_kv

    @cached_property
    def visibility(self) -> Mask:
        """The mask as a value, with the one visibility rule (:class:`Mask`)."""
        return Mask(self.mask)

    @property
    def causal_offset(self) -> int:
        """``S_k - S_q``: row ``r`` sees key ``c`` iff ``c <= r + causal_offset`` (causal only)."""
        return self.seqlen_k - self.seqlen_q

    def rows(self, i: int) -> range:
        """Query rows of tile ``i``."""
        return range(i * self.block_m, min((i + 1) * self.block_m, self.seqlen_q))

    def cols(self, j: int) -> range:
        """Key rows of tile ``j``."""
        return range(j * self.block_n, min((j + 1) * self.block_n, self.seqlen_k))

    def active(self, i: int, j: int) -> bool:
        """True if any element of tile pair ``(i, j)`` is unmasked."""
        if not (0 <= i < self.n_q and 0 <= j < self.n_kv):
            return False
        return self.visibility.any_visible(self.rows(i), self.cols(j), self.seqlen_q,
                                           self.seqlen_k)

    @cached_property
    def chain_rows(self) -> tuple[tuple[int, ...], ...]:
        """For each KV tile ``j``, its active query tiles in ascending order."""
        return tuple(
            tuple(i for i in range(self.n_q) if self.active(i, j)) for j in range(self.n_kv)
        )

    @cached_property
    def tile_cols(self) -> tuple[tuple[int, ...], ...]:
        """For each query tile ``i``, its active KV tiles in ascending order."""
        return tuple(
            tuple(j for j in range(self.n_kv) if self.active(i, j)) for i in range(self.n_q)
        )

    @property
    def num_pairs(self) -> int:
        """Active tile pairs of one head."""
        return sum(len(rows) for rows in self.chain_rows)

    def unmasked(self, i: int, j: int) -> int:
        """Number of unmasked elements in tile pair ``(i, j)``."""
        return self.visibility.unmasked(self.rows(i), self.cols(j), self.seqlen_q,
                                        self.seqlen_k)

    def tile_fraction(self, i: int, j: int) -> float:
        """Unmasked fraction of a full ``BM x BN`` tile: the partial weight of a diagonal tile."""
        return self.unmasked(i, j) / (self.block_m * self.block_n)

    def is_dense(self, i: int, j: int) -> bool:
        """True if no element of the full ``BM x BN`` tile is masked or out of bounds."""
        return self.unmasked(i, j) == self.block_m * self.block_n

    @property
    def heads_total(self) -> int:
        """``B * H``: the independent (batch, head) problems."""
        return self.batch * self.heads

    def flops_forward(self) -> float:
        """FlashAttention's convention: ``4 B H S_q S_k d``, halved for a causal square."""
        f = 4.0 * self.batch * self.heads * self.seqlen_q * self.seqlen_k * self.head_dim
        return f / 2 if self.mask == "causal" else f

    def flops_backward(self) -> float:
        """2.5 times the forward."""
        return 2.5 * self.flops_forward()
