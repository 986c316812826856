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
    # 192 / 128 and 256: 1.20 and 0.49 ms against 1.61 and 0.61 for 64 x 64 x 4 warps
    # (benchmarks/results/experiments/wide_tiles.md)
    256: TileConfig(128, 64, 8, 2),
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
    # 64-row KV tiles at d = 256: 3.82 ms against 4.10 with 8 warps and 4.31 for 32 x 128
    # (experiments/wide_tiles.md)
    256: TileConfig(64, 64, 4, 1),
}
# Rows for a pair of widths (q and k, v) whose values are narrower: 192 / 128 takes 32 x 128
# tiles (8.16 ms against 8.84 for 64 x 64, 8 warps; 64 x 64 with 4 warps: 13.4).
_BACKWARD_PAIRS = {(256, 128): TileConfig(32, 128, 8, 1)}


def _widths(head_dim: int, head_dim_v: int | None) -> tuple[int, int]:
    """The tile widths of a pair of head dims, ``(q and k, v)``: each the next power of two
    (96 is held as 128, 192 as 256); a head dim the kernels are not built for is a
    ``KeyError``, as a missing row."""
    widths = []
    for d in (head_dim, head_dim_v or head_dim):
        if d not in HEAD_DIMS:
            raise KeyError(d)
        widths.append(1 << (d - 1).bit_length())
    return widths[0], widths[1]


def forward_config(head_dim: int, head_dim_v: int | None = None) -> TileConfig:
    """Tile shape of the forward kernel for ``head_dim`` (and ``head_dim_v``, None: the same)."""
    return _FORWARD[max(_widths(head_dim, head_dim_v))]


def backward_config(head_dim: int, head_dim_v: int | None = None) -> TileConfig:
    """Tile shape of the persistent backward kernel for ``head_dim`` (and ``head_dim_v``): the
    row of the pair of widths where there is one, else that of the wider."""
    widths = _widths(head_dim, head_dim_v)
    return _BACKWARD_PAIRS.get(widths) or _BACKWARD[max(widths)]

