"""``dash-verify reproduce``: a captured GPU run recomputed on this CPU, step by step."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from .args import EXIT_FINDING, EXIT_OK, Outcome


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "reproduce", help="recompute captured GPU runs on this CPU, bit for bit",
        description="Recompute every step of each captured run (`dash-verify capture`) with "
                    "dash_ref in the run's arithmetic: O and LSE2, D, every dQ partial, the "
                    "accumulators, dQ, dK, dV. Exit 0 if every step of every file is "
                    "bitwise equal, 1 if one differs (naming the first step and how many "
                    "elements differ), 2 on a bad or truncated file.")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="capture files")
    return p


def run(args: argparse.Namespace, out: TextIO) -> Outcome:
    from verify.capture import check, load
    from verify.l2 import first_difference

    captures = [(path, load(path)) for path in args.files]  # every file valid before work
    rows, differ = [], []
    for path, c in captures:
        steps = check(c)
        diff = first_difference(steps)
        row = {"file": str(path), "run": c.describe(), "steps": [s for s, _, _ in steps],
               "first_difference": None}
        if diff is None:
            print(f"EQUAL  {path}: {c.describe()}: all {len(steps)} steps bitwise equal "
                  f"({', '.join(row['steps'])})", file=out)
        else:
            step, n, total = diff
            row["first_difference"] = {"step": step, "elements": n, "of": total}
            differ.append(f"{path.name}: {step} differs in {n} of {total} elements")
            print(f"DIFFER {path}: {c.describe()}: first differing step {step}, {n} of "
                  f"{total} elements", file=out)
        rows.append(row)
    if differ:
        return Outcome(EXIT_FINDING, "; ".join(differ), {"files": rows})
    return Outcome(EXIT_OK, f"{len(rows)} capture(s) reproduced bit for bit on this CPU",
                   {"files": rows})
