"""The custom ops behind ``dash_cuda.attention_varlen``: registration, fake outputs, autograd
wiring and tracing, on the CPU.

Meta and fake tensors take the ops' fake implementations, which must describe the real
outputs exactly (``O`` like ``q``, ``LSE2`` a ``(total_q, H)`` view of an ``(H, total_q)``
buffer); ``torch.compile(fullgraph=True)`` must trace a packed call into one op, with the
offsets, the ``max_seqlen`` values and the options as written (the lengths are read inside
the op, where tracing does not look). ``tests/gpu/test_cuda_varlen.py`` runs the kernels.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import dash_cuda
from dash_cuda import ops
from dash_cuda.ops import attention_varlen_backward_op, attention_varlen_op
from dash_cuda.options import FIELDS, Options, Packing
from dash_ref import Mask

TOTAL_Q, TOTAL_K, H, HK, D = 58, 48, 4, 2, 64


def meta(*shape, grad=False):
    return torch.randn(*shape, device="meta", dtype=torch.bfloat16, requires_grad=grad)


def offsets(device="meta"):
    return (torch.empty(5, dtype=torch.int32, device=device),
            torch.empty(5, dtype=torch.int32, device=device))


def test_both_ops_are_registered_with_offsets_then_options():
    fwd = str(torch.ops.dash.attention_varlen.default._schema)
    bwd = str(torch.ops.dash.attention_varlen_backward.default._schema)
    for arg in ("Tensor cu_seqlens_q", "Tensor cu_seqlens_k", "SymInt max_seqlen_q",
                "SymInt max_seqlen_k", "bool causal", "float softmax_scale", "str schedule",
                "bool deterministic", "bool portable", "SymInt? num_workers", "bool exact",
                "str backend", "SymInt[] window_size", "float softcap", "Tensor? learnable_sink"):
        assert arg in fwd and arg in bwd
    assert "-> (Tensor, Tensor)" in fwd
    assert "-> (Tensor, Tensor, Tensor, Tensor)" in bwd  # dQ, dK, dV, dsink


def test_the_ops_take_the_options_fields_in_order():
    forward = list(inspect.signature(ops.attention_varlen_forward_impl).parameters)
    backward = list(inspect.signature(ops.attention_varlen_backward_impl).parameters)
    assert forward[3:7] == ["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    assert backward[6:10] == forward[3:7]
    assert forward[7] == backward[10] == "learnable_sink"  # the optional tensor, then options
    assert tuple(forward[8:]) == FIELDS and tuple(backward[11:]) == FIELDS


def test_fake_outputs_have_the_real_layouts():
    """O like q (contiguous where q is a slice of a fused qkv projection, as the kernel's
    ``empty_like`` gives it), LSE2 a (total_q, H) view of an (H, total_q) buffer; gradients
    like their inputs."""
    k, v = meta(TOTAL_K, HK, D), meta(TOTAL_K, HK, D)
    sliced = meta(TOTAL_Q, 3, H, D)[:, 0]
    o, _ = attention_varlen_op(sliced, k, v, *offsets(), 37, 20, None, True, 0.125, "lpt",
                               True, True, None, False, "triton", [-1, -1], 0.0)
    assert o.shape == sliced.shape and o.is_contiguous()
    q = meta(TOTAL_Q, H, D)
    o, lse = attention_varlen_op(q, k, v, *offsets(), 37, 20, None, True, 0.125, "lpt", True,
                                 True, None, False, "triton", [-1, -1], 0.0)
    assert o.shape == q.shape and o.dtype == q.dtype and o.stride() == q.stride()
    assert lse.shape == (TOTAL_Q, H) and lse.dtype == torch.float32
    assert lse.stride() == (1, TOTAL_Q)
    dq, dk, dv, dsink = attention_varlen_backward_op(
        q, k, v, o, lse, meta(TOTAL_Q, H, D), *offsets(), 37, 20, None, True, 0.125, "naive",
        True, False, 3, True, "auto", [-1, -1], 0.0)
    assert dsink.shape == (0,)  # no sinks: an empty gradient, which autograd drops
    for grad, x in ((dq, q), (dk, k), (dv, v)):
        assert grad.shape == x.shape and grad.dtype == x.dtype and grad.stride() == x.stride()


def test_autograd_runs_the_backward_op_and_lse_has_no_gradient():
    q = meta(TOTAL_Q, H, D, grad=True)
    k, v = meta(TOTAL_K, HK, D, grad=True), meta(TOTAL_K, HK, D, grad=True)
    o, lse = attention_varlen_op(q, k, v, *offsets(), 37, 20, None, False, 0.125, "auto", True,
                                 True, None, False, "auto", [-1, -1], 0.0)
    assert o.requires_grad and not lse.requires_grad
    o.float().sum().backward()
    for x in (q, k, v):
        assert x.grad.shape == x.shape and x.grad.dtype == x.dtype


class PackedLayers(torch.nn.Module):
    """Two packed attention calls with a matmul between them, as a varlen transformer stacks
    them (the offsets and lengths are the batch's, passed along)."""

    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("mix", torch.randn(d, d, device="cuda", dtype=torch.bfloat16))

    def forward(self, q, k, v, cu_q, cu_k, max_q: int, max_k: int):
        x = dash_cuda.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True,
                                       portable=True)
        return dash_cuda.flash_attn_varlen_func((x @ self.mix).contiguous(), k, v, cu_q, cu_k,
                                                max_q, max_k, 0.0, 0.5, schedule="lpt")


