"""The CuTe backend's packed (varlen) forward on the GPU: L2, accuracy, packing invariance,
determinism.

The backend still refuses packed calls (no packed backward yet), so these tests run its
forward through ``CuteBackend.forward_varlen`` on a :class:`dash_cuda.options.Packing`:

* ``O`` and ``LSE2`` equal ``dash_ref.emulate.forward(arithmetic="fast")`` of the packed
  batch (each sequence in its own coordinates) bit for bit, outputs poisoned with NaN
  first (a row the kernel fails to write, or one it writes past a sequence's end, shows):
  heavy-tailed lengths with empty sequences, length 1, lengths off the tiles, S_q != S_k
  per sequence (causal rows that see no key), sequences without keys; causal, full and one
  window; bf16 and fp16, d 64 and 128, MHA and GQA;
* every sequence's ``O`` within its float64 bound (``verify.reference.attention_f64_packed``);
* packing invariance: each sequence's bits equal those of the same sequence packed in
  another order with larger ``max_seqlen`` values, and of the batch-1 CuTe forward
  (``dash_cuda.attention_forward(backend="cute")``) on it alone;
* 100 runs give one bit pattern;
* ``backend="auto"`` still runs packed calls on Triton and ``backend="cute"`` refuses them.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cases import bound, normwise

import dash_cuda
from dash_cuda.options import Packing
from dash_ref import Mask
from dash_ref.emulate import forward as emulated_forward
from verify.reference import attention_f64_packed

SEQLENS_Q = (1, 0, 700, 3, 511, 0, 257, 64, 129, 1)
SEQLENS_K = (1, 7, 900, 3, 300, 0, 257, 130, 129, 0)
# (causal, window, H, H_kv, d, dtype)
CASES = [
    (True, (-1, -1), 4, 4, 64, torch.bfloat16),
    (False, (-1, -1), 4, 2, 128, torch.float16),
    (True, (-1, -1), 2, 1, 128, torch.bfloat16),
    (False, (-1, -1), 2, 2, 64, torch.float16),
    (False, (64, 32), 4, 2, 64, torch.bfloat16),
]
IDS = [f"{'causal' if c else 'full'}-{w}-h{h}x{hk}-d{d}-{str(t)[6:]}"
       for c, w, h, hk, d, t in CASES]


@pytest.fixture(autouse=True)
def _cute_only():
    from dash_cuda.backends import get_backend

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()],
                        dtype=torch.int32, device="cuda")


def packing_of(seqlens_q, seqlens_k, extra: int = 0) -> Packing:
    return Packing.read(offsets(seqlens_q), offsets(seqlens_k), max(seqlens_q) + extra,
                        max(seqlens_k) + extra, sum(seqlens_q), sum(seqlens_k))


def packed_inputs(seqlens_q, seqlens_k, heads, heads_kv, d, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    return (randn(sum(seqlens_q), heads, d), randn(sum(seqlens_k), heads_kv, d),
            randn(sum(seqlens_k), heads_kv, d))


def cute_forward(q, k, v, packing, causal, window, scale):
    from dash_cuda.backends.cute import BACKEND

    with torch.cuda.device(q.device):
        return BACKEND.forward_varlen(q, k, v, packing, Mask.of(causal, window), scale, True)


def split(x: torch.Tensor, lengths) -> list[torch.Tensor]:
    return list(torch.split(x, list(lengths)))


@pytest.mark.parametrize("causal, window, heads, heads_kv, d, dtype", CASES, ids=IDS)
def test_the_packed_forward_is_dash_ref_fast_bit_for_bit(causal, window, heads, heads_kv, d,
                                                         dtype):
    from dash_cuda.backends.cute.launch import forward_variant

    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=d + heads)
    scale = 1 / math.sqrt(d)
    o, lse2 = cute_forward(q, k, v, packing_of(SEQLENS_Q, SEQLENS_K), causal, window, scale)
    assert lse2.shape == (q.shape[0], heads) and lse2.stride() == (1, q.shape[0])
    block_m = forward_variant(dtype, d, Mask.of(causal, window), max(SEQLENS_Q), True).block_m
    emu = emulated_forward(q.cpu(), k.cpu(), v.cpu(), causal, scale, block_m, 128,
                           arithmetic="fast", seqlens_q=SEQLENS_Q, seqlens_k=SEQLENS_K,
                           window_size=window)
    assert torch.equal(o.cpu(), emu.o)
    assert torch.equal(lse2.cpu(), emu.lse2)
    # a sequence with queries and no keys: O = 0, LSE2 = -inf
    assert torch.equal(split(o, SEQLENS_Q)[-1], torch.zeros_like(split(o, SEQLENS_Q)[-1]))
    assert (split(lse2, SEQLENS_Q)[-1] == -math.inf).all()
    # accuracy: every sequence within its float64 bound
    ref = attention_f64_packed(q.cpu(), k.cpu(), v.cpu(), torch.zeros_like(q).cpu(), SEQLENS_Q,
                               SEQLENS_K, causal=causal, softmax_scale=scale,
                               window_size=window)
    for b, (got, exact) in enumerate(zip(split(o.cpu(), SEQLENS_Q), split(ref.o, SEQLENS_Q))):
        if exact.numel() and exact.norm() > 0:
            shape = (1, heads, heads_kv, SEQLENS_Q[b], SEQLENS_K[b])
            assert normwise(got, exact) <= bound(dtype, "o", shape, d), b


@pytest.mark.parametrize("causal, window, heads, heads_kv, d, dtype", CASES[:2] + CASES[4:],
                         ids=IDS[:2] + IDS[4:])
def test_each_sequence_has_its_batch_1_bits_in_any_packing(causal, window, heads, heads_kv, d,
                                                           dtype):
    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=7)
    scale = 1 / math.sqrt(d)
    o, lse2 = cute_forward(q, k, v, packing_of(SEQLENS_Q, SEQLENS_K), causal, window, scale)
    order = [4, 9, 2, 0, 7, 5, 3, 8, 1, 6]
    perm_q = [SEQLENS_Q[b] for b in order]
    perm_k = [SEQLENS_K[b] for b in order]
    qs, ks, vs = split(q, SEQLENS_Q), split(k, SEQLENS_K), split(v, SEQLENS_K)
    o2, lse2_2 = cute_forward(torch.cat([qs[b] for b in order]),
                              torch.cat([ks[b] for b in order]),
                              torch.cat([vs[b] for b in order]),
                              packing_of(perm_q, perm_k, extra=300), causal, window, scale)
    o2s, l2s = split(o2, perm_q), split(lse2_2, perm_q)
    os_, ls = split(o, SEQLENS_Q), split(lse2, SEQLENS_Q)
    for n, b in enumerate(order):
        assert torch.equal(os_[b], o2s[n]) and torch.equal(ls[b], l2s[n]), b
        if SEQLENS_Q[b] and SEQLENS_K[b]:
            o1, l1 = dash_cuda.attention_forward(qs[b][None], ks[b][None], vs[b][None],
                                                 causal=causal, softmax_scale=scale,
                                                 window_size=window, backend="cute")
            assert torch.equal(os_[b], o1[0]) and torch.equal(ls[b], l1[0]), b


def test_a_hundred_runs_give_one_bit_pattern():
    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, 4, 2, 128, torch.bfloat16, seed=3)
    packing = packing_of(SEQLENS_Q, SEQLENS_K)
    first = cute_forward(q, k, v, packing, True, (-1, -1), 0.125)
    for _ in range(100):
        again = cute_forward(q, k, v, packing, True, (-1, -1), 0.125)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


def test_packed_calls_still_run_on_triton():
    from dash_cuda.backends import Case, choose_backend

    case = Case(64, torch.bfloat16, False, True, packed=True)
    assert choose_backend("auto", case).name == "triton"
    with pytest.raises(ValueError, match="packed"):
        choose_backend("cute", case)
