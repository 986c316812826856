"""The shape of one attention problem and its tiling.

A :class:`Problem` fixes everything a schedule depends on: batch ``B``, query heads ``H``,
key/value heads ``H_kv``, lengths ``S_q`` and ``S_k``, head dim ``d``, the mask and the tile
sizes ``BM`` (query rows) and ``BN`` (key rows). Causal masks are bottom-right aligned:
query row ``r`` sees key ``c`` iff ``c <= r + S_k - S_q``.

**Packed batches** (variable lengths, FlashAttention's ``varlen``): with ``seqlens_q`` and
``seqlens_k`` given, sequence ``b`` has its own lengths ``S_q(b)``, ``S_k(b)`` (each may be
0), and ``seqlen_q`` / ``seqlen_k`` are their maxima (:meth:`Problem.packed` fills them and
the batch). Its tensors lie one sequence after another: ``(total_q, H, d)`` and
``(total_k, H_kv, d)``, sequence ``b`` in rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``. The
tiles of a sequence start at its own first row (row 0 of sequence ``b`` is the first row of
its Q tile 0), and the mask is the rule of :class:`Mask` with the sequence's own lengths
(causal: bottom-right aligned per sequence). A packed problem is a batch of the rectangular
batch-1 problems :meth:`Problem.sequence` returns; the per-sequence views (``*_of(b)``,
``rows(i, b)``, ``cols(j, b)``, ``active(i, j, b)``) mean the same for both kinds, and for a
rectangular problem every sequence has ``S_q`` and ``S_k``.

dQ tiles are numbered sequence by sequence, head by head (:meth:`Problem.q_tile_index`):
``q_tile_base(b) + h * n_q_of(b) + i``, with ``q_tile_base(b) = H * sum_{b' < b} n_q_of(b')``;
for a rectangular problem that is ``(b * H + h) * n_q + i``.

**Sliding windows** (FlashAttention's ``window_size=(left, right)``, ``-1`` unbounded):
``window_size`` holds the window beside ``mask`` (the public ``causal`` flag) and the rule is
:meth:`Mask.of` of the two: query row ``r`` sees key ``c`` iff
``r + S_k - S_q - left <= c <= r + S_k - S_q + right`` (per sequence), with ``causal`` the
window ``(left, 0)``. The problem keeps one value per rule: ``window_size`` is stored as the
window of that :class:`Mask` (``right = 0`` under ``causal``), None when the rule has no
window (``(-1, -1)``; ``(-1, 0)`` is the causal mask), and ``mask`` reads ``"causal"``
exactly when the rule sees no key right of the diagonal (``right == 0``): ``mask="full",
window_size=(w, 0)`` is the same problem as ``mask="causal", window_size=(w, 0)``. A
problem without a window reads, hashes and tiles as it always has.

**Value head dim** ``head_dim_v`` (``d_v``; None or ``head_dim`` itself: the same as ``d``):
``v`` is ``(..., H_kv, d_v)``, ``O`` and ``dO`` ``(..., H, d_v)``. Schedules do not depend on
it; it is part of the problem so that a kernel's tiles can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import cached_property
from numbers import Integral

from .._checks import choice, integer, window
from .mask import MASKS, Mask


@dataclass(frozen=True)
class Problem:
    """An attention problem: sizes, mask and tiles (``B, H, H_kv, S_q, S_k, d, mask, BM, BN``),
    for a packed batch the lengths of every sequence (``seqlens_q``, ``seqlens_k``), a
    sliding window (``window_size``) and the value head dim (``head_dim_v``), the last four
    optional (module docstring)."""

    batch: int
    heads: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    mask: str = "full"
    block_m: int = 128
    block_n: int = 128
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None
    window_size: tuple[int, int] | None = None
    head_dim_v: int | None = None

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
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)
        integer("Problem.head_dim_v", self.head_dim_v, minimum=1)
        if self.window_size is not None:
            rule = Mask.of(self.mask == "causal",
                           window("Problem.window_size", self.window_size))
            object.__setattr__(self, "window_size",
                               rule.window_size if rule.kind == "window" else None)
            object.__setattr__(self, "mask", "causal" if rule.window_size[1] == 0 else "full")
        if (self.seqlens_q is None) != (self.seqlens_k is None):
            given = "seqlens_q" if self.seqlens_k is None else "seqlens_k"
            raise ValueError(f"Problem.{given} was given alone: a packed problem needs both "
                             "Problem.seqlens_q and Problem.seqlens_k")
        if self.seqlens_q is None:
            return
        given = {name: _lengths(f"Problem.{name}", getattr(self, name))
                 for name in ("seqlens_q", "seqlens_k")}
        for name, longest in (("seqlens_q", "seqlen_q"), ("seqlens_k", "seqlen_k")):
            lengths = given[name]
            if len(lengths) != self.batch:
                raise ValueError(f"Problem.{name} has {len(lengths)} lengths, Problem.batch is "
                                 f"{self.batch}: one length per sequence")
            if max(lengths) != getattr(self, longest):
                raise ValueError(f"Problem.{longest} ({getattr(self, longest)}) must be the "
                                 f"longest of Problem.{name} ({max(lengths)})")
            object.__setattr__(self, name, lengths)

    def __repr__(self) -> str:
        """The dataclass's, with ``seqlens_q`` and ``seqlens_k`` only for a packed problem,
        ``window_size`` only with a window and ``head_dim_v`` only where it is not
        ``head_dim`` (a problem without them reads as it always has)."""
        def shown(name: str) -> bool:
            if name.startswith("seqlens"):
                return self.is_packed
            if name == "window_size":
                return self.window_size is not None
            if name == "head_dim_v":
                return self.head_dim_v != self.head_dim
            return True

        given = [f for f in fields(self) if shown(f.name)]
        return f"Problem({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in given)})"

    @classmethod
    def packed(cls, seqlens_q: Sequence[int], seqlens_k: Sequence[int], heads: int,
               heads_kv: int, head_dim: int, mask: str = "full", block_m: int = 128,
               block_n: int = 128, window_size: tuple[int, int] | None = None,
               head_dim_v: int | None = None) -> Problem:
        """A packed batch of sequences of lengths ``seqlens_q[b]``, ``seqlens_k[b]``: the
        batch is their number, ``seqlen_q`` and ``seqlen_k`` their maxima (the window, if
        any, applies to every sequence in its own coordinates)."""
        q = _lengths("Problem.seqlens_q", seqlens_q)
        k = _lengths("Problem.seqlens_k", seqlens_k)
        if len(k) != len(q):
            raise ValueError(f"Problem.seqlens_k has {len(k)} lengths, Problem.seqlens_q "
                             f"{len(q)}: one of each per sequence")
        return cls(len(q), heads, heads_kv, max(q), max(k), head_dim, mask, block_m, block_n,
                   q, k, window_size, head_dim_v)

    # -- tiling -------------------------------------------------------------------------
    @property
    def n_q(self) -> int:
        """Number of query tiles, ``ceil(S_q / BM)`` (packed: of the longest sequence)."""
        return -(-self.seqlen_q // self.block_m)

    @property
    def n_kv(self) -> int:
        """Number of key/value tiles, ``ceil(S_k / BN)`` (packed: of the longest sequence)."""
        return -(-self.seqlen_k // self.block_n)

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 for MHA, ``H`` for MQA)."""
        return self.heads // self.heads_kv

    @cached_property
    def visibility(self) -> Mask:
        """The mask as a value, with the one visibility rule (:class:`Mask`): ``mask`` and
        ``window_size`` together."""
        return Mask.of(self.mask == "causal", self.window_size)

    @property
    def is_windowed(self) -> bool:
        """True when the problem has a sliding window (``window_size`` is set)."""
        return self.window_size is not None

    @property
    def causal_offset(self) -> int:
        """``S_k - S_q``: row ``r`` sees key ``c`` iff ``c <= r + causal_offset`` (causal only;
        a packed problem has one per sequence, :meth:`causal_offset_of`)."""
        self._rectangular_only("causal_offset", "causal_offset_of(b)")
        return self.seqlen_k - self.seqlen_q

    def rows(self, i: int, b: int = 0) -> range:
        """Query rows of tile ``i`` of sequence ``b``, counted from the sequence's first row."""
        return range(i * self.block_m, min((i + 1) * self.block_m, self.seqlen_q_of(b)))

    def cols(self, j: int, b: int = 0) -> range:
        """Key rows of tile ``j`` of sequence ``b``, counted from the sequence's first key."""
        return range(j * self.block_n, min((j + 1) * self.block_n, self.seqlen_k_of(b)))

    def active(self, i: int, j: int, b: int = 0) -> bool:
        """True if any element of tile pair ``(i, j)`` of sequence ``b`` is unmasked."""
        if not 0 <= b < self.batch:
            return False
        if not (0 <= i < self.n_q_of(b) and 0 <= j < self.n_kv_of(b)):
            return False
        s_q, s_k = self.seqlen_q_of(b), self.seqlen_k_of(b)
        return self.visibility.any_visible(self.rows(i, b), self.cols(j, b), s_q, s_k)

    @cached_property
    def chain_rows(self) -> tuple[tuple[int, ...], ...]:
        """For each KV tile ``j``, its active query tiles in ascending order (rectangular;
        packed: :meth:`chain_rows_of`)."""
        self._rectangular_only("chain_rows", "chain_rows_of(b)")
        return tuple(
            tuple(i for i in range(self.n_q) if self.active(i, j)) for j in range(self.n_kv)
        )

    @cached_property
    def tile_cols(self) -> tuple[tuple[int, ...], ...]:
        """For each query tile ``i``, its active KV tiles in ascending order (rectangular;
        packed: :meth:`tile_cols_of`)."""
        self._rectangular_only("tile_cols", "tile_cols_of(b)")
        return tuple(
            tuple(j for j in range(self.n_kv) if self.active(i, j)) for i in range(self.n_q)
        )

    @property
    def num_pairs(self) -> int:
        """Active tile pairs of one head (rectangular; packed: :meth:`num_pairs_of`)."""
        self._rectangular_only("num_pairs", "num_pairs_of(b)")
        return sum(len(rows) for rows in self.chain_rows)

    def unmasked(self, i: int, j: int, b: int = 0) -> int:
        """Number of unmasked elements in tile pair ``(i, j)`` of sequence ``b``."""
        return self.visibility.unmasked(self.rows(i, b), self.cols(j, b), self.seqlen_q_of(b),
                                        self.seqlen_k_of(b))

    def tile_fraction(self, i: int, j: int, b: int = 0) -> float:
        """Unmasked fraction of a full ``BM x BN`` tile: the partial weight of a diagonal tile."""
        return self.unmasked(i, j, b) / (self.block_m * self.block_n)

    def is_dense(self, i: int, j: int, b: int = 0) -> bool:
        """True if no element of the full ``BM x BN`` tile is masked or out of bounds."""
        return self.unmasked(i, j, b) == self.block_m * self.block_n

    @property
    def heads_total(self) -> int:
        """``B * H``: the independent (batch, head) problems."""
        return self.batch * self.heads

    def flops_forward(self) -> float:
        """FlashAttention's convention: ``4 B H S_q S_k d``, halved for a causal square (packed:
        the sum over the sequences of their own); with ``d_v != d``,
        ``2 B H S_q S_k (d + d_v)``, halved likewise; with a window, ``2 B H (d + d_v)`` times
        the visible elements of one head (FlashAttention's benchmarks count a window's
        average row length)."""
        if self.is_packed:
            return sum(self.sequence(b).flops_forward() for b in range(self.batch))
        if self.is_windowed:
            return (2.0 * self.batch * self.heads * (self.head_dim + self.head_dim_v)
                    * self.visibility.unmasked(range(self.seqlen_q), range(self.seqlen_k),
                                               self.seqlen_q, self.seqlen_k))
        if self.head_dim_v == self.head_dim:
            f = 4.0 * self.batch * self.heads * self.seqlen_q * self.seqlen_k * self.head_dim
        else:
            f = (2.0 * self.batch * self.heads * self.seqlen_q * self.seqlen_k
                 * (self.head_dim + self.head_dim_v))
        return f / 2 if self.mask == "causal" else f

    def flops_backward(self) -> float:
        """2.5 times the forward."""
        return 2.5 * self.flops_forward()

    # -- sequences (packed or not) ------------------------------------------------------
    @property
    def is_packed(self) -> bool:
        """True when the sequences have lengths of their own (``seqlens_q``, ``seqlens_k``)."""
        return self.seqlens_q is not None

    def _sequence_index(self, b: int, stop: int | None = None) -> int:
        stop = self.batch if stop is None else stop
        if type(b) is int and 0 <= b < stop:  # the common case, without the ABC check
            return b
        if isinstance(b, bool) or not isinstance(b, Integral) or not 0 <= b < stop:
            raise IndexError(f"sequence b={b!r} is outside 0 <= b < {stop}")
        return int(b)

    def _rectangular_only(self, name: str, instead: str) -> None:
        if self.is_packed:
            raise ValueError(f"Problem.{name} is one sequence's; a packed problem has one per "
                             f"sequence: Problem.{instead}")

    def seqlen_q_of(self, b: int) -> int:
        """``S_q`` of sequence ``b``."""
        b = self._sequence_index(b)
        return self.seqlen_q if self.seqlens_q is None else self.seqlens_q[b]

    def seqlen_k_of(self, b: int) -> int:
        """``S_k`` of sequence ``b``."""
        b = self._sequence_index(b)
        return self.seqlen_k if self.seqlens_k is None else self.seqlens_k[b]

    def n_q_of(self, b: int) -> int:
        """Query tiles of sequence ``b``, ``ceil(S_q(b) / BM)``."""
        return -(-self.seqlen_q_of(b) // self.block_m)

    def n_kv_of(self, b: int) -> int:
        """Key/value tiles of sequence ``b``, ``ceil(S_k(b) / BN)``."""
        return -(-self.seqlen_k_of(b) // self.block_n)

    def causal_offset_of(self, b: int) -> int:
        """``S_k(b) - S_q(b)``: the causal diagonal of sequence ``b``."""
        return self.seqlen_k_of(b) - self.seqlen_q_of(b)

    def sequence(self, b: int) -> Problem:
        """Sequence ``b`` alone: the rectangular batch-1 problem with its lengths and the same
        heads, head dims, mask, window and tiles."""
        key = (self.seqlen_q_of(b), self.seqlen_k_of(b))
        if not self.is_packed:
            return Problem(1, self.heads, self.heads_kv, key[0], key[1], self.head_dim,
                           self.mask, self.block_m, self.block_n, None, None, self.window_size,
                           self.head_dim_v)
        cache = self._sequences
        if key not in cache:
            cache[key] = Problem(1, self.heads, self.heads_kv, key[0], key[1], self.head_dim,
                                 self.mask, self.block_m, self.block_n, None, None,
                                 self.window_size, self.head_dim_v)
        return cache[key]

    @cached_property
    def _sequences(self) -> dict[tuple[int, int], Problem]:
        return {}

    def chain_rows_of(self, b: int) -> tuple[tuple[int, ...], ...]:
        """For each KV tile ``j`` of sequence ``b``, its active query tiles, ascending."""
        if not self.is_packed:
            self._sequence_index(b)
            return self.chain_rows
        return self.sequence(b).chain_rows

    def tile_cols_of(self, b: int) -> tuple[tuple[int, ...], ...]:
        """For each query tile ``i`` of sequence ``b``, its active KV tiles, ascending."""
        if not self.is_packed:
            self._sequence_index(b)
            return self.tile_cols
        return self.sequence(b).tile_cols

    def num_pairs_of(self, b: int) -> int:
        """Active tile pairs of one head of sequence ``b``."""
        return sum(len(rows) for rows in self.chain_rows_of(b))

    @property
    def num_visits(self) -> int:
        """Active tile pairs over every sequence and head: the visits of any schedule."""
        return self.heads * sum(self.num_pairs_of(b) for b in range(self.batch))

    @cached_property
    def cu_seqlens_q(self) -> tuple[int, ...]:
        """``B + 1`` offsets: sequence ``b``'s query rows are ``cu_seqlens_q[b]:[b + 1]`` of the
        packed ``(total_q, H, d)`` layout (rectangular: multiples of ``S_q``)."""
        return _offsets(self.seqlen_q_of(b) for b in range(self.batch))

    @cached_property
    def cu_seqlens_k(self) -> tuple[int, ...]:
        """``B + 1`` offsets of the sequences' keys in the packed ``(total_k, H_kv, d)`` layout."""
        return _offsets(self.seqlen_k_of(b) for b in range(self.batch))

    @property
    def total_q(self) -> int:
        """Query rows of all sequences together."""
        return self.cu_seqlens_q[-1]

    @property
    def total_k(self) -> int:
        """Key rows of all sequences together."""
        return self.cu_seqlens_k[-1]

    # -- dQ tile numbering (semaphores, dq_count, the kernels' accumulator tiles) -------
    @cached_property
    def _q_tile_bases(self) -> tuple[int, ...]:
        return _offsets(self.heads * self.n_q_of(b) for b in range(self.batch))

    def q_tile_base(self, b: int) -> int:
        """The number of the first dQ tile of sequence ``b`` (``b == B``: :attr:`num_q_tiles`):
        ``H * sum_{b' < b} n_q_of(b')``."""
        return self._q_tile_bases[self._sequence_index(b, self.batch + 1)]

    def q_tile_index(self, b: int, h: int, i: int) -> int:
        """The number of dQ tile ``(b, h, i)``: ``q_tile_base(b) + h * n_q_of(b) + i``."""
        return self._q_tile_bases[self._sequence_index(b)] + h * self.n_q_of(b) + i

    @property
    def num_q_tiles(self) -> int:
        """dQ tiles over every sequence and head (rectangular: ``B * H * n_q``)."""
        return self._q_tile_bases[-1]


def _lengths(name: str, values: object) -> tuple[int, ...]:
    """``values`` as a tuple of ints >= 0, each checked by name."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()  # a NumPy array or a tensor of lengths
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of ints, got {values!r}")
    if not values:
        raise ValueError(f"{name} must hold at least one length, got {values!r}")
    return tuple(integer(f"{name}[{n}]", x, minimum=0) for n, x in enumerate(values))


def _offsets(counts) -> tuple[int, ...]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return tuple(out)
