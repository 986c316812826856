"""Logit softcap and learnable sinks on the Triton backend's GPU kernels.

- accuracy: ``O``, ``dQ``, ``dK``, ``dV`` and ``dsink`` within the float64 reference's bound
  (``verify.reference.attention_f64`` with ``softcap`` and ``learnable_sink``,
  ``grad_checks``: ``error_bound(dtype, name, 1) * M``), bf16 and fp16, d 64 and 128, GQA,
  ``S_q != S_k`` both ways (causal rows that see no key: ``O = 0``, ``LSE2`` the sink's);
  the capped outputs leave the uncapped reference's bound (the cap matters);
- the audit: the partials replayed in the schedule's dQ orders give the dQ accumulator bit
  for bit (L1);
- determinism: 100 runs give one bit pattern of ``O``, ``LSE2``, ``dQ``, ``dK``, ``dV`` and
  ``dsink``;
- a sink of -1e4 gives the no-sink bits (``exp2`` of it underflows to 0 against any score);
- ``torch.compile(fullgraph=True)`` of a model with softcap and a trainable sink gives the
  eager bits, ``dsink`` included; ``opcheck`` accepts both ops with a sink;
- ``exact=True`` with a softcap (d = 64, 192, 256) or sinks (d = 64, 256): every backward
  step, and ``dsink``, is the exact emulation (L2);
- ``backend="auto"`` runs softcap at d = 64 on Triton (the CuTe softcap is at 96 and 128)
  and sinks alone on CuTe where it is installed (``tests/gpu/test_cute_sinks.py`` tests them there).
"""

from __future__ import annotations

import pytest
import torch
from gpu_cases import inputs

import dash_cuda
from dash_cuda.ops import attention_backward_op, attention_op
from dash_ref import Mask, build_schedule
from dash_ref.arithmetic.steps import sink_logit
from dash_ref.emulate import replay
from verify.reference import attention_f64, grad_checks

TRITON = dict(backend="triton")
# (B, H, H_kv, S_q, S_k), d, dtype, causal
LAYOUTS = [((2, 4, 2, 300, 520), 64, torch.bfloat16, True),
           ((1, 2, 2, 333, 190), 128, torch.float16, True),  # rows 0..142 see no key
           ((1, 4, 1, 257, 257), 64, torch.float16, False)]
# (softcap, sinks: None or how to draw them)
FEATURES = [(30.0, None), (0.0, "mixed"), (50.0, "mixed")]


def sinks(kind, heads, dtype=torch.float32):
    if kind is None:
        return None
    gen = torch.Generator(device="cuda").manual_seed(heads)
    base = torch.randn(heads, device="cuda", generator=gen) * 2
    base[0], base[-1] = 12.0, -12.0  # far above and far below the scores
    return base.to(dtype)


def run(q, k, v, do, causal, softcap, sink, **kw):
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, softcap=softcap,
                                         learnable_sink=sink, _poison=True, **TRITON)
    got = dash_cuda.attention_backward(q, k, v, o, lse, do, causal=causal, softcap=softcap,
                                       learnable_sink=sink, _poison=True, **TRITON, **kw)
    return o, lse, got


@pytest.mark.parametrize("softcap, sink_kind", FEATURES)
@pytest.mark.parametrize("shape, d, dtype, causal", LAYOUTS)
def test_within_the_float64_bound(shape, d, dtype, causal, softcap, sink_kind):
    q, k, v, do = inputs(shape, d, dtype, seed=81)
    q = (q.float() * 12).to(dtype)  # scores large enough for the cap to bite
    sink = sinks(sink_kind, shape[1])
    o, lse, got = run(q, k, v, do, causal, softcap, sink)
    names = ("o", "dq", "dk", "dv") + (("dsink",) if sink is not None else ())
    out = dict(zip(names, (o, *got)))
    ref = attention_f64(q, k, v, do, causal, softcap=softcap, learnable_sink=sink)
    for check in grad_checks(out, ref, dtype).values():
        assert check.ok, check
    if softcap:
        uncapped = attention_f64(q, k, v, do, causal, learnable_sink=sink)
        assert not grad_checks({"o": o, "dq": got[0]}, uncapped, dtype)["dq"].ok
    s_q, s_k = q.shape[1], k.shape[1]
    sees = Mask.of(causal, (-1, -1)).visible(range(s_q), range(s_k), s_q, s_k).any(1).cuda()
    assert torch.isfinite(lse[:, sees]).all()
    if not sees.all():
        assert torch.equal(o[:, ~sees], torch.zeros_like(o[:, ~sees]))
        want = (sink_logit(sink).expand_as(lse[:, ~sees]) if sink is not None
                else torch.full_like(lse[:, ~sees], -float("inf")))
        assert torch.equal(lse[:, ~sees], want)


