"""The CuTe kernels' configurations: tiles, buffering and in-tile choices, as values.

One function of the problem chooses each: :func:`backward_config` (head dim, mask kind,
dtype) and :func:`forward_config` (head dim, mask kind, ``S_q``, dtype). A sliding window
(kind ``"window"``) takes the causal configurations: its backward is causal's (the same
tiles as every kind, the masking branch), its forward causal's where its right side is 0
(:func:`tiling_mask`), else the full mask's. The kernels take the
configuration they are given (nothing is looked up inside a kernel module), and a compiled
variant's name carries its configuration's :attr:`~BackwardConfig.name`.

The backward's ``block_m`` and ``block_n`` are part of the problem: a schedule's tables name
tiles of exactly these sizes (``dash_cuda.launch.problem_for`` asks :func:`backward_config`),
so changing them changes the dQ orders and the bits. Nothing else here changes a bit: the
forward's bits depend on ``block_n`` alone (a row's sums never leave its warpgroup), and
stages and in-tile choices only move work in time. Every choice was made by measurement on
an H200 (``docs/performance.md``; the A/Bs are kept under ``benchmarks/results/experiments``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEAD_DIMS = (64, 96, 128, 192, 256)
#: head dims whose backward splits the head dims between its math warpgroups instead of the
#: keys (``BackwardConfig.split == "dims"``), so that fp32 dK and dV of a chain fit their
#: registers
WIDE_HEAD_DIMS = (192, 256)
#: value head dims other than the head dim, by head dim (everywhere else d_v = d)
VALUE_HEAD_DIMS = {192: (128,)}
#: head dims with softcap variants: at 64 the softcap backward's registers serialize its
#: wgmmas (ptxas C7512, on the CPU's compile), so a softcap call there runs on Triton
SOFTCAP_HEAD_DIMS = (96, 128, 192, 256)


@dataclass(frozen=True)
class BackwardConfig:
    """Tiles and buffering of one backward variant."""

    block_m: int  # query rows per Q tile (part of the problem)
    block_n: int  # key rows per KV tile (part of the problem)
    q_stages: int = 2  # Q/LSE and dO/D pipeline depth; also the dS buffers (one per Q stage)
    dq_stages: int = 2  # staged dQ partials between the math warps and the dQ writer
    # [softmax_p]'s selects run in every tile (they keep every element of a tile that needs
    # no mask) instead of behind a branch. Without the branch the exponentials and [ds] are
    # one basic block, and ptxas interleaves them across the wait for dP: d = 128 full
    # masks +1 - 6 % deterministic; at d = 64 it spills inside the visit loop, and causal
    # masks keep the branch.
    select_every_tile: bool = False
    # What the two math warpgroups split. "keys": each owns half of the chain's key rows
    # across every head dim (dK, dV, S and dP rows). "dims": both hold all BN = 64 keys,
    # each owns half of the head dims of dK, dV and the dQ partial and half of the query
    # columns of S and dP; P and dS then reach the dK/dV MMAs through shared memory
    # (wide head dims, where a warpgroup's dK and dV of 64 keys across all of d and d_v
    # would not fit its registers).
    split: str = "keys"
    # The dQ partial's MMA on one warpgroup (m64 x d, the other skips it) instead of split
    # by columns between the two (BM = 64, keys split only). Its dS operand is read once
    # instead of twice, and K needs no swizzle atom at d / 2. The staged tile is the same
    # (staging_coords), and so are the bits: splitting the columns moves no add.
    dq_one_warpgroup: bool = False
    # With the partial on one warpgroup: the math traced once per warpgroup role (the
    # partial's holder and the other), so that ptxas allocates each copy alone instead of
    # one copy under a run-time `wg == 0` (at d = 96: no spills instead of 176 - 224 bytes).
    # The same instructions run on each warpgroup, so the same bits.
    math_per_role: bool = False

    @property
    def name(self) -> str:
        """What a compiled variant's name says of its configuration."""
        return (f"m{self.block_m}n{self.block_n}q{self.q_stages}dq{self.dq_stages}"
                + ("sel" if self.select_every_tile else "")
                + ("dims" if self.split == "dims" else "")
                + ("dq1" if self.dq_one_warpgroup else "")
                + ("roles" if self.math_per_role else ""))


