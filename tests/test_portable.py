"""Portable schedules: their bits do not depend on the number of workers (the GPU's SM count).

The bits of a backward are fixed by its schedule's fingerprint (visit orders and dQ
orders); placement on workers changes speed only. A portable schedule's fingerprint is
therefore the same for every ``num_workers``, and it must be deadlock-free for each.
"""

from __future__ import annotations

import pytest

from dash_ref import DETERMINISTIC, PORTABLE, Problem, build_schedule, resolve_name, simulate
from dash_ref.schedules.auto import auto_schedule, load_table

WORKERS = (1, 7, 66, 78, 114, 132)  # one worker, odd counts, half an H200, H100 PCIe / SXM
PROBLEMS = [
    Problem(2, 4, 4, 1000, 1000, 64, "full", 128, 128),
    Problem(2, 4, 4, 1000, 1000, 64, "causal", 128, 128),
    Problem(1, 6, 2, 700, 1300, 128, "causal", 64, 128),  # GQA, S_q < S_k, ragged tiles
    Problem(3, 2, 1, 1300, 700, 64, "causal", 64, 64),  # MQA, S_q > S_k: rows see no key
]


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{p.mask}-{p.seqlen_q}x{p.seqlen_k}")
@pytest.mark.parametrize("name", PORTABLE)
def test_a_portable_schedule_has_one_fingerprint_for_every_worker_count(name, problem):
    prints = {build_schedule(problem, name, w).fingerprint() for w in WORKERS}
    assert len(prints) == 1


@pytest.mark.parametrize("name", sorted(set(DETERMINISTIC) - set(PORTABLE)))
def test_the_wave_schedules_are_not_portable(name):
    """The shape of the issue that found it: their bits change with the SM count."""
    p = Problem(2, 16, 16, 4096, 4096, 64, "causal", 128, 128)
    prints = {w: build_schedule(p, name, w).fingerprint() for w in (132, 114, 66)}
    assert len(set(prints.values())) == 3, prints


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_interleaved_is_deadlock_free_on_every_worker_count_up_to_an_h200(mask):
    p = Problem(1, 3, 3, 640, 640, 64, mask, 128, 128)
    for w in range(1, 133):
        build_schedule(p, "interleaved", w).validate()  # raises on a possible deadlock


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_interleaved_adds_in_naives_order(mask):
    p = PROBLEMS[0] if mask == "full" else PROBLEMS[1]
    a, b = build_schedule(p, "interleaved", 5), build_schedule(p, "naive", 5)
    assert a.fingerprint() == b.fingerprint()
    assert a.dq_orders == b.dq_orders
    assert a.workers != b.workers  # the same sums, placed differently


@pytest.mark.parametrize("mask", ["full", "causal"])
def test_with_more_heads_than_workers_interleaved_never_waits(mask):
    """The DAG model: every chain of a head starts after the previous one has ended."""
    p = Problem(4, 8, 8, 512, 512, 64, mask, 128, 128)  # 32 heads, 16 workers
    naive = simulate(build_schedule(p, "naive", 16), cost_reduce=0.2, handoff_latency=0.4)
    inter = simulate(build_schedule(p, "interleaved", 16), cost_reduce=0.2,
                     handoff_latency=0.4)
    assert sum(inter.waiting) == 0
    assert sum(naive.waiting) > 0
    assert inter.makespan < naive.makespan


def test_portable_auto_picks_the_fastest_measured_portable_schedule():
    for e in load_table():
        measured = {n: t for n, t in e["all_tflops"].items() if n in PORTABLE}
        pick = auto_schedule(e["mask"], e["head_dim"], e["seqlen"], e["backend"], PORTABLE)
        assert pick in PORTABLE
        if measured:
            assert measured[pick] == max(measured.values())


def test_portable_resolution_keeps_to_the_set():
    for p in PROBLEMS:
        for backend in ("cute", "triton"):
            assert resolve_name("auto", p, backend, portable=True) in PORTABLE
        for name in PORTABLE:
            assert resolve_name(name, p, portable=True) == name
