"""Deliberately flawed attention implementations: the audit and the fuzzer must catch them."""

from __future__ import annotations

import random

import torch

from verify.reference import attention_f64, causal_mask


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


# -- FlashAttention's softcap and learnable sinks ---------------------------------------------
def _featured(q, k, v, do, causal, softmax_scale, softcap, learnable_sink):
    """float64 outputs and gradients with the features, rounded to the inputs' dtypes."""
    g = attention_f64(q, k, v, do, causal, softmax_scale, softcap=softcap,
                      learnable_sink=learnable_sink)
    out = tuple(x.to(q.dtype) for x in (g.o, g.dq, g.dk, g.dv))
    return out + (() if learnable_sink is None else (g.dsink.to(learnable_sink.dtype),))


def featured_reference(q, k, v, do, causal, softmax_scale, softcap=0.0, learnable_sink=None):
    """Correct: takes a softcap and sinks, float64 gradients (dsink too) rounded."""
    return _featured(q, k, v, do, causal, softmax_scale, softcap, learnable_sink)


def ignores_softcap(q, k, v, do, causal, softmax_scale, softcap=0.0, learnable_sink=None):
    """Softcap bug: says it takes one, then runs without it."""
    return _featured(q, k, v, do, causal, softmax_scale, 0.0, learnable_sink)


def zero_dsink(q, k, v, do, causal, softmax_scale, softcap=0.0, learnable_sink=None):
    """Sink bug: the forward uses the sinks, their gradient is left at zero."""
    out = _featured(q, k, v, do, causal, softmax_scale, softcap, learnable_sink)
    return out if learnable_sink is None else (*out[:4], torch.zeros_like(out[4]))


def forgets_dsink(q, k, v, do, causal, softmax_scale, softcap=0.0, learnable_sink=None):
    """Contract bug: takes sinks, returns no gradient for them (four outputs)."""
    return _featured(q, k, v, do, causal, softmax_scale, softcap, learnable_sink)[:4]


_CALLS = [0]


def shuffled_dsink(q, k, v, do, causal, softmax_scale, softcap=0.0, learnable_sink=None):
    """Order-dependent: dsink is an fp32 sum over query rows in a fresh order every call
    (drawn from the call count, so a test run repeats); O and the other gradients are
    deterministic."""
    out = _featured(q, k, v, do, causal, softmax_scale, softcap, learnable_sink)
    if learnable_sink is None:
        return out
    g = attention_f64(q, k, v, do, causal, softmax_scale, softcap=softcap,
                      learnable_sink=learnable_sink)
    # per row: -P_sink D, the terms of dsink (B, S_q, H)
    sink = learnable_sink.double()
    lse = torch.logsumexp(torch.cat([_scores(q, k, causal, softmax_scale, softcap),
                                     sink[None, :, None, None].expand(q.shape[0], -1,
                                                                      q.shape[1], 1)], -1), -1)
    delta = (g.o * do.double()).sum(-1).permute(0, 2, 1)  # (B, H, S_q)
    terms = (-(sink[None, :, None] - lse).exp() * delta).float().permute(1, 0, 2)
    terms = terms.reshape(q.shape[2], -1)
    _CALLS[0] += 1
    order = torch.randperm(terms.shape[1], generator=torch.Generator().manual_seed(_CALLS[0]))
    dsink = torch.zeros(q.shape[2])
    for r in order:  # one fp32 addition per row, in this call's order
        dsink = dsink + terms[:, r]
    return (*out[:4], dsink.to(learnable_sink.dtype))


def _scores(q, k, causal, softmax_scale, softcap):
    """Scaled (and capped) float64 scores ``(B, H, S_q, S_k)``, masked ones ``-inf``."""
    group = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(),
                     k.double().repeat_interleave(group, 2)) * softmax_scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[1], k.shape[1]), float("-inf"))
    return s


for _fn in (featured_reference, ignores_softcap, zero_dsink, forgets_dsink, shuffled_dsink):
    _fn.takes_softcap = _fn.takes_sinks = True


# -- packed batches (FlashAttention's varlen layout) ------------------------------------------
def _lengths(cu):
    offsets = cu.tolist()
    return [b - a for a, b in zip(offsets, offsets[1:])]


def packed_reference(q, k, v, do, causal, softmax_scale, cu_seqlens_q=None, cu_seqlens_k=None,
                     max_seqlen_q=None, max_seqlen_k=None):
    """Correct: each packed sequence on its own, float64 gradients rounded."""
    from verify.reference import attention_f64_packed

    g = attention_f64_packed(q, k, v, do, _lengths(cu_seqlens_q), _lengths(cu_seqlens_k),
                             causal, softmax_scale)
    return tuple(x.to(q.dtype) for x in (g.o, g.dq, g.dk, g.dv))


def one_long_sequence(q, k, v, do, causal, softmax_scale, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=None, max_seqlen_k=None):
    """Packing bug: ignores the offsets, so every query attends to every packed sequence's
    keys (right only for a batch of one sequence)."""
    out = reference_cast(q[None], k[None], v[None], do[None], causal, softmax_scale)
    return tuple(x[0] for x in out)


packed_reference.takes_packed = one_long_sequence.takes_packed = True
