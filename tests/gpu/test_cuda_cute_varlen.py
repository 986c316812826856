"""The CuTe backend's packed (varlen) forward and backward on the GPU: L2, L1, accuracy,
packing invariance, determinism.

The forward runs through ``CuteBackend.forward_varlen`` on a
:class:`dash_cuda.options.Packing`; the backward through the public packed calls with
``backend="cute"`` (skipped, with the reason, while ``PACKED_BACKWARD`` refuses them):

* ``O`` and ``LSE2`` equal ``dash_ref.emulate.forward(arithmetic="fast")`` of the packed
  batch (each sequence in its own coordinates) bit for bit, outputs poisoned with NaN
  first (a row the kernel fails to write, or one it writes past a sequence's end, shows):
  heavy-tailed lengths with empty sequences, length 1, lengths off the tiles, S_q != S_k
  per sequence (causal rows that see no key), sequences without keys; causal, full and one
  window; bf16 and fp16, d 64 and 128, MHA and GQA;
* the backward's ``D``, partials, accumulators and ``dQ, dK, dV`` equal
  ``dash_ref.emulate.backward`` in the fast arithmetic bit for bit (outputs and scratch
  poisoned), the dQ accumulator equals the replay of its partials (L1), the audit changes
  no bit, autograd gives the explicit calls' bits;
* every sequence's ``O`` and gradients within their float64 bounds
  (``verify.reference.attention_f64_packed``);
* packing invariance: each sequence's bits equal those of the same sequence packed in
  another order with larger ``max_seqlen`` values, and of the batch-1 CuTe calls on it
  alone (a portable schedule, and ``lpt`` against ``descending``, whose orders it adds in);
* 100 runs give one bit pattern, forward and backward;
* ``backend="auto"`` runs packed calls on CuTe while ``PACKED_BACKWARD`` is on, on Triton
  otherwise.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpu_cases import bound, normwise

import dash_cuda
from dash_cuda.options import Packing
from dash_ref import Mask
from dash_ref.emulate import forward as emulated_forward
from verify.reference import attention_f64_packed

SEQLENS_Q = (1, 0, 700, 3, 511, 0, 257, 64, 129, 1)
SEQLENS_K = (1, 7, 900, 3, 300, 0, 257, 130, 129, 0)
# (causal, window, H, H_kv, d, dtype)
CASES = [
    (True, (-1, -1), 4, 4, 64, torch.bfloat16),
    (False, (-1, -1), 4, 2, 128, torch.float16),
    (True, (-1, -1), 2, 1, 128, torch.bfloat16),
    (False, (-1, -1), 2, 2, 64, torch.float16),
    (False, (64, 32), 4, 2, 64, torch.bfloat16),
    (True, (-1, -1), 4, 2, 96, torch.bfloat16),
]
IDS = [f"{'causal' if c else 'full'}-{w}-h{h}x{hk}-d{d}-{str(t)[6:]}"
       for c, w, h, hk, d, t in CASES]


@pytest.fixture(autouse=True)
def _cute_only():
    from dash_cuda.backends import get_backend

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reason = get_backend("cute").missing()
    if reason:
        pytest.skip(f"backend 'cute': {reason}")


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()],
                        dtype=torch.int32, device="cuda")


def packing_of(seqlens_q, seqlens_k, extra: int = 0) -> Packing:
    return Packing.read(offsets(seqlens_q), offsets(seqlens_k), max(seqlens_q) + extra,
                        max(seqlens_k) + extra, sum(seqlens_q), sum(seqlens_k))


def packed_inputs(seqlens_q, seqlens_k, heads, heads_kv, d, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    return (randn(sum(seqlens_q), heads, d), randn(sum(seqlens_k), heads_kv, d),
            randn(sum(seqlens_k), heads_kv, d))


def cute_forward(q, k, v, packing, causal, window, scale):
    from dash_cuda.backends.cute import BACKEND

    with torch.cuda.device(q.device):
        return BACKEND.forward_varlen(q, k, v, packing, Mask.of(causal, window), scale, True)


def split(x: torch.Tensor, lengths) -> list[torch.Tensor]:
    return list(torch.split(x, list(lengths)))


@pytest.mark.parametrize("causal, window, heads, heads_kv, d, dtype", CASES, ids=IDS)
def test_the_packed_forward_is_dash_ref_fast_bit_for_bit(causal, window, heads, heads_kv, d,
                                                         dtype):
    from dash_cuda.backends.cute.launch import forward_variant

    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=d + heads)
    scale = 1 / math.sqrt(d)
    o, lse2 = cute_forward(q, k, v, packing_of(SEQLENS_Q, SEQLENS_K), causal, window, scale)
    assert lse2.shape == (q.shape[0], heads) and lse2.stride() == (1, q.shape[0])
    block_m = forward_variant(dtype, d, Mask.of(causal, window), max(SEQLENS_Q), True).block_m
    emu = emulated_forward(q.cpu(), k.cpu(), v.cpu(), causal, scale, block_m, 128,
                           arithmetic="fast", seqlens_q=SEQLENS_Q, seqlens_k=SEQLENS_K,
                           window_size=window)
    assert torch.equal(o.cpu(), emu.o)
    assert torch.equal(lse2.cpu(), emu.lse2)
    # a sequence with queries and no keys: O = 0, LSE2 = -inf
    assert torch.equal(split(o, SEQLENS_Q)[-1], torch.zeros_like(split(o, SEQLENS_Q)[-1]))
    assert (split(lse2, SEQLENS_Q)[-1] == -math.inf).all()
    # accuracy: every sequence within its float64 bound
    ref = attention_f64_packed(q.cpu(), k.cpu(), v.cpu(), torch.zeros_like(q).cpu(), SEQLENS_Q,
                               SEQLENS_K, causal=causal, softmax_scale=scale,
                               window_size=window)
    for b, (got, exact) in enumerate(zip(split(o.cpu(), SEQLENS_Q), split(ref.o, SEQLENS_Q))):
        if exact.numel() and exact.norm() > 0:
            shape = (1, heads, heads_kv, SEQLENS_Q[b], SEQLENS_K[b])
            assert normwise(got, exact) <= bound(dtype, "o", shape, d), b


@pytest.mark.parametrize("causal, window, heads, heads_kv, d, dtype", CASES[:2] + CASES[4:],
                         ids=IDS[:2] + IDS[4:])
def test_each_sequence_has_its_batch_1_bits_in_any_packing(causal, window, heads, heads_kv, d,
                                                           dtype):
    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=7)
    scale = 1 / math.sqrt(d)
    o, lse2 = cute_forward(q, k, v, packing_of(SEQLENS_Q, SEQLENS_K), causal, window, scale)
    order = [4, 9, 2, 0, 7, 5, 3, 8, 1, 6]
    perm_q = [SEQLENS_Q[b] for b in order]
    perm_k = [SEQLENS_K[b] for b in order]
    qs, ks, vs = split(q, SEQLENS_Q), split(k, SEQLENS_K), split(v, SEQLENS_K)
    o2, lse2_2 = cute_forward(torch.cat([qs[b] for b in order]),
                              torch.cat([ks[b] for b in order]),
                              torch.cat([vs[b] for b in order]),
                              packing_of(perm_q, perm_k, extra=300), causal, window, scale)
    o2s, l2s = split(o2, perm_q), split(lse2_2, perm_q)
    os_, ls = split(o, SEQLENS_Q), split(lse2, SEQLENS_Q)
    for n, b in enumerate(order):
        assert torch.equal(os_[b], o2s[n]) and torch.equal(ls[b], l2s[n]), b
        if SEQLENS_Q[b] and SEQLENS_K[b]:
            o1, l1 = dash_cuda.attention_forward(qs[b][None], ks[b][None], vs[b][None],
                                                 causal=causal, softmax_scale=scale,
                                                 window_size=window, backend="cute")
            assert torch.equal(os_[b], o1[0]) and torch.equal(ls[b], l1[0]), b


def test_a_hundred_runs_give_one_bit_pattern():
    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, 4, 2, 128, torch.bfloat16, seed=3)
    packing = packing_of(SEQLENS_Q, SEQLENS_K)
    first = cute_forward(q, k, v, packing, True, (-1, -1), 0.125)
    for _ in range(100):
        again = cute_forward(q, k, v, packing, True, (-1, -1), 0.125)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


# -- the packed backward ---------------------------------------------------------------------
SMALL_Q = (1, 0, 200, 77, 130, 3, 64)  # for the CPU emulation (L2)
SMALL_K = (1, 5, 260, 77, 129, 0, 200)


def packed_backward_on():
    import dash_cuda.backends.cute as cute_backend

    if not cute_backend.PACKED_BACKWARD:
        pytest.skip("the CuTe packed backward is switched off (PACKED_BACKWARD = False)")


def call_args(seqlens_q, seqlens_k, extra: int = 0):
    return (offsets(seqlens_q), offsets(seqlens_k), max(seqlens_q) + extra,
            max(seqlens_k) + extra)


def grads_of(q, k, v, do, seqlens_q, seqlens_k, extra=0, **kw):
    """``O, dQ, dK, dV`` of one packed CuTe call through autograd."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = dash_cuda.attention_varlen(*leaves, *call_args(seqlens_q, seqlens_k, extra),
                                   backend="cute", **kw)
    o.backward(do)
    return [o.detach(), *(x.grad for x in leaves)]


