"""FlashAttention's packed-QKV and packed-KV entry points: ``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func`` and their varlen forms, as FlashAttention names and orders
their arguments.

Each takes views of its packed tensor (no copy) and hands them, with every option as
written, to ``flash_attn_func`` / ``flash_attn_varlen_func``; the gradients flow back into
the packed tensor. Checked on the CPU by recording what the unpacked function receives and,
for gradients, by standing a differentiable CPU attention in for the kernels.
(``tests/gpu/test_cuda_flash_packed.py`` compares the bits with the unpacked calls.)
"""

from __future__ import annotations

import inspect

import pytest
import torch

import dash_cuda
from dash_cuda import api

FLASH_ORDER = ["dropout_p", "softmax_scale", "causal", "window_size", "softcap",
               "alibi_slopes", "deterministic", "return_attn_probs"]
DASH_OPTIONS = ["schedule", "num_workers", "exact", "backend", "portable", "learnable_sink"]
ENTRIES = {  # name: (FlashAttention's leading arguments, the function it unpacks into)
    "flash_attn_qkvpacked_func": (["qkv"], "flash_attn_func"),
    "flash_attn_kvpacked_func": (["q", "kv"], "flash_attn_func"),
    "flash_attn_varlen_qkvpacked_func": (["qkv", "cu_seqlens", "max_seqlen"],
                                         "flash_attn_varlen_func"),
    "flash_attn_varlen_kvpacked_func": (["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                         "max_seqlen_q", "max_seqlen_k"],
                                        "flash_attn_varlen_func"),
}


@pytest.mark.parametrize("name", ENTRIES)
def test_flash_attentions_argument_order(name):
    params = inspect.signature(getattr(dash_cuda, name)).parameters
    leading, _ = ENTRIES[name]
    positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == leading + FLASH_ORDER
    assert [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY] == DASH_OPTIONS
    assert params["deterministic"].default is True
    assert name in dash_cuda.__all__


def _record(monkeypatch, target):
    seen = {}
    monkeypatch.setattr(api, target, lambda *a, **kw: seen.update(args=a, kw=kw) or "o")
    return seen


OPTIONS = dict(softmax_scale=0.25, causal=True, window_size=(64, 0), softcap=30.0,
               deterministic=False, schedule="naive", num_workers=7, exact=False,
               backend="triton", portable=False, learnable_sink=None)


def _same_view(view, of):
    """``view`` shares ``of``'s memory (no copy)."""
    return view.untyped_storage().data_ptr() == of.untyped_storage().data_ptr()


def test_qkv_packed_unpacks_along_dim_2_into_flash_attn_func(monkeypatch):
    seen = _record(monkeypatch, "flash_attn_func")
    qkv = torch.randn(2, 8, 3, 4, 64, dtype=torch.bfloat16)
    assert dash_cuda.flash_attn_qkvpacked_func(qkv, 0.0, **OPTIONS) == "o"
    for i, x in enumerate(seen["args"]):
        assert torch.equal(x, qkv[:, :, i]) and _same_view(x, qkv)
    assert seen["kw"] == OPTIONS


def test_kv_packed_takes_gqa_and_unpacks_kv(monkeypatch):
    seen = _record(monkeypatch, "flash_attn_func")
    q = torch.randn(2, 8, 4, 64, dtype=torch.bfloat16)
    kv = torch.randn(2, 12, 2, 1, 64, dtype=torch.bfloat16)
    dash_cuda.flash_attn_kvpacked_func(q, kv, **OPTIONS)
    got_q, k, v = seen["args"]
    assert got_q is q and torch.equal(k, kv[:, :, 0]) and torch.equal(v, kv[:, :, 1])
    assert seen["kw"] == OPTIONS


def test_varlen_qkv_packed_uses_one_set_of_offsets_for_both(monkeypatch):
    seen = _record(monkeypatch, "flash_attn_varlen_func")
    qkv = torch.randn(20, 3, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    dash_cuda.flash_attn_varlen_qkvpacked_func(qkv, cu, 13, **OPTIONS)
    q, k, v, cu_q, cu_k, max_q, max_k = seen["args"]
    for i, x in enumerate((q, k, v)):
        assert torch.equal(x, qkv[:, i]) and _same_view(x, qkv)
    assert cu_q is cu and cu_k is cu and max_q == max_k == 13
    assert seen["kw"] == OPTIONS


def test_varlen_kv_packed_passes_both_offsets(monkeypatch):
    seen = _record(monkeypatch, "flash_attn_varlen_func")
    q = torch.randn(20, 4, 64, dtype=torch.bfloat16)
    kv = torch.randn(30, 2, 2, 64, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 7, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 10, 30], dtype=torch.int32)
    dash_cuda.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 13, 20, **OPTIONS)
    assert seen["args"][0] is q and seen["args"][3:] == (cu_q, cu_k, 13, 20)
    assert torch.equal(seen["args"][1], kv[:, 0]) and torch.equal(seen["args"][2], kv[:, 1])


