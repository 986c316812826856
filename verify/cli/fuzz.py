"""``dash-verify fuzz``: hypothesis-drawn shapes against float64; shrink and print a reproducer."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fuzz", help="fuzz an implementation over shapes")
    p.add_argument("--impl", required=True)
    p.add_argument("--budget", type=int, default=100, help="cases to draw at most")
    p.add_argument("--max-elements", type=int, default=20_000,
                   help="memory budget: numbers in q, k, v, dO together")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from verify.fuzz import fuzz

    result = fuzz(args.impl, budget=args.budget, max_elements=args.max_elements,
                  rng_seed=args.seed)
    if result.ok:
        print(f"PASS {args.impl}: {result.examples} cases, no failure")
        return 0
    print(f"FAIL {args.impl}: {result.failure.message}")
    print(f"smallest failing case (after shrinking): {result.failure.case}")
    print(f"reproduce: {result.reproducer()}")
    return 1
