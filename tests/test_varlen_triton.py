"""The Triton kernels on packed batches, run in Triton's CPU interpreter through dash_cuda's
own call path (``tests/triton_interpreter.py``): the emulator's bits, and packing invariance.

- **L2 on the CPU.** With the interpreter given the GPU's rounding (``hopper=True``: the
  tensor-core model for ``tl.dot``, one-rounding FMAs, RNE casts to bf16), an ``exact=True``
  varlen backward audited on the packed kernels gives ``dash_ref.emulate.backward(...,
  arithmetic="exact")``'s bits on every step (``D``, every dQ partial on its sequence's
  rows, every dQ accumulator, the per-head dK/dV accumulators where there is no GQA, dQ,
  dK, dV), fed the kernel's own ``O`` and ``LSE2`` as on the GPU (``tests/gpu``); the
  rectangular kernel is held to the same in one case, which shows the harness itself.
  The Triton forward's arithmetic is not emulated (``docs/design.md`` section 5): its
  packed output is held to the float64 reference and to the batch-1 bits below.
- **Packing invariance.** Every sequence's ``O``, ``LSE2``, ``dQ``, ``dK``, ``dV`` are the
  same bits (``torch.equal``) in the packed call, in a call that packs the sequences in
  another order beside another sequence with larger ``max_seqlen`` values, and in the
  rectangular batch-1 call on that sequence alone, for portable schedules (and ``lpt``,
  whose batch-1 orders are ``descending``'s), in the default arithmetic.

Sequences: lengths that are off the tiles (64-row Q tiles, 128-row KV tiles in the
backward; 128 x 64 in the forward), an empty one, one with queries and no keys, causal
rows that see no key (``S_q > S_k``), several tiles (so dQ orders have two partials), GQA
2:1. Outputs are poisoned with NaN before each run. Interpreted programs run one after
another, so the persistent backward runs on one worker.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("triton.runtime.interpreter")

from triton_interpreter import run  # noqa: E402

from dash_cuda.backends.triton.config import backward_config  # noqa: E402
from dash_ref import Problem, build_schedule  # noqa: E402
from dash_ref.arithmetic.numerics import flush_subnormals_f32  # noqa: E402
from dash_ref.arithmetic.steps import EXACT, delta  # noqa: E402
from dash_ref.emulate import backward  # noqa: E402
from verify.reference import attention_f64_packed, packed_grad_checks  # noqa: E402

# (S_q, S_k) per sequence: a ragged tail, an empty sequence, S_q > S_k, several Q and KV
# tiles, equal lengths, queries without keys
SEQLENS_Q = (5, 0, 37, 70, 16, 7)
SEQLENS_K = (12, 3, 20, 200, 16, 0)


def offsets(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def packed_inputs(seqlens_q, seqlens_k, heads, heads_kv, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    total_q, total_k = sum(seqlens_q), sum(seqlens_k)
    return (randn(total_q, heads, d), randn(total_k, heads_kv, d), randn(total_k, heads_kv, d),
            randn(total_q, heads, d))


def varlen_call(kind, tensors, seqlens_q, seqlens_k, max_q=None, max_k=None, audit=False,
                **kwargs):
    q, k, v, do = tensors
    return dict(kind=kind, q=q, k=k, v=v, do=do, cu_seqlens_q=offsets(seqlens_q),
                cu_seqlens_k=offsets(seqlens_k), max_seqlen_q=max_q or max(seqlens_q),
                max_seqlen_k=max_k or max(seqlens_k), audit=audit,
                kwargs=dict(num_workers=1, **kwargs))


# -- L2 on the CPU ------------------------------------------------------------------------------
# (mask, schedule, dtype, heads, heads_kv, head dim)
EXACT_CASES = [
    ("causal", "descending", torch.float16, 2, 1, 32),
    ("full", "lpt", torch.float16, 2, 1, 32),
    ("causal", "naive", torch.bfloat16, 2, 2, 16),
    ("full", "spt", torch.bfloat16, 2, 2, 16),
]


@pytest.fixture(scope="module")
def exact_runs(tmp_path_factory):
    calls = []
    for n, (mask, schedule, dtype, h, hk, d) in enumerate(EXACT_CASES):
        tensors = packed_inputs(SEQLENS_Q, SEQLENS_K, h, hk, d, dtype, seed=100 + n)
        calls.append(varlen_call("passes_varlen", tensors, SEQLENS_Q, SEQLENS_K, audit=True,
                                 causal=mask == "causal", schedule=schedule, exact=True))
    gen = torch.Generator().manual_seed(99)  # the rectangular kernel, in the same harness
    q, k, v, do = (torch.randn(*s, generator=gen).half()
                   for s in ((2, 70, 2, 32), (2, 150, 1, 32), (2, 150, 1, 32), (2, 70, 2, 32)))
    calls.append(dict(kind="passes", q=q, k=k, v=v, do=do, audit=True,
                      kwargs=dict(causal=True, schedule="descending", exact=True,
                                  num_workers=1)))
    return run(calls, tmp_path_factory.mktemp("varlen_exact"), hopper=True)


def emulated_steps(c: dict, problem: Problem):
    """``[(step, kernel, emulated)]`` of one audited exact run, as ``verify.l2`` pairs them,
    a partial compared on the rows of its chain's sequence only."""
    out = c["out"]
    schedule = build_schedule(problem, c["kwargs"]["schedule"], 1)
    assert out["fingerprint"] == schedule.fingerprint() and out["exact"]
    assert out["flush_subnormals"]  # red.add flushes: the interpreter's adds do not, so
    for x in (out["partials"], out["dq_acc"]):  # there must be nothing to flush
        assert torch.equal(flush_subnormals_f32(x), x)
    arithmetic = EXACT.with_dq_adds(flush_subnormals=True)
    emu = backward(schedule, c["q"], c["k"], c["v"], out["o"], out["lse"], c["do"],
                   return_partials=True, arithmetic=arithmetic,
                   softcap=c["kwargs"].get("softcap", 0.0))
    rows = torch.tensor([len(problem.rows(i, chain.b)) for _, chain in schedule.chains()
                         for i in chain.visits])
    real = torch.arange(problem.block_m)[None, :] < rows[:, None]
    steps = [("D", out["delta"], delta(arithmetic, out["o"], c["do"])),
             ("partials", out["partials"][real], emu.partials[real]),
             ("dq_acc", out["dq_acc"], emu.dq_acc)]
    if problem.heads == problem.heads_kv:
        steps += [("dk_acc", out["dk_heads"], emu.dk_acc), ("dv_acc", out["dv_heads"],
                                                            emu.dv_acc)]
    return steps + [("dq", out["dq"], emu.dq), ("dk", out["dk"], emu.dk),
                    ("dv", out["dv"], emu.dv)]


