"""The DAG model of a schedule (``docs/design.md`` section 4) and its critical path.

Nodes are task stages of every visit ``(b, h, i, j)`` of a
:class:`~dash_ref.schedules.schedule.Schedule`:

``compute(b, h, i, j)``  weight ``c`` (or ``c`` times the unmasked fraction of the tile with
                         ``partial=True``: diagonal tiles of a causal mask, and ragged edge
                         tiles when ``S`` is not a multiple of the tile size)
``reduce(b, h, i, j)``   weight ``r``: adding the partial ``dQ_ij`` into ``dQacc_i``

Edges (a node starts when all its predecessors have finished):

- each reduce after its own compute;
- ``sync`` worker model (one warp group does both): on a worker, ``compute_k -> reduce_k ->
  compute_{k+1}`` in program order;
- ``async`` worker model (a separate dQ writer per worker): computes run back to back
  (``compute_k -> compute_{k+1}``), reduces queue behind them in program order
  (``reduce_k -> reduce_{k+1}``); with ``staging = s`` staging buffers between the two
  (a kernel's staged partials), ``reduce_{k-s} -> compute_k`` on a worker: a visit starts
  once the partial ``s`` visits back has left its buffer (``s = 1`` is the ``sync``
  model; unbounded by default);
- dQ order: each reduce after the previous reduce in its tile's dQ order (none for
  ``atomic``, whose adds land in arrival order).

The makespan is the longest node-weighted path (:meth:`DAG.critical_path`). The DAG is
read from the schedule (workers, visit orders, dQ orders); nothing is re-derived here.

Closed forms (sync model, ``B = 1``, ``H = m`` heads run back to back, ``BM = BN``,
``S_q = S_k = n * BM``, so ``n`` KV tiles = ``n`` Q tiles = ``n`` workers, every active tile
costing ``c`` (``partial=False``) and every reduce ``r``), with the placements of
:mod:`dash_ref.schedules.schedule` (greedy list scheduling at one unit per visit for
naive/spt/descending, ties to the lowest worker; round-robin items for
shift/symmetric_shift):

- full, ``naive``: ``m n (c + r) + (n - 1) r``, any ``n, m >= 1``, ``c, r >= 0``. Chain
  ``(h, j)`` lands on worker ``j``; worker ``j`` starts ``j r`` late (it waits for the
  reduce of worker ``j - 1`` on the same tile) and stays in that pipeline for all heads.
- full, ``shift``: ``m n (c + r)``, any ``n, m``, ``c, r >= 0``. One head is one wave on
  ``n`` workers; at every step the ``n`` workers touch ``n`` distinct dQ tiles.
- causal, ``descending``: ``m (n + 1)(c + r) / 2 + (n - 1) r`` for even ``m`` and any
  ``n``, provided ``r <= c`` when ``m >= 4`` (``m = 2``: any ``c, r``). The greedy placement
  zigzags: head ``2t`` puts chain ``j`` on worker ``j``, head ``2t + 1`` puts chain ``j`` on
  worker ``n - 1 - j`` (the one free first), so every worker carries ``n + 1`` visits per
  pair of heads. In an even head worker ``j`` starts ``j r`` late (as in ``naive``); in the
  odd head chain ``j`` starts ``c`` after chain ``j - 1`` and visits the same rows at the
  same steps, so each of its reduces waits ``max(0, r - c)`` for chain ``j - 1``'s reduce
  of that tile. With ``r > c`` that lag carries into the next pair of heads: each pair after
  the first adds ``(n - 1)(r - c)`` (observed, not part of the published form).
- causal, ``symmetric_shift``: ``m (n + 1)(c + r) / 2`` (the lower bound: total work over
  ``n`` workers) for even ``n`` and even ``m``, any ``c, r >= 0``. Each worker runs one
  folded pair of chains (``n + 1`` visits) per round and two heads share a round; with odd
  ``m`` the last round is half empty and the makespan is ``ceil(m / 2)(n + 1)(c + r)``.

Beyond the closed forms: in the idealized full-mask model (``partial=False``) ``shift``
never takes longer than ``naive`` (any ``B``, ``H``, GQA, ragged lengths, ``W``, both worker
models) provided every wave fits in the Q tiles, ``min(W, n_kv) <= n_q``. With larger waves
two chains of a wave reach one dQ tile at the same step and ``shift`` can lose: ``n_q = 2``,
``n_kv = 4``, ``H = 2``, ``W = 7``, ``c = 1``, ``r = 2``, sync: naive 12, shift 13.

The lemma behind shift scheduling (:func:`edge_keeps_critical_path`,
:func:`depth_condition`): add a zero-weight edge ``u -> v`` to a DAG made of parallel
isomorphic chains. With ``depth(u)`` the time of ``u``'s end event (its earliest finish)
and ``depth(v)`` the time of ``v``'s start event (its earliest start), the critical path
is unchanged iff ``depth(u) <= depth(v)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from .._checks import choice, integer, number
from ..schedules.problem import Problem
from ..schedules.schedule import Schedule, ScheduleError

MODELS = ("sync", "async")
COMPUTE = "compute"
REDUCE = "reduce"

TaskKey = tuple[str, int, int, int, int]  # (kind, b, h, i, j)


@dataclass(frozen=True)
class Task:
    """One node: a ``compute`` or ``reduce`` stage of visit ``(b, h, i, j)`` on ``worker``."""

    kind: str
    b: int
    h: int
    i: int
    j: int
    worker: int
    weight: float

    @property
    def key(self) -> TaskKey:
        return (self.kind, self.b, self.h, self.i, self.j)


@dataclass(frozen=True)
class CriticalPath:
    """The longest path: its length (the makespan) and its node ids, source to sink."""

    length: float
    nodes: tuple[int, ...]


def compute_cost(problem: Problem, i: int, j: int, cost_compute: float, partial: bool) -> float:
    """Weight of ``compute(., ., i, j)``: ``c``, or ``c`` times the tile's unmasked fraction."""
    return cost_compute * problem.tile_fraction(i, j) if partial else cost_compute


