"""L2: every step of a forward and backward, the kernel's bits beside the CPU emulation's.

Given the kernel's inputs, its ``O`` and ``LSE2`` and what its audit mode wrote,
:func:`l2_steps` recomputes the backward with ``dash_ref.emulate.backward`` in the
arithmetic the kernel ran and pairs each kernel value with the emulator's, in the order
the backward computes them: ``D``, the dQ partials (on the query rows that exist), the dQ
accumulators, the per-head dK/dV accumulators (one query head per KV head only; with GQA
the emulator keeps only their sums) and the rounded ``dQ``, ``dK``, ``dV``, then, for a call
with learnable sinks, ``dsink``.
:func:`forward_steps` does the same for the forward's ``O`` and ``LSE2``. A kernel whose
arithmetic ``dash_ref`` reproduces must match on every step (``torch.equal``).

Which arithmetic that is travels in the kernel's audit record (``BackwardAudit.arithmetic``:
``"exact"`` for ``exact=True`` runs, ``"fast"`` for default runs of the CuTe backend,
None for the Triton backend's default, which no CPU arithmetic reproduces), together with
whether the dQ additions flushed subnormals (``flush_subnormals``). :func:`record_steps`
honours both; a record no arithmetic reproduces is refused with a one-line reason, never
compared. :func:`first_difference` names the first step that differs and how many
elements differ there.
"""

from __future__ import annotations

import torch

from dash_ref import Schedule
from dash_ref.arithmetic import steps as contract
from dash_ref.arithmetic.steps import Arithmetic
from dash_ref.emulate import backward, forward

#: what the kernel must provide, by name: its audit record's fields and its gradients
KERNEL_VALUES = ("delta", "partials", "dq_acc", "dk_heads", "dv_heads", "dq", "dk", "dv")

Steps = list[tuple[str, torch.Tensor, torch.Tensor]]


def l2_steps(schedule: Schedule, inputs: tuple[torch.Tensor, ...],
             kernel: dict[str, torch.Tensor], softmax_scale: float | None = None,
             flush_subnormals: bool = True, arithmetic: str | Arithmetic = "exact", *,
             softcap: float = 0.0, learnable_sink: torch.Tensor | None = None) -> Steps:
    """``[(step, kernel value, emulated value)]`` for one backward.

    ``inputs`` is ``(q, k, v, o, lse2, do)`` and ``kernel`` maps :data:`KERNEL_VALUES` to
    the kernel's tensors, all on the CPU. ``arithmetic`` is the arithmetic the kernel
    ran (``"exact"`` or ``"fast"``) and ``flush_subnormals`` how its dQ additions treated
    subnormals (its audit record says both); ``softcap`` the call's; ``learnable_sink`` its
    sinks, whose gradient ``kernel["dsink"]`` is then the last step.
    """
    missing = [name for name in KERNEL_VALUES if name not in kernel]
    if missing:
        raise ValueError(f"kernel values missing: {missing}")
    q, k, v, o, lse2, do = inputs
    p = schedule.problem
    a = contract.arithmetic(arithmetic).with_dq_adds(flush_subnormals)
    sink = None if learnable_sink is None else learnable_sink.cpu()
    if sink is not None and "dsink" not in kernel:
        raise ValueError("kernel values missing: ['dsink'] (the call has learnable sinks)")
    emu = backward(schedule, q, k, v, o, lse2, do, softmax_scale, return_partials=True,
                   arithmetic=a, softcap=softcap, learnable_sink=sink)
    rows = torch.tensor(visit_rows(schedule))
    real_rows = torch.arange(p.block_m)[None, :] < rows[:, None]  # padding rows are not read
    steps = [("D", kernel["delta"], contract.delta(a, o, do)),
             ("partials", kernel["partials"][real_rows], emu.partials[real_rows]),
             ("dq_acc", kernel["dq_acc"], emu.dq_acc)]
    if p.heads == p.heads_kv:
        steps += [("dk_acc", kernel["dk_heads"], emu.dk_acc),
                  ("dv_acc", kernel["dv_heads"], emu.dv_acc)]
    steps += [("dq", kernel["dq"], emu.dq), ("dk", kernel["dk"], emu.dk),
              ("dv", kernel["dv"], emu.dv)]
    if sink is not None:
        steps.append(("dsink", kernel["dsink"], emu.dsink))
    return steps


