"""Sliding windows (``window_size=(left, right)``) on the Triton backend's GPU kernels.

- accuracy: ``O``, ``dQ``, ``dK``, ``dV`` within the float64 reference's bound
  (``verify.reference.attention_f64`` with the window, ``grad_checks``); a row that sees no
  key gives ``O = 0`` and ``LSE2 = -inf``, every other row a finite ``LSE2``;
- L1: with ``audit=True`` the dQ accumulator equals ``dash_ref.emulate.replay`` of the
  kernel's partials in the schedule's orders, the gradients are its epilogue, and the
  audit changes no bit;
- L2: with ``exact=True`` ``dash_ref.emulate.backward(..., arithmetic="exact")`` on the
  kernel's own ``O`` and ``LSE2`` reproduces every step bit for bit (``verify.l2``);
- determinism: 100 runs give one bit pattern of every output;
- a packed batch with a window: every sequence within its bound, each sequence's bits
  those of the sequence run alone at batch 1, and L2 on the packed kernel.

Windows ``(256, 0)`` (a causal sliding window), ``(64, 64)``, ``(0, 0)`` (the diagonal
alone) and ``(-1, 32)``, each with ``causal`` False and True (``causal`` drops the right
side, so ``(-1, 32)`` with ``causal=True`` is the causal mask and ``(64, 64)`` becomes
``(64, 0)``); bf16 and fp16, GQA, ``S_q != S_k`` both ways. Small shapes: the whole file
takes a few seconds of GPU time, the CPU emulation of L2 most of its wall time.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cases import inputs

import dash_cuda
from dash_ref import DETERMINISTIC, Mask
from dash_ref.arithmetic.steps import EXACT, delta, gqa_sum
from dash_ref.emulate import backward, epilogue, replay
from verify.l2 import record_steps
from verify.reference import attention_f64, attention_f64_packed, grad_checks, packed_grad_checks

WINDOWS = [(256, 0), (64, 64), (0, 0), (-1, 32)]
# (B, H, H_kv, S_q, S_k), d, dtype: S_q < S_k with GQA, S_q > S_k (rows that see no key
# under a causal window), fp16 at d = 128, several Q and KV tiles each
LAYOUTS = [((2, 4, 2, 300, 520), 64, torch.bfloat16),
           ((1, 2, 2, 333, 190), 128, torch.float16),
           ((1, 4, 1, 257, 257), 32, torch.bfloat16)]
TRITON = dict(backend="triton")


def run(q, k, v, do, causal, window, **kw):
    """``(O, LSE2)`` and the backward's outputs of one call (outputs poisoned first)."""
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, window_size=window,
                                         _poison=True, **TRITON)
    got = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, window_size=window,
                                       _poison=True, **TRITON, **kw)
    return (o, lse), got


# -- accuracy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape, d, dtype", LAYOUTS)
def test_window_is_within_the_float64_bound(window, causal, shape, d, dtype):
    q, k, v, do = inputs(shape, d, dtype, seed=61)
    (o, lse), (dq, dk, dv) = run(q, k, v, do, causal, window)
    ref = attention_f64(q, k, v, do, causal, window_size=window)
    for check in grad_checks({"o": o, "dq": dq, "dk": dk, "dv": dv}, ref, dtype).values():
        assert check.ok, check
    rule = Mask.of(causal, window)
    s_q, s_k = q.shape[1], k.shape[1]
    sees = torch.tensor([len(rule.keys(r, s_q, s_k)) > 0 for r in range(s_q)], device="cuda")
    assert torch.equal(o[:, ~sees], torch.zeros_like(o[:, ~sees]))
    assert (lse[:, ~sees] == -math.inf).all() and torch.isfinite(lse[:, sees]).all()


def test_the_windows_hide_keys_and_some_rows_see_none():
    """Not vacuous: every window hides keys on the first layout, and the causal sliding
    window leaves rows without keys on the second (``S_q > S_k``)."""
    _, _, _, s_q, s_k = LAYOUTS[0][0]
    for window in WINDOWS:
        assert not Mask.of(False, window).visible(range(s_q), range(s_k), s_q, s_k).all()
    _, _, _, s_q, s_k = LAYOUTS[1][0]
    assert not Mask.of(True, (256, 0)).keys(0, s_q, s_k)


