"""Head dims 192 (``d_v`` 192 or 128) and 256 on the CuTe backend, on the GPU: the backward
whose math warpgroups split the head dims, the forward's 64-key tiles.

- L2: the CPU reproduces every step of a default run bit for bit (``verify.capture``):
  GQA at 192 / 128, rows that see no key at 256, both masks, a sliding window, a softcap,
  a packed batch;
- accuracy: ``O``, ``dQ``, ``dK``, ``dV`` within the float64 reference's bound;
- determinism (L0): 1000 runs at 256 with a busy stream give one bit pattern;
- ``"auto"`` takes these calls to CuTe, autograd gives the passes' bits.
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import busy_trials

import dash_cuda
from verify.capture import capture, check
from verify.reference import attention_f64, grad_checks

CUTE = dict(backend="cute")
# (B, H, H_kv, S_q, S_k), d, d_v, dtype, num_workers
CASES = [((1, 4, 2, 200, 333), 192, 128, torch.bfloat16, 3),  # GQA, S_q != S_k
         ((2, 2, 2, 190, 150), 256, 256, torch.float16, None),  # rows that see no key
         ((1, 2, 1, 130, 260), 192, 192, torch.bfloat16, 2)]
IDS = [f"d{d}-v{dv}" for _, d, dv, _, _ in CASES]


def inputs(shape, d, dv, dtype, seed):
    b, h, hk, sq, sk = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(*s, device="cuda", generator=gen).to(dtype)
                 for s in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv), (b, sq, h, dv)))


@pytest.fixture(autouse=True)
def _cute():
    from dash_cuda.backends import get_backend

    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


def steps_equal(c) -> None:
    assert c.meta["backend"] == "cute" and c.meta["arithmetic"] == "fast"
    assert (c.meta["block_m"], c.meta["block_n"]) == (64, 64)  # the head-dim split's tiles
    steps = check(c)
    assert [s for s, _, _ in steps][:3] == ["O", "LSE2", "D"]
    for name, got, want in steps:
        assert torch.equal(got, want), name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dv, dtype, num_workers", CASES, ids=IDS)
def test_the_cpu_reproduces_every_step(shape, d, dv, dtype, num_workers, causal):
    q, k, v, do = inputs(shape, d, dv, dtype, seed=91 + causal)
    # causal: a deterministic schedule other than auto's choice too (the bits follow it)
    for schedule in ("auto", "descending") if causal else ("auto",):
        steps_equal(capture(q, k, v, do, causal=causal, schedule=schedule,
                            num_workers=num_workers))


def test_a_window_a_softcap_and_a_packed_batch_are_reproduced():
    q, k, v, do = inputs((1, 2, 2, 300, 300), 256, 256, torch.bfloat16, seed=93)
    steps_equal(capture(q, k, v, do, window_size=(70, 20)))
    steps_equal(capture(q, k, v, do, causal=True, softcap=50.0))  # Gemma 2's cap
    lengths = torch.tensor([0, 130, 131, 300], dtype=torch.int32, device="cuda")
    q, k, v, do = (x[0] for x in inputs((1, 4, 2, 300, 300), 192, 128, torch.bfloat16, 94))
    packing = dict(cu_seqlens_q=lengths, cu_seqlens_k=lengths, max_seqlen_q=169,
                   max_seqlen_k=169)
    steps_equal(capture(q, k, v, do, causal=True, packing=packing))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dv, dtype, num_workers", CASES, ids=IDS)
def test_the_default_arithmetic_is_within_the_float64_bound(shape, d, dv, dtype, num_workers,
                                                            causal):
    q, k, v, do = inputs(shape, d, dv, dtype, seed=95)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, _poison=True, **CUTE)
    grads = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, _poison=True,
                                         **CUTE)
    out = dict(zip(("o", "dq", "dk", "dv"), (o, *grads[:3])))
    ref = attention_f64(q, k, v, do, causal=causal)
    for name, c in grad_checks(out, ref, dtype).items():
        assert c.ok, (name, c)
    flipped = attention_f64(q, k, v.flip(-1), do, causal=causal)
    assert not grad_checks({"o": o}, flipped, dtype)["o"].ok  # the check can fail


def test_one_bit_pattern_in_1000_runs_with_a_busy_stream():
    q, k, v, do = inputs((1, 8, 8, 512, 512), 256, 256, torch.bfloat16, seed=96)

    def once():
        o, lse = dash_cuda.attention_forward(q, k, v, causal=True, **CUTE)
        return (o, lse, *dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True,
                                                      **CUTE)[:3])

    first = once()
    for again in busy_trials(once, 999):
        for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV"), first, again):
            assert torch.equal(a, b), name


def test_auto_takes_cute_and_autograd_gives_the_passes_bits():
    shape, d, dv, dtype, _ = CASES[0]
    q, k, v, do = inputs(shape, d, dv, dtype, seed=97)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True, **CUTE)
    want = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=True, **CUTE)[:3]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    for _ in range(2):  # the first call, then its plan (O has the values' head dim)
        out = dash_cuda.attention(*leaves, causal=True)  # backend "auto"
        assert out.shape == do.shape and torch.equal(out, o)
        for leaf in leaves:
            leaf.grad = None
        out.backward(do)
        for name, leaf, ref in zip(("dq", "dk", "dv"), leaves, want):
            assert torch.equal(leaf.grad, ref), name
