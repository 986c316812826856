"""A call's plan makes the general path's launches: same kernels, same arguments.

:mod:`dash_cuda.plans` keeps a plan from the first call of a signature, which replaces
the general path on later calls. Here (CPU, kernels recorded instead of run) the launches
of the first call (general path) and of the next ones (the plan) must be equal in every
argument, with each pointer or tensor named by the buffer it points into: the call's
inputs and outputs by name, scratch by order of first use and byte offset. Then the bits
on a GPU are the general path's (``tests/gpu/test_cuda_plans.py`` checks them).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cutlass")
pytest.importorskip("triton")

import dash_cuda  # noqa: E402
import dash_cuda.backends as backends  # noqa: E402
from dash_cuda import api, calls, launch, ops, plans, prepost, triton_launch  # noqa: E402
from dash_cuda.backends.cute import CuteBackend  # noqa: E402
from dash_cuda.backends.cute import finish_dq as cute_finish_dq  # noqa: E402
from dash_cuda.backends.cute import launch as cute_launch  # noqa: E402
from dash_cuda.options import Options  # noqa: E402


class H200:
    multi_processor_count = 132


class Recorder:
    """Every launch of a call; :meth:`named` gives them with each pointer or tensor named
    by the buffer it falls in."""

    def __init__(self):
        self.launches: list = []

    def triton(self, kernel, grid, args, named, **options):
        self.launches.append((getattr(kernel, "__name__", kernel), tuple(grid), tuple(args),
                              tuple(sorted(named.items())), tuple(sorted(options.items()))))

    def cute(self, variant):
        def kernel(*args):
            self.launches.append((variant.name, tuple(args)))
        return kernel

    def named(self, tensors: dict[str, torch.Tensor]) -> list:
        """The launches with the buffers of ``tensors`` named, the other tensors' buffers
        (scratch) numbered by first use, and pointers into any of them as ``name+offset``
        (pointers into nothing known, such as the schedule's tables, numbered likewise)."""
        buffers = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), name)
                   for name, t in tensors.items()]
        others: dict[int, str] = {}

        def where(address: int) -> str:
            for start, size, name in buffers:
                if start <= address < start + max(size, 1):
                    return f"{name}+{address - start}"
            return others.setdefault(address, f"other{len(others)}")

        def value(x):
            if isinstance(x, torch.Tensor):
                if where(x.data_ptr()).startswith("other"):
                    others.pop(x.data_ptr())
                    storage = x.untyped_storage()
                    buffers.append((storage.data_ptr(), storage.nbytes(),
                                    f"scratch{len(buffers)}"))
                return ("tensor", x.dtype, where(x.data_ptr()))
            if isinstance(x, int) and not isinstance(x, bool) and x > 1 << 32:  # a pointer
                return where(x)
            if isinstance(x, tuple):
                return tuple(map(value, x))
            return x

        return [value(x) for x in self.launches]


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(backends, "device_properties", lambda d: H200)
    for module in (launch, cute_launch):
        monkeypatch.setattr(module, "device_properties", lambda d: H200)
    monkeypatch.setattr(launch, "sm_count", lambda device: 132)
    monkeypatch.setattr(launch, "max_workers", lambda backend, lau: 264)
    monkeypatch.setattr(plans, "raw_stream", lambda index: 7)
    monkeypatch.setattr(cute_launch, "_stream", lambda t: 7)
    monkeypatch.setattr(cute_launch, "get_kernel", rec.cute)
    monkeypatch.setattr(CuteBackend, "missing", lambda self: None)
    for module in (prepost, cute_finish_dq):
        monkeypatch.setattr(module, "launch", rec.triton)
    monkeypatch.setattr(triton_launch.Bound, "__call__", lambda self, *tensors: rec.triton(
        self.kernel, self.grid, _filled(self, tensors), self.named, **self.options))
    plans.clear()
    cute_launch._forward_plan.cache_clear()  # its kernels record into one test's recorder
    yield rec
    plans.clear()
    cute_launch._forward_plan.cache_clear()


