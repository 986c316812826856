"""``torch.compile``: the custom ops trace without a graph break and keep the bits.

A model with two attention layers, compiled with ``fullgraph=True``, must give O and every
gradient bit for bit equal to the eager model, and ``torch.library.opcheck`` must accept
both ops (schema, fake implementations, autograd registration).
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import inputs, need

import dash_cuda
from dash_cuda.ops import attention_backward_op, attention_op


class TwoLayers(torch.nn.Module):
    def __init__(self, d: int, backend: str):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.mix = torch.nn.Parameter(torch.randn(d, d, generator=gen).bfloat16() / d ** 0.5)
        self.backend = backend

    def forward(self, q, k, v):
        x = dash_cuda.attention(q, k, v, causal=True, backend=self.backend)
        x = (x @ self.mix).contiguous()
        return dash_cuda.attention(x, k, v, causal=False, backend=self.backend)


def run(model, q, k, v, do):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    model.zero_grad(set_to_none=True)
    out = model(*leaves)
    out.backward(do)
    return [out.detach(), *(x.grad for x in leaves), model.mix.grad.clone()]


def test_compiled_model_gives_the_eager_bits(backend):
    need(backend, 64)
    q, k, v, do = inputs((2, 4, 2, 384, 512), 64, torch.bfloat16, seed=31)
    model = TwoLayers(64, backend).cuda()
    eager = run(model, q, k, v, do)
    compiled = run(torch.compile(model, fullgraph=True), q, k, v, do)
    for name, a, b in zip(("O", "dQ", "dK", "dV", "dW"), eager, compiled):
        assert torch.equal(a, b), f"{name} differs between eager and compiled"


def test_no_graph_break(backend):
    need(backend, 64)
    q, k, v, _ = inputs((1, 2, 2, 256, 256), 64, torch.bfloat16, seed=32)
    explained = torch._dynamo.explain(TwoLayers(64, backend).cuda())(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_accepts_both_ops(backend, causal):
    need(backend, 64)
    q, k, v, do = inputs((1, 2, 1, 200, 328), 64, torch.bfloat16, seed=33)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    args = (q, k, v, None, causal, 0.125, "naive", True, False, None, False, backend,
            [-1, -1], 0.0)
    torch.library.opcheck(attention_op, args)
    o, lse = attention_op(*args)
    torch.library.opcheck(attention_backward_op,
                          (q.detach(), k.detach(), v.detach(), o.detach(), lse, do, None,
                           causal, 0.125, "naive", True, False, None, False, backend,
                           [-1, -1], 0.0))
