"""A call's options as one value: checked once at the public entry, then carried whole.

:meth:`Options.checked` validates what a user wrote (types and values; one-line errors that
name the argument) and resolves the softmax scale; from there every layer takes the one
value: the eager autograd function keeps it as it is, and the custom ops, whose schema
``torch.compile`` traces, receive its fields as plain arguments (:meth:`Options.flat`, in
field order) and rebuild it. What depends on shapes and the device (the backend, the
schedule) is resolved once per call inside the ops (``dash_cuda.ops``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dash_ref import Mask
from dash_ref.arithmetic.steps import resolve_scale

from .checks import check_options


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

    @classmethod
    def checked(cls, head_dim: int, *, causal: bool = False, softmax_scale: float | None = None,
                schedule: str = "auto", deterministic: bool = True,
                num_workers: int | None = None, exact: bool = False, backend: str = "auto",
                portable: bool = False) -> Options:
        """The options of a public call, validated, with the default scale filled in."""
        check_options(causal, softmax_scale, schedule, deterministic, num_workers, exact,
                      backend, portable)
        return cls(causal, resolve_scale(softmax_scale, head_dim), schedule, deterministic,
                   portable, num_workers, exact, backend)

    @property
    def mask(self) -> Mask:
        """The mask as a value, with the one visibility rule (:class:`dash_ref.Mask`)."""
        return Mask.of(self.causal)

    def flat(self) -> tuple:
        """The fields in order: the custom ops' arguments after the tensors."""
        return tuple(getattr(self, name) for name in FIELDS)


FIELDS = tuple(f.name for f in fields(Options))

__all__ = ["FIELDS", "Options"]
