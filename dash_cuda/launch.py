"""The shared launch: everything around a backend's two kernels, the same for every backend.

:func:`run_forward` hands validated views to the backend's forward. :func:`run_backward`
builds the :class:`dash_ref.Problem` with the backend's tiles, computes ``D`` (step
``delta``), allocates the fp32 accumulators and scratch (poisoned with NaN on request),
checks that the persistent grid fits on the device, uploads the validated schedule tables,
runs the backend's schedule-driven kernel, then the shared epilogues (steps ``epilogue``
and ``gqa_sum``) and, with ``audit=True``, returns the :class:`BackwardAudit` record that
``dash_ref.emulate.replay`` and ``verify`` read. Given a ``plan_key``, both keep what they
launched as a plan (:mod:`dash_cuda.plans`), which later calls of the signature take
instead.

Layouts: inputs are ``(B, S, H, d)`` views with a contiguous last dim; ``LSE2`` and ``D`` are
fp32 ``(B, S_q, H)`` views of ``(B, H, S_q)`` buffers; ``dQacc`` is a contiguous fp32
``(B, S_q, H, d)``; per-query-head dK/dV scratch is a contiguous fp32 ``(B, S_k, H, d)``.

Packed batches (a :class:`~dash_cuda.options.Packing` given): the inputs are ``(total_q, H,
d)`` and ``(total_k, H_kv, d)``, ``LSE2`` and ``D`` fp32 ``(total_q, H)`` views of ``(H,
total_q)`` buffers, ``dQacc`` a contiguous fp32 ``(total_q, H, d)`` and the per-head scratch
``(total_k, H, d)``; the problem is :func:`packed_problem_for` the lengths, and its tables
carry ``q_tile_base`` (where each sequence's dQ tiles, and semaphores, start). ``D``, the dQ
epilogue and the GQA sum are row-wise, so they run on the packed rows as one sequence of
``total`` rows: every row gets the bits it gets alone.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from dash_ref import Mask, Problem, Schedule
from dash_ref.arithmetic.steps import ARITHMETICS, sink_logit

from .backends import Backend, Launch, device_properties
from .options import Options, Packing
from .plans import backward_plan, forward_plan, keep
from .tables import device_schedule

F32 = torch.float32


@dataclass
class BackwardAudit:
    """What ``audit=True`` returns beside the gradients (small problems only).

    ``partials[v]`` is the fp32 partial ``dQ_ij = dS_ij @ K_j`` of visit ``v`` in
    :meth:`dash_ref.Schedule.to_tables` order (workers, then chains in run order, then
    visits in visit order); its row ``r`` is query row ``i * BM + r`` (rows past ``S_q``
    hold anything). ``dq_acc`` is the fp32 ``(B, S_q, H, d)`` accumulator before scaling,
    so ``dash_ref.emulate.replay(schedule, partials, flush_subnormals=flush_subnormals)``
    must equal it bit for bit. ``dk_heads`` / ``dv_heads`` are each query head's fp32
    ``(B, S_k, H, d)`` dK / dV accumulators before the GQA sum (dK unscaled); ``delta`` is
    the fp32 ``D = rowsum(dO * O)``, ``(B, S_q, H)``. For a packed batch (the schedule's
    problem ``is_packed``) a partial's row ``r`` is row ``i * BM + r`` of its chain's
    sequence, and the rest is packed: ``dq_acc`` ``(total_q, H, d)`` (what ``replay``
    returns for it), ``dk_heads`` / ``dv_heads`` ``(total_k, H, d)``, ``delta``
    ``(total_q, H)``. The arithmetic the launch chose
    travels with it: ``flush_subnormals`` (the dQ additions flushed subnormal inputs and
    results), ``exact`` (the launch ran ``exact=True``), ``arithmetic`` (the name of the
    ``dash_ref`` arithmetic that reproduces every step bit for bit, None where none does)
    and ``backend``.
    """

    schedule: Schedule
    partials: torch.Tensor
    dq_acc: torch.Tensor
    dk_heads: torch.Tensor
    dv_heads: torch.Tensor
    delta: torch.Tensor
    flush_subnormals: bool = False
    exact: bool = False
    backend: str = "triton"
    arithmetic: str | None = None


# -- residency ------------------------------------------------------------------------------
_resident: dict[tuple, int] = {}
_resident_lock = threading.Lock()


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``: the default number of persistent workers."""
    return device_properties(device).multi_processor_count


