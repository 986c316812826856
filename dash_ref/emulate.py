"""Tile-level emulation of the attention forward and of a schedule's backward, on the CPU.

The backward follows a :class:`~dash_ref.schedule.Schedule` literally: every chain visits
its Q tiles in visit order (so ``dK_j`` and ``dV_j`` accumulate in that order), every fp32
partial ``P_ij`` is kept, and every ``dQacc_i`` is the fp32 sum of its partials in the
tile's dQ order, starting from ``+0.0`` (:func:`replay`). Each floating-point step below is
one line of the arithmetic contract (``DESIGN.md`` section 5); its name is the name the
kernel's contract table refers to.

===========================  ===========================================================
step                         emulation (fp32 unless said otherwise)
===========================  ===========================================================
``operand``                  inputs are bf16/fp16; upcast to fp32 is exact
``qk``                       ``S = Q_i @ K_j^T``
``softmax_p``                ``P = exp2(S * scale_log2 - LSE2_i)``; masked elements ``0``
``round_operand``            ``P``, ``dS`` rounded to the input dtype (RNE) before a matmul
``dv_step``                  ``dV_j += P^T(bf16) @ dO_i``
``dp``                       ``dP = dO_i @ V_j^T``
``ds``                       ``dS = P * (dP - D_i)``
``dk_step``                  ``dK_j += dS^T(bf16) @ Q_i``
``dq_partial``               ``P_ij = dS(bf16) @ K_j`` (fresh accumulator)
``dq_add``                   ``dQacc_i += P_ij`` in dQ order, from ``+0.0`` (:func:`replay`)
``preprocess_d``             ``D_i = rowsum(dO_i * O_i)``
``epilogue``                 ``dQ = rnd(dQacc*scale)``, ``dK = rnd(dK*scale)``, ``dV = rnd(dV)``
``gqa_sum``                  dK/dV of a KV head: ``((+0 + dK_h0) + dK_h1) + ...``, ``h`` ascending
===========================  ===========================================================

Matrix products here are fp32 products of exactly upcast operands, as torch computes them
on the CPU: they fix *which* sums happen in *what order* at the tile level, which is what
the schedule decides. The bits of a single tensor-core product are the business of a
separate arithmetic model. Logsumexps are in base 2 (``LSE2 = log2 sum 2^(S*scale_log2)``);
rows that see no key have ``LSE2 = -inf``, ``O = 0`` and zero gradients.

Tensors use the ``(B, S, H, d)`` layout; ``k`` and ``v`` have ``H_kv`` heads.

Hopper arithmetic
-----------------
``backward(..., arithmetic="hopper")`` (and :func:`emulate`) replaces the CPU arithmetic by
the operations the sm_90 kernel issues (the contract in :mod:`dash_cuda.backward`), in the
kernel's orientations and on its padded ``BM x BN`` tiles (rows past ``S_q``, keys past
``S_k`` are zero; zeros are exact in the MMA model). Every matrix product is
:func:`~dash_ref.tensorcore.mma` (k16 fused steps, ascending, the model measured on an
H200), through :func:`tc_dot`:

* ``qk``: ``S^T = mma(K_j, Q_i^T)``, ``k = d``, fresh accumulator;
* ``softmax_p``: ``P^T = exp2_fma(fma(S^T, scale_log2, 0 - LSE2))``, masked elements ``0``
  (:func:`softmax_p_fma`, :func:`~dash_ref.numerics.fma_f32`,
  :func:`~dash_ref.exp2.exp2_fma`);
* ``dv_step``: ``dV_j = mma(P^T(bf16), dO_i, c=dV_j)``, ``k = BM``: the accumulation is
  inside the tensor-core sum;
* ``dp``: ``dP^T = mma(V_j, dO_i^T)``, ``k = d``, fresh;
* ``ds``: ``dS = P * (dP - D_i)``, an fp32 subtraction and a multiplication, each rounded;
* ``dk_step``: ``dK_j = mma(dS^T(bf16), Q_i, c=dK_j)``, ``k = BM``;
* ``dq_partial``: ``P_ij = mma(dS(bf16), K_j)``, ``k = BN``, fresh;
* ``dq_add``: flushing subnormals, as the kernel's default ``red.add.f32`` does
  (``replay(..., flush_subnormals=True)``);
* ``preprocess_d``: :func:`preprocess_d_ordered` (an ascending pairwise tree);
* ``gqa_sum`` and ``epilogue`` as in IEEE mode.

The forward is not emulated in this mode: ``O`` and ``LSE2`` are inputs (:func:`emulate`
feeds the IEEE forward's). The kernel computes this arithmetic with ``exact=True``
(:mod:`dash_cuda.backward`); ``tests/gpu/test_cuda_exact.py`` gives the kernel and
``backward(..., arithmetic="hopper")`` the same ``Q, K, V, O, dO, LSE2`` and compares ``D``,
every partial, the accumulators and ``dQ``, ``dK``, ``dV`` bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .exp2 import exp2_fma
from .numerics import fma_f32, fp32_add_rne
from .problem import Problem
from .schedule import Chain, Schedule
from .tensorcore import K_STEP, mma

LOG2E = 1.4426950408889634
F32 = torch.float32
#: The arithmetics :func:`backward` and :func:`emulate` know (module docstring).
ARITHMETICS = ("ieee", "hopper")


# ---------------------------------------------------------------------------------------
# named arithmetic steps
# ---------------------------------------------------------------------------------------
def scale_log2(softmax_scale: float) -> torch.Tensor:
    """The fp32 constant the kernel multiplies ``S`` by: ``fp32(softmax_scale * log2(e))``."""
    return torch.tensor(softmax_scale * LOG2E, dtype=F32)


def round_operand(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``round_operand``: an fp32 value rounded (RNE) to the matmul operand dtype, as fp32."""
    return x.to(dtype).to(F32)


