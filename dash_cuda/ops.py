"""The attention as ``torch.library`` custom ops: what autograd and ``torch.compile`` see.

``dash::attention`` runs the forward on validated ``(B, S, H, d)`` views and returns ``O``
and ``LSE2``; its registered autograd runs ``dash::attention_backward``. Both have fake
implementations (shapes, dtypes and strides of the real outputs, no kernel), so
``torch.compile(fullgraph=True)`` traces a model that calls :func:`dash_cuda.attention`
without a graph break, and the compiled model runs the same kernels, with the same bits, as
the eager one. A call's :class:`~dash_cuda.options.Options` travel into the ops as their
fields (``"auto"`` included) and are resolved inside, once, where tracing does not look:
which backend and which schedule run depends only on shapes, dtypes and the device, so the
compiled graph and the eager call resolve them alike. The forward op takes the backward's
options too: its registered autograd hands them to ``dash::attention_backward``.

Rectangular calls of a signature seen before take its plan (:mod:`dash_cuda.plans`): the
launches the general path made for it, with the call's own pointers. An eager backward
whose forward ran a plan finds its own plan there, by ``dO`` alone
(:attr:`~dash_cuda.plans.ForwardPlan.backwards`); :func:`dash_cuda.attention` hands the
forward's plan in where a call like an earlier one found it (:mod:`dash_cuda.calls`).

Eager calls skip the custom-op dispatch: :func:`attention_call` runs the same two functions
(:func:`attention_forward_impl`, :func:`attention_backward_impl`) behind a plain
``torch.autograd.Function``, since the dispatch costs more host time than the kernels of a
small model's call (about 250 us per forward and backward, measured).

Packed batches (:func:`dash_cuda.attention_varlen`) have their own pair,
``dash::attention_varlen`` and ``dash::attention_varlen_backward``, whose arguments add the
``cu_seqlens`` offsets and the ``max_seqlen`` values after the tensors (then the fields of
Options, in order). The schedule is built from the lengths on the host, so each op reads
the offsets once (``.tolist()``, :meth:`~dash_cuda.options.Packing.read`, where their
values are checked) before any kernel runs; the eager path (:func:`varlen_call`) reads them
once per call at the public entry and carries the :class:`~dash_cuda.options.Packing` to
the backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from dash_ref import Mask, Problem, resolve_name
from dash_ref.arithmetic.steps import sink_logit

from . import plans
from .backends import (
    Backend,
    Case,
    choose_backend,
    new_output,
    new_packed_row_stats,
    new_row_stats,
)
from .launch import (
    BackwardAudit,
    on_device,
    packed_problem_for,
    problem_for,
    run_backward,
    run_forward,
    value_dim,
)
from .options import Options, Packing

Tensor = torch.Tensor


def empty_problem(q: Tensor, k: Tensor) -> bool:
    """Nothing to compute: no batch, no queries or no keys (packed ``(total, H, d)``
    tensors: no query rows or no key rows)."""
    if q.dim() == 3:
        return q.shape[0] == 0 or k.shape[0] == 0
    return q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0


def resolve_backend(q: Tensor, options: Options, packed: bool = False, sink: bool = False,
                    head_dim_v: int | None = None) -> Backend:
    """The backend that runs a call on ``q``: ``options.backend`` or the ``"auto"`` choice
    (``packed``: one that runs packed batches; ``sink``: one that computes learnable sinks;
    ``head_dim_v``: the values' head dim where it is not ``q``'s; a softcap comes with the
    options)."""
    return _backend_for(options.backend, _case(q.shape[-1], q.dtype, options, packed, sink,
                                               head_dim_v))


def _case(head_dim: int, dtype: torch.dtype, options: Options, packed: bool, sink: bool,
          head_dim_v: int | None = None) -> Case:
    """What a backend must support to run a call."""
    return Case(head_dim, dtype, options.exact, options.deterministic, packed,
                options.mask.kind == "window", options.softcap > 0, sink, head_dim_v)


@lru_cache(maxsize=256)
def _backend_for(backend: str, case: Case) -> Backend:
    return choose_backend(backend, case)  # what is installed does not change in a process


@dataclass(frozen=True)
class Resolution:
    """What a rectangular call runs, resolved once per shapes, dtype and options: the
    backend, the schedule of its backward (``atomic`` or a name) and the backend's
    :class:`dash_ref.Problem` (its tiles)."""

    backend: Backend
    schedule: str
    problem: Problem


def resolution_for(q: Tensor, k: Tensor, options: Options, sink: bool = False,
                   head_dim_v: int | None = None) -> Resolution:
    """The :class:`Resolution` of a call on non-empty ``(B, S, H, d)`` views (``sink``: with
    learnable sinks; ``head_dim_v``: :func:`dash_cuda.launch.value_dim`):
    :func:`resolve_backend` and :func:`resolve_schedule` at once, looked up rather than
    worked out on every call."""
    return _resolution(q.shape, k.shape, q.dtype, options, sink, head_dim_v)


@lru_cache(maxsize=1024)
def _resolution(q_shape: torch.Size, k_shape: torch.Size, dtype: torch.dtype, options: Options,
                sink: bool, head_dim_v: int | None) -> Resolution:
    backend = _backend_for(options.backend, _case(q_shape[-1], dtype, options, False, sink,
                                                  head_dim_v))
    schedule = "atomic" if not options.deterministic else _schedule_for(
        backend, tuple(q_shape), tuple(k_shape), options.mask, options.schedule,
        options.portable, head_dim_v)
    problem = problem_for(backend, q_shape[0], q_shape[2], k_shape[2], q_shape[1],
                          k_shape[1], q_shape[3], options.mask, head_dim_v)
    return Resolution(backend, schedule, problem)


def resolve_schedule(backend: Backend, q: Tensor, k: Tensor, options: Options,
                     head_dim_v: int | None = None) -> str:
    """The schedule a backward on ``(B, S, H, d)`` views runs: ``atomic`` or a name."""
    if not options.deterministic:
        return "atomic"
    if empty_problem(q, k):  # nothing runs: no problem to resolve a name on
        return options.schedule
    return _schedule_for(backend, tuple(q.shape), tuple(k.shape), options.mask,
                         options.schedule, options.portable, head_dim_v)


@lru_cache(maxsize=1024)
def _schedule_for(backend: Backend, q_shape: tuple, k_shape: tuple, mask: Mask,
                  schedule: str, portable: bool, head_dim_v: int | None = None) -> str:
    problem = problem_for(backend, q_shape[0], q_shape[2], k_shape[2], q_shape[1],
                          k_shape[1], q_shape[3], mask, head_dim_v)
    return resolve_name(schedule, problem, backend.name, portable)


def resolve_packed_schedule(backend: Backend, q: Tensor, k: Tensor, packing: Packing,
                            options: Options, head_dim_v: int | None = None) -> str:
    """The schedule a backward of a packed batch runs: ``atomic`` or a name, resolved on
    the packed problem (``"auto"`` by its longest sequence, or ``lpt`` where the lengths
    are ragged: :func:`dash_ref.schedules.schedule.is_ragged`)."""
    if not options.deterministic:
        return "atomic"
    problem = packed_problem_for(backend, packing.seqlens_q, packing.seqlens_k, q.shape[1],
                                 k.shape[1], q.shape[2], options.mask, head_dim_v)
    return resolve_name(options.schedule, problem, backend.name, options.portable)


def _lse_like(q: Tensor, fill: float | None = None) -> Tensor:
    """The ``LSE2`` of queries ``q`` (``(B, S_q, H, d)``, or packed ``(total_q, H, d)``), in
    the layout every forward writes."""
    if q.dim() == 3:
        return new_packed_row_stats(q.shape[0], q.shape[1], q.device, fill)
    return new_row_stats(q.shape[0], q.shape[1], q.shape[2], q.device, fill)


def forward_views(q: Tensor, k: Tensor, v: Tensor, options: Options, poison: bool = False,
                  packing: Packing | None = None, sink: Tensor | None = None
                  ) -> tuple[Tensor, Tensor]:
    """On validated ``(B, S, H, d)`` views: ``(O, LSE2)``, LSE2 fp32 ``(B, S_q, H)``; with
    ``packing``, on packed ``(total, H, d)`` tensors, LSE2 fp32 ``(total_q, H)``; ``sink``:
    the validated learnable sinks ``(H,)`` (LSE2 includes them)."""
    return planned_forward(q, k, v, options, poison, packing, sink)[:2]


def planned_forward(q: Tensor, k: Tensor, v: Tensor, options: Options, poison: bool = False,
                    packing: Packing | None = None, sink: Tensor | None = None
                    ) -> tuple[Tensor, Tensor, plans.ForwardPlan | None]:
    """:func:`forward_views` and the :class:`~dash_cuda.plans.ForwardPlan` the call ran or
    kept (None: it has none)."""
    if empty_problem(q, k):
        lse = _lse_like(q, -math.inf)
        if sink is not None:  # rows without keys: LSE2 is the sink's (dash_ref's fwd_sink)
            lse.copy_(sink_logit(sink).expand_as(lse))
        return new_output(q, v, zeros=True), lse, None
    if packing is not None:
        backend = resolve_backend(q, options, True, sink is not None, value_dim(q, v))
        return *run_forward(backend, q, k, v, options, poison, packing, sink), None
    kept, key = None, None
    if not poison:
        kept, key = plans.lookup("forward", options, *_forward_tensors(q, k, v, sink))
    if kept is not None:
        with on_device(q.device):
            return *kept.run(q, k, v, sink), kept
    backend = resolution_for(q, k, options, sink is not None, value_dim(q, v)).backend
    o, lse = run_forward(backend, q, k, v, options, poison, packing, sink, key)
    return o, lse, None if key is None else plans.kept(key)


def _forward_tensors(q: Tensor, k: Tensor, v: Tensor, sink: Tensor | None) -> tuple:
    """The tensors of a forward's plan signature: the sinks' too where given."""
    return (q, k, v) if sink is None else (q, k, v, sink)


def kept_forward_plan(q: Tensor, k: Tensor, v: Tensor, options: Options,
                      sink: Tensor | None = None) -> plans.ForwardPlan | None:
    """The plan an earlier forward on views of this signature kept (None: none, or the
    signature has none)."""
    return plans.lookup("forward", options, *_forward_tensors(q, k, v, sink))[0]


def backward_views(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor,
                   options: Options, audit: bool = False, poison: bool = False,
                   packing: Packing | None = None, sink: Tensor | None = None
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, BackwardAudit | None]:
    """On validated ``(B, S, H, d)`` views (with ``packing``: packed ``(total, H, d)``
    tensors, ``lse`` ``(total_q, H)``): ``(dQ, dK, dV, dsink, audit record or None)``,
    ``dsink`` None without ``sink``."""
    if empty_problem(q, k):
        dsink = None if sink is None else torch.zeros_like(sink)  # D = 0 on every row
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dsink, None
    if packing is None:
        kept, key = None, None
        if not (audit or poison):
            kept, key = plans.lookup("backward", options, q, k, v, o, lse, do)
        if kept is not None:
            with on_device(q.device):
                return (*kept.run(q, k, v, o, lse, do, sink), None)
        resolved = resolution_for(q, k, options, sink is not None, value_dim(q, v))
        return run_backward(resolved.backend, q, k, v, o, lse, do, options, resolved.schedule,
                            audit, poison, sink=sink, problem=resolved.problem, plan_key=key)
    head_dim_v = value_dim(q, v)
    backend = resolve_backend(q, options, True, sink is not None, head_dim_v)
    name = resolve_packed_schedule(backend, q, k, packing, options, head_dim_v)
    return run_backward(backend, q, k, v, o, lse, do, options, name, audit, poison, packing,
                        sink)


def _dsink_out(dsink: Tensor | None, q: Tensor) -> Tensor:
    """A backward op's ``dsink`` output: the gradient, or an empty fp32 tensor without sinks
    (an op returns tensors only; the registered autograd hands None on)."""
    return q.new_empty((0,), dtype=torch.float32) if dsink is None else dsink


# The ops' signatures: the tensors, the optional learnable sinks, then the fields of Options
# in order (torch.library infers the schema from them; a test holds them equal to
# ``options.FIELDS``).
def attention_forward_impl(q: Tensor, k: Tensor, v: Tensor, learnable_sink: Tensor | None,
                           causal: bool, softmax_scale: float, schedule: str,
                           deterministic: bool, portable: bool, num_workers: int | None,
                           exact: bool, backend: str, window_size: list[int], softcap: float
                           ) -> tuple[Tensor, Tensor]:
    """``(O, LSE2)``; the options after ``softmax_scale`` are the backward's."""
    options = Options(causal, softmax_scale, schedule, deterministic, portable, num_workers,
                      exact, backend, window_size, softcap)
    return forward_views(q, k, v, options, sink=learnable_sink)


