"""Command-line flags shared by the ``dash-verify`` subcommands: a problem's shape."""

from __future__ import annotations

import argparse

from dash_ref.schedules.problem import MASKS, Problem

DEFAULT_WORKERS = 132  # SMs of an H100/H200


def add_shape_args(parser: argparse.ArgumentParser) -> None:
    """The problem-shape and worker flags shared by ``schedule`` and ``simulate``."""
    g = parser.add_argument_group("problem shape")
    g.add_argument("--mask", choices=MASKS, default="full")
    g.add_argument("--seqlen-q", type=int, default=1024, metavar="N")
    g.add_argument("--seqlen-k", type=int, default=None, metavar="N",
                   help="default: --seqlen-q")
    g.add_argument("--block-m", type=int, default=128, metavar="BM", help="query rows per tile")
    g.add_argument("--block-n", type=int, default=128, metavar="BN", help="key rows per tile")
    g.add_argument("--batch", type=int, default=1, metavar="B")
    g.add_argument("--heads", type=int, default=1, metavar="H")
    g.add_argument("--heads-kv", type=int, default=None, metavar="H_KV",
                   help="key/value heads (GQA); default: --heads")
    g.add_argument("--head-dim", type=int, default=128, metavar="D")
    g.add_argument("--workers", type=int, default=DEFAULT_WORKERS, metavar="W",
                   help="persistent workers (SMs); pin it to reproduce the same orders "
                        f"(default {DEFAULT_WORKERS})")


def problem_from_args(args: argparse.Namespace) -> Problem:
    """The :class:`Problem` the shape flags describe."""
    return Problem(
        batch=args.batch,
        heads=args.heads,
        heads_kv=args.heads if args.heads_kv is None else args.heads_kv,
        seqlen_q=args.seqlen_q,
        seqlen_k=args.seqlen_q if args.seqlen_k is None else args.seqlen_k,
        head_dim=args.head_dim,
        mask=args.mask,
        block_m=args.block_m,
        block_n=args.block_n,
    )
