"""Implementations that break the interface contract or misbehave: none may be certified.

Each takes ``(q, k, v, do, causal, softmax_scale)`` like a real one; most start from the
correct :func:`planted.reference_cast` and then break one promise of
:mod:`verify.contract`, or raise, exit, interrupt themselves, print or hang.
"""

from __future__ import annotations

import sys
import time

import torch
from planted import reference_cast


def _good(*args):
    return reference_cast(*args)


# -- the number and kind of outputs ----------------------------------------------------------
def three_outputs(*args):
    return _good(*args)[:3]


def five_outputs(*args):
    return (*_good(*args), _good(*args)[0])


def no_outputs(*args):
    return ()


def one_tensor(*args):
    return _good(*args)[0]


def returns_none(*args):
    return None


def returns_dict(*args):
    return dict(zip(["o", "dq", "dk", "dv"], _good(*args)))


def returns_generator(*args):
    return (x for x in _good(*args))


def dv_as_list(*args):
    o, dq, dk, dv = _good(*args)
    return o, dq, dk, dv.tolist()


def o_as_numpy(*args):
    o, dq, dk, dv = _good(*args)
    return o.float().numpy(), dq, dk, dv


def dq_is_none(*args):
    o, _, dk, dv = _good(*args)
    return o, None, dk, dv


# -- shapes ------------------------------------------------------------------------------------
def o_one_rank_more(*args):
    o, dq, dk, dv = _good(*args)
    return o[None], dq, dk, dv


def o_with_the_query_head_dim(q, k, v, do, *rest):
    """Shapes the output like ``q``: right until ``v`` has a head dim of its own."""
    o, dq, dk, dv = _good(q, k, v, do, *rest)
    return (o if o.shape == q.shape else q.clone()), dq, dk, dv


def dq_without_batch(*args):
    o, dq, dk, dv = _good(*args)
    return o, dq[0], dk, dv


def dk_one_row_short(*args):
    o, dq, dk, dv = _good(*args)
    return o, dq, dk[:, :-1], dv


def dv_flattened(*args):
    o, dq, dk, dv = _good(*args)
    return o, dq, dk, dv.reshape(-1)


def empty_outputs(*args):
    return tuple(torch.empty(0, dtype=x.dtype) for x in _good(*args))


# -- dtypes and devices ------------------------------------------------------------------------
def float64_outputs(*args):
    return tuple(x.double() for x in _good(*args))


def float32_dv(*args):
    o, dq, dk, dv = _good(*args)
    return o, dq, dk, dv.float()


def fp16_for_bf16(*args):
    return tuple(x.to(torch.float16 if x.dtype == torch.bfloat16 else torch.bfloat16)
                 for x in _good(*args))


def integer_outputs(*args):
    return tuple(x.to(torch.int64) for x in _good(*args))


def meta_outputs(*args):
    return tuple(x.to("meta") for x in _good(*args))


# -- values ------------------------------------------------------------------------------------
def all_nan(*args):
    return tuple(torch.full_like(x, float("nan")) for x in _good(*args))


def one_inf_in_dk(*args):
    o, dq, dk, dv = _good(*args)
    dk = dk.clone()
    dk.view(-1)[0] = float("inf")
    return o, dq, dk, dv


# -- behaviour ---------------------------------------------------------------------------------
def raises(*args):
    raise RuntimeError("boom")


def raises_memory_error(*args):
    raise MemoryError("out of memory")


def exits_3(*args):
    sys.exit(3)


def exits_0(*args):
    sys.exit(0)


def exits_with_text(*args):
    sys.exit("giving up")


def interrupts_itself(*args):
    raise KeyboardInterrupt


def hangs(*args):
    time.sleep(600)
    return _good(*args)


def prints(*args):
    print("a line from the implementation")
    sys.stdout.write("and another\n")
    return _good(*args)


__all__ = [name for name, obj in dict(globals()).items()
           if callable(obj) and not name.startswith("_") and obj.__module__ == __name__]
