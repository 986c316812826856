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
from dash_cuda.ops import attention_op, resolve_backend, resolve_schedule
from dash_cuda.options import FIELDS, Options
from dash_ref import NAMES, PORTABLE


def meta(*shape, grad=False):
    return torch.randn(*shape, device="meta", dtype=torch.bfloat16, requires_grad=grad)


def test_both_ops_are_registered_with_their_options():
    fwd = str(torch.ops.dash.attention.default._schema)
    bwd = str(torch.ops.dash.attention_backward.default._schema)
    for arg in ("bool causal", "float softmax_scale", "str schedule", "bool deterministic",
                "bool portable", "SymInt? num_workers", "bool exact", "str backend",
                "SymInt[] window_size", "float softcap", "Tensor? learnable_sink"):
        assert arg in fwd and arg in bwd
    assert "-> (Tensor, Tensor)" in fwd
    assert "-> (Tensor, Tensor, Tensor, Tensor)" in bwd  # dQ, dK, dV, dsink


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_fake_outputs_have_the_real_layouts(layout):
    """O like q (its strides too), LSE2 a (B, S_q, H) view of a (B, H, S_q) buffer."""
    b, s, h, hk, sk, d = 2, 40, 4, 2, 50, 64
    if layout == "bshd":
        q, k, v = meta(b, s, h, d), meta(b, sk, hk, d), meta(b, sk, hk, d)
    else:  # SDPA's (B, H, S, d) tensors, which the op sees as (B, S, H, d) views
        q, k, v = (x.transpose(1, 2) for x in (meta(b, h, s, d), meta(b, hk, sk, d),
                                               meta(b, hk, sk, d)))
    o, lse = attention_op(q, k, v, None, True, 0.125, "naive", True, False, None, False,
                          "triton", [-1, -1], 0.0)
    assert o.shape == q.shape and o.dtype == q.dtype and o.stride() == q.stride()
    assert lse.shape == (b, s, h) and lse.dtype == torch.float32
    assert lse.stride() == (h * s, 1, s)
    dq, dk, dv, dsink = torch.ops.dash.attention_backward(
        q, k, v, o, lse, meta(b, s, h, d), None, True, 0.125, "naive", True, False, 66, False,
        "cute", [-1, -1], 0.0)
    assert dsink.shape == (0,)  # no sinks: an empty gradient, which autograd drops
    for grad, x in ((dq, q), (dk, k), (dv, v)):
        assert grad.shape == x.shape and grad.dtype == x.dtype and grad.stride() == x.stride()


def test_autograd_runs_the_backward_op_and_lse_has_no_gradient():
    q, k, v = meta(2, 40, 4, 64, grad=True), meta(2, 50, 2, 64, grad=True), meta(2, 50, 2, 64,
                                                                              grad=True)
    o, lse = attention_op(q, k, v, None, False, 0.125, "auto", True, True, None, False, "auto",
                          [-1, -1], 0.0)
    assert o.requires_grad and not lse.requires_grad
    o.float().sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype


class TwoLayers(torch.nn.Module):
    """Two attention calls with a matmul between them, as a transformer stacks them."""

    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("mix", torch.randn(d, d, device="cuda", dtype=torch.bfloat16))

    def forward(self, q, k, v):
        x = dash_cuda.attention(q, k, v, causal=True, portable=True)
        return dash_cuda.attention((x @ self.mix).contiguous(), k, v, schedule="shift")