def max_workers(backend: Backend, launch: Launch) -> int:
    """Most programs of ``launch``'s kernel resident at once (cached per backend and variant)."""
    key = (backend.name, launch.variant())
    with _resident_lock:
        hit = _resident.get(key)
    if hit is None:
        hit = backend.max_workers(launch)
        with _resident_lock:
            _resident[key] = hit
    return hit


def on_device(device: torch.device):
    """``torch.cuda.device(device)``, or nothing to do where it is current already (most
    calls: entering and leaving the context costs host time every call)."""
    if device.type != "cuda" or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


# -- problems ---------------------------------------------------------------------------------
def value_dim(q: torch.Tensor, v: torch.Tensor) -> int | None:
    """The values' head dim where it is not the queries' (``d_v != d``), else None: the key
    that keeps the common case's problems, cases and caches as they are."""
    head_dim_v = v.shape[-1]
    return None if head_dim_v == q.shape[-1] else head_dim_v


@lru_cache(maxsize=1024)
def problem_for(backend: Backend, batch: int, heads: int, heads_kv: int, seqlen_q: int,
                seqlen_k: int, head_dim: int, mask: Mask, head_dim_v: int | None = None
                ) -> Problem:
    """The :class:`dash_ref.Problem` ``backend``'s backward runs: the shape and mask with its
    tiles (built once per shape: a problem is immutable); ``head_dim_v``: the values' head
    dim, None where it is ``head_dim``."""
    shape = Problem(batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim,
                    window_size=mask.window_size,  # Problem reads the rule's window itself
                    head_dim_v=head_dim_v)
    return _with_tiles(backend, shape)


@lru_cache(maxsize=1024)
def packed_problem_for(backend: Backend, seqlens_q: tuple[int, ...], seqlens_k: tuple[int, ...],
                       heads: int, heads_kv: int, head_dim: int, mask: Mask,
                       head_dim_v: int | None = None) -> Problem:
    """The packed :class:`dash_ref.Problem` of sequences of lengths ``seqlens_q[b]``,
    ``seqlens_k[b]`` with ``backend``'s backward tiles (:meth:`dash_ref.Problem.packed`;
    built once per set of lengths)."""
    shape = Problem.packed(seqlens_q, seqlens_k, heads, heads_kv, head_dim,
                           window_size=mask.window_size, head_dim_v=head_dim_v)
    return _with_tiles(backend, shape)


def _with_tiles(backend: Backend, shape: Problem) -> Problem:
    block_m, block_n = backend.backward_tiles(shape.head_dim, shape.mask, shape.head_dim_v)
    return replace(shape, block_m=block_m, block_n=block_n)


# -- forward / backward -------------------------------------------------------------------------
def _features(options: Options, sink: torch.Tensor | None) -> dict:
    """The optional features a backend's forward takes as keywords (only backends whose
    ``features`` list them are handed any): ``softcap`` and ``sink2``, the sinks in base 2,
    ``fp32(sink * log2 e)`` (:func:`dash_ref.arithmetic.steps.sink_logit`, on the device)."""
    extra = {}
    if options.softcap:
        extra["softcap"] = options.softcap
    if sink is not None:
        extra["sink2"] = sink_logit(sink)
    return extra


