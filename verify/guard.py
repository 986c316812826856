"""Call code under audit so that nothing it does can change the verdict.

:func:`call` runs one call of an implementation (or the import of its module) and turns
every way it can misbehave into a :class:`~verify.contract.Finding` with a one-line
message, instead of letting it end or hijack the run:

- an exception, ``sys.exit()`` or a ``KeyboardInterrupt`` it raises itself: :class:`Crash`;
- no result within ``timeout`` seconds: :class:`TimedOut` (the call goes on in a daemon
  thread, which the process does not wait for; what that thread prints through
  ``sys.stdout`` afterwards still goes to stderr, :class:`_Router`);
- what it prints to stdout (``print``, ``sys.stdout`` and, where the platform allows, the
  file descriptor) goes to stderr, so a report or a JSON document on stdout stays clean.
  (The file descriptor is restored when the call returns or times out: C code in a
  timed-out thread that writes to fd 1 afterwards is not caught.)

A real Ctrl-C (SIGINT) still interrupts: it is told apart from a ``KeyboardInterrupt``
the code raises itself, and propagates.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from .contract import Finding


class Crash(Finding):
    """The implementation raised, exited or interrupted itself on a valid case."""


class TimedOut(Finding):
    """The implementation gave no result within the time allowed per call."""


def describe(exc: BaseException) -> str:
    """What a call did, on one line: ``raised ValueError: ...``, ``called exit(3)``."""
    if isinstance(exc, SystemExit):
        return f"called exit({exc.code!r})"
    text = " ".join(str(exc).split())
    return f"raised {type(exc).__name__}{': ' + text if text else ''}"


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what is written to stdout (Python and, if possible, fd 1) to stderr."""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if saved is not None:
            _flush_c_stdio()
            os.dup2(saved, 1)
            os.close(saved)


def _flush_c_stdio() -> None:
    """Flush the C library's stdout buffer while fd 1 still points at stderr."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).fflush(None)


class _Sigint:
    """While active, a SIGINT is recorded before it raises ``KeyboardInterrupt``."""

    def __init__(self) -> None:
        self.seen = False
        self.previous = None

    def __enter__(self) -> _Sigint:
        if threading.current_thread() is threading.main_thread():
            current = signal.getsignal(signal.SIGINT)
            if current is not signal.SIG_IGN:
                self.previous = current
                signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.seen = True
        if callable(self.previous):
            self.previous(signum, frame)
        raise KeyboardInterrupt

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class _Router:
    """``sys.stdout`` once a call has timed out: the abandoned threads' writes go to stderr,
    everyone else's to the stdout it wraps."""

    abandoned: set[threading.Thread] = set()

    def __init__(self, out) -> None:
        self.out = out

    def write(self, text: str) -> int:
        if threading.current_thread() in self.abandoned:
            return sys.stderr.write(text)
        return self.out.write(text)

    def __getattr__(self, name: str):
        return getattr(self.out, name)


def _abandon(worker: threading.Thread) -> None:
    """From now on, what ``worker`` prints through ``sys.stdout`` goes to stderr."""
    _Router.abandoned.add(worker)
    if not isinstance(sys.stdout, _Router):
        sys.stdout = _Router(sys.stdout)


def call(fn: Callable, *args, timeout: float | None = None):
    """``fn(*args)``; its misbehaviour as :class:`Crash` or :class:`TimedOut` (see above)."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - classified below
            box["error"] = exc

    abandoned = None
    try:
        with _Sigint() as sigint, stdout_to_stderr():
            if timeout is None:
                target()
            else:
                worker = threading.Thread(target=target, daemon=True, name="dash-verify call")
                worker.start()
                worker.join(timeout)
                if worker.is_alive():
                    abandoned = worker
                    raise TimedOut(f"no result within {timeout:g} s (--timeout)")
    finally:
        if abandoned is not None:  # after stdout_to_stderr has put sys.stdout back
            _abandon(abandoned)
    error = box.get("error")
    if error is None:
        return box["value"]
    if isinstance(error, KeyboardInterrupt) and sigint.seen:
        raise error  # a real Ctrl-C: stop the run
    raise Crash(describe(error)) from error
