"""What the ``dash-verify`` subcommands share: exit codes, the outcome, flags, argument types."""

from __future__ import annotations

import argparse
import math
import os
import re
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
# ASCII digits only: Python's int() and float() also take "1_000", " 12 ", "١٢", "1e400"
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
#: the largest integer any flag takes: beyond it no shape fits in memory anyway
MAX_INT = 2**31 - 1


def _int(text: str) -> int:
    if not _INT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected an integer (ASCII digits), got {text!r}")
    value = int(text)
    if value > MAX_INT:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_INT}, got {text}")
    return value


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


def lengths(text: str) -> tuple[int, ...]:
    """Comma-separated sequence lengths, each >= 0 (a batch of empty sequences is a
    problem too; the audit refuses one with nothing to audit)."""
    return tuple(nonnegative_int(part) for part in text.split(","))


lengths.__name__ = "comma-separated lengths"


def _float(text: str) -> float:
    if not _FLOAT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a number (ASCII digits), got {text!r}")
    return float(text)


def positive_number(text: str) -> float:
    """A finite number > 0."""
    value = _float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
    return value


def logits(text: str) -> tuple[float, ...]:
    """Comma-separated finite numbers (one sink logit per query head)."""
    values = tuple(_float(part) for part in text.split(","))
    bad = [x for x in values if not math.isfinite(x)]
    if bad:
        raise argparse.ArgumentTypeError(f"must be finite, got {bad[0]}")
    return values


logits.__name__ = "comma-separated logits"


def cost(text: str) -> float:
    """A finite, non-negative cost."""
    special = text.lower().lstrip("+-") in ("nan", "inf", "infinity")
    value = float(text) if special else _float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be finite and >= 0, got {text}")
    return value


def seconds(text: str) -> float:
    """A finite, positive number of seconds."""
    value = _float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text}")
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
def add_shape_args(parser: argparse.ArgumentParser, workers: bool = True,
                   impl_tiles: bool = False, windows: bool = False,
                   packed: bool = False) -> None:
    """The problem-shape flags (and the worker count) shared by several subcommands.

    With ``impl_tiles`` (the checks), ``--block-m``/``--block-n`` default to None: the
    implementation's own tiles; only ``emulator:NAME`` takes others. ``windows`` adds
    ``--window-size LEFT RIGHT`` (the commands that run implementations refuse it for one
    that takes no window, :attr:`verify.impls.Impl.windows`, rather than run it without).
    ``packed`` adds ``--seqlens-q`` and ``--seqlens-k``: a packed batch, one length per
    sequence, in place of ``--batch``, ``--seqlen-q`` and ``--seqlen-k``.
    """
    tiles = 16 if impl_tiles else 128
    g = parser.add_argument_group("problem shape")
    g.add_argument("--mask", choices=MASKS, default="full", help="attention mask")
    g.add_argument("--seqlen-q", type=positive_int, default=1024, metavar="N",
                   help="query length S_q")
    g.add_argument("--seqlen-k", type=positive_int, default=None, metavar="N",
                   help="key length S_k (default: --seqlen-q)")
    own = (" (default: the implementation's own; only emulator:NAME takes others, "
           f"its own are {tiles})") if impl_tiles else ""
    g.add_argument("--block-m", type=positive_int, default=None if impl_tiles else tiles,
                   metavar="BM", help=f"query rows per tile{own}")
    g.add_argument("--block-n", type=positive_int, default=None if impl_tiles else tiles,
                   metavar="BN", help=f"key rows per tile{own}")
    g.add_argument("--batch", type=positive_int, default=1, metavar="B", help="batch size")
    g.add_argument("--heads", type=positive_int, default=1, metavar="H", help="query heads")
    g.add_argument("--heads-kv", type=positive_int, default=None, metavar="H_KV",
                   help="key/value heads, a divisor of H (GQA; default: --heads)")
    g.add_argument("--head-dim", type=positive_int, default=128, metavar="D", help="head dim")
    g.add_argument("--head-dim-v", type=positive_int, default=None, metavar="D_V",
                   help="the values' head dim (default: --head-dim; DeepSeek's 192 / 128)")
    if windows:
        g.add_argument("--window-size", type=int, nargs=2, default=None,
                       metavar=("LEFT", "RIGHT"),
                       help="FlashAttention's sliding window (-1: unbounded on that side; "
                            "with --mask causal the window is (LEFT, 0))")
    if packed:
        g.add_argument("--seqlens-q", type=lengths, default=None, metavar="L,L,...",
                       help="a packed batch (FlashAttention's varlen layout): each "
                            "sequence's query length, in place of --batch and --seqlen-q")
        g.add_argument("--seqlens-k", type=lengths, default=None, metavar="L,L,...",
                       help="each sequence's key length (default: --seqlens-q)")
    if workers:
        g.add_argument("--workers", type=positive_int, default=DEFAULT_WORKERS, metavar="W",
                       help="persistent workers (SMs); pin it to reproduce the same orders")


