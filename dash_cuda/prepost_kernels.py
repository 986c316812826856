"""The small kernels around the persistent backward: D before it, rounding after it.

* :func:`dash_delta_kernel` -- ``D = rowsum(dO * O)`` in fp32, one value per query row;
  with ``EXACT`` in the pinned pairwise order of
  :func:`dash_ref.emulate.preprocess_d_ordered` (:func:`_rowsum_pairwise`).
* :func:`dash_dq_kernel` -- ``dQ = rnd(dQacc * scale)``: one fp32 multiply, one RNE cast.
* :func:`dash_gqa_kernel` -- dK/dV of a KV head from the per-query-head fp32 accumulators,
  summed in ascending query head from ``+0.0`` (when a KV head has several query heads),
  then ``dK = rnd(sum * scale)``, ``dV = rnd(sum)``.

Every program writes every element it owns, so outputs need no clearing beforehand.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .bwd_kernel import _load_tile, _store_tile


@triton.jit
def _halve(x):
    """One level of the pairwise tree: column ``m`` of the result is ``x[:, 2m] + x[:, 2m+1]``."""
    a, b = tl.split(tl.reshape(x, [x.shape[0], x.shape[1] // 2, 2]))
    return a + b


@triton.jit
def _rowsum_pairwise(x):
    """Row sums of an ``(M, 2**k)`` fp32 tile (``k <= 7``), as ``preprocess_d_ordered``.

    ``tl.sum``'s order (per-thread adds, then a shuffle tree) is Triton's to choose; this
    one is written down. Each level adds neighbouring columns, one fp32 RNE add each (the
    kernel is built with ``enable_fp_fusion=False``, so the products are not fused into
    the first level's adds).
    """
    for _ in tl.static_range(7):  # enough levels for the widest head dim, 128
        if x.shape[1] > 1:
            x = _halve(x)
    return tl.reshape(x, [x.shape[0]])


@triton.jit(do_not_specialize=["H", "S_Q", "stride_lb", "stride_lh"])
def dash_delta_kernel(
    O, DO, DELTA,
    stride_ob, stride_os, stride_oh,
    stride_dob, stride_dos, stride_doh,
    stride_lb, stride_ls, stride_lh,
    H, S_Q,
    BM: tl.constexpr, HEAD_DIM: tl.constexpr, EXACT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = pid_m * BM + tl.arange(0, BM)
    o = _load_tile(O + b * stride_ob + h * stride_oh, rows, S_Q, stride_os, HEAD_DIM)
    do = _load_tile(DO + b * stride_dob + h * stride_doh, rows, S_Q, stride_dos, HEAD_DIM)
    prod = o.to(tl.float32) * do.to(tl.float32)
    delta = _rowsum_pairwise(prod) if EXACT else tl.sum(prod, axis=1)
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
    acc = _load_tile(DQ_ACC + (b * S_Q * H + h) * HEAD_DIM, rows, S_Q, H * HEAD_DIM, HEAD_DIM)
    dq = (acc * softmax_scale).to(DQ.dtype.element_ty)  # one fp32 multiply, one RNE cast
    _store_tile(DQ + b * stride_dqb + h * stride_dqh, rows, S_Q, stride_dqs, dq, HEAD_DIM)


@triton.jit(do_not_specialize=["H_KV", "S_K"])
def dash_gqa_kernel(
    DK_HEADS, DV_HEADS, DK, DV,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    H_KV, S_K, softmax_scale,
    GROUP: tl.constexpr, BN: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H_KV).to(tl.int64)
    h_kv = (bh % H_KV).to(tl.int64)
    rows = pid_n * BN + tl.arange(0, BN)
    # per-head scratch is contiguous (B, S_k, H, d) with H = H_KV * GROUP
    row_stride = H_KV * GROUP * HEAD_DIM
    first = (b * S_K * H_KV * GROUP + h_kv * GROUP) * HEAD_DIM
    if GROUP == 1:
        # one query head: its accumulator is the sum (no +0.0 added)
        dk = _load_tile(DK_HEADS + first, rows, S_K, row_stride, HEAD_DIM)
        dv = _load_tile(DV_HEADS + first, rows, S_K, row_stride, HEAD_DIM)
    else:
        dk = tl.zeros([BN, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BN, HEAD_DIM], dtype=tl.float32)
        for g in range(GROUP):  # ascending query head, from +0.0
            dk += _load_tile(DK_HEADS + first + g * HEAD_DIM, rows, S_K, row_stride, HEAD_DIM)
            dv += _load_tile(DV_HEADS + first + g * HEAD_DIM, rows, S_K, row_stride, HEAD_DIM)
    _store_tile(DK + b * stride_dkb + h_kv * stride_dkh, rows, S_K, stride_dks,
                (dk * softmax_scale).to(DK.dtype.element_ty), HEAD_DIM)
    _store_tile(DV + b * stride_dvb + h_kv * stride_dvh, rows, S_K, stride_dvs,
                dv.to(DV.dtype.element_ty), HEAD_DIM)
