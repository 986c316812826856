"""The small kernels around every backend's backward: D before it, rounding after it.

Shared by all backends (written in Triton: row-wise work where warp specialization buys
nothing), each with its launcher:

* :func:`preprocess_delta` (:func:`dash_delta_kernel`) -- step ``delta``,
  ``D = rowsum(dO * O)`` in fp32, one value per query row; with ``PAIRWISE`` as the
  pairwise tree of :func:`dash_ref.arithmetic.steps.delta` (:func:`_rowsum_pairwise`: the
  ``exact`` arithmetic and the CuTe backend's default), else by ``tl.sum``.
* :func:`finish_dq` (:func:`dash_dq_kernel`) -- step ``epilogue``,
  ``dQ = rnd(dQacc * scale)``: one fp32 multiply, one RNE cast, from a row-major
  accumulator (the CuTe backward keeps its own as staged tiles and rounds them with
  :func:`dash_cuda.backends.cute.finish_dq.finish_dq_tiles`).
* :func:`finish_dk_dv` (:func:`dash_gqa_kernel`) -- steps ``gqa_sum`` and ``epilogue``:
  dK/dV of a KV head from the per-query-head fp32 accumulators, summed in ascending query
  head from ``+0.0`` (when a KV head has several query heads), then ``dK = rnd(sum *
  scale)``, ``dV = rnd(sum)``.
* :func:`sink_grad` (:func:`dash_sink_grad_kernel`) -- step ``sink_grad`` of learnable
  sinks, ``dsink_h = -sum_r exp2(s2_h - LSE2_r) D_r`` over every query row of head ``h``,
  in an order and arithmetic fixed by the kernel alone (its docstring), so the same on
  every run and GPU, and the same for every backend and arithmetic: those of
  :func:`dash_ref.arithmetic.steps.sink_grad`'s ``"lanes"`` order.

Every program writes every element it owns, so outputs need no clearing beforehand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dash_cuda.backends import new_row_stats
from dash_cuda.exp2 import exp2_fma
from dash_cuda.tile_io import load_tile, padded, store_tile
from dash_cuda.triton_launch import launch
from dash_ref.arithmetic.steps import SINK_LANES, sink_logit

#: fp32 elements a program of :func:`dash_delta_kernel` zeroes per store of the workspace
CLEAR_BLOCK = 1024


@triton.jit
def _halve(x):
    """One level of the pairwise tree: column ``m`` of the result is ``x[:, 2m] + x[:, 2m+1]``."""
    a, b = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
    return a + b


@triton.jit
def _rowsum_pairwise(x):
    """Row sums of an ``(M, 2**k)`` fp32 tile (``k <= 10``) as the pairwise tree of ``delta``
    (a head dim that is not a power of two comes zero-padded, as that tree pads it).

    ``tl.sum``'s order (per-thread adds, then a shuffle tree) is Triton's to choose; this
    one is written down. Each level adds neighbouring columns, one fp32 RNE add each (the
    kernel is built with ``enable_fp_fusion=False``, so the products are not fused into
    the first level's adds).
    """
    # enough levels for the widest head dim, 256, and the sink gradient's 1024 lanes
    for _ in tl.static_range(10):
        if x.shape[1] > 1:
            x = _halve(x)
    return tl.reshape(x, [x.shape[0]])


@triton.jit
def _clear_chunk(WORKSPACE, numel, chunk, program, CLEAR_BLOCK: tl.constexpr):
    """Zero elements ``[program * chunk, (program + 1) * chunk)`` of a flat fp32 buffer of
    ``numel`` elements (``chunk`` a multiple of ``CLEAR_BLOCK``)."""
    first = program.to(tl.int64) * chunk
    for start in range(0, chunk, CLEAR_BLOCK):
        at = first + start + tl.arange(0, CLEAR_BLOCK)
        tl.store(WORKSPACE + at, tl.zeros([CLEAR_BLOCK], dtype=tl.float32), mask=at < numel)


@triton.jit(do_not_specialize=["H", "S_Q", "stride_lb", "stride_lh", "CLEAR_NUMEL",
                               "CLEAR_CHUNK"])
def dash_delta_kernel(
    O, DO, DELTA,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_lb, stride_ls, stride_lh,
    H, S_Q, CLEAR, CLEAR_NUMEL, CLEAR_CHUNK,
    BM: tl.constexpr, HEAD_DIM: tl.constexpr, PAIRWISE: tl.constexpr,
    CLEAR_BLOCK: tl.constexpr = 1024,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    if CLEAR is not None:  # the backward's zeroed workspace, a chunk per program
        _clear_chunk(CLEAR, CLEAR_NUMEL, CLEAR_CHUNK, bh * tl.num_programs(0) + pid_m,
                     CLEAR_BLOCK)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = pid_m * BM + tl.arange(0, BM)
    o = load_tile(O + b * stride_ob + h * stride_oh, rows, S_Q, stride_os, HEAD_DIM)
    do = load_tile(DO + b * stride_dob + h * stride_doh, rows, S_Q, stride_dos, HEAD_DIM)
    prod = o.to(tl.float32) * do.to(tl.float32)
    delta = _rowsum_pairwise(prod) if PAIRWISE else tl.sum(prod, axis=1)
    tl.store(DELTA + b * stride_lb + h * stride_lh + rows * stride_ls, delta, mask=rows < S_Q)


@triton.jit(do_not_specialize=["H", "S_Q"])
def dash_dq_kernel(
    DQ_ACC, DQ,
    stride_dqb, stride_dqs, stride_dqh,
    H, S_Q, softmax_scale,
    BM: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = pid_m * BM + tl.arange(0, BM)
    # dQacc is contiguous (B, S_q, H, d)
    acc = load_tile(DQ_ACC + (b * S_Q * H + h) * HEAD_DIM, rows, S_Q, H * HEAD_DIM, HEAD_DIM)
    dq = (acc * softmax_scale).to(DQ.dtype.element_ty)  # one fp32 multiply, one RNE cast
    store_tile(DQ + b * stride_dqb + h * stride_dqh, rows, S_Q, stride_dqs, dq, HEAD_DIM)


@triton.jit
def _head_sum(HEADS, b, h_kv, rows, H_KV, S_K, GROUP: tl.constexpr, BN: tl.constexpr,
              HEAD_DIM: tl.constexpr):
    """[gqa_sum] The fp32 sum over a KV head's ``GROUP`` query heads of rows ``rows`` of a
    contiguous per-query-head ``(B, S_k, H, HEAD_DIM)`` scratch, in ascending query head."""
    row_stride = H_KV * GROUP * HEAD_DIM
    first = (b * S_K * H_KV * GROUP + h_kv * GROUP) * HEAD_DIM
    if GROUP == 1:  # one query head: its accumulator is the sum (no +0.0 added)
        return load_tile(HEADS + first, rows, S_K, row_stride, HEAD_DIM)
    acc = tl.zeros([BN, padded(HEAD_DIM)], dtype=tl.float32)
    for g in range(GROUP):  # ascending query head, from +0.0
        acc += load_tile(HEADS + first + g * HEAD_DIM, rows, S_K, row_stride, HEAD_DIM)
    return acc


@triton.jit(do_not_specialize=["H_KV", "S_K"])
def dash_gqa_kernel(
    DK_HEADS, DV_HEADS, DK, DV,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    H_KV, S_K, softmax_scale,
    GROUP: tl.constexpr, BN: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H_KV).to(tl.int64)
    h_kv = (bh % H_KV).to(tl.int64)
    rows = pid_n * BN + tl.arange(0, BN)
    dk = _head_sum(DK_HEADS, b, h_kv, rows, H_KV, S_K, GROUP, BN, HEAD_DIM)
    dv = _head_sum(DV_HEADS, b, h_kv, rows, H_KV, S_K, GROUP, BN, HEAD_DIM_V)
    store_tile(DK + b * stride_dkb + h_kv * stride_dkh, rows, S_K, stride_dks,
               (dk * softmax_scale).to(DK.dtype.element_ty), HEAD_DIM)
    store_tile(DV + b * stride_dvb + h_kv * stride_dvh, rows, S_K, stride_dvs,
               dv.to(DV.dtype.element_ty), HEAD_DIM_V)


@triton.jit(do_not_specialize=["B", "S_Q", "stride_lb", "stride_ls", "stride_lh"])
def dash_sink_grad_kernel(LSE2, DELTA, SINK2, DSINK, B, S_Q, stride_lb, stride_ls, stride_lh,
                          BLOCK: tl.constexpr):
    """[sink_grad] One program per query head: ``DSINK[h] = -sum_r P_sink,r D_r``.

    Deterministic by construction, with no atomics and nothing that depends on the grid or
    the device, and written down to the last add (built with fp fusion off), so one order
    and arithmetic serve every backend: lane ``t`` of a ``BLOCK``-wide fp32 vector adds the
    terms of rows ``t, t + BLOCK, ...`` in batch-then-row order, and the lanes are then
    joined by the pairwise tree of :func:`_rowsum_pairwise` (``tl.sum``'s tree would be
    Triton's to choose). ``P_sink = exp2_fma(s2 - LSE2)``, at most about 1 (``LSE2``
    includes the sink), so it neither overflows nor needs a guard; lanes past ``S_Q`` add
    0. This is :func:`dash_ref.arithmetic.steps.sink_grad`'s ``"lanes"`` order.
    """
    h = tl.program_id(0)
    sink2 = tl.load(SINK2 + h)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for b in range(B):
        base = tl.cast(b, tl.int64) * stride_lb + h * stride_lh
        for start in range(0, S_Q, BLOCK):
            rows = start + offs
            inside = rows < S_Q
            lse2 = tl.load(LSE2 + base + rows * stride_ls, mask=inside, other=0.0)
            delta = tl.load(DELTA + base + rows * stride_ls, mask=inside, other=0.0)
            acc += tl.where(inside, exp2_fma(sink2 - lse2) * delta, 0.0)
    total = _rowsum_pairwise(tl.reshape(acc, [1, BLOCK]))  # one row of BLOCK lanes
    tl.store(DSINK + h + tl.arange(0, 1), -total)


# -- launchers --------------------------------------------------------------------------------
def preprocess_delta(o: torch.Tensor, do: torch.Tensor, block_m: int, pairwise: bool = False,
                     clear: torch.Tensor | None = None) -> torch.Tensor:
    """``D = rowsum(dO * O)`` in fp32, a ``(B, S_q, H)`` view of a ``(B, H, S_q)`` buffer.

    Laid out like the ``LSE2`` the backward reads with the same strides; with ``pairwise``
    in the pairwise order of :func:`dash_ref.arithmetic.steps.delta` (the ``exact`` and
    ``fast`` arithmetics), else by ``tl.sum`` (an order of its own, contractions allowed).
    ``clear``: a contiguous fp32 buffer the same launch fills with zeros (the backward's
    accumulator and semaphores: one launch where a memset would add another, and no host
    work per buffer).
    """
    batch, seqlen_q, heads, _ = o.shape
    delta = new_row_stats(batch, seqlen_q, heads, o.device)
    kernel, grid, args, named, options = delta_launch(o, do, delta, block_m, pairwise, clear)
    launch(kernel, grid, args, named, **options)
    return delta


def delta_launch(o: torch.Tensor, do: torch.Tensor, delta: torch.Tensor, block_m: int,
                 pairwise: bool, clear: torch.Tensor | None) -> tuple:
    """``(kernel, grid, args, named, options)`` of :func:`preprocess_delta`'s launch into
    ``delta`` (a :func:`new_row_stats` view): the one place its arguments are written."""
    batch, seqlen_q, heads, head_dim = o.shape
    grid = (triton.cdiv(seqlen_q, block_m), batch * heads)
    numel = 0 if clear is None else clear.numel()
    chunk = triton.cdiv(triton.cdiv(numel, grid[0] * grid[1]), CLEAR_BLOCK) * CLEAR_BLOCK
    return dash_delta_kernel, grid, (
        o, do, delta,
        o.stride(0), o.stride(1), o.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        delta.stride(0), delta.stride(1), delta.stride(2),
        heads, seqlen_q, clear, numel, chunk), dict(
        BM=block_m, HEAD_DIM=head_dim, PAIRWISE=pairwise, CLEAR_BLOCK=CLEAR_BLOCK), dict(
        enable_fp_fusion=not pairwise)


def finish_dq(dq_acc: torch.Tensor, dq: torch.Tensor, softmax_scale: float, block_m: int
              ) -> None:
    """``dQ = rnd(dQacc * scale)`` from a contiguous fp32 ``(B, S_q, H, d)`` accumulator."""
    batch, seqlen_q, heads, head_dim = dq.shape
    launch(dash_dq_kernel, (triton.cdiv(seqlen_q, block_m), batch * heads), (
        dq_acc, dq, dq.stride(0), dq.stride(1), dq.stride(2),
        heads, seqlen_q, softmax_scale), dict(BM=block_m, HEAD_DIM=head_dim))


def finish_dk_dv(dk_heads: torch.Tensor, dv_heads: torch.Tensor, dk: torch.Tensor,
                 dv: torch.Tensor, softmax_scale: float) -> None:
    """dK, dV from per-query-head fp32 ``(B, S_k, H, d)`` and ``(B, S_k, H, d_v)``
    accumulators (GQA sum, rounding)."""
    kernel, grid, args, named, options = gqa_launch(dk_heads, dv_heads, dk, dv, softmax_scale)
    launch(kernel, grid, args, named, **options)


def gqa_launch(dk_heads: torch.Tensor, dv_heads: torch.Tensor, dk: torch.Tensor,
               dv: torch.Tensor, softmax_scale: float) -> tuple:
    """``(kernel, grid, args, named, options)`` of :func:`finish_dk_dv`'s launch."""
    batch, seqlen_k, heads_kv, head_dim = dk.shape
    head_dim_v = dv.shape[-1]
    # 64 rows, 4 warps: with 4 query heads per KV head at 16k tokens this pass takes 84 us
    # at d = 64 and 128 on an H200, where 8 warps took 112 us at d = 64 (docs/performance.md)
    return dash_gqa_kernel, (triton.cdiv(seqlen_k, 64), batch * heads_kv), (
        dk_heads, dv_heads, dk, dv,
        dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        heads_kv, seqlen_k, softmax_scale), dict(
        GROUP=dk_heads.shape[2] // heads_kv, BN=64, HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v), dict(num_warps=4)


def sink_grad(lse2: torch.Tensor, delta: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """``dsink`` ``(H,)``, of ``sink``'s dtype, of learnable sinks ``sink`` from the forward's
    ``LSE2`` and ``D``, fp32 ``(B, S_q, H)`` views with one set of strides; the kernel
    reads the sinks in base 2 (:func:`dash_ref.arithmetic.steps.sink_logit`) and sums in
    fp32 in the fixed order of :func:`dash_sink_grad_kernel`, the one ``dash_ref``'s
    ``sink_grad`` reproduces in every kernel arithmetic."""
    batch, seqlen_q, heads = lse2.shape
    if lse2.stride() != delta.stride():
        raise ValueError("sink_grad reads LSE2 and D with one set of strides")
    dsink = torch.empty(heads, device=lse2.device, dtype=torch.float32)
    launch(dash_sink_grad_kernel, (heads,), (lse2, delta, sink_logit(sink).contiguous(), dsink,
                                             batch, seqlen_q, *lse2.stride()),
           dict(BLOCK=SINK_LANES), num_warps=4, enable_fp_fusion=False)
    return dsink.to(sink.dtype)
