"""Learnable sinks on the CuTe backend: folded into the forward's rows, bit for bit.

- L2: the forward's ``O`` and ``LSE2`` with sinks are ``dash_ref``'s fast forward with
  them (step ``fwd_sink``), bit for bit, every mask kind, rectangular and packed, and the
  backward from them reproduces too (``verify.capture``: its steps do not change, LSE2
  carries the sinks), ``dsink`` included (the one sink kernel every backend runs);
- accuracy: ``O``, ``dQ``, ``dK``, ``dV`` and ``dsink`` within the float64 reference's
  bound, GQA, ``S_q != S_k`` (causal rows that see no key: ``O = 0``, ``LSE2`` the sink's);
- determinism (L0): 1000 runs with a busy stream give one bit pattern, ``dsink`` included;
- a sink of -1e4 gives the no-sink bits; a packed sequence's bits are its batch-1 call's;
- ``backend="auto"`` runs a sink call here.
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import busy_trials, inputs, passes

import dash_cuda
from dash_ref.arithmetic.steps import sink_logit
from verify.l2 import first_difference, forward_steps
from verify.reference import attention_f64, grad_checks

CUTE = dict(backend="cute")


@pytest.fixture(autouse=True)
def _cute_only():
    from dash_cuda.backends import get_backend

    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


def sinks(heads, dtype=torch.float32, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(1000 + heads + seed)
    base = torch.randn(heads, device="cuda", generator=gen) * 2
    base[0], base[-1] = 12.0, -12.0  # far above and far below the scores
    return base.to(dtype)


def run(q, k, v, do, sink, mask, **backward):
    """``(O, LSE2, gradients)``: the forward under ``mask``, the backward under ``mask`` with
    the ``backward`` keywords (schedule, workers, audit)."""
    return passes(q, k, v, do, mask, dict(learnable_sink=sink), **backward)


# (B, H, H_kv, S_q, S_k), d, dtype, mask keywords
CASES = [((2, 4, 2, 300, 520), 64, torch.bfloat16, dict(causal=True)),
         ((1, 4, 4, 333, 190), 128, torch.float16, dict(causal=True)),  # rows that see none
         ((1, 4, 1, 257, 400), 96, torch.bfloat16, dict()),
         ((1, 2, 2, 600, 600), 64, torch.float16, dict(window_size=(100, 30)))]


@pytest.mark.parametrize("shape, d, dtype, mask", CASES)
def test_the_forward_with_sinks_is_the_fast_emulation_bit_for_bit(shape, d, dtype, mask):
    from dash_cuda.backends.cute.config import forward_block_n

    q, k, v, _ = inputs(shape, d, dtype, seed=91)
    sink = sinks(shape[1])
    o, lse = dash_cuda.attention_forward(q, k, v, learnable_sink=sink, _poison=True, **CUTE,
                                         **mask)
    window = mask.get("window_size", (-1, -1))
    steps = forward_steps((q.cpu(), k.cpu(), v.cpu()), o.cpu(), lse.cpu(),
                          mask.get("causal", False), None, forward_block_n(d),
                          window_size=window, learnable_sink=sink)
    assert first_difference(steps) is None
    plain = dash_cuda.attention_forward(q, k, v, **CUTE, **mask)
    assert not torch.equal(plain[1], lse)  # the sinks changed LSE2


@pytest.mark.parametrize("shape, d, dtype, mask", CASES[:3])
def test_within_the_float64_bound(shape, d, dtype, mask):
    q, k, v, do = inputs(shape, d, dtype, seed=92)
    q = (q.float() * 3).to(dtype)
    sink = sinks(shape[1])
    o, lse, got = run(q, k, v, do, sink, mask)
    out = dict(zip(("o", "dq", "dk", "dv", "dsink"), (o, *got)))
    ref = attention_f64(q, k, v, do, learnable_sink=sink, **mask)
    for check in grad_checks(out, ref, dtype).values():
        assert check.ok, check
    uncapped = attention_f64(q, k, v, do, **mask)
    assert not grad_checks({"o": o}, uncapped, dtype)["o"].ok  # the sinks matter
    causal = mask.get("causal", False)
    s_q, s_k = q.shape[1], k.shape[1]
    if causal and s_q > s_k:
        unseen = slice(0, s_q - s_k)
        assert torch.equal(o[:, unseen], torch.zeros_like(o[:, unseen]))
        assert torch.equal(lse[:, unseen], sink_logit(sink).expand_as(lse[:, unseen]))


@pytest.mark.parametrize("schedule", ["shift", "descending"])
def test_the_backward_from_the_sinks_lse2_is_reproduced_by_the_cpu(schedule):
    """The backward's steps do not change with sinks (LSE2 carries them): every step of an
    audited run, D to the rounded gradients and ``dsink`` (the one sink kernel's lanes and
    pairwise tree), is the fast emulation's (L2); two batches of more rows than the sum's
    lanes, so lanes restart per batch and take several rows each."""
    from verify.l2 import record_steps

    q, k, v, do = inputs((2, 2, 2, 1100, 130), 64, torch.bfloat16, seed=93)
    sink = sinks(2)
    o, lse, got = run(q, k, v, do, sink, dict(causal=True), schedule=schedule,
                      num_workers=4, audit=True)
    dq, dk, dv, dsink, record = got
    assert record.arithmetic == "fast"
    steps = record_steps(record, (q, k, v, o, lse, do), (dq, dk, dv, dsink),
                         learnable_sink=sink)
    assert steps[-1][0] == "dsink" and first_difference(steps) is None


def test_one_bit_pattern_in_1000_runs_with_a_busy_stream():
    q, k, v, do = inputs((2, 4, 2, 384, 512), 64, torch.bfloat16, seed=94)
    sink = sinks(4, torch.bfloat16)

    def once():
        o, lse, got = run(q, k, v, do, sink, dict(causal=True))
        return (o, lse, *got)

    first = once()
    for again in busy_trials(once, 999):
        for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV", "dsink"), first, again):
            assert torch.equal(a, b), name
    assert first[-1].dtype == torch.bfloat16


def test_a_very_negative_sink_gives_the_no_sink_bits():
    q, k, v, do = inputs((1, 4, 2, 256, 300), 128, torch.float16, seed=95)
    base = run(q, k, v, do, None, {})
    sunk = run(q, k, v, do, torch.full((4,), -1e4, device="cuda"), {})
    for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV"), (*base[:2], *base[2]),
                          (*sunk[:2], *sunk[2][:3])):
        assert torch.equal(a, b), name
    assert torch.equal(sunk[2][3], torch.zeros(4, device="cuda"))


def test_a_packed_sequence_with_sinks_has_its_batch_1_bits():
    """Packing invariance is a portable schedule's (``auto`` may pick differently for the
    batch and for one sequence: ``lpt`` for this ragged batch): ``lpt`` packed, whose orders
    are ``descending``'s, against ``descending`` alone."""
    lengths = [130, 1, 0, 257, 64]
    gen = torch.Generator(device="cuda").manual_seed(96)
    total = sum(lengths)
    q, k, v, do = (torch.randn(total, 4, 64, device="cuda", generator=gen).to(torch.bfloat16)
                   for _ in range(4))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    sink = sinks(4)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    sink_leaf = sink.clone().requires_grad_()
    o = dash_cuda.attention_varlen(*leaves, cu, cu, max(lengths), max(lengths), causal=True,
                                   learnable_sink=sink_leaf, schedule="lpt", **CUTE)
    o.backward(do)
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        rows = slice(int(cu[b]), int(cu[b + 1]))
        one = [x[rows].unsqueeze(0).clone().requires_grad_() for x in (q, k, v)]
        o1 = dash_cuda.attention(*one, causal=True, learnable_sink=sink,
                                 schedule="descending", **CUTE)
        o1.backward(do[rows].unsqueeze(0))
        assert torch.equal(o[rows], o1[0]), b
        for name, packed, alone in zip(("dq", "dk", "dv"), leaves, one):
            assert torch.equal(packed.grad[rows], alone.grad[0]), (b, name)
    assert sink_leaf.grad is not None and torch.isfinite(sink_leaf.grad).all()


