"""The persistent backward kernel: one program per worker, running the chains of its table.

(The arithmetic contract is in :mod:`dash_cuda.backward`.)

A program ``w`` reads ``worker_offsets[w] : worker_offsets[w + 1]``, the chains it runs, in
order. For chain ``c = (b, h, j)`` it loads ``K_j`` and ``V_j`` once, clears its fp32
``dK_j``, ``dV_j`` accumulators, and visits the Q tiles ``visit_q[chain_offsets[c] :
chain_offsets[c + 1]]`` in that order. Each visit computes the fp32 partial
``P_ij = dS_ij @ K_j`` and adds it into ``dQacc_i``:

* deterministic schedules: wait until the semaphore of tile ``(b, h, i)`` equals the
  visit's rank (``visit_rank``), load the accumulator tile, add, store, release the
  semaphore with ``rank + 1``. The sums therefore happen in the schedule's dQ order, one
  fp32 round-to-nearest-even add at a time, with subnormals kept. The accumulator load is
  issued right after the wait and before the partial's MMA, whose time hides its latency.
  With ``LATE_RELEASE`` the release moves after the next visit's MMAs (the stores have
  drained by then), always before the next wait: a program never waits while it holds a
  tile. It measured slower (tiles are held longer), so it is off by default.
* ``atomic``: relaxed fp32 atomics in arrival order (non-deterministic, flushes
  subnormals); the peer that measures what determinism costs.

Memory ordering (``DESIGN.md`` section 7), what makes the semaphore hand-off correct:

* acquire: one thread spins on ``ld.acquire.gpu`` (``tl.atomic_add(sem, 0,
  sem="acquire")``; Triton lowers an add of 0 to an acquire load, executed by one thread
  and broadcast to the others through shared memory behind ``bar.sync``). The barrier
  orders every thread's following loads of ``dQacc`` after the acquire. A plain or
  volatile load would not be an acquire, and a plain-load loop is deleted by the compiler.
* the accumulator is read with ``.cg`` (L2, not the non-coherent L1) as a second guard:
  the same program may have cached that tile in L1 on an earlier visit.
* release: ``tl.debug_barrier()`` (``bar.sync``) orders every warp's stores of the tile
  before the single thread's ``atom.release.gpu.exch`` that hands the tile to the next
  rank; release is cumulative, so the other warps' stores are visible to the acquirer.
* no forward-progress guarantee across CTAs: the grid is never larger than what can be
  resident at once (:func:`dash_cuda.backward.max_workers`), and a validated schedule
  waits only on work placed on resident workers in an order that admits no cycle.

Layouts: ``Q, dO`` are ``(B, S_q, H, d)`` and ``K, V`` ``(B, S_k, H_kv, d)`` with any strides
but a contiguous last dim; ``LSE2, D`` are fp32 with strides ``(b, s, h)``; ``dQacc`` is a
contiguous fp32 ``(B, S_q, H, d)``; dK/dV go either to the outputs (rounded, head
``h // GROUP``) or to per-query-head fp32 scratch (head ``h``) summed later.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .exp2 import exp2_fma


@triton.jit
def _load_tile(base, rows, n_rows, stride_s, HEAD_DIM: tl.constexpr):
    """Rows ``rows`` of a ``(S, d)`` slice (any row stride); rows past ``n_rows`` read 0."""
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = base + (rows[:, None] * stride_s + offs_d[None, :])
    return tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)


@triton.jit
def _store_tile(base, rows, n_rows, stride_s, x, HEAD_DIM: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = base + (rows[:, None] * stride_s + offs_d[None, :])
    tl.store(ptrs, x, mask=rows[:, None] < n_rows)


@triton.jit
def _load_q_do(q_base, do_base, VISIT_Q, vis, vis_end, S_Q, stride_qs, stride_dos,
               BM: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Q and dO tiles of visit ``vis`` (zeros when ``vis`` is past the chain's last visit)."""
    valid = vis < vis_end
    i = tl.load(VISIT_Q + vis, mask=valid, other=0)
    rows = i * BM + tl.arange(0, BM)
    n_rows = tl.where(valid, S_Q, 0)
    q = _load_tile(q_base, rows, n_rows, stride_qs, HEAD_DIM)
    do = _load_tile(do_base, rows, n_rows, stride_dos, HEAD_DIM)
    return q, do


@triton.jit
def _wait_turn(sem, rank):
    """Spin until the tile's semaphore reaches ``rank`` (acquire, GPU scope)."""
    while tl.atomic_add(sem, 0, sem="acquire", scope="gpu") != rank:
        pass


@triton.jit
def _pass_turn(sem, rank):
    """Hand the tile to the next rank: all warps' stores first, then a release."""
    tl.debug_barrier()
    tl.atomic_xchg(sem, rank + 1, sem="release", scope="gpu")


