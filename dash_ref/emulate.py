"""Tile-level emulation of the attention forward and of a schedule's backward, on the CPU.

The backward follows a :class:`~dash_ref.schedules.schedule.Schedule` literally: every chain
visits its Q tiles in visit order (so ``dK_j`` and ``dV_j`` accumulate in that order), every
fp32 partial ``dQ_ij`` is kept, and every ``dQacc_i`` is the fp32 sum of its partials in the
tile's dQ order, starting from ``+0.0`` (:func:`replay`). Each floating-point operation is a
named step of :mod:`dash_ref.arithmetic.steps` (the arithmetic contract); ``arithmetic``
selects how the steps round: ``"ieee"`` (CPU fp32, the default), ``"fast"`` (the CuTe
backend's default arithmetic, forward and backward, bit for bit) or ``"exact"`` (the
kernels' ``exact=True`` mode, bit for bit): the last two are the L2 verification level.

Logsumexps are in base 2 (``LSE2 = log2 sum 2^(S*scale_log2)``, plus ``2^(sink log2 e)``
with a learnable sink); rows that see no key have ``LSE2 = -inf`` (with a sink: the sink's
``fp32(sink log2 e)``), ``O = 0`` and zero gradients. NaN and infinity follow PyTorch's SDPA: a NaN
in a row's inputs makes that row's output and LSE NaN. Tensors use the ``(B, S, H, d)``
layout; ``k`` and ``v`` have ``H_kv`` heads.

The forward is emulated in ``"ieee"`` and ``"fast"`` arithmetic (``"fast"``: the CuTe
forward's order of steps). The backward takes ``O`` and ``LSE2`` as inputs
(:func:`emulate` feeds the forward's, in the same arithmetic where it has one, else the
IEEE forward's; the L2 check feeds the kernel's).

**Packed batches** (a :class:`Problem` with ``seqlens_q``, ``seqlens_k``; FlashAttention's
``varlen`` layout): the sequences lie one after another, ``q``, ``o``, ``do`` as
``(total_q, H, d)``, ``k``, ``v`` as ``(total_k, H_kv, d)``, sequence ``b`` in rows
``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` (and ``cu_seqlens_k``) of
:attr:`Problem.cu_seqlens_q`, implied by the lengths. ``LSE2`` is ``(total_q, H)`` fp32: the
rectangular ``(B, S_q, H)`` with its first two dims flattened (FlashAttention's varlen
``softmax_lse`` is the transpose, ``(H, total_q)``). :func:`forward` takes the lengths as
``seqlens_q=``, ``seqlens_k=``; :func:`backward`, :func:`replay` and :func:`emulate` read
them from the schedule's problem. Every sequence runs in its own coordinates (its tiles
start at its first row; the mask uses its own lengths), so a packed call gives each
sequence, bit for bit, what the batch-1 call on that sequence alone gives, with any
schedule whose orders are packing invariant (:data:`dash_ref.PORTABLE`, ``lpt``), whatever
the other sequences and their order.

**FlashAttention's other features** (``docs/design.md`` section 10): a sliding window is part
of the :class:`Problem` (``window_size``; :func:`forward` takes it as FlashAttention does,
``window_size=(left, right)`` with ``-1`` unbounded, ``causal=True`` making it ``(left, 0)``)
and changes only which tiles and elements are visible, in every arithmetic. ``v`` may have
its own head dim ``d_v`` (``Problem.head_dim_v``; ``O`` and ``dO`` have it too). Softcap
(``softcap=``, FlashAttention's: ``softcap * tanh(S softmax_scale / softcap)``, 0 for none)
and learnable sinks (``learnable_sink=``, FlashAttention-4's: one logit per query head,
``(H,)``, in the natural-log units of the final scores; ``LSE2`` includes it; the backward
returns its gradient, ``BackwardResult.dsink``) are optional steps of the contract
(:mod:`dash_ref.arithmetic.steps`) computed in ``"ieee"`` arithmetic only: ``"fast"`` and
``"exact"`` refuse them in one line until a kernel computes them and its arithmetic is
modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._checks import attention_inputs, boolean, number, packed_inputs, window
from .arithmetic import steps
from .arithmetic.steps import ARITHMETICS, IEEE, Arithmetic, dq_add, epilogue
from .cpu import single_threaded
from .schedules.problem import Problem
from .schedules.schedule import Chain, Schedule

F32 = torch.float32

__all__ = ["ARITHMETICS", "BackwardResult", "ForwardResult", "backward", "dq_add", "emulate",
           "epilogue", "forward", "packed_problem_of", "problem_of", "replay", "visible",
           "visit_index"]


# ---------------------------------------------------------------------------------------
# problems and masks
# ---------------------------------------------------------------------------------------
def problem_of(q: torch.Tensor, k: torch.Tensor, causal: bool, block_m: int, block_n: int,
               *, window_size: tuple[int, int] | None = (-1, -1),
               head_dim_v: int | None = None) -> Problem:
    """The :class:`Problem` of ``(B, S, H, d)`` tensors ``q`` and ``k`` (with the window and the
    value head dim given, as FlashAttention's ``window_size``: ``-1`` unbounded)."""
    attention_inputs(q, k, k)
    b, s_q, h, d = q.shape
    return Problem(b, h, k.shape[2], s_q, k.shape[1], d, "causal" if causal else "full",
                   block_m, block_n, None, None, window("window_size", window_size),
                   head_dim_v)


def packed_problem_of(q: torch.Tensor, k: torch.Tensor, seqlens_q, seqlens_k, causal: bool,
                      block_m: int, block_n: int, *,
                      window_size: tuple[int, int] | None = (-1, -1),
                      head_dim_v: int | None = None) -> Problem:
    """The packed :class:`Problem` of ``(total_q, H, d)`` ``q`` and ``(total_k, H_kv, d)`` ``k``
    holding sequences of lengths ``seqlens_q``, ``seqlens_k``."""
    packed_inputs(q=q, k=k)
    return Problem.packed(seqlens_q, seqlens_k, q.shape[1], k.shape[1], q.shape[2],
                          "causal" if causal else "full", block_m, block_n,
                          window("window_size", window_size), head_dim_v)


def visible(p: Problem, rows: range, cols: range, b: int = 0) -> torch.Tensor:
    """Boolean ``(len(rows), len(cols))``: which elements of a tile pair of sequence ``b``
    are unmasked (rows and keys counted from the sequence's first)."""
    return p.visibility.visible(rows, cols, p.seqlen_q_of(b), p.seqlen_k_of(b))


def _check_inputs(p: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  **more: torch.Tensor) -> None:
    """Dtypes and shapes of the inputs against the problem; a message that names them."""
    if p.is_packed:
        _check_packed_inputs(p, q, k, v, **more)
        return
    attention_inputs(q, k, v, **{n: x for n, x in more.items() if n != "lse2"})
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"q must be bfloat16 or float16, got {q.dtype}")
    for name, x in {"k": k, "v": v, **more}.items():
        if name != "lse2" and x.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, q has {q.dtype}: they must match")
    dv = p.head_dim_v
    want = {"q": (p.batch, p.seqlen_q, p.heads, p.head_dim),
            "k": (p.batch, p.seqlen_k, p.heads_kv, p.head_dim),
            "v": (p.batch, p.seqlen_k, p.heads_kv, dv),
            "o": (p.batch, p.seqlen_q, p.heads, dv),
            "do": (p.batch, p.seqlen_q, p.heads, dv),
            "lse2": (p.batch, p.seqlen_q, p.heads)}
    for name, x in {"q": q, "k": k, "v": v, **more}.items():
        if tuple(x.shape) != want[name]:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, the problem needs "
                             f"{want[name]} ((B, S, H, d) layout; k and v with H_kv heads; "
                             "v, o and do with the value head dim)")
    if "lse2" in more and more["lse2"].dtype != F32:
        raise TypeError(f"lse2 must be float32, got {more['lse2'].dtype}")


