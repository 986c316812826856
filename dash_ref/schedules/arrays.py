"""A schedule's visits and dQ orders as flat integer arrays, for vectorized checks and models.

Visits are numbered worker by worker in program order (the numbering of the DAG model,
:func:`dash_ref.model.dag.build_dag`, and of the deadlock check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    :func:`visit_arrays`) in summation order, and the flat index of the tile each adds
    into. ``atomic`` tiles are left out."""
    p = schedule.problem
    tile = ((v["b"] * p.heads + v["h"]) * p.n_q + v["i"]) * p.n_kv
    index = np.full(p.batch * p.heads * p.n_q * p.n_kv, -1, np.int64)
    index[tile + v["j"]] = np.arange(len(tile))
    keys, js = [], []
    for (b, h, i), order in schedule.dq_orders.items():
        if order is None:
            continue  # atomic: arrival order, no edge
        keys.extend([(b * p.heads + h) * p.n_q + i] * len(order))
        js.extend(order)
    tiles = np.array(keys, np.int64)
    return index[tiles * p.n_kv + np.array(js, np.int64)], tiles
