"""``dash-verify audit``: run one implementation many times and count distinct bit patterns."""

from __future__ import annotations

import argparse
import json

from verify.cli.args import add_shape_args, problem_from_args


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="audit run-to-run determinism of an attention backward")
    p.add_argument("--impl", required=True,
                   help="emulator:NAME, sdpa-BACKEND[-det], dash:NAME, dash-exact:NAME, "
                        "fa4[-det], module:fn")
    add_shape_args(p)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-perturb", dest="perturb", action="store_false",
                   help="run without a busy stream, fresh allocations or unrelated work")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from verify.audit import audit

    report = audit(args.impl, problem_from_args(args), trials=args.trials,
                   perturb=args.perturb, dtype=args.dtype, seed=args.seed)
    print(report.summary())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0
