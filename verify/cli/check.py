"""``dash-verify check``: one case against the float64 reference (what ``fuzz`` reproduces)."""

from __future__ import annotations

import argparse

from verify.cli.args import add_shape_args, problem_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="check one shape of an implementation against float64")
    p.add_argument("--impl", required=True)
    add_shape_args(p)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--schedule", default="naive",
                   help="recorded with the case only: the implementation name picks the "
                        "schedule (emulator:NAME, dash:NAME, dash-exact:NAME)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from verify.fuzz import check
    from verify.strategies import Case

    result = check(args.impl, Case(problem_from_args(args), args.dtype, args.schedule,
                                   args.seed))
    errs = ", ".join(f"{k} {v:.2e}" for k, v in result.errors.items())
    print(f"{'PASS' if result.ok else 'FAIL'} {args.impl}: normwise errors {errs}"
          f"{'' if result.ok else '; ' + result.message}")
    return 0 if result.ok else 1
