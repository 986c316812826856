"""A simulator of a schedule's workers and semaphores: makespan, per-worker timelines, idle time.

It runs the same model as :mod:`dash_ref.model.dag` but by a different method, so the two check
each other: every worker is an agent that walks its program (the schedule's chains in run
order) and blocks on the semaphore of a dQ tile until the tile's counter equals the rank
of its ``j`` in the tile's dQ order, exactly as a kernel does. A worker runs until it
blocks; the release of the semaphore it waits for wakes it. Each stage's start is the
latest of the moments it waits for (its unit free, its compute done, its semaphore's
release, a staging buffer free), so no global clock is needed: workers interact only
through semaphores. (A global event queue gives the same times, more slowly.)

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

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from .._checks import number
from ..schedules.arrays import fraction_grid, tile_numbers
from ..schedules.schedule import Schedule, ScheduleError
from .dag import (
    COMPUTE,
    REDUCE,
    checked_costs,
    checked_staging,
    dq_sequence,
    visit_arrays,
)

WAIT = "wait"


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
    intervals: Sequence[Interval]  # sorted by worker, start, kind
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
    """Run ``schedule`` in the simulator; raise :class:`ScheduleError` on deadlock.

    Costs and the hand-off latency are finite and non-negative (a ``ValueError`` says which
    is not); ``staging`` (``async`` only) is None (unbounded) or at least 1.
    """
    cost_compute, cost_reduce = checked_costs(model, cost_compute, cost_reduce)
    staging = checked_staging(model, staging)
    handoff_latency = number("handoff_latency", handoff_latency, minimum=0)
    p = schedule.problem
    W = schedule.num_workers
    v = visit_arrays(schedule)
    n = len(v["i"])
    # per visit: its tile (flat index) and rank in the tile's dQ order (-1: atomic)
    tile_of = tile_numbers(p, v["b"], v["h"], v["i"]).tolist()
    rank_np = np.full(n, -1, np.int64)
    at, tiles = dq_sequence(schedule, v)
    if len(at):
        first = np.flatnonzero(np.concatenate(([True], tiles[1:] != tiles[:-1])))
        rank_np[at] = np.arange(len(at)) - np.repeat(first, np.diff(np.append(first, len(at))))
    rank_of = rank_np.tolist()
    if partial:
        first_row, fraction = fraction_grid(p)
        compute_w = (cost_compute * fraction[first_row[v["b"]] + v["i"], v["j"]]).tolist()
    else:
        compute_w = [cost_compute] * n
    bounds = np.searchsorted(v["worker"], np.arange(W + 1)).tolist()  # worker w: [lo, hi)

    count = [0] * p.num_q_tiles  # semaphore: reduces added to the tile
    released = [0.0] * len(count)  # when the last one became visible
    blocked: dict[tuple[int, int], int] = {}  # (tile, rank) -> worker waiting for it
    pos = bounds[:-1]
    c_start, c_end, r_ready, r_start, r_end = ([0.0] * n for _ in range(5))
    compute_free = [0.0] * W  # when the compute unit (sync: the worker) is free
    writer_free = [0.0] * W
    runnable = list(range(W - 1, -1, -1))
    sync = model == "sync"
    while runnable:
        w = runnable.pop()
        g, hi, lo = pos[w], bounds[w + 1], bounds[w]
        while g < hi:
            tile, rank = tile_of[g], rank_of[g]
            if rank > 0 and count[tile] != rank:
                blocked[(tile, rank)] = w  # woken by the release of rank - 1
                break
            if sync:
                cs = writer_free[w]
            else:
                cs = compute_free[w]
                if staging is not None and g - staging >= lo and r_end[g - staging] > cs:
                    cs = r_end[g - staging]  # a staging buffer frees up
            ce = cs + compute_w[g]
            ready = ce if sync or ce >= writer_free[w] else writer_free[w]
            rs = released[tile] if rank > 0 and released[tile] > ready else ready
            re = rs + cost_reduce
            c_start[g], c_end[g], r_ready[g], r_start[g], r_end[g] = cs, ce, ready, rs, re
            compute_free[w], writer_free[w] = ce, re
            g += 1
            if rank >= 0:
                count[tile] = rank + 1
                released[tile] = re + handoff_latency
                other = blocked.pop((tile, rank + 1), None)
                if other is not None:
                    runnable.append(other)
        pos[w] = g

    stuck = [w for w in range(W) if pos[w] < bounds[w + 1]]
    if stuck:
        def at_(w: int) -> str:
            g = pos[w]
            return (f"w{w} at (b={v['b'][g]},h={v['h'][g]},i={v['i'][g]},j={v['j'][g]}) "
                    f"waiting for rank {rank_of[g]}")
        shown = ", ".join(at_(w) for w in stuck[:4])
        raise ScheduleError(f"simulation deadlocked: {len(stuck)} workers blocked: {shown}")

    times = {name: np.array(x) for name, x in (("cs", c_start), ("ce", c_end), (
        "ready", r_ready), ("rs", r_start), ("re", r_end))}
    worker = v["worker"]
    makespan = float(max(times["ce"].max(), times["re"].max())) if n else 0.0
    waiting = np.bincount(worker, times["rs"] - times["ready"], minlength=W)
    if sync:  # one unit: compute and reduce never overlap
        busy = np.bincount(worker, (times["ce"] - times["cs"]) + (times["re"] - times["rs"]),
                           minlength=W).tolist()
    else:
        busy = [_union_length(times, lo, hi) for lo, hi in pairwise(bounds)]
    return SimResult(schedule.name, model, W, makespan, _Intervals(v, times),
                     tuple(busy), tuple(waiting.tolist()))


def _union_length(times: dict[str, np.ndarray], lo: int, hi: int) -> float:
    """Time covered by one worker's computes and reduces (they overlap in ``async``)."""
    starts = np.concatenate((times["cs"][lo:hi], times["rs"][lo:hi]))
    ends = np.concatenate((times["ce"][lo:hi], times["re"][lo:hi]))
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    before = np.maximum.accumulate(np.concatenate(([-np.inf], ends[:-1])))
    return float(np.clip(ends - np.maximum(starts, before), 0, None).sum())


class _Intervals(Sequence):
    """The intervals of a simulation, made :class:`Interval` objects on first use and sorted
    by worker, start and kind (a million visits need not pay for them unless read)."""

    def __init__(self, v: dict[str, np.ndarray], times: dict[str, np.ndarray]) -> None:
        self._v, self._t = v, times
        self._built: tuple[Interval, ...] | None = None

    def _all(self) -> tuple[Interval, ...]:
        if self._built is None:
            v, t = self._v, self._t
            made = []
            for w, b, h, i, j, cs, ce, ready, rs, re in zip(
                    *(v[k].tolist() for k in ("worker", "b", "h", "i", "j")),
                    *(t[k].tolist() for k in ("cs", "ce", "ready", "rs", "re")), strict=True):
                made.append(Interval(w, COMPUTE, b, h, i, j, cs, ce))
                if rs > ready:
                    made.append(Interval(w, WAIT, b, h, i, j, ready, rs))
                made.append(Interval(w, REDUCE, b, h, i, j, rs, re))
            made.sort(key=lambda x: (x.worker, x.start, x.kind))
            self._built = tuple(made)
        return self._built

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, index):
        return self._all()[index]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self._all()) == tuple(other)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self._all())