def audited(q, k, v, do, seqlens_q, seqlens_k, causal, window, **kw):
    cu = call_args(seqlens_q, seqlens_k)
    o, lse = dash_cuda.attention_varlen_forward(q, k, v, *cu, causal=causal,
                                                window_size=window, backend="cute")
    out = dash_cuda.attention_varlen_backward(q, k, v, o, lse, do, *cu, causal=causal,
                                              window_size=window, backend="cute",
                                              _poison=True, **kw)
    return out, (o, lse)


@pytest.mark.parametrize("causal, window, heads, heads_kv, d, dtype", CASES, ids=IDS)
def test_the_packed_backward_is_dash_ref_fast_bit_for_bit(causal, window, heads, heads_kv, d,
                                                          dtype):
    from dash_ref.arithmetic.steps import FAST, delta
    from dash_ref.emulate import backward, replay

    packed_backward_on()
    q, k, v = packed_inputs(SMALL_Q, SMALL_K, heads, heads_kv, d, dtype, seed=d + 5 * heads)
    do = packed_inputs(SMALL_Q, SMALL_Q, heads, heads, d, dtype, seed=d + 1)[0]
    (dq, dk, dv, record), (o, lse) = audited(q, k, v, do, SMALL_Q, SMALL_K, causal, window,
                                             schedule="lpt", audit=True)
    assert record.backend == "cute" and record.arithmetic == "fast"
    sched = record.schedule
    p = sched.problem
    assert p.is_packed and p.seqlens_q == SMALL_Q and p.visibility == Mask.of(causal, window)
    assert record.dq_acc.shape == (p.total_q, heads, d)
    arithmetic = FAST.with_dq_adds(record.flush_subnormals)
    cpu = [x.cpu() for x in (q, k, v, o, lse, do)]
    emu = backward(sched, *cpu, return_partials=True, arithmetic=arithmetic)
    rows = torch.tensor([len(p.rows(i, chain.b)) for _, chain in sched.chains()
                         for i in chain.visits])
    real = torch.arange(p.block_m)[None, :] < rows[:, None]  # rows past a sequence: padding
    steps = [("D", record.delta.cpu(), delta(arithmetic, cpu[3], cpu[5])),
             ("partials", record.partials.cpu()[real], emu.partials[real]),
             ("dq_acc", record.dq_acc.cpu(), emu.dq_acc)]
    if heads == heads_kv:
        steps += [("dk_acc", record.dk_heads.cpu(), emu.dk_acc),
                  ("dv_acc", record.dv_heads.cpu(), emu.dv_acc)]
    steps += [("dq", dq.cpu(), emu.dq), ("dk", dk.cpu(), emu.dk), ("dv", dv.cpu(), emu.dv)]
    for name, got, want in steps:
        assert torch.equal(got, want), name
    # L1: the accumulator is the replay of the partials in the schedule's order
    acc = replay(sched, record.partials.cpu(), flush_subnormals=record.flush_subnormals)
    assert torch.equal(record.dq_acc.cpu(), acc)
    # the audit changes no bit, and autograd gives the explicit calls' bits
    cu = call_args(SMALL_Q, SMALL_K)
    plain = dash_cuda.attention_varlen_backward(q, k, v, o, lse, do, *cu, causal=causal,
                                                window_size=window, schedule="lpt",
                                                backend="cute")
    auto = grads_of(q, k, v, do, SMALL_Q, SMALL_K, causal=causal, window_size=window,
                    schedule="lpt")
    for a, b, c in zip((dq, dk, dv), plain, auto[1:]):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(auto[0], o)


