"""``dash-verify demo``: the project's main job on a CPU (see :mod:`verify.demo`)."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="every schedule on one small problem: bits and accuracy")
    p.add_argument("--seqlen", type=int, default=256)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--block", type=int, default=32, help="BM = BN")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from verify.demo import run_demo

    out = run_demo(seqlen=args.seqlen, head_dim=args.head_dim, block=args.block,
                   workers=args.workers, seed=args.seed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if all(r["within_bound"] for r in out["rows"]) else 1