@pytest.mark.parametrize(("call", "text"), [
    (lambda: dash_cuda.flash_attn_qkvpacked_func(torch.randn(2, 8, 4, 64)),
     "qkv must be (B, S, 3, H, d), got shape (2, 8, 4, 64)"),
    (lambda: dash_cuda.flash_attn_qkvpacked_func(torch.randn(2, 8, 2, 4, 64)),
     "qkv must be (B, S, 3, H, d), got shape (2, 8, 2, 4, 64)"),
    (lambda: dash_cuda.flash_attn_kvpacked_func(torch.randn(2, 8, 4, 64),
                                                torch.randn(2, 8, 3, 4, 64)),
     "kv must be (B, S_k, 2, H_k, d), got shape (2, 8, 3, 4, 64)"),
    (lambda: dash_cuda.flash_attn_varlen_qkvpacked_func(
        torch.randn(20, 4, 64), torch.tensor([0, 20], dtype=torch.int32), 20),
     "qkv must be (total, 3, H, d), got shape (20, 4, 64)"),
    (lambda: dash_cuda.flash_attn_varlen_kvpacked_func(
        torch.randn(20, 4, 64), torch.randn(20, 3, 4, 64),
        *[torch.tensor([0, 20], dtype=torch.int32)] * 2, 20, 20),
     "kv must be (total_k, 2, H_k, d), got shape (20, 3, 4, 64)"),
])
def test_a_wrongly_packed_tensor_is_named_in_one_line(call, text):
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == text


def test_a_packed_argument_that_is_no_tensor_is_refused():
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor, got list"):
        dash_cuda.flash_attn_qkvpacked_func([[1.0]])


@pytest.mark.parametrize("name", ["flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"])
def test_options_dash_does_not_compute_are_refused_under_the_entrys_name(name):
    tensors = ([torch.randn(1, 8, 3, 2, 64)] if name == "flash_attn_qkvpacked_func"
               else [torch.randn(1, 8, 2, 64), torch.randn(1, 8, 2, 2, 64)])
    with pytest.raises(ValueError) as info:
        getattr(dash_cuda, name)(*tensors, dropout_p=0.1, return_attn_probs=True)
    text = str(info.value)
    assert text.startswith(f"{name}:") and "dropout_p=0.1" in text
    assert "return_attn_probs=True" in text and "\n" not in text


def test_the_gradient_flows_back_into_the_packed_tensor(monkeypatch):
    """With a differentiable stand-in for the kernels, ``qkv.grad`` holds dQ, dK and dV of
    the unpacked call, each in its slot."""
    def sdpa(q, k, v, **kw):  # (B, S, H, d) in and out, on the CPU
        t = [x.transpose(1, 2) for x in (q, k, v)]
        return torch.nn.functional.scaled_dot_product_attention(
            *t, is_causal=kw["causal"]).transpose(1, 2)

    monkeypatch.setattr(api, "flash_attn_func", sdpa)
    qkv = torch.randn(2, 8, 3, 2, 16, dtype=torch.float64, requires_grad=True)
    do = torch.randn(2, 8, 2, 16, dtype=torch.float64)
    out = dash_cuda.flash_attn_qkvpacked_func(qkv, causal=True)
    (grad,) = torch.autograd.grad(out, qkv, do)
    leaves = [qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3)]
    want = torch.autograd.grad(sdpa(*leaves, causal=True), leaves, do)
    for i in range(3):
        assert torch.equal(grad[:, :, i], want[i])
