"""L2: every step of an exact-mode backward, the kernel's bits beside the CPU emulation's.

Given the kernel's inputs, its ``O`` and ``LSE2`` and what its audit mode wrote,
:func:`l2_steps` recomputes the backward with ``dash_ref.emulate.backward(...,
arithmetic=EXACT)`` and pairs each kernel value with the emulator's, in the order the
backward computes them: ``D``, the dQ partials (on the query rows that exist), the dQ
accumulators, the per-head dK/dV accumulators (one query head per KV head only; with GQA
the emulator keeps only their sums) and the rounded ``dQ``, ``dK``, ``dV``. A kernel in
``exact`` mode must match on every step (``torch.equal``).

The arithmetic choices a launch makes travel in the kernel's audit record and are honoured
here: whether the dQ additions flushed subnormals (:func:`record_steps` reads
``flush_subnormals`` from the record); a record of the fast arithmetic is refused with a
message, never compared.
"""

from __future__ import annotations

import torch

from dash_ref import Schedule
from dash_ref.arithmetic.steps import EXACT, delta
from dash_ref.emulate import backward

#: what the kernel must provide, by name: its audit record's fields and its gradients
KERNEL_VALUES = ("delta", "partials", "dq_acc", "dk_heads", "dv_heads", "dq", "dk", "dv")


def l2_steps(schedule: Schedule, inputs: tuple[torch.Tensor, ...],
             kernel: dict[str, torch.Tensor], softmax_scale: float | None = None,
             flush_subnormals: bool = True) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """``[(step, kernel value, emulated value)]`` for one exact-mode backward.

    ``inputs`` is ``(q, k, v, o, lse2, do)`` and ``kernel`` maps :data:`KERNEL_VALUES` to
    the kernel's tensors, all on the CPU. ``flush_subnormals`` is how the kernel's dQ
    additions treated subnormals (its audit record says).
    """
    missing = [name for name in KERNEL_VALUES if name not in kernel]
    if missing:
        raise ValueError(f"kernel values missing: {missing}")
    q, k, v, o, lse2, do = inputs
    p = schedule.problem
    arithmetic = EXACT.with_dq_adds(flush_subnormals)
    emu = backward(schedule, q, k, v, o, lse2, do, softmax_scale, return_partials=True,
                   arithmetic=arithmetic)
    rows = torch.tensor([min(p.block_m, p.seqlen_q - i * p.block_m)
                         for i in schedule.to_tables().visit_q.tolist()])
    real_rows = torch.arange(p.block_m)[None, :] < rows[:, None]  # padding rows are not read
    steps = [("D", kernel["delta"], delta(arithmetic, o, do)),
             ("partials", kernel["partials"][real_rows], emu.partials[real_rows]),
             ("dq_acc", kernel["dq_acc"], emu.dq_acc)]
    if p.heads == p.heads_kv:
        steps += [("dk_acc", kernel["dk_heads"], emu.dk_acc),
                  ("dv_acc", kernel["dv_heads"], emu.dv_acc)]
    steps += [("dq", kernel["dq"], emu.dq), ("dk", kernel["dk"], emu.dk),
              ("dv", kernel["dv"], emu.dv)]
    return steps


def kernel_values(record, grads: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """:data:`KERNEL_VALUES` on the CPU from a ``BackwardAudit`` and the ``(dQ, dK, dV)``."""
    values = {name: getattr(record, name).cpu() for name in KERNEL_VALUES[:5]}
    values.update(zip(("dq", "dk", "dv"), (g.cpu() for g in grads)))
    return values


def record_steps(record, inputs: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...],
                 softmax_scale: float | None = None
                 ) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """:func:`l2_steps` for a kernel's audit record, with the record's arithmetic choices.

    ``inputs`` is ``(q, k, v, o, lse2, do)`` (any device) and ``grads`` the kernel's
    ``(dQ, dK, dV)``. A record of the fast arithmetic cannot be reproduced on the CPU: it
    raises ``ValueError`` saying so.
    """
    if not record.exact:
        raise ValueError("L2 reproduces the exact arithmetic only: run the backward with "
                         "exact=True (this audit record is from the fast arithmetic)")
    return l2_steps(record.schedule, tuple(x.cpu() for x in inputs),
                    kernel_values(record, grads), softmax_scale,
                    flush_subnormals=record.flush_subnormals)
