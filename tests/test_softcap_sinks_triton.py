"""Logit softcap and learnable sinks on the Triton kernels, run in Triton's CPU interpreter
through dash_cuda's own call path (``tests/triton_interpreter.py``, with the GPU's rounding
models: ``hopper=True``), and their plumbing (checks, custom ops, autograd) on the CPU.

- **Accuracy.** The default arithmetic is not emulated bit for bit (``docs/design.md``
  section 5), so ``O`` and ``dQ``, ``dK``, ``dV``, ``dsink`` are held to the float64
  reference's bound (``verify.reference.grad_checks``: ``error_bound(dtype, name, 1) * M``,
  ``verify.highprec``), with softcap 5, 30 and 50 on scores large enough for the cap to
  bite (the same outputs leave the bound of the uncapped reference: the check can fail),
  sinks far above and below the scores, causal, full and windowed masks, GQA, ``S_q !=
  S_k`` both ways (rows that see no key), and a packed batch.
- **LSE2** includes the sink: a row that sees no key has ``O = 0`` and ``LSE2 =
  fp32(sink * log2 e)`` exactly; the others are within ``2^-12 max(1, |LSE2|)`` of the
  float64 value (fp32 arithmetic on exact products and the MUFU models, far inside).
- **dsink** is one kernel for every backend and arithmetic: from the run's ``LSE2`` and
  ``D``, the fast and the exact arithmetics' ``sink_grad`` give its bits (its lanes,
  ``exp2_fma`` and pairwise tree), on the default path as with ``exact=True``.
- **The audit** partials replay to the dQ accumulator bit for bit (the replay does not
  depend on the arithmetic).
- **Limits that hold exactly**: a sink of -1e4 (``exp2`` of it underflows to 0 against
  any score) gives the no-sink bits of ``O``, of ``LSE2`` on rows that see a key and of
  every gradient, and ``dsink = 0``; a softcap of 1e6 is not bit-equal to none (its
  division and multiplication round) but within the uncapped reference's bound.
- **Autograd**: ``dash_cuda.attention``'s ``dsink`` (through the eager autograd function)
  is the bits of :func:`dash_cuda.attention_backward`'s, in the sink's dtype.

Outputs are poisoned with NaN before each run; inputs are fresh seeded draws; the
persistent backward runs on one worker (interpreted programs run one after another).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import dash_cuda
from dash_cuda.backends import Case, choose_backend, get_backend
from dash_cuda.ops import attention_op
from dash_ref import Mask, Problem, build_schedule
from dash_ref.arithmetic.steps import sink_logit
from verify.reference import attention_f64, attention_f64_packed, grad_checks, packed_grad_checks

F16, BF16 = torch.float16, torch.bfloat16
LOG2E = 1.4426950408889634
NO_KEYS = "rows that see no key"

# (name, causal, window_size, S_q, S_k, H, H_kv, d, dtype, amplitude of q, softcap, sinks,
#  schedule); sinks are natural-log logits per query head, None for none
CASES = [
    ("cap5-causal-gqa", True, (-1, -1), 70, 90, 2, 1, 16, BF16, 3.0, 5.0, None, "naive"),
    ("cap30-full-sinks", False, (-1, -1), 100, 60, 2, 2, 32, F16, 12.0, 30.0,
     (2.0, -3.0), "spt"),
    ("cap50-window-big-sinks", False, (40, 10), 130, 130, 2, 1, 16, BF16, 15.0, 50.0,
     (25.0, -25.0), "banded"),
    ("sinks-causal-no-keys", True, (-1, -1), 90, 50, 4, 2, 16, F16, 1.0, 0.0,
     (3.0, -1.0, 0.0, 9.5), "descending"),
]
NAMES = [c[0] for c in CASES]


def inputs(case, seed):
    _, _, _, s_q, s_k, h, hk, d, dtype, amp, *_ = case
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(*shape, generator=gen)
                   for shape in ((1, s_q, h, d), (1, s_k, hk, d), (1, s_k, hk, d),
                                 (1, s_q, h, d)))
    return (q * amp).to(dtype), k.to(dtype), v.to(dtype), do.to(dtype)


def features(case):
    cap, sinks = case[10], case[11]
    out = {}
    if cap:
        out["softcap"] = cap
    if sinks is not None:
        out["learnable_sink"] = torch.tensor(sinks, dtype=torch.float32)
    return out


def passes(tensors, audit=True, **kwargs):
    q, k, v, do = tensors
    return dict(kind="passes", q=q, k=k, v=v, do=do, audit=audit,
                kwargs=dict(num_workers=1, backend="triton", **kwargs))


def grads_of(out, sink: bool):
    return {n: out[n] for n in ("o", "dq", "dk", "dv") + (("dsink",) if sink else ())}


PACKED_Q, PACKED_K = (37, 0, 64, 20), (50, 12, 64, 9)
VERY_NEGATIVE = -1e4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    calls = []
    for n, case in enumerate(CASES):
        tensors = inputs(case, seed=500 + n)
        calls.append(passes(tensors, causal=case[1], window_size=case[2], schedule=case[12],
                            **features(case)))
    # autograd through dash_cuda.attention, on the sinks case (dsink via the autograd fn)
    case = CASES[1]
    tensors = inputs(case, seed=501)
    q, k, v, do = tensors
    calls.append(dict(kind="attention", q=q, k=k, v=v, do=do,
                      kwargs=dict(num_workers=1, backend="triton", schedule=case[12],
                                  **features(case))))
    # limits: a very negative sink, and a huge cap, against none (causal, S_q > S_k)
    gen = torch.Generator().manual_seed(777)
    plain = tuple(torch.randn(*s, generator=gen).to(BF16)
                  for s in ((1, 80, 2, 16), (1, 60, 2, 16), (1, 60, 2, 16), (1, 80, 2, 16)))
    calls.append(passes(plain, causal=True, schedule="naive"))
    calls.append(passes(plain, causal=True, schedule="naive",
                        learnable_sink=torch.full((2,), VERY_NEGATIVE).to(BF16)))
    calls.append(passes(plain, causal=True, schedule="naive", softcap=1e6))
    # a packed batch with softcap and sinks (an empty sequence among them)
    gen = torch.Generator().manual_seed(778)
    total_q, total_k = sum(PACKED_Q), sum(PACKED_K)
    pq, pk, pv, pdo = (torch.randn(*s, generator=gen).to(F16)
                       for s in ((total_q, 2, 16), (total_k, 1, 16), (total_k, 1, 16),
                                 (total_q, 2, 16)))
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32)
          for x in (PACKED_Q, PACKED_K)]
    calls.append(dict(kind="attention_varlen", q=pq * 4, k=pk, v=pv, do=pdo,
                      cu_seqlens_q=cu[0], cu_seqlens_k=cu[1], max_seqlen_q=max(PACKED_Q),
                      max_seqlen_k=max(PACKED_K),
                      kwargs=dict(num_workers=1, backend="triton", causal=True, softcap=20.0,
                                  schedule="lpt",
                                  learnable_sink=torch.tensor([1.0, -4.0]))))
    pytest.importorskip("triton.runtime.interpreter")
    from triton_interpreter import run

    return run(calls, tmp_path_factory.mktemp("softcap_sinks"), hopper=True)


def _reference(c, case):
    return attention_f64(c["q"], c["k"], c["v"], c["do"], case[1], window_size=case[2],
                         **features(case))


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_within_the_float64_bound(runs, index):
    c, case = runs[index], CASES[index]
    out = c["out"]
    sink = case[11] is not None
    for name, x in grads_of(out, sink).items():
        assert not x.isnan().any(), name  # every element written (outputs were poisoned)
    for check in grad_checks(grads_of(out, sink), _reference(c, case), case[8]).values():
        assert check.ok, check
    if sink:
        assert out["dsink"].dtype == torch.float32 and out["dsink"].shape == (case[5],)


SINK_CASES = [i for i, c in enumerate(CASES) if c[11] is not None]


@pytest.mark.parametrize("index", SINK_CASES, ids=[NAMES[i] for i in SINK_CASES])
def test_dsink_is_the_kernel_arithmetics_sum_bit_for_bit(runs, index):
    """The default path's ``dsink`` is the sink kernel's written-down sum: ``dash_ref``'s
    ``sink_grad`` in the fast and the exact arithmetic (``sink_order="lanes"``), fed the
    run's ``LSE2`` and audited ``D``, gives its bits."""
    from dash_ref.arithmetic.steps import EXACT, FAST, sink_grad

    out, heads = runs[index]["out"], CASES[index][5]
    sink2 = sink_logit(torch.tensor(CASES[index][11], dtype=torch.float32))
    rows = [out[n].reshape(-1, heads) for n in ("lse", "delta")]
    for a in (FAST, EXACT):
        assert torch.equal(sink_grad(a, sink2, *rows, CASES[index][3]), out["dsink"]), a.name


