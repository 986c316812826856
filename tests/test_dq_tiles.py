"""The dQ epilogue from staged tiles (``dash_cuda.backends.cute.finish_dq``), specified on the CPU.

The CuTe backward keeps dQacc as fp32 tiles whose elements are in *staging order*
(:func:`dash_cuda.backends.cute.bwd_kernel.staging_coords`). The epilogue writes
``dQ = rnd(dQacc * scale)`` row-major into ``(B, S_q, H, d)``: exactly the tile read through
the inverse index (``launch.staged_index``), multiplied in fp32 and rounded, every row below
``S_q`` written and none past it. The kernel knows the order itself (contiguous vector loads,
then a reshape and a permute), so these tests hold it to the index table.

The kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, in a fresh process: the
flag counts when the kernels are defined), small shapes, a few seconds. Its SASS for sm_90,
compiled on the CPU, shows the accumulator read in 16-byte loads only.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from triton_interpreter import run_source

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")
launch = pytest.importorskip("dash_cuda.backends.cute.launch")  # staging order (cutlass)

from dash_cuda.backends.cute.config import HEAD_DIMS, backward_config  # noqa: E402

# head dim -> BM of the staged tiles (both masks tile alike)
TILES = {d: backward_config(d, "full").block_m for d in HEAD_DIMS}

# (head dim, dtype, batch, heads, S_q): S_q not a multiple of BM, one tile, a partial
# single tile, and exact multiples
CASES = [
    (64, torch.float16, 2, 3, 300),
    (64, torch.bfloat16, 1, 2, 257),
    (64, torch.float16, 1, 1, 128),
    (128, torch.float16, 2, 3, 131),
    (128, torch.bfloat16, 3, 1, 200),
    (128, torch.bfloat16, 1, 2, 17),
    (128, torch.float16, 1, 1, 64),
    # d = 96: not a power of two, the tile is moved one register group at a time
    (96, torch.float16, 2, 2, 131),
    (96, torch.bfloat16, 1, 1, 64),
    # d = 192 and 256 (the head-dim split's 64-row tiles): one register group at a time too
    (192, torch.float16, 1, 2, 70),
    (192, torch.bfloat16, 1, 1, 64),
    (256, torch.bfloat16, 1, 2, 100),
    (256, torch.float16, 1, 1, 64),
]

INTERPRETED = """
import sys, torch
from dash_cuda.backends.cute.finish_dq import finish_dq_tiles
cases = torch.load(sys.argv[1])
for c in cases:
    finish_dq_tiles(c["acc"], c["dq"][:, :c["seqlen_q"]], c["scale"], c["block_m"])