def _filled(bound, tensors) -> tuple:
    args = list(bound.args)
    for slot, t in zip(bound.slots, tensors, strict=True):
        args[slot] = t
    return tuple(args)


def _backward(rec, q, k, v, o, lse, do, options):
    rec.launches.clear()
    dq, dk, dv, _, _ = ops.backward_views(q, k, v, o, lse, do, options)
    return rec.named(dict(q=q, k=k, v=v, o=o, lse=lse, do=do, dq=dq, dk=dk, dv=dv))


def _inputs(shape_q, heads_kv, seqlen_k, options, head_dim_v=None):
    b, s, h, d = shape_q
    dv = head_dim_v or d
    q = torch.randn(b, s, h, d).bfloat16()
    k = torch.randn(b, seqlen_k, heads_kv, d).bfloat16()
    v = torch.randn(b, seqlen_k, heads_kv, dv).bfloat16()
    o = torch.randn(b, s, h, dv).bfloat16()
    lse = backends.new_row_stats(b, s, h, q.device)
    lse.copy_(torch.randn(b, s, h))
    do = torch.randn_like(o)
    return q, k, v, o, lse, do


CASES = [  # (B, S_q, H, d), H_kv, S_k, options
    ((2, 256, 4, 64), 4, 256, dict(causal=True)),
    ((1, 384, 2, 128), 2, 200, dict(causal=False)),
    ((1, 256, 4, 128), 2, 256, dict(causal=True)),  # GQA: the per-head sum
    ((2, 128, 2, 64), 2, 128, dict(causal=True, deterministic=False)),  # the atomic peer
    ((1, 512, 2, 128), 2, 512, dict(window_size=(100, 0))),
    ((1, 256, 2, 64), 2, 256, dict(causal=True, schedule="naive", num_workers=7)),
]


@pytest.mark.parametrize(("shape_q", "heads_kv", "seqlen_k", "kw"), CASES)
def test_the_plan_launches_what_the_general_path_launches(recorder, shape_q, heads_kv,
                                                          seqlen_k, kw):
    options = Options.checked(shape_q[3], backend="cute", **kw)
    tensors = _inputs(shape_q, heads_kv, seqlen_k, options)
    general = _backward(recorder, *tensors, options)
    assert len(plans._plans) == 1 and None not in plans._plans.values()
    planned = _backward(recorder, *tensors, options)
    assert planned == general
    again = _backward(recorder, *_inputs(shape_q, heads_kv, seqlen_k, options), options)
    assert again == general  # fresh tensors of the same signature: the same plan
    assert len(plans._plans) == 1
    names = [x[0] for x in general]
    assert names[0] == "dash_delta_kernel" and names[-1] in ("dash_dq_tiles_kernel",
                                                              "dash_gqa_kernel")
    assert any(str(n).startswith("dash_bwd") for n in names)


def test_the_plan_is_taken_instead_of_the_general_path(recorder, monkeypatch):
    options = Options.checked(64, backend="cute", causal=True)
    tensors = _inputs((1, 256, 2, 64), 2, 256, options)
    _backward(recorder, *tensors, options)
    monkeypatch.setattr(launch, "_run_backward", lambda *a, **k: pytest.fail("general path"))
    _backward(recorder, *tensors, options)


@pytest.mark.parametrize("change", ["padded rows", "dO strided", "audit", "lse layout"])
def test_calls_a_plan_cannot_hold_take_the_general_path(recorder, change):
    """Rows that are no multiple of the query tile (LSE2 and D are copied, padded), a dO
    that is copied contiguous, an audit, an LSE2 the kernel cannot read in place: no plan,
    and each call runs the general path's launches again."""
    seqlen = 200 if change == "padded rows" else 256
    options = Options.checked(64, backend="cute", causal=True)
    q, k, v, o, lse, do = _inputs((1, seqlen, 2, 64), 2, seqlen, options)
    if change == "dO strided":
        do = torch.randn(1, seqlen, 2, 128).bfloat16()[..., ::2]
    if change == "lse layout":
        lse = lse.contiguous()
    if change == "audit":
        ops.backward_views(q, k, v, o, lse, do, options, audit=True)
        assert not plans._plans
        return
    first = _backward(recorder, q, k, v, o, lse, do, options)
    assert list(plans._plans.values()) == [None]
    assert _backward(recorder, q, k, v, o, lse, do, options) == first