class DAG:
    """A node-weighted DAG of tasks; ``succ[u]`` lists the nodes that start after ``u`` ends."""

    def __init__(self, tasks: Sequence[Task], edges: Iterable[tuple[int, int]] = ()) -> None:
        self.tasks: list[Task] = list(tasks)
        self.succ: list[list[int]] = [[] for _ in self.tasks]
        for u, v in edges:
            self.succ[u].append(v)
        self._index: dict[TaskKey, int] | None = None

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def num_edges(self) -> int:
        return sum(len(s) for s in self.succ)

    def add_edge(self, u: int, v: int) -> None:
        """Add the dependency ``u -> v`` (``v`` starts after ``u`` ends)."""
        self.succ[u].append(v)

    def copy(self) -> DAG:
        """A copy whose edges can be changed without touching this one."""
        return DAG(self.tasks, ((u, v) for u, outs in enumerate(self.succ) for v in outs))

    def node(self, kind: str, b: int, h: int, i: int, j: int) -> int:
        """Node id of ``kind(b, h, i, j)``."""
        if self._index is None:
            self._index = {t.key: n for n, t in enumerate(self.tasks)}
        return self._index[(kind, b, h, i, j)]

    def topological_order(self) -> list[int]:
        """Kahn's algorithm; raises :class:`ScheduleError` if the graph has a cycle."""
        indeg = [0] * len(self.tasks)
        for outs in self.succ:
            for v in outs:
                indeg[v] += 1
        order = [n for n, d in enumerate(indeg) if d == 0]
        k = 0
        while k < len(order):
            for v in self.succ[order[k]]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    order.append(v)
            k += 1
        if len(order) != len(self.tasks):
            stuck = next(n for n, d in enumerate(indeg) if d > 0)
            raise ScheduleError(
                f"the DAG has a cycle (deadlock); {len(self.tasks) - len(order)} tasks never "
                f"become ready, e.g. {_name(self.tasks[stuck])}"
            )
        return order

    def finish_times(self) -> list[float]:
        """Earliest finish time of every node: the depth of its end event."""
        finish = [0.0] * len(self.tasks)
        start = [0.0] * len(self.tasks)
        for u in self.topological_order():
            f = start[u] + self.tasks[u].weight
            finish[u] = f
            for v in self.succ[u]:
                if f > start[v]:
                    start[v] = f
        return finish

    def start_times(self) -> list[float]:
        """Earliest start time of every node: the depth of its start event."""
        return [f - t.weight for f, t in zip(self.finish_times(), self.tasks, strict=True)]

    def critical_path(self) -> CriticalPath:
        """Longest path by dynamic programming in topological order (ties: first found)."""
        if not self.tasks:
            return CriticalPath(0.0, ())
        start = [0.0] * len(self.tasks)
        via = [-1] * len(self.tasks)
        best, end = -1.0, -1
        for u in self.topological_order():
            f = start[u] + self.tasks[u].weight
            if f > best:
                best, end = f, u
            for v in self.succ[u]:
                if via[v] < 0 or f > start[v]:
                    start[v], via[v] = f, u
        path = [end]
        while via[path[-1]] >= 0:
            path.append(via[path[-1]])
        return CriticalPath(best, tuple(reversed(path)))

    def path_keys(self, path: CriticalPath) -> set[TaskKey]:
        """The task keys on ``path`` (for highlighting in a Gantt chart)."""
        return {self.tasks[n].key for n in path.nodes}


def _name(t: Task) -> str:
    return f"{t.kind}(b={t.b},h={t.h},i={t.i},j={t.j}) on w{t.worker}"


def checked_costs(model: str, cost_compute: float, cost_reduce: float) -> tuple[float, float]:
    """The costs as floats, once the worker model is known and both are finite and >= 0."""
    choice("model", model, MODELS)
    return (number("cost_compute", cost_compute, minimum=0),
            number("cost_reduce", cost_reduce, minimum=0))


