"""What a request will cost, estimated before any work starts, and the budget it must fit.

Every estimate is rough (measured on a 2-core CPU) and errs high; it exists so that a typo
such as ``--seqlen-q 10000000000`` or ``--workers 100000000`` is refused at once with the
estimate and the way to go on anyway (``--allow-large``), instead of growing for minutes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dash_ref import Problem

#: the budget a request must fit without ``--allow-large``
MAX_SECONDS = 600.0
MAX_BYTES = 4e9

# rough costs on a 2-core CPU
SCHEDULE_S_PER_VISIT, SCHEDULE_B_PER_VISIT = 2e-6, 300
SIMULATE_S_PER_VISIT, SIMULATE_B_PER_VISIT = 4e-6, 350  # per schedule simulated
BYTES_PER_WORKER = 2_000
EMULATOR_S_PER_VISIT, EMULATOR_S_PER_MAC = 150e-6, 1e-9  # one forward + backward
DEMO_SECONDS_AT_DEFAULT = 15.0  # S = 256, d = 32, 4 heads: scales with S^2 d


@dataclass(frozen=True)
class Cost:
    seconds: float
    bytes: float
    what: str  # the quantity the estimate comes from, said in the refusal


def visits(p: Problem) -> int:
    """Tile pairs over all heads, an upper bound (causal masks skip about half)."""
    return p.batch * p.heads * p.n_q * p.n_kv


def schedule_cost(p: Problem, workers: int, schedules: int = 1, simulate: bool = False
                  ) -> Cost:
    v = visits(p)
    per_s = SIMULATE_S_PER_VISIT if simulate else SCHEDULE_S_PER_VISIT
    per_b = SIMULATE_B_PER_VISIT if simulate else SCHEDULE_B_PER_VISIT
    return Cost(schedules * v * per_s, schedules * v * per_b + workers * BYTES_PER_WORKER,
                f"{v:.3g} tile visits, {workers} workers")


def emulator_cost(p: Problem, calls: int) -> Cost:
    v = visits(p)
    per_visit = EMULATOR_S_PER_VISIT + EMULATOR_S_PER_MAC * p.block_m * p.block_n * p.head_dim
    elements = p.batch * p.head_dim * (p.seqlen_q * p.heads + p.seqlen_k * p.heads_kv)
    return Cost(calls * v * per_visit, 40 * elements,
                f"{calls} emulator calls of {v:.3g} tile visits")


def demo_cost(seqlen: int, head_dim: int) -> Cost:
    scale = (seqlen / 256) ** 2 * (head_dim / 32)
    return Cost(DEMO_SECONDS_AT_DEFAULT * scale, 200 * seqlen * seqlen,
                f"S = {seqlen}, d = {head_dim}, 50-digit mpmath gradients")


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    raise AssertionError  # pragma: no cover


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.3g} s"
    return f"{s / 60:.3g} min" if s < 7200 else f"{s / 3600:.3g} h"


def require(cost: Cost, args: argparse.Namespace) -> None:
    """Refuse (``ValueError``, exit 2) a request over the budget unless ``--allow-large``."""
    if getattr(args, "allow_large", False):
        return
    if cost.seconds > MAX_SECONDS or cost.bytes > MAX_BYTES:
        raise ValueError(f"this request would take about {_duration(cost.seconds)} and "
                         f"{_size(cost.bytes)} ({cost.what}), over the budget of "
                         f"{_duration(MAX_SECONDS)} and {_size(MAX_BYTES)}; use a smaller "
                         "shape, or pass --allow-large to run it anyway")


def add_allow_large(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-large", action="store_true",
                        help=f"run a request estimated over the budget ({_duration(MAX_SECONDS)}"
                             f", {_size(MAX_BYTES)}); without it such a request is refused "
                             "(exit 2) with the estimate")
