"""Calls seen before: what a public call worked out, kept by the call's arguments.

A training step calls :func:`dash_cuda.attention` with the same structure every time:
tensors of the same shapes, strides, dtypes, devices and 16-byte alignment, and the same
option values. The first call of such a :func:`key` checks the tensors and the options
(:mod:`.checks`, :meth:`~dash_cuda.options.Options.checked`) and finds or makes the
forward's plan (:mod:`.plans`); :func:`remember` keeps the checked options and that plan
under the key, and a later call with an equal key takes them back (:func:`seen`): one key
and one lookup instead of the checks, the options' own cache and the plan's signature.

Nothing here decides a launch: the value kept is what the slow path computed for equal
arguments, and the checks and the options read nothing beside what the key holds (the
tensors' structure, the values and their types: ``1`` is not ``True``, nor ``[1, 0]``
``(1, 0)``). A plan kept here is dropped with the plans (:func:`dash_cuda.plans.clear`,
its ``generation``), and none is handed out inside :func:`dash_cuda.plans.suspended`.
"""

from __future__ import annotations

import contextlib

import torch

from . import plans
from .options import Options
from .plans import structure

_calls: dict[tuple, tuple[Options, object, int]] = {}
_MAX_CALLS = 1024  # keys kept; past that the cache starts over


def key(layout: str, q, k, v, sink, window_size, *arguments) -> tuple | None:
    """The key of a call of :func:`dash_cuda.attention`: ``layout``, the tensors'
    structure, ``window_size`` and the other ``arguments`` with their types; None where an
    argument is not a tensor (the checks then raise). A key holding a value that is not
    hashable is never kept."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
            and isinstance(v, torch.Tensor) and (sink is None or isinstance(sink, torch.Tensor))):
        return None
    window = window_size
    inner = ()
    if type(window_size) in (tuple, list):
        inner, window = tuple(map(type, window_size)), tuple(window_size)
    return (layout, window, type(window_size), inner, arguments, tuple(map(type, arguments)),
            structure(q), structure(k), structure(v),
            None if sink is None else structure(sink))


def seen(made: tuple | None) -> tuple[Options, object] | None:
    """``(options, forward plan or None)`` of a call whose :func:`key` is ``made``, or None
    for a key not kept (or kept before the plans were last cleared)."""
    if made is None:
        return None
    try:
        hit = _calls.get(made)
    except TypeError:  # a value that is not hashable: checked every call
        return None
    if hit is None or hit[2] != plans.generation:
        return None
    return hit[0], (hit[1] if plans.active() else None)


def remember(made: tuple | None, options: Options, plan: object) -> None:
    """Keep the checked ``options`` and the forward ``plan`` (None: the general path) of a
    call whose :func:`key` is ``made``; nothing inside :func:`dash_cuda.plans.suspended`
    (whose calls keep no plan)."""
    if made is None or not plans.active():
        return
    if len(_calls) >= _MAX_CALLS:
        _calls.clear()
    with contextlib.suppress(TypeError):  # a value that is not hashable: not kept
        _calls[made] = (options, plan, plans.generation)


def clear() -> None:
    """Forget every call."""
    _calls.clear()


__all__ = ["clear", "key", "remember", "seen"]
