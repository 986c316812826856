"""Head dims 96, 192 and 256 and values with a head dim of their own (``d_v != d``) on the
Triton backend, on the GPU.

- L2: an audited ``exact=True`` backward is ``dash_ref``'s exact emulation on every step
  (``verify.l2.record_steps``), at 192 / 128 with GQA, 256 and 96, both masks;
- accuracy: ``O``, ``dQ``, ``dK``, ``dV`` of the default arithmetic within the float64
  reference's bound (GQA, ``S_q != S_k``, rows that see no key);
- determinism (L0): 1000 runs at 192 / 128 with a busy stream give one bit pattern;
- autograd and ``torch.compile(fullgraph=True)``: ``dash_cuda.attention`` gives the
  passes' bits, ``O`` with ``v``'s head dim (``"auto"`` takes 192 and 256 to CuTe:
  ``test_cute_head_dims.py``).
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import busy_trials, need

import dash_cuda
from verify.l2 import first_difference, record_steps
from verify.reference import attention_f64, grad_checks

TRITON = dict(backend="triton")
# (B, H, H_kv, S_q, S_k), d, d_v, dtype
CASES = [((1, 4, 2, 200, 333), 192, 128, torch.bfloat16),
         ((2, 2, 2, 190, 150), 256, 256, torch.float16),  # rows that see no key (causal)
         ((1, 2, 1, 260, 260), 96, 96, torch.bfloat16),
         ((1, 2, 2, 130, 300), 128, 64, torch.bfloat16)]
IDS = [f"d{d}-v{dv}" for _, d, dv, _ in CASES]


def inputs(shape, d, dv, dtype, seed):
    b, h, hk, sq, sk = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(*s, device="cuda", generator=gen).to(dtype)
                 for s in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv), (b, sq, h, dv)))


@pytest.fixture(autouse=True)
def _triton():
    need("triton", 256)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dv, dtype", CASES, ids=IDS)
def test_the_exact_backward_is_the_emulation_bit_for_bit(shape, d, dv, dtype, causal):
    q, k, v, do = inputs(shape, d, dv, dtype, seed=81)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, **TRITON)
    assert o.shape == do.shape
    dq, dk, dv_, record = dash_cuda.attention_backward(
        q, k, v, o, lse, do, causal=causal, schedule="descending", audit=True, exact=True,
        _poison=True, **TRITON)
    assert record.exact and record.schedule.problem.head_dim_v == dv
    steps = record_steps(record, [x.cpu() for x in (q, k, v, o, lse, do)],
                         (dq.cpu(), dk.cpu(), dv_.cpu()))
    assert first_difference(steps) is None


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dv, dtype", CASES, ids=IDS)
def test_the_default_arithmetic_is_within_the_float64_bound(shape, d, dv, dtype, causal):
    q, k, v, do = inputs(shape, d, dv, dtype, seed=82)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, _poison=True, **TRITON)
    grads = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, _poison=True,
                                         **TRITON)
    out = dict(zip(("o", "dq", "dk", "dv"), (o, *grads[:3])))
    ref = attention_f64(q, k, v, do, causal=causal)
    for name, check in grad_checks(out, ref, dtype).items():
        assert check.ok, (name, check)
    flipped = attention_f64(q, k, v.flip(-1), do, causal=causal)
    assert not grad_checks({"o": o}, flipped, dtype)["o"].ok  # the check can fail


def test_one_bit_pattern_in_1000_runs_with_a_busy_stream():
    shape, d, dv, dtype = CASES[0]
    q, k, v, do = inputs(shape, d, dv, dtype, seed=83)

    def once():
        o, lse = dash_cuda.attention_forward(q, k, v, causal=True, **TRITON)
        return (o, lse, *dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True,
                                                      **TRITON)[:3])

    first = once()
    for again in busy_trials(once, 999):
        for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV"), first, again):
            assert torch.equal(a, b), name


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autograd_and_compile_give_the_passes_bits(compiled):
    shape, d, dv, dtype = CASES[0]
    q, k, v, do = inputs(shape, d, dv, dtype, seed=84)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True, **TRITON)
    want = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True, **TRITON)[:3]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def step(q, k, v):
        return dash_cuda.attention(q, k, v, causal=True, **TRITON)

    fn = torch.compile(step, fullgraph=True) if compiled else step
    out = fn(*leaves)
    assert out.shape == do.shape and torch.equal(out, o)
    out.backward(do)
    for name, leaf, ref in zip(("dq", "dk", "dv"), leaves, want):
        assert torch.equal(leaf.grad, ref), name
