"""Schedules as data: who computes which tile pair, in what order, and in what order dQ adds up.

A :class:`Schedule` is built once, here, by :func:`build_schedule`, and read by everything
else: the DAG model, the simulator, the emulator, the verifier and the GPU kernel (through
:meth:`Schedule.to_tables`). Nothing downstream re-derives an order.

Vocabulary (``docs/design.md`` section 2): a *chain* ``(b, h, j)`` is the work on KV tile ``j``
of query head ``h``; it visits its active Q tiles in its *visit order* (which fixes the
order dK_j, dV_j accumulate in), and every visit ``(i, j)`` produces an fp32 partial
``dQ_ij`` that is added into ``dQacc_i`` at the *rank* of ``j`` in the *dQ order* of
``(b, h, i)``. A *worker* (persistent CTA) runs its chains one after the other.

Schedules (``docs/design.md`` section 3), placement / visit order / dQ order:

``atomic``          greedy / ascending / none (fp32 atomics, arrival order; non-deterministic)
``naive``           greedy in ``(b, h, j)`` order / ascending / ``j`` ascending
``spt``             greedy in ``(b, h, j desc)`` order / ascending / ``j`` descending
``descending``      greedy in ``(b, h, j)`` order / descending / ``j`` ascending
``shift``           round-robin waves / cyclic shift by wave index / by (wave, step)
``symmetric_shift`` round-robin pairs ``(j, n_kv-1-j)`` / shift then fold / by (wave, step)
``interleaved``     greedy in ``(j, b, h)`` order / ascending / ``j`` ascending
``lpt``             greedy, head groups, longest chain first / descending / ``j`` in launch order
``banded``          greedy, head groups, ``(j, b, h)`` order / descending / ``j`` ascending

*Portable* schedules (:data:`PORTABLE`) fix their visit and dQ orders from the problem
alone, so their bits are the same for every ``num_workers`` (every GPU); the wave
schedules order a tile's sums by the round a chain runs in, which depends on
``num_workers``. ``interleaved`` adds in ``naive``'s orders (the same fingerprint, the same
bits) but launches the chains of all heads for one ``j`` before the next ``j``: while there
are at least as many heads as workers, chain ``j`` of a head starts after chain ``j - 1``
of that head has ended, so no hand-off ever waits, under either mask.

*Greedy* placement is list scheduling: in launch order each chain goes to the worker that
becomes free first, counting one unit of time per visit (ties to the lowest worker). It is
what a hardware block scheduler does with a non-persistent grid, made static so a
persistent kernel can read it from a table. Placement never changes the bits (they depend
on visit and dQ orders only); it changes speed, and whether a schedule can deadlock.

Wave-based schedules (``shift``, ``symmetric_shift``) place work item ``k`` (a chain, or a
pair of chains) on worker ``k mod W`` in round ``k // W``; a worker runs its items round by
round. The dQ order of a tile sorts its contributions by ``(round, step, launch index)``
where ``step`` is the position of the visit inside its item. That order is a pure function
of the shape and of ``num_workers``, which is therefore an explicit, pinnable parameter.
Every edge of the dependency graph then strictly increases ``(round, step, launch index)``,
so these schedules cannot deadlock; :meth:`Schedule.validate` checks it anyway.

Kernel tables (:meth:`Schedule.to_tables`), all ``int32``, ``W`` workers, ``C`` chains,
``V`` visits (active tile pairs over all heads), ``T`` dQ tiles (``B * H * n_q``; packed:
:attr:`Problem.num_q_tiles`)::

    worker_offsets  [W + 1]  worker w runs chains worker_offsets[w] : worker_offsets[w+1]
    chain_bhj       [C, 3]   (b, h, j) of each chain, grouped by worker, in run order
    chain_offsets   [C + 1]  chain c's visits are visit_* [chain_offsets[c] : chain_offsets[c+1]]
    visit_q         [V]      Q tile i of each visit, in the chain's visit order
    visit_rank      [V]      rank of j in the dQ order of (b, h, i); -1 for ``atomic``
    dq_count        [T]      length of the dQ order of tile t = Problem.q_tile_index(b, h, i)
                             (rectangular: (b * H + h) * n_q + i)
    q_tile_base     [B + 1]  Problem.q_tile_base(b): sequence b's dQ tiles start there (an
                             extra table: not in ScheduleTables.as_dict(), which holds what
                             today's kernels read)

A kernel visiting ``(b, h, i, j)`` waits until the semaphore of tile ``t`` equals
``visit_rank``, adds its partial, and stores ``visit_rank + 1``; after the backward every
semaphore equals ``dq_count``. Size is ``O(W + C + V + T)``.

**Packed batches** (:class:`Problem` with ``seqlens_q``, ``seqlens_k``): every schedule
builds chains ``(b, h, j)`` for ``j < n_kv_of(b)`` with sequence ``b``'s own active Q tiles,
and a dQ order for every tile ``(b, h, i)``, ``i < n_q_of(b)``, over the sequence's own
active ``j``. *Packing invariance*: for a portable schedule (:data:`PORTABLE`, and ``lpt``)
the visit order of chain ``(b, h, j)`` and the dQ order of tile ``(b, h, i)`` are exactly
those of chain ``(0, h, j)`` and tile ``(0, h, i)`` of ``build_schedule(p.sequence(b), name,
W)``, for every ``W``: a sequence's bits do not depend on the other sequences of its batch,
their order, or the number of workers. Placement (who runs which chain when) is the
batch's. The wave schedules number their waves over the whole batch, so their orders
depend on the other sequences as they depend on ``num_workers``.

``lpt`` (longest processing time first, made for ragged batches: :data:`RAGGED`): the
heads in groups of a few (the heads with the most work first; a group holds enough chains
to fill the workers, and few enough heads that what they stream stays in the L2 cache:
:func:`_head_groups`), each group's chains longest first (ties in ``(j, b, h)`` order),
placed greedily; ``descending``'s visit order; dQ order: the tile's ``j`` in launch order
(see :func:`_lpt`). Under full and causal masks a sequence's chains are never longer for a
larger ``j``, so that order is ``j`` ascending and ``lpt`` adds in ``descending``'s orders
(as ``interleaved`` adds in ``naive``'s). Under a sliding window the chains at both ends of
a band are the short ones, so ``lpt``'s orders are its own there (still deadlock-free).
Placement, the groups included, never changes the bits.

**Sliding windows** (:attr:`Problem.window_size`): every schedule covers a windowed
problem (its active tiles come from the one rule, :class:`~dash_ref.schedules.mask.Mask`)
and stays deadlock-free, by the arguments above, which never assumed a mask. ``banded``
(:data:`BANDED`, built by name, portable, not yet in :data:`NAMES`) adds in
``descending``'s orders and launches the chains ``j`` by ``j`` across the heads of a head
group; why that is the band's shift order, from the DAG model: :func:`_banded`.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .._checks import integer
from .._graph import levels_and_times
from .auto import auto_schedule
from .problem import Problem

DETERMINISTIC = ("naive", "spt", "descending", "shift", "symmetric_shift", "interleaved")
NAMES = ("atomic", *DETERMINISTIC)
#: schedules whose orders depend on the problem alone, not on ``num_workers``: the same
#: bits on every GPU (``tests/test_portable.py`` checks fingerprints across worker counts);
#: on a packed batch each sequence gets the orders it has alone (packing invariance, the
#: module docstring; ``tests/test_varlen_problem.py``)
PORTABLE = ("naive", "spt", "descending", "interleaved")
#: schedules made for packed batches of ragged lengths: built by name and portable like
#: :data:`PORTABLE` (packing invariant too), but not yet in :data:`NAMES`, which the
#: kernels' checks, the command line and the documentation's tables enumerate: they join
#: once the GPU has measured them
RAGGED = ("lpt",)
#: schedules made for sliding windows (banded masks): built by name and portable like
#: :data:`PORTABLE` (packing invariant too), kept out of :data:`NAMES` for the reason
#: :data:`RAGGED` is
BANDED = ("banded",)

TileKey = tuple[int, int, int]  # (b, h, i)


class ScheduleError(ValueError):
    """A schedule is invalid: it misses or repeats work, can deadlock, or is timing-dependent."""


@dataclass(frozen=True)
class Chain:
    """The work on KV tile ``j`` of head ``(b, h)``: its Q tiles in visit order."""

    b: int
    h: int
    j: int
    visits: tuple[int, ...]


@dataclass(frozen=True)
class ScheduleTables:
    """The int32 arrays a kernel reads (layout in the module docstring).

    ``q_tile_base`` (``B + 1`` entries: where each sequence's dQ tiles start) is an extra
    table for kernels of packed batches; :meth:`as_dict` and :meth:`nbytes` cover the six
    tables today's kernels read unless asked for it.
    """

    worker_offsets: np.ndarray
    chain_bhj: np.ndarray
    chain_offsets: np.ndarray
    visit_q: np.ndarray
    visit_rank: np.ndarray
    dq_count: np.ndarray
    q_tile_base: np.ndarray | None = None

    def as_dict(self, extra: bool = False) -> dict[str, np.ndarray]:
        """The tables by name; ``extra=True`` adds ``q_tile_base``."""
        names = [k for k in self.__dataclass_fields__ if extra or k not in _EXTRA_TABLES]
        return {k: getattr(self, k) for k in names}

    def nbytes(self, extra: bool = False) -> int:
        """Bytes of the tables :meth:`as_dict` holds."""
        return sum(a.nbytes for a in self.as_dict(extra).values())


_EXTRA_TABLES = ("q_tile_base",)


@dataclass(frozen=True, eq=False)
class Schedule:
    """A complete backward schedule for one :class:`Problem`.

    ``workers[w]`` is the tuple of chains worker ``w`` runs, in order. ``dq_orders[(b, h, i)]``
    is the tuple of ``j`` in the order their partials are added into ``dQacc_i`` (empty for
    a tile with no active pair), or ``None`` when the order is decided at run time
    (``atomic``).
    """

    problem: Problem
    name: str
    num_workers: int
    workers: tuple[tuple[Chain, ...], ...]
    dq_orders: dict[TileKey, tuple[int, ...] | None]

    # -- views ----------------------------------------------------------------------------
    @property
    def deterministic(self) -> bool:
        """True when every dQ order is fixed before the run."""
        return all(order is not None for order in self.dq_orders.values())

    def chains(self) -> Iterator[tuple[int, Chain]]:
        """``(worker, chain)`` for every chain, grouped by worker, in each worker's run order."""
        for w, chains in enumerate(self.workers):
            for chain in chains:
                yield w, chain

    @property
    def num_visits(self) -> int:
        """Visits (active tile pairs) over all heads: the rows of an audit's partials."""
        return sum(len(c.visits) for _, c in self.chains())

    def chain(self, b: int, h: int, j: int) -> Chain:
        """The chain of ``(b, h, j)``."""
        return self._chain_index[(b, h, j)]

    @property
    def _chain_index(self) -> dict[tuple[int, int, int], Chain]:
        cache = self.__dict__.get("_chain_cache")
        if cache is None:
            cache = {(c.b, c.h, c.j): c for _, c in self.chains()}
            object.__setattr__(self, "_chain_cache", cache)
        return cache

    def dq_order(self, b: int, h: int, i: int) -> tuple[int, ...] | None:
        """The ``j`` order of the partials added into ``dQacc`` of tile ``(b, h, i)``."""
        return self.dq_orders[(b, h, i)]

    def dq_rank(self, b: int, h: int, i: int) -> dict[int, int]:
        """``{j: rank}`` for tile ``(b, h, i)``: what a kernel waits for on its semaphore."""
        order = self.dq_orders[(b, h, i)]
        return {} if order is None else {j: r for r, j in enumerate(order)}

    # -- identity -------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """A hash of the problem, every visit order and every dQ order.

        Two runs with equal fingerprints (and equal inputs, dtype and arithmetic) add every
        sum in the same order, so a deterministic kernel must give them the same bits.
        Placement on workers is deliberately left out: it changes speed, never bits.
        ``atomic`` schedules have no fixed order; their fingerprint says so.
        """
        p = self.problem
        h = hashlib.sha256()
        h.update(repr((p.batch, p.heads, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim,
                       p.mask, p.block_m, p.block_n)).encode())
        if p.is_packed:  # a rectangular problem hashes as it always has
            h.update(repr(("packed", p.seqlens_q, p.seqlens_k)).encode())
        if p.is_windowed:  # so does a problem without a window, or with d_v = d
            h.update(repr(("window", p.window_size)).encode())
        if p.head_dim_v != p.head_dim:
            h.update(repr(("head_dim_v", p.head_dim_v)).encode())
        for key in sorted(self._chain_index):
            h.update(np.asarray((*key, -1, *self._chain_index[key].visits), np.int32).tobytes())
        for key in sorted(self.dq_orders):
            order = self.dq_orders[key]
            if order is None:
                return "nondeterministic"
            h.update(np.asarray((*key, -1, *order), np.int32).tobytes())
        return h.hexdigest()[:16]

    # -- checks ---------------------------------------------------------------------------
    def validate(self) -> Schedule:
        """Check coverage, deadlock-freedom and timing-freedom; raise :class:`ScheduleError`.

        Returns ``self`` so a call can be chained: ``build_schedule(...).validate()``.
        """
        _check_coverage(self)
        _check_deadlock_free(self)
        _check_timing_free(self)
        return self

    # -- kernel tables --------------------------------------------------------------------
    def to_tables(self) -> ScheduleTables:
        """The compact int32 tables a kernel reads; see the module docstring for the layout."""
        p = self.problem
        worker_offsets = [0]
        chain_bhj: list[tuple[int, int, int]] = []
        chain_offsets = [0]
        visit_q: list[int] = []
        visit_rank: list[int] = []
        deterministic = self.deterministic
        ranks: dict[TileKey, dict[int, int]] = {}
        for chains in self.workers:
            for c in chains:
                chain_bhj.append((c.b, c.h, c.j))
                for i in c.visits:
                    visit_q.append(i)
                    if not deterministic:
                        visit_rank.append(-1)
                        continue
                    key = (c.b, c.h, i)
                    if key not in ranks:
                        ranks[key] = self.dq_rank(*key)
                    visit_rank.append(ranks[key][c.j])
                chain_offsets.append(len(visit_q))
            worker_offsets.append(len(chain_bhj))
        dq_count = np.zeros(p.num_q_tiles, np.int32)
        for (b, h, i), order in self.dq_orders.items():
            dq_count[p.q_tile_index(b, h, i)] = (
                len(order) if order is not None else len(p.tile_cols_of(b)[i])
            )

        def i32(x: Sequence) -> np.ndarray:
            return np.asarray(x, dtype=np.int32)

        return ScheduleTables(
            worker_offsets=i32(worker_offsets),
            chain_bhj=i32(chain_bhj).reshape(-1, 3),
            chain_offsets=i32(chain_offsets),
            visit_q=i32(visit_q),
            visit_rank=i32(visit_rank),
            dq_count=dq_count,
            q_tile_base=i32([p.q_tile_base(b) for b in range(p.batch + 1)]),
        )

    # -- display --------------------------------------------------------------------------
    def describe(self, max_workers: int = 16, max_tiles: int = 32) -> str:
        """A human-readable listing: each worker's chains, then each dQ tile's order."""
        p = self.problem
        lines = [
            f"schedule {self.name!r}  fingerprint {self.fingerprint()}",
            f"  problem B={p.batch} H={p.heads} H_kv={p.heads_kv} S_q={p.seqlen_q} "
            f"S_k={p.seqlen_k} d={p.head_dim} mask={p.mask} BM={p.block_m} BN={p.block_n} "
            f"(n_q={p.n_q}, n_kv={p.n_kv}); workers={self.num_workers}",
        ]
        if p.is_packed:
            lines.append(f"  packed: seqlens_q={list(p.seqlens_q)} "
                         f"seqlens_k={list(p.seqlens_k)}")
        if p.is_windowed or p.head_dim_v != p.head_dim:
            lines.append(f"  window_size={p.window_size} head_dim_v={p.head_dim_v}")
        lines.append("  chains per worker, (b,h,j)[visit order]:")
        for w, chains in enumerate(self.workers[:max_workers]):
            body = " ".join(f"({c.b},{c.h},{c.j})[{' '.join(map(str, c.visits))}]"
                            for c in chains)
            lines.append(f"    w{w:<3d} {body}")
        if len(self.workers) > max_workers:
            lines.append(f"    ... {len(self.workers) - max_workers} more workers")
        lines.append("  dQ order per tile, (b,h,i): j...:")
        keys = sorted(self.dq_orders)
        for key in keys[:max_tiles]:
            order = self.dq_orders[key]
            body = "arrival order (atomics)" if order is None else " ".join(map(str, order))
            lines.append(f"    {key}: {body}")
        if len(keys) > max_tiles:
            lines.append(f"    ... {len(keys) - max_tiles} more tiles")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------
def _check_coverage(s: Schedule) -> None:
    if not _covers_exactly(s):
        _report_coverage(s)


def _covers_exactly(s: Schedule) -> bool:
    """Coverage, vectorized: True when every active tile pair is visited exactly once and
    every dQ order is a permutation of its tile's active ``j`` (else the slow check below
    names what is wrong)."""
    from .arrays import active_grid, sequence_arrays, tile_numbers, visit_arrays

    p = s.problem
    if len(s.workers) != s.num_workers or s.num_workers < 1:
        return False
    if len(s.dq_orders) != p.num_q_tiles:
        return False
    v = visit_arrays(s)
    b, h, i, j = v["b"], v["h"], v["i"], v["j"]
    if not ((b >= 0) & (b < p.batch)).all():
        return False
    seq = sequence_arrays(p)
    inside = ((h >= 0) & (h < p.heads) & (i >= 0) & (i < seq["n_q"][b]) & (j >= 0)
              & (j < seq["n_kv"][b]))
    if not inside.all():
        return False
    first_row, active = active_grid(p)
    if not active[first_row[b] + i, j].all():
        return False
    keys = tile_numbers(p, b, h, i) * max(p.n_kv, 1) + j
    if len(np.unique(keys)) != len(keys) or len(keys) != p.num_visits:
        return False
    chains = [(c.b, c.h, c.j) for _, c in s.chains()]
    if len(set(chains)) != len(chains):
        return False
    if not all(0 <= cb < p.batch and 0 <= ch < p.heads and 0 <= cj < p.n_kv_of(cb)
               for cb, ch, cj in chains):
        return False  # a chain of a KV tile its sequence lacks, even without visits
    for (tb, th, ti), order in s.dq_orders.items():
        if not (0 <= tb < p.batch and 0 <= th < p.heads and 0 <= ti < p.n_q_of(tb)):
            return False
        if order is not None and sorted(order) != list(p.tile_cols_of(tb)[ti]):
            return False
    return True


def _report_coverage(s: Schedule) -> None:
    p = s.problem
    if len(s.workers) != s.num_workers or s.num_workers < 1:
        raise ScheduleError(
            f"schedule has {len(s.workers)} worker lists for num_workers={s.num_workers}"
        )
    seen_chains: set[tuple[int, int, int]] = set()
    seen_pairs: set[tuple[int, int, int, int]] = set()
    for w, c in s.chains():
        if (c.b, c.h, c.j) in seen_chains:
            raise ScheduleError(f"chain (b={c.b}, h={c.h}, j={c.j}) is run twice (again on w{w})")
        seen_chains.add((c.b, c.h, c.j))
        if not (0 <= c.b < p.batch and 0 <= c.h < p.heads and 0 <= c.j < p.n_kv_of(c.b)):
            raise ScheduleError(f"chain (b={c.b}, h={c.h}, j={c.j}) is outside the problem")
        for i in c.visits:
            if not p.active(i, c.j, c.b):
                raise ScheduleError(
                    f"chain (b={c.b}, h={c.h}, j={c.j}) visits tile (i={i}, j={c.j}), "
                    "which is masked or out of range"
                )
            if (c.b, c.h, i, c.j) in seen_pairs:
                raise ScheduleError(
                    f"tile (b={c.b}, h={c.h}, i={i}, j={c.j}) is visited twice"
                )
            seen_pairs.add((c.b, c.h, i, c.j))
    for b in range(p.batch):
        tile_cols = p.tile_cols_of(b)
        for h in range(p.heads):
            for i in range(p.n_q_of(b)):
                expected = tile_cols[i]
                for j in expected:
                    if (b, h, i, j) not in seen_pairs:
                        raise ScheduleError(
                            f"tile (b={b}, h={h}, i={i}, j={j}) is active but never visited"
                        )
                if (b, h, i) not in s.dq_orders:
                    raise ScheduleError(f"dQ tile (b={b}, h={h}, i={i}) has no dQ order")
                order = s.dq_orders[(b, h, i)]
                if order is None:
                    continue
                if sorted(order) != list(expected):
                    missing = sorted(set(expected) - set(order))
                    extra = sorted(set(order) - set(expected))
                    dup = sorted({j for j in order if order.count(j) > 1})
                    raise ScheduleError(
                        f"dQ order of tile (b={b}, h={h}, i={i}) is {list(order)}: "
                        f"missing j={missing}, unexpected j={extra}, repeated j={dup}"
                    )
    if len(s.dq_orders) != p.num_q_tiles:
        raise ScheduleError("dQ orders name tiles outside the problem")


def _check_deadlock_free(s: Schedule) -> None:
    """Program order on each worker plus dQ-order edges must form an acyclic graph.

    A persistent grid has every worker resident, so acyclicity is exactly deadlock-freedom.
    """
    if not s.deterministic:
        return  # atomics never wait
    from .arrays import dq_sequence, visit_arrays

    v = visit_arrays(s)
    w = v["worker"]
    same = np.flatnonzero(w[1:] == w[:-1]) + 1  # a visit after another on its worker
    at, tiles = dq_sequence(s, v)
    after = np.flatnonzero(tiles[1:] == tiles[:-1])  # next in its tile's dQ order
    src = np.concatenate((same - 1, at[after]))
    dst = np.concatenate((same, at[after + 1]))
    levels, _, _, _ = levels_and_times(len(w), src, dst)
    if sum(level.size for level in levels) == len(w):
        return
    _report_cycle(s)


def _report_cycle(s: Schedule) -> None:
    """Find a cycle of waits (node by node: only on the way to an error) and raise."""
    node: dict[tuple[int, int, int, int], int] = {}
    succ: list[list[int]] = []
    for chains in s.workers:
        prev = -1
        for c in chains:
            for i in c.visits:
                n = len(succ)
                node[(c.b, c.h, i, c.j)] = n
                succ.append([])
                if prev >= 0:
                    succ[prev].append(n)
                prev = n
    for (b, h, i), order in s.dq_orders.items():
        for j0, j1 in zip(order, order[1:]):
            succ[node[(b, h, i, j0)]].append(node[(b, h, i, j1)])
    indeg = [0] * len(succ)
    for outs in succ:
        for v in outs:
            indeg[v] += 1
    ready = [n for n, d in enumerate(indeg) if d == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                ready.append(v)
    if done == len(succ):
        return
    # Walk back along unfinished predecessors until a node repeats: that is a cycle.
    names = {n: k for k, n in node.items()}
    pred: dict[int, int] = {}
    for u, outs in enumerate(succ):
        for v in outs:
            if indeg[u] > 0 and indeg[v] > 0:
                pred[v] = u
    start = next(n for n, d in enumerate(indeg) if d > 0)
    path, seen = [start], {start}
    while pred[path[-1]] not in seen:
        path.append(pred[path[-1]])
        seen.add(path[-1])
    cycle = path[path.index(pred[path[-1]]):][::-1]
    shown = " -> ".join("(b={},h={},i={},j={})".format(*names[n]) for n in cycle[:6])
    raise ScheduleError(
        f"schedule can deadlock: a cycle of waits through {len(cycle)} tiles: {shown}"
        f"{' -> ...' if len(cycle) > 6 else ''}"
    )


def _check_timing_free(s: Schedule) -> None:
    if s.name == "atomic":
        return
    for key, order in s.dq_orders.items():
        if order is None:
            raise ScheduleError(
                f"dQ tile (b={key[0]}, h={key[1]}, i={key[2]}) of deterministic schedule "
                f"{s.name!r} has no fixed order: it would be decided at run time"
            )
    if s.name in BUILDERS:
        again = BUILDERS[s.name](s.problem, s.num_workers)
        if again.fingerprint() != s.fingerprint() or again.workers != s.workers:
            raise ScheduleError(
                f"schedule {s.name!r} is not a pure function of its shape and parameters: "
                "building it again gave a different order"
            )


# ---------------------------------------------------------------------------------------
# placement
# ---------------------------------------------------------------------------------------
Item = tuple[Chain, ...]  # chains one worker runs back to back


def _place_greedy(items: Sequence[Item], num_workers: int) -> list[list[Item]]:
    """List scheduling: each item, in launch order, to the worker free first (unit cost/visit)."""
    workers: list[list[Item]] = [[] for _ in range(num_workers)]
    free = [(0, w) for w in range(num_workers)]
    for item in items:
        t, w = heapq.heappop(free)
        workers[w].append(item)
        heapq.heappush(free, (t + sum(len(c.visits) for c in item), w))
    return workers


def _place_round_robin(items: Sequence[Item], num_workers: int) -> list[list[Item]]:
    """Item ``k`` on worker ``k mod W``, in round ``k // W``."""
    workers: list[list[Item]] = [[] for _ in range(num_workers)]
    for k, item in enumerate(items):
        workers[k % num_workers].append(item)
    return workers


