"""``dash-verify``: the command-line front end.

Each subcommand lives in its own module ``verify/cmd_<name>.py`` exposing
``add_parser(subparsers)`` (which registers the parser and sets ``func``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("demo", "schedule", "simulate", "audit", "fuzz", "check", "figures")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dash-verify",
        description="Deterministic attention: schedules, simulation, reference emulation, checks.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"verify.cmd_{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
