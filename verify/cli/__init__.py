"""``dash-verify``: the command-line front end, built to be gated on in scripts and CI.

One module per subcommand, each exposing ``add_parser(subparsers)`` and ``run(args, out)``
(which returns an :class:`Outcome`), in two groups: the schedule model (:mod:`.schedule`,
:mod:`.simulate`) and the checks (:mod:`.demo`, :mod:`.audit`, :mod:`.fuzz`,
:mod:`.check`, and :mod:`.capture` on the GPU with :mod:`.reproduce` on any CPU).
:mod:`.args` holds the flags and argument types they share.

Exit status, the same for every subcommand (:data:`EXIT_STATUS`):

- 0: the claim holds, the check passed;
- 1: a finding (not deterministic, a mismatch, a fuzz failure, a bound exceeded, or an
  implementation that crashed, exited, hung past ``--timeout`` or broke the interface
  contract of :mod:`verify.contract`);
- 2: bad usage, or an environment that cannot run the check (no CUDA device, a missing
  package, an implementation that cannot be loaded): one line on stderr, no traceback
  (``--debug`` shows it);
- 130: interrupted (Ctrl-C), one line; 141: stdout was closed by its reader (``| head``),
  nothing more is written.

``--json FILE`` (``-`` for stdout, where the human-readable report then goes to stderr)
writes one object, :data:`JSON_SCHEMA`, on every one of these statuses but 141 (and to
FILE only on that one), argument errors included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from typing import TextIO

from dash_ref import __version__

from ..impls import Unavailable
from . import audit, capture, check, demo, fuzz, reproduce, schedule, simulate
from .args import EXIT_ERROR, EXIT_FINDING, EXIT_OK, Outcome

EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a process ended by SIGINT
EXIT_CLOSED_PIPE = 141  # the reader of stdout went away, as a shell reports SIGPIPE
EXIT_STATUS = ("exit status: 0 the claim holds / the check passed; 1 a finding (not "
               "deterministic, a mismatch, a fuzz failure, an implementation that crashed, "
               "exited, timed out or broke the interface contract); 2 bad usage or an "
               "environment that cannot run the check (one line on stderr; --debug shows "
               "the traceback); 130 interrupted; 141 stdout closed by its reader")
JSON_SCHEMA = ('{"tool": "dash-verify", "version": str, "command": str, "argv": [str], '
               '"exit_code": 0|1|2|130, "summary": str (one line), "result": {...} (per '
               'command, on 0 and 1), "error": str (2 and 130 only)}')

#: subcommands in the order ``--help`` lists them: the model first, then the checks
COMMANDS = {"schedule": schedule, "simulate": simulate, "demo": demo, "audit": audit,
            "fuzz": fuzz, "check": check, "capture": capture, "reproduce": reproduce}
__all__ = ["COMMANDS", "EXIT_ERROR", "EXIT_FINDING", "EXIT_OK", "Outcome", "build_parser",
           "main"]


class UsageError(Exception):
    """An argument the parser refused: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and exit 2."""

    def error(self, message: str) -> None:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


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


def _json_target(argv: list[str]) -> tuple[str | None, str | None]:
    """``(command, FILE)`` of ``--json`` read leniently from ``argv``, for an envelope
    when the real parser refuses the arguments; ``(None, None)`` without ``--json``."""
    command = next((a for a in argv if a in COMMANDS), None)
    target = None
    for n, arg in enumerate(argv):
        if arg == "--json":
            following = argv[n + 1] if n + 1 < len(argv) else ""
            target = following if following and not following.startswith("-") else "-"
        elif arg.startswith("--json="):
            target = arg.removeprefix("--json=") or "-"
    return command, target


def _write_json(target: str, command: str | None, argv: list[str], payload: dict) -> None:
    document = {"tool": "dash-verify", "version": __version__, "command": command,
                "argv": argv, **payload}
    text = json.dumps(document, indent=1, default=str) + "\n"
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        with open(target, "w") as f:
            f.write(text)


def _fail(target: str | None, command: str | None, argv: list[str], code: int,
          message: str) -> int:
    """Print ``message`` (one line) and write the envelope of a run that ended with it."""
    print(message, file=sys.stderr)
    if target is not None:
        with contextlib.suppress(OSError):  # the one-line message has been printed
            _write_json(target, command, argv, {"exit_code": code, "summary": message,
                                                "error": message})
    return code


def _stdout_closed() -> int:
    """The reader of stdout went away: stop writing there, quietly (exit 141)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    """Run ``dash-verify`` with ``argv`` (default: the command line); return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _main(argv)
    except BrokenPipeError:
        return _stdout_closed()


def _main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, --version (0)
        return int(done.code or 0)
    except UsageError as exc:
        command, target = _json_target(argv)
        return _fail(target, command, argv, EXIT_ERROR, str(exc))
    out: TextIO = sys.stderr if args.json == "-" else sys.stdout
    prefix = f"dash-verify {args.command}"
    try:
        if args.json not in (None, "-"):
            open(args.json, "a").close()  # fail now, not after a long run
        outcome = COMMANDS[args.command].run(args, out)
        if args.json is not None:
            _write_json(args.json, args.command, argv,
                        {"exit_code": outcome.code, "summary": outcome.summary,
                         "result": outcome.result})
    except KeyboardInterrupt:
        return _fail(args.json, args.command, argv, EXIT_INTERRUPTED,
                     f"{prefix}: interrupted")
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every error becomes one line and exit 2
        if args.debug:
            traceback.print_exc()
        target = None if isinstance(exc, OSError) and _is_json_path(exc, args) else args.json
        return _fail(target, args.command, argv, EXIT_ERROR, f"{prefix}: error: "
                     f"{_one_line(exc)}")
    return outcome.code


def _is_json_path(exc: OSError, args: argparse.Namespace) -> bool:
    """True when ``exc`` is about the ``--json`` file itself (no envelope can be written)."""
    return args.json not in (None, "-") and exc.filename == args.json