def attention_backward_impl(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                            do: Tensor, learnable_sink: Tensor | None, causal: bool,
                            softmax_scale: float, schedule: str, deterministic: bool,
                            portable: bool, num_workers: int | None, exact: bool, backend: str,
                            window_size: list[int], softcap: float
                            ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dQ, dK, dV, dsink)`` (``dsink`` empty without sinks); ``schedule`` and
    ``backend`` may be ``"auto"``."""
    options = Options(causal, softmax_scale, schedule, deterministic, portable, num_workers,
                      exact, backend, window_size, softcap)
    dq, dk, dv, dsink, _ = backward_views(q, k, v, o, lse, do, options, sink=learnable_sink)
    return dq, dk, dv, _dsink_out(dsink, q)


attention_op = torch.library.custom_op("dash::attention", attention_forward_impl,
                                       mutates_args=())
attention_backward_op = torch.library.custom_op("dash::attention_backward",
                                                attention_backward_impl, mutates_args=())


@attention_op.register_fake
def _(q, k, v, *options):
    return new_output(q, v), _lse_like(q)


def _fake_dsink(q: Tensor, sink: Tensor | None) -> Tensor:
    return q.new_empty((0,), dtype=torch.float32) if sink is None else torch.empty_like(sink)


@attention_backward_op.register_fake
def _(q, k, v, o, lse, do, learnable_sink, *options):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            _fake_dsink(q, learnable_sink))


def _save(ctx, q, k, v, o, lse, sink, options: Options) -> None:
    ctx.save_for_backward(q, k, v, o, lse, sink)
    ctx.options = options
    ctx.mark_non_differentiable(lse)  # the backward reads it; it has no gradient of its own


def _setup_context(ctx, inputs, output):
    q, k, v, sink, *flat = inputs
    _save(ctx, q, k, v, *output, sink, Options(*flat))


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, sink = ctx.saved_tensors
    dq, dk, dv, dsink = attention_backward_op(q, k, v, o, lse, grad_o, sink,
                                              *ctx.options.flat())
    return dq, dk, dv, None if sink is None else dsink, *(None for _ in ctx.options.flat())


attention_op.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The custom ops' two functions and autograd, without the custom-op dispatch: ``O``
    alone, one output for autograd to wrap (``LSE2`` stays on the context for the backward,
    the only reader; no caller holds it, so nothing can change it in place); the options
    travel as the one value."""

    @staticmethod
    def forward(ctx, q, k, v, sink, options: Options, plan: plans.ForwardPlan | None = None):
        if plan is not None:  # the call's plan, known already (dash_cuda.calls)
            with on_device(q.device):
                o, lse = plan.run(q, k, v, sink)
        else:
            o, lse, plan = planned_forward(q, k, v, options, sink=sink)
        ctx.save_for_backward(q, k, v, o, sink)
        ctx.lse, ctx.options, ctx.plan = lse, options, plan
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, sink = ctx.saved_tensors
        # a forward that ran a plan finds its backward's plan by dO alone
        # (:attr:`dash_cuda.plans.ForwardPlan.backwards`)
        plan, key = ctx.plan, None
        if plan is not None and plans.active():
            key = plans.grad_key(grad_o)
            kept = plan.backwards.get(key)
            if kept is not None:
                with on_device(q.device):
                    dq, dk, dv, dsink = kept.run(q, k, v, o, ctx.lse, grad_o, sink)
                return dq, dk, dv, dsink, None, None
        dq, dk, dv, dsink, _ = backward_views(q, k, v, o, ctx.lse, grad_o, ctx.options,
                                              sink=sink)
        if key is not None:
            kept = plans.kept(plans.signature("backward", ctx.options, q, k, v, o, ctx.lse,
                                              grad_o))
            if kept is not None:
                plan.backwards[key] = kept
        return dq, dk, dv, dsink, None, None