def test_a_model_traces_into_one_graph_of_two_ops_with_the_options_as_written():
    """``fullgraph=True`` fails on any graph break; the options reach the ops unresolved."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with FakeTensorMode(allow_non_fake_inputs=True):  # CUDA tensors without a GPU
        q = torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 200, 2, 64, device="cuda", dtype=torch.bfloat16)
        out = torch.compile(TwoLayers(64), fullgraph=True, backend=record)(q, k, k)
    assert out.shape == q.shape
    (graph,) = graphs
    calls = [n.args for n in graph.graph.nodes if n.target is torch.ops.dash.attention.default]
    assert [c[3:] for c in calls] == [
        (None, True, 0.125, "auto", True, True, None, False, "auto", (-1, -1), 0.0),
        (None, False, 0.125, "shift", True, False, None, False, "auto", (-1, -1), 0.0)]


def test_the_ops_resolve_auto_to_a_named_schedule():
    """Inside the op ``auto`` becomes a schedule (a portable one with ``portable=True``)."""
    q = meta(2, 4096, 16, 64)
    backend = resolve_backend(q, Options(False, 0.125, backend="triton"))
    assert backend.name == "triton"
    for causal in (False, True):
        def resolved(causal=causal, **kw):
            return resolve_schedule(backend, q, q, Options(causal, 0.125, **kw))

        assert resolved(portable=True) in PORTABLE
        assert resolved() in NAMES
        assert resolved(schedule="spt") == "spt"
        assert resolved(deterministic=False) == "atomic"


def test_a_resolution_is_what_the_separate_resolutions_give():
    """``resolution_for`` (looked up once per shapes, dtype and options) names the backend,
    schedule and problem that resolving them one by one names."""
    from dash_cuda.launch import problem_for
    from dash_cuda.ops import resolution_for

    q, k = meta(2, 1024, 8, 64), meta(2, 768, 2, 64)
    for kw in (dict(causal=False), dict(causal=True), dict(causal=True, portable=True),
               dict(causal=False, schedule="shift"), dict(causal=True, deterministic=False),
               dict(causal=False, window_size=(128, 0))):
        options = Options.checked(64, softmax_scale=0.125, backend="triton", **kw)
        backend = resolve_backend(q, options)
        resolved = resolution_for(q, k, options)
        assert resolved.backend is backend
        assert resolved.schedule == resolve_schedule(backend, q, k, options)
        assert resolved.problem == problem_for(backend, 2, 8, 2, 1024, 768, 64, options.mask)
        assert resolution_for(q, k, options) is resolved


def test_the_ops_take_the_options_fields_in_order():
    """The custom ops' arguments after the tensors are the fields of ``Options``, in order,
    so ``Options.flat()`` and ``Options(*args)`` carry a call through them unchanged."""
    import inspect

    from dash_cuda import ops

    forward = list(inspect.signature(ops.attention_forward_impl).parameters)
    backward = list(inspect.signature(ops.attention_backward_impl).parameters)
    assert forward[3] == backward[6] == "learnable_sink"  # the optional tensor, then options
    assert tuple(forward[4:]) == FIELDS and tuple(backward[7:]) == FIELDS
    options = Options(True, 0.3, "spt", True, True, 7, False, "triton")
    assert Options(*options.flat()) == options


@pytest.mark.parametrize("compiling", [False, True])
def test_eager_calls_skip_the_op_and_traced_calls_see_it(monkeypatch, compiling):
    """``attention_call`` runs the op's own functions behind an ``autograd.Function`` in eager
    mode (less host time) and the custom op while ``torch.compile`` traces, with the same
    arguments either way."""
    from dash_cuda import ops

    seen = []
    options = Options(True, 0.125, "auto", True, False, None, False, "auto", [-1, -1])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    monkeypatch.setattr(ops, "attention_op",
                        lambda *a: seen.append(("op", a)) or ("op", "lse"))
    monkeypatch.setattr(ops.EagerAttention, "apply",
                        lambda *a: seen.append(("eager", a)) or "eager")
    q, k, v = (meta(1, 8, 2, 64) for _ in range(3))
    expected = "op" if compiling else "eager"
    assert ops.attention_call(q, k, v, options) == expected
    carried = (None, *options.flat()) if compiling else (None, options, None)  # no plan known
    assert seen == [(expected, (q, k, v, *carried))]


@pytest.mark.parametrize("with_sink", [False, True])
def test_the_eager_function_hands_its_forward_lse_to_its_backward(monkeypatch, with_sink):
    """:class:`EagerAttention` returns ``O`` alone and gives its backward the very ``O`` and
    ``LSE2`` its forward made, with the incoming gradient; the gradients come back in the
    order of the inputs (``dsink`` for the sinks)."""
    from dash_cuda import ops

    b, s, h, d = 1, 8, 2, 16
    o_made = torch.randn(b, s, h, d)
    lse_made = torch.randn(b, h, s).transpose(1, 2)
    grads = [torch.randn(b, s, h, d) for _ in range(3)] + [torch.randn(h)]
    seen = {}

    def planned_forward(q, k, v, options, sink=None):
        return o_made.clone(), lse_made, None  # no plan: the backward takes backward_views

    def backward_views(q, k, v, o, lse, do, options, sink=None):
        seen.update(o=o, lse=lse, do=do, options=options, sink=sink)
        return (*grads[:3], grads[3] if sink is not None else None, None)

    monkeypatch.setattr(ops, "planned_forward", planned_forward)
    monkeypatch.setattr(ops, "backward_views", backward_views)
    q, k, v = (torch.randn(b, s, h, d, requires_grad=True) for _ in range(3))
    sink = torch.randn(h, requires_grad=True) if with_sink else None
    options = Options.checked(d, causal=True)
    o = ops.EagerAttention.apply(q, k, v, sink, options)
    assert isinstance(o, torch.Tensor) and torch.equal(o, o_made) and o.requires_grad
    do = torch.randn_like(o)
    leaves = (q, k, v, sink) if with_sink else (q, k, v)
    got = torch.autograd.grad(o, leaves, do)
    assert seen["lse"] is lse_made and torch.equal(seen["o"], o_made)
    assert torch.equal(seen["do"], do) and seen["options"] is options
    assert seen["sink"] is sink
    for g, want in zip(got, grads, strict=False):
        assert torch.equal(g, want)