def _check_packed_inputs(p: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         **more: torch.Tensor) -> None:
    """:func:`_check_inputs` for the packed layout (module docstring)."""
    named = {"q": q, "k": k, "v": v, **more}
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"q must be bfloat16 or float16, got {q.dtype}")
    for name, x in named.items():
        if name != "lse2" and x.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, q has {q.dtype}: they must match")
    dv = p.head_dim_v
    want = {"q": (p.total_q, p.heads, p.head_dim), "k": (p.total_k, p.heads_kv, p.head_dim),
            "v": (p.total_k, p.heads_kv, dv), "o": (p.total_q, p.heads, dv),
            "do": (p.total_q, p.heads, dv), "lse2": (p.total_q, p.heads)}
    for name, x in named.items():
        if tuple(x.shape) != want[name]:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, the packed problem needs "
                             f"{want[name]} ((total, H, d) layout, sequences one after "
                             "another; k and v with H_kv heads; lse2 (total_q, H))")
    if "lse2" in more and more["lse2"].dtype != F32:
        raise TypeError(f"lse2 must be float32, got {more['lse2'].dtype}")


def _features(a: Arithmetic, softcap: object, learnable_sink: object, heads: int
              ) -> tuple[float | None, torch.Tensor | None]:
    """``(softcap or None, the sinks as fp32 (H,) or None)``, checked by name: softcap a
    number >= 0 (0: none), the sinks a finite floating ``(H,)`` tensor; an arithmetic
    without the feature refuses it (:func:`~dash_ref.arithmetic.steps.require_feature`)."""
    cap = number("softcap", softcap, minimum=0.0)
    if cap:
        steps.require_feature(a, "softcap")
    if learnable_sink is None:
        return cap or None, None
    if not isinstance(learnable_sink, torch.Tensor):
        raise TypeError(f"learnable_sink must be a torch.Tensor of shape ({heads},), got "
                        f"{type(learnable_sink).__name__}")
    if learnable_sink.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"learnable_sink must be float32, bfloat16 or float16, got "
                        f"{learnable_sink.dtype}")
    if tuple(learnable_sink.shape) != (heads,):
        raise ValueError(f"learnable_sink must have shape ({heads},): one logit per query "
                         f"head, got {tuple(learnable_sink.shape)}")
    if not bool(torch.isfinite(learnable_sink).all()):
        raise ValueError("learnable_sink must be finite")
    steps.require_feature(a, "sinks")
    return cap or None, learnable_sink.detach().cpu().to(F32)


