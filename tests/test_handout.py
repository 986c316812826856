"""Handing chains out from a counter: the launch order, and why it cannot deadlock.

A kernel may let each worker take its next chain, in :meth:`Schedule.launch_order`, when it
finishes one, instead of running the placed lists. These tests hold the order to each
greedy schedule's documented launch order, and run the hand-out with random visit times
in a small event model of the kernel (workers, a counter, one semaphore per dQ tile) that
reports a deadlock where one happens.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dash_ref import Problem, build_schedule

RECTANGULAR = [
    Problem(2, 3, 3, 512, 512, 64, "causal", 64, 128),
    Problem(1, 2, 1, 384, 640, 64, "full", 64, 128),
    Problem(1, 2, 2, 700, 700, 64, "causal", 64, 128, window_size=(200, 0)),
]
PACKED = Problem.packed((1000, 64, 0, 300, 1), (1000, 64, 5, 300, 1), 3, 3, 64, "causal",
                        64, 128)
PROBLEMS = [*RECTANGULAR, PACKED]
GREEDY = ("naive", "spt", "descending", "interleaved", "lpt", "banded")


def launched(schedule) -> list[tuple[int, int, int, int]]:
    """``(b, h, j, visits)`` of every chain, in the schedule's launch order."""
    chains = [c for _, c in schedule.chains()]
    return [(chains[n].b, chains[n].h, chains[n].j, len(chains[n].visits))
            for n in schedule.launch_order()]


def hand_out(schedule, order, num_workers: int, rng: np.random.Generator) -> bool:
    """Run ``schedule``'s chains handed out in ``order`` (chain numbers) to ``num_workers``
    workers, each visit taking a random time and waiting for its dQ rank as the kernel
    does: True when every visit ran, False on a deadlock (every unfinished worker waits)."""
    chains = [c for _, c in schedule.chains()]
    rank = {(b, h, i, j): r for (b, h, i), dq in schedule.dq_orders.items()
            for r, j in enumerate(dq)}
    sem = dict.fromkeys(schedule.dq_orders, 0)
    clock = [0.0] * num_workers
    work: list[list | None] = [None] * num_workers  # [chain, its next visit], None: done
    taken = 0

    def take(w: int) -> None:  # the worker's next chain with a visit left, from the counter
        nonlocal taken
        while work[w] is None or work[w][1] == len(work[w][0].visits):
            if taken == len(order):
                work[w] = None
                return
            work[w] = [chains[order[taken]], 0]
            clock[w] += 0.1  # the chain's own overhead
            taken += 1

    for w in range(num_workers):
        take(w)
    while any(work):
        def waits_for(w: int) -> tuple[tuple[int, int, int], int]:
            c, at = work[w]
            return (c.b, c.h, c.visits[at]), rank[(c.b, c.h, c.visits[at], c.j)]

        ready = [w for w in range(num_workers)
                 if work[w] is not None and sem[waits_for(w)[0]] == waits_for(w)[1]]
        if not ready:
            return False  # every unfinished worker waits for a partial that never comes
        w = min(ready, key=lambda x: clock[x])
        tile, _ = waits_for(w)
        clock[w] += rng.uniform(0.5, 2.0)
        sem[tile] += 1
        work[w][1] += 1
        if work[w][1] == len(work[w][0].visits):
            take(w)
    return taken == len(order) and all(sem[k] == len(dq) for k, dq in schedule.dq_orders.items())


@pytest.mark.parametrize("problem", PROBLEMS, ids=repr)
@pytest.mark.parametrize("name", GREEDY)
def test_every_greedy_schedule_has_a_launch_order_of_all_its_chains(problem, name):
    schedule = build_schedule(problem, name, 5)
    order = schedule.launch_order()
    assert order is not None and order.dtype == np.int32
    assert sorted(order.tolist()) == list(range(len(list(schedule.chains()))))


@pytest.mark.parametrize("problem", PROBLEMS, ids=repr)
def test_the_launch_order_is_the_documented_one(problem):
    """naive and descending launch in (b, h, j) order, spt in (b, h, j descending),
    interleaved in (j, b, h); lpt by visits descending inside each head group, so a head's
    chains in j order."""
    for name, key in (("naive", lambda c: (c[0], c[1], c[2])),
                      ("descending", lambda c: (c[0], c[1], c[2])),
                      ("spt", lambda c: (c[0], c[1], -c[2])),
                      ("interleaved", lambda c: (c[2], c[0], c[1]))):
        got = launched(build_schedule(problem, name, 4))
        assert got == sorted(got, key=key), name
    for name in ("lpt", "banded"):
        got = launched(build_schedule(problem, name, 4))
        for b, h in {(c[0], c[1]) for c in got}:
            js = [c[2] for c in got if (c[0], c[1]) == (b, h)]
            if name == "banded" or not problem.is_windowed:
                assert js == sorted(js), (name, b, h)


def test_the_wave_schedules_have_no_launch_order():
    """Their dQ orders follow the step inside a round, which runs back in start order."""
    p = RECTANGULAR[0]
    for name in ("shift", "symmetric_shift", "atomic"):
        assert build_schedule(p, name, 4).launch_order() is None, name


@pytest.mark.parametrize("problem", PROBLEMS, ids=repr)
@pytest.mark.parametrize("name", GREEDY)
def test_handing_out_in_launch_order_never_deadlocks(problem, name):
    rng = np.random.default_rng(7)
    for workers in (1, 2, 3, 8):
        schedule = build_schedule(problem, name, workers)
        assert hand_out(schedule, schedule.launch_order().tolist(), workers, rng)


def test_an_order_whose_edges_run_back_is_refused_and_deadlocks():
    """The check is not vacuous: reverse naive's dQ orders (each tile adds j descending)
    while the chains still start j ascending, and one worker waits forever on its first
    chain, which launch_order refuses."""
    naive = build_schedule(RECTANGULAR[0], "naive", 1)
    flipped = dataclasses.replace(naive, dq_orders={k: v[::-1]
                                                    for k, v in naive.dq_orders.items()})
    assert flipped.launch_order() is None
    start_order = list(range(len(list(naive.chains()))))
    assert not hand_out(flipped, start_order, 1, np.random.default_rng(0))
    assert hand_out(naive, start_order, 1, np.random.default_rng(0))


def test_the_tables_carry_the_launch_order_as_an_extra_table():
    tables = build_schedule(PACKED, "lpt", 3).to_tables()
    assert "launch_order" not in tables.as_dict()
    assert np.array_equal(tables.as_dict(extra=True)["launch_order"],
                          build_schedule(PACKED, "lpt", 3).launch_order())
    assert build_schedule(PACKED, "shift", 3).to_tables().launch_order.size == 0
