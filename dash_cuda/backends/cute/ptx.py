"""The instructions the CuTe kernels' arithmetic contract names, as inline PTX.

Written as PTX so that the instruction is the one the contract table states (no
contraction or substitution by the compiler); each helper names its contract step.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


def _f32_asm(asm: str, operands, loc, ip) -> Float32:
    """The fp32 result ``$0`` of a pure PTX block over fp32 operands ``$1 ...``."""
    return Float32(llvm.inline_asm(
        Float32.mlir_type, [Float32(x).ir_value(loc=loc, ip=ip) for x in operands],
        asm, "=f" + ",f" * len(operands), has_side_effects=False, is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    ))


def _void_asm(asm: str, constraints: str, operands, loc, ip) -> None:
    """A PTX block with side effects and no result over ``operands`` (MLIR values)."""
    llvm.inline_asm(None, operands, asm, constraints, has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


# -- forward ------------------------------------------------------------------------------------
@dsl_user_op
def scale_max(m: Float32, scale_log2: Float32, *, loc=None, ip=None) -> Float32:
    """[fwd_max] a row's maximum raw score times ``scale_log2``: one mul.rn.f32.

    Rounding is monotone, so for ``scale_log2 > 0`` this is the maximum of the rounded
    scaled scores, the contract's ``rowmax(s)``, with one multiply per row instead of one
    per score.
    """
    return _f32_asm("mul.rn.f32 $0, $1, $2;", (m, scale_log2), loc, ip)


@dsl_user_op
def exp2_minus(x: Float32, m: Float32, *, loc=None, ip=None) -> Float32:
    """[fwd_probs] ``alpha = exp2(m - m')``: sub.rn.f32, then ex2.approx.ftz.f32."""
    return _f32_asm("{ .reg .f32 t; sub.rn.f32 t, $1, $2; ex2.approx.ftz.f32 $0, t; }",
                    (x, m), loc, ip)


@dsl_user_op
def exp2_scaled_minus(s: Float32, scale_log2: Float32, neg_m: Float32, *, loc=None, ip=None
                      ) -> Float32:
    """[fwd_scores] + [fwd_probs] ``P = exp2(S * scale_log2 - m)`` of a raw score: one
    fma.rn.f32 (the product is not rounded on its own), then ex2.approx.ftz.f32."""
    return _f32_asm("{ .reg .f32 x; fma.rn.f32 x, $1, $2, $3; ex2.approx.ftz.f32 $0, x; }",
                    (s, scale_log2, neg_m), loc, ip)


@dsl_user_op
def rescaled_sum(ell: Float32, alpha: Float32, psum: Float32, *, loc=None, ip=None
                 ) -> Float32:
    """[fwd_accumulate] ``l * alpha + psum``: one fma.rn.f32."""
    return _f32_asm("fma.rn.f32 $0, $1, $2, $3;", (ell, alpha, psum), loc, ip)


@dsl_user_op
def reciprocal(x: Float32, *, loc=None, ip=None) -> Float32:
    """[fwd_finish] ``1 / l`` correctly rounded: rcp.rn.f32, once per row (not per element)."""
    return _f32_asm("rcp.rn.f32 $0, $1;", (x,), loc, ip)


@dsl_user_op
def lse2_of(m: Float32, ell: Float32, *, loc=None, ip=None) -> Float32:
    """[fwd_finish] ``m + log2(l)``: lg2.approx.ftz.f32, then add.rn.f32."""
    return _f32_asm("{ .reg .f32 t; lg2.approx.ftz.f32 t, $2; add.rn.f32 $0, $1, t; }",
                    (m, ell), loc, ip)


# -- softcap (both passes) ----------------------------------------------------------------------
@dsl_user_op
def softcap_ratio(x: Float32, k: Float32, *, loc=None, ip=None) -> Float32:
    """[softcap] ``r = 1 / (1 + ex2(x * k)) = ex2(-lg2(1 + ex2(x * k)))`` of a raw score
    (``k = fp32(2 scale log2(e) / softcap)``): mul.rn.f32, ex2.approx.ftz.f32, add.rn.f32
    of 1, lg2.approx.ftz.f32, neg.f32, ex2.approx.ftz.f32. Three MUFU operations the fast
    arithmetic models bit for bit, and no branch: ``rcp.rn.f32`` calls a slow-path
    subroutine per element, and 32 calls in the backward's visit spilled registers."""
    return _f32_asm("{ .reg .f32 u, e, w, l; mul.rn.f32 u, $1, $2; ex2.approx.ftz.f32 e, u; "
                    "add.rn.f32 w, e, 0f3F800000; lg2.approx.ftz.f32 l, w; neg.f32 l, l; "
                    "ex2.approx.ftz.f32 $0, l; }", (x, k), loc, ip)


@dsl_user_op
def capped_score(r: Float32, neg_two_cap: Float32, cap: Float32, *, loc=None, ip=None
                 ) -> Float32:
    """[softcap] ``S' = softcap (1 - 2 r) = softcap tanh(x scale / softcap)``: one fma.rn.f32."""
    return _f32_asm("fma.rn.f32 $0, $1, $2, $3;", (r, neg_two_cap, cap), loc, ip)


@dsl_user_op
def softcap_slope(p: Float32, r: Float32, *, loc=None, ip=None) -> Float32:
    """[softcap_grad] ``P (1 - tanh^2) = P * 4 r (1 - r)``: neg.f32 and fma.rn.f32 for
    ``r - r r``, mul.rn.f32 by 4 (exact), mul.rn.f32 by ``P``."""
    return _f32_asm("{ .reg .f32 n, h; neg.f32 n, $2; fma.rn.f32 h, n, $2, $2; "
                    "mul.rn.f32 h, h, 0f40800000; mul.rn.f32 $0, $1, h; }", (p, r), loc, ip)


# -- backward -----------------------------------------------------------------------------------
@dsl_user_op
def softmax_p(s: Float32, scale_log2: Float32, neg_lse2: Float32, *, loc=None, ip=None
              ) -> Float32:
    """[softmax_p] ``exp2(S * scale_log2 - LSE2)``: one fma.rn.f32, then ex2.approx.ftz.f32."""
    return _f32_asm("{ .reg .f32 x; fma.rn.f32 x, $1, $2, $3; ex2.approx.ftz.f32 $0, x; }",
                    (s, scale_log2, neg_lse2), loc, ip)


@dsl_user_op
def ds_value(p: Float32, dp: Float32, delta: Float32, *, loc=None, ip=None) -> Float32:
    """[ds] ``P * (dP - D)``: a subtraction then a multiplication, each rounded (never an fma)."""
    return _f32_asm("{ .reg .f32 x; sub.rn.f32 x, $2, $3; mul.rn.f32 $0, $1, x; }",
                    (p, dp, delta), loc, ip)


@dsl_user_op
def bulk_load_1d(dst_smem: cute.Pointer, src_gmem: cute.Pointer, mbar: cute.Pointer,
                 num_bytes: int, *, loc=None, ip=None) -> None:
    """1-D bulk copy global -> shared that completes ``num_bytes`` transactions on ``mbar``."""
    _void_asm(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $3, [$2];",
        "r,l,r,r",
        [dst_smem.toint(loc=loc, ip=ip).ir_value(), src_gmem.llvm_ptr,
         mbar.toint(loc=loc, ip=ip).ir_value(), Int32(num_bytes).ir_value(loc=loc, ip=ip)],
        loc, ip)


def _bulk_operands(dst_gmem: cute.Pointer, src_smem: cute.Pointer, num_bytes: int, loc, ip
                   ) -> list:
    """``[$0] = dst_gmem, [$1] = src_smem, $2 = num_bytes`` of a 1-D bulk copy to global."""
    return [dst_gmem.llvm_ptr, src_smem.toint(loc=loc, ip=ip).ir_value(),
            Int32(num_bytes).ir_value(loc=loc, ip=ip)]


@dsl_user_op
def bulk_reduce_add_f32(dst_gmem: cute.Pointer, src_smem: cute.Pointer, num_bytes: int, *,
                        loc=None, ip=None) -> None:
    """[dq_add] ``dst += src`` elementwise in fp32, performed by the TMA unit at L2.

    SASS: UBLKRED.G.S.ADD.F32.RN. Measured on an H200: round-to-nearest-even, subnormal
    inputs and results kept (``dash_ref.emulate.replay(..., flush_subnormals=False)``).
    """
    _void_asm("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], $2;",
              "l,r,r", _bulk_operands(dst_gmem, src_smem, num_bytes, loc, ip), loc, ip)


@dsl_user_op
def red_add_f32(dst_gmem: cute.Pointer, value: Float32, *, loc=None, ip=None) -> None:
    """``*dst_gmem += value``: one scalar ``red.global.add.f32``, the instruction of the Triton
    backend's dQ hand-off (for the crafted-partials measurement of its arithmetic)."""
    _void_asm("red.global.add.f32 [$0], $1;", "l,f",
              [dst_gmem.llvm_ptr, Float32(value).ir_value(loc=loc, ip=ip)], loc, ip)


@dsl_user_op
def bulk_store_1d(dst_gmem: cute.Pointer, src_smem: cute.Pointer, num_bytes: int, *,
                  loc=None, ip=None) -> None:
    """Audit: copy a staged partial to global memory as it is (1-D bulk store)."""
    _void_asm("cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;",
              "l,r,r", _bulk_operands(dst_gmem, src_smem, num_bytes, loc, ip), loc, ip)


@dsl_user_op
def sm_clock(*, loc=None, ip=None) -> Int32:
    """The SM's 32-bit cycle counter (``%clock``), for the timing probe."""
    return Int32(llvm.inline_asm(
        Int32.mlir_type, [], "mov.u32 $0, %clock;", "=r", has_side_effects=True,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    ))


@dsl_user_op
def cvt_pack(lo: Float32, hi: Float32, kind: str, *, loc=None, ip=None) -> Int32:
    """``rnd`` of two fp32 values into one 32-bit register (``lo`` in the low half, the lower
    element address): one ``cvt.rn.{kind}x2.f32``, ``kind`` ``"bf16"`` or ``"f16"``.

    Used for dS^T, which is read twice (copied to shared memory, then an MMA's register A
    operand after a branch): converted by the compiler, the pair was converted again after
    the branch, keeping the fp32 values live in between (then ptxas serialized every wgmma).
    """
    return Int32(llvm.inline_asm(
        Int32.mlir_type,
        [Float32(lo).ir_value(loc=loc, ip=ip), Float32(hi).ir_value(loc=loc, ip=ip)],
        f"cvt.rn.{kind}x2.f32 $0, $2, $1;", "=r,f,f", has_side_effects=False,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
    ))