@pytest.mark.parametrize("causal, window, heads, heads_kv, d, dtype", CASES, ids=IDS)
def test_every_packed_gradient_is_within_its_float64_bound(causal, window, heads, heads_kv, d,
                                                           dtype):
    from verify.reference import packed_grad_checks

    packed_backward_on()
    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=11)
    do = packed_inputs(SEQLENS_Q, SEQLENS_Q, heads, heads, d, dtype, seed=12)[0]
    o, dq, dk, dv = grads_of(q, k, v, do, SEQLENS_Q, SEQLENS_K, causal=causal,
                             window_size=window)
    ref = attention_f64_packed(q.cpu(), k.cpu(), v.cpu(), do.cpu(), SEQLENS_Q, SEQLENS_K,
                               causal=causal, softmax_scale=1 / math.sqrt(d),
                               window_size=window)
    got = {"o": o.cpu(), "dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()}
    for b, checks in enumerate(packed_grad_checks(got, ref, dtype)):
        for check in checks.values():
            assert check.ok, (b, check)
    # keys no query sees (a sequence without queries): dK = dV = 0
    for x in (dk, dv):
        empty = split(x, SEQLENS_K)[1]  # S_q = 0, S_k = 7
        assert torch.equal(empty, torch.zeros_like(empty))


@pytest.mark.parametrize("schedule", ["naive", "lpt"])
@pytest.mark.parametrize("causal, window, heads, heads_kv, d, dtype", CASES[:2] + CASES[4:],
                         ids=IDS[:2] + IDS[4:])
def test_each_sequence_has_its_batch_1_gradients_in_any_packing(schedule, causal, window,
                                                                heads, heads_kv, d, dtype):
    packed_backward_on()
    kw = dict(causal=causal, window_size=window, schedule=schedule)
    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=21)
    do = packed_inputs(SEQLENS_Q, SEQLENS_Q, heads, heads, d, dtype, seed=22)[0]
    first = grads_of(q, k, v, do, SEQLENS_Q, SEQLENS_K, **kw)
    order = [4, 9, 2, 0, 7, 5, 3, 8, 1, 6]
    perm_q = [SEQLENS_Q[b] for b in order]
    perm_k = [SEQLENS_K[b] for b in order]
    parts = [split(x, SEQLENS_K if n in (1, 2) else SEQLENS_Q)
             for n, x in enumerate((q, k, v, do))]
    second = grads_of(*(torch.cat([x[b] for b in order]) for x in parts), perm_q, perm_k,
                      extra=300, **kw)
    lengths = (SEQLENS_Q, SEQLENS_Q, SEQLENS_K, SEQLENS_K)
    perm_lengths = (perm_q, perm_q, perm_k, perm_k)
    firsts = [split(x, n) for x, n in zip(first, lengths)]
    seconds = [split(x, n) for x, n in zip(second, perm_lengths)]
    # alone: the rectangular CuTe call (lpt adds in descending's orders)
    alone = dict(kw, schedule="descending" if schedule == "lpt" else schedule,
                 backend="cute")
    for n, b in enumerate(order):
        for name, a, c in zip(("O", "dQ", "dK", "dV"), (x[b] for x in firsts),
                              (x[n] for x in seconds)):
            assert torch.equal(a, c), (b, name, "packed vs re-packed")
        if SEQLENS_Q[b] and SEQLENS_K[b]:
            leaves = [parts[i][b][None].detach().clone().requires_grad_() for i in range(3)]
            o = dash_cuda.attention(*leaves, **alone)
            o.backward(parts[3][b][None])
            single = [o.detach()[0], *(x.grad[0] for x in leaves)]
            for name, a, s_ in zip(("O", "dQ", "dK", "dV"), (x[b] for x in firsts), single):
                assert torch.equal(a, s_), (b, name, "packed vs alone")


def test_a_hundred_packed_backwards_give_one_bit_pattern():
    packed_backward_on()
    q, k, v = packed_inputs(SEQLENS_Q, SEQLENS_K, 4, 2, 64, torch.bfloat16, seed=31)
    do = packed_inputs(SEQLENS_Q, SEQLENS_Q, 4, 4, 64, torch.bfloat16, seed=32)[0]
    first = grads_of(q, k, v, do, SEQLENS_Q, SEQLENS_K, causal=True)
    for _ in range(99):
        again = grads_of(q, k, v, do, SEQLENS_Q, SEQLENS_K, causal=True)
        for name, a, b in zip(("O", "dQ", "dK", "dV"), first, again):
            assert torch.equal(a, b), name


def test_auto_follows_the_packed_switch():
    import dash_cuda.backends.cute as cute_backend
    from dash_cuda.backends import Case, choose_backend

    case = Case(64, torch.bfloat16, False, True, packed=True)
    if cute_backend.PACKED_BACKWARD:
        assert choose_backend("auto", case).name == "cute"
    else:
        assert choose_backend("auto", case).name == "triton"
        with pytest.raises(ValueError, match="packed"):
            choose_backend("cute", case)
