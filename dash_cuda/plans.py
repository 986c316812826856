"""Plans: a rectangular call's launches worked out once per signature.

:func:`dash_cuda.launch.run_forward` and :func:`~dash_cuda.launch.run_backward` work out,
on every call, the problem, the scratch layout, the schedule's tables, the grid, each
kernel's arguments and compiled handle. For one :func:`signature` (options, the shapes,
strides, dtypes and 16-byte alignment of the tensors, the device) all of that is the same
on every call. The first call of a signature runs that general path and keeps what it
launched as a plan, made by the same functions from its own decisions (so the same kernels
with the same arguments, and the same bits: ``tests/test_plans.py``,
``tests/gpu/test_cuda_plans.py``); a later call only allocates its outputs and scratch
and launches. A forward's plan also keeps the backward plans of its calls by ``dO``
(:attr:`ForwardPlan.backwards`), so an eager training step looks up one signature, not
two.

Only the common case has a plan: a rectangular call without poisoning or softcap, on a
backend that binds its kernels (``bind_forward``, ``bind_schedule``, ``bind_finish_dq``:
the CuTe backend), learnable sinks included (a forward's plan takes their base-2 logits'
pointer; a backward's launches do not change with them, and its plan adds their
gradient); a backward also without audit, with
``LSE2`` as every forward writes it and ``S_q`` a multiple of the query tile (the kernel
reads it in place), and ``dO`` with a contiguous last dim (no copies). Any other call
takes the general path every time (its signature is kept as one without a plan).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from dash_ref.arithmetic.steps import sink_logit

from .backends import new_output
from .options import Options
from .triton_launch import current_stream

F32 = torch.float32

#: plans by :func:`signature`; None: the signature has none (the general path, every call)
_plans: dict[tuple, ForwardPlan | BackwardPlan | None] = {}
_UNSEEN = object()
_MAX_PLANS = 1024  # signatures kept; past that the cache starts over
#: how many times :func:`clear` ran: what keeps plans elsewhere (:mod:`dash_cuda.calls`)
#: holds them only for the generation it took them in
generation = 0


def structure(t: torch.Tensor) -> tuple:
    """What a kernel's launch depends on of one tensor beside its data: shape, strides,
    dtype, device and whether it is 16-byte aligned (the kernels are specialized on it).
    The plans' keys and the public calls' are made of these (:func:`signature`,
    :func:`grad_key`, :func:`dash_cuda.calls.key`)."""
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0


def signature(kind: str, options: Options, *tensors: torch.Tensor) -> tuple:
    """What a call's launches depend on beside its data: ``kind`` (``"forward"`` or
    ``"backward"``), the options and each tensor's :func:`structure`."""
    return (kind, options, *map(structure, tensors))


_local = threading.local()


def lookup(kind: str, options: Options, *tensors: torch.Tensor) -> tuple[object, tuple | None]:
    """``(plan, None)`` for a call whose :func:`signature` has a plan; ``(None, key)`` for a
    signature not seen yet (the general path keeps what it launched under ``key``);
    ``(None, None)`` for one without a plan, and for every call inside :func:`suspended`."""
    if getattr(_local, "suspended", 0):
        return None, None
    key = signature(kind, options, *tensors)
    kept = _plans.get(key, _UNSEEN)
    if kept is _UNSEEN:
        return None, key
    return kept, None


def active() -> bool:
    """Whether calls of this thread may take plans (not inside :func:`suspended`)."""
    return not getattr(_local, "suspended", 0)


def kept(key: tuple) -> ForwardPlan | BackwardPlan | None:
    """The plan kept under the :func:`signature` ``key`` (None: none kept)."""
    return _plans.get(key)


def grad_key(do: torch.Tensor) -> tuple:
    """What a backward's :func:`signature` holds of ``dO`` beside what its forward's plan
    fixes (:attr:`ForwardPlan.backwards`)."""
    return structure(do)


@contextmanager
def suspended() -> Iterator[None]:
    """Calls of this thread in this block take the general path and keep no plan: for
    state the signature does not hold, such as the CuTe backward's probe variant
    (:func:`dash_cuda.backends.cute.launch.probing`)."""
    _local.suspended = getattr(_local, "suspended", 0) + 1
    try:
        yield
    finally:
        _local.suspended -= 1


