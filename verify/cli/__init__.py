"""``dash-verify``: the command-line front end, built to be gated on in scripts and CI.

One module per subcommand, each exposing ``add_parser(subparsers)`` and ``run(args, out)``
(which returns an :class:`Outcome`), in two groups: the schedule model (:mod:`.schedule`,
:mod:`.simulate`) and the checks (:mod:`.demo`, :mod:`.audit`, :mod:`.fuzz`,
:mod:`.check`, and :mod:`.capture` on the GPU with :mod:`.reproduce` on any CPU).
:mod:`.args` holds the flags and argument types they share.

Exit status, the same for every subcommand (:data:`EXIT_STATUS`):

- 0: the claim holds, the check passed;
- 1: a finding (not deterministic, a mismatch, a fuzz failure, a bound exceeded);
- 2: bad usage, or an environment that cannot run the check (no CUDA device, a missing
  package): one line on stderr, no traceback (``--debug`` shows it).

``--json FILE`` (``-`` for stdout, where the human-readable report then goes to stderr)
writes one object, :data:`JSON_SCHEMA`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import traceback
from typing import TextIO

from dash_ref import __version__

from ..impls import Unavailable
from . import audit, capture, check, demo, fuzz, reproduce, schedule, simulate
from .args import EXIT_ERROR, EXIT_FINDING, EXIT_OK, Outcome

EXIT_STATUS = ("exit status: 0 the claim holds / the check passed; 1 a finding (not "
               "deterministic, a mismatch, a fuzz failure); 2 bad usage or an environment "
               "that cannot run the check (one line on stderr; --debug shows the traceback)")
JSON_SCHEMA = ('{"tool": "dash-verify", "version": str, "command": str, "argv": [str], '
               '"exit_code": 0|1|2, "summary": str (one line), "result": {...} (per command, '
               'absent on exit 2), "error": str (exit 2 only)}')

#: subcommands in the order ``--help`` lists them: the model first, then the checks
COMMANDS = {"schedule": schedule, "simulate": simulate, "demo": demo, "audit": audit,
            "fuzz": fuzz, "check": check, "capture": capture, "reproduce": reproduce}
__all__ = ["COMMANDS", "EXIT_ERROR", "EXIT_FINDING", "EXIT_OK", "Outcome", "build_parser",
           "main"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and exit 2."""

    def error(self, message: str) -> None:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown after every option's help (a None default is said in the help itself)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or isinstance(action.default, bool):
            return action.help or ""
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dash-verify", formatter_class=_Help, epilog=EXIT_STATUS,
        description="Deterministic attention: schedules, simulation, reference emulation, "
                    "determinism audits, shape fuzzing.",
    )
    parser.add_argument("--version", action="version",
                        version=f"dash-verify {__version__} (dash-attention)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="COMMAND")
    for module in COMMANDS.values():
        p = module.add_parser(sub)
        p.formatter_class = _Help
        p.epilog = f"{EXIT_STATUS}. --json writes {JSON_SCHEMA}."
        p.add_argument("--json", metavar="FILE", nargs="?", const="-", default=None,
                       help="also write the result as JSON to FILE ('-' or no FILE: stdout, "
                            "the report then goes to stderr)")
        p.add_argument("--debug", action="store_true",
                       help="on an error, show the traceback instead of one line")
    return parser


def _one_line(exc: BaseException) -> str:
    """The message of an error on one line; the type's name where the message needs it."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    plain = (ValueError, TypeError, Unavailable, OSError)
    return text if isinstance(exc, plain) else f"{type(exc).__name__}: {text}"


def _write_json(args: argparse.Namespace, argv: list[str], payload: dict) -> None:
    document = {"tool": "dash-verify", "version": __version__, "command": args.command,
                "argv": argv, **payload}
    text = json.dumps(document, indent=1, default=str) + "\n"
    if args.json == "-":
        sys.stdout.write(text)
    else:
        with open(args.json, "w") as f:
            f.write(text)


def main(argv: list[str] | None = None) -> int:
    """Run ``dash-verify`` with ``argv`` (default: the command line); return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, --version (0) and usage errors (2)
        return int(done.code or 0)
    out: TextIO = sys.stderr if args.json == "-" else sys.stdout
    try:
        if args.json not in (None, "-"):
            open(args.json, "a").close()  # fail now, not after a long run
        outcome = COMMANDS[args.command].run(args, out)
    except Exception as exc:  # noqa: BLE001 - every error becomes one line and exit 2
        if args.debug:
            traceback.print_exc()
        message = _one_line(exc)
        print(f"dash-verify {args.command}: error: {message}", file=sys.stderr)
        if args.json is not None:
            with contextlib.suppress(OSError):  # the one-line message has been printed
                _write_json(args, argv, {"exit_code": EXIT_ERROR, "summary": message,
                                         "error": message})
        return EXIT_ERROR
    if args.json is not None:
        _write_json(args, argv, {"exit_code": outcome.code, "summary": outcome.summary,
                                 "result": outcome.result})
    return outcome.code