def test_a_packed_model_traces_into_one_graph_of_two_ops_with_the_options_as_written():
    """``fullgraph=True`` fails on any graph break: reading the offsets' values (which the
    eager path does at the entry) must not happen while tracing."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with FakeTensorMode(allow_non_fake_inputs=True):  # CUDA tensors without a GPU
        q = torch.randn(TOTAL_Q, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(TOTAL_K, HK, D, device="cuda", dtype=torch.bfloat16)
        cu_q, cu_k = offsets("cuda")
        out = torch.compile(PackedLayers(D), fullgraph=True, backend=record)(
            q, k, k, cu_q, cu_k, 37, 20)
    assert out.shape == q.shape
    (graph,) = graphs
    calls = [n.args for n in graph.graph.nodes
             if n.target is torch.ops.dash.attention_varlen.default]
    assert [c[5:] for c in calls] == [
        (37, 20, None, True, 0.125, "auto", True, True, None, False, "auto", (-1, -1), 0.0),
        (37, 20, None, False, 0.5, "lpt", True, False, None, False, "auto", (-1, -1), 0.0)]


@pytest.mark.parametrize("compiling", [False, True])
def test_eager_calls_skip_the_op_and_traced_calls_see_it(monkeypatch, compiling):
    """``varlen_call`` runs the op's functions behind an ``autograd.Function`` with the
    lengths read at the entry when eager, and the custom op (which reads them itself) while
    ``torch.compile`` traces."""
    seen = []
    options = Options(True, 0.125, "lpt", True, True, None, False, "auto", [-1, -1])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    monkeypatch.setattr(ops, "attention_varlen_op",
                        lambda *a: seen.append(("op", a)) or ("op", "lse"))
    monkeypatch.setattr(ops.EagerAttentionVarlen, "apply",
                        lambda *a: seen.append(("eager", a)) or "eager")
    q, k = meta(TOTAL_Q, H, D), meta(TOTAL_K, HK, D)
    cu_q, cu_k = offsets()
    packing = None if compiling else Packing(cu_q, cu_k, 37, 20, (5, 0, 37, 16),
                                             (9, 3, 20, 16))
    got = ops.varlen_call(q, k, k, cu_q, cu_k, 37, 20, options, packing)
    expected = "op" if compiling else "eager"
    assert got == expected
    carried = ((cu_q, cu_k, 37, 20, None, *options.flat()) if compiling
               else (None, packing, options))
    assert seen == [(expected, (q, k, k, *carried))]


def test_the_offsets_are_read_once_and_checked():
    """``Packing.read``: one host copy of both offsets (one of a tensor given twice), the
    lengths from them, and a one-line error naming a bad value."""
    cu_q = torch.tensor([0, 5, 5, 42, 58], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 32, 48], dtype=torch.int32)
    p = Packing.read(cu_q, cu_k, 40, 20, 58, 48)
    assert (p.seqlens_q, p.seqlens_k, p.batch) == ((5, 0, 37, 16), (9, 3, 20, 16), 4)
    assert p.cu_seqlens_q is cu_q and p.max_seqlen_q == 40
    same = Packing.read(cu_q, cu_q, 37, 37, 58, 58)
    assert same.seqlens_k == same.seqlens_q
    with pytest.raises(ValueError, match="max_seqlen_q=36 is smaller than sequence 2"):
        Packing.read(cu_q, cu_k, 36, 20, 58, 48)


def copies(monkeypatch) -> list[int]:
    """Record every device-to-host read of ``host_offsets`` (``Tensor.tolist``): the
    number of values of each."""
    seen: list[int] = []
    tolist = torch.Tensor.tolist

    def counted(self):
        seen.append(self.numel())
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    return seen


def test_an_offsets_tensor_is_read_once_until_it_changes(monkeypatch):
    """The layers of a model share one ``cu_seqlens`` tensor: the first call reads it, the
    others read nothing; an in-place change (PyTorch's version counter) is read again, and
    a new tensor is always read, however equal its values."""
    from dash_cuda.options import host_offsets

    seen = copies(monkeypatch)
    cu_q = torch.tensor([0, 5, 5, 42, 58], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 32, 48], dtype=torch.int32)
    assert host_offsets(cu_q, cu_k) == [[0, 5, 5, 42, 58], [0, 9, 12, 32, 48]]
    assert seen == [10]  # both in one copy
    for _ in range(3):
        assert Packing.read(cu_q, cu_k, 40, 20, 58, 48).seqlens_q == (5, 0, 37, 16)
    assert seen == [10]
    cu_q[1:3] = 6  # in place
    assert Packing.read(cu_q, cu_k, 40, 20, 58, 48).seqlens_q == (6, 0, 36, 16)
    assert seen == [10, 5]  # that tensor alone
    fresh = cu_k.clone()
    assert host_offsets(cu_q, fresh)[1] == [0, 9, 12, 32, 48]
    assert seen == [10, 5, 5]


def test_tensors_without_a_version_are_read_every_time(monkeypatch):
    """An inference-mode tensor has no version counter, so nothing says it is unchanged."""
    from dash_cuda.options import host_offsets

    seen = copies(monkeypatch)
    with torch.inference_mode():
        cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    for _ in range(2):
        assert host_offsets(cu, cu) == [[0, 3, 7], [0, 3, 7]]
    assert seen == [3, 3]


def test_a_freed_offsets_tensor_is_forgotten():
    """What was read of a tensor goes with it (a later tensor may reuse its address)."""
    import gc

    from dash_cuda import options

    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    options.host_offsets(cu)
    key = id(cu)
    assert key in options._host
    del cu
    gc.collect()
    assert key not in options._host


def test_the_packed_schedule_is_resolved_on_the_packed_problem():
    """``auto`` resolves on the packed problem (by its longest sequence), ``portable=True``
    keeps to the portable names, and the problem carries the backend's tiles."""
    from dash_cuda.backends import get_backend
    from dash_cuda.launch import packed_problem_for
    from dash_ref import PORTABLE, RAGGED

    backend = get_backend("triton")
    cu = torch.tensor([0, 5, 5, 42, 58], dtype=torch.int32)
    packing = Packing.read(cu, cu, 37, 37, 58, 58)
    q = meta(TOTAL_Q, H, D)
    for causal in (False, True):
        def resolved(causal=causal, **kw):
            return ops.resolve_packed_schedule(backend, q, q, packing,
                                               Options(causal, 0.125, **kw))

        assert resolved(portable=True) in (*PORTABLE, *RAGGED)
        assert resolved(schedule="lpt") == "lpt"
        assert resolved(deterministic=False) == "atomic"
    p = packed_problem_for(backend, packing.seqlens_q, packing.seqlens_k, H, H, D,
                           Mask("causal"))
    assert p.is_packed and (p.block_m, p.block_n) == backend.backward_tiles(D, "causal")
    assert p.seqlens_q == (5, 0, 37, 16) and p.mask == "causal"


def test_the_eager_function_hands_its_forward_lse_and_packing_to_its_backward(monkeypatch):
    """:class:`EagerAttentionVarlen` returns ``O`` alone and gives its backward the ``O``,
    ``LSE2`` and :class:`Packing` of its forward, with the incoming gradient; the gradients
    come back in the order of the inputs."""
    total, heads, d = 12, 2, 16
    o_made, lse_made = torch.randn(total, heads, d), torch.randn(heads, total).t()
    grads = [torch.randn(total, heads, d) for _ in range(3)]
    packing = Packing(*offsets(), 37, 20, (5, 0, 37, 16), (9, 3, 20, 16))
    seen = {}

    def forward_views(q, k, v, options, packing=None, sink=None):
        seen["forward_packing"] = packing
        return o_made.clone(), lse_made

    def backward_views(q, k, v, o, lse, do, options, packing=None, sink=None):
        seen.update(o=o, lse=lse, do=do, packing=packing)
        return (*grads, None, None)

    monkeypatch.setattr(ops, "forward_views", forward_views)
    monkeypatch.setattr(ops, "backward_views", backward_views)
    q, k, v = (torch.randn(total, heads, d, requires_grad=True) for _ in range(3))
    o = ops.EagerAttentionVarlen.apply(q, k, v, None, packing, Options.checked(d))
    assert isinstance(o, torch.Tensor) and torch.equal(o, o_made)
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), do)
    assert seen["lse"] is lse_made and torch.equal(seen["o"], o_made)
    assert torch.equal(seen["do"], do)
    assert seen["packing"] is packing and seen["forward_packing"] is packing
    for g, want in zip(got, grads, strict=True):
        assert torch.equal(g, want)
