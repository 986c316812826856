"""``dash-verify``: the command-line front end.

One module per subcommand, each exposing ``add_parser(subparsers)`` (which registers the
parser and sets ``func``), in two groups: the schedule model (:mod:`.schedule`,
:mod:`.simulate`) and the checks (:mod:`.demo`, :mod:`.audit`, :mod:`.fuzz`,
:mod:`.check`). :mod:`.args` holds the flags they share.
"""

from __future__ import annotations

import argparse
import sys

from . import audit, check, demo, fuzz, schedule, simulate

#: subcommands in the order ``--help`` lists them: the model first, then the checks
COMMANDS = {"schedule": schedule, "simulate": simulate, "demo": demo, "audit": audit,
            "fuzz": fuzz, "check": check}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dash-verify",
        description="Deterministic attention: schedules, simulation, reference emulation, checks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