@pytest.mark.parametrize("index", range(len(EXACT_CASES)),
                         ids=[f"{m}-{s}-{str(t)[6:]}-H{h}:{hk}-d{d}"
                              for m, s, t, h, hk, d in EXACT_CASES])
def test_exact_varlen_backward_is_the_emulators_bit_for_bit(exact_runs, index):
    mask, _, dtype, h, hk, d = EXACT_CASES[index]
    c = exact_runs[index]
    block_m, block_n = backward_config(d).block_m, backward_config(d).block_n
    problem = Problem.packed(SEQLENS_Q, SEQLENS_K, h, hk, d, mask, block_m, block_n)
    steps = emulated_steps(c, problem)
    assert len(steps) == (8 if h == hk else 6)
    for name, got, want in steps:
        assert not got.isnan().any(), name  # every element written
        assert torch.equal(got, want), name


def test_the_harness_reproduces_the_rectangular_exact_kernel(exact_runs):
    c = exact_runs[len(EXACT_CASES)]
    d = c["q"].shape[-1]
    problem = Problem(2, 2, 1, 70, 150, d, "causal", backward_config(d).block_m,
                      backward_config(d).block_n)
    for name, got, want in emulated_steps(c, problem):
        assert torch.equal(got, want), name


def test_the_packed_forward_is_within_the_float64_bound(exact_runs):
    """Every sequence's ``O`` (and its exact gradients) against the float64 reference, each
    to its own bound; a sequence without keys gives ``O = 0`` and ``LSE2 = -inf``."""
    for index, (mask, _, dtype, *_) in enumerate(EXACT_CASES):
        c = exact_runs[index]
        out = c["out"]
        ref = attention_f64_packed(c["q"], c["k"], c["v"], c["do"], SEQLENS_Q, SEQLENS_K,
                                   causal=mask == "causal")
        for checks in packed_grad_checks({n: out[n] for n in ("o", "dq", "dk", "dv")}, ref,
                                         dtype):
            for check in checks.values():
                assert check.ok, (index, check)
        last = offsets(SEQLENS_Q)[-2:].tolist()
        assert torch.equal(out["o"][last[0]:last[1]], torch.zeros_like(out["o"][last[0]:]))
        assert (out["lse"][last[0]:last[1]] == -math.inf).all()


# -- packing invariance -------------------------------------------------------------------------
# (mask, schedule): portable schedules, lpt (made for ragged batches)
INVARIANCE_CASES = [("full", "naive"), ("causal", "lpt"), ("causal", "descending")]
ORDER = (3, 0, 5, 2, 1, 4)  # the sequences re-packed in this order, an extra one between
EXTRA = (45, 130)