@dataclass(frozen=True)
class ForwardConfig:
    """Tiles and buffering of one forward variant (``block_m`` does not change the bits)."""

    block_m: int  # query rows per tile: 64 per math warpgroup
    block_n: int  # key rows per KV tile (the bits depend on it)
    kv_stages: int  # K and V pipeline depth
    # O columns a warpgroup stages in shared memory per TMA store (None: all of d_v); a
    # narrower buffer leaves room for another K and V stage and stores O in column chunks
    o_cols: int | None = None

    def staged_o_cols(self, head_dim_v: int) -> int:
        """The O columns staged per store at ``head_dim_v`` (a divisor of it)."""
        cols = self.o_cols or head_dim_v
        if head_dim_v % cols:
            raise ValueError(f"o_cols {cols} does not divide d_v = {head_dim_v}")
        return cols

    def shared_bytes(self, head_dim: int, head_dim_v: int | None = None,
                     elem_bytes: int = 2) -> int:
        """The tiles' shared memory (Q, the K and V stages, the staged O of every math
        warpgroup), without the barriers."""
        dv = head_dim_v or head_dim
        return elem_bytes * (self.block_m * head_dim
                             + self.kv_stages * self.block_n * (head_dim + dv)
                             + self.math_warpgroups * 64 * self.staged_o_cols(dv))

    @property
    def math_warpgroups(self) -> int:
        return self.block_m // 64

    @property
    def math_threads(self) -> int:
        return 128 * self.math_warpgroups

    @property
    def registers(self) -> tuple[int, int]:
        """(loader, math) registers per thread after setmaxnreg: the file holds 64K."""
        return {2: (24, 240), 3: (32, 160)}[self.math_warpgroups]

    @property
    def name(self) -> str:
        return (f"m{self.block_m}n{self.block_n}kv{self.kv_stages}"
                + (f"o{self.o_cols}" if self.o_cols else ""))


def _supported(head_dim: int, head_dim_v: int | None = None) -> None:
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} is not supported by the CuTe kernels "
                         f"(supported: {HEAD_DIMS})")
    if head_dim_v not in (head_dim, *value_head_dims(head_dim)):
        raise ValueError(f"value head dim {head_dim_v} at head dim {head_dim} is not "
                         f"supported by the CuTe kernels (d_v = d, or {VALUE_HEAD_DIMS})")


def value_head_dims(head_dim: int) -> tuple[int | None, ...]:
    """The value head dims the kernels take at ``head_dim``: None (d_v = d), then any other
    (:data:`VALUE_HEAD_DIMS`)."""
    return (None, *VALUE_HEAD_DIMS.get(head_dim, ()))


def backward_config(head_dim: int, mask: str, dtype: torch.dtype = torch.bfloat16,
                    head_dim_v: int | None = None) -> BackwardConfig:
    """The backward's configuration for a problem (``mask``: its kind, ``"full"``,
    ``"causal"`` or ``"window"``; both dtypes run the same one; ``head_dim_v``: the values'
    head dim where it is not ``head_dim``).

    Wide head dims (:data:`WIDE_HEAD_DIMS`) split the head dims between the warpgroups on
    64 x 64 tiles (FlashAttention-4's sm90 tile at d = 256). At 256 one stage of Q, dO and
    the dQ partial fills shared memory (Q, dO, K and V are 32 KiB each, a staged partial
    64 KiB); at 192 Q and dO keep two.

    The tiles FlashAttention-3/4 use for their sm90 backward: 128 x 128 at d = 64; at d = 128
    a 64-row Q tile (their causal choice; the non-causal 80-row tile needs a swapped dQ MMA
    and would make the tiling depend on the mask); d = 96 takes d = 128's tiles, with the dQ
    partial on one warpgroup (theirs too: 1.023 - 1.026 of the split partial at S >= 4k on an
    H100, level at 1k, ``benchmarks/results/experiments/backward_d96_dq_one_warpgroup.md``;
    at d = 128 its 64 more registers a thread would not fit). [dk_step] is issued after the
    partial's MMA, so that staging the partial overlaps it (issuing it before the dS barrier
    was 1 - 6 % slower at d = 128 and 2 - 10 % at d = 64). A window keeps the masking branch (its
    edge tiles need the selects, its interior ones do not; selecting on every tile ran 1 -
    4.5 % slower at windows of 1024 and 4096 keys on the H200:
    ``benchmarks/results/experiments/window_select.md``), so one configuration serves
    every window.
    """
    _supported(head_dim, head_dim_v)
    if head_dim in WIDE_HEAD_DIMS:
        stages = 1 if head_dim == 256 else 2
        return BackwardConfig(64, 64, q_stages=stages, dq_stages=1, split="dims")
    if head_dim == 64:
        return BackwardConfig(128, 128)
    return BackwardConfig(64, 128, select_every_tile=mask == "full",
                          dq_one_warpgroup=head_dim == 96)  # d = 96 on d = 128's tiles


#: causal problems with S_q up to this keep 128-row forward tiles at d = 64
SHORT_CAUSAL = 1024

