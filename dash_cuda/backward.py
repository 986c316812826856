"""Launch the backward: preprocess D, the persistent schedule-driven kernel, postprocesses.

Arithmetic contract (``DESIGN.md`` section 5)
---------------------------------------------
Every floating-point step of the backward, in order, with the instruction it becomes on
sm_90 (read off the PTX and SASS Triton 3.6 emits for these kernels; ``python -m
dash_cuda.inspect_asm`` prints the counts again) and the :mod:`dash_ref.emulate` function
that names the same step. Inputs ``Q, K, V, O, dO`` are bf16/fp16, every other value is fp32;
``rnd`` is round-to-nearest-even to the input dtype.

Each step: what the kernel computes / the sm_90 instruction (PTX, then SASS) / the
emulate step that names it.

 0. ``scale_log2 = fp32(softmax_scale * log2(e))`` / host: float64 product rounded to fp32
    / ``scale_log2``.
 1. ``D_r = sum_d dO_rd * O_rd`` (:func:`~dash_cuda.prepost_kernels.dash_delta_kernel`) /
    products of exact upcasts summed by ``tl.sum`` (per-thread adds, then a shuffle tree:
    an order of its own; the compiler fuses some products into FFMAs) / ``preprocess_d``.
 2. ``S^T = K_j Q_i^T``, fresh fp32 accumulator / ``wgmma.mma_async ... f32.bf16.bf16``
    (HGMMA) / ``qk``.
 3. ``P = exp2(S * scale_log2 - LSE2_i)`` / ``fma.rn.f32`` (FFMA: product and difference
    rounded once) then ``ex2.approx.ftz.f32`` (MUFU.EX2: approximate, subnormal inputs and
    results flushed to 0) / ``softmax_p``.
 4. masked elements ``P = 0`` exactly / select / ``softmax_p``.
 5. ``P_op = rnd(P)`` / ``cvt.rn.bf16x2.f32`` (F2FP.BF16.F32.PACK) / ``round_operand``.
 6. ``dV_j += P_op^T dO_i`` / HGMMA with ``dV_j`` as its accumulator / ``dv_step``.
 7. ``dP^T = V_j dO_i^T``, fresh accumulator / HGMMA / ``dp``.
 8. ``dS = P * (dP - D_i)`` / ``sub.f32`` then ``mul.f32`` (FADD, FMUL: no contraction
    is possible) / ``ds``.
 9. ``dS_op = rnd(dS)`` / ``cvt.rn.bf16x2.f32`` / ``round_operand``.
10. ``dK_j += dS_op^T Q_i`` / HGMMA with ``dK_j`` as its accumulator / ``dk_step``.
11. ``P_ij = dS_op K_j``, fresh accumulator / HGMMA, then an opaque ``mov.b32`` so that
    Triton cannot fold step 12 into the MMA's accumulator / ``dq_partial``.
12. ``dQacc_i = dQacc_i + P_ij`` in the tile's dQ order, from ``+0.0`` (memset), under
    the semaphore. Default (``TileConfig.red_add``): ``red.global.add.f32``
    (REDG.E.ADD.F32: RNE, subnormal inputs and results flushed) performed at L2, one
    adder per tile at a time in rank order; no load round trip, and the release's fence
    waits for the reductions / ``dq_add(..., flush_subnormals=True)`` via
    ``replay(..., flush_subnormals=True)``. With ``red_add=False``: ``ld.global.cg``
    (issued after the acquire, before step 11's MMA) + ``add.f32`` + ``st.global`` (FADD,
    RNE, subnormals kept) / ``dq_add`` via ``replay``.
    ``atomic`` peer instead: ``atom.global.gpu.relaxed.add.v4.f32`` (REDG.E.ADD.F32,
    flushes subnormals) in arrival order / no emulate step (no fixed order).
13. ``dQ = rnd(dQacc * scale)`` / ``mul.f32`` + ``cvt.rn`` / ``epilogue``.
14. one query head per KV head: ``dK = rnd(dK_j * scale)``, ``dV = rnd(dV_j)`` / ``mul.f32``
    + ``cvt.rn`` / ``epilogue``.
15. GQA: each query head's fp32 ``dK_j``, ``dV_j`` go to a scratch buffer, then
    ``dK = rnd((((+0 + dK_h0) + dK_h1) + ...) * scale)`` with heads ascending, ``dV``
    likewise without the scale / ``add.f32`` ..., ``mul.f32`` + ``cvt.rn`` / ``gqa_sum``,
    ``epilogue``.

Two arithmetics. The default one above is fast. ``exact=True`` changes two steps, and
with them every step is reproduced on the CPU by ``dash_ref.emulate.backward(...,
arithmetic="exact")`` (L2, ``DESIGN.md`` section 6), given the kernel's ``O`` and ``LSE2``:

 1. ``D`` as an ascending pairwise tree (:func:`~dash_cuda.prepost_kernels._rowsum_pairwise`)
    / ``mul.f32``, then ``add.f32`` level by level / ``preprocess_d_ordered``.
 3. ``P = exp2_fma(fma(S, scale_log2, -LSE2_i))`` (:func:`dash_cuda.exp2.exp2_fma`) /
    ``fma.rn.f32``, then ``max``/``min``, ``cvt.rni``, ``sub.f32``, seven ``fma.rn.f32`` and
    integer operations on the bits, no ``.ftz`` / ``softmax_p_fma``.

Both exact kernels are built with ``enable_fp_fusion=False``: no multiply and add is fused
unless the source says ``tl.fma`` (every fp32 ``add``/``sub``/``mul`` in their PTX carries
``.rn``, which ``ptxas`` may not contract; ``tests/test_exact_asm.py`` reads the SASS: no
``MUFU.EX2``, eight FFMAs and one FRND per score element, nothing with ``.FTZ``). The
emulator's other counterparts are the same in both modes: steps 2, 6, 7, 10 and 11 are
``dash_ref.arithmetic.tensorcore.mma`` (k16 blocks fused, ascending; 6 and 10 accumulate inside the
MMA), step 8 is an fp32 subtraction then a multiplication, steps 12 to 15 are ``replay``,
``epilogue`` and ``gqa_sum`` (what ``audit=True`` checks in either mode). ``exact`` runs
at 0.70 - 0.80 of the default's throughput (``benchmarks/results/exact_cost.md``).

Subnormals: by default the dQ sums (12) flush subnormal inputs and results
(``red.add.f32``; the record of ``audit=True`` says so in ``flush_subnormals``); with
``red_add=False`` they are plain fp32 adds that keep them (no ``.ftz``), as the GQA sums
(15) always are. ``ex2.approx.ftz`` returns 0 where ``P`` would be below ``2**-126``.

Forward (:mod:`dash_cuda.fwd_kernel`): ``LSE2`` is stored in base 2,
``LSE2 = m + log2(l)`` with ``m`` the running max of ``S * scale_log2`` and ``l`` the sum
of ``exp2(S * scale_log2 - m)``, rows that see no key ``LSE2 = -inf`` and ``O = 0``.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import torch
import triton

from dash_ref import Schedule

from .bwd_kernel import dash_bwd_kernel
from .config import backward_config, backward_problem
from .forward import scale_log2
from .prepost_kernels import dash_delta_kernel, dash_dq_kernel, dash_gqa_kernel
from .tables import TABLE_NAMES, device_schedule

F32 = torch.float32


@dataclass
class BackwardAudit:
    """What ``audit=True`` returns beside the gradients (small problems only).

    ``partials[v]`` is the fp32 partial ``P_ij = dS_ij @ K_j`` of visit ``v`` in
    :meth:`dash_ref.Schedule.to_tables` order (workers, then chains in run order, then
    visits in visit order); its row ``r`` is query row ``i * BM + r`` (rows past ``S_q``
    hold anything). ``dq_acc`` is the fp32 ``(B, S_q, H, d)`` accumulator before scaling,
    so ``dash_ref.emulate.replay(schedule, partials)`` must equal it bit for bit.
    ``dk_heads`` / ``dv_heads`` are each query head's fp32 ``(B, S_k, H, d)`` dK / dV
    accumulators before the GQA sum (dK unscaled); ``delta`` is the preprocess's fp32
    ``D = rowsum(dO * O)``, ``(B, S_q, H)``.
    """

    schedule: Schedule
    partials: torch.Tensor
    dq_acc: torch.Tensor
    dk_heads: torch.Tensor
    dv_heads: torch.Tensor
    delta: torch.Tensor
    flush_subnormals: bool = False  # the dQ adds were red.add (replay with flushing)
    exact: bool = False  # the exact arithmetic (reproduced by emulate's "hopper" mode)


# -- residency ------------------------------------------------------------------------------
_resident: dict[tuple, int] = {}
_resident_lock = threading.Lock()


def _blocks_per_sm(kernel, device: torch.device) -> int:
    """How many programs of a compiled kernel fit on one SM at once (registers, smem, threads)."""
    props = torch.cuda.get_device_properties(device)
    kernel._init_handles()  # loads the binary; fills n_regs
    warps = kernel.metadata.num_warps
    regs_per_warp = -(-max(kernel.n_regs, 1) * 32 // 256) * 256  # allocated per warp in 256s
    regs = getattr(props, "regs_per_multiprocessor", 65536)  # every sm_80/sm_90 has 64 Ki
    by_regs = (regs // regs_per_warp) // warps
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    shared = kernel.metadata.shared
    # one KiB of each block's shared memory is reserved by the system on sm_8x/sm_90
    by_smem = props.shared_memory_per_multiprocessor // (shared + 1024) if shared else 32
    return max(0, min(by_regs, by_threads, by_smem, 32))


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device``: the default number of persistent workers."""
    return torch.cuda.get_device_properties(device).multi_processor_count


