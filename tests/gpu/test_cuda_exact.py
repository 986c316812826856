"""L2: in ``exact`` mode the CPU emulation reproduces the kernel's dQ, dK and dV bit for bit.

Given the kernel's own ``O`` and ``LSE2``, ``dash_ref.emulate.backward(...,
arithmetic="exact")`` recomputes every step of the backward on the CPU: ``D``, every fp32
dQ partial, every dK/dV accumulator, the dQ accumulators and the rounded gradients. Each is
compared with what the GPU wrote, with ``torch.equal``, for every deterministic schedule
and both masks, on problems with several Q and KV tiles, so that visit and dQ orders
matter.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from gpu_cases import inputs

import dash_cuda
from dash_ref import DETERMINISTIC, f32_bits
from dash_ref.arithmetic.exp2 import exp2_fma
from dash_ref.emulate import backward
from verify.l2 import record_steps

# (B, H, H_kv, S_q, S_k), d, dtype, num_workers. Backward tiles are 64 x 128: 3 to 4 Q tiles
# and 2 to 3 KV tiles, ragged ends, GQA, and pinned or default worker counts.
EXACT_CASES = [
    ((1, 2, 1, 250, 300), 64, torch.bfloat16, None),
    ((1, 1, 1, 256, 256), 128, torch.float16, 3),
    ((2, 1, 1, 150, 333), 32, torch.bfloat16, 2),
]


def _kernel_run(shape, d, dtype, causal, schedule, num_workers, exact, seed=71):
    q, k, v, do = inputs(shape, d, dtype, seed)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal)
    dq, dk, dv, record = dash_cuda.attention_backward(
        q, k, v, o, lse, do, causal=causal, schedule=schedule, num_workers=num_workers,
        audit=True, exact=exact, _poison=True)
    cpu = [x.cpu() for x in (q, k, v, o, lse, do)]
    return cpu, (dq.cpu(), dk.cpu(), dv.cpu()), record


@pytest.mark.parametrize("schedule", DETERMINISTIC)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dtype, num_workers", EXACT_CASES)
def test_emulation_reproduces_the_exact_kernel(schedule, causal, shape, d, dtype,
                                               num_workers):
    cpu, grads, record = _kernel_run(shape, d, dtype, causal, schedule, num_workers,
                                     exact=True)
    assert record.exact
    p = record.schedule.problem
    assert p.n_q >= 3 and p.n_kv >= 2
    steps = record_steps(record, cpu, grads)
    # D, the partials, dQacc, (dK/dV accumulators with one query head per KV head), dQ/dK/dV
    assert len(steps) == (8 if p.heads == p.heads_kv else 6)
    for name, got, want in steps:
        assert torch.equal(got, want), name


def test_exact_mode_runs_bit_identically_without_audit():
    shape, d, dtype, workers = EXACT_CASES[0]
    q, k, v, do = inputs(shape, d, dtype, seed=72)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True)
    runs = [dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True, exact=True,
                                         audit=audit, num_workers=workers)[:3]
            for audit in (True, False, False)]
    for run in runs[1:]:
        for a, b in zip(runs[0], run):
            assert torch.equal(a, b)


def test_default_arithmetic_is_not_what_the_emulation_reproduces():
    # guard against a vacuous pass: ex2.approx and tl.sum's D order change the bits
    shape, d, dtype, workers = EXACT_CASES[0]
    (q, k, v, o, lse, do), grads, record = _kernel_run(shape, d, dtype, False, "shift",
                                                       workers, exact=False)
    assert not record.exact
    emu = backward(record.schedule, q, k, v, o, lse, do, arithmetic="exact")
    assert not all(torch.equal(a, b) for a, b in zip(grads, (emu.dq, emu.dk, emu.dv)))
    # ... while the two arithmetics agree to within a few units of the last place
    for a, b in zip(grads, (emu.dq, emu.dk, emu.dv)):
        assert (a.float() - b.float()).norm() <= 1e-2 * b.float().norm()


# -- the software exp2 alone ---------------------------------------------------------------
def _exp2_inputs() -> torch.Tensor:
    gen = torch.Generator().manual_seed(74)
    parts = [
        torch.rand(1 << 20, generator=gen) * -130.0,  # softmax range and its underflow end
        (torch.rand(1 << 18, generator=gen) - 0.5) * 300.0,  # beyond the clamp both ways
        torch.randint(-130, 130, (1 << 12,), generator=gen).float()
        + torch.tensor([-0.5, 0.5, 0.0, 2**-24, -(2**-24)]).repeat(1 << 12)[: 1 << 12],
        torch.tensor([0.0, -0.0, 1e-40, -1e-40, 2**-149, -126.0, -126.5, -127.0, -127.5,
                      -149.0, 127.0, 127.99, 128.0, 300.0, -300.0, math.inf, -math.inf,
                      math.nan]),
    ]
    return torch.cat(parts).float()


def test_kernel_exp2_equals_reference_bit_for_bit():
    from dash_cuda.exp2 import exp2_fma_cuda

    x = _exp2_inputs()
    y = torch.full_like(x, 12345.0).cuda()  # poison: an unwritten element shows
    exp2_fma_cuda(x.cuda(), out=y)
    assert torch.equal(f32_bits(y.cpu()), f32_bits(exp2_fma(x)))


def test_quickstart_example_runs():
    """The L2 example of docs/quickstart.md, executed as written."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "quickstart.md").read_text()
    section = page.split("## Recompute the GPU's bits on a CPU", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "capture(" in code and "torch.equal" in code
    exec(compile(code, "docs/quickstart.md", "exec"), {})