def run_forward(backend: Backend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                options: Options, poison: bool = False, packing: Packing | None = None,
                sink: torch.Tensor | None = None, plan_key: tuple | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``O`` like ``q`` and fp32 ``LSE2`` ``(B, S_q, H)`` from validated non-empty views
    (with ``packing``: packed tensors, ``LSE2`` ``(total_q, H)``; with ``sink``, the
    learnable sinks ``(H,)``, LSE2 includes them). ``plan_key``: keep the call's
    :class:`dash_cuda.plans.ForwardPlan` (or that it has none) under this
    :func:`dash_cuda.plans.signature` (a rectangular call without poisoning)."""
    with on_device(q.device):
        extra = _features(options, sink)
        if packing is not None:
            return backend.forward_varlen(q, k, v, packing, options.mask,
                                          options.softmax_scale, poison, **extra)
        o, lse2 = backend.forward(q, k, v, options.mask, options.softmax_scale, poison,
                                  **extra)
        if plan_key is not None:  # a softcap has no plan; sinks do
            keep(plan_key, None if "softcap" in extra else forward_plan(
                backend, q, k, v, o, lse2, options, sinks=sink is not None))
        return o, lse2


def run_backward(backend: Backend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 o: torch.Tensor, lse2: torch.Tensor, do: torch.Tensor, options: Options,
                 schedule_name: str, audit: bool = False, poison: bool = False,
                 packing: Packing | None = None, sink: torch.Tensor | None = None,
                 problem: Problem | None = None, plan_key: tuple | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None,
                            BackwardAudit | None]:
    """dQ, dK, dV, dsink (None without ``sink``) and the audit record (None without
    ``audit``) under the schedule named ``schedule_name``.

    Inputs are validated non-empty ``(B, S, H, d)`` views; ``lse2`` is fp32 ``(B, S_q, H)``
    (with ``packing``: packed ``(total, H, d)`` tensors and ``(total_q, H)``).
    ``schedule_name`` is resolved (``atomic`` or a deterministic name). ``poison`` fills
    outputs and scratch with NaN first, so an element a kernel fails to write shows.
    ``options.softcap`` goes to the backend's kernel (:attr:`Launch.softcap`); with ``sink``
    ``lse2`` is the forward's (it includes the sinks) and ``dsink`` is
    :func:`dash_cuda.prepost.sink_grad` of ``LSE2`` and ``D``, in ``sink``'s dtype.
    ``problem``: :func:`problem_for` of the call where the caller has it already.
    ``plan_key``: keep the call's :class:`dash_cuda.plans.BackwardPlan` (or that it has
    none) under this :func:`dash_cuda.plans.signature`.
    """
    with on_device(q.device):
        return _run_backward(backend, q, k, v, o, lse2, do, options, schedule_name, audit,
                             poison, packing, sink, problem, plan_key)


def new_workspace(backend: Backend, problem: Problem, deterministic: bool,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq_acc, sem, workspace)``: the fp32 dQ accumulator in ``backend``'s layout and
    the int32 semaphores, one per dQ tile ``problem.q_tile_index(b, h, i)`` (the rank whose
    partial goes in next; one unused where ``deterministic`` is False), as views of one
    uninitialized fp32 ``workspace``, which the ``delta`` launch zeroes: one allocation and
    no memset per backward. The semaphores start at a multiple of 256 bytes (kernels take
    every pointer 16-byte aligned)."""
    shape, numel, at, size = _workspace_layout(backend, problem, deterministic)
    workspace = torch.empty(size, device=device, dtype=F32)
    return workspace[:numel].view(shape), workspace[at:].view(torch.int32), workspace


