"""Kernel backends: one folder per kernel technology, each behind the same small interface.

A backend supplies the two kernels that decide speed, the forward and the schedule-driven
backward, and says what it supports. Everything around them is shared
(:mod:`dash_cuda.launch`): input checks, the schedule tables, residency, scratch, the small
pre- and post-processing kernels and the audit record. A backend imports only shared
``dash_cuda`` parts and ``dash_ref``; importing this package imports no kernel technology.

``backend="auto"`` takes the first backend of :data:`PREFERENCE` that is installed and
supports the case. The optional score features (``softcap``, learnable sinks) are refused
here for every backend that does not list them in its ``features`` attribute (a set of
:data:`FEATURES`; none by default), so a backend's own ``unsupported`` need not know them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import torch

from dash_ref import Mask, Problem
from dash_ref.arithmetic.steps import FEATURES as STEP_FEATURES

#: backends by name, in the order ``"auto"`` tries them: the fastest that can run a call
PREFERENCE = ("cute", "triton")
BACKENDS = ("triton", "cute")
#: the optional score features a backend may compute (its ``features``): the steps'
#: features of ``dash_ref``, one name each (:class:`Case` flags ``softcap`` and ``sink``)
FEATURES = STEP_FEATURES


@lru_cache(maxsize=16)
def device_properties(device: torch.device):
    """``torch.cuda.get_device_properties`` of ``device``, asked once per process."""
    return torch.cuda.get_device_properties(device)


def new_row_stats(batch: int, seqlen_q: int, heads: int, device: torch.device,
                  fill: float | None = None) -> torch.Tensor:
    """An fp32 per-query-row statistic (``LSE2``, ``D``) as every kernel reads and writes it:
    a ``(B, S_q, H)`` view of a ``(B, H, S_q)`` buffer, so a head's rows are contiguous."""
    out = torch.empty((batch, heads, seqlen_q), device=device, dtype=torch.float32)
    if fill is not None:
        out.fill_(fill)
    return out.transpose(1, 2)


def new_output(q: torch.Tensor, v: torch.Tensor, zeros: bool = False) -> torch.Tensor:
    """``O`` of queries ``q`` and values ``v`` as every forward allocates it: ``q``'s shape
    with ``v``'s head dim, ``q``'s strides where the head dims agree (else contiguous);
    ``zeros``: filled with 0 (a call with nothing to compute)."""
    if v.shape[-1] == q.shape[-1]:
        return torch.zeros_like(q) if zeros else torch.empty_like(q)
    shape = (*q.shape[:-1], v.shape[-1])
    return q.new_zeros(shape) if zeros else q.new_empty(shape)


def new_packed_row_stats(total_q: int, heads: int, device: torch.device,
                         fill: float | None = None) -> torch.Tensor:
    """The same statistic of a packed batch: a ``(total_q, H)`` view of an ``(H, total_q)``
    buffer (``dash_ref.emulate``'s packed ``LSE2`` layout, read with its strides)."""
    out = torch.empty((heads, total_q), device=device, dtype=torch.float32)
    if fill is not None:
        out.fill_(fill)
    return out.t()


@dataclass(frozen=True)
class Case:
    """What a backend needs to know to say whether it can run a call."""

    head_dim: int
    dtype: torch.dtype
    exact: bool
    deterministic: bool
    packed: bool = False  # a packed batch of variable lengths (``attention_varlen``)
    window: bool = False  # a sliding window (``window_size``; the mask kind ``"window"``)
    softcap: bool = False  # a logit softcap (``softcap > 0``)
    sink: bool = False  # learnable attention sinks (``learnable_sink`` given)
    head_dim_v: int | None = None  # the values' head dim where it is not ``head_dim``


@dataclass(frozen=True)
class Instruction:
    """What one contract step becomes in a backend's kernels, per arithmetic.

    ``Instruction(text)`` when both arithmetics issue the same instructions, else
    ``Instruction(fast=..., exact=...)``. Each backend's ``contract.py`` maps every name of
    :data:`dash_ref.arithmetic.steps.STEPS` to one. ``cpu`` names the ``dash_ref``
    functions that reproduce the backend's default instructions bit for bit (where its
    ``default_arithmetic`` does).
    """

    same: str = ""
    fast: str = ""
    exact: str = ""
    cpu: str = ""

    def text(self, arithmetic: str) -> str:
        """The instructions of the ``"fast"`` or ``"exact"`` arithmetic."""
        return self.same or getattr(self, arithmetic)