def checked_staging(model: str, staging: int | None) -> int | None:
    """``staging`` as an int >= 1, or None (unbounded); only the ``async`` model has it."""
    if staging is None:
        return None
    if model != "async":
        raise ValueError(f"staging bounds the async model's dQ writer; model is {model!r}")
    return integer("staging", staging, minimum=1)


def build_dag(
    schedule: Schedule,
    model: str = "sync",
    cost_compute: float = 1.0,
    cost_reduce: float = 1.0,
    partial: bool = False,
    dq_edges: bool = True,
    staging: int | None = None,
) -> DAG:
    """The DAG of ``schedule`` under worker ``model`` (``sync`` or ``async``).

    ``staging`` (``async`` only): the staging buffers between a worker's computes and its
    dQ writer; None leaves them unbounded.

    ``partial=True`` weights each compute by its tile's unmasked fraction; otherwise every
    active tile costs ``cost_compute`` (the idealized model). ``dq_edges=False`` leaves out
    the dQ-order edges (each worker is then an independent chain; used for the lemma).
    Node ``2k`` is the compute and ``2k + 1`` the reduce of the ``k``-th visit, visits
    numbered worker by worker in program order. Costs are finite and non-negative.
    """
    cost_compute, cost_reduce = checked_costs(model, cost_compute, cost_reduce)
    staging = checked_staging(model, staging)
    p = schedule.problem
    tasks: list[Task] = []
    edges: list[tuple[int, int]] = []
    visit: dict[tuple[int, int, int, int], int] = {}
    for w, chains in enumerate(schedule.workers):
        prev = -1
        first = len(tasks) // 2  # the worker's first visit
        for c in chains:
            for i in c.visits:
                k = len(tasks) // 2
                visit[(c.b, c.h, i, c.j)] = k
                tasks.append(Task(COMPUTE, c.b, c.h, i, c.j, w,
                                  compute_cost(p, i, c.j, cost_compute, partial)))
                tasks.append(Task(REDUCE, c.b, c.h, i, c.j, w, cost_reduce))
                edges.append((2 * k, 2 * k + 1))
                if prev >= 0:
                    if model == "sync":
                        edges.append((2 * prev + 1, 2 * k))
                    else:
                        edges.append((2 * prev, 2 * k))
                        edges.append((2 * prev + 1, 2 * k + 1))
                if staging is not None and k - staging >= first:
                    edges.append((2 * (k - staging) + 1, 2 * k))  # the buffer is free
                prev = k
    if dq_edges:
        for (b, h, i), order in schedule.dq_orders.items():
            if order is None:
                continue  # atomic: arrival order, no edge
            for j0, j1 in pairwise(order):
                edges.append((2 * visit[(b, h, i, j0)] + 1, 2 * visit[(b, h, i, j1)] + 1))
    return DAG(tasks, edges)


def critical_path(
    schedule: Schedule,
    model: str = "sync",
    cost_compute: float = 1.0,
    cost_reduce: float = 1.0,
    partial: bool = False,
    staging: int | None = None,
) -> CriticalPath:
    """Shorthand: ``build_dag(...).critical_path()``."""
    return build_dag(schedule, model, cost_compute, cost_reduce, partial,
                     staging=staging).critical_path()


# ---------------------------------------------------------------------------------------
# the lemma
# ---------------------------------------------------------------------------------------
def parallel_chains(weights: Sequence[float], copies: int) -> DAG:
    """``copies`` isomorphic chains, each a path of tasks with the given ``weights``.

    Node ``k * len(weights) + s`` is step ``s`` of chain ``k``; tasks are labelled
    ``compute(0, k, s, 0)`` with ``worker = k``.
    """
    tasks = [Task(COMPUTE, 0, k, s, 0, k, float(wt))
             for k in range(copies) for s, wt in enumerate(weights)]
    L = len(weights)
    edges = [(k * L + s, k * L + s + 1) for k in range(copies) for s in range(L - 1)]
    return DAG(tasks, edges)


def depth_condition(dag: DAG, u: int, v: int) -> bool:
    """The lemma's test for a zero-weight edge ``u -> v``: ``depth(u) <= depth(v)``.

    ``depth(u)`` is the time of ``u``'s end event (earliest finish), ``depth(v)`` the time
    of ``v``'s start event (earliest start), both in ``dag`` as it is (without the edge).
    On parallel isomorphic chains this holds iff adding the edge keeps the critical path.
    """
    finish = dag.finish_times()
    return finish[u] <= finish[v] - dag.tasks[v].weight


def edge_keeps_critical_path(dag: DAG, u: int, v: int) -> bool:
    """Add ``u -> v`` to a copy of ``dag`` and compare critical path lengths (no shortcut)."""
    with_edge = dag.copy()
    with_edge.add_edge(u, v)
    return with_edge.critical_path().length == dag.critical_path().length
