"""The forward kernel: FlashAttention's online softmax in base 2, one program per Q tile.

Program ``(m, b * H + h)`` owns query rows ``m * BM : (m + 1) * BM`` of head ``(b, h)`` and
streams the KV tiles its rows can see in ascending order:

* for a sliding window, first the tiles left of the dense interior that some rows see
  only in part (the window's left edge; below them no row sees a key, so they are skipped),
* the tiles every row of the tile sees in full (no mask arithmetic at all),
* then the rest: the last partial KV tile and, for causal masks and windows, the diagonal
  band (past it, up to the window's right edge).

Which keys a row sees is :mod:`.mask`'s rule (the kind ``MASK`` is a compile-time constant),
also for the tile ranges.

Scores are kept in base-2 units, ``s2 = S * scale_log2`` with ``scale_log2 =
softmax_scale * log2(e)``, so every exponential is one ``ex2.approx``. The outputs are
``O`` (input dtype) and ``LSE2 = log2(sum_k 2^s2)`` (fp32, base 2), the value the backward
subtracts. A row that sees no key (causal with ``S_q > S_k``, a window past the keys) gets
``O = 0`` and ``LSE2 = -inf``, as :mod:`dash_ref.emulate` defines it; the backward masks
those rows' probabilities to exactly 0, so they produce zero gradients and never NaN.

``VARLEN`` (a compile-time switch): a packed batch, FlashAttention's varlen layout. Program
``(m, b * H + h)`` then owns rows ``m * BM : (m + 1) * BM`` of sequence ``b``, whose first
row and length it reads from the int32 offsets ``CU_SEQLENS_Q`` (and ``CU_SEQLENS_K`` for
its keys); a program past its sequence's end returns at once (the grid covers the longest
sequence). Everything else is the rectangular kernel on the sequence's rows, with the
sequence's own ``S_q``, ``S_k`` and causal offset ``S_k - S_q``: the batch strides are 0,
the row statistics a ``(total_q, H)`` view of an ``(H, total_q)`` buffer. Without it the
offsets are None (Triton drops them) and the kernel is the rectangular one.

Optional score features, each None unless asked for (Triton then drops it, and the kernel
compiles as it did before the feature existed): ``SOFTCAP`` (FlashAttention's logit
softcap, :mod:`.softcap`: the raw products are scaled by ``SOFTMAX_SCALE`` and capped, then
``scale_log2`` is ``fp32(log2 e)``) and ``SINK2`` (learnable sinks, one base-2 logit per
query head, fp32 ``(H,)``: folded after the last KV tile, so ``LSE2`` includes them and a
row that sees no key gets ``O = 0``, ``LSE2 = sink2``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dash_cuda.tile_io import load_tile, padded, sequence_rows, store_tile

from .mask import key_range, visible
from .softcap import softcap_scores


@triton.jit
def _softmax_step(acc, m, l, q, k, v, rows, cols, S_K, CAUSAL_OFFSET, WINDOW_LEFT,
                  WINDOW_RIGHT, scale_log2, SOFTCAP, SOFTMAX_SCALE, MASKED: tl.constexpr,
                  MASK: tl.constexpr):
    """Fold one KV tile into the running max ``m``, sum ``l`` and output ``acc``."""
    s = tl.dot(q, tl.trans(k))
    if SOFTCAP is not None:  # capped before the mask: masked elements stay -inf
        s, _ = softcap_scores(s, SOFTMAX_SCALE, SOFTCAP)
    s2 = s * scale_log2
    if MASKED:  # rows past S_q are never stored: no row bound
        seen = visible(rows[:, None], cols[None, :], None, S_K, CAUSAL_OFFSET, WINDOW_LEFT,
                       WINDOW_RIGHT, MASK)
        s2 = tl.where(seen, s2, float("-inf"))
    m_new = tl.maximum(m, tl.max(s2, 1))
    # a row that has seen no key yet keeps m = -inf; subtract 0 instead of -inf - -inf
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s2 - m_safe[:, None])
    alpha = tl.math.exp2(m - m_safe)
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l


@triton.jit
def _fold_sink(acc, m, l, sink2):
    """[fwd_sink] After the last KV tile: a learnable sink, logit ``sink2`` in base 2, as one
    more column of every row, with no value (:func:`dash_ref.arithmetic.steps.fwd_sink`).

    A row that saw no key (``m = -inf``) gets ``m = sink2``, ``l = 1``, ``acc = 0``: ``O =
    0`` and ``LSE2 = sink2``; a sink above the row's maximum rescales the row (``alpha <
    1``) instead of overflowing its sum.
    """
    m_new = tl.maximum(m, sink2)
    alpha = tl.math.exp2(m - m_new)
    l = l * alpha + tl.math.exp2(sink2 - m_new)
    return acc * alpha[:, None], m_new, l


# the window's extents too: one compiled kernel serves every window size
@triton.jit(do_not_specialize=["H", "GROUP", "S_Q", "S_K", "CAUSAL_OFFSET", "stride_lb",
                               "stride_lh", "WINDOW_LEFT", "WINDOW_RIGHT"])
def dash_fwd_kernel(
    Q, K, V, O, LSE2,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_ls, stride_lh,
    H, GROUP, S_Q, S_K, CAUSAL_OFFSET, scale_log2,
    BM: tl.constexpr, BN: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    MASK: tl.constexpr, CU_SEQLENS_Q=None, CU_SEQLENS_K=None, VARLEN: tl.constexpr = False,
    WINDOW_LEFT=None, WINDOW_RIGHT=None, SOFTCAP=None, SOFTMAX_SCALE=None, SINK2=None,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    if VARLEN:  # sequence b's own rows and lengths
        q_first, seqlen_q = sequence_rows(CU_SEQLENS_Q, b)
        if pid_m * BM >= seqlen_q:
            return
        k_first, seqlen_k = sequence_rows(CU_SEQLENS_K, b)
        causal_offset = seqlen_k - seqlen_q
        Q += q_first * stride_qs
        O += q_first * stride_os
        LSE2 += q_first * stride_ls
        K += k_first * stride_ks
        V += k_first * stride_vs
    else:
        seqlen_q, seqlen_k, causal_offset = S_Q, S_K, CAUSAL_OFFSET
    h_kv = h // GROUP
    rows = pid_m * BM + tl.arange(0, BM)
    q = load_tile(Q + b * stride_qb + h * stride_qh, rows, seqlen_q, stride_qs, HEAD_DIM)
    k_base = K + b * stride_kb + h_kv * stride_kh
    v_base = V + b * stride_vb + h_kv * stride_vh

    m = tl.full([BM], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, padded(HEAD_DIM_V)], dtype=tl.float32)

    # keys [lo, hi) hold every key some row of the tile sees; keys [dense_lo, dense_hi)
    # are whole tiles all of its rows see (lo = dense_lo = 0 but for windows), walked in
    # ascending order
    lo, dense_lo, dense_hi, hi = key_range(pid_m, seqlen_k, causal_offset, WINDOW_LEFT,
                                           WINDOW_RIGHT, BM, BN, MASK)
    for start in range(lo, dense_lo, BN):  # a window's left edge (no tile otherwise)
        cols = start + tl.arange(0, BN)
        k = load_tile(k_base, cols, seqlen_k, stride_ks, HEAD_DIM)
        v = load_tile(v_base, cols, seqlen_k, stride_vs, HEAD_DIM_V)
        acc, m, l = _softmax_step(acc, m, l, q, k, v, rows, cols, seqlen_k, causal_offset,
                                  WINDOW_LEFT, WINDOW_RIGHT, scale_log2, SOFTCAP, SOFTMAX_SCALE,
                                  True, MASK)
    for start in range(dense_lo, dense_hi, BN):
        cols = start + tl.arange(0, BN)
        k = load_tile(k_base, cols, seqlen_k, stride_ks, HEAD_DIM)
        v = load_tile(v_base, cols, seqlen_k, stride_vs, HEAD_DIM_V)
        acc, m, l = _softmax_step(acc, m, l, q, k, v, rows, cols, seqlen_k, causal_offset,
                                  WINDOW_LEFT, WINDOW_RIGHT, scale_log2, SOFTCAP, SOFTMAX_SCALE,
                                  False, MASK)
    for start in range(dense_hi, hi, BN):
        cols = start + tl.arange(0, BN)
        k = load_tile(k_base, cols, seqlen_k, stride_ks, HEAD_DIM)
        v = load_tile(v_base, cols, seqlen_k, stride_vs, HEAD_DIM_V)
        acc, m, l = _softmax_step(acc, m, l, q, k, v, rows, cols, seqlen_k, causal_offset,
                                  WINDOW_LEFT, WINDOW_RIGHT, scale_log2, SOFTCAP, SOFTMAX_SCALE,
                                  True, MASK)
    if SINK2 is not None:  # one logit per query head
        acc, m, l = _fold_sink(acc, m, l, tl.load(SINK2 + h))

    seen = l > 0.0
    o = acc / tl.where(seen, l, 1.0)[:, None]
    o = tl.where(seen[:, None], o, 0.0)
    lse2 = tl.where(seen, m + tl.math.log2(l), float("-inf"))
    store_tile(O + b * stride_ob + h * stride_oh, rows, seqlen_q, stride_os,
                o.to(O.dtype.element_ty), HEAD_DIM_V)
    tl.store(LSE2 + b * stride_lb + h * stride_lh + rows * stride_ls, lse2,
             mask=rows < seqlen_q)
