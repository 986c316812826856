"""``dash-verify check``: one case against the float64 reference (what ``fuzz`` reproduces)."""

from __future__ import annotations

import argparse
from typing import TextIO

from dash_ref import BANDED, RAGGED

from . import budget
from .args import (
    EXIT_FINDING,
    EXIT_OK,
    SCHEDULES,
    Outcome,
    add_feature_args,
    add_impl_args,
    add_shape_args,
    case_from_args,
    impl_from_args,
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "check", help="check one shape of an implementation against float64",
        description="Run one case and hold O, dQ, dK, dV to the float64 reference within "
                    "the bound of verify.highprec (and to L1/L2 where the implementation "
                    "has an audit mode), after holding them to the interface contract. Exit "
                    "0 if it passes, 1 if not or if the implementation crashed, exited, "
                    "timed out or broke the contract. With --window-size, --softcap or "
                    "--learnable-sink the implementation and the reference run them, with "
                    "--seqlens-q a packed batch, each sequence held to its own bound (one "
                    "that takes none is refused, exit 2).")
    add_impl_args(p)
    add_shape_args(p, workers=False, impl_tiles=True, windows=True, packed=True)
    add_feature_args(p)
    budget.add_allow_large(p)
    p.add_argument("--schedule", choices=(*SCHEDULES, *RAGGED, *BANDED), default="naive",
                   help="recorded with the case only: the implementation name picks the "
                        "schedule (emulator:NAME, dash:NAME, dash-exact:NAME)")
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    from verify.fuzz import check

    impl = impl_from_args(args)
    case = case_from_args(args, impl.tiles or (16, 16))
    if impl.tiles is not None:  # the emulator: its cost is known
        budget.require(budget.emulator_cost(case.problem, 1), args)
    result = check(impl, case, timeout=args.timeout)
    errs = ", ".join(f"{k} {v:.2e}" for k, v in result.errors.items())
    verdict = "PASS" if result.ok else "FAIL"
    said = [f"normwise errors {errs}"] if errs else []
    said += [] if result.ok else [result.message]
    print(f"{verdict} {args.impl}: {'; '.join(said) or 'no output compared'}", file=out)
    data = {"ok": result.ok, "kind": result.kind, "errors": result.errors,
            "message": result.message, "case": result.case.flags(impl.tiles is not None),
            "tiles": impl.tiles}
    if case.problem.is_windowed:
        data["window_size"] = list(case.problem.window_size)
    return Outcome(EXIT_OK if result.ok else EXIT_FINDING,
                   f"{args.impl}: {verdict}{'' if result.ok else ': ' + result.message}", data)