def max_workers(key: tuple, device: torch.device, compile_kernel) -> int:
    """Most programs of the backward kernel that can be resident at once on ``device``.

    ``compile_kernel()`` returns the compiled kernel for this launch; the answer is cached
    per ``key`` (kernel variant and device).
    """
    with _resident_lock:
        hit = _resident.get(key)
    if hit is None:
        hit = sm_count(device) * _blocks_per_sm(compile_kernel(), device)
        with _resident_lock:
            _resident[key] = hit
    return hit


# -- launch ---------------------------------------------------------------------------------
def preprocess_delta(o: torch.Tensor, do: torch.Tensor, block_m: int, exact: bool = False
                     ) -> torch.Tensor:
    """``D = rowsum(dO * O)`` in fp32 (step 1), a ``(B, S_q, H)`` view of ``(B, H, S_q)``.

    Laid out like the ``LSE2`` the backward reads with the same strides; with ``exact`` in
    the pairwise order of ``dash_ref.emulate.preprocess_d_ordered``.
    """
    batch, seqlen_q, heads, head_dim = o.shape
    delta = torch.empty((batch, heads, seqlen_q), device=o.device, dtype=F32).transpose(1, 2)
    dash_delta_kernel[(triton.cdiv(seqlen_q, block_m), batch * heads)](
        o, do, delta,
        o.stride(0), o.stride(1), o.stride(2),
        do.stride(0), do.stride(1), do.stride(2),
        delta.stride(0), delta.stride(1), delta.stride(2),
        heads, seqlen_q, BM=block_m, HEAD_DIM=head_dim, EXACT=exact,
        enable_fp_fusion=not exact,
    )
    return delta