@triton.jit
def _opaque(x):
    """Identity the compiler cannot see through (one ``mov`` per register).

    Triton's combine pass rewrites ``acc + dot(a, b, 0)`` into ``dot(a, b, acc)``, which
    would add ``dQacc`` inside the tensor-core sum instead of one fp32 add after a fresh
    product (different bits, and the product would move into the critical section). Passing
    the partial through this identity keeps the contract: fresh accumulator, then an add.
    """
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _softmax_p(s_t, lse2, scale_log2, EXACT: tl.constexpr):
    """``P^T = exp2(S^T * scale_log2 - LSE2)`` before masking.

    Default: the compiler contracts the product and difference into one FFMA and
    ``exp2`` is ``ex2.approx.ftz`` (fast, its bits known only to the hardware). ``EXACT``:
    the same FFMA written out, then the software :func:`~dash_cuda.exp2.exp2_fma`, so
    that :func:`dash_ref.emulate.softmax_p_fma` reproduces every bit.
    """
    if EXACT:  # Triton's unary minus is 0 - x; written out, as the emulator mirrors it
        return exp2_fma(tl.fma(s_t, scale_log2, 0.0 - lse2[None, :]))
    return tl.math.exp2(s_t * scale_log2 - lse2[None, :])


@triton.jit
def _visit(q, do, lse2, delta, k, v, rows, cols, S_Q, S_K, CAUSAL_OFFSET, scale_log2,
           CAUSAL: tl.constexpr, EXACT: tl.constexpr):
    """One tile pair up to ``dS``, in the transposed form (rows of score tiles are keys).

    Returns the operand-dtype ``P^T`` and ``dS^T``. Keeping keys as rows lets both
    ``P^T @ dO`` and ``dS^T @ Q`` take their left operand straight from registers; only
    ``dS`` for the partial ``dS @ K_j`` needs a transpose.
    """
    s_t = tl.dot(k, tl.trans(q))                          # S^T = K_j Q_i^T, fp32 accumulate
    p_t = _softmax_p(s_t, lse2, scale_log2, EXACT)
    visible = (cols[:, None] < S_K) & (rows[None, :] < S_Q)
    if CAUSAL:
        visible = visible & (cols[:, None] <= rows[None, :] + CAUSAL_OFFSET)
    p_t = tl.where(visible, p_t, 0.0)                     # masked elements exactly 0
    dp_t = tl.dot(v, tl.trans(do))                        # dP^T = V_j dO_i^T
    ds_t = p_t * (dp_t - delta[None, :])                  # dS = P * (dP - D)
    return p_t.to(q.dtype), ds_t.to(q.dtype)


@triton.jit
def _dq_partial(ds_op, k, OPAQUE: tl.constexpr):
    """``P_ij = dS(bf16) K_j`` in a fresh fp32 accumulator."""
    partial = tl.dot(tl.trans(ds_op), k)
    if OPAQUE:  # off only in the CPU interpreter, which has no inline asm (and no combine pass)
        partial = _opaque(partial)
    return partial


