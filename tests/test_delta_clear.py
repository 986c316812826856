"""The ``D`` launch zeroes the backward's workspace (``preprocess_delta(..., clear=...)``).

The backward hands the launch one uninitialized fp32 buffer, dQacc and the semaphores
together, and trusts it to come back as +0 everywhere: a semaphore left at garbage hangs
the persistent kernel, an accumulator element adds its garbage to dQ. Here the buffer is
NaN before the launch, every element must be +0 (its bits, not -0) after it, and the
elements just past it must keep their NaN: the launch writes all of the buffer and nothing
else, whether the buffer is smaller than one program's share or many blocks per program.
The kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, a fresh process), a few
seconds.
"""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import run_source

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")

GUARD = 1500  # NaN elements after the workspace, which the launch must leave alone

# (batch, S_q, heads, d, BM, workspace elements): fewer elements than programs, one
# partial block, block multiples, many blocks per program
CASES = [(1, 64, 1, 64, 64, 1), (2, 100, 3, 64, 64, 777), (1, 130, 2, 128, 64, 4096),
         (2, 256, 2, 64, 128, 50_001)]

INTERPRETED = """
import sys, torch
sys.path.insert(0, "tests")
from triton_interpreter import _patch_interpreter  # the interpreter's gaps, as elsewhere
_patch_interpreter()
from dash_cuda.prepost import preprocess_delta
cases = torch.load(sys.argv[1])
for c in cases:
    preprocess_delta(c["o"], c["do"], c["block_m"], True, clear=c["buffer"][:c["numel"]])
torch.save(cases, sys.argv[1])
"""


@pytest.fixture(scope="module")
def cleared(tmp_path_factory) -> list[dict]:
    gen = torch.Generator().manual_seed(7)
    cases = []
    for batch, seqlen_q, heads, head_dim, block_m, numel in CASES:
        o, do = (torch.randn(batch, seqlen_q, heads, head_dim, generator=gen).bfloat16()
                 for _ in range(2))
        buffer = torch.full((numel + GUARD,), float("nan"))
        cases.append(dict(o=o, do=do, block_m=block_m, numel=numel, buffer=buffer))
    return run_source(INTERPRETED, cases, tmp_path_factory.mktemp("delta_clear") / "cases.pt")


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"numel{c[-1]}" for c in CASES])
def test_the_delta_launch_zeroes_its_workspace_and_nothing_past_it(cleared, case):
    c = cleared[case]
    workspace, past = c["buffer"][:c["numel"]], c["buffer"][c["numel"]:]
    assert torch.equal(workspace.view(torch.int32), torch.zeros_like(workspace.view(torch.int32)))
    assert past.isnan().all()