def _sequence_views(p: Problem, b: int, **tensors: torch.Tensor) -> dict[str, torch.Tensor]:
    """Sequence ``b``'s rows of packed tensors as batch-1 views: ``(1, S(b), ...)``."""
    out = {}
    for name, x in tensors.items():
        cu = p.cu_seqlens_k if name in ("k", "v") else p.cu_seqlens_q
        out[name] = x[cu[b]:cu[b + 1]].unsqueeze(0)
    return out


# ---------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------
@dataclass
class ForwardResult:
    o: torch.Tensor  # (B, S_q, H, d), input dtype; packed: (total_q, H, d)
    lse2: torch.Tensor  # (B, S_q, H) fp32, base 2; -inf where a row sees no key; packed:
    # (total_q, H)


@single_threaded
def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
            softmax_scale: float | None = None, block_m: int = 64, block_n: int = 64,
            arithmetic: str | Arithmetic = "ieee", *, seqlens_q=None, seqlens_k=None,
            window_size: tuple[int, int] | None = (-1, -1), softcap: float = 0.0,
            learnable_sink: torch.Tensor | None = None) -> ForwardResult:
    """Tile-level forward: an online softmax over each query tile's KV tiles, ascending.

    The steps ``fwd_scores``, ``fwd_max``, ``fwd_probs``, ``fwd_accumulate`` and
    ``fwd_finish`` of :mod:`dash_ref.arithmetic.steps`. ``arithmetic`` is ``"ieee"`` or
    ``"fast"``: the CuTe forward bit for bit, given its KV tile (``block_n = 128``); its
    bits do not depend on ``block_m``, since a row's sums never leave the row.

    ``window_size=(left, right)``: FlashAttention's sliding window (``-1`` unbounded; with
    ``causal`` the window is ``(left, 0)``), in every arithmetic. ``v`` may have its own
    head dim; ``O`` has it. ``softcap`` (> 0; 0 for none) and ``learnable_sink`` (``(H,)``
    logits) add the optional steps ``softcap`` and ``fwd_sink``, in the arithmetics that
    model them (``"ieee"`` both, ``"fast"`` the sinks; module docstring); ``LSE2`` then
    includes the sink.

    With ``seqlens_q`` and ``seqlens_k`` (one length per sequence, both or neither) the
    inputs are a packed batch (module docstring): ``(total_q, H, d)`` and
    ``(total_k, H_kv, d)``, and so are the outputs (``lse2``: ``(total_q, H)``); each
    sequence is computed alone, in its own coordinates.
    """
    a = steps.arithmetic(arithmetic)
    boolean("causal", causal)
    if a.forward is None:
        raise ValueError(f"the forward is emulated in 'ieee' and 'fast' arithmetic, not "
                         f"{a.name!r}")
    if seqlens_q is not None or seqlens_k is not None:
        if seqlens_q is None or seqlens_k is None:
            raise ValueError("seqlens_q and seqlens_k go together: give both for a packed "
                             "batch, neither for (B, S, H, d) tensors")
        p = packed_problem_of(q, k, seqlens_q, seqlens_k, causal, block_m, block_n,
                              window_size=window_size, head_dim_v=_value_dim(v))
        _check_inputs(p, q, k, v)
        _features(a, softcap, learnable_sink, p.heads)
        parts = [forward(**_sequence_views(p, b, q=q, k=k, v=v), causal=causal,
                         softmax_scale=softmax_scale, block_m=block_m, block_n=block_n,
                         arithmetic=a, window_size=window_size, softcap=softcap,
                         learnable_sink=learnable_sink) for b in range(p.batch)]
        return ForwardResult(torch.cat([r.o[0] for r in parts]),
                             torch.cat([r.lse2[0] for r in parts]))
    p = problem_of(q, k, causal, block_m, block_n, window_size=window_size,
                   head_dim_v=_value_dim(v))
    _check_inputs(p, q, k, v)
    cap, sink = _features(a, softcap, learnable_sink, p.heads)
    scale = steps.resolve_scale(softmax_scale, p.head_dim)
    if a.forward == "cute" and scale <= 0:
        # as the CuTe host does: its row maximum needs c > 0, so S c = (-Q) K^T |c|, and a
        # zero scale is Q = 0 with scale 1 (every score 0)
        q, scale = (-q, -scale) if scale < 0 else (torch.zeros_like(q), 1.0)
    # softcap: the scale enters before the cap, the softmax takes log2(e) alone
    capped = None if cap is None else (scale, cap)
    c = steps.scale_log2(scale if cap is None else 1.0)
    sink2 = None if sink is None else steps.sink_logit(sink)
    o = torch.zeros(*q.shape[:3], p.head_dim_v, dtype=F32)
    lse2 = torch.full(q.shape[:3], -math.inf, dtype=F32)
    dtype = q.dtype
    if not a.tensor_cores:  # PyTorch's CPU products take fp32 operands
        q, k, v = q.to(F32), k.to(F32), v.to(F32)
    partial_sums = (4,) if a.forward == "cute" else ()  # each of a row's 4 threads' sums
    for b in range(p.batch):
        for h in range(p.heads):
            hk = h // p.group
            for i in range(p.n_q):
                rows = p.rows(i)
                m = torch.full((len(rows),), -math.inf, dtype=F32)
                ell = torch.zeros(len(rows), *partial_sums, dtype=F32)
                acc = torch.zeros(len(rows), p.head_dim_v, dtype=F32)
                for j in p.tile_cols[i]:
                    cols = p.cols(j)
                    s = steps.fwd_scores(a, q[b, rows.start:rows.stop, h],
                                         k[b, cols.start:cols.stop, hk], c,
                                         visible(p, rows, cols), capped)
                    m_new, m_safe = steps.fwd_max(a, m, s, c)
                    pt, alpha = steps.fwd_probs(a, s, m, m_safe, c)
                    ell, acc = steps.fwd_accumulate(a, ell, acc, alpha, pt,
                                                    v[b, cols.start:cols.stop, hk], dtype,
                                                    p.block_n)
                    m = m_new
                if sink2 is not None:
                    m, ell, acc = steps.fwd_sink(a, m, ell, acc, sink2[h])
                o_tile, lse_tile = steps.fwd_finish(a, acc, m, ell)
                o[b, rows.start:rows.stop, h] = o_tile
                lse2[b, rows.start:rows.stop, h] = lse_tile
    return ForwardResult(o.to(dtype), lse2)


