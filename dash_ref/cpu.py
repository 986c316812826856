"""Tile-level work on a CPU runs on one thread.

The emulator and the references issue thousands of small tensor operations (a 16 x 16
tile, a row of 64). Split across threads, each one waits for its slowest thread; on a
machine where other processes keep the cores busy, a descheduled thread stalls every
operation, and a run takes many times longer than on one thread. :func:`one_thread` runs
such work single-threaded and restores the caller's setting afterwards (PyTorch's thread
count is per process, so a program that calls these functions from several threads at
once sees one thread meanwhile).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

F = TypeVar("F", bound=Callable)
_depth = threading.local()


@contextmanager
def one_thread() -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(1)``; nested uses keep the outer setting."""
    outer = getattr(_depth, "n", 0)
    saved = torch.get_num_threads()
    _depth.n = outer + 1
    try:
        if outer == 0 and saved != 1:
            torch.set_num_threads(1)
        yield
    finally:
        _depth.n = outer
        if outer == 0 and torch.get_num_threads() != saved:
            torch.set_num_threads(saved)


def single_threaded(fn: F) -> F:
    """Decorate a function of small-tile CPU work to run under :func:`one_thread`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
