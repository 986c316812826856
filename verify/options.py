"""Options shared by the audit, the one-case check and the fuzzer, checked strictly."""

from __future__ import annotations

from dash_ref._checks import number
from dash_ref.arithmetic.steps import default_scale


def softmax_scale_or_default(value: object, head_dim: int) -> float:
    """``value`` as a finite positive float, or ``1 / sqrt(head_dim)`` when it is None.

    A string, a bool, NaN, an infinity, zero or a negative number is refused.
    """
    if value is None:
        return default_scale(head_dim)
    return number("softmax_scale", value, above=0)


def timeout_seconds(value: object) -> float | None:
    """``value`` as seconds per call (finite, > 0), or None for no limit."""
    return None if value is None else number("timeout", value, above=0)
