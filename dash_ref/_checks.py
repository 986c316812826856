"""Argument checks at the public boundary: each error names the argument, its value, the rule."""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real


def integer(name: str, value: object, minimum: int | None = None) -> int:
    """``value`` as an int; a bool, a float or a string is refused, as is one below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def number(name: str, value: object, minimum: float | None = None,
           above: float | None = None) -> float:
    """``value`` as a finite float, at least ``minimum`` and greater than ``above``; NaN,
    infinities, bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, got {value:g}")
    if above is not None and value <= above:
        raise ValueError(f"{name} must be > {above:g}, got {value:g}")
    return float(value)


def boolean(name: str, value: object) -> bool:
    """``value`` if it is a bool (``0``, ``1``, ``"yes"`` and None are refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")
    return value


def choice(name: str, value: object, allowed: Iterable[str]) -> str:
    """``value`` if it is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def attention_inputs(q, k, v, **more) -> None:
    """Ranks and shapes of ``(B, S, H, d)`` attention tensors; ``more`` are shaped like ``q``.

    ``k`` and ``v`` share a shape ``(B, S_k, H_kv, d)`` with ``H % H_kv == 0``; ``more``
    (``do``, ``o``) have the shape of ``q``. A ``ValueError``/``TypeError`` names the tensor.
    """
    import torch

    named = {"q": q, "k": k, "v": v, **more}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have 4 dims (B, S, H, d), got shape "
                             f"{tuple(x.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share batch and "
                         "head dim (B, S, H, d)")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"q has {q.shape[2]} heads, k and v {k.shape[2]}: the query heads "
                         "must be a positive multiple of the key/value heads")
    for name, x in more.items():
        if x.shape != q.shape:
            raise ValueError(f"{name} must have the shape of q {tuple(q.shape)}, got "
                             f"{tuple(x.shape)}")
