"""A call's plan gives the general path's bits (``tests/test_plans.py`` holds its launches
equal on the CPU; here the kernels run).

The first call of a signature runs the general path and keeps a plan; the next calls take
the plan. Each output of a planned forward and each gradient of a planned backward must
equal, bit for bit, that of the general path on the same inputs (forced by poisoning, which
never takes a plan), with outputs that the plan allocates afresh every call. S_q = 1024
causal forwards take their tiles from a counter the plan keeps per stream, which every
launch leaves at zero.
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import inputs, need

from dash_cuda import ops, plans
from dash_cuda.options import Options

CASES = [  # (B, H, H_kv, S_q, S_k), d, options
    ((2, 4, 4, 256, 256), 64, dict(causal=True)),
    ((1, 4, 2, 512, 384), 128, dict(causal=False)),  # GQA: the per-head sum
    ((2, 6, 1, 1024, 1024), 128, dict(causal=True)),  # MQA
    ((1, 2, 2, 2048, 2048), 64, dict(window_size=(300, 0))),
    ((1, 4, 4, 512, 512), 128, dict(causal=True, schedule="naive", num_workers=5)),
]


@pytest.mark.parametrize(("shape", "d", "kw"), CASES)
def test_planned_calls_give_the_general_paths_bits(shape, d, kw):
    need("cute", d)
    options = Options.checked(d, backend="cute", **kw)
    q, k, v, do = inputs(shape, d, torch.bfloat16, seed=51)
    plans.clear()
    o, lse = ops.forward_views(q, k, v, options)
    want = ops.forward_views(q, k, v, options, poison=True)
    for trial in range(3):
        got = ops.forward_views(q, k, v, options)
        for name, a, b in zip(("O", "LSE2"), got, want):
            assert torch.equal(a, b), f"{name} of planned forward {trial}"
            assert a.stride() == b.stride()
    assert torch.equal(o, want[0]) and torch.equal(lse, want[1])
    assert [type(p) for p in plans._plans.values()] == [plans.ForwardPlan]
    plans.clear()
    first = ops.backward_views(q, k, v, o, lse, do, options)[:3]
    assert [type(p) for p in plans._plans.values()] == [plans.BackwardPlan]
    general = ops.backward_views(q, k, v, o, lse, do, options, poison=True)[:3]
    for trial in range(3):
        planned = ops.backward_views(q, k, v, o, lse, do, options)[:3]
        for name, ref, got, before in zip(("dQ", "dK", "dV"), general, planned, first):
            assert torch.equal(got, ref), f"{name} of planned call {trial}"
            assert torch.equal(before, ref), f"{name} of the first call"
            assert got.data_ptr() != ref.data_ptr()


@pytest.mark.parametrize(("shape", "d", "kw"), CASES[:3])
def test_eager_steps_find_the_backwards_plan_from_the_forwards_and_keep_the_bits(shape, d,
                                                                                  kw):
    """Through :class:`dash_cuda.ops.EagerAttention` a forward that ran a plan finds its
    backward's plan by ``dO`` alone (``ForwardPlan.backwards``): every step's gradients
    equal the general path's, the first step's included (it runs and keeps the plans)."""
    need("cute", d)
    options = Options.checked(d, backend="cute", **kw)
    q, k, v, do = inputs(shape, d, torch.bfloat16, seed=52)
    o, lse = ops.forward_views(q, k, v, options, poison=True)
    general = ops.backward_views(q, k, v, o, lse, do, options, poison=True)[:3]
    plans.clear()
    for trial in range(3):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        out = ops.EagerAttention.apply(*leaves, None, options)
        assert torch.equal(out, o), f"O of step {trial}"
        grads = torch.autograd.grad(out, leaves, do)
        for name, ref, got in zip(("dQ", "dK", "dV"), general, grads):
            assert torch.equal(got, ref), f"{name} of step {trial}"
    (forward,) = [p for p in plans._plans.values() if isinstance(p, plans.ForwardPlan)]
    assert list(forward.backwards) == [plans.grad_key(do)]


def test_a_counters_plan_leaves_each_streams_counter_at_zero():
    """S_q = 1024 causal: a planned forward takes its tiles from the counter its plan keeps
    for the stream, never zeroed by the host again (the launch's last ticket stores 0
    back). Back-to-back planned forwards on two streams give the general path's bits, and
    each stream's counter reads 0 after them (one left at its last ticket would hand the
    next launch no tiles: O unwritten)."""
    need("cute", 128)
    options = Options.checked(128, backend="cute", causal=True)
    q, k, v, _ = inputs((2, 6, 1, 1024, 1024), 128, torch.bfloat16, seed=53)
    want = ops.forward_views(q, k, v, options, poison=True)
    plans.clear()
    ops.forward_views(q, k, v, options)  # the general path, which keeps the plan
    (plan,) = plans._plans.values()
    assert plan.counter
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(main)
    outs = []
    for stream in (main, side, main, side):
        with torch.cuda.stream(stream):
            outs += [ops.forward_views(q, k, v, options) for _ in range(3)]
    torch.cuda.synchronize()
    assert sorted(s for s, _ in plan.counters) == sorted({main.cuda_stream, side.cuda_stream})
    assert [c.item() for c in plan.counters.values()] == [0, 0]
    for trial, (o, lse) in enumerate(outs):
        assert torch.equal(o, want[0]) and torch.equal(lse, want[1]), f"forward {trial}"
