"""Longest paths in a node-weighted DAG given as edge arrays, one topological level at a time.

A level is every node whose predecessors all lie in earlier levels; each level is one
vectorized step, so a graph of a million nodes whose longest chain has tens of thousands
of nodes solves in well under a second. Used by the DAG model (critical paths) and by the
schedule's deadlock check (a node never reached lies on or behind a cycle).
"""

from __future__ import annotations

import numpy as np


def levels_and_times(n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None = None
                     ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """``(levels, start, finish, indeg)``: the topological levels, each node's earliest
    start and finish (``weight`` per node, zeros if None), and what is left of each
    in-degree: a node with ``indeg > 0`` was never reached (the graph has a cycle)."""
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    w = np.zeros(n + 1) if weight is None else np.append(np.asarray(weight, np.float64), 0.0)
    # successors padded to the largest out-degree; the padding points at a dummy node n
    out_deg = np.bincount(src, minlength=n)
    width = int(out_deg.max()) if n and len(src) else 1
    order = np.argsort(src, kind="stable")
    rank = np.arange(len(src)) - np.repeat(np.cumsum(out_deg) - out_deg, out_deg)
    succ = np.full((n + 1, width), n, np.int64)
    succ[src[order], rank] = dst[order]
    indeg = np.append(np.bincount(dst, minlength=n), 2**62)  # the dummy is never ready
    start = np.zeros(n + 1)
    finish = np.zeros(n)
    levels = []
    frontier = np.flatnonzero(indeg == 0)
    while frontier.size:
        levels.append(frontier)
        f = start[frontier] + w[frontier]
        finish[frontier] = f
        outs = np.take(succ, frontier, axis=0).ravel()
        np.maximum.at(start, outs, np.repeat(f, width))
        np.subtract.at(indeg, outs, 1)
        ready = outs[indeg[outs] == 0]
        if ready.size > 1:  # a node freed by two edges of this level appears twice
            ready.sort()
            ready = ready[np.concatenate(([True], ready[1:] != ready[:-1]))]
        frontier = ready
    return levels, start[:n], finish, indeg[:n]
