"""Which sm_90a instruction each step of the arithmetic contract becomes in the CuTe kernels.

One entry per step of :data:`dash_ref.arithmetic.steps.STEPS`; the function of the same
name mirrors it on the CPU. The CuTe backend runs the fast arithmetic only (``exact=True``
runs on the Triton backend), so each entry holds one text, and :data:`CPU` names the
``dash_ref`` functions that reproduce it bit for bit (the arithmetic ``FAST``). Read off
the PTX and SASS of the compiled kernels; ``python -m dash_cuda.backends.cute.inspect_ptx``
compiles every variant for sm_90a on any machine and checks the PTX facts
(``tests/test_cute_ptx.py`` runs it where ``nvidia-cutlass-dsl`` is installed).
"""

from __future__ import annotations

from dataclasses import replace

from dash_cuda.backends import SHARED_STEPS, Instruction

BACKEND = "cute"

_INSTRUCTIONS: dict[str, Instruction] = {
    "scale_log2": Instruction("host: the float64 product rounded to fp32 (a Float32 argument)"),
    "round_operand": Instruction("`cvt.rn.bf16x2.f32` / `cvt.rn.f16x2.f32` "
                                 "(F2FP.BF16.F32.PACK_AB)"),
    "fwd_scores": Instruction("`wgmma.mma_async` (A = Q, B = K from shared memory, fresh "
                              "accumulator); the scale is not applied to each score on its "
                              "own (see `fwd_max`, `fwd_probs`); masked: `selp.f32` -inf, in "
                              "a separate loop over the tiles that touch S_k or the causal "
                              "diagonal"),
    "fwd_max": Instruction("`max.f32` over the thread's raw scores (four chains), over the "
                           "row's four threads by `shfl.sync.bfly` 1 and 2, then one "
                           "`mul.rn.f32` by c: the largest rounded scaled score, since "
                           "rounding is monotone and c > 0 (the host runs c < 0 as (-Q) K^T "
                           "|c|, c = 0 as Q = 0)"),
    "fwd_probs": Instruction("P: `fma.rn.f32` S * c - m_safe then `ex2.approx.ftz.f32` in one "
                             "inline block (S * c not rounded on its own, as in `softmax_p`); "
                             "alpha: `sub.rn.f32` then `ex2.approx.ftz.f32` (MUFU.EX2: "
                             "approximate, subnormals flushed)"),
    "fwd_accumulate": Instruction("l: each thread adds its own columns of the row in register "
                                  "order (`add.f32`), then `fma.rn.f32` l * alpha + sum; the "
                                  "row's four partial l are summed only at the end; acc: "
                                  "`mul.f32` by alpha, then `wgmma` with rnd(P) in registers "
                                  "and acc as its accumulator; KV tiles in ascending order"),
    "fwd_finish": Instruction("l = the four partial sums by `shfl.sync.bfly` 1 then 2; "
                              "O = acc * (1 / l): `rcp.rn.f32` per row (correctly rounded), "
                              "`mul.f32` per element (not a correctly rounded quotient); "
                              "`lg2.approx.ftz.f32` then `add.rn.f32`; rows with l = 0: 1 / l "
                              "selected to 0 (O = +0), LSE2 to -inf; O rounded by `cvt.rn` "
                              "and stored by TMA"),
    **SHARED_STEPS,
    # the shared preprocess in the pairwise order, which dash_ref reproduces (FAST)
    "delta": Instruction(SHARED_STEPS["delta"].exact),
    "qk": Instruction("`wgmma.mma_async ... f32.bf16.bf16`, A = K and B = Q from shared "
                      "memory, first k-block without accumulator (HGMMA.64xBMx16 ... RZ), "
                      "computed as S^T = K_j Q_i^T"),
    "softmax_p": Instruction("`fma.rn.f32` then `ex2.approx.ftz.f32` in one inline block per "
                             "element (FFMA, MUFU.EX2: approximate, subnormals flushed); "
                             "masked: `selp.f32` 0 (FSEL), only in tiles that touch S_q, S_k "
                             "or the causal diagonal (d = 128 full masks: in every tile, "
                             "keeping the elements no mask hides)"),
    "dv_step": Instruction("`wgmma.mma_async` with A = rnd(P^T) in registers, B = dO^T from "
                           "shared memory, dV_j as its accumulator (k = BM)"),
    "dp": Instruction("`wgmma.mma_async`, fresh accumulator, computed as dP^T = V_j dO_i^T "
                      "(k = d)"),
    "ds": Instruction("`sub.rn.f32` then `mul.rn.f32` in one inline block (FADD, FMUL: never "
                      "contracted)"),
    "dk_step": Instruction("`wgmma.mma_async` with A = rnd(dS^T) in registers, B = Q^T from "
                           "shared memory, dK_j as its accumulator (k = BM)"),
    "dq_partial": Instruction("`wgmma.mma_async`, A = rnd(dS) and B = K^T from shared memory, "
                              "fresh accumulator (k = BN), staged in shared memory for the "
                              "dQ writer warp"),
    "dq_add": Instruction("`cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32` of "
                          "the whole tile (UBLKRED.G.S.ADD.F32.RN: RNE, subnormals kept, "
                          "measured on an H200), under the tile's semaphore in rank order: "
                          "`ld.acquire.gpu` spin, `fence.proxy.async.global`, the reduce, "
                          "`cp.async.bulk.wait_group 0` (completed, not `.read`), "
                          "`fence.proxy.async.global`, `st.release.gpu` (atomic peer: the "
                          "same reduce, in arrival order); dQacc starts as +0 (stored by the "
                          "`delta` launch)"),
    "epilogue": Instruction("dK, dV: `mul.f32` then `cvt.rn` in the kernel with one query head "
                            "per KV head, to shared memory and out by TMA stores (else the "
                            "shared `dash_gqa_kernel`); dQ: `mul.f32` "
                            "then `cvt.rn` in this backend's `dash_dq_tiles_kernel` (a Triton "
                            "kernel, `finish_dq.py`), which reads the staged tiles"),
}