# -- L1: replay ---------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", [*DETERMINISTIC, "banded"])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
def test_dq_accumulator_equals_replay(schedule, window, causal):
    if Mask.of(causal, window).kind != "window" and schedule == "banded":
        pytest.skip("banded is a schedule of windowed calls only")
    shape, d, dtype = LAYOUTS[0]
    q, k, v, do = inputs(shape, d, dtype, seed=62)
    (o, lse), (dq, dk, dv, record) = run(q, k, v, do, causal, window, schedule=schedule,
                                         audit=True)
    sched = record.schedule
    p = sched.problem
    assert sched.name == schedule and p.visibility == Mask.of(causal, window)
    acc = replay(sched, record.partials.cpu(), flush_subnormals=record.flush_subnormals)
    assert torch.equal(record.dq_acc.cpu(), acc)
    scale = 1.0 / math.sqrt(d)
    assert torch.equal(dq.cpu(), epilogue(acc, scale, dtype))
    assert torch.equal(dk.cpu(), epilogue(gqa_sum(record.dk_heads.cpu(), p.group), scale, dtype))
    assert torch.equal(dv.cpu(), epilogue(gqa_sum(record.dv_heads.cpu(), p.group), None, dtype))
    plain = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, window_size=window,
                                         schedule=schedule, **TRITON)
    for a, b in zip(plain, (dq, dk, dv)):
        assert torch.equal(a, b)  # the audit changes no bit


# -- L2: the exact arithmetic on the CPU ----------------------------------------------------------
# one schedule and layout per (window, causal): eight emulations in all
L2_SCHEDULES = ["naive", "descending", "shift", "banded", "spt", "symmetric_shift",
                "interleaved", "descending"]
L2_CASES = [(w, c, s, LAYOUTS[0] if n % 2 == 0 else LAYOUTS[2]) for n, ((w, c), s) in
            enumerate(zip([(w, c) for w in WINDOWS for c in (False, True)], L2_SCHEDULES))]


@pytest.mark.parametrize("window, causal, schedule, layout", L2_CASES,
                         ids=[f"{w}-{'causal' if c else 'full'}-{s}" for w, c, s, _ in L2_CASES])
def test_emulation_reproduces_the_exact_window_kernel(window, causal, schedule, layout):
    if Mask.of(causal, window).kind != "window" and schedule == "banded":
        schedule = "descending"  # banded takes windowed calls only
    (b, h, hk, s_q, s_k), d, dtype = layout
    q, k, v, do = inputs((1, h, hk, min(s_q, 260), min(s_k, 300)), d, dtype, seed=63)
    (o, lse), (dq, dk, dv, record) = run(q, k, v, do, causal, window, schedule=schedule,
                                         exact=True, audit=True)
    assert record.exact and record.schedule.problem.visibility == Mask.of(causal, window)
    steps = record_steps(record, (q, k, v, o, lse, do), (dq, dk, dv))
    assert len(steps) == (8 if h == hk else 6)
    for name, got, want in steps:
        assert torch.equal(got, want), name


# -- determinism --------------------------------------------------------------------------------
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("causal", [False, True])
def test_one_bit_pattern_in_100_runs(window, causal):
    q, k, v, do = inputs((2, 4, 2, 384, 512), 64, torch.bfloat16, seed=64)
    (o, lse), grads = run(q, k, v, do, causal, window)
    first = (o, lse, *grads)
    for _ in range(99):
        (o, lse), grads = run(q, k, v, do, causal, window)
        for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV"), first, (o, lse, *grads)):
            assert torch.equal(a, b), name


# -- a packed batch with a window -----------------------------------------------------------------
SEQLENS_Q = (1, 0, 300, 77, 130, 3, 257)
SEQLENS_K = (1, 7, 350, 77, 129, 0, 190)


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def split(x: torch.Tensor, lengths) -> list[torch.Tensor]:
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    return [x[cu[b]:cu[b + 1]] for b in range(len(lengths))]