# ---------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------
@dataclass
class BackwardResult:
    dq: torch.Tensor  # (B, S_q, H, d), input dtype; packed: (total_q, H, d)
    dk: torch.Tensor  # (B, S_k, H_kv, d); packed: (total_k, H_kv, d)
    dv: torch.Tensor
    dq_acc: torch.Tensor  # fp32 accumulators before the epilogue
    dk_acc: torch.Tensor  # fp32, per KV head after the GQA sum
    dv_acc: torch.Tensor
    partials: torch.Tensor | None  # (V, BM, d) fp32 in table order, rows past the
    # sequence's S_q are zero
    dsink: torch.Tensor | None = None  # (H,) in learnable_sink's dtype (None without sinks)
    dsink_acc: torch.Tensor | None = None  # (H,) fp32, the sum of step sink_grad


def _schedule(schedule: object) -> Schedule:
    """``schedule`` if it is a :class:`Schedule` (``build_schedule`` makes one)."""
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a dash_ref.Schedule (from build_schedule), got "
                        f"{type(schedule).__name__}")
    return schedule


def visit_index(schedule: Schedule) -> dict[tuple[int, int, int, int], int]:
    """``{(b, h, i, j): v}``: the row of each visit in the partials tensor (table order)."""
    index: dict[tuple[int, int, int, int], int] = {}
    for _, c in schedule.chains():
        for i in c.visits:
            index[(c.b, c.h, i, c.j)] = len(index)
    return index