#: the ``dash_ref`` functions that reproduce each step's instructions bit for bit
CPU: dict[str, str] = {
    "scale_log2": "`steps.scale_log2`",
    "round_operand": "`steps.round_operand` (`Tensor.to`, RNE)",
    "fwd_scores": "`tensorcore.mma` (k16 steps, ascending); `emulate.visible` for the mask",
    "fwd_max": "`torch.max` (exact), then one fp32 multiply",
    "fwd_probs": "`numerics.fma_f32`, then `mufu.ex2_approx_ftz`",
    "fwd_accumulate": "`steps.quad_sums` (each thread's columns in register order), "
                      "`numerics.fma_f32`; `tensorcore.mma` with acc as its accumulator",
    "fwd_finish": "fp32 adds in the butterfly's order; 1 / l in float64 rounded once "
                  "(= `rcp.rn`); `mufu.lg2_approx_ftz`, then one fp32 add",
    "delta": "`steps.delta` (pairwise)",
    "qk": "`tensorcore.mma`",
    "softmax_p": "`numerics.fma_f32` (-LSE2 by a sign flip), then `mufu.ex2_approx_ftz`; a "
                 "select",
    "dv_step": "`tensorcore.mma` with dV_j as its accumulator",
    "dp": "`tensorcore.mma`",
    "ds": "one fp32 subtraction, one multiplication",
    "dk_step": "`tensorcore.mma` with dK_j as its accumulator",
    "dq_partial": "`tensorcore.mma`",
    "dq_add": "`numerics.fp32_add_rne` (subnormals kept), in `emulate.replay`'s dQ order",
    "gqa_sum": "`steps.gqa_sum`",
    "epilogue": "`steps.epilogue`",
}

CONTRACT: dict[str, Instruction] = {name: replace(instruction, cpu=CPU[name])
                                    for name, instruction in _INSTRUCTIONS.items()}