def _split(x: torch.Tensor, lengths) -> list[torch.Tensor]:
    cu = offsets(lengths).tolist()
    return [x[cu[b]:cu[b + 1]] for b in range(len(lengths))]


@pytest.fixture(scope="module")
def invariance_runs(tmp_path_factory):
    dtype, h, hk, d = torch.bfloat16, 2, 1, 32
    tensors = packed_inputs(SEQLENS_Q, SEQLENS_K, h, hk, d, dtype, seed=7)
    extra = packed_inputs((EXTRA[0],), (EXTRA[1],), h, hk, d, dtype, seed=8)
    calls = []
    for mask, schedule in INVARIANCE_CASES:
        kw = dict(causal=mask == "causal", schedule=schedule)
        calls.append(varlen_call("passes_varlen", tensors, SEQLENS_Q, SEQLENS_K, **kw))
        # re-packed: another order, an unrelated sequence in the middle, larger max_seqlen
        order_q = [SEQLENS_Q[b] for b in ORDER[:3]] + [EXTRA[0]] + [
            SEQLENS_Q[b] for b in ORDER[3:]]
        order_k = [SEQLENS_K[b] for b in ORDER[:3]] + [EXTRA[1]] + [
            SEQLENS_K[b] for b in ORDER[3:]]
        repacked = []
        for n, x in enumerate(tensors):
            parts = _split(x, SEQLENS_K if n in (1, 2) else SEQLENS_Q)
            picked = [parts[b] for b in ORDER]
            repacked.append(torch.cat(picked[:3] + [extra[n]] + picked[3:]))
        calls.append(varlen_call("passes_varlen", repacked, order_q, order_k, max_q=300,
                                 max_k=400, **kw))
        # every sequence alone, rectangular, batch 1 (attention does not take lpt, which
        # adds in descending's orders)
        alone = dict(kw, schedule="descending" if schedule == "lpt" else schedule,
                     backend="triton")
        for b in range(len(SEQLENS_Q)):
            q, k, v, do = (_split(x, SEQLENS_K if n in (1, 2) else SEQLENS_Q)[b][None]
                           for n, x in enumerate(tensors))
            calls.append(dict(kind="passes", q=q, k=k, v=v, do=do,
                              kwargs=dict(num_workers=1, **alone)))
    # the autograd path (eager autograd function) of the first case
    calls.append(varlen_call("attention_varlen", tensors, SEQLENS_Q, SEQLENS_K,
                             causal=False, schedule="naive"))
    return run(calls, tmp_path_factory.mktemp("varlen_invariance"))


def _per_sequence(out: dict, seqlens_q, seqlens_k) -> list[dict]:
    names = ("o", "lse", "dq", "dk", "dv")
    parts = {n: _split(out[n], seqlens_k if n in ("dk", "dv") else seqlens_q) for n in names}
    return [{n: parts[n][b] for n in names} for b in range(len(seqlens_q))]


@pytest.mark.parametrize("index", range(len(INVARIANCE_CASES)),
                         ids=[f"{m}-{s}" for m, s in INVARIANCE_CASES])
def test_each_sequence_gets_its_batch_1_bits_whatever_else_is_packed(invariance_runs, index):
    per_case = 2 + len(SEQLENS_Q)
    packed, repacked, *alone = invariance_runs[index * per_case:(index + 1) * per_case]
    first = _per_sequence(packed["out"], SEQLENS_Q, SEQLENS_K)
    order_q = [SEQLENS_Q[b] for b in ORDER[:3]] + [EXTRA[0]] + [SEQLENS_Q[b] for b in ORDER[3:]]
    order_k = [SEQLENS_K[b] for b in ORDER[:3]] + [EXTRA[1]] + [SEQLENS_K[b] for b in ORDER[3:]]
    second = _per_sequence(repacked["out"], order_q, order_k)
    second = [second[n if n < 3 else n + 1] for n in range(len(ORDER))]  # without the extra
    for n, b in enumerate(ORDER):
        ran = alone[b]["out"]
        single = {name: ran[name][0] for name in ("o", "lse", "dq", "dk", "dv")}
        for name in single:
            assert not first[b][name].isnan().any(), (b, name)
            assert torch.equal(first[b][name], single[name]), (b, name, "packed")
            assert torch.equal(second[n][name], single[name]), (b, name, "re-packed")
    # not vacuous: the sequences differ, and one of them sees no key
    assert not torch.equal(first[0]["o"], first[4]["o"][:5])
    assert torch.equal(first[5]["o"], torch.zeros_like(first[5]["o"]))


def test_the_autograd_path_gives_the_passes_bits(invariance_runs):
    passes, autograd = invariance_runs[0]["out"], invariance_runs[-1]["out"]
    for name in ("o", "dq", "dk", "dv"):
        assert torch.equal(autograd[name], passes[name]), name
