"""Inputs, references and bounds shared by the GPU tests."""

from __future__ import annotations

import math

import torch

from dash_ref import Mask
from verify.reference import attention_f64

try:  # the accuracy bound of verify.highprec when it exists, else fixed normwise bounds
    from verify.highprec import error_bound
except ImportError:  # pragma: no cover - depends on the checkout
    error_bound = None

DTYPES = (torch.bfloat16, torch.float16)
FIXED_BOUND = {torch.bfloat16: 2e-2, torch.float16: 3e-3}

# (B, H, H_kv, S_q, S_k): tile multiples, ragged lengths, S_q < S_k and S_q > S_k (causal
# rows that see no key), MHA, GQA and MQA, a single query row.
SHAPES = [
    (2, 4, 4, 256, 256),
    (1, 4, 2, 200, 333),
    (2, 6, 1, 333, 190),
    (1, 2, 2, 1, 77),
    (3, 8, 2, 64, 700),
    (1, 4, 4, 1000, 1000),
]


def inputs(shape, d: int, dtype: torch.dtype, seed: int):
    """Fresh seeded ``q, k, v, do`` on the GPU, ``(B, S, H, d)``."""
    b, h, hk, sq, sk = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*size):
        return torch.randn(*size, device="cuda", generator=gen).to(dtype)

    return randn(b, sq, h, d), randn(b, sk, hk, d), randn(b, sk, hk, d), randn(b, sq, h, d)


def bound(dtype: torch.dtype, grad: str, shape, d: int) -> float:
    """Normwise relative error bound for one output."""
    b, h, hk, sq, sk = shape
    if error_bound is None:
        return FIXED_BOUND[dtype]
    return error_bound(dtype, grad, seqlen_q=sq, seqlen_k=sk, head_dim=d, group=h // hk)


def normwise(x: torch.Tensor, exact: torch.Tensor) -> float:
    return float((x.double() - exact).norm() / exact.norm())


def reference(q, k, v, do, causal: bool, softmax_scale: float | None = None):
    """float64 output and gradients, and the base-2 LSE, on the GPU (the keys a row sees
    by :class:`dash_ref.Mask`, the one visibility rule)."""
    ref = attention_f64(q, k, v, do, causal=causal, softmax_scale=softmax_scale)
    group = q.shape[2] // k.shape[2]
    s = torch.einsum("bqhd,bkhd->bqhk", q.double(), k.double().repeat_interleave(group, 2))
    s = s * (1 / math.sqrt(q.shape[-1]) if softmax_scale is None else softmax_scale)
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    seen = Mask.of(causal).visible(range(seqlen_q), range(seqlen_k), seqlen_q, seqlen_k)
    s = s.masked_fill(~seen.to(q.device)[None, :, None, :], -math.inf)
    lse2 = torch.logsumexp(s, dim=-1) / math.log(2)
    return ref, lse2


def need(backend: str, head_dim: int, dtype: torch.dtype = torch.bfloat16,
         exact: bool = False, deterministic: bool = True) -> None:
    """Skip the calling test where ``backend`` does not run this case (say why)."""
    import pytest

    from dash_cuda.backends import Case, get_backend

    impl = get_backend(backend)
    reason = impl.missing() or impl.unsupported(Case(head_dim, dtype, exact, deterministic))
    if reason:
        pytest.skip(f"backend {backend!r}: {reason}")


def busy_trials(once, trials: int):
    """``once()`` run ``trials`` times, each while another stream keeps the GPU busy with
    matmuls (a determinism claim must hold under load); yields each run's outputs."""
    busy = torch.cuda.Stream()
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(trials):
        with torch.cuda.stream(busy):
            for _ in range(4):
                x = (x @ x).tanh_()
        yield once()
    torch.cuda.synchronize()


def passes(q, k, v, do, mask: dict, features: dict, backend: str = "cute", **backward):
    """``(O, LSE2, gradients)`` of the two passes on ``backend``, outputs poisoned first:
    the forward under the ``mask`` and ``features`` keywords (softcap, sinks), the backward
    under both and the ``backward`` keywords (schedule, workers, audit)."""
    import dash_cuda

    o, lse = dash_cuda.attention_forward(q, k, v, _poison=True, backend=backend, **mask,
                                         **features)
    got = dash_cuda.attention_backward(q, k, v, o, lse, do, _poison=True, backend=backend,
                                       **mask, **features, **backward)
    return o, lse, got
