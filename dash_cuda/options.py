"""A call's options as one value: checked once at the public entry, then carried whole.

:meth:`Options.checked` validates what a user wrote (types and values; one-line errors that
name the argument) and resolves the softmax scale; from there every layer takes the one
value: the eager autograd function keeps it as it is, and the custom ops, whose schema
``torch.compile`` traces, receive its fields as plain arguments (:meth:`Options.flat`, in
field order) and rebuild it. What depends on shapes and the device (the backend, the
schedule) is resolved once per call inside the ops (``dash_cuda.ops``).

A packed (varlen) call carries one more value beside them, its :class:`Packing`: the
``cu_seqlens`` offsets on the device, the ``max_seqlen`` values, and the sequences' lengths
read to the host once (:meth:`Packing.read`, one device-to-host copy, where the offsets'
values are checked; a tensor read before, unchanged, is not read again:
:func:`host_offsets`), which the schedule is built from. The custom ops receive the offsets
and ``max_seqlen`` values as arguments and read the lengths inside, where tracing does not
look.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, fields
from functools import cached_property, lru_cache

import torch

from dash_ref import Mask
from dash_ref.arithmetic.steps import resolve_scale

from .checks import check_cu_seqlens_values, check_options, check_softcap


@dataclass(frozen=True)
class Options:
    """What a call asks for beside its tensors (the arguments of :func:`dash_cuda.attention`).

    The field order is the custom ops' argument order after the tensors.
    """

    causal: bool
    softmax_scale: float  # resolved: never None
    schedule: str = "auto"
    deterministic: bool = True
    portable: bool = False
    num_workers: int | None = None
    exact: bool = False
    backend: str = "auto"
    window_size: tuple[int, int] = (-1, -1)  # FlashAttention's; (-1, -1): no window
    softcap: float = 0.0  # FlashAttention's logit softcap; 0: none

    def __post_init__(self) -> None:
        # the custom ops hand the window back as a list: one value, one hash
        object.__setattr__(self, "window_size", tuple(self.window_size))

    @classmethod
    def checked(cls, head_dim: int, **given) -> Options:
        """The options of a public call (the keywords of :meth:`_check`), validated, with
        the default scale filled in (``packed``: a varlen call, which also takes the
        schedules of :data:`dash_ref.RAGGED`; a window also takes :data:`dash_ref.BANDED`)
        and the window as FlashAttention reads it with ``causal``
        (:meth:`dash_ref.Mask.of`); ``softcap`` a finite number >= 0, refused with
        ``exact``. Checked once per distinct set of values and types: a call with the
        arguments of an earlier one gets its value back."""
        if torch.compiler.is_compiling():  # traced: the checks, not the cache
            return cls._check(head_dim, **given)
        key = _typed(head_dim, given)
        hit = _checked.get(key) if key is not None else None
        if hit is None:
            hit = cls._check(head_dim, **given)
            if key is not None:
                if len(_checked) >= _CHECKED_CACHE:
                    _checked.clear()
                _checked[key] = hit
        return hit

    @classmethod
    def _check(cls, head_dim: int, *, causal: bool = False, softmax_scale: float | None = None,
               schedule: str = "auto", deterministic: bool = True,
               num_workers: int | None = None, exact: bool = False, backend: str = "auto",
               portable: bool = False, packed: bool = False,
               window_size: tuple[int, int] | None = (-1, -1),
               softcap: float = 0.0) -> Options:
        mask = Mask.of(causal, window_size)  # one-line errors naming window_size
        check_options(causal, softmax_scale, schedule, deterministic, num_workers, exact,
                      backend, portable, packed, mask.kind == "window")
        cap = check_softcap(softcap)
        # one value per rule: causal exactly where the rule sees no key right of the
        # diagonal (FlashAttention's (-1, 0) is the causal flag), a window only where the
        # rule has one
        return cls(mask.window_size[1] == 0, resolve_scale(softmax_scale, head_dim),
                   schedule, deterministic, portable, num_workers, exact, backend,
                   mask.window_size if mask.kind == "window" else (-1, -1), cap)

    @cached_property
    def mask(self) -> Mask:
        """The mask as a value, with the one visibility rule (:class:`dash_ref.Mask`)."""
        return _mask_of(self.causal, self.window_size)

    def flat(self) -> tuple:
        """The fields in order: the custom ops' arguments after the tensors."""
        return tuple(getattr(self, name) for name in FIELDS)


FIELDS = tuple(f.name for f in fields(Options))

