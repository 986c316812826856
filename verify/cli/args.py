"""What the ``dash-verify`` subcommands share: exit codes, the outcome, flags, argument types."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from dash_ref import NAMES
from dash_ref.schedules.problem import MASKS, Problem

EXIT_OK, EXIT_FINDING, EXIT_ERROR = 0, 1, 2
DEFAULT_WORKERS = 132  # SMs of an H100/H200
SCHEDULES = ("auto", *NAMES)


@dataclass
class Outcome:
    """What a subcommand found: its exit code (0 or 1), a one-line summary, its data."""

    code: int
    summary: str
    result: dict = field(default_factory=dict)


# -- argument types: a bad value is a usage error (exit 2) that names the rule ----------------
def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def at_least(minimum: int):
    """An integer type with a lower bound."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


positive_int = at_least(1)
nonnegative_int = at_least(0)


def cost(text: str) -> float:
    """A finite, non-negative cost."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text}")
    return value


def output_file(text: str) -> Path:
    """A file that can be written: its folder exists and is writable."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} is not writable")
    return path


# -- shared flags ---------------------------------------------------------------------------
def add_shape_args(parser: argparse.ArgumentParser, workers: bool = True) -> None:
    """The problem-shape flags (and the worker count) shared by several subcommands."""
    g = parser.add_argument_group("problem shape")
    g.add_argument("--mask", choices=MASKS, default="full", help="attention mask")
    g.add_argument("--seqlen-q", type=positive_int, default=1024, metavar="N",
                   help="query length S_q")
    g.add_argument("--seqlen-k", type=positive_int, default=None, metavar="N",
                   help="key length S_k (default: --seqlen-q)")
    g.add_argument("--block-m", type=positive_int, default=128, metavar="BM",
                   help="query rows per tile")
    g.add_argument("--block-n", type=positive_int, default=128, metavar="BN",
                   help="key rows per tile")
    g.add_argument("--batch", type=positive_int, default=1, metavar="B", help="batch size")
    g.add_argument("--heads", type=positive_int, default=1, metavar="H", help="query heads")
    g.add_argument("--heads-kv", type=positive_int, default=None, metavar="H_KV",
                   help="key/value heads, a divisor of H (GQA; default: --heads)")
    g.add_argument("--head-dim", type=positive_int, default=128, metavar="D", help="head dim")
    if workers:
        g.add_argument("--workers", type=positive_int, default=DEFAULT_WORKERS, metavar="W",
                       help="persistent workers (SMs); pin it to reproduce the same orders")


def problem_from_args(args: argparse.Namespace) -> Problem:
    """The :class:`Problem` the shape flags describe (``ValueError`` if inconsistent)."""
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


def add_impl_args(parser: argparse.ArgumentParser) -> None:
    """``--impl``, ``--dtype`` and ``--seed`` of the checks."""
    parser.add_argument("--impl", required=True,
                        help="emulator:NAME, dash:NAME, dash-exact:NAME, sdpa-BACKEND[-det], "
                             "fa4[-det] or module:function (NAME: a schedule or auto)")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16",
                        help="input dtype")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="input seed")