def keep(key: tuple, plan: ForwardPlan | BackwardPlan | None) -> None:
    """Keep ``plan`` (None: the signature has none) under ``key``."""
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def clear() -> None:
    """Forget every plan (and every plan kept elsewhere: :data:`generation`)."""
    global generation
    _plans.clear()
    generation += 1


def raw_stream(index: int) -> int:
    """The handle of device ``index``'s current stream (what a kernel launches on)."""
    return current_stream(index)


@dataclass(frozen=True)
class ForwardPlan:
    """A rectangular forward with everything but its tensors worked out: ``kernel`` and
    its argument ``template`` (pointers and the stream per call), the shape and strides of
    ``LSE2`` (a ``(B, S_q, H)`` view of a ``(B, H, S_q)`` buffer, allocated as such), and
    whether the launch takes its tiles from a ``counter`` (one of :attr:`counters`).

    ``counters``: a counter's launch takes, on each stream (and thread: a handle such as a
    per-thread default stream's may name one stream per thread), the one counter kept for
    it, which is zero between launches (the launch's last ticket stores 0 back:
    ``backends.cute.fwd_kernel``'s ``next_tile``), so no call zeroes a fresh one; launches
    on one stream never overlap, and a launch captured into a CUDA graph (which may replay
    on any stream, beside any other) takes a fresh counter of its own.

    ``backwards``: the backward plans of calls whose forward ran this plan, by
    :func:`grad_key`. Such a backward's :func:`signature` is the forward's (options, device,
    ``Q``, ``K``, ``V``) with ``O`` and ``LSE2`` as this plan allocates them (their shapes and
    strides follow from ``Q``'s and ``V``'s, fresh buffers are aligned) and ``dO``: so ``dO`` alone
    finds its plan, without the signature of six tensors (``ops.EagerAttention``).
    """

    device: torch.device
    stats_shape: tuple[int, int, int]
    stats_strides: tuple[int, int, int]
    counter: bool
    kernel: object
    template: object
    sinks: bool = False  # the launch also takes the learnable sinks' base-2 logits
    counters: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    backwards: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def run(self, q, k, v, sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(O, LSE2)`` of a call of the plan's signature (``sink``: its learnable sinks,
        for a plan with ``sinks``)."""
        o = new_output(q, v)  # as the general path made the O the plan was bound with
        lse2 = torch.empty_strided(self.stats_shape, self.stats_strides, device=self.device,
                                   dtype=F32)
        stream = raw_stream(self.device.index)
        counter = self._counter(stream) if self.counter else 0
        extra = ()
        if self.sinks:  # the general path's base-2 logits (dash_cuda.launch._features)
            sink2 = sink_logit(sink)
            extra = (sink2.data_ptr(),)
        self.kernel(*self.template.fill(q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        o.data_ptr(), lse2.data_ptr(), counter, stream,
                                        *extra))
        return o, lse2

    def _counter(self, stream: int) -> int:
        """The address of a zero tile counter for a launch on ``stream`` from this thread
        (:attr:`counters`; a fresh one while a CUDA graph is captured)."""
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return torch.zeros(1, dtype=torch.int32, device=self.device).data_ptr()
        owner = (stream, threading.get_ident())
        kept = self.counters.get(owner)
        if kept is None:
            kept = self.counters[owner] = torch.zeros(1, dtype=torch.int32,
                                                      device=self.device)
        return kept.data_ptr()


def forward_plan(backend, q, k, v, o, lse2, options: Options, sinks: bool = False
                 ) -> ForwardPlan | None:
    """The :class:`ForwardPlan` of a general forward that made ``o`` and ``lse2`` from
    ``q``, ``k``, ``v`` (``sinks``: with learnable sinks; None where the backend cannot bind
    it)."""
    bind_forward = getattr(backend, "bind_forward", None)
    bound = None if bind_forward is None else bind_forward(q, k, v, o, options.mask,
                                                           options.softmax_scale, sinks)
    if bound is None:
        return None
    kernel, template, counter = bound
    return ForwardPlan(q.device, tuple(lse2.shape), lse2.stride(), counter, kernel, template,
                       sinks)


@dataclass(frozen=True)
class BackwardPlan:
    """A rectangular backward with everything but its tensors worked out: the launches of
    :func:`dash_cuda.launch.run_backward` for one signature.

    ``workspace``: fp32 elements of the one scratch buffer
    (:func:`dash_cuda.launch.new_workspace`; the semaphores ``sem_offset`` bytes in);
    ``delta_shape``: the ``(B, H, S_q)`` buffer of ``D``; ``delta``, ``schedule``,
    ``finish_dq`` and ``gqa`` (the GQA sum, None without the per-head scratch of
    ``heads_shape``): the bound launches.
    """

    device: torch.device
    workspace: int
    sem_offset: int
    delta_shape: tuple[int, int, int]
    heads_shape: tuple[int, ...] | None
    delta: object
    schedule: object
    finish_dq: object
    gqa: object | None

    def run(self, q, k, v, o, lse2, do, sink: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(dQ, dK, dV, dsink)`` of a call of the plan's signature; ``dsink`` None without
        learnable sinks ``sink`` (the other launches do not change with them: ``LSE2``
        carries the sinks)."""
        device = self.device
        workspace = torch.empty(self.workspace, device=device, dtype=F32)
        delta = torch.empty(self.delta_shape, device=device, dtype=F32)
        self.delta(o, do, delta, workspace)  # D, and the workspace zeroed
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dk_out, dv_out = dk, dv
        if self.gqa is not None:
            dk_out = torch.empty(self.heads_shape, device=device, dtype=F32)
            dv_out = torch.empty_like(dk_out)
        at = workspace.data_ptr()  # dQacc (and the partials), then the semaphores
        self.schedule(q.data_ptr(), k.data_ptr(), v.data_ptr(), do.data_ptr(),
                      lse2.data_ptr(), delta.data_ptr(), at, dk_out.data_ptr(),
                      dv_out.data_ptr(), at + self.sem_offset, at, raw_stream(device.index))
        self.finish_dq(workspace, dq)
        if self.gqa is not None:
            self.gqa(dk_out, dv_out, dk, dv)
        dsink = None
        if sink is not None:  # D as the kernels read it: (B, S_q, H), strided like LSE2
            from . import prepost

            dsink = prepost.sink_grad(lse2, delta.transpose(1, 2), sink)
        return dq, dk, dv, dsink


