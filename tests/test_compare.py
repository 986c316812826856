"""Specification of the bit-for-bit comparator (verify.compare)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dash_ref import Problem, build_schedule
from dash_ref.emulate import emulate
from verify.compare import compare, dq_divergence, first_dq_mismatch, trace_dq
from verify.demo import random_inputs

INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def nudge(x: torch.Tensor, flat: list[int], ulps: list[int]) -> torch.Tensor:
    """Move chosen elements away from zero by a number of representable steps (finite, nonzero)."""
    y = x.clone().contiguous()
    bits = y.view(INT_VIEW[x.dtype]).reshape(-1)
    for f, u in zip(flat, ulps):
        bits[f] += u
    return y


@settings(max_examples=40, deadline=None)
@given(
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    shape=st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 3), st.integers(1, 8)),
    data=st.data(),
)
def test_report_counts_every_changed_element(dtype, shape, data):
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    a = (torch.rand(shape, generator=gen) + 0.5).to(dtype)  # positive, normal, away from max
    n = a.numel()
    flat = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=min(n, 6))))
    ulps = [data.draw(st.integers(1, 50)) for _ in flat]
    b = nudge(a, flat, ulps)
    rep = compare("x", a, b)
    assert rep.differing == len(flat)
    assert rep.equal == (not flat)
    if flat:
        assert rep.max_ulp == max(ulps)
        assert rep.first_index == tuple(int(i) for i in torch.unravel_index(
            torch.tensor(flat[0]), shape))
        assert "differ" in str(rep) and str(rep.first_index) in str(rep)
    else:
        assert "bitwise equal" in str(rep)


def test_signed_zeros_are_different_bits():
    a = torch.tensor([0.0, 1.0], dtype=torch.bfloat16)
    b = torch.tensor([-0.0, 1.0], dtype=torch.bfloat16)
    rep = compare("z", a, b)
    assert rep.differing == 1 and rep.first_index == (0,)


def test_shape_or_dtype_mismatch_is_an_error():
    with pytest.raises(ValueError, match="cannot compare"):
        compare("x", torch.ones(2), torch.ones(3))
    with pytest.raises(ValueError, match="cannot compare"):
        compare("x", torch.ones(2), torch.ones(2, dtype=torch.float16))


def test_divergence_names_the_step_where_two_schedules_part():
    p = Problem(1, 1, 1, 64, 64, 16, "full", 16, 16)
    q, k, v, do = random_inputs(p, torch.bfloat16, seed=0)
    runs = {}
    for name in ("naive", "shift"):
        s = build_schedule(p, name, 4)
        runs[name] = (s, emulate(s, q, k, v, do, return_partials=True)[1])
    (sa, ba), (sb, bb) = runs["naive"], runs["shift"]
    element = first_dq_mismatch(ba.dq_acc, bb.dq_acc)
    assert element is not None
    div = dq_divergence(sa, ba.partials, sb, bb.partials, element, ("naive", "shift"))
    # The traces end at the accumulators, and the reported step is the first that differs.
    assert div.steps_a[-1].running == float(ba.dq_acc[element])
    assert div.steps_b[-1].running == float(bb.dq_acc[element])
    assert div.step is not None
    assert all(x.running == y.running for x, y in zip(div.steps_a[:div.step],
                                                      div.steps_b[:div.step]))
    assert div.steps_a[div.step].running != div.steps_b[div.step].running
    assert "<- part here" in div.table()


def test_divergence_of_a_corrupted_partial_points_at_it():
    p = Problem(1, 1, 1, 48, 48, 8, "causal", 16, 16)
    q, k, v, do = random_inputs(p, torch.float16, seed=4)
    s = build_schedule(p, "descending", 2)
    bwd = emulate(s, q, k, v, do, return_partials=True)[1]
    bad = bwd.partials.clone()
    element = (0, 40, 0, 3)  # tile i = 2, three partials
    order = s.dq_order(0, 0, 2)
    steps = trace_dq(s, bwd.partials, element)
    assert [st_.j for st_ in steps] == list(order)
    from dash_ref.emulate import visit_index
    bad[visit_index(s)[(0, 0, 2, order[1])], 40 - 32, 3] += 1.0
    div = dq_divergence(s, bwd.partials, s, bad, element)
    assert div.step == 1