def run_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse2: torch.Tensor, do: torch.Tensor, causal: bool, softmax_scale: float,
                 schedule: str, num_workers: int | None, audit: bool = False,
                 poison: bool = False, exact: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, BackwardAudit | None]:
    """dQ, dK, dV (and the audit record) under schedule ``schedule``.

    Inputs are validated ``(B, S, H, d)`` views (contiguous last dim, non-empty sequences);
    ``lse2`` is fp32 with dims ``(B, S_q, H)``. ``schedule`` is a resolved name (``atomic``
    or a deterministic one). ``poison`` fills outputs and scratch with NaN first. ``exact``
    selects the arithmetic :mod:`dash_ref.emulate` reproduces bit for bit (module docstring).
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    device = q.device
    cfg = backward_config(head_dim)
    problem = backward_problem(batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
    deterministic = schedule != "atomic"
    per_head = audit or heads != heads_kv

    delta = preprocess_delta(o, do, cfg.block_m, exact)
    if lse2.stride() != delta.stride():  # the kernel reads LSE2 and D with one set of strides
        lse2 = torch.empty_like(delta).copy_(lse2)
    grid_rows = (triton.cdiv(seqlen_q, cfg.block_m), batch * heads)

    dq_acc = torch.zeros((batch, seqlen_q, heads, head_dim), device=device, dtype=F32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if per_head:
        dk_out = torch.empty((batch, seqlen_k, heads, head_dim), device=device, dtype=F32)
        dv_out = torch.empty_like(dk_out)
    else:
        dk_out, dv_out = dk, dv
    scratch = [dq, dk, dv] + ([dk_out, dv_out] if per_head else [])

    kernel_args_tail = dict(
        BM=cfg.block_m, BN=cfg.block_n, HEAD_DIM=head_dim, CAUSAL=causal,
        DETERMINISTIC=deterministic, AUDIT=audit, PER_HEAD=per_head,
        PREFETCH=bool(cfg.prefetch), LATE_RELEASE=bool(cfg.late_release),
        RED_ADD=bool(cfg.red_add), EXACT=exact,
        OPAQUE=os.environ.get("TRITON_INTERPRET", "0") != "1",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=not exact,
    )

    def args(sched_tables, sem, partials):
        t = sched_tables
        return (
            q, k, v, do, lse2, delta, dq_acc, dk_out, dv_out, sem, partials,
            t["worker_offsets"], t["chain_bhj"], t["chain_offsets"], t["visit_q"],
            t["visit_rank"],
            q.stride(0), q.stride(1), q.stride(2),
            k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2),
            do.stride(0), do.stride(1), do.stride(2),
            lse2.stride(0), lse2.stride(1), lse2.stride(2),
            dk_out.stride(0), dk_out.stride(1), dk_out.stride(2),
            dv_out.stride(0), dv_out.stride(1), dv_out.stride(2),
            heads, heads // heads_kv, seqlen_q, seqlen_k, problem.n_q, seqlen_k - seqlen_q,
            scale_log2(softmax_scale), softmax_scale,
        )

    workers = int(num_workers) if num_workers is not None else sm_count(device)
    variant = (device, q.dtype, head_dim, cfg, causal, deterministic, audit, per_head, exact)
    placeholder = {name: torch.zeros(4, device=device, dtype=torch.int32) for name in TABLE_NAMES}
    limit = max_workers(variant, device, lambda: dash_bwd_kernel.warmup(
        *args(placeholder, placeholder["visit_q"], dq_acc), grid=(workers,), **kernel_args_tail))
    if workers > limit:
        raise ValueError(
            f"num_workers={workers} exceeds the {limit} backward programs that can be resident "
            f"at once on {torch.cuda.get_device_name(device)}: a persistent grid larger than "
            "that could deadlock on its semaphores"
        )

    sched = device_schedule(problem, schedule, workers, device)  # validated, cached per shape
    # one semaphore per dQ tile (b, h, i): the rank whose partial goes in next
    sem = torch.zeros(sched.num_tiles if deterministic else 1, device=device, dtype=torch.int32)
    partials = (torch.empty((sched.num_visits, cfg.block_m, head_dim), device=device,
                            dtype=F32) if audit else dq_acc)
    if audit:
        scratch.append(partials)
    if poison:
        for t in scratch:
            t.fill_(math.nan)

    # One program per worker; the grid never exceeds what is resident (checked above).
    dash_bwd_kernel[(workers,)](*args(sched.tables, sem, partials), **kernel_args_tail)

    dash_dq_kernel[grid_rows](
        dq_acc, dq, dq.stride(0), dq.stride(1), dq.stride(2),
        heads, seqlen_q, softmax_scale, BM=cfg.block_m, HEAD_DIM=head_dim,
    )
    if per_head:
        grid_kv = (triton.cdiv(seqlen_k, 64), batch * heads_kv)
        dash_gqa_kernel[grid_kv](
            dk_out, dv_out, dk, dv,
            dk.stride(0), dk.stride(1), dk.stride(2),
            dv.stride(0), dv.stride(1), dv.stride(2),
            heads_kv, seqlen_k, softmax_scale,
            GROUP=heads // heads_kv, BN=64, HEAD_DIM=head_dim, num_warps=8,
        )
    record = None
    if audit:
        record = BackwardAudit(sched.schedule(), partials, dq_acc, dk_out, dv_out, delta,
                               flush_subnormals=deterministic and cfg.red_add, exact=exact)
    return dq, dk, dv, record