torch.save(cases, sys.argv[1])
"""


def run_interpreted(cases: list[dict], path: Path) -> list[dict]:
    """``finish_dq_tiles`` into the first ``seqlen_q`` rows of each case's ``dq``, in a fresh
    interpreted process (the cases go through ``path``)."""
    return run_source(INTERPRETED, cases, path)


def accumulator(head_dim: int, dtype: torch.dtype, tiles: int, gen: torch.Generator
                ) -> tuple[torch.Tensor, float]:
    """A random staged accumulator and a scale for it.

    fp16: any fp32 values and ``d ** -0.5`` (in fp32), so the products round. bf16: values
    with bf16 mantissas and a power-of-two scale, so the products are exact: the interpreter
    casts fp32 to bf16 by truncation, not RNE (on the GPU the cast is ``cvt.rn``, whose bits
    ``tests/gpu`` checks), so only the placement of the values is checked there.
    """
    acc = torch.randn(tiles, TILES[head_dim] * head_dim, generator=gen) * 4
    if dtype == torch.bfloat16:
        return acc.bfloat16().float(), 0.125
    return acc, float(torch.tensor(head_dim ** -0.5, dtype=torch.float32))


def reference(acc: torch.Tensor, scale: float, shape: tuple, dtype: torch.dtype
              ) -> torch.Tensor:
    """The old gather: tile rows through ``staged_index``, one fp32 multiply, one RNE cast."""
    batch, seqlen_q, heads, head_dim = shape
    index = launch.staged_index(TILES[head_dim], head_dim, acc.device).long()
    dq = (acc[:, index] * torch.tensor(scale, dtype=torch.float32)).to(dtype)
    dq = dq.reshape(batch, heads, -1, head_dim)[:, :, :seqlen_q]
    return dq.permute(0, 2, 1, 3)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> list[dict]:
    """Every case run through ``finish_dq_tiles`` in the interpreter, outputs NaN-poisoned."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for head_dim, dtype, batch, heads, seqlen_q in CASES:
        block_m = TILES[head_dim]
        tiles = batch * heads * -(-seqlen_q // block_m)
        acc, scale = accumulator(head_dim, dtype, tiles, gen)
        dq = torch.full((batch, seqlen_q, heads, head_dim), float("nan"), dtype=dtype)
        cases.append(dict(acc=acc, scale=scale, block_m=block_m, dq=dq, seqlen_q=seqlen_q))
    # the first 70 rows of a 128-row buffer (one head, d = 128, two tiles)
    acc, scale = accumulator(128, torch.float16, 2, gen)
    dq = torch.full((1, 128, 1, 128), float("nan"), dtype=torch.float16)
    cases.append(dict(acc=acc, scale=scale, block_m=64, dq=dq, seqlen_q=70))
    return run_interpreted(cases, tmp_path_factory.mktemp("dq_tiles") / "cases.pt")


@pytest.mark.parametrize("case", range(len(CASES)),
                         ids=[f"d{d}-{str(t)[6:]}-B{b}H{h}S{s}" for d, t, b, h, s in CASES])
def test_dq_is_the_staged_tile_read_through_the_index_then_scaled_and_rounded(
        interpreted, case):
    """Bit for bit the index-table gather, with every row below ``S_q`` written (no NaN of
    the poisoned output is left); the input tiles are not touched."""
    c = interpreted[case]
    expected = reference(c["acc"], c["scale"], c["dq"].shape, c["dq"].dtype)
    assert not c["dq"].isnan().any()
    assert torch.equal(c["dq"], expected)


def test_rows_past_seqlen_are_not_written(interpreted):
    """Into the first ``S_q`` rows of a longer buffer: the rows after them keep their poison
    (the last tile's rows past ``S_q`` land nowhere)."""
    c = interpreted[len(CASES)]
    seqlen_q = c["seqlen_q"]
    expected = reference(c["acc"], c["scale"], (1, seqlen_q, 1, 128), torch.float16)
    assert torch.equal(c["dq"][:, :seqlen_q], expected)
    assert c["dq"][:, seqlen_q:].isnan().all()


def test_only_the_staged_tile_shapes_of_the_backward_are_accepted():
    """The kernel knows the staging order of the backward's tiles, one shape per head dim
    (128 x 64, then 64 rows at 96 - 256), nothing else."""
    from dash_cuda.backends.cute.finish_dq import TILE_SHAPES, finish_dq_tiles

    assert set(TILE_SHAPES) == {(128, 64), (64, 96), (64, 128), (64, 192), (64, 256)}
    dq = torch.empty(1, 64, 1, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="^staged dQ tiles are 128 x 64, 64 x 96, 64 x 128, "
                                         "64 x 192, 64 x 256, not 64 x 64$"):
        finish_dq_tiles(torch.empty(1, 64 * 64), dq, 1.0, 64)


# -- SASS -----------------------------------------------------------------------------------
try:
    from triton import knobs

    HAVE_TOOLS = bool(knobs.nvidia.cuobjdump.path) and bool(knobs.nvidia.ptxas.path)
except Exception:  # noqa: BLE001 - any failure to locate the tools means "skip"
    HAVE_TOOLS = False


def sass(head_dim: int, dtype: str) -> str:
    """The kernel for sm_90 as a launch specializes it (16-byte aligned pointers, strides
    multiples of 16)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from dash_cuda.backends.cute.finish_dq import dash_dq_tiles_kernel as kernel
    from dash_cuda.backends.triton.inspect_asm import sass_of

    names = kernel.arg_names
    constants = {"BM": TILES[head_dim], "HEAD_DIM": head_dim}
    types = {"DQ_ACC": "*fp32", "DQ": f"*{dtype}", "softmax_scale": "fp32"}
    signature = {n: "constexpr" if n in constants else types.get(n, "i32") for n in names}
    aligned = {(names.index(n),): [["tt.divisibility", 16]] for n in names
               if n in ("DQ_ACC", "DQ") or n.startswith("stride")}
    source = ASTSource(kernel, signature, constexprs=constants, attrs=aligned)
    return sass_of(triton.compile(source, target=GPUTarget("cuda", 90, 32)))


@pytest.mark.skipif(not HAVE_TOOLS, reason="needs Triton's NVIDIA tools")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_accumulator_is_read_in_16_byte_loads_and_rounded_once(head_dim, dtype):
    """A program's tile, 8192 fp32 values, is read once, as 16 ``LDG.E.128`` for each of
    its 128 threads (no index table, no scalar gather), and written in 16-byte stores; each
    value is one ``FMUL`` then one RNE pack (``F2FP``, two values an instruction), nothing
    fused."""
    text = sass(head_dim, dtype)
    loads = re.findall(r"\bLDG\.[A-Z0-9.]+", text)
    stores = re.findall(r"\bSTG\.[A-Z0-9.]+", text)
    assert loads == ["LDG.E.128"] * 16
    assert stores and set(stores) == {"STG.E.128"}
    assert len(re.findall(r"\bFMUL\b", text)) == 64
    assert len(re.findall(r"\bFFMA\b", text)) == 0
    pack = "BF16" if dtype == "bf16" else "F16"
    assert len(re.findall(rf"\bF2FP\.{pack}\.F32\.PACK_AB\b", text)) == 32
