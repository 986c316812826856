"""Hand-off latency in the event simulator: a release reaches other workers ``l`` later."""

from __future__ import annotations

import pytest

from dash_ref import Problem, build_schedule, critical_path, simulate


def full(n: int, m: int) -> Problem:
    return Problem(1, m, m, 64 * n, 64 * n, 64, "full", 64, 64)


@pytest.mark.parametrize("n, m", [(2, 1), (4, 3), (6, 2)])
@pytest.mark.parametrize("c, r, lat", [(1.0, 0.25, 0.5), (1.0, 0.5, 0.1), (2.0, 0.3, 1.5)])
def test_naive_pays_the_latency_once_per_chain_in_its_ramp(n, m, c, r, lat):
    # chain j is offset by j (r + l) from chain 0 and keeps that offset for every head:
    # m n (c + r) + (n - 1)(r + l)
    got = simulate(build_schedule(full(n, m), "naive", n), "sync", c, r, handoff_latency=lat)
    assert got.makespan == pytest.approx(m * n * (c + r) + (n - 1) * (r + lat))


@pytest.mark.parametrize("n, m", [(2, 1), (4, 3), (6, 2)])
@pytest.mark.parametrize("c, r, lat", [(1.0, 0.25, 0.5), (1.0, 0.5, 1.0), (2.0, 0.3, 1.5)])
def test_shift_hides_a_latency_up_to_one_compute(n, m, c, r, lat):
    # the previous rank of a tile finished a whole step earlier: no wait while l <= c
    got = simulate(build_schedule(full(n, m), "shift", n), "sync", c, r, handoff_latency=lat)
    assert got.makespan == pytest.approx(m * n * (c + r))


def test_zero_latency_is_the_dag_model():
    p = Problem(2, 3, 1, 200, 330, 64, "causal", 64, 64)
    for name in ("naive", "descending", "symmetric_shift"):
        s = build_schedule(p, name, 5)
        assert simulate(s, "sync", 1.0, 0.4, True, 0.0).makespan == pytest.approx(
            critical_path(s, "sync", 1.0, 0.4, True).length)
