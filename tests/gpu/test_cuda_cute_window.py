"""Sliding windows on the CuTe backend: L2 against ``dash_ref``'s fast arithmetic, L1, L0.

For FlashAttention's windows ``(256, 0)``, ``(64, 64)``, ``(0, 0)``, ``(-1, 32)`` and
``(100, -1)``, with and without ``causal`` (which makes the window ``(left, 0)``), over both
dtypes and head dims (paired, to keep the compiled variants few), GQA, ``S_q != S_k`` both
ways (a Q tile whose rows all lie above the window sees no key) and lengths that are no
multiples of the tiles:

* the forward's ``O`` and ``LSE2`` equal ``dash_ref.emulate.forward(arithmetic="fast")`` at
  the kernel's tiles, bit for bit (outputs poisoned with NaN first), and do not depend on
  the tile height, the grid or the hand-out of tiles;
* the audited backward's every step (``D``, each dQ partial, the accumulators, dQ, dK, dV)
  equals the CPU's (``verify.l2.record_steps``), the accumulator equals the replay of its
  partials in the schedule's dQ order (L1), and the window reached the backward's problem;
* both stay within the float64 bound (``verify.reference.attention_f64`` with the window);
* 100 runs of the plain (unaudited) backward give one set of bits, the audited run's;
* ``backend="auto"`` runs windows on the CuTe backend.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cases import inputs

import dash_cuda
from dash_ref import DETERMINISTIC, Mask
from dash_ref.emulate import forward as emulated_forward
from dash_ref.emulate import replay
from verify.l2 import first_difference, record_steps
from verify.reference import attention_f64, grad_checks

# window, causal, (B, H, H_kv, S_q, S_k), d, dtype
CASES = [
    ((256, 0), False, (1, 2, 1, 200, 390), 64, torch.bfloat16),
    ((64, 64), False, (1, 1, 1, 333, 333), 128, torch.float16),
    ((64, 64), True, (2, 2, 1, 260, 200), 64, torch.float16),
    ((0, 0), False, (1, 2, 1, 450, 130), 64, torch.bfloat16),  # Q tile 0 sees no key
    ((-1, 32), False, (1, 2, 2, 200, 330), 128, torch.bfloat16),
    ((100, -1), False, (1, 3, 1, 257, 300), 128, torch.float16),
    ((100, -1), True, (1, 2, 2, 390, 270), 64, torch.bfloat16),
    ((128, 0), False, (1, 2, 1, 300, 333), 96, torch.bfloat16),
]
IDS = [f"{w}-{'causal' if c else 'nc'}-{s}-d{d}-{str(t)[6:]}" for w, c, s, d, t in CASES]


@pytest.fixture(autouse=True)
def _cute_only():
    from dash_cuda.backends import get_backend

    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


def forward_block_m(d: int, rule: Mask, seqlen_q: int) -> int:
    from dash_cuda.backends.cute.config import forward_config, tiling_mask

    return forward_config(d, tiling_mask(rule), seqlen_q).block_m


def cpu(*xs):
    return tuple(x.cpu() for x in xs)


@pytest.mark.parametrize("window, causal, shape, d, dtype", CASES, ids=IDS)
def test_the_window_forward_is_dash_ref_fast_bit_for_bit(window, causal, shape, d, dtype):
    q, k, v, _ = inputs(shape, d, dtype, seed=sum(shape) + d)
    rule = Mask.of(causal, window)
    assert rule.kind == "window"
    o, lse2 = dash_cuda.attention_forward(q, k, v, causal=causal, window_size=window,
                                          backend="cute", _poison=True)
    emu = emulated_forward(*cpu(q, k, v), causal, None, forward_block_m(d, rule, shape[3]),
                           128, arithmetic="fast", window_size=window)
    assert torch.equal(o.cpu(), emu.o)
    assert torch.equal(lse2.cpu(), emu.lse2)
    # rows that see no key: O = 0, LSE2 = -inf, as the rule says
    sq, sk = shape[3], shape[4]
    blind = torch.tensor([len(rule.keys(r, sq, sk)) == 0 for r in range(sq)])
    assert torch.equal(torch.isinf(lse2.cpu()), blind[None, :, None].expand_as(lse2.cpu()))
    assert (o.cpu()[:, blind] == 0).all()


def test_a_q_tile_that_sees_no_key_and_rows_that_see_none():
    """(0, 0) with S_q - S_k longer than a Q tile: tile 0's rows all lie above the window."""
    window, causal, shape, d, dtype = CASES[3]
    sq, sk = shape[3], shape[4]
    assert sq - sk > forward_block_m(d, Mask.of(causal, window), sq)
    q, k, v, _ = inputs(shape, d, dtype, seed=3)
    o, lse2 = dash_cuda.attention_forward(q, k, v, window_size=window, backend="cute",
                                          _poison=True)
    assert (lse2[:, :sq - sk] == -math.inf).all() and (o[:, :sq - sk] == 0).all()
    assert torch.isfinite(lse2[:, sq - sk:]).all()