# Lengths, head counts and the LSE strides vary from call to call; keeping them out of the
# specialization key gives one compiled kernel per (dtype, head dim, flags).
_RUNTIME_INTS = ["H", "GROUP", "S_Q", "S_K", "N_Q", "CAUSAL_OFFSET", "stride_lb", "stride_lh"]


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
    BM: tl.constexpr, BN: tl.constexpr, HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr, DETERMINISTIC: tl.constexpr, AUDIT: tl.constexpr,
    PER_HEAD: tl.constexpr, PREFETCH: tl.constexpr, LATE_RELEASE: tl.constexpr,
    RED_ADD: tl.constexpr, EXACT: tl.constexpr,
    OPAQUE: tl.constexpr = True,
):
    worker = tl.program_id(0)
    offs_d = tl.arange(0, HEAD_DIM)
    c_begin = tl.load(WORKER_OFFSETS + worker)
    c_end = tl.load(WORKER_OFFSETS + worker + 1)
    for c in range(c_begin, c_end):
        b = tl.load(CHAIN_BHJ + 3 * c).to(tl.int64)
        h = tl.load(CHAIN_BHJ + 3 * c + 1).to(tl.int64)
        j = tl.load(CHAIN_BHJ + 3 * c + 2)
        h_kv = h // GROUP
        cols = j * BN + tl.arange(0, BN)
        k = _load_tile(K + b * stride_kb + h_kv * stride_kh, cols, S_K, stride_ks, HEAD_DIM)
        v = _load_tile(V + b * stride_vb + h_kv * stride_vh, cols, S_K, stride_vs, HEAD_DIM)
        dk = tl.zeros([BN, HEAD_DIM], dtype=tl.float32)
        dv = tl.zeros([BN, HEAD_DIM], dtype=tl.float32)
        q_base = Q + b * stride_qb + h * stride_qh
        do_base = DO + b * stride_dob + h * stride_doh
        lse_base = LSE2 + b * stride_lb + h * stride_lh
        delta_base = DELTA + b * stride_lb + h * stride_lh
        # dQacc is contiguous (B, S_q, H, d): row r of head h starts at ((b*S_q + r)*H + h)*d
        dq_base = DQ_ACC + (b * S_Q * H + h) * HEAD_DIM
        vis_begin = tl.load(CHAIN_OFFSETS + c)
        vis_end = tl.load(CHAIN_OFFSETS + c + 1)
        if PREFETCH:
            q_next, do_next = _load_q_do(q_base, do_base, VISIT_Q, vis_begin, vis_end, S_Q,
                                         stride_qs, stride_dos, BM, HEAD_DIM)
        pending_sem = SEM  # LATE_RELEASE: the tile this program still holds (rank >= 0)
        pending_rank = -1
        for vis in range(vis_begin, vis_end):
            i = tl.load(VISIT_Q + vis)
            rows = i * BM + tl.arange(0, BM)
            if PREFETCH:
                # this visit's tiles were loaded one visit ago; start the next visit's now,
                # so their latency hides behind this visit's MMAs and its dQ hand-off
                q, do = q_next, do_next
                q_next, do_next = _load_q_do(q_base, do_base, VISIT_Q, vis + 1, vis_end, S_Q,
                                             stride_qs, stride_dos, BM, HEAD_DIM)
            else:
                q = _load_tile(q_base, rows, S_Q, stride_qs, HEAD_DIM)
                do = _load_tile(do_base, rows, S_Q, stride_dos, HEAD_DIM)
            lse2 = tl.load(lse_base + rows * stride_ls, mask=rows < S_Q, other=0.0)
            delta = tl.load(delta_base + rows * stride_ls, mask=rows < S_Q, other=0.0)
            p_op, ds_op = _visit(q, do, lse2, delta, k, v, rows, cols, S_Q, S_K, CAUSAL_OFFSET,
                                 scale_log2, CAUSAL, EXACT)
            dv += tl.dot(p_op, do)                       # dV_j += P^T(bf16) dO_i
            dk += tl.dot(ds_op, q)                       # dK_j += dS^T(bf16) Q_i
            dq_ptrs = dq_base + rows.to(tl.int64)[:, None] * (H * HEAD_DIM) + offs_d[None, :]
            row_ok = rows[:, None] < S_Q
            if DETERMINISTIC:
                if LATE_RELEASE:  # noqa: SIM102 - a compile-time branch around a run-time one
                    # the previous visit's dQ stores had this visit's MMAs to drain: the
                    # release's fence finds them done. Released before any new wait, so a
                    # worker never waits while it holds a tile.
                    if pending_rank >= 0:
                        _pass_turn(pending_sem, pending_rank)
                rank = tl.load(VISIT_RANK + vis)
                sem = SEM + (b * H + h) * N_Q + i
                if not RED_ADD:
                    _wait_turn(sem, rank)
                    # issued before the partial's MMA, so the load's latency hides behind it
                    acc = tl.load(dq_ptrs, mask=row_ok, other=0.0, cache_modifier=".cg")
            partial = _dq_partial(ds_op, k, OPAQUE)     # P_ij = dS(bf16) K_j, fresh acc
            if AUDIT:
                r = tl.arange(0, BM)
                tl.store(PARTIALS + (tl.cast(vis, tl.int64) * BM + r[:, None]) * HEAD_DIM
                         + offs_d[None, :], partial)
            if DETERMINISTIC:
                if RED_ADD:
                    # dQacc_i += P_ij as fire-and-forget reductions performed at L2: no load
                    # round trip. Still one adder per tile at a time, in rank order; the
                    # release's fence waits for the reductions (fp32 RNE, subnormals flushed).
                    _wait_turn(sem, rank)
                    tl.atomic_add(dq_ptrs, partial, mask=row_ok, sem="relaxed", scope="gpu")
                else:
                    tl.store(dq_ptrs, acc + partial, mask=row_ok)  # dQacc_i += P_ij, fp32 RNE
                if LATE_RELEASE:
                    pending_sem, pending_rank = sem, rank
                else:
                    _pass_turn(sem, rank)
            else:
                tl.atomic_add(dq_ptrs, partial, mask=row_ok, sem="relaxed", scope="gpu")
        if DETERMINISTIC and LATE_RELEASE:  # noqa: SIM102 - compile time, then run time
            if pending_rank >= 0:
                _pass_turn(pending_sem, pending_rank)
        if PER_HEAD:
            # fp32 per query head; the GQA postprocess sums heads in ascending order
            _store_tile(DK + b * stride_dkb + h * stride_dkh, cols, S_K, stride_dks, dk,
                        HEAD_DIM)
            _store_tile(DV + b * stride_dvb + h * stride_dvh, cols, S_K, stride_dvs, dv,
                        HEAD_DIM)
        else:
            # one query head per KV head: round here, dK = rnd(dK_acc * scale), dV = rnd(dV)
            _store_tile(DK + b * stride_dkb + h * stride_dkh, cols, S_K, stride_dks,
                        (dk * softmax_scale).to(DK.dtype.element_ty), HEAD_DIM)
            _store_tile(DV + b * stride_dvb + h * stride_dvh, cols, S_K, stride_dvs,
                        dv.to(DV.dtype.element_ty), HEAD_DIM)