def qk(q_i: torch.Tensor, k_j: torch.Tensor) -> torch.Tensor:
    """``qk``: ``S = Q_i @ K_j^T`` in fp32."""
    return q_i @ k_j.T


def softmax_p(s: torch.Tensor, scale2: torch.Tensor, lse2_i: torch.Tensor,
              visible: torch.Tensor) -> torch.Tensor:
    """``softmax_p``: ``exp2(S * scale_log2 - LSE2)`` with masked elements exactly zero."""
    p = torch.exp2(s * scale2 - lse2_i[:, None])
    return torch.where(visible, p, torch.zeros((), dtype=F32))


def ds(p: torch.Tensor, dp: torch.Tensor, d_i: torch.Tensor) -> torch.Tensor:
    """``ds``: ``dS = P * (dP - D_i)``."""
    return p * (dp - d_i[:, None])


def preprocess_d(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """``preprocess_d``: ``D = rowsum(dO * O)`` in fp32, shape ``(B, S_q, H)``."""
    return (do.to(F32) * o.to(F32)).sum(-1)


def preprocess_d_ordered(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """``preprocess_d`` in a fixed order: ``D = rowsum(dO * O)`` as an ascending pairwise tree.

    Level 0 holds the ``d`` fp32 products ``dO_c * O_c`` (``mul.f32`` of exact upcasts,
    RNE, subnormals kept) in ascending column ``c``. Each level replaces elements ``2m``
    and ``2m + 1`` by their fp32 RNE sum and carries an odd last element unchanged, until
    one value is left. For a power-of-two ``d`` a kernel gets the same bits by halving
    ``tl.reshape(x, [BM, d // 2, 2])`` with ``tl.sum(..., 2)`` ``log2(d)`` times: a sum of
    two elements is one commutative addition, so its order inside ``tl.sum`` is immaterial.
    Shape ``(B, S_q, H)``.
    """
    x = do.to(F32) * o.to(F32)
    while x.shape[-1] > 1:
        even = x.shape[-1] // 2 * 2
        summed = x[..., 0:even:2] + x[..., 1:even:2]
        x = torch.cat([summed, x[..., even:]], dim=-1)
    return x[..., 0]


def dq_add(acc: torch.Tensor, partial: torch.Tensor, flush_subnormals: bool = False
           ) -> torch.Tensor:
    """``dq_add``: one fp32 round-to-nearest-even addition.

    Subnormals are kept (a plain load-add-store), or with ``flush_subnormals`` flushed in
    the inputs and the result, as a global ``red.add.f32`` does.
    """
    if flush_subnormals:
        return fp32_add_rne(acc, partial, flush_subnormals=True)
    return acc + partial


def epilogue(acc: torch.Tensor, scale: float | None, dtype: torch.dtype) -> torch.Tensor:
    """``epilogue``: one fp32 multiply by ``scale`` (if any), then an RNE cast to ``dtype``."""
    if scale is not None:
        acc = acc * torch.tensor(scale, dtype=F32)
    return acc.to(dtype)


# ---------------------------------------------------------------------------------------
# problems and masks
# ---------------------------------------------------------------------------------------
def problem_of(q: torch.Tensor, k: torch.Tensor, causal: bool, block_m: int, block_n: int
               ) -> Problem:
    """The :class:`Problem` of ``(B, S, H, d)`` tensors ``q`` and ``k``."""
    b, s_q, h, d = q.shape
    return Problem(b, h, k.shape[2], s_q, k.shape[1], d, "causal" if causal else "full",
                   block_m, block_n)


def visible(p: Problem, rows: range, cols: range) -> torch.Tensor:
    """Boolean ``(len(rows), len(cols))``: which elements of a tile pair are unmasked."""
    r = torch.arange(rows.start, rows.stop)[:, None]
    c = torch.arange(cols.start, cols.stop)[None, :]
    if p.mask == "full":
        return torch.ones(len(rows), len(cols), dtype=torch.bool)
    return c <= r + p.causal_offset


def _check_inputs(p: Problem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"inputs must be bfloat16 or float16, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError("q, k and v must share one dtype")
    want_q = (p.batch, p.seqlen_q, p.heads, p.head_dim)
    want_kv = (p.batch, p.seqlen_k, p.heads_kv, p.head_dim)
    if tuple(q.shape) != want_q or tuple(k.shape) != want_kv or tuple(v.shape) != want_kv:
        raise ValueError(
            f"shapes q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} do not match the "
            f"problem: q{want_q}, k/v{want_kv} in (B, S, H, d) layout"
        )


# ---------------------------------------------------------------------------------------
# forward
# ---------------------------------------------------------------------------------------
@dataclass
class ForwardResult:
    o: torch.Tensor  # (B, S_q, H, d), input dtype
    lse2: torch.Tensor  # (B, S_q, H) fp32, base 2; -inf where a row sees no key


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
            softmax_scale: float | None = None, block_m: int = 64, block_n: int = 64
            ) -> ForwardResult:
    """Tile-level forward: an online softmax over KV tiles in ascending order.

    Per query tile: ``m = max(m, rowmax(S*scale_log2))``, ``alpha = exp2(m_old - m)``,
    ``P = exp2(S*scale_log2 - m)``, ``l = l*alpha + rowsum(P)``,
    ``acc = acc*alpha + P(bf16) @ V``; at the end ``O = rnd(acc / l)``,
    ``LSE2 = m + log2(l)``.
    """
    p = problem_of(q, k, causal, block_m, block_n)
    _check_inputs(p, q, k, v)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(p.head_dim)
    s2 = scale_log2(scale)
    o = torch.zeros(q.shape, dtype=F32)
    lse2 = torch.full(q.shape[:3], -math.inf, dtype=F32)
    qf, kf, vf = q.to(F32), k.to(F32), v.to(F32)
    for b in range(p.batch):
        for h in range(p.heads):
            hk = h // p.group
            for i in range(p.n_q):
                rows = p.rows(i)
                m = torch.full((len(rows),), -math.inf, dtype=F32)
                ell = torch.zeros(len(rows), dtype=F32)
                acc = torch.zeros(len(rows), p.head_dim, dtype=F32)
                for j in p.tile_cols[i]:
                    cols = p.cols(j)
                    s = qk(qf[b, rows.start:rows.stop, h], kf[b, cols.start:cols.stop, hk]) * s2
                    s = torch.where(visible(p, rows, cols), s, torch.tensor(-math.inf))
                    m_new = torch.maximum(m, s.max(dim=1).values)
                    safe = torch.where(torch.isinf(m_new), torch.zeros(()), m_new)
                    alpha = torch.exp2(m - safe)
                    pt = torch.exp2(s - safe[:, None])
                    ell = ell * alpha + pt.sum(1)
                    acc = acc * alpha[:, None] + round_operand(pt, q.dtype) @ vf[
                        b, cols.start:cols.stop, hk]
                    m = m_new
                seen = ell > 0
                o[b, rows.start:rows.stop, h] = torch.where(
                    seen[:, None], acc / torch.where(seen, ell, torch.ones(()))[:, None], 0.0)
                lse2[b, rows.start:rows.stop, h] = torch.where(seen, m + torch.log2(ell),
                                                               torch.tensor(-math.inf))
    return ForwardResult(o.to(q.dtype), lse2)


# ---------------------------------------------------------------------------------------
# backward
# ---------------------------------------------------------------------------------------
@dataclass
class BackwardResult:
    dq: torch.Tensor  # (B, S_q, H, d), input dtype
    dk: torch.Tensor  # (B, S_k, H_kv, d)
    dv: torch.Tensor
    dq_acc: torch.Tensor  # fp32 accumulators before the epilogue
    dk_acc: torch.Tensor  # fp32, per KV head after the GQA sum
    dv_acc: torch.Tensor
    partials: torch.Tensor | None  # (V, BM, d) fp32 in table order, rows past S_q are zero


def visit_index(schedule: Schedule) -> dict[tuple[int, int, int, int], int]:
    """``{(b, h, i, j): v}``: the row of each visit in the partials tensor (table order)."""
    index: dict[tuple[int, int, int, int], int] = {}
    for _, c in schedule.chains():
        for i in c.visits:
            index[(c.b, c.h, i, c.j)] = len(index)
    return index


def replay(schedule: Schedule, partials: torch.Tensor,
           arrival: dict[tuple[int, int, int], tuple[int, ...]] | None = None,
           flush_subnormals: bool = False) -> torch.Tensor:
    """Rebuild every ``dQacc`` from fp32 partials in the schedule's dQ order.

    ``partials`` is ``(V, BM, d)`` fp32 in :meth:`Schedule.to_tables` visit order (what the
    kernel writes in audit mode). Each tile starts from ``+0.0`` and adds its partials one
    fp32 RNE addition at a time. A non-deterministic schedule has no order to replay unless
    ``arrival`` gives one for every tile. ``flush_subnormals`` mirrors a kernel whose adds
    are ``red.add.f32`` (:func:`dq_add`). Returns ``(B, S_q, H, d)`` fp32.
    """
    p = schedule.problem
    if partials.dtype != F32 or partials.dim() != 3 or partials.shape[1] != p.block_m:
        raise ValueError(f"partials must be fp32 (V, {p.block_m}, d), got "
                         f"{tuple(partials.shape)} {partials.dtype}")
    index = visit_index(schedule)
    if partials.shape[0] != len(index):
        raise ValueError(f"partials has {partials.shape[0]} rows, the schedule has "
                         f"{len(index)} visits")
    acc = torch.zeros(p.batch, p.seqlen_q, p.heads, partials.shape[2], dtype=F32)
    for (b, h, i), order in schedule.dq_orders.items():
        if order is None:
            if arrival is None:
                raise ValueError(f"schedule {schedule.name!r} has no dQ order to replay; "
                                 "pass the arrival order")
            order = arrival[(b, h, i)]
        rows = p.rows(i)
        tile = torch.zeros(len(rows), partials.shape[2], dtype=F32)
        for j in order:
            tile = dq_add(tile, partials[index[(b, h, i, j)], : len(rows)], flush_subnormals)
        acc[b, rows.start:rows.stop, h] = tile
    return acc


def backward(schedule: Schedule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             o: torch.Tensor, lse2: torch.Tensor, do: torch.Tensor,
             softmax_scale: float | None = None, return_partials: bool = False,
             arrival_seed: int | None = None, arithmetic: str = "ieee") -> BackwardResult:
    """Emulate the backward exactly as ``schedule`` orders it.

    ``arithmetic`` is ``"ieee"`` (CPU fp32 products, correctly rounded ``exp2``) or
    ``"hopper"`` (the kernel's operations step for step: tensor-core MMAs, a fused
    multiply-add, :func:`~dash_ref.exp2.exp2_fma`, the ordered ``D``, flushing dQ adds;
    module docstring). For the ``atomic`` schedule (no fixed dQ order) the arrival order of
    every tile is drawn from ``arrival_seed`` (a stand-in for the run-to-run variation of
    atomics).
    """
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic={arithmetic!r}: expected one of {ARITHMETICS}")
    hopper = arithmetic == "hopper"
    p = schedule.problem
    _check_inputs(p, q, k, v)
    dtype = q.dtype
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(p.head_dim)
    s2 = scale_log2(scale)
    d_all = preprocess_d_ordered(o, do) if hopper else preprocess_d(o, do)
    index = visit_index(schedule)
    partials = torch.zeros(len(index), p.block_m, p.head_dim, dtype=F32)
    dk_head = torch.zeros(p.batch, p.seqlen_k, p.heads, p.head_dim, dtype=F32)
    dv_head = torch.zeros_like(dk_head)
    chain_grads = _chain_hopper if hopper else _chain_ieee
    for _, c in schedule.chains():
        cols = p.cols(c.j)
        dk, dv = chain_grads(p, c, q, k, v, do, lse2, d_all, s2, partials, index)
        dk_head[c.b, cols.start:cols.stop, c.h] = dk[: len(cols)]
        dv_head[c.b, cols.start:cols.stop, c.h] = dv[: len(cols)]
    arrival = None
    if not schedule.deterministic:
        gen = torch.Generator().manual_seed(arrival_seed or 0)
        arrival = {key: tuple(p.tile_cols[key[2]][t] for t in
                              torch.randperm(len(p.tile_cols[key[2]]), generator=gen).tolist())
                   for key in schedule.dq_orders}
    dq_acc = replay(schedule, partials, arrival, flush_subnormals=hopper)
    dk_acc, dv_acc = gqa_sum(p, dk_head), gqa_sum(p, dv_head)
    return BackwardResult(
        dq=epilogue(dq_acc, scale, dtype),
        dk=epilogue(dk_acc, scale, dtype),
        dv=epilogue(dv_acc, None, dtype),
        dq_acc=dq_acc,
        dk_acc=dk_acc,
        dv_acc=dv_acc,
        partials=partials if return_partials else None,
    )


# ---------------------------------------------------------------------------------------
# hopper arithmetic: the kernel's operations, step for step
# ---------------------------------------------------------------------------------------
def tc_dot(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None) -> torch.Tensor:
    """``tl.dot(a, b, c)`` on Hopper: :func:`~dash_ref.tensorcore.mma`, k16 steps ascending.

    ``a (M, K)`` and ``b (K, N)`` are bf16/fp16 operands, ``c`` fp32 (``None``: fresh).
    ``K`` is padded with zero columns of ``a`` and zero rows of ``b`` to a multiple of 16,
    which leaves every bit unchanged (zero products take no part in the model).
    """
    pad = -a.shape[1] % K_STEP
    if pad:
        a = torch.cat([a, a.new_zeros(a.shape[0], pad)], 1)
        b = torch.cat([b, b.new_zeros(pad, b.shape[1])], 0)
    return mma(a, b, c)


def softmax_p_fma(s_t: torch.Tensor, scale2: torch.Tensor, lse2_i: torch.Tensor,
                  visible_t: torch.Tensor) -> torch.Tensor:
    """``softmax_p`` as the kernel computes it, on ``S^T`` (keys are rows).

    ``P^T = exp2_fma(fma(S^T, scale_log2, 0 - LSE2))``: one fused multiply-add
    (``fma.rn.f32``), then :func:`~dash_ref.exp2.exp2_fma` (the kernel's ``exact``
    replacement for ``ex2.approx.ftz``); masked elements exactly ``0``. The negation is
    ``0 - LSE2`` (``sub.rn.f32``) because that is how Triton lowers a unary minus: it
    turns ``+0`` into ``+0``, not ``-0``.
    """
    p_t = exp2_fma(fma_f32(s_t, scale2, torch.zeros((), dtype=F32) - lse2_i[None, :]))
    return torch.where(visible_t, p_t, torch.zeros((), dtype=F32))


def _chain_ieee(p: Problem, c: Chain, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                do: torch.Tensor, lse2: torch.Tensor, d_all: torch.Tensor,
                s2: torch.Tensor, partials: torch.Tensor,
                index: dict[tuple[int, int, int, int], int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One chain in CPU fp32 arithmetic on its exact (unpadded) rows and keys.

    Writes each visit's partial into ``partials``; returns the fp32 ``dK_j`` (unscaled)
    and ``dV_j`` as ``(len(cols), d)``.
    """
    cols = p.cols(c.j)
    hk = c.h // p.group
    k_j = k[c.b, cols.start:cols.stop, hk].to(F32)
    v_j = v[c.b, cols.start:cols.stop, hk].to(F32)
    dk = torch.zeros(len(cols), p.head_dim, dtype=F32)
    dv = torch.zeros_like(dk)
    for i in c.visits:
        rows = p.rows(i)
        sl = slice(rows.start, rows.stop)
        q_i, do_i = q[c.b, sl, c.h].to(F32), do[c.b, sl, c.h].to(F32)
        pt = softmax_p(qk(q_i, k_j), s2, lse2[c.b, sl, c.h], visible(p, rows, cols))
        dv = dv + round_operand(pt, q.dtype).T @ do_i  # dv_step
        dp = do_i @ v_j.T  # dp
        ds_op = round_operand(ds(pt, dp, d_all[c.b, sl, c.h]), q.dtype)
        dk = dk + ds_op.T @ q_i  # dk_step
        partials[index[(c.b, c.h, i, c.j)], : len(rows)] = ds_op @ k_j  # dq_partial
    return dk, dv


def _pad_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``n`` rows (the kernel's masked loads read 0)."""
    if x.shape[0] == n:
        return x
    return torch.cat([x, x.new_zeros(n - x.shape[0], *x.shape[1:])])


def _chain_hopper(p: Problem, c: Chain, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  do: torch.Tensor, lse2: torch.Tensor, d_all: torch.Tensor,
                  s2: torch.Tensor, partials: torch.Tensor,
                  index: dict[tuple[int, int, int, int], int]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One chain in the kernel's operand orientations and padded ``BM x BN`` tiles.

    Writes each visit's ``(BM, d)`` partial into ``partials``; returns the fp32 ``dK_j``
    (unscaled) and ``dV_j`` as ``(BN, d)`` (rows past ``S_k`` are zero).
    """
    bm, bn, dtype = p.block_m, p.block_n, q.dtype
    cols = p.cols(c.j)
    hk = c.h // p.group
    k_j = _pad_rows(k[c.b, cols.start:cols.stop, hk], bn)
    v_j = _pad_rows(v[c.b, cols.start:cols.stop, hk], bn)
    dk = torch.zeros(bn, p.head_dim, dtype=F32)
    dv = torch.zeros_like(dk)
    all_cols = range(c.j * bn, (c.j + 1) * bn)
    for i in c.visits:
        rows = p.rows(i)
        sl = slice(rows.start, rows.stop)
        q_i = _pad_rows(q[c.b, sl, c.h], bm)
        do_i = _pad_rows(do[c.b, sl, c.h], bm)
        lse_i = _pad_rows(lse2[c.b, sl, c.h], bm)  # the kernel loads 0 past S_q
        d_i = _pad_rows(d_all[c.b, sl, c.h], bm)
        all_rows = range(i * bm, (i + 1) * bm)
        vis_t = (visible(p, all_rows, all_cols)
                 & (torch.tensor(all_rows)[:, None] < p.seqlen_q)
                 & (torch.tensor(all_cols)[None, :] < p.seqlen_k)).T
        s_t = tc_dot(k_j, q_i.T)  # qk: S^T = K_j Q_i^T, k = d, fresh
        p_t = softmax_p_fma(s_t, s2, lse_i, vis_t)
        p_op = p_t.to(dtype)  # round_operand
        dv = tc_dot(p_op, do_i, dv)  # dv_step inside the MMA: k = BM
        dp_t = tc_dot(v_j, do_i.T)  # dp: dP^T = V_j dO_i^T, k = d, fresh
        ds_op = ds(p_t.T, dp_t.T, d_i).T.to(dtype)  # ds: sub.f32 then mul.f32
        dk = tc_dot(ds_op, q_i, dk)  # dk_step inside the MMA: k = BM
        partials[index[(c.b, c.h, i, c.j)]] = tc_dot(ds_op.T, k_j)  # dq_partial: k = BN
    return dk, dv


def gqa_sum(p: Problem, per_head: torch.Tensor) -> torch.Tensor:
    """``gqa_sum``: per-query-head fp32 dK (or dV) summed per KV head, ``h`` ascending.

    With one query head per KV head the accumulator is used as is; otherwise the sum starts
    from ``+0.0``, one fp32 RNE addition per query head.
    """
    if p.group == 1:
        return per_head.clone()
    b, s, _, d = per_head.shape
    out = torch.zeros(b, s, p.heads_kv, d, dtype=F32)
    for h in range(p.heads):
        out[:, :, h // p.group] = dq_add(out[:, :, h // p.group], per_head[:, :, h])
    return out


def emulate(schedule: Schedule, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            do: torch.Tensor, softmax_scale: float | None = None,
            return_partials: bool = False, arrival_seed: int | None = None,
            arithmetic: str = "ieee") -> tuple[ForwardResult, BackwardResult]:
    """Forward, then the backward under ``schedule``, for one problem.

    The forward is always the tile-level IEEE forward; ``arithmetic`` selects the
    backward's arithmetic (:func:`backward`).
    """
    p = schedule.problem
    fwd = forward(q, k, v, p.mask == "causal", softmax_scale, p.block_m, p.block_n)
    bwd = backward(schedule, q, k, v, fwd.o, fwd.lse2, do, softmax_scale, return_partials,
                   arrival_seed, arithmetic)
    return fwd, bwd