def test_the_triton_backend_has_no_plan(recorder):
    options = Options.checked(64, backend="triton", causal=True)
    q, k, v, o, lse, do = _inputs((1, 128, 2, 64), 2, 128, options)
    backend = ops.resolution_for(q, k, options).backend
    assert getattr(backend, "bind_schedule", None) is None


def _forward(rec, q, k, v, options, sink=None):
    rec.launches.clear()
    o, lse = ops.forward_views(q, k, v, options, sink=sink)
    want = backends.new_output(q, v)  # as the general path allocates O
    assert (o.shape, o.stride(), o.dtype) == (want.shape, want.stride(), want.dtype)
    assert lse.shape == (q.shape[0], q.shape[1], q.shape[2])
    assert lse.stride() == (q.shape[1] * q.shape[2], 1, q.shape[1])  # as every forward
    return rec.named(dict(q=q, k=k, v=v, o=o, lse=lse))


@pytest.mark.parametrize(("shape_q", "heads_kv", "seqlen_k", "kw"), [
    *CASES, ((1, 1024, 2, 64), 2, 1024, dict(causal=True))])  # tiles from a counter
def test_the_forward_plan_launches_what_the_general_forward_launches(recorder, shape_q,
                                                                     heads_kv, seqlen_k, kw):
    options = Options.checked(shape_q[3], backend="cute", **kw)
    q, k, v, _, _, _ = _inputs(shape_q, heads_kv, seqlen_k, options)
    general = _forward(recorder, q, k, v, options)
    assert [p is not None for p in plans._plans.values()] == [True]
    assert _forward(recorder, q, k, v, options) == general
    q2, k2, v2, _, _, _ = _inputs(shape_q, heads_kv, seqlen_k, options)
    assert _forward(recorder, q2, k2, v2, options) == general
    assert len(general) == 1 and str(general[0][0]).startswith("dash_fwd")


@pytest.mark.parametrize(("shape_q", "head_dim_v"), [((1, 256, 4, 192), 128),
                                                      ((1, 128, 2, 256), None)])
def test_plans_at_the_wide_head_dims_launch_what_the_general_path_does(recorder, shape_q,
                                                                       head_dim_v):
    """At 192 / 128 the planned forward's ``O`` has the values' head dim, as the general
    path's (the kernel was bound to that buffer's strides), and the planned backward
    launches what the general one does, at 256 too."""
    options = Options.checked(shape_q[3], backend="cute", causal=True)
    q, k, v, o, lse, do = _inputs(shape_q, 2, shape_q[1], options, head_dim_v)
    general = _forward(recorder, q, k, v, options)
    assert _forward(recorder, q, k, v, options) == general  # the plan
    first = _backward(recorder, q, k, v, o, lse, do, options)
    assert len(plans._plans) == 2 and None not in plans._plans.values()  # both planned
    assert _backward(recorder, q, k, v, o, lse, do, options) == first


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.bfloat16])
def test_a_forward_with_sinks_has_a_plan_that_launches_what_the_general_path_does(
        recorder, sink_dtype):
    """The sinks' base-2 logits (``sink_logit``, a fresh buffer each call) reach the planned
    launch last, as the general path passes them; the same call without sinks has a plan
    of its own."""
    options = Options.checked(64, backend="cute", causal=True)
    q, k, v, _, _, _ = _inputs((1, 256, 2, 64), 2, 256, options)
    sink = torch.randn(2).to(sink_dtype)
    general = _forward(recorder, q, k, v, options, sink)
    (plan,) = plans._plans.values()
    assert isinstance(plan, plans.ForwardPlan) and plan.sinks
    assert _forward(recorder, q, k, v, options, sink) == general
    assert _forward(recorder, q, k, v, options, torch.randn(2).to(sink_dtype)) == general
    assert "sink" in general[0][0]
    _forward(recorder, q, k, v, options)
    assert sorted(p.sinks for p in plans._plans.values()) == [False, True]