@pytest.mark.parametrize("window", [(256, 0), (64, 64)])
def test_the_window_forward_bits_do_not_depend_on_the_grid(window):
    from dash_cuda.backends.cute.launch import run_forward

    q, k, v, _ = inputs((1, 2, 1, 1100, 1000), 64, torch.bfloat16, seed=5)
    rule = Mask.of(False, window)
    runs = [run_forward(q, k, v, rule, 0.125, poison=True, block_m=bm, num_ctas=ctas,
                        dynamic=dyn)
            for bm, ctas, dyn in [(192, None, None), (128, 1, False), (192, 7, True),
                                  (128, 132, True)]]
    for o, lse in runs[1:]:
        assert torch.equal(o, runs[0][0]) and torch.equal(lse, runs[0][1])


def audited(window, causal, shape, d, dtype, schedule="auto", backend="cute"):
    q, k, v, do = inputs(shape, d, dtype, seed=sum(shape) * 3 + d)
    o, lse2 = dash_cuda.attention_forward(q, k, v, causal=causal, window_size=window,
                                          backend=backend)
    dq, dk, dv, rec = dash_cuda.attention_backward(
        q, k, v, o, lse2, do, causal=causal, window_size=window, schedule=schedule,
        audit=True, backend=backend, _poison=True)
    return (q, k, v, o, lse2, do), (dq, dk, dv), rec


def check_l2_l1(args, grads, rec, window, causal):
    assert rec.backend == "cute" and rec.arithmetic == "fast"
    assert rec.schedule.problem.visibility == Mask.of(causal, window)
    steps = record_steps(rec, args, grads)
    assert [s for s, _, _ in steps][:3] == ["D", "partials", "dq_acc"]
    assert first_difference(steps) is None, first_difference(steps)
    for name, got, want in steps:
        assert torch.equal(got, want), name
    acc = replay(rec.schedule, rec.partials.cpu(), flush_subnormals=rec.flush_subnormals)
    assert torch.equal(rec.dq_acc.cpu(), acc)


@pytest.mark.parametrize("window, causal, shape, d, dtype", CASES, ids=IDS)
def test_the_window_backward_is_dash_ref_fast_bit_for_bit(window, causal, shape, d, dtype):
    args, grads, rec = audited(window, causal, shape, d, dtype)
    check_l2_l1(args, grads, rec, window, causal)


@pytest.mark.parametrize("schedule", DETERMINISTIC)
def test_every_deterministic_schedule_runs_windows_bit_for_bit(schedule):
    window, causal, shape, d, dtype = (48, 16), False, (1, 2, 1, 400, 330), 64, torch.bfloat16
    args, grads, rec = audited(window, causal, shape, d, dtype, schedule)
    assert rec.schedule.name == schedule
    check_l2_l1(args, grads, rec, window, causal)


@pytest.mark.parametrize("window, causal, shape, d, dtype", CASES, ids=IDS)
def test_the_window_is_within_the_float64_bound(window, causal, shape, d, dtype):
    q, k, v, do = inputs(shape, d, dtype, seed=sum(shape) + 7)
    ref = attention_f64(q, k, v, do, causal=causal, window_size=window)
    o, lse2 = dash_cuda.attention_forward(q, k, v, causal=causal, window_size=window,
                                          backend="cute")
    dq, dk, dv = dash_cuda.attention_backward(q, k, v, o, lse2, do, causal=causal,
                                              window_size=window, backend="cute")
    # the bound scales with the operands' magnitudes, not the result's norm: with one key
    # per row (window (0, 0)) the exact dQ is 0 and a relative error has no meaning
    got = {"o": o, "dq": dq, "dk": dk, "dv": dv}
    for name, check in grad_checks(got, ref, dtype).items():
        assert got[name].dtype == dtype, name
        assert check.ok, check


@pytest.mark.parametrize("case", [CASES[0], CASES[1]], ids=[IDS[0], IDS[1]])
def test_the_window_backward_repeats_its_bits(case):
    """100 plain runs (GQA: per-head dK/dV; MHA: rounded in the kernel) give the audited
    run's bits each time."""
    window, causal, shape, d, dtype = case
    args, grads, _ = audited(window, causal, shape, d, dtype)
    q, k, v, o, lse2, do = args
    for _ in range(100):
        again = dash_cuda.attention_backward(q, k, v, o, lse2, do, causal=causal,
                                             window_size=window, backend="cute")
        for a, b in zip(again, grads):
            assert torch.equal(a, b)


def test_auto_runs_windows_on_the_cute_backend():
    window, causal, shape, d, dtype = CASES[1]
    _, _, rec = audited(window, causal, shape, d, dtype, backend="auto")
    assert rec.backend == "cute"
