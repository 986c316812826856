"""Tile shapes and launch settings of the Triton kernels, per head dim.

The backward tile shape is part of the *problem*: a schedule's tables name Q tiles of
``block_m`` rows and KV tiles of ``block_n`` rows, so the kernel and
:class:`dash_ref.Problem` must agree on them (:func:`dash_cuda.backward_problem` builds the
problem with the kernel's tiles). Changing a backward tile changes the dQ orders, hence the
bits; so the tiles are these constants, and no environment variable changes them.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def forward_config(head_dim: int) -> TileConfig:
    """Tile shape of the forward kernel for ``head_dim``."""
    return _FORWARD[head_dim]


def backward_config(head_dim: int) -> TileConfig:
    """Tile shape of the persistent backward kernel for ``head_dim``."""
    return _BACKWARD[head_dim]