@single_threaded
def replay(schedule: Schedule, partials: torch.Tensor,
           arrival: dict[tuple[int, int, int], tuple[int, ...]] | None = None,
           flush_subnormals: bool = False) -> torch.Tensor:
    """Rebuild every ``dQacc`` from fp32 partials in the schedule's dQ order (step ``dq_add``).

    ``partials`` is ``(V, BM, d)`` fp32 in :meth:`Schedule.to_tables` visit order (what a
    kernel writes in audit mode). Each tile starts from ``+0.0`` and adds its partials one
    fp32 RNE addition at a time. A non-deterministic schedule has no order to replay unless
    ``arrival`` gives one for every tile. ``flush_subnormals`` mirrors a kernel whose adds
    flush subnormals (its audit record says so). Returns ``(B, S_q, H, d)`` fp32 (packed:
    ``(total_q, H, d)``).
    """
    p = _schedule(schedule).problem
    if partials.dtype != F32 or partials.dim() != 3 or partials.shape[1] != p.block_m:
        raise ValueError(f"partials must be fp32 (V, {p.block_m}, d), got "
                         f"{tuple(partials.shape)} {partials.dtype}")
    index = visit_index(schedule)
    if partials.shape[0] != len(index):
        raise ValueError(f"partials has {partials.shape[0]} rows, the schedule has "
                         f"{len(index)} visits")
    if p.is_packed:
        acc = torch.zeros(p.total_q, p.heads, partials.shape[2], dtype=F32)
    else:
        acc = torch.zeros(p.batch, p.seqlen_q, p.heads, partials.shape[2], dtype=F32)
    for (b, h, i), order in schedule.dq_orders.items():
        if order is None:
            if arrival is None:
                raise ValueError(f"schedule {schedule.name!r} has no dQ order to replay; "
                                 "pass the arrival order")
            order = arrival[(b, h, i)]
        rows = p.rows(i, b)
        tile = torch.zeros(len(rows), partials.shape[2], dtype=F32)
        for j in order:
            tile = dq_add(tile, partials[index[(b, h, i, j)], : len(rows)], flush_subnormals)
        if p.is_packed:
            first = p.cu_seqlens_q[b]
            acc[first + rows.start:first + rows.stop, h] = tile
        else:
            acc[b, rows.start:rows.stop, h] = tile
    return acc