def backward_plan(backend, launch, o: torch.Tensor, do: torch.Tensor,
                  workspace: torch.Tensor, pairwise: bool) -> BackwardPlan | None:
    """The :class:`BackwardPlan` of a general backward's :class:`dash_cuda.backends.Launch`
    (its tables set, not yet run) and the ``o``, ``do``, ``workspace`` and ``D`` order it
    ran ``D`` with, or None where the backend cannot bind it."""
    from . import prepost
    from .triton_launch import bind

    bind_schedule = getattr(backend, "bind_schedule", None)
    bind_finish_dq = getattr(backend, "bind_finish_dq", None)
    if bind_schedule is None or bind_finish_dq is None or launch.partials is not launch.dq_acc:
        return None
    schedule = bind_schedule(launch)
    finish = bind_finish_dq(launch.dq_acc, torch.empty_like(launch.q), launch.problem,
                            launch.softmax_scale)
    if schedule is None or finish is None:
        return None
    p = launch.problem
    kernel, grid, args, named, options = prepost.delta_launch(
        o, do, launch.delta, p.block_m, pairwise, workspace)
    delta = bind(kernel, grid, args, named, (o, do, launch.delta, workspace), **options)
    gqa = None
    if launch.per_head:
        dk, dv = torch.empty_like(launch.k), torch.empty_like(launch.v)
        kernel, grid, args, named, options = prepost.gqa_launch(
            launch.dk_out, launch.dv_out, dk, dv, launch.softmax_scale)
        gqa = bind(kernel, grid, args, named, (launch.dk_out, launch.dv_out, dk, dv),
                   **options)
    return BackwardPlan(launch.q.device, workspace.numel(),
                        launch.sem.data_ptr() - workspace.data_ptr(),
                        (p.batch, p.heads, p.seqlen_q),
                        tuple(launch.dk_out.shape) if launch.per_head else None,
                        delta, schedule, finish, gqa)


__all__ = ["BackwardPlan", "ForwardPlan", "active", "backward_plan", "clear", "forward_plan",
           "grad_key", "keep", "kept", "lookup", "raw_stream", "signature", "structure",
           "suspended"]
