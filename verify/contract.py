"""The interface contract of an implementation under audit, checked on every call.

An implementation is called as ``fn(q, k, v, do, causal, softmax_scale)`` on ``(B, S, H, d)``
tensors and must return exactly four tensors ``(o, dq, dk, dv)``, or five, ``(o, dq, dk,
dv, dsink)``, when it was given ``learnable_sink``:

- ``o`` of the shape of ``do``, ``dq`` of ``q``'s, ``dk`` of ``k``'s, ``dv`` of ``v``'s;
- each of the inputs' dtype and on the inputs' device;
- ``dsink`` of the shape, dtype and device of ``learnable_sink``;
- finite everywhere when the inputs are finite (a row that sees no key has ``o = 0``
  and zero gradients, as the float64 reference has).

:func:`check_outputs` runs before anything compares or hashes an output: the audit, the
one-case check and the fuzzer (and so ``dash-verify audit``, ``check``, ``fuzz``) all
refuse to certify what they did not see. A violation raises :class:`ContractViolation`,
a :class:`Finding` (exit status 1), whose message is one line naming the output and what
was expected.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

OUTPUTS = ("O", "dQ", "dK", "dV")
#: the fifth output of a call with learnable sinks: their gradient
SINK_OUTPUT = "dsink"


def output_names(sinks: bool) -> tuple[str, ...]:
    """The outputs a call returns: :data:`OUTPUTS`, and :data:`SINK_OUTPUT` with sinks."""
    return (*OUTPUTS, SINK_OUTPUT) if sinks else OUTPUTS


class Finding(Exception):
    """The implementation misbehaved on a valid case: a finding (exit 1), not bad usage."""


class ContractViolation(Finding):
    """An implementation returned something other than what the contract asks for."""


def _fail(message: str) -> None:
    raise ContractViolation(message)


def check_outputs(result: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  do: torch.Tensor, learnable_sink: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, ...]:
    """``result`` as the tuple ``(o, dq, dk, dv)`` (``(o, dq, dk, dv, dsink)`` with
    ``learnable_sink``) if it keeps the contract, else raise.

    Raises :class:`ContractViolation` with one line: which output, what was expected, what
    came back.
    """
    names = output_names(learnable_sink is not None)
    expected = f"a tuple of {len(names)} tensors ({', '.join(names)})"
    if isinstance(result, torch.Tensor) or not isinstance(result, Sequence):
        _fail(f"returned a {type(result).__name__}, expected {expected}")
    got = tuple(result)
    if len(got) != len(names):
        missing = ", ".join(names[len(got):]) or "none"
        _fail(f"returned {len(got)} outputs, expected {len(names)} ({', '.join(names)}); "
              f"missing: {missing}")
    # O has q's rows and v's head dim, as dO does; each gradient its input's shape
    like = {"O": (do, "do"), "dQ": (q, "q"), "dK": (k, "k"), "dV": (v, "v"),
            SINK_OUTPUT: (learnable_sink, "learnable_sink")}
    finite_inputs = all(bool(x.isfinite().all()) for x in (q, k, v, do))
    for name, x in zip(names, got):
        _check_one(name, x, *like[name], finite_inputs)
    return got


def _check_one(name: str, x: object, like: torch.Tensor, like_name: str,
               finite_inputs: bool) -> None:
    if not isinstance(x, torch.Tensor):
        _fail(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    whose = "learnable_sink's" if name == SINK_OUTPUT else "the inputs'"
    if tuple(x.shape) != tuple(like.shape):
        _fail(f"{name}: expected shape {tuple(like.shape)} (that of {like_name}), got "
              f"{tuple(x.shape)}")
    if x.dtype != like.dtype:
        _fail(f"{name}: expected dtype {like.dtype} ({whose}), got {x.dtype}")
    if x.device != like.device:
        _fail(f"{name}: expected device {like.device} ({whose}), got {x.device}")
    if finite_inputs and x.numel():
        bad = int((~x.detach().isfinite()).sum())
        if bad:
            _fail(f"{name}: expected finite values for finite inputs, got {bad} of "
                  f"{x.numel()} NaN or infinite")