#: the steps the shared launch computes for every backend (:mod:`dash_cuda.prepost`)
SHARED_STEPS: dict[str, Instruction] = {
    "delta": Instruction(
        fast="`mul.f32` of exact upcasts summed by `tl.sum` (per-thread adds, then a shuffle "
             "tree: an order of its own; the compiler fuses some products into FFMAs), "
             "`dash_delta_kernel`",
        exact="`mul.f32`, then `add.f32` level by level of the pairwise tree "
              "(`_rowsum_pairwise`, built with fp fusion off), `dash_delta_kernel`"),
    "gqa_sum": Instruction("`add.f32` in ascending query head from +0, subnormals kept "
                           "(`dash_gqa_kernel`)"),
}


@dataclass
class Launch:
    """One backward launch: the operands a backend's schedule-driven kernel reads and writes.

    ``tables`` and ``partials`` are None until the grid size is known
    (:meth:`Backend.max_workers` sees them so); ``partials`` is ``dq_acc`` when not auditing.
    A packed batch (``problem.is_packed``) has ``(total, H, d)`` tensors, ``(total_q, H)``
    row statistics, its int32 offsets ``cu_seqlens_q`` / ``cu_seqlens_k`` on the device
    (None otherwise) and, once known, the table ``q_tile_base`` among ``tables``.
    """

    problem: Problem
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    lse2: torch.Tensor
    delta: torch.Tensor
    dq_acc: torch.Tensor
    dk_out: torch.Tensor  # rounded dK, or fp32 per-query-head scratch when per_head
    dv_out: torch.Tensor
    softmax_scale: float
    deterministic: bool
    audit: bool
    per_head: bool
    exact: bool
    num_workers: int
    tables: dict[str, torch.Tensor] | None = None
    sem: torch.Tensor | None = None  # int32, one per dQ tile, zeroed (dash_cuda.launch)
    partials: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    softcap: float = 0.0  # FlashAttention's logit softcap, 0: none (backends with "softcap")

    def variant(self) -> tuple:
        """What selects a compiled kernel: one residency answer per variant and device."""
        p = self.problem
        return (self.q.device, self.q.dtype, p.head_dim, p.head_dim_v, p.block_m, p.block_n,
                p.visibility.kind, self.deterministic, self.audit, self.per_head, self.exact,
                p.is_packed, self.softcap > 0)