def add_feature_args(parser: argparse.ArgumentParser) -> None:
    """``--softcap`` and ``--learnable-sink``: FlashAttention's other two options (the
    commands that run implementations refuse them for one that takes neither,
    :attr:`verify.impls.Impl.features`, rather than run without)."""
    g = parser.add_argument_group("features")
    g.add_argument("--softcap", type=positive_number, default=0.0, metavar="CAP",
                   help="FlashAttention's softcap: scores become CAP * tanh(scores / CAP) "
                        "(default: none)")
    g.add_argument("--learnable-sink", type=logits, default=None, metavar="L,L,...",
                   help="learnable attention sinks, one logit per query head (write "
                        "--learnable-sink=-1.5,2 when the first is negative); the sinks' "
                        "gradient dsink is checked too")


def problem_from_args(args: argparse.Namespace, tiles: tuple[int, int] = (16, 16)
                      ) -> Problem:
    """The :class:`Problem` the shape flags describe (``ValueError`` if inconsistent);
    ``tiles`` stand in for ``--block-m``/``--block-n`` left at None."""
    seqlens_q = getattr(args, "seqlens_q", None)
    seqlens_k = getattr(args, "seqlens_k", None)
    if seqlens_k is not None and seqlens_q is None:
        raise ValueError("--seqlens-k needs --seqlens-q (a packed batch)")
    if seqlens_q is not None:
        seqlens_k = seqlens_q if seqlens_k is None else seqlens_k
        if len(seqlens_k) != len(seqlens_q):
            raise ValueError(f"--seqlens-q has {len(seqlens_q)} lengths, --seqlens-k "
                             f"{len(seqlens_k)}: one of each per sequence")
        return Problem.packed(
            seqlens_q, seqlens_k, args.heads,
            args.heads if args.heads_kv is None else args.heads_kv, args.head_dim,
            args.mask, tiles[0] if args.block_m is None else args.block_m,
            tiles[1] if args.block_n is None else args.block_n,
            window_size=None if getattr(args, "window_size", None) is None
            else tuple(args.window_size), head_dim_v=args.head_dim_v)
    return Problem(
        batch=args.batch,
        heads=args.heads,
        heads_kv=args.heads if args.heads_kv is None else args.heads_kv,
        seqlen_q=args.seqlen_q,
        seqlen_k=args.seqlen_q if args.seqlen_k is None else args.seqlen_k,
        head_dim=args.head_dim,
        mask=args.mask,
        block_m=tiles[0] if args.block_m is None else args.block_m,
        block_n=tiles[1] if args.block_n is None else args.block_n,
        window_size=None if getattr(args, "window_size", None) is None
        else tuple(args.window_size),
        head_dim_v=args.head_dim_v,
    )


def case_from_args(args: argparse.Namespace, tiles: tuple[int, int] = (16, 16)):
    """The :class:`verify.strategies.Case` ``dash-verify check``'s flags describe: the
    problem (:func:`problem_from_args`), dtype, schedule, seed, softcap and sinks."""
    from verify.strategies import Case

    return Case(problem_from_args(args, tiles), args.dtype, args.schedule, args.seed,
                args.softcap, args.learnable_sink)


def impl_from_args(args: argparse.Namespace):
    """The implementation ``--impl`` names, running ``--block-m``/``--block-n`` if given
    (``ValueError``, exit 2, where it chooses its own tiles)."""
    from verify.impls import get_impl

    impl = get_impl(args.impl)
    if args.block_m is None and args.block_n is None:
        return impl
    if impl.tiles is None:
        raise ValueError(f"--block-m/--block-n: {args.impl} chooses its own tiles; only "
                         "emulator:NAME runs the tiles asked for")
    bm = impl.tiles[0] if args.block_m is None else args.block_m
    bn = impl.tiles[1] if args.block_n is None else args.block_n
    return impl.with_tiles(bm, bn)


def add_impl_args(parser: argparse.ArgumentParser) -> None:
    """``--impl``, ``--dtype`` and ``--seed`` of the checks."""
    parser.add_argument("--impl", required=True,
                        help="emulator:NAME, dash:NAME, dash-exact:NAME, sdpa-BACKEND[-det], "
                             "fa4[-det] or module:function (NAME: a schedule or auto)")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16",
                        help="input dtype")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="input seed")
    add_timeout_arg(parser)


def add_timeout_arg(parser: argparse.ArgumentParser) -> None:
    """``--timeout``: seconds per call of the implementation; a hang becomes a finding."""
    parser.add_argument("--timeout", type=seconds, default=None, metavar="SECONDS",
                        help="give each call of the implementation at most SECONDS; one "
                             "that takes longer is a finding (exit 1). Default: no limit")
