"""Deliberately flawed attention implementations: the audit and the fuzzer must catch them."""

from __future__ import annotations

import random

import torch

from verify.reference import attention_f64


def reference_cast(q, k, v, do, causal, softmax_scale):
    """Correct: float64 gradients rounded to the input dtype (deterministic)."""
    g = attention_f64(q, k, v, do, causal, softmax_scale)
    return tuple(x.to(q.dtype) for x in (g.o, g.dq, g.dk, g.dv))


def shuffled_dq(q, k, v, do, causal, softmax_scale):
    """Order-dependent: dQ is an fp32 sum over keys in a fresh random order every call."""
    o, _, dk, dv = reference_cast(q, k, v, do, causal, softmax_scale)
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd.repeat_interleave(q.shape[2] // k.shape[2], 2))
    p = torch.softmax(s * softmax_scale, -1)
    dp = torch.einsum("bqhd,bkhd->bhqk", do.double(),
                      vd.repeat_interleave(q.shape[2] // k.shape[2], 2))
    ds = (p * (dp - (dp * p).sum(-1, keepdim=True))).float()
    kk = k.float().repeat_interleave(q.shape[2] // k.shape[2], 2)
    order = list(range(k.shape[1]))
    random.shuffle(order)
    dq = torch.zeros(q.shape, dtype=torch.float32)
    for c in order:  # one fp32 addition per key, in arrival order
        dq = dq + ds[..., c].permute(0, 2, 1)[..., None] * kk[:, c][:, None]
    return o, (dq * softmax_scale).to(q.dtype), dk, dv


def broken_tail(q, k, v, do, causal, softmax_scale):
    """Shape bug: forgets the last key when S_k > 16 is not a multiple of 16."""
    s_k = k.shape[1]
    if s_k <= 16 or s_k % 16 == 0 or causal:
        return reference_cast(q, k, v, do, causal, softmax_scale)
    o, dq, dk, dv = reference_cast(q, k[:, :-1], v[:, :-1], do, causal, softmax_scale)
    pad = torch.zeros_like(k[:, -1:])
    return o, dq, torch.cat([dk, pad], 1), torch.cat([dv, pad], 1)


def windowed_reference(q, k, v, do, causal, softmax_scale, window_size=(-1, -1)):
    """Correct: takes a sliding window, float64 gradients under it rounded to the input
    dtype."""
    g = attention_f64(q, k, v, do, causal, softmax_scale, window_size=window_size)
    return tuple(x.to(q.dtype) for x in (g.o, g.dq, g.dk, g.dv))


windowed_reference.takes_window = True


def ignores_window(q, k, v, do, causal, softmax_scale, window_size=(-1, -1)):
    """Window bug: says it takes a sliding window, then attends to every key (causal only)."""
    return reference_cast(q, k, v, do, causal, softmax_scale)


ignores_window.takes_window = True
