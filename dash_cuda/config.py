"""Tile shapes and launch settings of the kernels, per head dim.

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
    late_release: bool = False  # backward: release a dQ tile after the next visit's MMAs
    red_add: bool = False  # backward: dQ add as a fire-and-forget red.add under the semaphore


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
# (benchmarks/results/issue4_h200_notes.md): prefetch pays at d = 64 (shift, full, S = 2048:
# 166 against 156 TFLOP/s); BM = 32 at d = 128 (140 against 181), late release (149
# against 173 at d = 64) and 64 x 64 tiles with two programs per SM (161 against 173) do not.
# The dQ hand-off is a red.add under the semaphore (benchmarks/results/dq_handoff_ab.md:
# 1.26x the load-add-store hand-off, geometric mean over 8 cells).
_BACKWARD = {
    16: TileConfig(64, 128, 8, 1, prefetch=True, red_add=True),
    32: TileConfig(64, 128, 8, 1, prefetch=True, red_add=True),
    64: TileConfig(64, 128, 8, 1, prefetch=True, red_add=True),
    128: TileConfig(64, 128, 8, 1, red_add=True),  # prefetching here spills (255 registers)
}


def _override(cfg: TileConfig, env: str, head_dim: int) -> TileConfig:
    """Tuning: ``DASH_CUDA_BWD_TILES="BM,BN,warps,stages[,prefetch[,late_release[,red_add]]]"``.

    Several head dims at once: ``"64:64,128,8,1,1;128:64,128,8,1"``; an entry without a
    ``d:`` prefix applies to every head dim.
    """
    for entry in filter(None, os.environ.get(env, "").split(";")):
        dims, _, values = entry.rpartition(":")
        if not dims or int(dims) == head_dim:
            return TileConfig(*(int(x) for x in values.split(",")))
    return cfg


def forward_config(head_dim: int) -> TileConfig:
    """Tile shape of the forward kernel for ``head_dim``."""
    return _override(_FORWARD[head_dim], "DASH_CUDA_FWD_TILES", head_dim)


def backward_config(head_dim: int) -> TileConfig:
    """Tile shape of the persistent backward kernel for ``head_dim``."""
    return _override(_BACKWARD[head_dim], "DASH_CUDA_BWD_TILES", head_dim)


def backward_problem(batch: int, heads: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                     head_dim: int, causal: bool) -> Problem:
    """The :class:`dash_ref.Problem` the backward kernel runs, with the kernel's tiles."""
    cfg = backward_config(head_dim)
    return Problem(batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim,
                   "causal" if causal else "full", cfg.block_m, cfg.block_n)
