"""A logit softcap on the CuTe backend, in the fast arithmetic, bit for bit.

- L2: the forward's ``O`` and ``LSE2`` with a softcap are ``dash_ref``'s fast forward with
  it (step ``softcap``: ``ex2``, ``lg2``, ``ex2`` and an ``fma``), every mask kind, and every
  step of an audited backward is the fast emulation's (the slope ``4 r (1 - r)`` folded
  into ``P`` before [ds]);
- accuracy: ``O``, ``dQ``, ``dK``, ``dV`` within the float64 reference's bound with the cap
  (GQA, ``S_q != S_k``), and outside it without the cap;
- determinism (L0): 1000 runs with a busy stream give one bit pattern;
- a packed sequence's bits are its batch-1 call's (``lpt`` against ``descending``);
- ``backend="auto"`` runs a softcap call here.
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import busy_trials, inputs, passes

import dash_cuda
from verify.l2 import first_difference, forward_steps, record_steps
from verify.reference import attention_f64, grad_checks

CUTE = dict(backend="cute")
CAP = 20.0


@pytest.fixture(autouse=True)
def _cute_only():
    from dash_cuda.backends import get_backend

    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


def scaled(shape, d, dtype, seed, gain=3.0):
    """Inputs whose scores reach the cap (``q`` scaled by ``gain``)."""
    q, k, v, do = inputs(shape, d, dtype, seed=seed)
    return (q.float() * gain).to(dtype), k, v, do


def run(q, k, v, do, mask, cap=CAP, **backward):
    return passes(q, k, v, do, mask, dict(softcap=cap), **backward)


# (B, H, H_kv, S_q, S_k), d, dtype, mask keywords
CASES = [((2, 4, 2, 300, 520), 128, torch.bfloat16, dict(causal=True)),
         ((1, 4, 4, 333, 190), 128, torch.float16, dict(causal=True)),  # rows that see none
         ((1, 4, 1, 257, 400), 96, torch.bfloat16, dict()),
         ((1, 2, 2, 600, 600), 128, torch.bfloat16, dict(window_size=(100, 30)))]


@pytest.mark.parametrize("shape, d, dtype, mask", CASES)
def test_the_forward_with_softcap_is_the_fast_emulation_bit_for_bit(shape, d, dtype, mask):
    from dash_cuda.backends.cute.config import forward_block_n

    q, k, v, _ = scaled(shape, d, dtype, seed=71)
    o, lse = dash_cuda.attention_forward(q, k, v, softcap=CAP, _poison=True, **CUTE, **mask)
    steps = forward_steps((q.cpu(), k.cpu(), v.cpu()), o.cpu(), lse.cpu(),
                          mask.get("causal", False), None, forward_block_n(d),
                          window_size=mask.get("window_size", (-1, -1)), softcap=CAP)
    assert first_difference(steps) is None
    plain = dash_cuda.attention_forward(q, k, v, **CUTE, **mask)
    assert not torch.equal(plain[1], lse)  # the cap changed LSE2


@pytest.mark.parametrize("schedule", ["shift", "descending", "naive"])
@pytest.mark.parametrize("d", [96, 128])
def test_every_step_of_the_softcap_backward_is_reproduced_by_the_cpu(schedule, d):
    q, k, v, do = scaled((1, 2, 2, 260, 300), d, torch.bfloat16, seed=72)
    o, lse, got = run(q, k, v, do, dict(causal=True), schedule=schedule, num_workers=4,
                      audit=True)
    dq, dk, dv, record = got
    assert record.arithmetic == "fast"
    steps = record_steps(record, (q, k, v, o, lse, do), (dq, dk, dv), softcap=CAP)
    assert first_difference(steps) is None


@pytest.mark.parametrize("shape, d, dtype, mask", CASES)
def test_within_the_float64_bound(shape, d, dtype, mask):
    q, k, v, do = scaled(shape, d, dtype, seed=73)
    o, lse, got = run(q, k, v, do, mask)
    out = dict(zip(("o", "dq", "dk", "dv"), (o, *got)))
    ref = attention_f64(q, k, v, do, softcap=CAP, **mask)
    for check in grad_checks(out, ref, dtype).values():
        assert check.ok, check
    uncapped = attention_f64(q, k, v, do, **mask)
    assert not grad_checks({"o": o}, uncapped, dtype)["o"].ok  # the cap matters


def test_one_bit_pattern_in_1000_runs_with_a_busy_stream():
    q, k, v, do = scaled((2, 4, 2, 384, 512), 128, torch.bfloat16, seed=74)

    def once():
        o, lse, got = run(q, k, v, do, dict(causal=True))
        return (o, lse, *got)

    first = once()
    for again in busy_trials(once, 999):
        for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV"), first, again):
            assert torch.equal(a, b), name


def test_a_packed_sequence_with_softcap_has_its_batch_1_bits():
    lengths = [130, 1, 0, 257, 64]
    gen = torch.Generator(device="cuda").manual_seed(75)
    total = sum(lengths)
    q, k, v, do = ((torch.randn(total, 4, 128, device="cuda", generator=gen) * s)
                   .to(torch.bfloat16) for s in (3, 1, 1, 1))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = dash_cuda.attention_varlen(*leaves, cu, cu, max(lengths), max(lengths), causal=True,
                                   softcap=CAP, schedule="lpt", **CUTE)
    o.backward(do)
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        rows = slice(int(cu[b]), int(cu[b + 1]))
        one = [x[rows].unsqueeze(0).clone().requires_grad_() for x in (q, k, v)]
        o1 = dash_cuda.attention(*one, causal=True, softcap=CAP, schedule="descending",
                                 **CUTE)
        o1.backward(do[rows].unsqueeze(0))
        assert torch.equal(o[rows], o1[0]), b
        for name, packed, alone in zip(("dq", "dk", "dv"), leaves, one):
            assert torch.equal(packed.grad[rows], alone.grad[0]), (b, name)


def test_auto_runs_a_softcap_call_on_cute():
    from dash_cuda.ops import resolve_backend
    from dash_cuda.options import Options

    q, *_ = inputs((1, 2, 2, 64, 64), 128, torch.bfloat16, seed=76)
    assert resolve_backend(q, Options.checked(128, softcap=CAP)).name == "cute"
    q, *_ = inputs((1, 2, 2, 64, 64), 64, torch.bfloat16, seed=76)  # d = 64: Triton's
    assert resolve_backend(q, Options.checked(64, softcap=CAP)).name == "triton"
