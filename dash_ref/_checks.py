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


def window(name: str, value: object) -> tuple[int, int]:
    """A FlashAttention ``window_size``: a pair ``(left, right)`` of ints, each ``>= 0`` or
    ``-1`` (that side unbounded); None means ``(-1, -1)``. Bools, floats and other lengths
    are refused by name."""
    if value is None:
        return (-1, -1)
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a pair (left, right) of ints (-1: unbounded), got "
                        f"{value!r}")
    out = []
    for n, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, Integral):
            raise TypeError(f"{name}[{n}] must be an int (-1: unbounded), got {x!r} "
                            f"({type(x).__name__})")
        if x < -1:
            raise ValueError(f"{name}[{n}] must be >= 0, or -1 for unbounded, got {x}")
        out.append(int(x))
    return out[0], out[1]


def attention_inputs(q, k, v, **more) -> None:
    """Ranks and shapes of ``(B, S, H, d)`` attention tensors.

    ``k`` is ``(B, S_k, H_kv, d)`` with ``H % H_kv == 0``; ``v`` is ``(B, S_k, H_kv, d_v)``,
    its head dim its own (``d_v = d`` unless the problem says otherwise); ``more`` (``do``,
    ``o``) have the shape of ``q`` with ``v``'s head dim, ``(B, S_q, H, d_v)``. A
    ``ValueError``/``TypeError`` names the tensor.
    """
    _tensors({"q": q, "k": k, "v": v, **more}, "(B, S, H, d)")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must have one shape (B, S_k, H_kv; v's head dim may "
                         f"differ), got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share batch and "
                         "head dim (B, S, H, d)")
    _heads(q.shape[2], k.shape[2])
    want = (*q.shape[:3], v.shape[3])
    for name, x in more.items():
        if tuple(x.shape) != want:
            raise ValueError(f"{name} must have the shape of q with v's head dim {want}, got "
                             f"{tuple(x.shape)}")


def packed_inputs(**named) -> None:
    """Ranks and heads of packed ``(total, H, d)`` attention tensors, ``q`` and ``k`` among
    ``named`` (in the order given): each a tensor of 3 dims, and the query heads a positive
    multiple of the key/value heads. A ``ValueError``/``TypeError`` names the tensor."""
    _tensors(named, "(total, H, d)", " for a packed batch")
    _heads(named["q"].shape[1], named["k"].shape[1])


def _tensors(named: dict, layout: str, where: str = "") -> None:
    """Each of ``named`` a tensor with one dim per name of ``layout``."""
    import torch

    rank = layout.count(",") + 1
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != rank:
            raise ValueError(f"{name} must have {rank} dims {layout}{where}, got shape "
                             f"{tuple(x.shape)}")


def _heads(heads: int, heads_kv: int) -> None:
    """Query heads a positive multiple of the key/value heads."""
    if heads_kv == 0 or heads % heads_kv:
        raise ValueError(f"q has {heads} heads, k and v {heads_kv}: the query heads must be a "
                         "positive multiple of the key/value heads")
