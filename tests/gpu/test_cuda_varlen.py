"""Packed batches (``dash_cuda.attention_varlen``) on the GPU: accuracy, packing invariance,
determinism, L1 and L2.

- accuracy: every sequence's ``O``, ``dQ``, ``dK``, ``dV`` within its own float64 bound
  (``verify.reference.attention_f64_packed``, ``packed_grad_checks``), both masks, bf16 and
  fp16, MHA and GQA, heavy-tailed lengths with empty sequences, length 1 and ``S_q != S_k``;
- packing invariance: with portable schedules (and ``lpt``) each sequence's bits are those
  of the same sequence packed in another order beside other sequences with larger
  ``max_seqlen`` values, and of the batch-1 ``dash_cuda.attention`` call on it alone;
- determinism: 100 runs give one bit pattern of every output;
- L1: with ``audit=True`` the packed dQ accumulator equals ``dash_ref.emulate.replay`` of
  the kernel's partials for every deterministic schedule, and the audit changes no bit;
- L2: with ``exact=True`` ``dash_ref.emulate.backward(..., arithmetic="exact")`` on the
  kernel's own ``O`` and ``LSE2`` reproduces ``D``, every partial, every accumulator and
  the gradients bit for bit;
- the call path: ``backend="auto"`` runs packed calls on CuTe while its ``PACKED_BACKWARD``
  is on, otherwise on Triton (and ``backend="cute"`` refuses them); the other tests pin
  ``backend="triton"``; ``torch.compile(fullgraph=True)`` gives the eager bits; ``opcheck`` takes
  both ops; FlashAttention's alias gives ``attention_varlen``'s bits.
"""

from __future__ import annotations

import math

import pytest
import torch

import dash_cuda
from dash_cuda.ops import attention_varlen_backward_op, attention_varlen_op
from dash_ref import DETERMINISTIC, PORTABLE, RAGGED
from dash_ref.arithmetic.steps import EXACT, delta, gqa_sum
from dash_ref.emulate import backward, epilogue, replay
from verify.reference import attention_f64_packed, packed_grad_checks