def packed_inputs(heads, heads_kv, d, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    total_q, total_k = sum(SEQLENS_Q), sum(SEQLENS_K)
    return (randn(total_q, heads, d), randn(total_k, heads_kv, d), randn(total_k, heads_kv, d),
            randn(total_q, heads, d))


def packed_run(tensors, causal, window, **kw):
    q, k, v, do = tensors
    cu = (offsets(SEQLENS_Q), offsets(SEQLENS_K), max(SEQLENS_Q), max(SEQLENS_K))
    o, lse = dash_cuda.attention_varlen_forward(q, k, v, *cu, causal=causal, window_size=window,
                                                _poison=True, **TRITON)
    got = dash_cuda.attention_varlen_backward(q, k, v, o, lse, do, *cu, causal=causal,
                                              window_size=window, _poison=True, **TRITON, **kw)
    return (o, lse), got


@pytest.mark.parametrize("causal, window", [(True, (64, 0)), (False, (48, 16))])
@pytest.mark.parametrize("schedule", ["descending", "naive"])
def test_packed_window_is_within_its_bounds_and_each_sequence_its_batch_1_bits(causal, window,
                                                                              schedule):
    dtype = torch.bfloat16
    tensors = packed_inputs(4, 2, 64, dtype, seed=65)
    (o, lse), (dq, dk, dv) = packed_run(tensors, causal, window, schedule=schedule)
    ref = attention_f64_packed(*(x.cpu() for x in tensors), SEQLENS_Q, SEQLENS_K, causal,
                               window_size=window)
    got = {"o": o.cpu(), "dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()}
    for b, checks in enumerate(packed_grad_checks(got, ref, dtype)):
        for check in checks.values():
            assert check.ok, (b, check)
    packed = [split(x, SEQLENS_K if n >= 3 else SEQLENS_Q) for n, x in
              enumerate((o, lse, dq, dk, dv))]
    for b in range(len(SEQLENS_Q)):
        if SEQLENS_Q[b] == 0:
            continue
        seq = [split(x, SEQLENS_K if n in (1, 2) else SEQLENS_Q)[b][None]
               for n, x in enumerate(tensors)]
        (o1, lse1), grads1 = run(*seq, causal, window, schedule=schedule)
        for name, mine, alone in zip(("O", "LSE2", "dQ", "dK", "dV"), (p[b] for p in packed),
                                     (o1, lse1, *grads1)):
            assert torch.equal(mine, alone[0]), (b, name)


def test_exact_packed_window_kernel_is_the_emulators():
    """L2 on the packed kernel: every step, a partial compared on its sequence's rows."""
    tensors = packed_inputs(2, 1, 64, torch.float16, seed=66)
    (o, lse), (dq, dk, dv, record) = packed_run(tensors, False, (48, 16), schedule="lpt",
                                                exact=True, audit=True)
    assert record.exact and record.arithmetic == "exact"
    q, k, v, do = (x.cpu() for x in tensors)
    o, lse = o.cpu(), lse.cpu()
    sched = record.schedule
    p = sched.problem
    assert p.is_packed and p.visibility == Mask("window", 48, 16)
    arithmetic = EXACT.with_dq_adds(record.flush_subnormals)
    emu = backward(sched, q, k, v, o, lse, do, return_partials=True, arithmetic=arithmetic)
    rows = torch.tensor([len(p.rows(i, chain.b)) for _, chain in sched.chains()
                         for i in chain.visits])
    real = torch.arange(p.block_m)[None, :] < rows[:, None]
    steps = [("D", record.delta.cpu(), delta(arithmetic, o, do)),
             ("partials", record.partials.cpu()[real], emu.partials[real]),
             ("dq_acc", record.dq_acc.cpu(), emu.dq_acc),
             ("dq", dq.cpu(), emu.dq), ("dk", dk.cpu(), emu.dk), ("dv", dv.cpu(), emu.dv)]
    for name, got, want in steps:
        assert torch.equal(got, want), name
