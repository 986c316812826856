"""L1: the kernel adds dQ partials in the schedule's order, bit for bit.

With ``audit=True`` the kernel hands back every fp32 partial ``dQ_ij`` and its fp32 dQ
accumulator; :func:`dash_ref.emulate.replay` adds the same partials on the CPU in the
schedule's dQ order. They must agree exactly, and so must the rounded dQ and the GQA sums
of dK and dV.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cases import inputs, need

import dash_cuda
from dash_ref import DETERMINISTIC
from dash_ref.arithmetic.steps import gqa_sum
from dash_ref.emulate import epilogue, replay

AUDIT_SHAPES = [  # (B, H, H_kv, S_q, S_k), d, dtype
    ((1, 2, 1, 300, 200), 64, torch.bfloat16),
    ((2, 2, 2, 512, 640), 128, torch.bfloat16),
    ((1, 3, 3, 129, 385), 64, torch.float16),
    ((1, 4, 2, 700, 700), 128, torch.float16),
    ((1, 2, 1, 333, 260), 96, torch.bfloat16),
]


def audited(backend, shape, d, dtype, causal, schedule, num_workers, seed):
    need(backend, d, dtype)
    q, k, v, do = inputs(shape, d, dtype, seed)
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend=backend)
    return dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, schedule=schedule,
                                        num_workers=num_workers, audit=True,
                                        backend=backend), (q, k, v, o, lse, do)


@pytest.mark.parametrize("schedule", DETERMINISTIC)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dtype", AUDIT_SHAPES)
@pytest.mark.parametrize("num_workers", [None, 5])
def test_dq_accumulator_equals_replay(backend, schedule, causal, shape, d, dtype, num_workers):
    (dq, dk, dv, record), args = audited(backend, shape, d, dtype, causal, schedule,
                                         num_workers, seed=31)
    assert record.backend == backend
    sched = record.schedule
    assert sched.name == schedule
    assert record.partials.shape == (len(sched.to_tables().visit_q), sched.problem.block_m, d)
    scale = 1.0 / math.sqrt(d)
    acc = replay(sched, record.partials.cpu(), flush_subnormals=record.flush_subnormals)
    assert torch.equal(record.dq_acc.cpu(), acc)
    assert torch.equal(dq.cpu(), epilogue(acc, scale, dtype))
    # dK / dV: per-query-head accumulators summed in ascending head order
    p = sched.problem
    assert torch.equal(dk.cpu(), epilogue(gqa_sum(record.dk_heads.cpu(), p.group), scale, dtype))
    assert torch.equal(dv.cpu(), epilogue(gqa_sum(record.dv_heads.cpu(), p.group), None, dtype))
    # audit mode computes the same bits as the normal path
    q, k, v, o, lse, do = args
    plain = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                         schedule=schedule, num_workers=num_workers,
                                         backend=backend)
    for a, b in zip(plain, (dq, dk, dv)):
        assert torch.equal(a, b)


def test_replay_detects_a_different_order(backend):
    # guard against a vacuous pass: the same partials in naive and in reverse order differ
    (dq, _, _, record), _ = audited(backend, (1, 2, 2, 256, 4096), 64, torch.bfloat16, False,
                                    "naive", None, seed=32)
    p = record.schedule.problem
    reverse = type(record.schedule)(
        problem=p, name="naive", num_workers=record.schedule.num_workers,
        workers=record.schedule.workers,
        dq_orders={key: order[::-1] for key, order in record.schedule.dq_orders.items()})
    flush = record.flush_subnormals
    assert torch.equal(replay(record.schedule, record.partials.cpu(), flush_subnormals=flush),
                       record.dq_acc.cpu())
    assert not torch.equal(replay(reverse, record.partials.cpu(), flush_subnormals=flush),
                           record.dq_acc.cpu())


def test_atomic_audit_rounds_its_accumulator(backend):
    q, k, v, do = inputs((1, 2, 1, 300, 200), 64, torch.bfloat16, seed=33)
    o, lse = dash_cuda.attention_forward(q, k, v, backend=backend)
    dq, _, _, record = dash_cuda.attention_backward(q, k, v, o, lse, do, deterministic=False,
                                                    audit=True, backend=backend)
    assert torch.equal(dq.cpu(), epilogue(record.dq_acc.cpu(), 1.0 / math.sqrt(64), torch.bfloat16))


@pytest.mark.parametrize("schedule", ["naive", "shift", "symmetric_shift"])
@pytest.mark.parametrize("causal", [False, True])
def test_dq_adds_treat_subnormals_as_the_record_says(backend, schedule, causal):
    """Tiny dO makes many partials subnormal: the record's flag is what replay must use."""
    shape, d, dtype = AUDIT_SHAPES[0]
    q, k, v, do = inputs(shape, d, dtype, seed=34)
    do = (do.float() * 2.0**-118).to(dtype)  # partials near and below 2**-126
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, backend=backend)
    dq, _, _, record = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal,
                                                    schedule=schedule, audit=True,
                                                    backend=backend)
    partials = record.partials.cpu()
    tiny = (partials != 0) & (partials.abs() < 2.0**-126)
    assert tiny.sum() > 100  # the check below is not vacuous
    flag = record.flush_subnormals
    acc = replay(record.schedule, partials, flush_subnormals=flag)
    assert torch.equal(record.dq_acc.cpu(), acc)
    assert not torch.equal(record.dq_acc.cpu(),
                           replay(record.schedule, partials, flush_subnormals=not flag))