def _chain(a: Arithmetic, p: Problem, c: Chain, q: torch.Tensor, k: torch.Tensor,
           v: torch.Tensor, do: torch.Tensor, lse2: torch.Tensor, delta: torch.Tensor,
           scale2: torch.Tensor, partials: torch.Tensor, first_visit: int,
           capped: tuple[float, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One chain: its visits in visit order, every step named, on the rows that exist.

    Writes visit ``first_visit + n``'s partial into ``partials``; returns the fp32 ``dK_j``
    (unscaled) and ``dV_j`` as ``(len(cols), d)`` and ``(len(cols), d_v)``. With ``capped =
    (softmax_scale, softcap)`` the scores go through step ``softcap`` and ``dS`` through
    ``softcap_grad`` (``scale2`` is then ``fp32(log2 e)``).
    """
    dtype = q.dtype
    cols = p.cols(c.j)
    hk = c.h // p.group
    k_j = k[c.b, cols.start:cols.stop, hk]
    v_j = v[c.b, cols.start:cols.stop, hk]
    if not a.tensor_cores:  # PyTorch's CPU products take fp32 operands
        k_j, v_j = k_j.to(F32), v_j.to(F32)
    dk = torch.zeros(len(cols), p.head_dim, dtype=F32)
    dv = torch.zeros(len(cols), p.head_dim_v, dtype=F32)
    for n, i in enumerate(c.visits):
        rows = p.rows(i)
        sl = slice(rows.start, rows.stop)
        q_i, do_i = q[c.b, sl, c.h], do[c.b, sl, c.h]
        if not a.tensor_cores:
            q_i, do_i = q_i.to(F32), do_i.to(F32)
        s = steps.qk(a, q_i, k_j)
        if capped is not None:
            s, t = steps.softcap(a, s, *capped)
        pr = steps.softmax_p(a, s, scale2, lse2[c.b, sl, c.h], visible(p, rows, cols))
        dv = steps.dv_step(a, dv, _operand(a, pr, dtype), do_i)
        dp = steps.dp(a, do_i, v_j)
        if capped is not None and steps.ratio_softcap(a):  # the slope folded into P first
            pr = steps.softcap_grad(a, pr, t)
        ds = steps.ds(pr, dp, delta[c.b, sl, c.h])
        if capped is not None and not steps.ratio_softcap(a):
            ds = steps.softcap_grad(a, ds, t)
        ds_op = _operand(a, ds, dtype)
        dk = steps.dk_step(a, dk, ds_op, q_i)
        partials[first_visit + n, : len(rows)] = steps.dq_partial(a, ds_op, k_j)
    return dk, dv


def _operand(a: Arithmetic, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``round_operand``, kept in ``dtype`` for the tensor-core model (it reads the bits)."""
    return x.to(dtype) if a.tensor_cores else steps.round_operand(x, dtype)


@single_threaded
def backward(schedule: Schedule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse2: torch.Tensor, do: torch.Tensor,
             softmax_scale: float | None = None, return_partials: bool = False,
             arrival_seed: int | None = None, arithmetic: str | Arithmetic = "ieee", *,
             softcap: float = 0.0, learnable_sink: torch.Tensor | None = None
             ) -> BackwardResult:
    """Emulate the backward exactly as ``schedule`` orders it.

    ``arithmetic`` is ``"ieee"``, ``"exact"`` (the kernels' ``exact=True`` arithmetic) or
    an :class:`~dash_ref.arithmetic.steps.Arithmetic` (for instance ``EXACT`` with the dQ
    additions of a kernel whose audit record says they keep subnormals). For the
    ``atomic`` schedule (no fixed dQ order) the arrival order of every tile is drawn from
    ``arrival_seed`` (a stand-in for the run-to-run variation of atomics).

    The window and the value head dim come with the schedule's problem. ``softcap`` and
    ``learnable_sink`` must be the forward's; with sinks ``lse2`` is the forward's (it
    includes them) and the result carries ``dsink``: step ``sink_grad``, one fp32 sum per
    head over every query row in layout order (batch by batch; a packed batch's
    ``total_q`` order) in the arithmetic's ``sink_order``, rounded to
    ``learnable_sink``'s dtype.
    """
    a = steps.arithmetic(arithmetic)
    p = _schedule(schedule).problem
    _check_inputs(p, q, k, v, o=o, do=do, lse2=lse2)
    cap, sink = _features(a, softcap, learnable_sink, p.heads)
    if p.is_packed:
        return _backward_packed(schedule, a, q, k, v, o, lse2, do, softmax_scale,
                                return_partials, arrival_seed, cap, sink, learnable_sink)
    scale = steps.resolve_scale(softmax_scale, p.head_dim)
    capped = None if cap is None else (scale, cap)
    scale2 = steps.scale_log2(scale if cap is None else 1.0)
    delta = steps.delta(a, o, do)
    partials = torch.zeros(schedule.num_visits, p.block_m, p.head_dim, dtype=F32)
    dk_head = torch.zeros(p.batch, p.seqlen_k, p.heads, p.head_dim, dtype=F32)
    dv_head = torch.zeros(p.batch, p.seqlen_k, p.heads, p.head_dim_v, dtype=F32)
    first_visit = 0
    for _, c in schedule.chains():
        cols = p.cols(c.j)
        dk, dv = _chain(a, p, c, q, k, v, do, lse2, delta, scale2, partials, first_visit,
                        capped)
        first_visit += len(c.visits)
        dk_head[c.b, cols.start:cols.stop, c.h] = dk
        dv_head[c.b, cols.start:cols.stop, c.h] = dv
    arrival = _arrival(schedule, arrival_seed)
    dq_acc = replay(schedule, partials, arrival, flush_subnormals=a.flush_dq_adds)
    dk_acc, dv_acc = steps.gqa_sum(dk_head, p.group), steps.gqa_sum(dv_head, p.group)
    return _result(dq_acc, dk_acc, dv_acc, scale, q.dtype,
                   partials if return_partials else None,
                   _sink_grads(a, sink, learnable_sink, lse2.reshape(-1, p.heads),
                               delta.reshape(-1, p.heads), p.seqlen_q))


def _result(dq_acc: torch.Tensor, dk_acc: torch.Tensor, dv_acc: torch.Tensor, scale: float,
            dtype: torch.dtype, partials: torch.Tensor | None,
            sink_grads: dict[str, torch.Tensor]) -> BackwardResult:
    """The :class:`BackwardResult` of the fp32 accumulators: each rounded by the epilogue to
    ``dtype``, dQ and dK scaled by ``scale`` first, dV not."""
    return BackwardResult(dq=epilogue(dq_acc, scale, dtype), dk=epilogue(dk_acc, scale, dtype),
                          dv=epilogue(dv_acc, None, dtype), dq_acc=dq_acc, dk_acc=dk_acc,
                          dv_acc=dv_acc, partials=partials, **sink_grads)


def _sink_grads(a: Arithmetic, sink: torch.Tensor | None, learnable_sink: torch.Tensor | None,
                lse2: torch.Tensor, delta: torch.Tensor, rows_per_batch: int | None = None
                ) -> dict[str, torch.Tensor]:
    """``dsink`` and ``dsink_acc`` of :class:`BackwardResult` from ``(R, H)`` rows in layout
    order, ``rows_per_batch`` rows a batch (None: one batch; nothing without sinks)."""
    if sink is None:
        return {}
    acc = steps.sink_grad(a, steps.sink_logit(sink), lse2, delta, rows_per_batch)
    return {"dsink": acc.to(learnable_sink.dtype), "dsink_acc": acc}


def _value_dim(v: object) -> int | None:
    """``v``'s head dim (its last), or None where ``v`` is not a tensor (the checks name it)."""
    return v.shape[-1] if isinstance(v, torch.Tensor) and v.dim() >= 1 else None


def _arrival(schedule: Schedule, arrival_seed: int | None
             ) -> dict[tuple[int, int, int], tuple[int, ...]] | None:
    """For ``atomic``: every tile's arrival order drawn from ``arrival_seed``; else None."""
    if schedule.deterministic:
        return None
    p = schedule.problem
    gen = torch.Generator().manual_seed(arrival_seed or 0)
    arrival = {}
    for b, h, i in schedule.dq_orders:
        cols = p.tile_cols_of(b)[i]
        arrival[(b, h, i)] = tuple(cols[t] for t in
                                   torch.randperm(len(cols), generator=gen).tolist())
    return arrival


def _backward_packed(schedule: Schedule, a: Arithmetic, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, o: torch.Tensor, lse2: torch.Tensor, do: torch.Tensor,
                     softmax_scale: float | None, return_partials: bool,
                     arrival_seed: int | None, cap: float | None = None,
                     sink: torch.Tensor | None = None,
                     learnable_sink: torch.Tensor | None = None) -> BackwardResult:
    """:func:`backward` of a packed batch: every chain on its own sequence's batch-1 views,
    with that sequence's problem, in table order; every sequence's ``D``, GQA sums and
    epilogue on its own rows (module docstring)."""
    p = schedule.problem
    scale = steps.resolve_scale(softmax_scale, p.head_dim)
    capped = None if cap is None else (scale, cap)
    scale2 = steps.scale_log2(scale if cap is None else 1.0)
    seqs = [_sequence_views(p, b, q=q, k=k, v=v, o=o, do=do, lse2=lse2)
            for b in range(p.batch)]
    for x in seqs:
        x["delta"] = steps.delta(a, x["o"], x["do"])
    partials = torch.zeros(schedule.num_visits, p.block_m, p.head_dim, dtype=F32)
    dk_head = [torch.zeros(1, p.seqlen_k_of(b), p.heads, p.head_dim, dtype=F32)
               for b in range(p.batch)]
    dv_head = [torch.zeros(1, p.seqlen_k_of(b), p.heads, p.head_dim_v, dtype=F32)
               for b in range(p.batch)]
    first_visit = 0
    for _, c in schedule.chains():
        x = seqs[c.b]
        cols = p.cols(c.j, c.b)
        dk, dv = _chain(a, p.sequence(c.b), Chain(0, c.h, c.j, c.visits), x["q"], x["k"],
                        x["v"], x["do"], x["lse2"], x["delta"], scale2, partials, first_visit,
                        capped)
        first_visit += len(c.visits)
        dk_head[c.b][0, cols.start:cols.stop, c.h] = dk
        dv_head[c.b][0, cols.start:cols.stop, c.h] = dv
    dq_acc = replay(schedule, partials, _arrival(schedule, arrival_seed),
                    flush_subnormals=a.flush_dq_adds)
    dk_acc = torch.cat([steps.gqa_sum(x, p.group)[0] for x in dk_head])
    dv_acc = torch.cat([steps.gqa_sum(x, p.group)[0] for x in dv_head])
    return _result(dq_acc, dk_acc, dv_acc, scale, q.dtype,
                   partials if return_partials else None,
                   _sink_grads(a, sink, learnable_sink, lse2,
                               torch.cat([x["delta"][0] for x in seqs])))


def emulate(schedule: Schedule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            do: torch.Tensor, softmax_scale: float | None = None,
            return_partials: bool = False, arrival_seed: int | None = None,
            arithmetic: str | Arithmetic = "ieee", *, softcap: float = 0.0,
            learnable_sink: torch.Tensor | None = None
            ) -> tuple[ForwardResult, BackwardResult]:
    """Forward, then the backward under ``schedule``, for one problem.

    ``arithmetic`` selects the backward's arithmetic (:func:`backward`) and the forward's
    where it has one (``"fast"``, on the problem's KV tiles; else the IEEE forward). The
    window comes with the schedule's problem; ``softcap`` and ``learnable_sink`` go to both
    passes (``"ieee"`` only).
    """
    p = _schedule(schedule).problem
    a = steps.arithmetic(arithmetic)
    _features(a, softcap, learnable_sink, p.heads)  # refused before any work
    fwd = forward(q, k, v, p.mask == "causal", softmax_scale, p.block_m, p.block_n,
                  a if a.forward is not None else IEEE, seqlens_q=p.seqlens_q,
                  seqlens_k=p.seqlens_k, window_size=p.window_size, softcap=softcap,
                  learnable_sink=learnable_sink)
    bwd = backward(schedule, q, k, v, fwd.o, fwd.lse2, do, softmax_scale, return_partials,
                   arrival_seed, arithmetic, softcap=softcap, learnable_sink=learnable_sink)
    return fwd, bwd