# heavy-tailed lengths: empty sequences, length 1, lengths off the tiles, one long sequence,
# S_q != S_k per sequence (causal rows that see no key where S_q > S_k)
SEQLENS_Q = (1, 0, 1500, 3, 511, 0, 777, 64, 129, 1)
SEQLENS_K = (1, 7, 1800, 3, 300, 0, 777, 130, 129, 0)
SMALL_Q = (1, 0, 200, 77, 130, 3)  # for the CPU emulation (L2)
SMALL_K = (1, 5, 260, 77, 129, 0)
# (H, H_kv, d, dtype)
LAYOUTS = [(4, 4, 64, torch.bfloat16), (8, 2, 128, torch.float16), (4, 1, 32, torch.bfloat16),
           (2, 2, 16, torch.float16)]


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def packed_inputs(seqlens_q, seqlens_k, heads, heads_kv, d, dtype, seed):
    """Fresh seeded ``q, k, v, do`` in the packed layout, on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(dtype)

    total_q, total_k = sum(seqlens_q), sum(seqlens_k)
    return (randn(total_q, heads, d), randn(total_k, heads_kv, d), randn(total_k, heads_kv, d),
            randn(total_q, heads, d))


def grads(q, k, v, do, seqlens_q, seqlens_k, max_q=None, max_k=None, **kw):
    """``O, dQ, dK, dV`` of one packed call through autograd (on Triton, this file's
    backend, unless ``backend`` says otherwise: auto may pick CuTe for packed calls)."""
    kw.setdefault("backend", "triton")
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = dash_cuda.attention_varlen(*leaves, offsets(seqlens_q), offsets(seqlens_k),
                                   max_q or max(seqlens_q), max_k or max(seqlens_k), **kw)
    o.backward(do)
    return [o.detach(), *(x.grad for x in leaves)]


def split(x: torch.Tensor, lengths) -> list[torch.Tensor]:
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    return [x[cu[b]:cu[b + 1]] for b in range(len(lengths))]


def per_sequence(outputs, seqlens_q, seqlens_k) -> list[list[torch.Tensor]]:
    """``[[O_b, dQ_b, dK_b, dV_b] for b]`` from packed outputs."""
    parts = [split(x, seqlens_k if n >= 2 else seqlens_q) for n, x in enumerate(outputs)]
    return [[p[b] for p in parts] for b in range(len(seqlens_q))]


# -- accuracy -----------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, heads_kv, d, dtype", LAYOUTS)
def test_every_sequence_is_within_its_float64_bound(causal, heads, heads_kv, d, dtype):
    q, k, v, do = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=41)
    o, dq, dk, dv = grads(q, k, v, do, SEQLENS_Q, SEQLENS_K, causal=causal)
    ref = attention_f64_packed(q.cpu(), k.cpu(), v.cpu(), do.cpu(), SEQLENS_Q, SEQLENS_K,
                               causal=causal)
    got = {"o": o.cpu(), "dq": dq.cpu(), "dk": dk.cpu(), "dv": dv.cpu()}
    for b, checks in enumerate(packed_grad_checks(got, ref, dtype)):
        for check in checks.values():
            assert check.ok, (b, check)
    # a sequence with queries and no keys: O = 0 and zero gradients
    last = split(o, SEQLENS_Q)[-1]
    assert torch.equal(last, torch.zeros_like(last))


def test_the_forward_writes_every_row_and_the_lse_of_rows_without_keys():
    q, k, v, _ = packed_inputs(SEQLENS_Q, SEQLENS_K, 4, 2, 64, torch.bfloat16, seed=42)
    o, lse = dash_cuda.attention_varlen_forward(q, k, v, offsets(SEQLENS_Q), offsets(SEQLENS_K),
                                                max(SEQLENS_Q), max(SEQLENS_K), causal=True,
                                                backend="triton",
                                                _poison=True)
    assert lse.shape == (q.shape[0], 4) and lse.stride() == (1, q.shape[0])
    assert not o.isnan().any() and not lse.isnan().any()
    assert (split(lse, SEQLENS_Q)[-1] == -math.inf).all()
    # causal with S_q > S_k: sequence 4 (511 queries, 300 keys), its first 211 rows see nothing
    rows = split(lse, SEQLENS_Q)[4]
    assert (rows[:211] == -math.inf).all() and torch.isfinite(rows[211:]).all()


# -- packing invariance -------------------------------------------------------------------------
ORDER = (6, 2, 9, 0, 4, 1, 8, 3, 7, 5)
EXTRA_Q, EXTRA_K = (333, 1), (20, 900)


@pytest.mark.parametrize("schedule", [*PORTABLE, *RAGGED])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, heads_kv, d, dtype", LAYOUTS[:2])
def test_each_sequence_gets_its_batch_1_bits_whatever_else_is_packed(schedule, causal, heads,
                                                                     heads_kv, d, dtype):
    kw = dict(causal=causal, schedule=schedule)
    tensors = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=43)
    first = per_sequence(grads(*tensors, SEQLENS_Q, SEQLENS_K, **kw), SEQLENS_Q, SEQLENS_K)
    # re-packed in another order, two unrelated sequences among them, larger max_seqlen
    extra = packed_inputs(EXTRA_Q, EXTRA_K, heads, heads_kv, d, dtype, seed=44)
    order_q = [SEQLENS_Q[b] for b in ORDER[:5]] + [EXTRA_Q[0]] + [
        SEQLENS_Q[b] for b in ORDER[5:]] + [EXTRA_Q[1]]
    order_k = [SEQLENS_K[b] for b in ORDER[:5]] + [EXTRA_K[0]] + [
        SEQLENS_K[b] for b in ORDER[5:]] + [EXTRA_K[1]]
    repacked = []
    for n, x in enumerate(tensors):
        lengths, more = (SEQLENS_K, EXTRA_K) if n in (1, 2) else (SEQLENS_Q, EXTRA_Q)
        parts = split(x, lengths)
        others = split(extra[n], more)
        repacked.append(torch.cat([parts[b] for b in ORDER[:5]] + [others[0]]
                                  + [parts[b] for b in ORDER[5:]] + [others[1]]))
    second = per_sequence(grads(*repacked, order_q, order_k, max_q=4000, max_k=5000, **kw),
                          order_q, order_k)
    second = second[:5] + second[6:-1]  # without the extra sequences
    # alone: the rectangular call on the same backend (auto would pick CuTe at d = 64, 128);
    # attention does not take lpt, which adds in descending's orders
    alone = dict(kw, schedule="descending" if schedule in RAGGED else schedule,
                 backend="triton")
    for n, b in enumerate(ORDER):
        if SEQLENS_Q[b] == 0:
            continue
        seq = [x[None] for x in (split(t, SEQLENS_K if i in (1, 2) else SEQLENS_Q)[b]
                                 for i, t in enumerate(tensors))]
        leaves = [x.detach().clone().requires_grad_() for x in seq[:3]]
        o = dash_cuda.attention(*leaves, **alone)
        o.backward(seq[3])
        single = [o.detach()[0], *(x.grad[0] for x in leaves)]
        for name, a, c, s in zip(("O", "dQ", "dK", "dV"), first[b], second[n], single):
            assert torch.equal(a, s), (b, name, "packed vs alone")
            assert torch.equal(c, s), (b, name, "re-packed vs alone")


# -- determinism --------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["auto", "lpt"])
@pytest.mark.parametrize("causal", [False, True])
def test_one_bit_pattern_in_100_runs(schedule, causal):
    tensors = packed_inputs(SEQLENS_Q, SEQLENS_K, 8, 2, 64, torch.bfloat16, seed=45)
    first = grads(*tensors, SEQLENS_Q, SEQLENS_K, causal=causal, schedule=schedule)
    for _ in range(99):
        again = grads(*tensors, SEQLENS_Q, SEQLENS_K, causal=causal, schedule=schedule)
        for name, a, b in zip(("O", "dQ", "dK", "dV"), first, again):
            assert torch.equal(a, b), name


# -- L1: replay -----------------------------------------------------------------------------------
def audited(tensors, seqlens_q, seqlens_k, causal, **kw):
    q, k, v, do = tensors
    cu = (offsets(seqlens_q), offsets(seqlens_k), max(seqlens_q), max(seqlens_k))
    o, lse = dash_cuda.attention_varlen_forward(q, k, v, *cu, causal=causal, backend="triton")
    return dash_cuda.attention_varlen_backward(q, k, v, o, lse, do, *cu, causal=causal,
                                               backend="triton",
                                               _poison=True, **kw), (o, lse)


@pytest.mark.parametrize("schedule", [*DETERMINISTIC, *RAGGED])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, heads_kv, d, dtype", LAYOUTS[:3])
@pytest.mark.parametrize("num_workers", [None, 5])
def test_packed_dq_accumulator_equals_replay(schedule, causal, heads, heads_kv, d, dtype,
                                             num_workers):
    tensors = packed_inputs(SEQLENS_Q, SEQLENS_K, heads, heads_kv, d, dtype, seed=46)
    (dq, dk, dv, record), fwd = audited(tensors, SEQLENS_Q, SEQLENS_K, causal,
                                        schedule=schedule, num_workers=num_workers,
                                        audit=True)
    sched = record.schedule
    p = sched.problem
    assert sched.name == schedule and p.is_packed and p.seqlens_q == SEQLENS_Q
    assert record.partials.shape == (sched.num_visits, p.block_m, d)
    assert record.dq_acc.shape == (p.total_q, heads, d)
    acc = replay(sched, record.partials.cpu(), flush_subnormals=record.flush_subnormals)
    assert torch.equal(record.dq_acc.cpu(), acc)
    scale = 1.0 / math.sqrt(d)
    assert torch.equal(dq.cpu(), epilogue(acc, scale, dtype))
    dk_sum = gqa_sum(record.dk_heads.cpu()[None], p.group)[0]
    dv_sum = gqa_sum(record.dv_heads.cpu()[None], p.group)[0]
    assert torch.equal(dk.cpu(), epilogue(dk_sum, scale, dtype))
    assert torch.equal(dv.cpu(), epilogue(dv_sum, None, dtype))
    # the audit changes no bit
    q, k, v, do = tensors
    o, lse = fwd
    cu = (offsets(SEQLENS_Q), offsets(SEQLENS_K), max(SEQLENS_Q), max(SEQLENS_K))
    plain = dash_cuda.attention_varlen_backward(q, k, v, o, lse, do, *cu, causal=causal,
                                                schedule=schedule, num_workers=num_workers,
                                                backend="triton")
    for a, b in zip((dq, dk, dv), plain):
        assert torch.equal(a, b)


# -- L2: the exact arithmetic on the CPU ----------------------------------------------------------
@pytest.mark.parametrize("schedule", ["naive", "descending", "shift", "lpt"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, heads_kv, d, dtype",
                         [(2, 2, 64, torch.bfloat16), (4, 2, 32, torch.float16),
                          (2, 1, 128, torch.bfloat16)])
def test_emulation_reproduces_the_exact_packed_kernel(schedule, causal, heads, heads_kv, d,
                                                      dtype):
    tensors = packed_inputs(SMALL_Q, SMALL_K, heads, heads_kv, d, dtype, seed=47)
    (dq, dk, dv, record), (o, lse) = audited(tensors, SMALL_Q, SMALL_K, causal,
                                             schedule=schedule, exact=True, audit=True)
    assert record.exact and record.arithmetic == "exact"
    q, k, v, do = (x.cpu() for x in tensors)
    o, lse = o.cpu(), lse.cpu()
    sched = record.schedule
    p = sched.problem
    arithmetic = EXACT.with_dq_adds(record.flush_subnormals)
    emu = backward(sched, q, k, v, o, lse, do, return_partials=True, arithmetic=arithmetic)
    rows = torch.tensor([len(p.rows(i, chain.b)) for _, chain in sched.chains()
                         for i in chain.visits])
    real = torch.arange(p.block_m)[None, :] < rows[:, None]
    steps = [("D", record.delta.cpu(), delta(arithmetic, o, do)),
             ("partials", record.partials.cpu()[real], emu.partials[real]),
             ("dq_acc", record.dq_acc.cpu(), emu.dq_acc)]
    if heads == heads_kv:
        steps += [("dk_acc", record.dk_heads.cpu(), emu.dk_acc),
                  ("dv_acc", record.dv_heads.cpu(), emu.dv_acc)]
    steps += [("dq", dq.cpu(), emu.dq), ("dk", dk.cpu(), emu.dk), ("dv", dv.cpu(), emu.dv)]
    for name, got, want in steps:
        assert torch.equal(got, want), name


# -- the call path --------------------------------------------------------------------------------
def test_auto_runs_packed_calls_where_the_cute_switch_says():
    """``backend="auto"`` (CuTe first) runs packed calls on CuTe while its
    ``PACKED_BACKWARD`` is on; off, on Triton, and ``backend="cute"`` refuses them."""
    import dash_cuda.backends.cute as cute_backend

    tensors = packed_inputs(SMALL_Q, SMALL_K, 2, 2, 64, torch.bfloat16, seed=48)
    auto = grads(*tensors, SMALL_Q, SMALL_K, causal=True, backend="auto")
    picked = "cute" if cute_backend.PACKED_BACKWARD else "triton"
    same = grads(*tensors, SMALL_Q, SMALL_K, causal=True, backend=picked)
    for a, b in zip(auto, same):
        assert torch.equal(a, b)
    if not cute_backend.PACKED_BACKWARD:
        q, k, v, _ = tensors
        with pytest.raises(ValueError, match="backend 'cute' cannot run this call"):
            dash_cuda.attention_varlen(q, k, v, offsets(SMALL_Q), offsets(SMALL_K),
                                       max(SMALL_Q), max(SMALL_K), backend="cute")


def test_flash_attn_alias_gives_the_same_bits():
    tensors = packed_inputs(SMALL_Q, SMALL_K, 4, 2, 64, torch.float16, seed=49)
    q, k, v, do = tensors
    cu = (offsets(SMALL_Q), offsets(SMALL_K), max(SMALL_Q), max(SMALL_K))
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    o = dash_cuda.flash_attn_varlen_func(*leaves, *cu, 0.0, 0.1, True)
    o.backward(do)
    alias = [o.detach(), *(x.grad for x in leaves)]
    direct = grads(*tensors, SMALL_Q, SMALL_K, causal=True, softmax_scale=0.1, backend="auto")
    for a, b in zip(alias, direct):
        assert torch.equal(a, b)


class PackedLayers(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.mix = torch.nn.Parameter(torch.randn(d, d, generator=gen).bfloat16() / d ** 0.5)

    def forward(self, q, k, v, cu_q, cu_k, max_q: int, max_k: int):
        x = dash_cuda.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
        x = (x @ self.mix).contiguous()
        return dash_cuda.attention_varlen(x, k, v, cu_q, cu_k, max_q, max_k, schedule="lpt")


def test_compiled_packed_model_gives_the_eager_bits():
    q, k, v, do = packed_inputs(SEQLENS_Q, SEQLENS_K, 4, 2, 64, torch.bfloat16, seed=50)
    cu = (offsets(SEQLENS_Q), offsets(SEQLENS_K), max(SEQLENS_Q), max(SEQLENS_K))
    model = PackedLayers(64).cuda()

    def run(m):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        model.zero_grad(set_to_none=True)
        out = m(*leaves, *cu)
        out.backward(do)
        return [out.detach(), *(x.grad for x in leaves), model.mix.grad.clone()]

    eager = run(model)
    explained = torch._dynamo.explain(model)(q, k, v, *cu)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = run(torch.compile(model, fullgraph=True))
    for name, a, b in zip(("O", "dQ", "dK", "dV", "dW"), eager, compiled):
        assert torch.equal(a, b), f"{name} differs between eager and compiled"


@pytest.mark.parametrize("causal", [False, True])
def test_opcheck_accepts_both_varlen_ops(causal):
    q, k, v, do = packed_inputs(SMALL_Q, SMALL_K, 2, 1, 64, torch.bfloat16, seed=51)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    cu = (offsets(SMALL_Q), offsets(SMALL_K), max(SMALL_Q), max(SMALL_K))
    args = (q, k, v, *cu, None, causal, 0.125, "lpt", True, True, None, False, "triton",
            [-1, -1], 0.0)
    torch.library.opcheck(attention_varlen_op, args)
    o, lse = attention_varlen_op(*args)
    torch.library.opcheck(attention_varlen_backward_op,
                          (q.detach(), k.detach(), v.detach(), o.detach(), lse, do, *cu, None,
                           causal, 0.125, "lpt", True, True, None, False, "triton", [-1, -1],
                           0.0))
