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

Eager calls skip the custom-op dispatch: :func:`attention_call` runs the same two functions
(:func:`attention_forward_impl`, :func:`attention_backward_impl`) behind a plain
``torch.autograd.Function``, since the dispatch costs more host time than the kernels of a
small model's call (about 250 us per forward and backward, measured).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from dash_ref import resolve_name

from .backends import Backend, Case, choose_backend, new_row_stats
from .launch import BackwardAudit, problem_for, run_backward, run_forward
from .options import Options

Tensor = torch.Tensor


def empty_problem(q: Tensor, k: Tensor) -> bool:
    """Nothing to compute: no batch, no queries or no keys."""
    return q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0


def resolve_backend(q: Tensor, options: Options) -> Backend:
    """The backend that runs a call on ``q``: ``options.backend`` or the ``"auto"`` choice."""
    return _backend_for(options.backend,
                        Case(q.shape[-1], q.dtype, options.exact, options.deterministic))


@lru_cache(maxsize=256)
def _backend_for(backend: str, case: Case) -> Backend:
    return choose_backend(backend, case)  # what is installed does not change in a process


def resolve_schedule(backend: Backend, q: Tensor, k: Tensor, options: Options) -> str:
    """The schedule a backward on ``(B, S, H, d)`` views runs: ``atomic`` or a name."""
    if not options.deterministic:
        return "atomic"
    if empty_problem(q, k):  # nothing runs: no problem to resolve a name on
        return options.schedule
    return _schedule_for(backend, tuple(q.shape), tuple(k.shape), options.causal,
                         options.schedule, options.portable)


@lru_cache(maxsize=1024)
def _schedule_for(backend: Backend, q_shape: tuple, k_shape: tuple, causal: bool,
                  schedule: str, portable: bool) -> str:
    problem = problem_for(backend, q_shape[0], q_shape[2], k_shape[2], q_shape[1],
                          k_shape[1], q_shape[3], causal)
    return resolve_name(schedule, problem, backend.name, portable)


def _lse_like(q: Tensor, fill: float | None = None) -> Tensor:
    """The ``LSE2`` of queries ``q`` (``(B, S_q, H, d)``), in the layout every forward writes."""
    return new_row_stats(q.shape[0], q.shape[1], q.shape[2], q.device, fill)


def forward_views(q: Tensor, k: Tensor, v: Tensor, options: Options, poison: bool = False
                  ) -> tuple[Tensor, Tensor]:
    """On validated ``(B, S, H, d)`` views: ``(O, LSE2)``, LSE2 fp32 ``(B, S_q, H)``."""
    if empty_problem(q, k):
        return torch.zeros_like(q), _lse_like(q, -math.inf)
    return run_forward(resolve_backend(q, options), q, k, v, options, poison)


def backward_views(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor,
                   options: Options, audit: bool = False, poison: bool = False
                   ) -> tuple[Tensor, Tensor, Tensor, BackwardAudit | None]:
    """On validated ``(B, S, H, d)`` views: ``(dQ, dK, dV, audit record or None)``."""
    if empty_problem(q, k):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None
    backend = resolve_backend(q, options)
    name = resolve_schedule(backend, q, k, options)
    return run_backward(backend, q, k, v, o, lse, do, options, name, audit, poison)


# The ops' signatures spell out the fields of Options, in order (torch.library infers the
# schema from them; a test holds them equal to ``options.FIELDS``).
def attention_forward_impl(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                           softmax_scale: float, schedule: str, deterministic: bool,
                           portable: bool, num_workers: int | None, exact: bool, backend: str
                           ) -> tuple[Tensor, Tensor]:
    """``(O, LSE2)``; the options after ``softmax_scale`` are the backward's."""
    options = Options(causal, softmax_scale, schedule, deterministic, portable, num_workers,
                      exact, backend)
    return forward_views(q, k, v, options)


def attention_backward_impl(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                            do: Tensor, causal: bool, softmax_scale: float, schedule: str,
                            deterministic: bool, portable: bool, num_workers: int | None,
                            exact: bool, backend: str) -> tuple[Tensor, Tensor, Tensor]:
    """``(dQ, dK, dV)``; ``schedule`` and ``backend`` may be ``"auto"``."""
    options = Options(causal, softmax_scale, schedule, deterministic, portable, num_workers,
                      exact, backend)
    dq, dk, dv, _ = backward_views(q, k, v, o, lse, do, options)
    return dq, dk, dv


attention_op = torch.library.custom_op("dash::attention", attention_forward_impl,
                                       mutates_args=())
attention_backward_op = torch.library.custom_op("dash::attention_backward",
                                                attention_backward_impl, mutates_args=())


@attention_op.register_fake
def _(q, k, v, *options):
    return torch.empty_like(q), _lse_like(q)


@attention_backward_op.register_fake
def _(q, k, v, o, lse, do, *options):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save(ctx, q, k, v, o, lse, options: Options) -> None:
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.options = options
    ctx.mark_non_differentiable(lse)  # the backward reads it; it has no gradient of its own


def _setup_context(ctx, inputs, output):
    q, k, v, *flat = inputs
    _save(ctx, q, k, v, *output, Options(*flat))


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward_op(q, k, v, o, lse, grad_o, *ctx.options.flat())
    return dq, dk, dv, *(None for _ in ctx.options.flat())


attention_op.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The custom ops' two functions and autograd, without the custom-op dispatch; the
    options travel as the one value."""

    @staticmethod
    def forward(ctx, q, k, v, options: Options):
        o, lse = forward_views(q, k, v, options)
        _save(ctx, q, k, v, o, lse, options)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv, _ = backward_views(q, k, v, o, lse, grad_o, ctx.options)
        return dq, dk, dv, None


def attention_call(q: Tensor, k: Tensor, v: Tensor, options: Options
                   ) -> tuple[Tensor, Tensor]:
    """``(O, LSE2)`` with autograd: the custom op under ``torch.compile``, else
    :class:`EagerAttention` (the same functions, the same bits, less host time)."""
    if torch.compiler.is_compiling():
        return attention_op(q, k, v, *options.flat())
    return EagerAttention.apply(q, k, v, options)


__all__ = ["EagerAttention", "attention_backward_impl", "attention_backward_op",
           "attention_call", "attention_forward_impl", "attention_op", "backward_views",
           "empty_problem", "forward_views", "resolve_backend", "resolve_schedule"]