@pytest.mark.parametrize("index", [i for i, c in enumerate(CASES) if c[10]],
                         ids=[c[0] for c in CASES if c[10]])
def test_the_cap_matters_the_uncapped_reference_rejects_the_outputs(runs, index):
    """The capped outputs leave the uncapped reference's bound: a kernel that dropped the
    cap (or its ``1 - tanh^2``) could not pass :func:`test_within_the_float64_bound`."""
    c, case = runs[index], CASES[index]
    uncapped = attention_f64(c["q"], c["k"], c["v"], c["do"], case[1], window_size=case[2],
                             learnable_sink=features(case).get("learnable_sink"))
    checks = grad_checks(grads_of(c["out"], False), uncapped, case[8])
    assert not checks["o"].ok and not checks["dq"].ok and not checks["dk"].ok


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_lse2_includes_the_sink_and_rows_without_keys_get_it_exactly(runs, index):
    c, case = runs[index], CASES[index]
    _, causal, window, s_q, s_k, h, *_ = case
    out = c["out"]
    lse = out["lse"][0].double()  # (S_q, H)
    scale = 1 / math.sqrt(case[7])
    s = torch.einsum("qhd,khd->hqk", c["q"][0].double(),
                     c["k"][0].double().repeat_interleave(h // case[6], 1)) * scale
    if case[10]:
        s = case[10] * torch.tanh(s / case[10])
    rule = Mask.of(causal, window)
    seen = rule.visible(range(s_q), range(s_k), s_q, s_k)
    s = s.masked_fill(~seen, -math.inf)
    if case[11] is not None:
        sinks = torch.tensor(case[11], dtype=torch.float64)
        s = torch.cat([s, sinks[:, None, None].expand(h, s_q, 1)], dim=2)
    want = (torch.logsumexp(s, dim=2) * LOG2E).T  # (S_q, H), base 2
    sees = seen.any(1)
    assert torch.isfinite(lse[sees]).all()
    err = (lse[sees] - want[sees]).abs()
    assert (err <= 2 ** -12 * want[sees].abs().clamp(min=1)).all(), float(err.max())
    if not sees.all():  # the case with S_q > S_k under causal has them
        o = out["o"][0][~sees]
        assert torch.equal(o, torch.zeros_like(o))
        assert case[11] is not None  # NO_KEYS rows of this case: LSE2 is the sink's
        sink2 = sink_logit(torch.tensor(case[11]))
        assert torch.equal(out["lse"][0][~sees], sink2.expand(int((~sees).sum()), h))


@pytest.mark.parametrize("index", range(len(CASES)), ids=NAMES)
def test_the_audit_partials_replay_to_the_dq_accumulator(runs, index):
    c, case = runs[index], CASES[index]
    _, causal, window, s_q, s_k, h, hk, d, *_ = case
    problem = dash_cuda.backward_problem(1, h, hk, s_q, s_k, d, causal, window_size=window)
    out = c["out"]
    schedule = build_schedule(problem, case[12], 1)
    assert out["fingerprint"] == schedule.fingerprint()
    from dash_ref.emulate import replay

    acc = replay(schedule, out["partials"], flush_subnormals=out["flush_subnormals"])
    assert torch.equal(out["dq_acc"], acc)


def test_autograd_gives_the_backward_passes_bits(runs):
    """``dash_cuda.attention(...).backward`` (the eager autograd function) returns the
    sinks' gradient, the bits of ``attention_backward``'s, as it does for dQ, dK, dV."""
    passes_out, autograd_out = runs[1]["out"], runs[len(CASES)]["out"]
    for name in ("o", "dq", "dk", "dv", "dsink"):
        assert torch.equal(autograd_out[name], passes_out[name]), name


def test_a_very_negative_sink_gives_the_no_sink_bits(runs):
    base, sunk = runs[len(CASES) + 1]["out"], runs[len(CASES) + 2]["out"]
    for name in ("o", "dq", "dk", "dv"):
        assert torch.equal(sunk[name], base[name]), name
    sees = Mask("causal").visible(range(80), range(60), 80, 60).any(1)
    assert not sees.all()  # rows without keys: LSE2 is the sink's instead of -inf
    assert torch.equal(sunk["lse"][0][sees], base["lse"][0][sees])
    sink2 = sink_logit(torch.full((2,), VERY_NEGATIVE).to(BF16))
    assert torch.equal(sunk["lse"][0][~sees], sink2.expand(int((~sees).sum()), 2))
    assert sunk["dsink"].dtype == BF16 and torch.equal(sunk["dsink"], torch.zeros(2, dtype=BF16))


def test_a_huge_cap_is_close_to_none_but_not_its_bits(runs):
    c, base, capped = runs[len(CASES) + 1], runs[len(CASES) + 1]["out"], \
        runs[len(CASES) + 3]["out"]
    ref = attention_f64(c["q"], c["k"], c["v"], c["do"], True)
    for check in grad_checks(grads_of(capped, False), ref, BF16).values():
        assert check.ok, check
    assert not all(torch.equal(capped[n], base[n]) for n in ("o", "lse", "dq", "dk", "dv"))


def test_a_packed_batch_with_softcap_and_sinks_is_within_every_sequences_bound(runs):
    c = runs[-1]
    out, kw = c["out"], c["kwargs"]
    ref = attention_f64_packed(c["q"], c["k"], c["v"], c["do"], PACKED_Q, PACKED_K, True,
                               softcap=kw["softcap"], learnable_sink=kw["learnable_sink"])
    got = grads_of(out, True)
    for checks in packed_grad_checks(got, ref, F16):
        for check in checks.values():
            assert check.ok, check
    check = grad_checks({"dsink": got["dsink"]}, ref, F16)["dsink"]
    assert check.ok, check


# -- refused in one line, before any CUDA check ----------------------------------------------
def _one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text
    return text


def _qkv(h=2):
    q = torch.randn(1, 8, h, 16, dtype=BF16)
    return q, q.clone(), q.clone()


# -- exact=True with a softcap: L2 on the CPU --------------------------------------------------
# (name, causal, S_q, S_k, H, H_kv, d, dtype, amplitude of q, softcap, schedule)
EXACT_CAPPED = [
    ("cap30-causal-gqa", True, 90, 120, 2, 1, 32, BF16, 8.0, 30.0, "descending"),
    ("cap50-full-d256", False, 70, 60, 2, 2, 256, F16, 3.0, 50.0, "shift"),
    ("cap5-causal-rows-without-keys", True, 100, 40, 2, 2, 16, BF16, 3.0, 5.0, "naive"),
]


@pytest.fixture(scope="module")
def exact_capped_runs(tmp_path_factory):
    calls = []
    for n, (_, causal, s_q, s_k, h, hk, d, dtype, amp, cap, schedule) in enumerate(
            EXACT_CAPPED):
        case = (None, causal, (-1, -1), s_q, s_k, h, hk, d, dtype, amp)
        calls.append(passes(inputs(case, seed=600 + n), causal=causal, schedule=schedule,
                            softcap=cap, exact=True))
    # a packed batch (an empty sequence among them), the same steps per sequence
    from test_varlen_triton import SEQLENS_K, SEQLENS_Q, packed_inputs, varlen_call

    tensors = packed_inputs(SEQLENS_Q, SEQLENS_K, 2, 1, 32, BF16, seed=650)
    tensors = ((tensors[0].float() * 8).to(BF16), *tensors[1:])
    calls.append(varlen_call("passes_varlen", tensors, SEQLENS_Q, SEQLENS_K, audit=True,
                             causal=True, schedule="lpt", exact=True, softcap=30.0,
                             backend="triton"))
    # sinks with exact=True: two batches of more rows than the sum's lanes (1024), so lanes
    # restart per batch and take several rows each; sinks far above and below the scores
    gen = torch.Generator().manual_seed(660)
    long = tuple(torch.randn(*s, generator=gen).to(BF16)
                 for s in ((2, 1100, 2, 16), (2, 30, 1, 16), (2, 30, 1, 16), (2, 1100, 2, 16)))
    calls.append(passes(long, causal=False, schedule="naive", exact=True,
                        learnable_sink=torch.tensor([6.0, -3.0])))
    calls.append(varlen_call("passes_varlen", tensors, SEQLENS_Q, SEQLENS_K, audit=True,
                             causal=True, schedule="descending", exact=True,
                             learnable_sink=torch.tensor([0.5, -8.0]), backend="triton"))
    pytest.importorskip("triton.runtime.interpreter")
    from triton_interpreter import run

    return run(calls, tmp_path_factory.mktemp("softcap_exact"), hopper=True)


@pytest.mark.parametrize("index", range(len(EXACT_CAPPED)), ids=[c[0] for c in EXACT_CAPPED])
def test_the_exact_capped_backward_is_the_emulators_bit_for_bit(exact_capped_runs, index):
    """``exact=True`` with a softcap: every step of the audited backward, the ratio form's
    cap and slope included, is ``dash_ref``'s exact emulation (fed the kernel's O and LSE2);
    the emulation without the cap differs, so the cap's steps are compared."""
    from test_varlen_triton import emulated_steps

    _, causal, s_q, s_k, h, hk, d, *_ = EXACT_CAPPED[index]
    c = exact_capped_runs[index]
    problem = dash_cuda.backward_problem(1, h, hk, s_q, s_k, d, causal)
    steps = emulated_steps(c, problem)
    for name, got, want in steps:
        assert not got.isnan().any(), name
        assert torch.equal(got, want), name
    uncapped = dict(c, kwargs={k: v for k, v in c["kwargs"].items() if k != "softcap"})
    assert not torch.equal(emulated_steps(uncapped, problem)[-3][2], c["out"]["dq"])


def test_the_exact_capped_packed_backward_is_the_emulators_bit_for_bit(exact_capped_runs):
    from test_varlen_triton import SEQLENS_K, SEQLENS_Q, emulated_steps

    from dash_cuda.backends.triton.config import backward_config

    cfg = backward_config(32)
    problem = Problem.packed(SEQLENS_Q, SEQLENS_K, 2, 1, 32, "causal", cfg.block_m,
                             cfg.block_n)
    for name, got, want in emulated_steps(exact_capped_runs[len(EXACT_CAPPED)], problem):
        assert not got.isnan().any(), name
        assert torch.equal(got, want), name


@pytest.mark.parametrize("packed", [False, True], ids=["rectangular", "packed"])
def test_exact_sinks_give_the_emulators_dsink_and_backward_bit_for_bit(exact_capped_runs,
                                                                       packed):
    """``exact=True`` with sinks: every backward step (LSE2 carries the sinks) and ``dsink``,
    its lanes and pairwise tree included, are ``dash_ref``'s exact emulation; the IEEE
    arithmetic's row-by-row order gives other ``dsink`` bits, so the order is compared."""
    from test_varlen_triton import SEQLENS_K, SEQLENS_Q, emulated_steps

    from dash_cuda.backends.triton.config import backward_config
    from dash_ref.emulate import backward
    from verify.l2 import first_difference, l2_steps

    c = exact_capped_runs[len(EXACT_CAPPED) + 1 + packed]
    sink = c["kwargs"]["learnable_sink"]
    cfg = backward_config(c["q"].shape[-1])
    if packed:
        problem = Problem.packed(SEQLENS_Q, SEQLENS_K, 2, 1, 32, "causal", cfg.block_m,
                                 cfg.block_n)
    else:
        problem = dash_cuda.backward_problem(2, 2, 1, 1100, 30, 16, False)
    for name, got, want in emulated_steps(c, problem):
        assert not got.isnan().any(), name
        assert torch.equal(got, want), name
    out = c["out"]
    schedule = build_schedule(problem, c["kwargs"]["schedule"], 1)
    inputs_ = (c["q"], c["k"], c["v"], out["o"], out["lse"], c["do"])
    steps = l2_steps(schedule, inputs_, out, arithmetic="exact", learnable_sink=sink)
    assert steps[-1][0] == "dsink" and first_difference(steps) is None  # verify.l2's view
    ieee = backward(schedule, *inputs_, arithmetic="ieee", learnable_sink=sink)
    if not packed:  # 1100 rows: the orders' roundings differ
        assert not torch.equal(ieee.dsink, out["dsink"])


@pytest.mark.parametrize("index", range(len(EXACT_CAPPED)), ids=[c[0] for c in EXACT_CAPPED])
def test_the_exact_capped_outputs_are_within_the_float64_bound(exact_capped_runs, index):
    _, causal, *_, dtype, _, cap, _ = EXACT_CAPPED[index]
    c = exact_capped_runs[index]
    got = grads_of(c["out"], sink=False)
    ref = attention_f64(c["q"], c["k"], c["v"], c["do"], causal, softcap=cap)
    for name, check in grad_checks(got, ref, dtype).items():
        assert check.ok, (name, check)
    uncapped = attention_f64(c["q"], c["k"], c["v"], c["do"], causal)
    assert not all(x.ok for x in grad_checks(got, uncapped, dtype).values())


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, "5", True])
def test_bad_softcaps_are_refused_by_name(value):
    for fn in (dash_cuda.attention, dash_cuda.attention_forward):
        with pytest.raises(ValueError) as info:
            fn(*_qkv(), softcap=value)
        assert _one_line(info).startswith("softcap must be a finite number >= 0")