_checked: dict[tuple, Options] = {}
_CHECKED_CACHE = 256


def _typed(head_dim: int, given: dict) -> tuple | None:
    """The cache key of a call's options: the names, the values and their types (``1`` is
    not ``True``, nor ``(1, 0)`` a list's ``[1, 0]`` or ``(1.0, 0)``), None where a value
    is not hashable (then the options are checked and not kept)."""
    window = given.get("window_size")
    inner = tuple(map(type, window)) if isinstance(window, (tuple, list)) else ()
    values = tuple(tuple(v) if v is window and inner else v for v in given.values())
    key = (type(head_dim), head_dim, tuple(given), values, tuple(map(type, values)),
           type(window), inner)
    try:
        hash(key)
    except TypeError:
        return None
    return key


@lru_cache(maxsize=256)
def _mask_of(causal: bool, window_size: tuple[int, int]) -> Mask:
    return Mask.of(causal, window_size)


@dataclass(frozen=True, eq=False)
class Packing:
    """Where the sequences of a packed batch lie (FlashAttention's varlen layout).

    Sequence ``b`` holds query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` of the
    ``(total_q, H, d)`` tensors and key rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` of the
    ``(total_k, H_kv, d)`` ones. ``cu_seqlens_q`` / ``cu_seqlens_k`` are the int32 offsets on
    the device (the kernels read them); ``seqlens_q`` / ``seqlens_k`` the lengths on the
    host (the schedule's :class:`dash_ref.Problem` is built from them); ``max_seqlen_q`` /
    ``max_seqlen_k`` what the call said (at least every length: the forward's grid).
    """

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]

    @classmethod
    def read(cls, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
             max_seqlen_k: int, total_q: int, total_k: int) -> Packing:
        """The offsets on the host (:func:`host_offsets`: at most one copy, none for
        tensors read before), checked against the tensors' rows and the ``max_seqlen``
        values (``ValueError`` naming the argument), as a value.

        The offsets' types, dtype and length are checked before
        (:func:`dash_cuda.checks.check_cu_seqlens`), and both lie on one device.
        """
        offsets_q, offsets_k = host_offsets(cu_seqlens_q, cu_seqlens_k)
        seqlens_q, seqlens_k = check_cu_seqlens_values(offsets_q, offsets_k, int(max_seqlen_q),
                                                       int(max_seqlen_k), total_q, total_k)
        return cls(cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                   seqlens_q, seqlens_k)

    @property
    def batch(self) -> int:
        """The number of sequences ``B``."""
        return len(self.seqlens_q)


# -- the offsets on the host ------------------------------------------------------------------
#: id(tensor) -> (a weak reference to it, its version when read, its values)
_host: dict[int, tuple[weakref.ref, int, list[int]]] = {}
_host_lock = threading.Lock()


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, None where it has none (an inference-mode tensor)."""
    try:
        return t._version
    except RuntimeError:
        return None


def _forget(key: int):
    """The callback that drops a freed tensor's entry (its address may be reused)."""
    return lambda _: _host.pop(key, None)


def host_offsets(*tensors: torch.Tensor) -> list[list[int]]:
    """Each offsets tensor's values on the host, read in at most one device-to-host copy
    (which waits for the device).

    A tensor read before, and not changed in place since (PyTorch's version counter),
    is not read again: the layers of a model that share one ``cu_seqlens`` tensor
    synchronise with the device once, at the first. Values written into a tensor behind
    PyTorch's back (through ``.data``, DLPack or a kernel of one's own) are not seen, as
    no version counter sees them; pass a new tensor instead. Tensors of equal length
    (``B + 1`` each, checked before).
    """
    found: dict[int, list[int]] = {}
    with _host_lock:
        for t in tensors:
            hit = _host.get(id(t))
            if hit is not None and hit[0]() is t and hit[1] == _version(t):
                found[id(t)] = hit[2]  # (only tensors with a version are kept)
    todo = list({id(t): t for t in tensors if id(t) not in found}.values())
    if len(todo) == 1:
        read = [todo[0].tolist()]
    elif todo:  # in one copy
        read = torch.stack(todo).tolist()
    for t, values in zip(todo, read if todo else ()):
        found[id(t)] = values
        version = _version(t)
        if version is None:
            continue
        with _host_lock:
            _host[id(t)] = (weakref.ref(t, _forget(id(t))), version, values)
    return [found[id(t)] for t in tensors]


__all__ = ["FIELDS", "Options", "Packing", "host_offsets"]
