"""``dash-verify fuzz``: hypothesis-drawn shapes against float64; shrink and print a reproducer."""

from __future__ import annotations

import argparse
from typing import TextIO

from .args import (
    EXIT_FINDING,
    EXIT_OK,
    Outcome,
    add_timeout_arg,
    at_least,
    nonnegative_int,
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from verify.fuzz import MIN_ELEMENTS

    p = subparsers.add_parser(
        "fuzz", help="fuzz an implementation over shapes",
        description="Draw shapes that break kernels (lengths of 1, off-tile lengths, S_q != "
                    "S_k, GQA/MQA), hold each to float64 within its bound (and to L1/L2 "
                    "where the implementation has an audit mode); on a failure, shrink it "
                    "and print a one-line reproducer. Exit 0 if every case passed, 1 if "
                    "one failed (a crash, an exit, a timeout or a broken interface "
                    "contract included). With --windows the shapes get sliding windows too, "
                    "with --softcaps softcaps, with --sinks learnable sinks; --packed draws "
                    "packed batches (an implementation that takes none of what is asked "
                    "is refused, exit 2).")
    p.add_argument("--impl", required=True,
                   help="emulator:NAME, dash:NAME, dash-exact:NAME, sdpa-BACKEND[-det], "
                        "fa4[-det] or module:function")
    p.add_argument("--budget", type=at_least(1), default=100, help="cases to draw at most")
    p.add_argument("--max-elements", type=at_least(MIN_ELEMENTS), default=20_000,
                   help="memory budget: numbers in q, k, v, dO together")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="hypothesis seed")
    p.add_argument("--windows", action="store_true",
                   help="draw sliding windows as well (one-sided, two-sided, zero-width, "
                        "wider than the sequence); the reproducer gives --window-size")
    p.add_argument("--value-head-dims", type=at_least(1), nargs="+", default=None,
                   metavar="D_V", help="draw values with a head dim of their own as well, "
                   "one of these or d (DeepSeek's 192 / 128); the reproducer gives "
                   "--head-dim-v")
    p.add_argument("--packed", action="store_true",
                   help="draw packed batches (FlashAttention's varlen layout) instead: "
                        "heavy-tailed mixes of lengths with empty sequences and S_q != S_k "
                        "per sequence; the reproducer gives --seqlens-q and --seqlens-k")
    p.add_argument("--softcaps", action="store_true",
                   help="draw softcaps as well (about half the cases; small caps, Gemma's "
                        "30 and 50); the reproducer gives --softcap")
    p.add_argument("--sinks", action="store_true",
                   help="draw learnable sinks as well (about half the cases; logits near "
                        "the scores, far above and below); the reproducer gives "
                        "--learnable-sink")
    add_timeout_arg(p)
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    from verify.fuzz import fuzz

    # without --windows, --value-head-dims, --packed, --softcaps or --sinks the strategy is
    # called exactly as it always was
    drawn = {"windows": True} if args.windows else {}
    if args.value_head_dims:
        drawn["value_head_dims"] = tuple(args.value_head_dims)
    drawn |= {flag: True for flag in ("packed", "softcaps", "sinks") if getattr(args, flag)}
    result = fuzz(args.impl, budget=args.budget, max_elements=args.max_elements,
                  rng_seed=args.seed, timeout=args.timeout, **drawn)
    data = {"examples": result.examples, "ok": result.ok, "skipped": result.skipped}
    if result.skipped:
        print(f"skipped {result.skipped} drawn cases that {args.impl} does not run (its own "
              "limits refuse them before any kernel)", file=out)
    if result.ok:
        print(f"PASS {args.impl}: {result.examples} cases, no failure", file=out)
        return Outcome(EXIT_OK, f"{args.impl}: {result.examples} cases passed", data)
    print(f"FAIL {args.impl}: {result.failure.message}", file=out)
    how = ("not shrunk: shrinking would call the hanging code again"
           if result.failure.kind == "timeout" else "after shrinking")
    print(f"smallest failing case ({how}): {result.failure.case}", file=out)
    print(f"reproduce: {result.reproducer()}", file=out)
    data.update(message=result.failure.message, kind=result.failure.kind,
                case=result.failure.case.flags(result.takes_tiles),
                reproducer=result.reproducer())
    return Outcome(EXIT_FINDING, f"{args.impl}: {result.failure.message}", data)