@pytest.mark.parametrize("value, error, words", [
    (torch.zeros(3), ValueError, "shape (2,)"),
    (torch.zeros(2, 1), ValueError, "shape (2,)"),
    (torch.zeros(2, dtype=torch.float64), TypeError, "float32, bfloat16 or float16"),
    (torch.zeros(2, dtype=torch.int32), TypeError, "float32, bfloat16 or float16"),
    ([0.0, 0.0], TypeError, "torch.Tensor"),
    (torch.zeros(2, device="meta"), ValueError, "learnable_sink: meta"),
])
def test_bad_sinks_are_refused_by_name(value, error, words):
    for fn in (dash_cuda.attention, dash_cuda.attention_forward):
        with pytest.raises(error) as info:
            fn(*_qkv(), learnable_sink=value)
        text = _one_line(info)
        assert "learnable_sink" in text and words in text


def test_exact_takes_softcap_and_sinks():
    for kw in (dict(softcap=30.0), dict(learnable_sink=torch.zeros(2))):
        with pytest.raises(ValueError, match="needs CUDA tensors"):  # past every other check
            dash_cuda.attention(*_qkv(), exact=True, **kw)
    q = torch.randn(10, 2, 16, dtype=BF16)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.attention_varlen(q, q, q, cu, cu, 10, 10, softcap=5.0, exact=True)


