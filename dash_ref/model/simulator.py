"""A discrete-event simulator of a schedule: makespan, per-worker timelines and idle time.

It runs the same model as :mod:`dash_ref.model.dag` but by a different method, so the two check
each other: every worker is an agent that walks its program (the schedule's chains in run
order) and blocks on the semaphore of a dQ tile until the tile's counter equals the rank
of its ``j`` in the tile's dQ order, exactly as a kernel does. An event loop advances time.

Worker models (``docs/design.md`` section 4): ``sync``, one unit per worker does compute then
reduce, visit after visit; ``async``, a compute unit runs computes back to back and a dQ
writer per worker runs the reduces in program order, each once its compute is done and
its semaphore allows; with ``staging = s`` buffers between them, a compute starts only
while fewer than ``s`` computed partials wait for their reduce. ``atomic`` schedules
never wait on a semaphore.

Costs: every reduce costs ``cost_reduce``; every compute costs ``cost_compute``, or with
``partial=True`` ``cost_compute`` times the tile's unmasked fraction.

``handoff_latency`` (default 0, the model of ``docs/design.md``) delays the moment a reduce's
semaphore increment becomes visible to the other workers: on a GPU a release reaches a
spinning acquirer only after a trip through L2. The DAG model has no such term, so only
the default is checked against :meth:`dash_ref.model.dag.DAG.critical_path`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from .._checks import number
from ..schedules.schedule import Schedule, ScheduleError
from .dag import COMPUTE, REDUCE, checked_costs, checked_staging, compute_cost

WAIT = "wait"
RELEASE = "release"


@dataclass(frozen=True)
class Interval:
    """A stretch of one worker's time: ``kind`` is ``compute``, ``reduce`` or ``wait``.

    ``wait`` is time a reduce is ready (its compute done, its writer free) but blocked on
    the semaphore of its dQ tile.
    """

    worker: int
    kind: str
    b: int
    h: int
    i: int
    j: int
    start: float
    end: float

    @property
    def key(self) -> tuple[str, int, int, int, int]:
        return (self.kind, self.b, self.h, self.i, self.j)


@dataclass(frozen=True)
class SimResult:
    """What a simulation produced. ``busy[w]``: time worker ``w`` computes or reduces."""

    name: str
    model: str
    num_workers: int
    makespan: float
    intervals: tuple[Interval, ...]
    busy: tuple[float, ...]
    waiting: tuple[float, ...]

    @property
    def idle(self) -> tuple[float, ...]:
        """Per worker: time neither computing nor reducing (semaphore waits included)."""
        return tuple(self.makespan - b for b in self.busy)

    @property
    def idle_fraction(self) -> float:
        """Idle time over ``num_workers * makespan`` (0 for an empty schedule)."""
        if self.makespan <= 0:
            return 0.0
        return sum(self.idle) / (self.num_workers * self.makespan)


def simulate(
    schedule: Schedule,
    model: str = "sync",
    cost_compute: float = 1.0,
    cost_reduce: float = 1.0,
    partial: bool = False,
    handoff_latency: float = 0.0,
    staging: int | None = None,
) -> SimResult:
    """Run ``schedule`` in the event simulator; raise :class:`ScheduleError` on deadlock.

    Costs and the hand-off latency are finite and non-negative (a ``ValueError`` says which
    is not); ``staging`` (``async`` only) is None (unbounded) or at least 1.
    """
    cost_compute, cost_reduce = checked_costs(model, cost_compute, cost_reduce)
    staging = checked_staging(model, staging)
    handoff_latency = number("handoff_latency", handoff_latency, minimum=0)
    p = schedule.problem
    W = schedule.num_workers
    progs = [[(c.b, c.h, i, c.j) for c in chains for i in c.visits] for chains in schedule.workers]
    ranks: dict[tuple[int, int, int, int], int | None] = {}
    for (b, h, i), order in schedule.dq_orders.items():
        if order is None:
            for j in p.tile_cols[i]:
                ranks[(b, h, i, j)] = None
        else:
            for r, j in enumerate(order):
                ranks[(b, h, i, j)] = r

    sem: dict[tuple[int, int, int], int] = {}
    blocked: dict[tuple[tuple[int, int, int], int], int] = {}  # (tile, rank) -> worker
    wait_since = [0.0] * W
    computed = [0] * W
    reduced = [0] * W
    writer_busy = [False] * W  # reducing, or blocked on a semaphore
    computing = [False] * W
    started = [0.0] * W  # start of the stage in flight (compute unit / writer share it in sync)
    writer_started = [0.0] * W
    intervals: list[Interval] = []
    events: list[tuple[float, int, str, int, tuple | None]] = []
    seq = 0

    def push(t: float, action: str, w: int, tile: tuple | None = None) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, action, w, tile))
        seq += 1

    def release(tile: tuple, t: float) -> None:
        """The tile's semaphore moves to the next rank; wake the worker waiting for it."""
        sem[tile] = sem.get(tile, 0) + 1
        other = blocked.pop((tile, sem[tile]), None)
        if other is not None:
            ob, oh, oi, oj = progs[other][reduced[other]]
            if t > wait_since[other]:
                intervals.append(Interval(other, WAIT, ob, oh, oi, oj, wait_since[other], t))
            writer_busy[other] = False
            try_reduce(other, t)

    def start_compute(w: int, t: float) -> None:
        b, h, i, j = progs[w][computed[w]]
        computing[w] = True
        started[w] = t
        push(t + compute_cost(p, i, j, cost_compute, partial), COMPUTE, w)

    def try_compute(w: int, t: float) -> None:
        """``async``: start the next compute if the unit is free and a buffer is."""
        if computing[w] or computed[w] >= len(progs[w]):
            return
        if staging is None or computed[w] - reduced[w] < staging:
            start_compute(w, t)

    def try_reduce(w: int, t: float) -> None:
        if writer_busy[w] or reduced[w] >= computed[w]:
            return
        b, h, i, j = progs[w][reduced[w]]
        rank = ranks[(b, h, i, j)]
        if rank is not None and sem.get((b, h, i), 0) != rank:
            blocked[((b, h, i), rank)] = w
            wait_since[w] = t
            writer_busy[w] = True
            return
        writer_busy[w] = True
        writer_started[w] = t
        push(t + cost_reduce, REDUCE, w)

    for w in range(W):
        if progs[w]:
            start_compute(w, 0.0)

    while events:
        t, _, action, w, tile = heapq.heappop(events)
        if action == RELEASE:
            release(tile, t)
        elif action == COMPUTE:
            b, h, i, j = progs[w][computed[w]]
            intervals.append(Interval(w, COMPUTE, b, h, i, j, started[w], t))
            computed[w] += 1
            computing[w] = False
            if model == "async":
                try_compute(w, t)
            try_reduce(w, t)
        else:
            b, h, i, j = progs[w][reduced[w]]
            intervals.append(Interval(w, REDUCE, b, h, i, j, writer_started[w], t))
            reduced[w] += 1
            writer_busy[w] = False
            if ranks[(b, h, i, j)] is not None:
                if handoff_latency > 0:
                    push(t + handoff_latency, RELEASE, w, (b, h, i))
                else:
                    release((b, h, i), t)
            if model == "sync" and computed[w] < len(progs[w]):
                start_compute(w, t)
            elif model == "async":
                try_compute(w, t)
            try_reduce(w, t)

    stuck = [w for w in range(W) if reduced[w] < len(progs[w])]
    if stuck:
        shown = ", ".join(
            "w{} at (b={},h={},i={},j={}) waiting for rank {}".format(
                w, *progs[w][reduced[w]], ranks[progs[w][reduced[w]]])
            for w in stuck[:4]
        )
        raise ScheduleError(f"simulation deadlocked: {len(stuck)} workers blocked: {shown}")

    intervals.sort(key=lambda x: (x.worker, x.start, x.kind))
    makespan = max((x.end for x in intervals), default=0.0)
    busy = [0.0] * W
    waiting = [0.0] * W
    last_end = [float("-inf")] * W
    for x in intervals:  # union of compute and reduce intervals per worker
        if x.kind == WAIT:
            waiting[x.worker] += x.end - x.start
            continue
        lo = max(x.start, last_end[x.worker])
        if x.end > lo:
            busy[x.worker] += x.end - lo
        last_end[x.worker] = max(last_end[x.worker], x.end)
    return SimResult(schedule.name, model, W, makespan, tuple(intervals), tuple(busy),
                     tuple(waiting))