def test_auto_runs_a_sink_call_on_cute():
    from dash_cuda.ops import resolve_backend
    from dash_cuda.options import Options

    q, *_ = inputs((1, 2, 2, 64, 64), 64, torch.bfloat16, seed=97)
    assert resolve_backend(q, Options.checked(64), sink=True).name == "cute"


@pytest.mark.parametrize("heads_kv", [4, 2])  # GQA: the per-head sum before dsink
def test_a_sink_backward_takes_its_plan_with_the_general_paths_bits(heads_kv):
    """Repeated sink backwards run their signature's kept plan, as calls without sinks do
    (no per-call set-up); dQ, dK, dV and dsink are the general path's (forced by poisoning,
    which never takes a plan), bit for bit."""
    from dash_cuda import ops, plans
    from dash_cuda.options import Options

    options = Options.checked(128, backend="cute", causal=True)
    q, k, v, do = inputs((2, 4, heads_kv, 384, 512), 128, torch.bfloat16, seed=98)
    sink = sinks(4)
    o, lse = ops.forward_views(q, k, v, options, sink=sink)
    plans.clear()
    first = ops.backward_views(q, k, v, o, lse, do, options, sink=sink)[:4]
    assert [type(p) for p in plans._plans.values()] == [plans.BackwardPlan]
    general = ops.backward_views(q, k, v, o, lse, do, options, poison=True, sink=sink)[:4]
    assert general[3] is not None
    for trial in range(3):
        planned = ops.backward_views(q, k, v, o, lse, do, options, sink=sink)[:4]
        for name, ref, got, before in zip(("dQ", "dK", "dV", "dsink"), general, planned, first):
            assert torch.equal(got, ref), f"{name} of planned call {trial}"
            assert torch.equal(before, ref), f"{name} of the first call"
    plain = ops.backward_views(q, k, v, o, lse, do, options)
    assert plain[3] is None and torch.equal(plain[0], general[0])  # one plan for both


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.bfloat16])
def test_a_sink_forward_and_step_take_their_plans_with_the_general_paths_bits(sink_dtype):
    """Repeated sink forwards run their signature's kept plan (the sinks' base-2 logits
    passed as the general path passes them): O and LSE2 equal the general path's (forced by
    poisoning, which never takes a plan), bit for bit, for fresh sinks too; and an eager
    step (``EagerAttention``) then finds its backward's plan on the forward's, with the
    general path's dQ, dK, dV and dsink."""
    from dash_cuda import ops, plans
    from dash_cuda.options import Options

    options = Options.checked(128, backend="cute", causal=True)
    q, k, v, do = inputs((2, 4, 2, 384, 512), 128, torch.bfloat16, seed=99)
    plans.clear()
    for trial in range(3):
        sink = sinks(4, sink_dtype, seed=trial)
        want = ops.forward_views(q, k, v, options, poison=True, sink=sink)
        got = ops.forward_views(q, k, v, options, sink=sink)
        for name, a, b in zip(("O", "LSE2"), got, want):
            assert torch.equal(a, b), f"{name} of forward {trial}"
    (plan,) = plans._plans.values()
    assert isinstance(plan, plans.ForwardPlan) and plan.sinks
    o, lse = want
    general = ops.backward_views(q, k, v, o, lse, do, options, poison=True, sink=sink)[:4]
    for trial in range(3):
        leaves = [x.detach().requires_grad_() for x in (q, k, v, sink)]
        out = ops.EagerAttention.apply(*leaves[:3], leaves[3], options)
        grads = torch.autograd.grad(out, leaves, do)
        for name, ref, got in zip(("dQ", "dK", "dV", "dsink"), general, grads):
            assert torch.equal(got, ref), f"{name} of step {trial}"
    assert list(plan.backwards) == [plans.grad_key(do)]
