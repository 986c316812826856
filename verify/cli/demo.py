"""``dash-verify demo``: the project's main job on a CPU (see :mod:`verify.demo`)."""

from __future__ import annotations

import argparse
from typing import TextIO

from . import budget
from .args import EXIT_FINDING, EXIT_OK, Outcome, at_least, nonnegative_int, positive_int


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo", help="every schedule on one small problem: bits and accuracy",
        description="Every schedule on one small problem (CPU): fingerprints, which bits "
                    "differ from naive, errors against 50-digit mpmath, and one dQ "
                    "element's running sum under two schedules. Exit 1 if an error exceeds "
                    "its bound.")
    p.add_argument("--seqlen", type=positive_int, default=256, help="S_q = S_k")
    p.add_argument("--head-dim", type=at_least(2), default=32, help="head dim d")
    p.add_argument("--block", type=positive_int, default=32, help="BM = BN")
    p.add_argument("--workers", type=positive_int, default=4, help="persistent workers")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="input seed")
    budget.add_allow_large(p)
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    from verify.demo import run_demo

    budget.require(budget.demo_cost(args.seqlen, args.head_dim), args)
    result = run_demo(seqlen=args.seqlen, head_dim=args.head_dim, block=args.block,
                      workers=args.workers, seed=args.seed,
                      log=lambda line: print(line, file=out))
    bad = [f"{r['mask']}/{r['schedule']}" for r in result["rows"] if not r["within_bound"]]
    if bad:
        return Outcome(EXIT_FINDING, f"error above its bound: {', '.join(bad)}", result)
    return Outcome(EXIT_OK, f"{len(result['rows'])} schedule runs, all within their bounds",
                   result)
