"""Which sm_90 instruction each step of the arithmetic contract becomes in the Triton kernels.

One entry per step of :data:`dash_ref.arithmetic.steps.STEPS` (the function of the same name
mirrors it on the CPU), for each of the kernels' two arithmetics: ``fast`` (the default)
and ``exact`` (``exact=True``, reproduced bit for bit by ``Arithmetic`` ``EXACT``). Read off
the PTX and SASS that Triton 3.6 emits (``python -m dash_cuda.backends.triton.inspect_asm``
prints the counts again; ``tests/test_exact_asm.py`` pins the facts the ``exact`` column
rests on). ``docs/design.md`` renders this table beside the steps.

Inputs ``Q, K, V, O, dO`` are bf16/fp16; every other value is fp32. The forward is not
reproduced bit for bit on the CPU: its column says how it differs from the IEEE steps.
"""

from __future__ import annotations

from dash_cuda.backends import SHARED_STEPS, Instruction

BACKEND = "triton"

CONTRACT: dict[str, Instruction] = {
    "scale_log2": Instruction("host: the float64 product rounded to fp32 (Triton passes "
                              "float arguments as fp32)"),
    "round_operand": Instruction("`cvt.rn.bf16x2.f32` / `cvt.rn.f16x2.f32` (F2FP ... PACK)"),
    # -- forward (fwd_kernel) --------------------------------------------------------------
    "fwd_scores": Instruction("`wgmma` (HGMMA), then `mul.f32` by c; masked: select -inf"),
    "fwd_max": Instruction("`max.f32` per thread, then a shuffle tree (order immaterial: "
                           "max is exact)"),
    "fwd_probs": Instruction("`sub.f32` then `ex2.approx.ftz.f32` (MUFU.EX2): approximate, "
                             "subnormals flushed"),
    "fwd_accumulate": Instruction("row sum by `tl.sum` (per-thread adds, then a shuffle "
                                  "tree); `l * alpha + sum` may contract to FFMA; acc * alpha "
                                  "then HGMMA with acc as its accumulator"),
    "fwd_finish": Instruction("`div.full.f32` (approximate division), `lg2.approx.f32`, "
                              "`add.f32`; rows with l = 0 selected to O = 0, LSE2 = -inf"),
    # -- backward ----------------------------------------------------------------------------
    "qk": Instruction("`wgmma.mma_async ... f32.bf16.bf16` (HGMMA), fresh accumulator, "
                      "computed as S^T = K_j Q_i^T"),
    "softmax_p": Instruction(
        fast="`fma.rn.f32` (FFMA: product and difference rounded once) then "
             "`ex2.approx.ftz.f32` (MUFU.EX2: approximate, subnormals flushed); masked: "
             "select 0",
        exact="`sub.rn.f32` (0 - LSE2), `fma.rn.f32`, then exp2_fma: `max`/`min`, "
              "`cvt.rni`, `sub.f32`, seven `fma.rn.f32`, integer scaling; no `.ftz`; "
              "masked: select 0"),
    "dv_step": Instruction("HGMMA with dV_j as its accumulator (k = BM)"),
    "dp": Instruction("HGMMA, fresh accumulator, computed as dP^T = V_j dO_i^T (k = d)"),
    "ds": Instruction("`sub.f32` then `mul.f32` (FADD, FMUL: no contraction is possible)"),
    "dk_step": Instruction("HGMMA with dK_j as its accumulator (k = BM)"),
    "dq_partial": Instruction("HGMMA, fresh accumulator (k = BN), then an opaque `mov.b32` so "
                              "that Triton cannot fold the dQ add into the MMA"),
    "dq_add": Instruction("`red.global.add.f32` (REDG.E.ADD.F32.FTZ.RN: RNE, subnormal "
                          "inputs and results flushed), performed at the L2 cache, under the "
                          "tile's semaphore in rank order (atomic peer: the same, in arrival "
                          "order); dQacc starts as +0 (stored by the `delta` launch)"),
    **SHARED_STEPS,
    "epilogue": Instruction("`mul.f32` then `cvt.rn` (dQ in `dash_dq_kernel`; dK, dV in the "
                            "backward kernel with one query head per KV head, else in "
                            "`dash_gqa_kernel`)"),
}