def test_good_values_pass_the_checks_and_reach_the_cuda_check():
    for kw in (dict(softcap=0.0), dict(softcap=30), dict(learnable_sink=torch.zeros(2)),
               dict(learnable_sink=torch.zeros(2, dtype=F16), softcap=1e6)):
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            dash_cuda.attention(*_qkv(), **kw)
    q = torch.randn(10, 2, 16, dtype=BF16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        dash_cuda.flash_attn_varlen_func(q, q, q, cu, cu, 6, 6, softcap=30.0,
                                         learnable_sink=torch.zeros(2))


def test_both_backends_run_softcap_and_sinks_and_auto_chooses_cute():
    """Softcap and learnable sinks run on both backends (CuTe caps its scores and folds the
    sinks into its forward), so ``"auto"`` takes such calls to CuTe where it is installed
    and supports the rest of the call; ``exact=True`` stays Triton's."""
    from dash_cuda.backends import _lacks_feature

    for backend in ("cute", "triton"):
        chosen = get_backend(backend)
        for case in (Case(128, BF16, False, True, softcap=True),
                     Case(128, BF16, False, True, sink=True),
                     Case(128, BF16, False, True, softcap=True, sink=True)):
            assert _lacks_feature(chosen, case) is None, (backend, case)
    if get_backend("cute").missing() is None:
        assert choose_backend("auto", Case(128, BF16, False, True, softcap=True)).name == "cute"
    # at head dim 64 a softcap runs on Triton (the CuTe backward would serialize its wgmmas)
    assert "softcap at head dim 64" in get_backend("cute").unsupported(
        Case(64, BF16, False, True, softcap=True))
    assert choose_backend("auto", Case(64, BF16, False, True, softcap=True)).name == "triton"
    exact = Case(64, BF16, True, True, softcap=False)
    assert choose_backend("auto", exact).name == "triton"


def test_every_shipped_cute_forward_has_its_sink_twin():
    """A sink call never compiles on demand: each shipped forward, rectangular and packed,
    ships with sinks too, under a name that says so; the backward has no sink variant."""
    from dataclasses import replace

    from dash_cuda.backends.cute.variants import ForwardVariant, shipped_variants

    forwards = [v for v in shipped_variants() if isinstance(v, ForwardVariant)]
    plain = {v for v in forwards if not v.sinks}
    sunk = {v for v in forwards if v.sinks}
    assert plain and {replace(v, sinks=True) for v in plain} == sunk
    assert all("_sink_" in v.name for v in sunk) and not any("sink" in v.name for v in plain)


def test_every_shipped_cute_variant_has_its_softcap_twin():
    """A softcap call never compiles on demand: each shipped forward and backward ships
    with a softcap too, under a name that says so."""
    from dataclasses import replace

    from dash_cuda.backends.cute.config import SOFTCAP_HEAD_DIMS
    from dash_cuda.backends.cute.variants import shipped_variants

    shipped = shipped_variants()
    plain = {v for v in shipped if not v.softcap}
    capped = {v for v in shipped if v.softcap}
    assert plain and {replace(v, softcap=True) for v in plain
                      if v.head_dim in SOFTCAP_HEAD_DIMS} == capped
    assert all("_cap_" in v.name for v in capped) and not any("_cap_" in v.name
                                                               for v in plain)


# -- the custom ops: the sinks' gradient through autograd, and tracing -----------------------
def _meta(*shape, grad=False, dtype=BF16):
    return torch.randn(*shape, device="meta", dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize("sink_dtype", [torch.float32, BF16])
def test_the_op_autograd_gives_the_sink_a_gradient_of_its_dtype(sink_dtype):
    q, k, v = _meta(2, 40, 4, 64, grad=True), _meta(2, 50, 2, 64, grad=True), \
        _meta(2, 50, 2, 64, grad=True)
    sink = _meta(4, grad=True, dtype=sink_dtype)
    o, lse = attention_op(q, k, v, sink, True, 0.125, "auto", True, False, None, False,
                          "auto", [-1, -1], 30.0)
    assert o.requires_grad and not lse.requires_grad
    o.float().sum().backward()
    assert sink.grad.shape == (4,) and sink.grad.dtype == sink_dtype
    for x in (q, k, v):
        assert x.grad.shape == x.shape


class CappedSinks(torch.nn.Module):
    def forward(self, q, k, v, sink):
        return dash_cuda.attention(q, k, v, causal=True, softcap=30.0, learnable_sink=sink)


def test_a_model_with_softcap_and_sinks_traces_into_one_graph():
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with FakeTensorMode(allow_non_fake_inputs=True):  # CUDA tensors without a GPU
        q = torch.randn(2, 300, 4, 64, device="cuda", dtype=BF16)
        k = torch.randn(2, 200, 2, 64, device="cuda", dtype=BF16)
        sink = torch.randn(4, device="cuda")
        out = torch.compile(CappedSinks(), fullgraph=True, backend=record)(q, k, k, sink)
    assert out.shape == q.shape
    (graph,) = graphs
    calls = [n.args for n in graph.graph.nodes if n.target is torch.ops.dash.attention.default]
    assert len(calls) == 1
    assert calls[0][3] is not None and calls[0][-1] == 30.0  # the sinks and the cap
