"""The persistent backward kernel: one program per worker, running the chains of its table.

A program ``w`` reads ``worker_offsets[w] : worker_offsets[w + 1]``, the chains it runs, in
order. For chain ``c = (b, h, j)`` it loads ``K_j`` and ``V_j`` once, clears its fp32
``dK_j``, ``dV_j`` accumulators, and visits the Q tiles ``visit_q[chain_offsets[c] :
chain_offsets[c + 1]]`` in that order. Each visit computes the fp32 partial
``dQ_ij = dS_ij @ K_j`` and adds it into ``dQacc_i``:

* deterministic schedules: wait until the semaphore of tile ``(b, h, i)`` equals the
  visit's rank (``visit_rank``), add the partial with ``red.global.add.f32`` (performed at
  the L2 cache, no load round trip), release the semaphore with ``rank + 1``. The sums
  therefore happen in the schedule's dQ order, one fp32 round-to-nearest-even add at a time
  (subnormal inputs and results flushed, as the audit record says).
* ``atomic``: the same reductions without the semaphore, in arrival order
  (non-deterministic); the peer that measures what determinism costs.

Which elements of a score tile a visit keeps is :mod:`.mask`'s rule (the mask's kind
``MASK`` is a compile-time constant; a window's extents ``WINDOW_LEFT``, ``WINDOW_RIGHT``
are runtime integers, None for the other kinds); the tiles a chain visits are the
schedule's, derived on the CPU from the same rule (:class:`dash_ref.Mask`), so a window's
tile pairs that no row sees are never visited.

Every floating-point step is marked ``[name]``: the step of
:mod:`dash_ref.arithmetic.steps` that mirrors it; :mod:`.contract` says which instruction
each becomes.

Memory ordering, what makes the semaphore hand-off correct:

* acquire: one thread spins on ``ld.acquire.gpu`` (``tl.atomic_add(sem, 0,
  sem="acquire")``; Triton lowers an add of 0 to an acquire load, executed by one thread
  and broadcast to the others through shared memory behind ``bar.sync``). The barrier
  orders every thread's following reductions after the acquire. A plain or volatile load
  would not be an acquire, and a plain-load loop is deleted by the compiler.
* release: ``tl.debug_barrier()`` (``bar.sync``) orders every warp's reductions of the
  tile before the single thread's ``atom.release.gpu.exch`` that hands the tile to the
  next rank; the release's fence waits until the reductions are performed, and release is
  cumulative, so the other warps' reductions are visible to the acquirer.
* no forward-progress guarantee across CTAs: the grid is never larger than what can be
  resident at once (the launcher checks), and a validated schedule waits only on work
  placed on resident workers in an order that admits no cycle.

Layouts: ``Q, dO`` are ``(B, S_q, H, d)`` and ``K, V`` ``(B, S_k, H_kv, d)`` with any strides
but a contiguous last dim; ``LSE2, D`` are fp32 with strides ``(b, s, h)``; ``dQacc`` is a
contiguous fp32 ``(B, S_q, H, d)``; dK/dV go either to the outputs (rounded, head
``h // GROUP``) or to per-query-head fp32 scratch (head ``h``) summed later.

``VARLEN`` (a compile-time switch): a packed batch. A chain ``(b, h, j)`` then works on
sequence ``b``, whose first rows and lengths it reads from the int32 offsets
``CU_SEQLENS_Q`` and ``CU_SEQLENS_K``; tile indices ``i``, ``j`` count from the sequence's
first row, and the mask takes the sequence's own ``S_q``, ``S_k`` and causal offset. The
tensors are packed (``(total, H, d)``, batch strides 0; ``LSE2, D`` and ``dQacc`` packed
likewise), and the semaphore of dQ tile ``(b, h, i)`` is number ``q_tile_base[b] + h *
n_q(b) + i`` (the schedule's table ``Q_TILE_BASE``; ``n_q(b)`` the sequence's Q tiles), as
:meth:`dash_ref.Problem.q_tile_index` numbers them. Without it those pointers are None
(Triton drops them) and the kernel is the rectangular one.

``SOFTCAP`` (FlashAttention's logit softcap, a runtime fp32 value; None: none, and Triton
drops it): the raw products are capped as in the forward (:mod:`.softcap`, ``scale_log2``
then ``fp32(log2 e)``) and ``dS`` is multiplied by ``1 - t^2``, ``t`` the visit's own
recomputed ``tanh``; the epilogue's ``softmax_scale`` is unchanged. With ``EXACT`` the cap
is the ratio form (``SOFTCAP_K`` its constant; :func:`.softcap.softcap_ratio`) and the slope
``4 r (1 - r)`` multiplies ``P`` before [ds], as ``dash_ref``'s exact steps write them.
Learnable sinks need nothing here: ``LSE2`` includes them, so ``P`` is already right, and
``dsink`` is computed after the kernel (:func:`dash_cuda.prepost.sink_grad`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from dash_cuda.exp2 import exp2_fma
from dash_cuda.tile_io import load_tile, padded, sequence_rows, store_tile

from .mask import visible
from .softcap import softcap_ratio, softcap_scores, softcap_slope


@triton.jit
def _load_q_do(q_base, do_base, VISIT_Q, vis, vis_end, S_Q, stride_qs, stride_dos,
               BM: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr):
    """Q and dO tiles of visit ``vis`` (zeros when ``vis`` is past the chain's last visit)."""
    valid = vis < vis_end
    i = tl.load(VISIT_Q + vis, mask=valid, other=0)
    rows = i * BM + tl.arange(0, BM)
    n_rows = tl.where(valid, S_Q, 0)
    q = load_tile(q_base, rows, n_rows, stride_qs, HEAD_DIM)
    do = load_tile(do_base, rows, n_rows, stride_dos, HEAD_DIM_V)
    return q, do


@triton.jit
def _dq_mask(rows, S_Q, offs_d, HEAD_DIM: tl.constexpr):
    """The elements of a dQ partial that go into ``dQacc``: rows below ``S_Q`` and, in a
    padded tile, columns below ``HEAD_DIM``."""
    inside = rows[:, None] < S_Q
    if padded(HEAD_DIM) != HEAD_DIM:
        inside = inside & (offs_d[None, :] < HEAD_DIM)
    return inside


@triton.jit
def _wait_turn(sem, rank):
    """Spin until the tile's semaphore reaches ``rank`` (acquire, GPU scope)."""
    while tl.atomic_add(sem, 0, sem="acquire", scope="gpu") != rank:
        pass


@triton.jit
def _pass_turn(sem, rank):
    """Hand the tile to the next rank: all warps' reductions first, then a release."""
    tl.debug_barrier()
    tl.atomic_xchg(sem, rank + 1, sem="release", scope="gpu")


@triton.jit
def _opaque(x):
    """Identity the compiler cannot see through (one ``mov`` per register).

    Triton's combine pass rewrites ``acc + dot(a, b, 0)`` into ``dot(a, b, acc)``, which
    would add ``dQacc`` inside the tensor-core sum instead of one fp32 add after a fresh
    product (different bits). Passing the partial through this identity keeps the
    contract: fresh accumulator, then an add.
    """
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _softmax_p(s_t, lse2, scale_log2, seen, EXACT: tl.constexpr):
    """[softmax_p] ``P^T = exp2(S^T * scale_log2 - LSE2)``, masked elements exactly 0.

    Default: the compiler contracts the product and difference into one FFMA and
    ``exp2`` is ``ex2.approx.ftz`` (fast, its bits known only to the hardware). ``EXACT``:
    the same FFMA written out, then the software :func:`dash_cuda.exp2.exp2_fma`, the arithmetic
    the CPU reproduces.
    """
    if EXACT:  # Triton's unary minus is 0 - x; written out, as the emulator mirrors it
        p_t = exp2_fma(tl.fma(s_t, scale_log2, 0.0 - lse2[None, :]))
    else:
        p_t = tl.math.exp2(s_t * scale_log2 - lse2[None, :])
    return tl.where(seen, p_t, 0.0)


# Lengths, head counts and the LSE strides vary from call to call; keeping them out of the
# specialization key gives one compiled kernel per (dtype, head dim, flags).
# The window's extents likewise: one compiled kernel serves every window size.
_RUNTIME_INTS = ["H", "GROUP", "S_Q", "S_K", "N_Q", "CAUSAL_OFFSET", "stride_lb", "stride_lh",
                 "WINDOW_LEFT", "WINDOW_RIGHT"]


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def dash_bwd_kernel(
    Q, K, V, DO, LSE2, DELTA, DQ_ACC, DK, DV, SEM, PARTIALS,
    WORKER_OFFSETS, CHAIN_BHJ, CHAIN_OFFSETS, VISIT_Q, VISIT_RANK,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_dob, stride_dos, stride_doh,
    stride_lb, stride_ls, stride_lh,
    stride_dkb, stride_dks, stride_dkh,
    stride_dvb, stride_dvs, stride_dvh,
    H, GROUP, S_Q, S_K, N_Q, CAUSAL_OFFSET,
    scale_log2, softmax_scale,
    BM: tl.constexpr, BN: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    MASK: tl.constexpr, DETERMINISTIC: tl.constexpr, AUDIT: tl.constexpr,
    PER_HEAD: tl.constexpr, PREFETCH: tl.constexpr, EXACT: tl.constexpr,
    OPAQUE: tl.constexpr = True,
    CU_SEQLENS_Q=None, CU_SEQLENS_K=None, Q_TILE_BASE=None, VARLEN: tl.constexpr = False,
    WINDOW_LEFT=None, WINDOW_RIGHT=None, SOFTCAP=None, SOFTCAP_K=None,
):
    worker = tl.program_id(0)
    offs_d = tl.arange(0, padded(HEAD_DIM))  # a dQ row's columns, padding included
    c_begin = tl.load(WORKER_OFFSETS + worker)
    c_end = tl.load(WORKER_OFFSETS + worker + 1)
    for c in range(c_begin, c_end):
        b = tl.load(CHAIN_BHJ + 3 * c).to(tl.int64)
        h = tl.load(CHAIN_BHJ + 3 * c + 1).to(tl.int64)
        j = tl.load(CHAIN_BHJ + 3 * c + 2)
        if VARLEN:  # sequence b's own rows and lengths; its tensors start at its first rows
            q_first, seqlen_q = sequence_rows(CU_SEQLENS_Q, b)
            k_first, seqlen_k = sequence_rows(CU_SEQLENS_K, b)
            causal_offset = seqlen_k - seqlen_q
            n_q = (seqlen_q + BM - 1) // BM
            q_seq, do_seq = Q + q_first * stride_qs, DO + q_first * stride_dos
            lse_seq, delta_seq = LSE2 + q_first * stride_ls, DELTA + q_first * stride_ls
            k_seq, v_seq = K + k_first * stride_ks, V + k_first * stride_vs
            dk_seq, dv_seq = DK + k_first * stride_dks, DV + k_first * stride_dvs
        else:
            seqlen_q, seqlen_k, causal_offset = S_Q, S_K, CAUSAL_OFFSET
            q_seq, do_seq, lse_seq, delta_seq = Q, DO, LSE2, DELTA
            k_seq, v_seq, dk_seq, dv_seq = K, V, DK, DV
        h_kv = h // GROUP
        cols = j * BN + tl.arange(0, BN)
        k = load_tile(k_seq + b * stride_kb + h_kv * stride_kh, cols, seqlen_k, stride_ks,
                      HEAD_DIM)
        v = load_tile(v_seq + b * stride_vb + h_kv * stride_vh, cols, seqlen_k, stride_vs,
                      HEAD_DIM_V)
        dk = tl.zeros([BN, padded(HEAD_DIM)], dtype=tl.float32)
        dv = tl.zeros([BN, padded(HEAD_DIM_V)], dtype=tl.float32)
        q_base = q_seq + b * stride_qb + h * stride_qh
        do_base = do_seq + b * stride_dob + h * stride_doh
        lse_base = lse_seq + b * stride_lb + h * stride_lh
        delta_base = delta_seq + b * stride_lb + h * stride_lh
        if VARLEN:  # dQacc is contiguous (total_q, H, d)
            dq_base = DQ_ACC + (q_first * H + h) * HEAD_DIM
        else:
            # dQacc is contiguous (B, S_q, H, d): row r of head h starts at ((b*S_q + r)*H + h)*d
            dq_base = DQ_ACC + (b * S_Q * H + h) * HEAD_DIM
        vis_begin = tl.load(CHAIN_OFFSETS + c)
        vis_end = tl.load(CHAIN_OFFSETS + c + 1)
        if PREFETCH:
            q_next, do_next = _load_q_do(q_base, do_base, VISIT_Q, vis_begin, vis_end,
                                         seqlen_q, stride_qs, stride_dos, BM, HEAD_DIM,
                                         HEAD_DIM_V)
        for vis in range(vis_begin, vis_end):
            i = tl.load(VISIT_Q + vis)
            rows = i * BM + tl.arange(0, BM)
            if PREFETCH:
                # this visit's tiles were loaded one visit ago; start the next visit's now,
                # so their latency hides behind this visit's MMAs and its dQ hand-off
                q, do = q_next, do_next
                q_next, do_next = _load_q_do(q_base, do_base, VISIT_Q, vis + 1, vis_end,
                                             seqlen_q, stride_qs, stride_dos, BM, HEAD_DIM,
                                             HEAD_DIM_V)
            else:
                q = load_tile(q_base, rows, seqlen_q, stride_qs, HEAD_DIM)
                do = load_tile(do_base, rows, seqlen_q, stride_dos, HEAD_DIM_V)
            lse2 = tl.load(lse_base + rows * stride_ls, mask=rows < seqlen_q, other=0.0)
            delta = tl.load(delta_base + rows * stride_ls, mask=rows < seqlen_q, other=0.0)
            # Score tiles are transposed (keys as rows), so P^T and dS^T feed dV and dK
            # straight from registers; only dS for the partial needs a transpose.
            s_t = tl.dot(k, tl.trans(q))                                    # [qk]
            if SOFTCAP is not None:  # scale_log2 is then fp32(log2 e)
                if EXACT:  # the ratio form, r kept for the slope
                    s_t, t_t = softcap_ratio(s_t, SOFTCAP_K, SOFTCAP)       # [softcap]
                else:
                    s_t, t_t = softcap_scores(s_t, softmax_scale, SOFTCAP)  # [softcap]
            # the transposed score tile's elements (keys as rows) that exist and are unmasked
            seen = visible(rows[None, :], cols[:, None], seqlen_q, seqlen_k, causal_offset,
                           WINDOW_LEFT, WINDOW_RIGHT, MASK)
            p_t = _softmax_p(s_t, lse2, scale_log2, seen, EXACT)           # [softmax_p]
            p_op = p_t.to(q.dtype)                                          # [round_operand]
            dv += tl.dot(p_op, do)                                          # [dv_step]
            dp_t = tl.dot(v, tl.trans(do))                                  # [dp]
            if SOFTCAP is not None and EXACT:  # the slope folded into P (dV took rnd(P))
                p_t = softcap_slope(p_t, t_t)                               # [softcap_grad]
            ds_t = p_t * (dp_t - delta[None, :])                            # [ds]
            if SOFTCAP is not None and not EXACT:  # the scaled scores' gradient: 1 - tanh^2
                ds_t = ds_t * (1.0 - t_t * t_t)                             # [softcap_grad]
            ds_op = ds_t.to(q.dtype)                                        # [round_operand]
            dk += tl.dot(ds_op, q)                                          # [dk_step]
            if DETERMINISTIC:  # read the visit's rank before the MMA hides the load
                rank = tl.load(VISIT_RANK + vis)
                if VARLEN:
                    sem = SEM + tl.load(Q_TILE_BASE + b) + h * n_q + i
                else:
                    sem = SEM + (b * H + h) * N_Q + i
            partial = tl.dot(tl.trans(ds_op), k)                            # [dq_partial]
            if OPAQUE:  # off only in the CPU interpreter (no inline asm, no combine pass)
                partial = _opaque(partial)
            if AUDIT:
                r = tl.arange(0, BM)
                tl.store(PARTIALS + (tl.cast(vis, tl.int64) * BM + r[:, None]) * HEAD_DIM
                         + offs_d[None, :], partial,
                         mask=_dq_mask(r, BM, offs_d, HEAD_DIM))  # every row: replayed
            dq_ptrs = dq_base + rows.to(tl.int64)[:, None] * (H * HEAD_DIM) + offs_d[None, :]
            if DETERMINISTIC:
                _wait_turn(sem, rank)
            # [dq_add] fire-and-forget reductions performed at the L2 cache
            tl.atomic_add(dq_ptrs, partial, mask=_dq_mask(rows, seqlen_q, offs_d, HEAD_DIM),
                          sem="relaxed", scope="gpu")
            if DETERMINISTIC:
                _pass_turn(sem, rank)
        if PER_HEAD:
            # fp32 per query head; the GQA postprocess sums heads in ascending order
            store_tile(dk_seq + b * stride_dkb + h * stride_dkh, cols, seqlen_k, stride_dks,
                       dk, HEAD_DIM)
            store_tile(dv_seq + b * stride_dvb + h * stride_dvh, cols, seqlen_k, stride_dvs,
                       dv, HEAD_DIM_V)
        else:
            # [epilogue] one query head per KV head: dK = rnd(dK_acc * scale), dV = rnd(dV)
            store_tile(dk_seq + b * stride_dkb + h * stride_dkh, cols, seqlen_k, stride_dks,
                       (dk * softmax_scale).to(DK.dtype.element_ty), HEAD_DIM)
            store_tile(dv_seq + b * stride_dvb + h * stride_dvh, cols, seqlen_k, stride_dvs,
                       dv.to(DV.dtype.element_ty), HEAD_DIM_V)