@lru_cache(maxsize=1024)
def _workspace_layout(backend: Backend, problem: Problem, deterministic: bool
                      ) -> tuple[tuple[int, ...], int, int, int]:
    """``(accumulator shape, its elements, where the semaphores start, workspace
    elements)`` of :func:`new_workspace`."""
    shape = tuple(backend.dq_acc_shape(problem))
    numel = math.prod(shape)
    at = -(-numel // 64) * 64
    return shape, numel, at, at + (problem.num_q_tiles if deterministic else 1)


def _batched(x: torch.Tensor, packed: bool) -> torch.Tensor:
    """A packed ``(total, ...)`` tensor as a batch of one sequence, ``(1, total, ...)``, for
    the row-wise kernels (``D``, the epilogues), which give each row the bits it gets alone;
    any other tensor as it is."""
    return x.unsqueeze(0) if packed else x


def _run_backward(backend, q, k, v, o, lse2, do, options, schedule_name, audit, poison,
                  packing=None, sink=None, problem=None, plan_key=None):
    from . import prepost  # Triton kernels: loaded on the first launch, not on import

    given = (do, lse2)
    heads, head_dim = q.shape[-2:]
    heads_kv, head_dim_v = k.shape[-2], value_dim(q, v)
    device = q.device
    mask, softmax_scale, exact = options.mask, options.softmax_scale, options.exact
    num_workers = options.num_workers
    packed = packing is not None
    if packed:
        problem = packed_problem_for(backend, packing.seqlens_q, packing.seqlens_k, heads,
                                     heads_kv, head_dim, mask, head_dim_v)
    elif problem is None:
        problem = problem_for(backend, q.shape[0], heads, heads_kv, q.shape[1], k.shape[1],
                              head_dim, mask, head_dim_v)
    deterministic = schedule_name != "atomic"
    per_head = audit or heads != heads_kv
    if do.stride(-1) != 1:
        do = do.contiguous()

    arithmetic = "exact" if exact else backend.default_arithmetic
    pairwise = arithmetic is not None and ARITHMETICS[arithmetic].delta_order == "pairwise"
    dq_acc, sem, workspace = new_workspace(backend, problem, deterministic, device)
    if poison:  # the delta launch must clear it: a value it missed shows in dQ (or hangs)
        workspace.fill_(math.nan)
    delta = prepost.preprocess_delta(_batched(o, packed), _batched(do, packed),
                                     problem.block_m, pairwise, clear=workspace)
    if packed:
        delta = delta[0]  # (total_q, H), strided like the packed LSE2
    if lse2.stride() != delta.stride():  # kernels read LSE2 and D with one set of strides
        lse2 = torch.empty_like(delta).copy_(lse2)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if per_head:
        dk_out = torch.empty((*k.shape[:-2], heads, head_dim), device=device, dtype=F32)
        dv_out = torch.empty((*v.shape[:-2], heads, v.shape[-1]), device=device, dtype=F32)
    else:
        dk_out, dv_out = dk, dv
    launch = Launch(problem, q, k, v, do, lse2, delta, dq_acc, dk_out, dv_out, softmax_scale,
                    deterministic, audit, per_head, exact,
                    int(num_workers) if num_workers is not None else sm_count(device),
                    softcap=options.softcap, sem=sem)
    if packed:  # the kernels read one int32 offset per sequence, contiguous
        launch.cu_seqlens_q = packing.cu_seqlens_q.contiguous()
        launch.cu_seqlens_k = packing.cu_seqlens_k.contiguous()

    limit = max_workers(backend, launch)
    if launch.num_workers > limit:
        raise ValueError(
            f"num_workers={launch.num_workers} exceeds the {limit} backward programs that can "
            f"be resident at once on {torch.cuda.get_device_name(device)}: a persistent grid "
            "larger than that could deadlock on its semaphores"
        )
    sched = device_schedule(problem, schedule_name, launch.num_workers, device)  # validated
    launch.tables = sched.tables
    launch.partials = (backend.new_partials(sched.num_visits, problem, device) if audit
                       else dq_acc)
    if poison:
        for t in [dq, dk, dv] + ([dk_out, dv_out] if per_head else []) + (
                [launch.partials] if audit else []):
            t.fill_(math.nan)

    if plan_key is not None:  # the next calls of this signature take its plan, if any
        copied = launch.do is not given[0] or launch.lse2 is not given[1]
        keep(plan_key, None if copied else backward_plan(backend, launch, o, do, workspace,
                                                         pairwise))
    backend.run_schedule(launch)

    backend.finish_dq(dq_acc, dq, problem, softmax_scale)
    if per_head:
        prepost.finish_dk_dv(*(_batched(x, packed) for x in (dk_out, dv_out, dk, dv)),
                             softmax_scale)
    dsink = None
    if sink is not None:
        dsink = prepost.sink_grad(_batched(lse2, packed), _batched(delta, packed), sink)
    record = None
    if audit:
        record = BackwardAudit(sched.schedule(), backend.partials_rows(launch.partials, problem),
                               backend.dq_acc_rows(dq_acc, problem), dk_out, dv_out, delta,
                               flush_subnormals=backend.dq_add_flushes_subnormals,
                               exact=exact, backend=backend.name, arithmetic=arithmetic)
    return dq, dk, dv, dsink, record