class Backend(Protocol):
    """The interface every backend module's ``BACKEND`` object implements.

    A backend may also bind its launches for :mod:`dash_cuda.plans` (its calls then skip
    the general path's per-call work once a signature is known): ``bind_forward(q, k, v,
    o, mask, softmax_scale)``, ``bind_schedule(launch)`` and ``bind_finish_dq(dq_acc, dq,
    problem, softmax_scale)``, each returning None where one launch of fixed arguments does
    not do the work (the CuTe backend has them; the Triton backend's calls take the general
    path).
    """

    name: str
    #: subnormal handling of its dQ additions, recorded in every audit record
    dq_add_flushes_subnormals: bool
    #: the ``dash_ref`` arithmetic that reproduces this backend's default (``exact=False``)
    #: forward and backward bit for bit, or None where none does
    default_arithmetic: str | None
    #: the optional score features of :data:`FEATURES` its kernels compute; a call asking
    #: for another is refused before :meth:`unsupported` is asked
    features: frozenset[str]

    def missing(self) -> str | None:
        """What to install for this backend to run here, or None when it can."""

    def unsupported(self, case: Case) -> str | None:
        """Why this backend cannot run ``case``, or None when it can."""

    def backward_tiles(self, head_dim: int, mask: str, head_dim_v: int | None = None
                       ) -> tuple[int, int]:
        """``(block_m, block_n)`` of the backward for a head dim and mask kind (and the
        values' head dim, None: ``head_dim``): the tiles of the schedule's problem, from the
        backend's configuration function."""

    def forward_block_n(self, head_dim: int) -> int | None:
        """The forward's KV tile where ``default_arithmetic`` reproduces the forward."""

    def forward(self, q, k, v, mask: Mask, softmax_scale: float, poison: bool, **features
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(O, LSE2)`` for validated ``(B, S, H, d)`` views (see :mod:`dash_cuda.launch`)
        under ``mask`` (a kind :meth:`unsupported` admits); ``features`` (``softcap``,
        ``sink2``) are passed only where the call asks for them, to a backend whose
        :attr:`features` lists them."""

    def forward_varlen(self, q, k, v, packing, mask: Mask, softmax_scale: float,
                       poison: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """``(O, LSE2)`` of a packed batch (:class:`dash_cuda.options.Packing`): ``O`` like
        ``q``, ``(total_q, H, d)``, and LSE2 fp32 ``(total_q, H)``; only backends whose
        :meth:`unsupported` admits packed cases have it."""

    def dq_acc_shape(self, problem: Problem) -> tuple[int, ...]:
        """The shape of the contiguous fp32 dQ accumulator in the layout this backend's
        kernel adds into (the shared launch allocates and zeroes it)."""

    def dq_acc_rows(self, dq_acc: torch.Tensor, problem: Problem) -> torch.Tensor:
        """The accumulator as a contiguous fp32 ``(B, S_q, H, d)`` (packed: ``(total_q, H,
        d)``; a view where possible)."""

    def finish_dq(self, dq_acc: torch.Tensor, dq: torch.Tensor, problem: Problem,
                  softmax_scale: float) -> None:
        """Step ``epilogue`` of dQ: ``dq = rnd(dQacc * scale)`` from this backend's layout."""

    def new_partials(self, num_visits: int, problem: Problem, device: torch.device
                     ) -> torch.Tensor:
        """Room for every fp32 dQ partial of an audit, in this backend's layout."""

    def partials_rows(self, partials: torch.Tensor, problem: Problem) -> torch.Tensor:
        """The audit's partials as ``(V, BM, d)`` in table order (``dash_ref.emulate.replay``)."""

    def max_workers(self, launch: Launch) -> int:
        """How many programs of this launch's backward kernel fit on the device at once."""

    def run_schedule(self, launch: Launch) -> None:
        """Run the schedule-driven backward kernel of a :class:`Launch`."""


def get_backend(name: str) -> Backend:
    """The backend object of ``name`` (its module is imported, its kernels are not)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from 'auto', {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def _lacks_feature(backend: Backend, case: Case) -> str | None:
    """The optional feature of ``case`` that ``backend`` does not compute, or None."""
    has = backend.features
    for feature, wanted in (("softcap", case.softcap), ("sinks", case.sink)):
        if wanted and feature not in has:
            return {"softcap": "softcap (no softcap in its kernels)",
                    "sinks": "learnable_sink (no sinks in its kernels)"}[feature]
    return None


def limit(backend: Backend, case: Case) -> str | None:
    """Why ``backend`` cannot run ``case`` by its own limits (a feature it does not
    compute, a head dim, a dtype...), whatever is installed; None when it can."""
    return _lacks_feature(backend, case) or backend.unsupported(case)


def refusal(name: str, case: Case) -> str | None:
    """Why a call of ``case`` on backend ``name`` would be refused by the backends' limits
    (:func:`limit`; for ``"auto"``: every backend's), whatever is installed; None when it
    would run on a machine with the backends installed. What :func:`choose_backend` raises
    beside what is missing: a verifier asks it before calling, so that a refusal is a
    usage error and never a finding."""
    if name != "auto":
        reason = limit(get_backend(name), case)
        return None if reason is None else _cannot(name, reason)
    reasons = [(c, r) for c in PREFERENCE if (r := limit(get_backend(c), case))]
    return _none_can(reasons) if len(reasons) == len(PREFERENCE) else None


def _cannot(name: str, reason: str) -> str:
    return f"backend {name!r} cannot run this call: {reason}"


def _none_can(reasons: list[tuple[str, str]]) -> str:
    return "no backend can run this call (" + "; ".join(f"{c}: {r}" for c, r in reasons) + ")"


def choose_backend(name: str, case: Case) -> Backend:
    """The backend that runs ``case``: ``name`` itself, or for ``"auto"`` the first that can.

    A named backend that is missing or cannot run the case raises ``ValueError`` (what to
    install, or why not: :func:`refusal`); ``"auto"`` only fails when no backend can.
    """
    if name != "auto":
        backend = get_backend(name)
        reason = backend.missing() or limit(backend, case)
        if reason:
            raise ValueError(_cannot(name, reason))
        return backend
    reasons = []
    for candidate in PREFERENCE:
        backend = get_backend(candidate)
        reason = backend.missing() or limit(backend, case)
        if reason is None:
            return backend
        reasons.append((candidate, reason))
    raise ValueError(_none_can(reasons))


def _head_dims() -> tuple[int, ...]:
    from .cute.config import HEAD_DIMS as cute_dims
    from .triton.config import HEAD_DIMS as triton_dims

    return tuple(sorted(set(cute_dims) | set(triton_dims)))


#: head dims some backend runs (each backend's ``unsupported`` says which it does): ``"auto"``
#: takes a call to one that can
HEAD_DIMS = _head_dims()
