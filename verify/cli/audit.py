"""``dash-verify audit``: run one implementation many times and count distinct bit patterns."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from .args import (
    EXIT_FINDING,
    EXIT_OK,
    Outcome,
    add_impl_args,
    add_shape_args,
    at_least,
    problem_from_args,
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "audit", help="audit run-to-run determinism of an attention backward",
        description="Run forward + backward TRIALS times on identical inputs (perturbing "
                    "streams, allocations and unrelated work between runs) and count the "
                    "distinct bit patterns of O, dQ, dK, dV. Exit 0 if each output had one "
                    "pattern, 1 if not.")
    add_impl_args(p)
    add_shape_args(p, workers=False)
    p.add_argument("--trials", type=at_least(2), default=100, help="runs to compare")
    p.add_argument("--no-perturb", dest="perturb", action="store_false",
                   help="run without a busy stream, fresh allocations or unrelated work")
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    from verify.audit import audit

    report = audit(args.impl, problem_from_args(args), trials=args.trials,
                   perturb=args.perturb, dtype=args.dtype, seed=args.seed)
    print(report.summary(), file=out)
    print(report.timing(), file=sys.stderr)
    verdict = "deterministic" if report.deterministic else "NOT deterministic"
    return Outcome(EXIT_OK if report.deterministic else EXIT_FINDING,
                   f"{args.impl}: {verdict} over {args.trials} trials", report.to_json())
