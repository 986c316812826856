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
Packed problems (sequences of their own lengths) are read the same way: their chains
simply differ in length, and a tile's fraction is that of its own sequence.

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

import numpy as np

from .._checks import choice, integer, number
from .._graph import levels_and_times
from ..schedules.arrays import dq_sequence, fraction_grid, visit_arrays
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


def compute_cost(problem: Problem, i: int, j: int, cost_compute: float, partial: bool,
                 b: int = 0) -> float:
    """Weight of ``compute(b, ., i, j)``: ``c``, or ``c`` times the tile's unmasked fraction."""
    return cost_compute * problem.tile_fraction(i, j, b) if partial else cost_compute


class DAG:
    """A node-weighted DAG of tasks; ``succ[u]`` lists the nodes that start after ``u`` ends.

    Stored as arrays (one entry per task, one per edge), so a schedule of a million visits
    builds and solves in about a second: the longest path is computed level by level of a
    topological sort, each level one vectorized step. ``tasks`` and ``succ`` are built on
    first use, for callers that walk the graph node by node.
    """

    def __init__(self, tasks: Sequence[Task] | None = None,
                 edges: Iterable[tuple[int, int]] = (), *, _arrays: dict | None = None
                 ) -> None:
        if _arrays is None:
            tasks = list(tasks or ())
            _arrays = {
                "kind": np.array([t.kind == REDUCE for t in tasks], np.int8),
                "b": np.array([t.b for t in tasks], np.int64),
                "h": np.array([t.h for t in tasks], np.int64),
                "i": np.array([t.i for t in tasks], np.int64),
                "j": np.array([t.j for t in tasks], np.int64),
                "worker": np.array([t.worker for t in tasks], np.int64),
                "weight": np.array([t.weight for t in tasks], np.float64),
            }
            pairs = np.array(list(edges), np.int64).reshape(-1, 2)
            _arrays["src"], _arrays["dst"] = pairs[:, 0], pairs[:, 1]
            self._tasks: list[Task] | None = tasks
        else:
            self._tasks = None
        self._a = _arrays
        self._succ: list[list[int]] | None = None
        self._index: dict[TaskKey, int] | None = None

    @classmethod
    def from_arrays(cls, kind, b, h, i, j, worker, weight, src, dst) -> DAG:
        """A DAG from per-task arrays (``kind`` 0 compute, 1 reduce) and edge arrays."""
        arrays = {"kind": kind, "b": b, "h": h, "i": i, "j": j, "worker": worker,
                  "weight": np.asarray(weight, np.float64), "src": np.asarray(src, np.int64),
                  "dst": np.asarray(dst, np.int64)}
        return cls(_arrays=arrays)

    def __len__(self) -> int:
        return len(self._a["weight"])

    @property
    def tasks(self) -> list[Task]:
        if self._tasks is None:
            a = self._a
            kinds = (COMPUTE, REDUCE)
            self._tasks = [Task(kinds[k], b, h, i, j, w, x) for k, b, h, i, j, w, x in zip(
                a["kind"].tolist(), a["b"].tolist(), a["h"].tolist(), a["i"].tolist(),
                a["j"].tolist(), a["worker"].tolist(), a["weight"].tolist(), strict=True)]
        return self._tasks

    @property
    def succ(self) -> list[list[int]]:
        if self._succ is None:
            self._succ = [[] for _ in range(len(self))]
            for u, v in zip(self._a["src"].tolist(), self._a["dst"].tolist(), strict=True):
                self._succ[u].append(v)
        return self._succ

    @property
    def num_edges(self) -> int:
        return len(self._a["src"])

    def add_edge(self, u: int, v: int) -> None:
        """Add the dependency ``u -> v`` (``v`` starts after ``u`` ends)."""
        self._a = {**self._a, "src": np.append(self._a["src"], u),
                   "dst": np.append(self._a["dst"], v)}
        if self._succ is not None:
            self._succ[u].append(v)

    def copy(self) -> DAG:
        """A copy whose edges can be changed without touching this one."""
        twin = DAG(_arrays=dict(self._a))
        twin._tasks = self._tasks
        return twin

    def node(self, kind: str, b: int, h: int, i: int, j: int) -> int:
        """Node id of ``kind(b, h, i, j)``."""
        if self._index is None:
            self._index = {t.key: n for n, t in enumerate(self.tasks)}
        return self._index[(kind, b, h, i, j)]

    def _solve(self) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """Topological levels and the earliest finish of every node, level by level.

        A level is every node whose predecessors all lie in earlier levels; its nodes'
        start times are final when it is reached. Raises :class:`ScheduleError` on a cycle.
        """
        n = len(self)
        levels, start, finish, indeg = levels_and_times(n, self._a["src"], self._a["dst"],
                                                        self._a["weight"])
        reached = sum(level.size for level in levels)
        if reached != n:
            stuck = int(np.flatnonzero(indeg > 0)[0])
            raise ScheduleError(
                f"the DAG has a cycle (deadlock); {n - reached} tasks never become ready, "
                f"e.g. {_name(self.tasks[stuck])}"
            )
        return levels, start, finish

    def topological_order(self) -> list[int]:
        """Nodes level by level; raises :class:`ScheduleError` if the graph has a cycle."""
        levels, _, _ = self._solve()
        return np.concatenate(levels).tolist() if levels else []

    def finish_times(self) -> list[float]:
        """Earliest finish time of every node: the depth of its end event."""
        return self._solve()[2].tolist()

    def start_times(self) -> list[float]:
        """Earliest start time of every node: the depth of its start event."""
        return self._solve()[1].tolist()

    def critical_path(self) -> CriticalPath:
        """The longest path: finish times level by level, then back from the node that
        ends last along predecessors whose finish is the start of their successor (ties:
        the predecessor in the earliest level, then the lowest node id)."""
        if not len(self):
            return CriticalPath(0.0, ())
        levels, start, finish = self._solve()
        depth = np.empty(len(self), np.int64)  # the level of every node
        for n, level in enumerate(levels):
            depth[level] = n
        src, dst = self._a["src"], self._a["dst"]
        order = np.argsort(dst, kind="stable")
        preds = src[order]
        first = np.zeros(len(self) + 1, np.int64)
        np.cumsum(np.bincount(dst, minlength=len(self)), out=first[1:])
        end = int(np.argmax(finish))
        path = [end]
        while True:
            v = path[-1]
            mine = preds[first[v]:first[v + 1]]
            on_path = mine[finish[mine] == start[v]]
            if not on_path.size:
                break
            path.append(int(on_path[np.lexsort((on_path, depth[on_path]))[0]]))
        return CriticalPath(float(finish[end]), tuple(reversed(path)))

    def path_keys(self, path: CriticalPath) -> set[TaskKey]:
        """The task keys on ``path`` (for highlighting in a Gantt chart)."""
        a = self._a
        kinds = (COMPUTE, REDUCE)
        return {(kinds[int(a["kind"][n])], int(a["b"][n]), int(a["h"][n]), int(a["i"][n]),
                 int(a["j"][n])) for n in path.nodes}


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
    v = visit_arrays(schedule)
    w, b, h, i, j = v["worker"], v["b"], v["h"], v["i"], v["j"]
    n = len(w)
    k = np.arange(n)
    compute_w = np.full(n, cost_compute)
    if partial:
        first_row, fraction = fraction_grid(p)
        compute_w = cost_compute * fraction[first_row[b] + i, j]
    src = [2 * k]  # each reduce after its compute
    dst = [2 * k + 1]
    same = np.flatnonzero(w[1:] == w[:-1]) + 1  # visits after another on their worker
    if model == "sync":
        src.append(2 * (same - 1) + 1)
        dst.append(2 * same)
    else:
        src += [2 * (same - 1), 2 * (same - 1) + 1]
        dst += [2 * same, 2 * same + 1]
    if staging is not None:  # compute k waits until reduce k - staging frees its buffer
        first = np.searchsorted(w, w)  # the worker's first visit (visits are worker-major)
        held = k[k - staging >= first]
        src.append(2 * (held - staging) + 1)
        dst.append(2 * held)
    if dq_edges:
        a, c = _dq_pairs(schedule, v)
        src.append(2 * a + 1)
        dst.append(2 * c + 1)
    kind = np.tile(np.array([0, 1], np.int8), n)
    weight = np.empty(2 * n)
    weight[0::2], weight[1::2] = compute_w, cost_reduce
    return DAG.from_arrays(kind, np.repeat(b, 2), np.repeat(h, 2), np.repeat(i, 2),
                           np.repeat(j, 2), np.repeat(w, 2), weight, np.concatenate(src),
                           np.concatenate(dst))


def _dq_pairs(schedule: Schedule, v: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Visit numbers ``(a, c)``: in some tile's dQ order, ``c`` comes right after ``a``."""
    at, tiles = dq_sequence(schedule, v)
    next_in_tile = np.flatnonzero(tiles[1:] == tiles[:-1])
    return at[next_in_tile], at[next_in_tile + 1]


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