def attention_call(q: Tensor, k: Tensor, v: Tensor, options: Options,
                   sink: Tensor | None = None, plan: plans.ForwardPlan | None = None
                   ) -> Tensor:
    """``O`` with autograd (``sink``'s gradient too): the custom op under ``torch.compile``,
    else :class:`EagerAttention` (the same functions, the same bits, less host time);
    ``plan``: the forward's, where the caller knows it (:mod:`dash_cuda.calls`)."""
    if torch.compiler.is_compiling():
        return attention_op(q, k, v, sink, *options.flat())[0]
    return EagerAttention.apply(q, k, v, sink, options, plan)


# -- packed batches ---------------------------------------------------------------------------
# The varlen ops' signatures: the tensors, the offsets, the max_seqlen values, then the
# fields of Options in order (a test holds them equal to ``options.FIELDS``).
def attention_varlen_forward_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                                  cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                  learnable_sink: Tensor | None, causal: bool,
                                  softmax_scale: float, schedule: str, deterministic: bool,
                                  portable: bool, num_workers: int | None, exact: bool,
                                  backend: str, window_size: list[int], softcap: float
                                  ) -> tuple[Tensor, Tensor]:
    """``(O, LSE2)`` of a packed batch; reads the offsets once (checked) before any kernel."""
    options = Options(causal, softmax_scale, schedule, deterministic, portable, num_workers,
                      exact, backend, window_size, softcap)
    packing = Packing.read(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           q.shape[0], k.shape[0])
    return forward_views(q, k, v, options, packing=packing, sink=learnable_sink)