def visit_rows(schedule: Schedule) -> list[int]:
    """The query rows each visit's partial holds, in table order (a tile's rows past its
    sequence's ``S_q`` are padding: a kernel writes anything there). A packed problem's
    tiles are its sequences' own, so a visit's rows are counted on its chain's sequence."""
    p = schedule.problem
    return [len(p.rows(i, c.b)) for _, c in schedule.chains() for i in c.visits]


def forward_steps(inputs: tuple[torch.Tensor, ...], kernel_o: torch.Tensor,
                  kernel_lse2: torch.Tensor, causal: bool, softmax_scale: float | None,
                  block_n: int, arithmetic: str | Arithmetic = "fast", *,
                  window_size: tuple[int, int] | None = (-1, -1),
                  learnable_sink: torch.Tensor | None = None, softcap: float = 0.0,
                  seqlens: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> Steps:
    """``[("O", kernel, emulated), ("LSE2", kernel, emulated)]`` for one forward.

    ``inputs`` is ``(q, k, v)`` on the CPU, ``block_n`` the forward's KV tile (its query
    tile does not change the bits), ``window_size`` the forward's sliding window,
    ``learnable_sink`` its sinks (``(H,)``, any device), ``softcap`` its cap; ``seqlens``
    ``(seqlens_q, seqlens_k)`` of a packed batch (``(total, H, d)`` inputs).
    """
    q, k, v = inputs
    sink = None if learnable_sink is None else learnable_sink.cpu()
    packed = {} if seqlens is None else dict(seqlens_q=seqlens[0], seqlens_k=seqlens[1])
    emu = forward(q, k, v, causal, softmax_scale, block_n, block_n, arithmetic=arithmetic,
                  window_size=window_size, learnable_sink=sink, softcap=softcap, **packed)
    return [("O", kernel_o, emu.o), ("LSE2", kernel_lse2.contiguous(), emu.lse2)]


def kernel_values(record, grads: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """:data:`KERNEL_VALUES` on the CPU from a ``BackwardAudit`` and the ``(dQ, dK, dV)``."""
    values = {name: getattr(record, name).cpu() for name in KERNEL_VALUES[:5]}
    values.update(zip(("dq", "dk", "dv"), (g.cpu() for g in grads)))
    return values


def record_arithmetic(record) -> str:
    """The arithmetic that reproduces an audit record; ``ValueError`` where none does."""
    name = getattr(record, "arithmetic", None) or ("exact" if record.exact else None)
    if name is None:
        raise ValueError(
            f"L2 cannot reproduce this record: the {getattr(record, 'backend', 'triton')} "
            "backend's default arithmetic has no CPU counterpart; run it with exact=True, "
            "or use the cute backend, whose default arithmetic dash_ref reproduces")
    return name


def record_steps(record, inputs: tuple[torch.Tensor, ...], grads: tuple[torch.Tensor, ...],
                 softmax_scale: float | None = None, softcap: float = 0.0,
                 learnable_sink: torch.Tensor | None = None) -> Steps:
    """:func:`l2_steps` for a kernel's audit record, with the record's arithmetic choices.

    ``inputs`` is ``(q, k, v, o, lse2, do)`` (any device) and ``grads`` the kernel's
    ``(dQ, dK, dV)``, or ``(dQ, dK, dV, dsink)`` with ``learnable_sink``. A record that no
    CPU arithmetic reproduces (the Triton backend's default) raises ``ValueError`` saying
    so.
    """
    name = record_arithmetic(record)
    values = kernel_values(record, grads[:3])
    if learnable_sink is not None:
        values["dsink"] = grads[3].cpu()
    return l2_steps(record.schedule, tuple(x.cpu() for x in inputs), values, softmax_scale,
                    flush_subnormals=record.flush_subnormals, arithmetic=name,
                    softcap=softcap, learnable_sink=learnable_sink)


def first_difference(steps: Steps) -> tuple[str, int, int] | None:
    """``(step, differing elements, elements)`` of the first step whose bits differ, or None.

    Bits are compared raw (``torch.equal`` on the bit patterns), so NaNs compare by their
    payload and ``+0`` differs from ``-0``.
    """
    for name, got, want in steps:
        if got.shape != want.shape or got.dtype != want.dtype:
            return name, max(got.numel(), want.numel()), max(got.numel(), want.numel())
        if not torch.equal(_bits(got), _bits(want)):
            return name, int((_bits(got) != _bits(want)).sum()), got.numel()
    return None


def _bits(x: torch.Tensor) -> torch.Tensor:
    view = {4: torch.int32, 2: torch.int16, 8: torch.int64, 1: torch.int8}[x.element_size()]
    return x.contiguous().view(view)
