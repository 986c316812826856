"""``dash-verify schedule``: print a schedule: its chains per worker and its dQ orders."""

from __future__ import annotations

import argparse
from typing import TextIO

from dash_ref.schedules.schedule import BANDED, Schedule, build_schedule

from . import budget
from .args import EXIT_OK, SCHEDULES, Outcome, add_shape_args, problem_from_args


def schedule_json(s: Schedule) -> dict:
    """``{"name", "num_workers", "fingerprint", "chains": [[w, b, h, j, [i...]]...],
    "dq_order": [[b, h, i, [j...] | None]...]}``; chains in each worker's run order, dQ
    tiles sorted."""
    return {
        "name": s.name,
        "num_workers": s.num_workers,
        "fingerprint": s.fingerprint(),
        "chains": [[w, c.b, c.h, c.j, list(c.visits)] for w, c in s.chains()],
        "dq_order": [
            [b, h, i, None if order is None else list(order)]
            for (b, h, i), order in sorted(s.dq_orders.items())
        ],
    }


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "schedule", help="print a schedule: chains per worker and dQ orders",
        description="Build a schedule for one problem shape, validate it and print it.")
    p.add_argument("--name", choices=(*SCHEDULES, *BANDED), default="auto",
                   help="the schedule (banded: made for --window-size, valid for any mask)")
    add_shape_args(p, windows=True)
    budget.add_allow_large(p)
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    problem = problem_from_args(args)
    budget.require(budget.schedule_cost(problem, args.workers), args)
    s = build_schedule(problem, args.name, args.workers).validate()
    print(s.describe(), file=out)
    return Outcome(EXIT_OK, f"{s.name}: valid, fingerprint {s.fingerprint()}",
                   schedule_json(s))
