"""A packed batch's rows in and out of the CuTe backward's tile-major order
(``dash_cuda.backends.cute.packed_rows``), specified on the CPU.

The packed CuTe backward reads ``LSE2`` and ``D`` as contiguous ``(num_q_tiles, BM)``
buffers, tile ``t = Problem.q_tile_index(b, h, i)`` holding rows ``i * BM ..`` of sequence
``b``, head ``h`` (0 past the sequence's end), and keeps dQacc as staged tiles in the same
numbering. Two Triton kernels move the rows, one program per tile, through the one tile
table: ``tile_stats`` (the gather of ``LSE2`` and ``D``: a copy, bits kept, ``-inf``
included) and ``finish_dq_packed`` (step ``epilogue`` into packed dQ rows: one fp32
multiply, one RNE cast, no row past a sequence's end written). Here they run in Triton's
interpreter (a fresh process) on a mix of lengths with empty sequences, a length of 1 and
lengths that are not tile multiples, against references written from ``Problem`` alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")
pytest.importorskip("cutlass")

from dash_cuda.backends.cute import BACKEND  # noqa: E402
from dash_cuda.backends.cute import launch as cute_launch  # noqa: E402
from dash_cuda.launch import packed_problem_for  # noqa: E402
from dash_ref import Mask  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SEQLENS = (1, 0, 300, 3, 129, 0, 64)
HEADS = 3

INTERPRETED = """
import sys, torch
from dash_cuda.backends.cute.finish_dq import finish_dq_packed
from dash_cuda.backends.cute.packed_rows import tile_stats
from dash_cuda.launch import packed_problem_for
from dash_cuda.backends.cute import BACKEND
from dash_ref import Mask
cases = torch.load(sys.argv[1])
for c in cases:
    p = packed_problem_for(BACKEND, c["seqlens"], c["seqlens"], c["heads"], c["heads"],
                           c["head_dim"], Mask("causal"))
    c["lse2_tiles"], c["delta_tiles"] = tile_stats(c["lse2"], c["delta"], p)
    finish_dq_packed(c["acc"], c["dq"][:p.total_q], c["scale"], p)
torch.save(cases, sys.argv[1])
"""


def problem(head_dim: int):
    return packed_problem_for(BACKEND, SEQLENS, SEQLENS, HEADS, HEADS, head_dim, Mask("causal"))


def row_stats(total_q: int, gen: torch.Generator) -> torch.Tensor:
    """A packed ``(total_q, H)`` statistic as the forward writes it (a view of ``(H,
    total_q)``), with ``-inf`` rows (rows that see no key)."""
    x = torch.randn(HEADS, total_q, generator=gen)
    x[:, ::7] = float("-inf")
    return x.t()


@pytest.fixture(scope="module", params=[64, 128, 192], ids=["d64", "d128", "d192"])
def interpreted(request, tmp_path_factory) -> dict:
    """One case through both kernels in the interpreter: ``dq`` is the first ``total_q``
    rows of a longer NaN-poisoned buffer; bf16 with bf16-valued accumulators and a scale of
    a power of two, so the products are exact (the interpreter truncates fp32 to bf16; the
    GPU's RNE cast is checked in ``tests/gpu``)."""
    head_dim = request.param
    p = problem(head_dim)
    gen = torch.Generator().manual_seed(head_dim)
    acc = (torch.randn(p.num_q_tiles, p.block_m * head_dim, generator=gen) * 4).bfloat16()
    case = dict(seqlens=SEQLENS, heads=HEADS, head_dim=head_dim,
                lse2=row_stats(p.total_q, gen), delta=row_stats(p.total_q, gen),
                acc=acc.float(), scale=0.125,
                dq=torch.full((p.total_q + 70, HEADS, head_dim), float("nan"),
                              dtype=torch.bfloat16))
    path = tmp_path_factory.mktemp("packed_rows") / "cases.pt"
    torch.save([case], path)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-c", INTERPRETED, str(path)], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(path)[0]


def tiles_of(p):
    """Every dQ tile ``(t, first packed row, rows, head)``, from ``Problem`` alone."""
    for b in range(p.batch):
        for h in range(HEADS):
            for i in range(p.n_q_of(b)):
                rows = min(p.block_m, p.seqlen_q_of(b) - i * p.block_m)
                yield p.q_tile_index(b, h, i), p.cu_seqlens_q[b] + i * p.block_m, rows, h


def test_lse2_and_d_are_copied_tile_major_with_zeros_past_each_sequence(interpreted):
    """Slot ``r`` of tile ``t`` is row ``i * BM + r`` of its sequence and head, bit for bit
    (``-inf`` kept), 0 past the sequence's end; contiguous ``(num_q_tiles, BM)``."""
    c = interpreted
    p = problem(c["head_dim"])
    for name in ("lse2", "delta"):
        tiles = c[f"{name}_tiles"]
        assert tiles.shape == (p.num_q_tiles, p.block_m) and tiles.is_contiguous()
        want = torch.zeros_like(tiles)
        for t, first, rows, h in tiles_of(p):
            want[t, :rows] = c[name][first:first + rows, h]
        assert torch.equal(tiles, want)


def test_dq_is_each_tile_in_staging_order_scaled_and_rounded_into_its_rows(interpreted):
    """Every packed row is its tile's row (read through ``staged_index``) times the scale,
    rounded once; no NaN of the poisoned buffer is left in it and the rows after
    ``total_q`` keep theirs (no tile writes past its sequence's end)."""
    c = interpreted
    p = problem(c["head_dim"])
    index = cute_launch.staged_index(p.block_m, c["head_dim"], torch.device("cpu")).long()
    row_major = (c["acc"][:, index] * torch.tensor(c["scale"])).bfloat16()
    row_major = row_major.view(p.num_q_tiles, p.block_m, c["head_dim"])
    want = torch.empty(p.total_q, HEADS, c["head_dim"], dtype=torch.bfloat16)
    for t, first, rows, h in tiles_of(p):
        want[first:first + rows, h] = row_major[t, :rows]
    assert torch.equal(c["dq"][:p.total_q], want)
    assert c["dq"][p.total_q:].isnan().all()