def test_a_forward_that_scales_q_first_has_no_plan(recorder):
    options = Options.checked(64, backend="cute", softmax_scale=-0.5)
    q, k, v, _, _, _ = _inputs((1, 128, 2, 64), 2, 128, options)
    first = _forward(recorder, q, k, v, options)
    assert list(plans._plans.values()) == [None]
    assert _forward(recorder, q, k, v, options) == first


def _step(rec, q, k, v, do, options):
    """One eager forward and ``grad`` (``ops.EagerAttention``): its launches, named."""
    rec.launches.clear()
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    o = ops.EagerAttention.apply(*x, None, options)
    dq, dk, dv = torch.autograd.grad(o, x, do)
    return rec.named(dict(q=q, k=k, v=v, do=do, o=o, dq=dq, dk=dk, dv=dv))


@pytest.mark.parametrize(("shape_q", "heads_kv", "seqlen_k", "kw"), CASES[:3])
def test_a_planned_forward_finds_its_backwards_plan_by_do_alone(recorder, monkeypatch,
                                                                 shape_q, heads_kv, seqlen_k,
                                                                 kw):
    """After the first step, the backward's plan comes from the forward's plan by ``dO``'s
    metadata, without the signature of six tensors, and launches what the general path
    launched; a ``dO`` of other strides gets a plan of its own, the general path's too."""
    options = Options.checked(shape_q[3], backend="cute", **kw)
    q, k, v, _, _, do = _inputs(shape_q, heads_kv, seqlen_k, options)
    general = _step(recorder, q, k, v, do, options)
    (forward,) = [p for p in plans._plans.values() if isinstance(p, plans.ForwardPlan)]
    assert list(forward.backwards) == [plans.grad_key(do)]
    real = plans.signature
    monkeypatch.setattr(plans, "signature", lambda kind, *a: pytest.fail("a signature")
                        if kind == "backward" else real(kind, *a))
    assert _step(recorder, q, k, v, do, options) == general
    monkeypatch.setattr(plans, "signature", real)
    b, s, h, d = shape_q
    strided = torch.randn(b, h, s, d).bfloat16().transpose(1, 2)  # (B, S, H, d), other strides
    planned = _step(recorder, q, k, v, strided, options)
    assert len(forward.backwards) == 2
    assert _step(recorder, q, k, v, strided, options) == planned  # kept for that dO
    plans.clear()  # and from scratch, the general path for it launches the same
    assert _step(recorder, q, k, v, strided, options) == planned


def test_calls_inside_suspended_take_the_general_path_and_keep_nothing(recorder, monkeypatch):
    options = Options.checked(64, backend="cute", causal=True)
    tensors = _inputs((1, 256, 2, 64), 2, 256, options)
    general = _backward(recorder, *tensors, options)  # keeps a plan
    runs = []
    real = launch._run_backward
    monkeypatch.setattr(launch, "_run_backward",
                        lambda *a, **k: runs.append(a[-1]) or real(*a, **k))
    with plans.suspended():
        assert _backward(recorder, *tensors, options) == general
    assert runs == [None]  # the general path, with no plan to keep
    _backward(recorder, *tensors, options)
    assert runs == [None]  # and the plan again after the block


def test_the_probe_variant_suspends_plans():
    from unittest import mock

    stamps = mock.Mock(dtype=torch.int32, is_cuda=True, is_contiguous=lambda: True)
    call = ("backward", Options.checked(64), torch.ones(2))
    plans.keep(plans.signature(*call), "a plan")
    try:
        with cute_launch.probing(stamps):
            assert plans.lookup(*call) == (None, None)
        assert plans.lookup(*call) == ("a plan", None)
    finally:
        plans.clear()


# -- public calls seen before (dash_cuda.calls) -----------------------------------------------
@pytest.fixture
def public(recorder, monkeypatch):
    """The recorder behind :func:`dash_cuda.attention`, whose CPU tensors stand in for CUDA
    ones (the device check passes them), with no call kept from another test."""
    monkeypatch.setattr(api, "check_devices", lambda named: None)
    calls.clear()
    yield recorder
    calls.clear()


