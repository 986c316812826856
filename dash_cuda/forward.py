"""Launch the forward kernel: ``(O, LSE2)`` from ``(B, S, H, d)`` views of q, k, v."""

from __future__ import annotations

import math

import torch
import triton

from dash_ref.emulate import scale_log2 as _scale_log2_fp32

from .config import forward_config
from .fwd_kernel import dash_fwd_kernel


def scale_log2(softmax_scale: float) -> float:
    """The emulator's fp32 ``softmax_scale * log2(e)`` (Triton passes floats as fp32)."""
    return float(_scale_log2_fp32(softmax_scale))


def run_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                softmax_scale: float, poison: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``O`` like ``q`` (same strides) and fp32 ``LSE2`` of shape ``(B, S_q, H)``.

    Inputs are validated ``(B, S, H, d)`` views with a contiguous last dim and non-empty
    sequences. ``poison`` fills the outputs with NaN first (tests: every element written).
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    # (B, S_q, H) view of a (B, H, S_q) buffer: each head's rows are contiguous, so the
    # backward loads a Q tile's LSE2 values as vectors
    lse2 = torch.empty((batch, heads, seqlen_q), device=q.device,
                       dtype=torch.float32).transpose(1, 2)
    if poison:
        o.fill_(math.nan)
        lse2.fill_(math.nan)
    cfg = forward_config(head_dim)
    grid = (triton.cdiv(seqlen_q, cfg.block_m), batch * heads)
    dash_fwd_kernel[grid](
        q, k, v, o, lse2,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        lse2.stride(0), lse2.stride(1), lse2.stride(2),
        heads, heads // heads_kv, seqlen_q, seqlen_k, seqlen_k - seqlen_q,
        scale_log2(softmax_scale),
        BM=cfg.block_m, BN=cfg.block_n, HEAD_DIM=head_dim, CAUSAL=causal,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o, lse2
