"""verify.l2 pairs every step of an exact-mode backward with the CPU emulation's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dash_ref import Problem, build_schedule
from dash_ref.arithmetic.steps import EXACT, delta
from dash_ref.emulate import backward, forward
from verify.demo import random_inputs
from verify.l2 import l2_steps, record_steps

# ragged: 40 query rows in 16-row tiles leave 8 padding rows in the last Q tile
PROBLEM = Problem(1, 2, 2, 40, 48, 16, "causal", 16, 16)


def emulated_kernel(seed: int = 3):
    """Inputs and a stand-in for the kernel's values: the emulation itself, padding poisoned."""
    q, k, v, do = random_inputs(PROBLEM, torch.bfloat16, seed=seed)
    fwd = forward(q, k, v, True, None, PROBLEM.block_m, PROBLEM.block_n)
    sched = build_schedule(PROBLEM, "symmetric_shift", 3)
    emu = backward(sched, q, k, v, fwd.o, fwd.lse2, do, return_partials=True,
                   arithmetic="exact")
    partials = emu.partials.clone()
    last = PROBLEM.seqlen_q - (PROBLEM.n_q - 1) * PROBLEM.block_m
    for vis, i in enumerate(sched.to_tables().visit_q.tolist()):
        if i == PROBLEM.n_q - 1:
            partials[vis, last:] = float("nan")  # rows past S_q hold anything in the kernel
    kernel = dict(delta=delta(EXACT, fwd.o, do), partials=partials,
                  dq_acc=emu.dq_acc, dk_heads=emu.dk_acc, dv_heads=emu.dv_acc,
                  dq=emu.dq, dk=emu.dk, dv=emu.dv)
    return sched, (q, k, v, fwd.o, fwd.lse2, do), kernel


def test_equal_values_pass_every_step_and_padding_rows_are_not_read():
    sched, inputs, kernel = emulated_kernel()
    steps = l2_steps(sched, inputs, kernel)
    assert [s[0] for s in steps] == ["D", "partials", "dq_acc", "dk_acc", "dv_acc", "dq",
                                     "dk", "dv"]
    assert all(torch.equal(got, want) for _, got, want in steps)


@pytest.mark.parametrize("name", ["delta", "partials", "dq_acc", "dk_heads", "dq", "dv"])
def test_one_flipped_bit_is_named(name):
    sched, inputs, kernel = emulated_kernel()
    flipped = kernel[name].clone()
    bits = flipped.view(torch.int32 if flipped.dtype == torch.float32 else torch.int16)
    bits.view(-1)[0] ^= 1
    kernel[name] = flipped
    differ = [step for step, got, want in l2_steps(sched, inputs, kernel)
              if not torch.equal(got, want)]
    assert differ == [{"delta": "D", "dk_heads": "dk_acc"}.get(name, name)]


def test_missing_values_are_refused():
    sched, inputs, kernel = emulated_kernel()
    del kernel["partials"]
    with pytest.raises(ValueError, match="partials"):
        l2_steps(sched, inputs, kernel)


def test_the_records_subnormal_handling_is_honoured_and_named():
    """A kernel whose dQ adds keep subnormals passes when its record says so, and only then."""
    q, k, v, do = random_inputs(PROBLEM, torch.bfloat16, seed=5)
    do = (do.float() * 2.0**-118).to(torch.bfloat16)  # partials near and below 2**-126
    fwd = forward(q, k, v, True, None, PROBLEM.block_m, PROBLEM.block_n)
    sched = build_schedule(PROBLEM, "shift", 3)
    keeps = EXACT.with_dq_adds(False)
    emu = backward(sched, q, k, v, fwd.o, fwd.lse2, do, return_partials=True,
                   arithmetic=keeps)
    tiny = (emu.partials != 0) & (emu.partials.abs() < 2.0**-126)
    assert tiny.sum() > 20  # subnormal partials exist, so the flag matters
    record = SimpleNamespace(schedule=sched, exact=True, flush_subnormals=False,
                             delta=delta(keeps, fwd.o, do), partials=emu.partials,
                             dq_acc=emu.dq_acc, dk_heads=emu.dk_acc, dv_heads=emu.dv_acc)
    inputs = (q, k, v, fwd.o, fwd.lse2, do)
    grads = (emu.dq, emu.dk, emu.dv)
    assert all(torch.equal(got, want) for _, got, want in record_steps(record, inputs, grads))
    record.flush_subnormals = True  # a record that misstates the adds fails, at dq_acc
    differ = [name for name, got, want in record_steps(record, inputs, grads)
              if not torch.equal(got, want)]
    assert differ and differ[0] == "dq_acc"


def test_a_record_of_the_fast_arithmetic_is_refused():
    sched, inputs, kernel = emulated_kernel()
    record = SimpleNamespace(schedule=sched, exact=False, flush_subnormals=True,
                             **{n: kernel[n] for n in ("delta", "partials", "dq_acc",
                                                       "dk_heads", "dv_heads")})
    with pytest.raises(ValueError, match="exact=True"):
        record_steps(record, inputs, (kernel["dq"], kernel["dk"], kernel["dv"]))


def test_a_packed_schedule_reads_each_visit_on_its_own_sequences_rows():
    """Packed sequences of 21, 5 and 40 query rows in 16-row tiles: every visit's padding
    rows (past its own sequence's S_q, not the longest one's) are poisoned, and every step
    still matches; the padding of the second sequence's only tile is 11 rows."""
    seqlens_q, seqlens_k = (21, 5, 40), (30, 17, 33)
    p = Problem.packed(seqlens_q, seqlens_k, 2, 1, 16, "causal", 16, 16)
    gen = torch.Generator().manual_seed(11)
    q, do = (torch.randn(p.total_q, 2, 16, generator=gen).to(torch.bfloat16) for _ in "qd")
    k, v = (torch.randn(p.total_k, 1, 16, generator=gen).to(torch.bfloat16) for _ in "kv")
    fwd = forward(q, k, v, True, None, 16, 16, seqlens_q=seqlens_q, seqlens_k=seqlens_k)
    sched = build_schedule(p, "descending", 3)
    emu = backward(sched, q, k, v, fwd.o, fwd.lse2, do, return_partials=True,
                   arithmetic="exact")
    partials = emu.partials.clone()
    tables = sched.to_tables()
    padded = 0
    for c in range(len(tables.chain_bhj)):  # the tables, read without verify.l2
        b = int(tables.chain_bhj[c][0])
        for vis in range(int(tables.chain_offsets[c]), int(tables.chain_offsets[c + 1])):
            real = seqlens_q[b] - int(tables.visit_q[vis]) * 16
            if real < 16:
                partials[vis, real:] = float("nan")
                padded += 1
    assert padded > 0
    kernel = dict(delta=delta(EXACT, fwd.o, do), partials=partials, dq_acc=emu.dq_acc,
                  dk_heads=emu.dk_acc, dv_heads=emu.dv_acc, dq=emu.dq, dk=emu.dk, dv=emu.dv)
    steps = l2_steps(sched, (q, k, v, fwd.o, fwd.lse2, do), kernel)
    assert all(torch.equal(got, want) for _, got, want in steps)
