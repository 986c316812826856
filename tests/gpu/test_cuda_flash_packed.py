"""FlashAttention's packed-QKV and packed-KV entry points give the bits of the unpacked
calls (``tests/test_flash_attn_packed.py`` checks their plumbing on the CPU): ``O`` and
the packed gradient, slot by slot, ``torch.equal`` against ``flash_attn_func`` /
``flash_attn_varlen_func`` on the same values as separate tensors, on both backends."""

from __future__ import annotations

import torch
from gpu_cases import need

import dash_cuda


def _grads(out, leaves, do):
    return torch.autograd.grad(out, leaves, do)


def test_qkv_and_kv_packed_give_the_unpacked_bits(backend):
    need(backend, 64)
    gen = torch.Generator(device="cuda").manual_seed(61)
    qkv = torch.randn(2, 300, 3, 4, 64, device="cuda", generator=gen).bfloat16()
    do = torch.randn(2, 300, 4, 64, device="cuda", generator=gen).bfloat16()
    leaves = [qkv[:, :, i].clone().requires_grad_() for i in range(3)]
    want_o = dash_cuda.flash_attn_func(*leaves, causal=True, backend=backend)
    want = _grads(want_o, leaves, do)

    packed = qkv.clone().requires_grad_()
    out = dash_cuda.flash_attn_qkvpacked_func(packed, causal=True, backend=backend)
    (grad,) = _grads(out, [packed], do)
    assert torch.equal(out, want_o)
    for i in range(3):
        assert torch.equal(grad[:, :, i], want[i])

    kv = qkv[:, :, 1:].clone().requires_grad_()
    q = leaves[0].detach().clone().requires_grad_()
    out = dash_cuda.flash_attn_kvpacked_func(q, kv, causal=True, backend=backend)
    dq, dkv = _grads(out, [q, kv], do)
    assert torch.equal(out, want_o) and torch.equal(dq, want[0])
    assert torch.equal(dkv[:, :, 0], want[1]) and torch.equal(dkv[:, :, 1], want[2])


def test_varlen_qkv_packed_gives_the_unpacked_bits(backend):
    need(backend, 128)
    gen = torch.Generator(device="cuda").manual_seed(62)
    lengths = (300, 1, 0, 130)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda",
                      dtype=torch.int32)
    total = sum(lengths)
    qkv = torch.randn(total, 3, 2, 128, device="cuda", generator=gen).bfloat16()
    do = torch.randn(total, 2, 128, device="cuda", generator=gen).bfloat16()
    leaves = [qkv[:, i].clone().requires_grad_() for i in range(3)]
    want_o = dash_cuda.flash_attn_varlen_func(*leaves, cu, cu, max(lengths), max(lengths),
                                              causal=True, backend=backend)
    want = _grads(want_o, leaves, do)
    packed = qkv.clone().requires_grad_()
    out = dash_cuda.flash_attn_varlen_qkvpacked_func(packed, cu, max(lengths), causal=True,
                                                     backend=backend)
    (grad,) = _grads(out, [packed], do)
    assert torch.equal(out, want_o)
    for i in range(3):
        assert torch.equal(grad[:, i], want[i])
