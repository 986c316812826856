"""The custom ops behind ``dash_cuda.attention``: registration, fake outputs, autograd wiring.

Runs without a GPU: meta and fake tensors take the ops' fake implementations, which must
describe the real outputs exactly (shape, dtype, strides), since ``torch.compile`` plans
the rest of a graph from them. ``tests/gpu/test_compile.py`` runs the real kernels.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import dash_cuda
from dash_cuda.ops import attention_op
from dash_ref import PORTABLE


def meta(*shape, grad=False):
    return torch.randn(*shape, device="meta", dtype=torch.bfloat16, requires_grad=grad)


def test_both_ops_are_registered_with_their_options():
    fwd = str(torch.ops.dash.attention.default._schema)
    bwd = str(torch.ops.dash.attention_backward.default._schema)
    for arg in ("bool causal", "float scale", "str schedule", "SymInt? num_workers", "bool exact",
                "str backend"):
        assert arg in fwd and arg in bwd
    assert "-> (Tensor, Tensor)" in fwd
    assert "-> (Tensor, Tensor, Tensor)" in bwd


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_fake_outputs_have_the_real_layouts(layout):
    """O like q (its strides too), LSE2 a (B, S_q, H) view of a (B, H, S_q) buffer."""
    b, s, h, hk, sk, d = 2, 40, 4, 2, 50, 64
    if layout == "bshd":
        q, k, v = meta(b, s, h, d), meta(b, sk, hk, d), meta(b, sk, hk, d)
    else:  # SDPA's (B, H, S, d) tensors, which the op sees as (B, S, H, d) views
        q, k, v = (x.transpose(1, 2) for x in (meta(b, h, s, d), meta(b, hk, sk, d),
                                               meta(b, hk, sk, d)))
    o, lse = attention_op(q, k, v, True, 0.125, "naive", None, False, "triton")
    assert o.shape == q.shape and o.dtype == q.dtype and o.stride() == q.stride()
    assert lse.shape == (b, s, h) and lse.dtype == torch.float32
    assert lse.stride() == (h * s, 1, s)
    dq, dk, dv = torch.ops.dash.attention_backward(q, k, v, o, lse, meta(b, s, h, d), True,
                                                   0.125, "naive", 66, False, "cute")
    for grad, x in ((dq, q), (dk, k), (dv, v)):
        assert grad.shape == x.shape and grad.dtype == x.dtype and grad.stride() == x.stride()


def test_autograd_runs_the_backward_op_and_lse_has_no_gradient():
    q, k, v = meta(2, 40, 4, 64, grad=True), meta(2, 50, 2, 64, grad=True), meta(2, 50, 2, 64,
                                                                              grad=True)
    o, lse = attention_op(q, k, v, False, 0.125, "shift", None, False, "triton")
    assert o.requires_grad and not lse.requires_grad
    o.float().sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype


def test_the_public_function_reaches_the_op_with_resolved_options():
    """``attention`` validates, resolves ``auto`` and the backend, then calls the op."""
    calls = []

    def spy(*args):
        calls.append(args[3:])
        return attention_op(*args)

    with FakeTensorMode():
        q = torch.randn(1, 300, 4, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 300, 4, 64, device="cuda", dtype=torch.bfloat16)
        original = dash_cuda.api.attention_op
        dash_cuda.api.attention_op = spy
        try:
            o = dash_cuda.attention(q, k, k, causal=True, portable=True, backend="triton")
        finally:
            dash_cuda.api.attention_op = original
    assert o.shape == q.shape
    (causal, scale, schedule, workers, exact, backend), = calls
    assert causal is True and scale == pytest.approx(64 ** -0.5)
    assert schedule in PORTABLE
    assert workers is None and exact is False and backend == "triton"