def attention_varlen_backward_impl(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                                   do: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                   max_seqlen_q: int, max_seqlen_k: int,
                                   learnable_sink: Tensor | None, causal: bool,
                                   softmax_scale: float, schedule: str, deterministic: bool,
                                   portable: bool, num_workers: int | None, exact: bool,
                                   backend: str, window_size: list[int], softcap: float
                                   ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dQ, dK, dV, dsink)`` of a packed batch (``dsink`` empty without sinks); reads the
    offsets once (checked) first."""
    options = Options(causal, softmax_scale, schedule, deterministic, portable, num_workers,
                      exact, backend, window_size, softcap)
    packing = Packing.read(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           q.shape[0], k.shape[0])
    dq, dk, dv, dsink, _ = backward_views(q, k, v, o, lse, do, options, packing=packing,
                                          sink=learnable_sink)
    return dq, dk, dv, _dsink_out(dsink, q)


attention_varlen_op = torch.library.custom_op("dash::attention_varlen",
                                              attention_varlen_forward_impl, mutates_args=())
attention_varlen_backward_op = torch.library.custom_op("dash::attention_varlen_backward",
                                                       attention_varlen_backward_impl,
                                                       mutates_args=())


@attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *options):
    return new_output(q, v), _lse_like(q)


@attention_varlen_backward_op.register_fake
def _(q, k, v, o, lse, do, cu_q, cu_k, max_q, max_k, learnable_sink, *options):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            _fake_dsink(q, learnable_sink))


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, sink, *flat = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k, sink)
    ctx.options = Options(*flat)
    ctx.max_seqlens = (max_q, max_k)
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, cu_q, cu_k, sink = ctx.saved_tensors
    dq, dk, dv, dsink = attention_varlen_backward_op(q, k, v, o, lse, grad_o, cu_q, cu_k,
                                                     *ctx.max_seqlens, sink,
                                                     *ctx.options.flat())
    return (dq, dk, dv, None, None, None, None, None if sink is None else dsink,
            *(None for _ in ctx.options.flat()))


attention_varlen_op.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


class EagerAttentionVarlen(torch.autograd.Function):
    """:class:`EagerAttention` for packed batches (``O`` alone; ``LSE2`` on the context): the
    lengths, read once at the public entry, travel to the backward in the
    :class:`~dash_cuda.options.Packing`."""

    @staticmethod
    def forward(ctx, q, k, v, sink, packing: Packing, options: Options):
        o, lse = forward_views(q, k, v, options, packing=packing, sink=sink)
        ctx.save_for_backward(q, k, v, o, sink)
        ctx.lse, ctx.options, ctx.packing = lse, options, packing
        return o

    @staticmethod
    def backward(ctx, grad_o):
        q, k, v, o, sink = ctx.saved_tensors
        dq, dk, dv, dsink, _ = backward_views(q, k, v, o, ctx.lse, grad_o, ctx.options,
                                              packing=ctx.packing, sink=sink)
        return dq, dk, dv, dsink, None, None


def varlen_call(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                max_seqlen_q: int, max_seqlen_k: int, options: Options,
                packing: Packing | None, sink: Tensor | None = None) -> Tensor:
    """``O`` of a packed batch with autograd (``sink``'s gradient too): the custom op under
    ``torch.compile`` (which reads the offsets itself; ``packing`` is None there), else
    :class:`EagerAttentionVarlen` with the ``packing`` read at the entry."""
    if torch.compiler.is_compiling():
        return attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, sink, *options.flat())[0]
    return EagerAttentionVarlen.apply(q, k, v, sink, packing, options)


__all__ = ["EagerAttention", "EagerAttentionVarlen", "attention_backward_impl",
           "attention_backward_op", "attention_call", "attention_forward_impl", "attention_op",
           "attention_varlen_backward_impl", "attention_varlen_backward_op",
           "attention_varlen_forward_impl", "attention_varlen_op", "backward_views",
           "empty_problem", "forward_views", "planned_forward", "resolve_backend",
           "resolve_packed_schedule",
           "resolve_schedule", "varlen_call"]