@pytest.mark.parametrize("schedule", ["naive", "descending", "shift"])
def test_dq_accumulator_equals_replay(schedule):
    shape, d = (1, 4, 2, 200, 330), 64
    q, k, v, do = inputs(shape, d, torch.bfloat16, seed=82)
    sink = sinks("mixed", 4)
    o, lse, got = run(q, k, v, do, True, 30.0, sink, audit=True, schedule=schedule,
                      num_workers=8)
    record = got[-1]
    assert len(got) == 5  # dQ, dK, dV, dsink, the record
    assert record.schedule.fingerprint() == build_schedule(record.schedule.problem, schedule,
                                                           8).fingerprint()
    acc = replay(record.schedule, record.partials.cpu(),
                 flush_subnormals=record.flush_subnormals)
    assert torch.equal(record.dq_acc.cpu(), acc)


@pytest.mark.parametrize("sink_dtype", [torch.float32, torch.bfloat16])
def test_one_bit_pattern_in_100_runs(sink_dtype):
    q, k, v, do = inputs((2, 4, 2, 384, 512), 64, torch.bfloat16, seed=83)
    sink = sinks("mixed", 4, sink_dtype)
    o, lse, got = run(q, k, v, do, True, 30.0, sink)
    first = (o, lse, *got)
    assert got[3].dtype == sink_dtype
    for _ in range(99):
        o, lse, got = run(q, k, v, do, True, 30.0, sink)
        for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV", "dsink"), first, (o, lse, *got)):
            assert torch.equal(a, b), name


def test_a_very_negative_sink_gives_the_no_sink_bits():
    q, k, v, do = inputs((1, 4, 2, 256, 300), 128, torch.float16, seed=84)
    base = run(q, k, v, do, False, 0.0, None)
    sunk = run(q, k, v, do, False, 0.0, torch.full((4,), -1e4, device="cuda"))
    for name, a, b in zip(("O", "LSE2", "dQ", "dK", "dV"), (*base[:2], *base[2]),
                          (*sunk[:2], *sunk[2][:3])):
        assert torch.equal(a, b), name
    assert torch.equal(sunk[2][3], torch.zeros(4, device="cuda"))


class CappedSinks(torch.nn.Module):
    def __init__(self, heads: int, backend: str):
        super().__init__()
        self.sink = torch.nn.Parameter(torch.linspace(-3, 3, heads))
        self.backend = backend

    def forward(self, q, k, v):
        x = dash_cuda.attention(q, k, v, causal=True, softcap=30.0, learnable_sink=self.sink,
                                backend=self.backend)
        return dash_cuda.attention(x, k, v, softcap=50.0, backend=self.backend)


def _train_step(model, q, k, v, do):
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    model.zero_grad(set_to_none=True)
    out = model(*leaves)
    out.backward(do)
    return [out.detach(), *(x.grad for x in leaves), model.sink.grad.clone()]


def test_compiled_model_gives_the_eager_bits():
    q, k, v, do = inputs((2, 4, 2, 384, 384), 64, torch.bfloat16, seed=85)
    model = CappedSinks(4, "auto").cuda()  # auto: Triton, the backend with both
    eager = _train_step(model, q, k, v, do)
    compiled = _train_step(torch.compile(model, fullgraph=True), q, k, v, do)
    for name, a, b in zip(("O", "dQ", "dK", "dV", "dsink"), eager, compiled):
        assert torch.equal(a, b), f"{name} differs between eager and compiled"
    assert eager[-1].dtype == torch.float32 and bool(eager[-1].abs().sum() > 0)


