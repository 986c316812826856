"""Float64 attention through PyTorch autograd: the everyday reference for accuracy checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class Grads:
    o: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bottom-right causal mask ``(S_q, S_k)``: row ``r`` sees ``c`` iff ``c <= r + S_k - S_q``."""
    r = torch.arange(seqlen_q, device=device)[:, None]
    c = torch.arange(seqlen_k, device=device)[None, :]
    return c <= r + seqlen_k - seqlen_q


def attention_f64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                  causal: bool = False, softmax_scale: float | None = None) -> Grads:
    """Output and gradients in float64 for ``(B, S, H, d)`` inputs (GQA by head repetition).

    Rows that see no key give ``O = 0`` and zero gradients.
    """
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    kk, vv = k64.repeat_interleave(group, 2), v64.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q64, kk) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[1], k.shape[1], q.device), -math.inf)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    o.backward(do.double())
    return Grads(o.detach(), q64.grad, k64.grad, v64.grad)
