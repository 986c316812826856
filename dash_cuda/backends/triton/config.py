"""Tile shapes and launch settings of the Triton kernels, per head dim.

The backward tile shape is part of the *problem*: a schedule's tables name Q tiles of
``block_m`` rows and KV tiles of ``block_n`` rows, so the kernel and
:class:`dash_ref.Problem` must agree on them (:func:`dash_cuda.backward_problem` builds the
problem with the kernel's tiles). Changing a backward tile changes the dQ orders, hence the
bits; so the tiles are these constants, and no environment variable changes them.
"""

from __future__ import annotations

from dataclasses import dataclass

#: head dims the kernels are built for, of queries and keys and, on their own, of values:
#: a tile holds the next power of two (``tl.arange`` needs one; :func:`dash_cuda.tile_io.padded`)
#: and its padding columns read 0 and are never written.
HEAD_DIMS = (16, 32, 64, 96, 128, 192, 256)


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
    256: TileConfig(64, 64, 4, 2),  # a 128 x 256 fp32 accumulator would spill
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
    # fp32 dK and dV of 128 rows at d = 256 would be all 255 registers of 8 warps: 64 rows
    256: TileConfig(64, 64, 8, 1),
}


def _width(head_dim: int, head_dim_v: int | None) -> int:
    """The table row of a pair of head dims: the widest tile either needs (96 is held as
    128, 192 as 256); a head dim the kernels are not built for is a ``KeyError``, as a
    missing row."""
    for d in (head_dim, head_dim_v or head_dim):
        if d not in HEAD_DIMS:
            raise KeyError(d)
    return max(1 << (d - 1).bit_length() for d in (head_dim, head_dim_v or head_dim))


def forward_config(head_dim: int, head_dim_v: int | None = None) -> TileConfig:
    """Tile shape of the forward kernel for ``head_dim`` (and ``head_dim_v``, None: the same)."""
    return _FORWARD[_width(head_dim, head_dim_v)]


def backward_config(head_dim: int, head_dim_v: int | None = None) -> TileConfig:
    """Tile shape of the persistent backward kernel for ``head_dim`` (and ``head_dim_v``)."""
    return _BACKWARD[_width(head_dim, head_dim_v)]

