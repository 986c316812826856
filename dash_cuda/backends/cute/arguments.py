"""A CuTe kernel's launch arguments, named once.

Each kernel module lists its host entry's arguments, in order, as ``(name, kind)`` pairs
beside the entry (``bwd_kernel.LAUNCH_ARGS``, ``fwd_kernel.LAUNCH_ARGS``); a test holds the
list equal to the entry's signature. From that one list come both the placeholders that
``cute.compile`` needs (:func:`placeholders`: values of the right types, never read) and a
call's real values (:func:`values`: by name, in the list's order), so no argument position
is written anywhere else.

Kinds: ``"input"`` a pointer to the inputs' dtype, ``"output"`` a pointer to the dtype the
variant writes its outputs in, ``"f32"`` / ``"i32"`` pointers to fp32 / int32, ``"int"`` an
Int32, ``"strides"`` a ``(b, s, h)`` tuple of Int32, ``"float"`` a Float32, ``"stream"`` the
CUDA stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_ptr

KINDS = ("input", "output", "f32", "i32", "int", "strides", "float", "stream")


def names(spec: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The arguments' names, in order."""
    return tuple(name for name, _ in spec)


def _ptr(dtype):
    return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=16)


def placeholders(spec: tuple[tuple[str, str], ...], input_dtype, output_dtype) -> list:
    """Arguments of the right types for ``cute.compile`` (their values are never used);
    ``input_dtype`` / ``output_dtype`` are the cutlass types the pointer kinds name."""
    made = {"input": lambda: _ptr(input_dtype), "output": lambda: _ptr(output_dtype),
            "f32": lambda: _ptr(Float32), "i32": lambda: _ptr(Int32), "int": lambda: Int32(1),
            "strides": lambda: (Int32(1), Int32(1), Int32(1)), "float": lambda: Float32(1.0),
            "stream": lambda: cuda.CUstream(0)}
    return [made[kind]() for _, kind in spec]


def values(order: tuple[str, ...], named: dict) -> list:
    """A call's arguments in ``order`` (:func:`names` of a spec) from ``named``; a missing
    or unknown name is an error, never a shifted argument."""
    try:
        if len(named) == len(order):
            return [named[name] for name in order]
    except KeyError:
        pass
    extra = sorted(set(named) - set(order))
    missing = sorted(set(order) - set(named))
    raise TypeError(f"kernel arguments: missing {missing}, unknown {extra}")


@dataclass(frozen=True)
class Template:
    """A launch's arguments worked out once but for the few that change every call (the
    pointers, the stream): :meth:`fill` places those, by the names given to
    :func:`template`, into a copy of the rest."""

    static: tuple
    slots: tuple[int, ...]

    def fill(self, *per_call) -> list:
        """The arguments in order, ``per_call`` in the slots of :func:`template`'s names."""
        args = list(self.static)
        for slot, value in zip(self.slots, per_call, strict=True):
            args[slot] = value
        return args


def template(order: tuple[str, ...], static: dict, per_call: tuple[str, ...]) -> Template:
    """The :class:`Template` of a kernel's arguments (``order``, :func:`names` of a spec):
    ``static`` names every argument but those of ``per_call``; a name missing from both,
    named twice or unknown is an error, as in :func:`values`."""
    if set(static) & set(per_call):
        raise TypeError(f"kernel arguments named twice: {sorted(set(static) & set(per_call))}")
    args = values(order, {**static, **dict.fromkeys(per_call)})
    return Template(tuple(args), tuple(order.index(name) for name in per_call))


__all__ = ["KINDS", "Template", "names", "placeholders", "template", "values"]
