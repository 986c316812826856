"""A schedule's visits and dQ orders as flat integer arrays, for vectorized checks and models.

Visits are numbered worker by worker in program order (the numbering of the DAG model,
:func:`dash_ref.model.dag.build_dag`, and of the deadlock check); dQ tiles by
:meth:`Problem.q_tile_index`, for rectangular and packed problems alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .problem import Problem


class Schedule(Protocol):
    """What these functions read of a :class:`~dash_ref.schedules.schedule.Schedule`."""

    problem: Problem
    workers: Sequence[Sequence[Any]]  # each worker's chains (b, h, j, visits) in run order
    dq_orders: Mapping[tuple[int, int, int], tuple[int, ...] | None]


def visit_arrays(schedule: Schedule) -> dict[str, np.ndarray]:
    """Every visit as arrays ``worker``, ``b``, ``h``, ``i``, ``j``, worker by worker in
    program order (the numbering of :func:`build_dag`)."""
    lengths, chain_w, chain_b, chain_h, chain_j, visits = [], [], [], [], [], []
    for w, chains in enumerate(schedule.workers):
        for c in chains:
            lengths.append(len(c.visits))
            chain_w.append(w)
            chain_b.append(c.b)
            chain_h.append(c.h)
            chain_j.append(c.j)
            visits.extend(c.visits)
    lengths = np.array(lengths, np.int64)
    return {"worker": np.repeat(np.array(chain_w, np.int64), lengths),
            "b": np.repeat(np.array(chain_b, np.int64), lengths),
            "h": np.repeat(np.array(chain_h, np.int64), lengths),
            "i": np.array(visits, np.int64),
            "j": np.repeat(np.array(chain_j, np.int64), lengths)}


def dq_sequence(schedule: Schedule, v: dict[str, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every fixed dQ order laid end to end: ``(visit, tile)``, the visit numbers (of
    :func:`visit_arrays`) in summation order, and the number of the tile each adds into
    (:meth:`Problem.q_tile_index`). ``atomic`` tiles are left out."""
    p = schedule.problem
    n_kv = max(p.n_kv, 1)
    tile = tile_numbers(p, v["b"], v["h"], v["i"]) * n_kv
    index = np.full(p.num_q_tiles * n_kv, -1, np.int64)
    index[tile + v["j"]] = np.arange(len(tile))
    keys, js = [], []
    for (b, h, i), order in schedule.dq_orders.items():
        if order is None:
            continue  # atomic: arrival order, no edge
        keys.extend([p.q_tile_index(b, h, i)] * len(order))
        js.extend(order)
    tiles = np.array(keys, np.int64)
    return index[tiles * n_kv + np.array(js, np.int64)], tiles


# ---------------------------------------------------------------------------------------
# per-sequence lookups (a rectangular problem is a batch of equal sequences)
# ---------------------------------------------------------------------------------------
def sequence_arrays(p: Problem) -> dict[str, np.ndarray]:
    """Per sequence ``b``: ``n_q``, ``n_kv`` and ``q_tile_base`` (``B + 1`` entries)."""
    return {"n_q": np.array([p.n_q_of(b) for b in range(p.batch)], np.int64),
            "n_kv": np.array([p.n_kv_of(b) for b in range(p.batch)], np.int64),
            "q_tile_base": np.array([p.q_tile_base(b) for b in range(p.batch + 1)], np.int64)}


def tile_numbers(p: Problem, b: np.ndarray, h: np.ndarray, i: np.ndarray) -> np.ndarray:
    """:meth:`Problem.q_tile_index` of arrays ``b, h, i``."""
    seq = sequence_arrays(p)
    return seq["q_tile_base"][b] + h * seq["n_q"][b] + i


def pair_grid(p: Problem, value: Callable[[Problem, int, int], float], dtype: type
              ) -> tuple[np.ndarray, np.ndarray]:
    """``(first_row, grid)``: ``grid[first_row[b] + i, j]`` is ``value(seq, i, j)`` for every
    active pair ``(i, j)`` of sequence ``b`` (0 elsewhere), ``n_kv`` columns; ``seq`` is
    ``p.sequence(b)``, or ``p`` itself for a rectangular problem. Sequences of one shape
    share their rows."""
    where: dict[tuple[int, int], int] = {}
    blocks: list[np.ndarray] = []
    rows = 0
    first_row = np.zeros(p.batch, np.int64)
    for b in range(p.batch):
        key = (p.seqlen_q_of(b), p.seqlen_k_of(b))
        if key not in where:
            seq = p.sequence(b) if p.is_packed else p  # rectangular: sequence 0 stands for all
            block = np.zeros((seq.n_q, p.n_kv), dtype)
            for i, cols in enumerate(seq.tile_cols):
                for j in cols:
                    block[i, j] = value(seq, i, j)
            where[key] = rows
            rows += seq.n_q
            blocks.append(block)
        first_row[b] = where[key]
    grid = np.concatenate(blocks) if blocks else np.zeros((0, p.n_kv), dtype)
    return first_row, grid


def active_grid(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pair_grid` of whether a pair is active."""
    return pair_grid(p, lambda seq, i, j: True, bool)


def fraction_grid(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pair_grid` of each active pair's unmasked fraction (:meth:`Problem.tile_fraction`)."""
    return pair_grid(p, lambda seq, i, j: seq.tile_fraction(i, j), np.float64)
