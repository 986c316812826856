"""``dash-verify audit``: run one implementation many times and count distinct bit patterns."""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from . import budget
from .args import (
    EXIT_FINDING,
    EXIT_OK,
    Outcome,
    add_feature_args,
    add_impl_args,
    add_shape_args,
    at_least,
    impl_from_args,
    problem_from_args,
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "audit", help="audit run-to-run determinism of an attention backward",
        description="Run forward + backward TRIALS times on identical inputs (perturbing "
                    "streams, allocations and unrelated work between runs) and count the "
                    "distinct bit patterns of O, dQ, dK, dV. Every call's outputs are held "
                    "to the interface contract first (four tensors, the inputs' shapes, "
                    "dtype and device, finite). Exit 0 if each output had one pattern, 1 "
                    "if not or if the implementation crashed, exited, timed out or broke "
                    "the contract. With --window-size every call runs the window, with "
                    "--seqlens-q a packed batch, with --softcap and --learnable-sink those "
                    "features (dsink is then audited too); an implementation that takes "
                    "none of them is refused, exit 2.")
    add_impl_args(p)
    add_shape_args(p, workers=False, impl_tiles=True, windows=True, packed=True)
    add_feature_args(p)
    budget.add_allow_large(p)
    p.add_argument("--trials", type=at_least(2), default=100, help="runs to compare")
    p.add_argument("--no-perturb", dest="perturb", action="store_false",
                   help="run without a busy stream, fresh allocations or unrelated work")
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    from verify.audit import audit

    impl = impl_from_args(args)
    problem = problem_from_args(args, impl.tiles or (16, 16))
    if impl.tiles is not None:  # the emulator: its cost is known
        budget.require(budget.emulator_cost(problem, args.trials), args)
    report = audit(impl, problem, trials=args.trials, perturb=args.perturb, dtype=args.dtype,
                   seed=args.seed, timeout=args.timeout, softcap=args.softcap,
                   learnable_sink=args.learnable_sink)
    print(report.summary(), file=out)
    if report.times_ms:
        print(report.timing(), file=sys.stderr)
    verdict = ("deterministic" if report.deterministic else report.failure
               or "NOT deterministic")
    return Outcome(EXIT_OK if report.deterministic else EXIT_FINDING,
                   f"{args.impl}: {verdict} over {args.trials} trials" if not report.failure
                   else f"{args.impl}: {verdict}", report.to_json())