def _order_by_key(
    p: Problem, keyed: dict[TileKey, list[tuple[tuple, int]]]
) -> dict[TileKey, tuple[int, ...]]:
    return {
        (b, h, i): tuple(j for _, j in sorted(keyed.get((b, h, i), [])))
        for b, h in _heads(p)
        for i in range(p.n_q_of(b))
    }


def _order_by_j(p: Problem, descending: bool) -> dict[TileKey, tuple[int, ...]]:
    step = -1 if descending else 1
    return {
        (b, h, i): p.tile_cols_of(b)[i][::step]
        for b, h in _heads(p)
        for i in range(p.n_q_of(b))
    }


def _wave_dq_orders(p: Problem, items: list[Item], num_workers: int
                    ) -> dict[TileKey, tuple[int, ...]]:
    """dQ order of a wave schedule: by (round, step inside the item, launch index)."""
    keyed: dict[TileKey, list[tuple[tuple, int]]] = {}
    for k, item in enumerate(items):
        step = 0
        for c in item:
            for i in c.visits:
                keyed.setdefault((c.b, c.h, i), []).append(((k // num_workers, step, k), c.j))
                step += 1
    return _order_by_key(p, keyed)


def _rotate(seq: Sequence[int], r: int) -> tuple[int, ...]:
    if not seq:
        return ()
    r %= len(seq)
    return tuple(seq[r:]) + tuple(seq[:r])


# ---------------------------------------------------------------------------------------
# the schedules
# ---------------------------------------------------------------------------------------
def _heads(p: Problem) -> Iterator[tuple[int, int]]:
    for b in range(p.batch):
        for h in range(p.heads):
            yield b, h


#: a head group of ``lpt`` and ``banded`` closes once it holds this many chains per worker
#: (:func:`_head_groups`; measured on the H200 from 1 to 8: 4 was the fastest, or within
#: 0.5 % of it, on the ragged packed batches and the 4096 windows, within 5 % on the rest,
#: and 1.08 - 1.34x (packed) and 1.005 - 1.09x (windows) the ungrouped order:
#: ``benchmarks/results/experiments/head_groups.md``)
GROUP_FILL = 4


def _head_groups(p: Problem, num_workers: int) -> dict[tuple[int, int], int]:
    """The launch group of every head ``(b, h)``: the heads by their work (visits),
    descending (ties in ``(b, h)`` order), cut into groups of at least ``GROUP_FILL *
    num_workers`` chains.

    Why: a schedule that launches chain ``j`` of every head before chain ``j + 1`` of any
    keeps every head of the batch in flight at once, and each streams its own Q, dO and
    dQ accumulator rows, far more than the L2 cache holds on a 16k-token batch (``lpt`` was
    1.4x slower than ``symmetric_shift`` there on the H200). A group keeps a few heads in
    flight and still enough chains to fill every worker and its tail. Launching a group's
    heads one at a time would make a head's chains, which start together, wait for each
    other's hand-offs (the DAG model: up to 35 % slower); a group of several heads
    spaces them out.
    """
    visits = [sum(len(rows) for rows in p.chain_rows_of(b)) for b in range(p.batch)]
    groups: dict[tuple[int, int], int] = {}
    group, chains = 0, 0
    for b, h in sorted(_heads(p), key=lambda bh: (-visits[bh[0]], bh)):
        groups[b, h] = group
        chains += p.n_kv_of(b)
        if chains >= GROUP_FILL * num_workers:
            group, chains = group + 1, 0
    return groups


def _place_by_head_groups(p: Problem, num_workers: int, within: Callable[[Chain], tuple]
                          ) -> list[list[Item]]:
    """Every chain of ``p``, its visits descending, placed greedily in launch order: head
    group by head group (:func:`_head_groups`), and inside a group by ``within(chain)``
    (``lpt``'s and ``banded``'s placement)."""
    groups = _head_groups(p, num_workers)
    chains = [Chain(b, h, j, rows[::-1])
              for b, h in _heads(p) for j, rows in enumerate(p.chain_rows_of(b))]
    chains.sort(key=lambda c: (groups[c.b, c.h], *within(c)))
    return _place_greedy([(c,) for c in chains], num_workers)


def _greedy_schedule(p: Problem, name: str, num_workers: int, j_descending: bool,
                     visits_descending: bool, dq: dict[TileKey, tuple[int, ...] | None],
                     heads_inner: bool = False) -> Schedule:
    """Chains in launch order ``(b, h, j)``, or ``(j, b, h)`` with ``heads_inner``, placed
    greedily (packed: each sequence's own ``j``; ``heads_inner`` counts ``j`` over the
    longest sequence and skips the sequences that have no such tile)."""
    def js(n: int) -> range:
        return range(n - 1, -1, -1) if j_descending else range(n)

    step = -1 if visits_descending else 1
    order = ([(b, h, j) for j in js(p.n_kv) for b, h in _heads(p) if j < p.n_kv_of(b)]
             if heads_inner else [(b, h, j) for b, h in _heads(p) for j in js(p.n_kv_of(b))])
    items = [(Chain(b, h, j, p.chain_rows_of(b)[j][::step]),) for b, h, j in order]
    return _assemble(p, name, num_workers, _place_greedy(items, num_workers), dq)


def _atomic(p: Problem, num_workers: int) -> Schedule:
    dq = {(b, h, i): None for b, h in _heads(p) for i in range(p.n_q_of(b))}
    return _greedy_schedule(p, "atomic", num_workers, False, False, dq)


def _naive(p: Problem, num_workers: int) -> Schedule:
    return _greedy_schedule(p, "naive", num_workers, False, False, _order_by_j(p, False))


def _spt(p: Problem, num_workers: int) -> Schedule:
    return _greedy_schedule(p, "spt", num_workers, True, False, _order_by_j(p, True))


def _descending(p: Problem, num_workers: int) -> Schedule:
    return _greedy_schedule(p, "descending", num_workers, False, True, _order_by_j(p, False))


def _interleaved(p: Problem, num_workers: int) -> Schedule:
    """``naive``'s orders, launched ``j`` by ``j`` across all heads (see the module docstring)."""
    return _greedy_schedule(p, "interleaved", num_workers, False, False, _order_by_j(p, False),
                            heads_inner=True)


def _shift(p: Problem, num_workers: int) -> Schedule:
    """Chains of one head in one round form a wave; wave member r starts at its r-th tile."""
    items: list[Item] = []
    for b, h in _heads(p):
        chain_rows = p.chain_rows_of(b)
        for j in range(p.n_kv_of(b)):
            k = len(items)
            # index of this chain among the chains of (b, h) placed in the same round
            first_of_head_in_round = max(k - j, (k // num_workers) * num_workers)
            r = k - first_of_head_in_round
            items.append((Chain(b, h, j, _rotate(chain_rows[j], r)),))
    workers = _place_round_robin(items, num_workers)
    return _assemble(p, "shift", num_workers, workers,
                     _wave_dq_orders(p, items, num_workers))


def _symmetric_shift(p: Problem, num_workers: int) -> Schedule:
    """Fold the causal triangle into a rectangle: one worker runs chains ``j`` and ``n_kv-1-j``.

    With ``P = n_kv // 2`` pairs, let ``R`` be the active rows of chain ``n_kv - P`` (for a
    square causal problem with even ``n``: the bottom ``n/2`` rows, dense for every long
    chain). Long chain ``p`` first visits ``R`` cyclically shifted by ``p`` (phase 1, a
    dense rectangle, one row per worker per step), then its remaining rows ascending from
    the diagonal; the short chain ``n_kv-1-p`` follows, its rows descending (phase 2, the
    folded triangle: at each step the ``P`` workers of a head touch distinct rows). With
    odd ``n_kv`` the middle chain runs alone like a long chain. Every worker of a pair
    carries ``n + 1`` visits, so ``n`` workers run two heads side by side with no wait:
    the critical path is the lower bound ``m (n + 1)(c + r) / 2``.
    """
    items: list[Item] = []
    for b, h in _heads(p):
        chain_rows = p.chain_rows_of(b)  # packed: each sequence folds its own triangle
        n = p.n_kv_of(b)
        pairs = n // 2
        rect_set = set(chain_rows[n - pairs] if pairs else ())
        for q in range((n + 1) // 2):
            rows = chain_rows[q]
            shifted = _rotate([i for i in rows if i in rect_set], q)
            rest = tuple(i for i in rows if i not in rect_set)
            long_chain = Chain(b, h, q, shifted + rest)
            if q < pairs:
                items.append((long_chain, Chain(b, h, n - 1 - q, chain_rows[n - 1 - q][::-1])))
            else:
                items.append((long_chain,))
    workers = _place_round_robin(items, num_workers)
    return _assemble(p, "symmetric_shift", num_workers, workers,
                     _wave_dq_orders(p, items, num_workers))


def _banded(p: Problem, num_workers: int) -> Schedule:
    """``descending``'s orders, launched ``j`` by ``j`` across all heads: made for bands.

    **Portable**: its visit and dQ orders are ``descending``'s (the same fingerprint, the
    same bits), fixed by the problem alone, so they are the same for every ``num_workers``
    and, per sequence, for every packing; only the placement is new (greedy, head group
    by head group, :func:`_head_groups`, and inside a group in ``(j, b, h)`` order, as
    ``interleaved`` launches ``naive``'s orders).

    Why, from the DAG model. Under a sliding window chain ``j``'s active Q tiles are a
    band ``lo_j .. hi_j`` whose ends move ``BN / BM`` tiles per chain, and every chain away
    from the ends of the sequence has the same length. Visiting its band top down, chain
    ``j`` reaches tile ``X`` ``hi_j - X`` visits after it starts: for two chains of one head
    the difference of their arrival times is the same at every tile they share,
    ``(t_j' + hi_j') - (t_j + hi_j)`` (``t`` the start times), the band's form of the shift
    lemma (``docs/design.md`` section 4: a dQ edge costs nothing iff the earlier chain
    arrives first). So a tile's dQ order ``j`` ascending never makes a later chain wait as
    long as it starts no earlier and its top tile is higher: chains of one head that run
    together want different dQ tiles at each step (each starts at its own top, ``BN / BM``
    tiles above the previous one: a shift with no wrap-around). The chains that share a top
    tile are those clipped by the end of the sequence (their bands end at the last Q tile,
    a small causal triangle); launching ``j`` by ``j`` across the heads of a group starts
    two of them at least as many launches apart as the group has heads, so they rarely meet
    there at the same time either. Every edge runs forward in launch order (greedy
    placement keeps it on every worker, and each tile adds in ``j`` order, which is launch
    order within a head), so the schedule is deadlock-free for every ``num_workers``. The
    DAG model, which has no cache, predicts it within 1 - 4 % of its most loaded worker's
    work with the calibrated hand-off latency (``benchmarks/results/model_window.md``);
    the head groups cost that much there and gain more on the GPU (:func:`_head_groups`).
    Valid for every mask.
    """
    workers = _place_by_head_groups(p, num_workers, lambda c: (c.j, c.b, c.h))
    return _assemble(p, "banded", num_workers, workers, _order_by_j(p, False))


def _lpt(p: Problem, num_workers: int) -> Schedule:
    """Longest processing time first, head group by head group, placed greedily.

    Made for packed batches of ragged lengths, where launching sequence by sequence leaves
    a long sequence's chains for last. Launch order: the heads in groups
    (:func:`_head_groups`: the heads with the most work first), and inside a group by
    visits, descending, ties in ``(j, b, h)`` order (a sequence's chain ``j + 1`` is never
    longer than its chain ``j``, so inside a group chain ``j`` of every head comes before
    chain ``j + 1`` of any). Visits descending, as in ``descending`` (chains of one head
    that start together then meet each dQ tile in the same order, one hand-off apart,
    instead of one visit apart).

    Why the dQ order is the tile's ``j`` in launch order (by visits descending, then ``j``):
    greedy placement keeps the launch order on every worker, so every program-order edge
    runs from a chain to one launched later. If a tile's dQ order followed any other order,
    a chain could wait for the partial of a chain launched after it, which may sit behind
    it on its own worker: a deadlock. With the dQ order in launch order every dQ edge runs
    from an earlier-launched chain to a later one too, so every edge of the graph goes
    forward in (launch index, visit number) and it has no cycle for any ``num_workers``.
    The order depends only on the lengths of the chains of the tile's own sequence, so
    it is portable and packing invariant; under full and causal masks a sequence's chain
    ``j + 1`` is never longer than chain ``j``, so it is ``j`` ascending, ``descending``'s
    (under a sliding window it is not: the chains at the band's ends are shorter).
    """
    workers = _place_by_head_groups(p, num_workers,
                                    lambda c: (-len(c.visits), c.j, c.b, c.h))
    dq: dict[TileKey, tuple[int, ...] | None] = {}
    for b, h in _heads(p):
        chain_rows = p.chain_rows_of(b)
        for i, cols in enumerate(p.tile_cols_of(b)):
            dq[(b, h, i)] = tuple(sorted(cols, key=lambda j: (-len(chain_rows[j]), j)))
    return _assemble(p, "lpt", num_workers, workers, dq)


def _assemble(p: Problem, name: str, num_workers: int, workers: list[list[Item]],
              dq: dict[TileKey, tuple[int, ...] | None]) -> Schedule:
    return Schedule(
        problem=p,
        name=name,
        num_workers=num_workers,
        workers=tuple(tuple(c for item in items for c in item) for items in workers),
        dq_orders=dq,
    )


BUILDERS: dict[str, Callable[[Problem, int], Schedule]] = {
    "atomic": _atomic,
    "naive": _naive,
    "spt": _spt,
    "descending": _descending,
    "shift": _shift,
    "symmetric_shift": _symmetric_shift,
    "interleaved": _interleaved,
    "lpt": _lpt,
    "banded": _banded,
}


def default_schedule(mask: str, head_dim: int, seqlen: int = 4096,
                     backend: str | None = None, portable: bool = False) -> str:
    """What ``auto`` resolves to: the measured table of :mod:`dash_ref.schedules.auto`."""
    return auto_schedule(mask, head_dim, seqlen, backend, PORTABLE if portable else None)


#: the backend on whose kernels ``auto`` takes ``banded`` for sliding windows: on the H200
#: (``benchmarks/results/experiments/windows_auto_a07479d.md``, causal windows of 256 -
#: 4096 at S = 8k, 16k, d = 128) it ran at 0.99 of the speed of the table's choice at 256,
#: 1.02 - 1.04 at 1024
#: and 1.26 - 1.33 at 4096; on the Triton kernels at 0.96 - 0.99, so Triton keeps the table
WINDOWS_MEASURED_ON = "cute"

#: ``auto`` takes ``lpt`` for a packed batch whose longest sequence (keys) is more than
#: this many times the mean length, on the backend of :data:`RAGGED_MEASURED_ON`: on the
#: H200 (``benchmarks/results/experiments/head_groups.md``, causal, d = 128, 16k and 64k
#: tokens) ``lpt`` ran at 1.15 - 1.19x and 1.04 - 1.06x the table's choice on the
#: heavy-tailed mixes (longest 3.6 and 13 times the mean), and at 0.93 - 0.94x and 0.98x
#: on the equal and uniform ones (1.0 and 1.7 times)
RAGGED_SPREAD = 2.0
RAGGED_MEASURED_ON = "cute"


def is_ragged(problem: Problem) -> bool:
    """Whether ``auto`` treats a packed problem as ragged (:data:`RAGGED_SPREAD`)."""
    if not problem.is_packed or not any(problem.seqlens_k):
        return False
    lengths = problem.seqlens_k
    return max(lengths) > RAGGED_SPREAD * sum(lengths) / len(lengths)


def resolve_name(name: str, problem: Problem, backend: str | None = None,
                 portable: bool = False) -> str:
    """The schedule ``name`` stands for on ``problem``: itself, or what ``auto`` picks.

    The one place ``"auto"`` is resolved (by :func:`default_schedule`, from the longer of
    the two sequence lengths, with the entries measured on ``backend`` where there are;
    ``banded`` for a sliding window on the backend of :data:`WINDOWS_MEASURED_ON`, ``lpt``
    for a ragged packed batch, :func:`is_ragged`, on that of :data:`RAGGED_MEASURED_ON`).
    ``portable=True`` keeps to :data:`PORTABLE`, :data:`RAGGED` and :data:`BANDED` (the
    same bits for every ``num_workers``): ``auto`` picks the fastest measured portable
    schedule, and a named schedule outside the sets is refused. Unknown names raise a
    ``ValueError`` that lists the known ones.
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be a Problem, got {type(problem).__name__}")
    if not isinstance(portable, bool):
        raise TypeError(f"portable must be a bool, got {portable!r}")
    if name == "auto":
        if problem.is_windowed and backend == WINDOWS_MEASURED_ON:
            return "banded"  # measured on this backend's kernels: see WINDOWS_MEASURED_ON
        if backend == RAGGED_MEASURED_ON and is_ragged(problem):
            return "lpt"  # measured on this backend's kernels: see RAGGED_SPREAD
        return default_schedule(problem.mask, problem.head_dim,
                                max(problem.seqlen_q, problem.seqlen_k), backend, portable)
    if not isinstance(name, str) or name not in BUILDERS:
        raise ValueError(f"unknown schedule {name!r}; choose from 'auto', "
                         f"{', '.join((*NAMES, *RAGGED, *BANDED))}")
    if portable and name not in (*PORTABLE, *RAGGED, *BANDED):
        raise ValueError(f"schedule {name!r} orders its sums by num_workers, so its bits "
                         f"differ between GPUs; portable=True takes "
                         f"{', '.join((*PORTABLE, *RAGGED, *BANDED))}")
    return name


def build_schedule(problem: Problem, name: str, num_workers: int = 132) -> Schedule:
    """Build the schedule ``name`` for ``problem`` on ``num_workers`` persistent workers.

    ``num_workers`` is explicit because wave-based orders depend on it: pin it to make two
    different GPUs produce the same bits. ``name="auto"`` resolves through
    :func:`resolve_name`. Results are cached per (problem, name, workers).
    """
    name = resolve_name(name, problem)
    return _build(problem, name, integer("num_workers", num_workers, minimum=1))


@lru_cache(maxsize=256)
def _build(problem: Problem, name: str, num_workers: int) -> Schedule:
    return BUILDERS[name](problem, num_workers)