def test_opcheck_accepts_both_ops_with_a_sink():
    q, k, v, do = inputs((1, 2, 1, 200, 328), 64, torch.bfloat16, seed=86)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    sink = torch.tensor([0.5, -1.0], device="cuda", requires_grad=True)
    args = (q, k, v, sink, True, 0.125, "naive", True, False, None, False, "triton",
            [-1, -1], 30.0)
    torch.library.opcheck(attention_op, args)
    o, lse = attention_op(*args)
    torch.library.opcheck(attention_backward_op,
                          (q.detach(), k.detach(), v.detach(), o.detach(), lse, do,
                           sink.detach(), True, 0.125, "naive", True, False, None, False,
                           "triton", [-1, -1], 30.0))


def test_auto_runs_softcap_on_triton_and_sinks_on_cute():
    from dash_cuda.backends import get_backend
    from dash_cuda.ops import resolve_backend
    from dash_cuda.options import Options

    q, *_ = inputs((1, 2, 2, 64, 64), 64, torch.bfloat16, seed=87)
    options = Options.checked(64, softcap=30.0)
    assert resolve_backend(q, options).name == "triton"
    assert resolve_backend(q, options, sink=True).name == "triton"
    cute = "triton" if get_backend("cute").missing() else "cute"
    assert resolve_backend(q, Options.checked(64), sink=True).name == cute


@pytest.mark.parametrize("shape, d, dtype, causal", [
    ((1, 4, 2, 300, 520), 64, torch.bfloat16, True),
    ((2, 8, 8, 256, 256), 256, torch.bfloat16, True),  # Gemma 2's head dim
    ((1, 2, 2, 200, 333), 192, torch.float16, False)])
def test_exact_with_a_softcap_is_the_emulation_bit_for_bit(shape, d, dtype, causal):
    """``exact=True`` with softcap 50: every step of the audited backward, the ratio form's
    cap and slope included, is ``dash_ref``'s exact emulation (L2)."""
    from verify.l2 import first_difference, record_steps

    q, k, v, do = inputs(shape, d, dtype, seed=47)
    q = (q.float() * 3).to(dtype)  # scores that reach the cap
    o, lse = dash_cuda.attention_forward(q, k, v, causal=causal, softcap=50.0, **TRITON)
    dq, dk, dv, record = dash_cuda.attention_backward(
        q, k, v, o, lse, do, causal=causal, softcap=50.0, exact=True, audit=True,
        _poison=True, **TRITON)
    assert record.exact
    steps = record_steps(record, (q, k, v, o, lse, do), (dq, dk, dv), softcap=50.0)
    assert first_difference(steps) is None
    uncapped = record_steps(record, (q, k, v, o, lse, do), (dq, dk, dv))
    assert first_difference(uncapped) is not None  # the cap's steps are what matched


@pytest.mark.parametrize("shape, d, dtype", [((2, 4, 2, 1500, 700), 64, torch.bfloat16),
                                             ((1, 8, 8, 600, 600), 256, torch.float16)])
def test_exact_with_sinks_is_the_emulation_bit_for_bit_dsink_included(shape, d, dtype):
    """``exact=True`` with learnable sinks: every backward step and ``dsink`` (its lanes and
    pairwise tree) are ``dash_ref``'s exact emulation (L2)."""
    from verify.l2 import first_difference, record_steps

    q, k, v, do = inputs(shape, d, dtype, seed=48)
    sink = torch.randn(shape[1], device="cuda") * 4
    o, lse = dash_cuda.attention_forward(q, k, v, causal=True, learnable_sink=sink, **TRITON)
    dq, dk, dv, dsink, record = dash_cuda.attention_backward(
        q, k, v, o, lse, do, causal=True, learnable_sink=sink, exact=True, audit=True,
        _poison=True, **TRITON)
    steps = record_steps(record, (q, k, v, o, lse, do), (dq, dk, dv, dsink),
                         learnable_sink=sink)
    assert steps[-1][0] == "dsink" and first_difference(steps) is None
