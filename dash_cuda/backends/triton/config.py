"""Tile shapes and launch settings of the Triton kernels, per head dim.

The backward tile shape is part of the *problem*: a schedule's tables name Q tiles of
``block_m`` rows and KV tiles of ``block_n`` rows, so the kernel and
:class:`dash_ref.Problem` must agree on them (:func:`backward_problem` builds the problem
with the kernel's tiles). Changing a backward tile changes the dQ orders, hence the bits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dash_ref import Problem

#: head dims the kernels are built for (powers of two: ``tl.arange`` needs them).
HEAD_DIMS = (16, 32, 64, 128)


@dataclass(frozen=True)
class TileConfig:
    """Tile shape and Triton launch settings of one kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    prefetch: bool = False  # backward: load the next visit's Q/dO tiles one visit ahead


# Forward: one program per (Q tile, b, h), K/V tiles streamed through an online softmax.
_FORWARD = {
    16: TileConfig(128, 64, 4, 3),
    32: TileConfig(128, 64, 4, 3),
    64: TileConfig(128, 64, 4, 3),
    128: TileConfig(128, 64, 8, 3),
}

# Backward: a chain keeps K_j, V_j (block_n rows) and its dK_j, dV_j accumulators on chip,
# and visits Q tiles of block_m rows. BN = 128 rows of fp32 dK and dV at d = 128 are 128
# registers per thread over 8 warps, which is why BM stays at 64 there. Measured on an H200
# (benchmarks/results/experiments/issue4_h200_notes.md, sweep_tiles.md): prefetch pays at d = 64
# (shift, full, S = 2048: 166 against 156 TFLOP/s); BM = 32 at d = 128 (140 against 181),
# releasing a tile one visit late (149 against 173 at d = 64) and 64 x 64 tiles with two
# programs per SM (161 against 173) do not. The dQ hand-off is a red.add under the
# semaphore (dq_handoff_ab.md: 1.26x a load-add-store hand-off, geometric mean of 8 cells).
_BACKWARD = {
    16: TileConfig(64, 128, 8, 1, prefetch=True),
    32: TileConfig(64, 128, 8, 1, prefetch=True),
    64: TileConfig(64, 128, 8, 1, prefetch=True),
    128: TileConfig(64, 128, 8, 1),  # prefetching here spills (255 registers)
}


def _override(cfg: TileConfig, env: str, head_dim: int) -> TileConfig:
    """Tuning: ``DASH_CUDA_BWD_TILES="BM,BN,warps,stages[,prefetch]"`` (likewise ``_FWD_``).

    Several head dims at once: ``"64:64,128,8,1,1;128:64,128,8,1"``; an entry without a
    ``d:`` prefix applies to every head dim.
    """
    for entry in filter(None, os.environ.get(env, "").split(";")):
        dims, _, values = entry.rpartition(":")
        if not dims or int(dims) == head_dim:
            fields = [int(x) for x in values.split(",")]
            if not 4 <= len(fields) <= 5:
                raise ValueError(f"{env}={os.environ[env]!r}: expected "
                                 "BM,BN,warps,stages[,prefetch] per entry")
            return TileConfig(*fields[:4], *(bool(x) for x in fields[4:]))
    return cfg


def forward_config(head_dim: int) -> TileConfig:
    """Tile shape of the forward kernel for ``head_dim``."""
    return _override(_FORWARD[head_dim], "DASH_CUDA_FWD_TILES", head_dim)


def backward_config(head_dim: int) -> TileConfig:
    """Tile shape of the persistent backward kernel for ``head_dim``."""
    return _override(_BACKWARD[head_dim], "DASH_CUDA_BWD_TILES", head_dim)


def backward_problem(batch: int, heads: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                     head_dim: int, causal: bool) -> Problem:
    """The :class:`dash_ref.Problem` the Triton backward runs, with its tiles."""
    cfg = backward_config(head_dim)
    return Problem(batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim,
                   "causal" if causal else "full", cfg.block_m, cfg.block_n)
