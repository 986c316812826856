"""``dash-verify schedule``: print a schedule (human-readable, or JSON with ``--json``)."""

from __future__ import annotations

import argparse
import json
import sys

from dash_ref.schedules.schedule import NAMES, Schedule, build_schedule

from .args import add_shape_args, problem_from_args


def schedule_json(s: Schedule) -> dict:
    """``{"chains": [[w, b, h, j, [i...]]...], "dq_order": [[b, h, i, [j...] | None]...],
    "fingerprint": str}``; chains in each worker's run order, dQ tiles sorted."""
    return {
        "chains": [[w, c.b, c.h, c.j, list(c.visits)] for w, c in s.chains()],
        "dq_order": [
            [b, h, i, None if order is None else list(order)]
            for (b, h, i), order in sorted(s.dq_orders.items())
        ],
        "fingerprint": s.fingerprint(),
    }


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "schedule",
        help="print a schedule: chains per worker and dQ orders",
        description="Build a schedule for one problem shape and print it.",
    )
    p.add_argument("--name", choices=(*NAMES, "auto"), default="auto")
    add_shape_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        problem = problem_from_args(args)
        s = build_schedule(problem, args.name, args.workers).validate()
    except ValueError as e:  # bad shape or invalid schedule (ScheduleError)
        print(f"dash-verify schedule: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(schedule_json(s)))
    else:
        print(s.describe())
    return 0