def _public_step(rec, q, k, v, do, **kw):
    """One :func:`dash_cuda.attention` forward and ``grad``: its launches, named."""
    rec.launches.clear()
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    o = dash_cuda.attention(*x, backend="cute", **kw)
    dq, dk, dv = torch.autograd.grad(o, x, do)
    return rec.named(dict(q=q, k=k, v=v, do=do, o=o, dq=dq, dk=dk, dv=dv))


def _count(monkeypatch, module, name) -> list:
    """Calls of ``module.name`` from here on, recorded (the function still runs)."""
    seen, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: seen.append(name) or real(*a, **k))
    return seen


@pytest.mark.parametrize(("shape_q", "heads_kv", "seqlen_k", "kw"), [
    ((1, 1024, 2, 64), 2, 1024, dict(causal=True)),  # tiles from a counter
    ((1, 256, 4, 128), 2, 256, dict(causal=True)),  # GQA
    ((1, 384, 2, 128), 2, 200, dict(window_size=[100, 0])),  # a list: a key of its own
])
def test_a_public_call_like_an_earlier_one_skips_every_check_and_launches_the_same(
        public, monkeypatch, shape_q, heads_kv, seqlen_k, kw):
    """The first call checks and runs the general path; later calls with arguments of the
    same structure take its checked options and plan back (no check, no options, no
    signature) and launch what it launched, on fresh tensors too."""
    q, k, v, _, _, do = _inputs(shape_q, heads_kv, seqlen_k, None)
    general = _public_step(public, q, k, v, do, **kw)
    for step in ("check_tensors", "_checked"):
        monkeypatch.setattr(api, step, lambda *a, step=step, **k: pytest.fail(step))
    monkeypatch.setattr(plans, "signature", lambda *a: pytest.fail("a signature"))
    monkeypatch.setattr(Options, "checked", lambda *a, **k: pytest.fail("options"))
    forwards = _count(monkeypatch, ops, "run_forward")
    assert _public_step(public, q, k, v, do, **kw) == general
    fresh = _inputs(shape_q, heads_kv, seqlen_k, None)
    assert _public_step(public, *fresh[:3], fresh[5], **kw) == general
    assert forwards == []  # every later forward ran the plan


def test_arguments_of_another_structure_are_checked_again(public):
    """What the checks refuse stays refused after a call of the same shapes was kept: the
    key holds every tensor's dtype and each argument's type."""
    q, k, v, _, _, do = _inputs((1, 256, 2, 64), 2, 256, None)
    _public_step(public, q, k, v, do, causal=True)
    with pytest.raises(TypeError, match="k has dtype"):
        dash_cuda.attention(q, k.half(), v, causal=True, backend="cute")
    with pytest.raises(TypeError, match="causal must be a bool"):
        dash_cuda.attention(q, k, v, causal=1, backend="cute")
    with pytest.raises(ValueError, match="layout"):
        dash_cuda.attention(q, k, v, causal=True, backend="cute", layout="sbhd")


def test_a_kept_call_drops_its_plan_with_the_plans(public, monkeypatch):
    """After :func:`dash_cuda.plans.clear` (kernels swapped, say) the next call runs the
    general path again and keeps a fresh plan; inside :func:`dash_cuda.plans.suspended`
    every call runs the general path and keeps nothing."""
    q, k, v, _, _, do = _inputs((1, 256, 2, 64), 2, 256, None)
    general = _public_step(public, q, k, v, do, causal=True)
    forwards = _count(monkeypatch, ops, "run_forward")
    plans.clear()
    assert _public_step(public, q, k, v, do, causal=True) == general
    assert forwards == ["run_forward"]
    with plans.suspended():
        _public_step(public, q, k, v, do, causal=True)
        _public_step(public, q, k, v, do, causal=False)
    assert forwards == ["run_forward"] * 3
    assert _public_step(public, q, k, v, do, causal=True) == general
    assert forwards == ["run_forward"] * 3  # the plan kept before the block, again
    _public_step(public, q, k, v, do, causal=False)
    assert forwards == ["run_forward"] * 4  # the call in the block kept nothing