# Three math warpgroups (192 rows) keep the tensor cores busier while each runs its softmax
# (d = 64); d = 96 and 128 need more registers per math thread than three leave, so two.
# At d = 192 and 256 a warpgroup's fp32 O rows take 96 and 128 registers a thread, so the KV
# tiles have 64 keys (S and P fit beside O). There the K and V stages are what the shared
# memory can hold: O is staged in column chunks to leave room for one more (at 256 Q and
# two stages fill 192 KiB, and O leaves in two 128-column stores; at 192, three stages and
# 64-column stores; 192 / 128 fits three stages with all of O). One more stage was 1.6 -
# 1.7x faster at 256 and 1.13 - 1.15x at 192 (H100,
# ``benchmarks/results/experiments/forward_stages.md``).
_FORWARD = {64: {192: ForwardConfig(192, 128, 3), 128: ForwardConfig(128, 128, 3)},
            96: {128: ForwardConfig(128, 128, 2)}, 128: {128: ForwardConfig(128, 128, 2)},
            192: {128: ForwardConfig(128, 64, 3, o_cols=64)},
            256: {128: ForwardConfig(128, 64, 2, o_cols=128)}}
#: the forward's configurations at a value head dim other than the head dim, where they
#: differ from the head dim's (the same ``block_n``: the bits depend on it alone)
_FORWARD_V = {(192, 128): {128: ForwardConfig(128, 64, 3)}}


def _forward_table(head_dim: int, head_dim_v: int | None) -> dict[int, ForwardConfig]:
    return _FORWARD_V.get((head_dim, head_dim_v), _FORWARD[head_dim])


def tiling_mask(rule) -> str:
    """The kind the configuration rules read for a :class:`dash_ref.Mask`: a window with no
    key right of the diagonal (``right = 0``) tiles as ``"causal"``, any other as
    ``"full"`` (as :attr:`dash_ref.Problem.mask` reads it)."""
    if rule.kind == "window":
        return "causal" if rule.window_size[1] == 0 else "full"
    return rule.kind


def forward_config(head_dim: int, mask: str, seqlen_q: int,
                   dtype: torch.dtype = torch.bfloat16, block_m: int | None = None,
                   head_dim_v: int | None = None) -> ForwardConfig:
    """The forward's configuration for a problem (``mask``: ``"full"`` or ``"causal"``, a
    window's :func:`tiling_mask`; ``head_dim_v``: the values' head dim where it is not
    ``head_dim``).

    At d = 64, 192 rows are 3 - 11 % faster except for short causal problems (S_q <=
    :data:`SHORT_CAUSAL`), where 128 rows waste less on the diagonal and are ~10 % faster.
    ``block_m`` (tests, measurements) asks for the configuration of that height instead;
    the bits do not depend on it.
    """
    head_dim_v = None if head_dim_v == head_dim else head_dim_v
    _supported(head_dim, head_dim_v)
    table = _forward_table(head_dim, head_dim_v)
    if block_m is not None:
        if block_m not in table:
            raise ValueError(f"block_m {block_m} at head dim {head_dim}: the forward has "
                             f"{sorted(table)}")
        return table[block_m]
    if head_dim == 64 and not (mask == "causal" and seqlen_q <= SHORT_CAUSAL):
        return table[192]
    return table[128]


def forward_configs(head_dim: int, mask: str, head_dim_v: int | None = None
                    ) -> tuple[ForwardConfig, ...]:
    """Every configuration :func:`forward_config` can pick for this head dim (and value head
    dim) and mask kind (its rule only looks at which side of :data:`SHORT_CAUSAL` the length
    falls; a window tiles as either mask)."""
    tilings = ("full", "causal") if mask == "window" else (mask,)
    picked = {forward_config(head_dim, m, s, head_dim_v=head_dim_v) for m in tilings
              for s in (SHORT_CAUSAL, SHORT_CAUSAL + 1)}
    return tuple(sorted(picked, key=lambda c: c.block_m))


def forward_block_n(head_dim: int) -> int:
    """Keys per KV tile of the forward at ``head_dim``: every configuration's (the bits
    depend on it, so ``dash_ref``'s fast forward takes it)."""
    _supported(head_dim)
    tables = [_FORWARD[head_dim], *(t for (d, _), t in _FORWARD_V.items() if d == head_dim)]
    (block_n,) = {c.block_n for t in tables for c in t.values()}
    return block_n


__all__ = ["HEAD_DIMS", "SHORT_CAUSAL", "SOFTCAP_HEAD_DIMS", "VALUE_HEAD_DIMS", "WIDE_HEAD_DIMS",
           "BackwardConfig", "ForwardConfig", "backward_config", "forward_block_n",
           "forward_config", "forward_configs", "tiling_mask", "value_head_dims"]
