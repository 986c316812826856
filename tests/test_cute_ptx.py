"""The CuTe kernels' PTX, compiled for sm_90a on this machine: the contract's instructions.

Skipped where ``nvidia-cutlass-dsl`` is not installed. Compiling needs no GPU; each variant
takes a second or two, so a few representative ones run here and
``python -m dash_cuda.backends.cute.inspect_ptx`` checks all of them.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

pytest.importorskip("cutlass")

from dash_cuda.backends.cute import inspect_ptx  # noqa: E402
from dash_cuda.backends.cute.config import forward_config  # noqa: E402
from dash_cuda.backends.cute.variants import (  # noqa: E402
    ForwardVariant,
    backward_variant,
    shipped_variants,
)


def forward_variant(dtype, head_dim, mask, block_m, packed=False, sinks=False, softcap=False,
                    head_dim_v=None):
    tiling = "causal" if mask == "window" else mask  # any tiling: block_m picks the config
    config = forward_config(head_dim, tiling, 1, dtype, block_m, head_dim_v)
    return ForwardVariant(dtype, head_dim, mask, config, packed, sinks, softcap, head_dim_v)


# a few of the shipped variants (the module's main compiles every one)
VARIANTS = [
    backward_variant(torch.bfloat16, 64, "causal", True, audit=False, per_head=False),
    backward_variant(torch.float16, 128, "full", True, audit=True, per_head=True),
    backward_variant(torch.bfloat16, 128, "causal", False, audit=False, per_head=False),
    forward_variant(torch.bfloat16, 64, "causal", 192),
    forward_variant(torch.bfloat16, 64, "causal", 128),
    forward_variant(torch.float16, 128, "full", 128),
    backward_variant(torch.float16, 64, "window", True, audit=False, per_head=True),
    forward_variant(torch.bfloat16, 64, "window", 192),
    forward_variant(torch.float16, 128, "window", 128),
    # packed batches (cu_seqlens): O and LSE2 by predicated stores, the offsets read
    forward_variant(torch.bfloat16, 64, "causal", 192, packed=True),
    forward_variant(torch.float16, 128, "full", 128, packed=True),
    # packed backwards: dK/dV by predicated register stores, offset loads; rounded outputs,
    # and the per-head scratch with audit
    backward_variant(torch.bfloat16, 64, "causal", True, audit=False, per_head=False,
                     packed=True),
    backward_variant(torch.float16, 128, "full", True, audit=True, per_head=True, packed=True),
    # d = 96: 64-byte swizzle atoms, and 32-byte ones for K and V (dQ's column halves)
    backward_variant(torch.bfloat16, 96, "causal", True, audit=False, per_head=False),
    forward_variant(torch.bfloat16, 96, "causal", 128),
    # learnable sinks: folded into each row after its last KV tile
    forward_variant(torch.bfloat16, 64, "causal", 192, sinks=True),
    forward_variant(torch.float16, 128, "window", 128, packed=True, sinks=True),
    # a softcap: every raw score capped before the mask; the backward recomputes the cap
    # and scales P by its slope before [ds]
    forward_variant(torch.bfloat16, 128, "causal", 128, softcap=True),
    backward_variant(torch.bfloat16, 128, "causal", True, audit=False, per_head=False,
                     softcap=True),
    backward_variant(torch.float16, 128, "full", True, audit=True, per_head=True,
                     softcap=True),
    # wide head dims: the backward's warpgroups split the head dims (P^T and dS^T through
    # shared memory, dK and dV out through sK and sV), d_v < d; the forward's KV tiles of 64
    backward_variant(torch.bfloat16, 256, "causal", True, audit=False, per_head=False),
    backward_variant(torch.bfloat16, 192, "full", True, audit=False, per_head=False,
                     head_dim_v=128),
    backward_variant(torch.bfloat16, 192, "full", True, audit=False, per_head=False,
                     packed=True, head_dim_v=128),
    backward_variant(torch.float16, 256, "window", True, audit=True, per_head=True),
    backward_variant(torch.bfloat16, 256, "causal", True, audit=False, per_head=False,
                     softcap=True),
    forward_variant(torch.bfloat16, 256, "causal", 128),
    forward_variant(torch.bfloat16, 192, "full", 128, head_dim_v=128),
    forward_variant(torch.bfloat16, 192, "full", 128, packed=True, head_dim_v=128),
]


def test_the_sampled_variants_are_shipped():
    """Every variant these tests compile is one warm-up exports and a call can run."""
    assert set(VARIANTS) <= set(shipped_variants())


BACKWARD, FORWARD = VARIANTS[0], VARIANTS[3]
PACKED_FORWARDS = [v for v in VARIANTS if v.packed and isinstance(v, ForwardVariant)]
PACKED_BACKWARDS = [v for v in VARIANTS if v.packed and not isinstance(v, ForwardVariant)]


@pytest.fixture(scope="module")
def ptx_of(tmp_path_factory):
    """The PTX of a variant, compiled once for the whole module."""
    folder = tmp_path_factory.mktemp("ptx")
    done: dict = {}

    def get(v):
        if v not in done:
            done[v] = inspect_ptx.compile_ptx(v, str(folder / v.name))[1]
        return done[v]

    return get


def sass_or_skip(ptx: str) -> str:
    try:
        return inspect_ptx.assemble_sass(ptx)
    except inspect_ptx.SassUnavailable as e:
        pytest.skip(f"SASS check not run: {e}")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_every_contract_step_is_the_named_instruction(variant, ptx_of):
    assert inspect_ptx.check_ptx(ptx_of(variant), variant) == []


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_the_only_approximate_instructions_are_the_modelled_ones(variant, ptx_of):
    """Backward: ``ex2.approx.ftz.f32`` only; forward: also ``lg2.approx.ftz.f32``: the ones
    :mod:`dash_ref.arithmetic.mufu` reproduces bit for bit; no other ``.approx`` or ``.ftz``."""
    assert inspect_ptx.check_approx_ptx(ptx_of(variant), variant) == []


@pytest.mark.parametrize("variant", [BACKWARD, VARIANTS[2], FORWARD, VARIANTS[5]],
                         ids=lambda v: v.name)
def test_each_ex2_and_lg2_is_a_bare_mufu_in_the_sass(variant, ptx_of):
    ptx = ptx_of(variant)
    assert inspect_ptx.check_sass(ptx, sass_or_skip(ptx)) == []


def inject(ptx: str, stmt: str) -> str:
    """``ptx`` with one more instruction before its first ``ret``."""
    assert "\tret;" in ptx
    return ptx.replace("\tret;", f"\t{stmt}\n\tret;", 1)


CONTROLS = [
    (BACKWARD, "ex2.approx.f32 %f1, %f2;", "ex2.approx.f32"),
    (FORWARD, "ex2.approx.f32 %f1, %f2;", "ex2.approx.f32"),
    (FORWARD, "lg2.approx.f32 %f1, %f2;", "lg2.approx.f32"),
    (BACKWARD, "lg2.approx.ftz.f32 %f1, %f2;", "lg2.approx.ftz.f32"),
    (BACKWARD, "rcp.approx.ftz.f32 %f1, %f2;", "rcp.approx.ftz.f32"),
    (FORWARD, "@%p1 add.ftz.f32 %f1, %f2, %f3;", "add.ftz.f32"),
    (BACKWARD, "fma.rn.ftz.f32 %f1, %f2, %f3, %f4;", "fma.rn.ftz.f32"),
    (FORWARD, "div.full.f32 %f1, %f2, %f3;", "div.full.f32"),
    (FORWARD, "rcp.f32 %f1, %f2;", "rcp.f32"),
    (BACKWARD, "{ tanh.approx.f32 %f1, %f2; }", "tanh.approx.f32"),
]


@pytest.mark.parametrize("variant, stmt, op", CONTROLS,
                         ids=[f"{v.name[5:8]}-{op}" for v, _, op in CONTROLS])
def test_the_approximate_instruction_checks_can_fail(variant, stmt, op, ptx_of):
    """The compiled kernel with one instruction more is refused, for that instruction."""
    failures = inspect_ptx.check_approx_ptx(inject(ptx_of(variant), stmt), variant)
    assert len(failures) == 1 and failures[0].startswith(f"{op} (1x)"), failures


def test_a_kernel_without_ftz_exp2_is_refused(ptx_of):
    ptx = ptx_of(FORWARD).replace("ex2.approx.ftz.f32", "ex2.approx.f32")
    failures = inspect_ptx.check_approx_ptx(ptx, FORWARD)
    assert any(f.startswith("ex2.approx.f32 (198x)") for f in failures)
    assert "no ex2.approx.ftz.f32: the contract names it" in failures
    assert inspect_ptx.check_approx_ptx(inject(ptx_of(FORWARD), "rcp.rn.f32 %f1, %f2;"),
                                        FORWARD) == []


# ptxas (CUDA 12.8, sm_90a) on one ld.global.f32 -> ex2.approx.f32 -> st.global.f32 kernel:
# the non-ftz ex2 keeps subnormals by scaling around the MUFU
NON_FTZ_EX2_SASS = """
        /*0030*/                   LDG.E R0, desc[UR4][R2.64] ;   /* 0x0000000402007981 */
        /*0040*/                   FSETP.GEU.AND P0, PT, R0, -126, PT ;   /* 0x... */
        /*0050*/              @!P0 FMUL R0, R0, 0.5 ;   /* 0x... */
        /*0060*/                   MUFU.EX2 R5, R0 ;   /* 0x... */
        /*0070*/              @!P0 FMUL R5, R5, R5 ;   /* 0x... */
        /*0080*/                   STG.E desc[UR4][R2.64], R5 ;   /* 0x... */
        /*0090*/                   EXIT ;   /* 0x... */
"""
FTZ_EX2_PTX = ".target sm_90a\nex2.approx.ftz.f32 %f2, %f1;\n"


def bare(sass: str) -> str:
    return "\n".join(line for line in sass.splitlines() if "P0" not in line)


def test_a_mufu_wrapped_by_the_non_ftz_scaling_is_refused():
    failures = inspect_ptx.check_sass(FTZ_EX2_PTX, NON_FTZ_EX2_SASS)
    assert any("1 MUFU.EX2 wrapped by range-scaling" in f for f in failures), failures
    assert any("FSETP range test" in f for f in failures), failures
    assert inspect_ptx.check_sass(FTZ_EX2_PTX, bare(NON_FTZ_EX2_SASS)) == []
    # the scaling alone, without the range test, scheduled apart from the MUFU
    apart = NON_FTZ_EX2_SASS.replace("FSETP.GEU.AND P0, PT, R0, -126, PT", "IADD3 R7, R8, R9, RZ")
    apart = apart.replace("MUFU.EX2 R5, R0 ;", "MUFU.EX2 R5, R0 ;\n /*0061*/ FADD R9, R8, R7 ;")
    failures = inspect_ptx.check_sass(FTZ_EX2_PTX, apart)
    assert failures == ["1 MUFU.EX2 wrapped by range-scaling FMUL/FADD: the non-ftz form, not "
                        "the bare MUFU of the .ftz one"]
    for half in ("@!P0 FMUL R0, R0, 0.5 ;", "@!P0 FMUL R5, R5, R5 ;"):  # either side will do
        assert inspect_ptx.check_sass(FTZ_EX2_PTX, apart.replace(half, "NOP ;")) == failures


def test_the_mufu_counts_and_kinds_are_checked():
    sass = bare(NON_FTZ_EX2_SASS)
    two = FTZ_EX2_PTX + "ex2.approx.ftz.f32 %f3, %f1;\n"
    assert inspect_ptx.check_sass(two, sass) == ["1 MUFU.EX2 in the SASS, 2 ex2.approx.ftz.f32 "
                                                 "in the PTX"]
    lg2 = sass.replace("MUFU.EX2", "MUFU.LG2")
    assert inspect_ptx.check_sass(FTZ_EX2_PTX, lg2) == [
        "0 MUFU.EX2 in the SASS, 1 ex2.approx.ftz.f32 in the PTX",
        "1 MUFU.LG2 in the SASS, 0 lg2.approx.ftz.f32 in the PTX"]
    for other in ("MUFU.RSQ R6, R0 ;", "MUFU.TANH R6, R0 ;", "MUFU.EX2.F16 R6, R0 ;",
                  "MUFU.EX2 R6, |R0| ;", "MUFU.LG2 R6, -R0 ;", "MUFU.EX2 -R6, R0 ;"):
        failures = inspect_ptx.check_sass(FTZ_EX2_PTX + "ex2.approx.ftz.f32 %f3, %f1;\n",
                                          sass.replace("EXIT ;", other + "\n /*00a0*/ EXIT ;"))
        assert failures and other.rstrip(" ;") in failures[0], (other, failures)
    # a neg.f32 that ptxas folded into an ex2's source: the bare instruction of -x
    folded = sass.replace("EXIT ;", "MUFU.EX2 R6, -R0 ;\n /*00a0*/ EXIT ;")
    assert inspect_ptx.check_sass(FTZ_EX2_PTX + "ex2.approx.ftz.f32 %f3, %f1;\n", folded) == []
    # MUFU.RCP only as the start of a correctly rounded rcp.rn.f32 or of an integer division
    rcp = sass.replace("EXIT ;", "MUFU.RCP R6, R0 ;\n /*00a0*/ EXIT ;")
    assert inspect_ptx.check_sass(FTZ_EX2_PTX, rcp)
    assert inspect_ptx.check_sass(FTZ_EX2_PTX + "div.s32 %r1, %r2, %r3;\n", rcp) == []
    assert inspect_ptx.check_sass(FTZ_EX2_PTX + "rcp.rn.f32 %f4, %f1;\n", rcp) == []
    assert inspect_ptx.check_sass(FTZ_EX2_PTX, "") == ["no SASS instructions in the listing"]


def tiny_kernel(op: str) -> str:
    return f""".version 8.7
.target sm_90a
.address_size 64
.visible .entry k(.param .u64 p)
{{
  .reg .b64 %rd<3>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd2, %rd1;
  ld.global.f32 %f1, [%rd2];
  {op} %f2, %f1;
  st.global.f32 [%rd2], %f2;
  ret;
}}
"""


@pytest.mark.parametrize("fn", ["ex2", "lg2"])
def test_ptxas_wraps_the_non_ftz_forms_and_the_check_sees_it(fn):
    """What ptxas itself emits: ``.ftz`` a bare MUFU, passed; without it the MUFU between
    the range-scaling instructions, refused."""
    unit = f"MUFU.{fn.upper()}"
    ftz = sass_or_skip(tiny_kernel(f"{fn}.approx.ftz.f32"))
    assert inspect_ptx.check_sass(tiny_kernel(f"{fn}.approx.ftz.f32"), ftz) == []
    plain_ptx = tiny_kernel(f"{fn}.approx.f32")
    failures = inspect_ptx.check_sass(plain_ptx, sass_or_skip(plain_ptx))
    assert f"1 {unit} wrapped by range-scaling FMUL/FADD: the non-ftz form, not the bare " \
           "MUFU of the .ftz one" in failures
    assert any("FSETP range test" in f for f in failures)


def test_a_compiled_kernel_without_ftz_is_refused_in_the_sass(ptx_of):
    """The forward kernel's own PTX with every ``.ftz`` of ex2 and lg2 dropped: ptxas wraps
    every MUFU, scheduled among the kernel's other instructions, and the check finds each."""
    ptx = ptx_of(FORWARD)
    plain = ptx.replace("ex2.approx.ftz.f32", "ex2.approx.f32").replace("lg2.approx.ftz.f32",
                                                                        "lg2.approx.f32")
    failures = inspect_ptx.check_sass(ptx, sass_or_skip(plain))
    n_ex2, n_lg2 = ptx.count("ex2.approx.ftz.f32"), ptx.count("lg2.approx.ftz.f32")
    assert f"{n_ex2} MUFU.EX2 wrapped by range-scaling FMUL/FADD: the non-ftz form, not the " \
           "bare MUFU of the .ftz one" in failures
    assert f"{n_lg2} MUFU.LG2 wrapped by range-scaling FMUL/FADD: the non-ftz form, not the " \
           "bare MUFU of the .ftz one" in failures


def test_the_sass_check_is_skipped_with_a_reason_without_ptxas(monkeypatch):
    monkeypatch.setattr(inspect_ptx, "sass_tools", lambda: ([], ["/bin/cuobjdump"]))
    with pytest.raises(inspect_ptx.SassUnavailable, match="ptxas not found"):
        inspect_ptx.check_mufu_sass(FTZ_EX2_PTX)


def test_the_main_runs_the_approximate_instruction_checks(monkeypatch, ptx_of, tmp_path,
                                                          capsys):
    """``python -m dash_cuda.backends.cute.inspect_ptx`` refuses a kernel with an ``.ftz``
    add (here a compiled backward with one more instruction) and says why; where the SASS
    checks cannot run it says so."""
    import sys

    ptx = inject(ptx_of(BACKWARD), "add.ftz.f32 %f1, %f2, %f3;")
    monkeypatch.setattr(inspect_ptx, "all_variants", lambda quick=False, head_dims=None: [BACKWARD])
    monkeypatch.setattr(inspect_ptx, "check_staging_layout", lambda: [])
    monkeypatch.setattr(inspect_ptx, "compile_ptx", lambda v, folder: (None, ptx, "-", 0.0))
    monkeypatch.setattr(inspect_ptx, "ptxas_report", lambda path: "ptxas not run")

    def no_sass(_ptx):
        raise inspect_ptx.SassUnavailable("not in this test")

    monkeypatch.setattr(inspect_ptx, "assemble_sass", no_sass)
    monkeypatch.setattr(sys, "argv", ["inspect_ptx", "--out", str(tmp_path)])
    assert inspect_ptx.main() == 1
    out = capsys.readouterr().out
    assert "add.ftz.f32 (1x): flushes subnormals (.ftz); add/sub/mul/fma/max/min must keep " \
           "them" in out
    assert "SASS checks (bare MUFU.EX2 / MUFU.LG2) SKIPPED: not in this test" in out


def test_the_forward_checks_can_fail():
    """A forward whose exp2 is fed by a contracted fma is refused."""
    v = VARIANTS[3]
    ptx = ".target sm_90a\n" + "fma.rn.f32 %f1, %f2, %f3, %f4;\nex2.approx.ftz.f32 %f5, %f1;\n"
    failures = inspect_ptx.check_ptx(ptx * 66, v)
    assert any("ex2" in f for f in failures)
    assert any("wgmma" in f for f in failures)


def test_the_mask_select_checks_tell_the_kinds_apart(ptx_of):
    """A forward's mask selects count its bounds: the window's PTX checked as a causal
    kernel (one bound too many) and a causal one checked as a window (one too few) are
    refused, and likewise a full forward as causal; the backward's the same way."""
    window, causal, full = VARIANTS[7], VARIANTS[3], VARIANTS[5]
    as_causal = replace(window, mask="causal")
    assert inspect_ptx.check_forward_mask(ptx_of(window), window) == []
    assert "per score, expected 2" in inspect_ptx.check_forward_mask(ptx_of(window),
                                                                   as_causal)[0]
    assert "per score, expected 3" in inspect_ptx.check_forward_mask(
        ptx_of(causal), replace(causal, mask="window"))[0]
    assert "1 per score, expected 2" in inspect_ptx.check_forward_mask(
        ptx_of(full), replace(full, mask="causal"))[0]
    bwd = VARIANTS[6]
    failures = inspect_ptx.check_ptx(ptx_of(bwd), replace(bwd, mask="causal"))
    assert len(failures) == 1 and "mask selects" in failures[0], failures
    failures = inspect_ptx.check_ptx(ptx_of(BACKWARD), replace(BACKWARD, mask="window"))
    assert len(failures) == 1 and "mask selects" in failures[0], failures


def test_the_checks_can_fail():
    """A PTX that misses the ordered hand-off is refused (the checks are not vacuous)."""
    v = VARIANTS[0]
    ptx = ".target sm_90a\nex2.approx.ftz.f32 %f1, %f2;\n"
    failures = inspect_ptx.check_ptx(ptx, v)
    assert any("cp.reduce.async.bulk" in f for f in failures)
    assert any("ld.acquire.gpu" in f for f in failures)
    assert any("mask selects" in f for f in failures)


def test_the_launch_register_count_is_checked_against_ptxas():
    backward, forward = VARIANTS[0], VARIANTS[3]
    assert inspect_ptx.check_launch_registers("regs=168 spill_st=0 spill_ld=0", backward) == []
    assert inspect_ptx.check_launch_registers("regs=176 spill_st=0 spill_ld=0", backward)
    assert inspect_ptx.check_launch_registers("ptxas not found", backward) == []
    assert inspect_ptx.check_launch_registers("regs=128 spill_st=0 spill_ld=0", forward) == []


def test_the_staged_dq_tile_order_is_the_mmas_own():
    """Also with the dQ MMA on one warpgroup: the staged tile, and so dQacc, is the same."""
    assert inspect_ptx.check_staging_layout() == []


@pytest.mark.parametrize("head_dim", [64, 192])
def test_the_dq_partial_on_one_warpgroup_needs_64_row_tiles_split_by_keys(head_dim):
    v = backward_variant(torch.bfloat16, head_dim, "full", True, audit=False, per_head=False)
    one = replace(v, config=replace(v.config, dq_one_warpgroup=True))
    with pytest.raises(ValueError, match="one warpgroup needs BM = 64 and keys split"):
        one.kernel_object()


def test_a_math_trace_per_warpgroup_role_needs_the_partial_on_one():
    v = backward_variant(torch.bfloat16, 128, "full", True, audit=False, per_head=False)
    roles = replace(v, config=replace(v.config, math_per_role=True))
    with pytest.raises(ValueError, match="per warpgroup role needs the dQ partial on one"):
        roles.kernel_object()


def test_a_math_trace_per_warpgroup_role_holds_every_step_twice_and_the_partial_once(ptx_of):
    """d = 96 with ``math_per_role``: each trace its own S, dP, dV and dK MMAs, exponentials,
    selects, [ds] and dK/dV stores; the partial's MMA in the holder's trace alone."""
    v = backward_variant(torch.bfloat16, 96, "causal", True, audit=False, per_head=False)
    roles = replace(v, config=replace(v.config, math_per_role=True))
    assert inspect_ptx.math_traces(roles) == 2 and inspect_ptx.math_traces(v) == 1
    ptx = ptx_of(roles)
    assert inspect_ptx.check_ptx(ptx, roles) == []
    assert inspect_ptx.check_approx_ptx(ptx, roles) == []
    # counted as one trace, the same PTX is refused
    assert any("wgmma" in f for f in inspect_ptx.check_ptx(ptx, v))


def spills_or_skip(ptx: str, folder) -> int:
    """The bytes of spill stores ``ptxas -v`` reports for ``ptx`` (skipped without a ptxas
    on PATH that takes it)."""
    folder.mkdir()
    path = folder / "kernel.ptx"
    path.write_text(ptx)
    report = inspect_ptx.ptxas_report(str(path))
    if not report.startswith("regs="):
        pytest.skip(report)
    return int(report.split("spill_st=")[1].split()[0])


def test_a_math_trace_per_warpgroup_role_takes_d96s_spills_away(ptx_of, tmp_path):
    """Why ``math_per_role`` exists: with one trace for both of d = 96's warpgroups (the
    partial under a run-time ``wg == 0``) ptxas spills; with one trace per role, nothing."""
    v = backward_variant(torch.bfloat16, 96, "causal", True, audit=False, per_head=False)
    roles = replace(v, config=replace(v.config, math_per_role=True))
    assert spills_or_skip(ptx_of(v), tmp_path / "one") > 0
    assert spills_or_skip(ptx_of(roles), tmp_path / "roles") == 0


def test_the_forwards_o_chunks_are_runs_of_its_registers(monkeypatch):
    """A forward that stages O in column chunks (d = 256) stores chunk ``c`` from the c-th
    run of its registers; a chunk MMA as wide as the whole of d_v is refused."""
    from dash_cuda.backends.cute.fwd_kernel import DashForwardSm90

    assert forward_config(256, "causal", 4096).staged_o_cols(256) < 256  # a chunked one
    assert inspect_ptx.check_o_chunks() == []
    tiled = DashForwardSm90._tiled_mmas

    def whole_tile(self):  # the chunk MMA left at (64, d_v)
        cols, self.o_cols = self.o_cols, self.dv
        try:
            return tiled(self)
        finally:
            self.o_cols = cols

    monkeypatch.setattr(DashForwardSm90, "_tiled_mmas", whole_tile)
    assert any("d256" in f for f in inspect_ptx.check_o_chunks())


def test_only_the_probe_variant_reads_the_clock(tmp_path, ptx_of):
    """The timing probe is compiled in only where asked for, and then at every phase."""
    plain = VARIANTS[0]
    probe = replace(plain, probe=True)
    assert probe.name == plain.name.replace("_m128", "_probe_m128")
    ptx_plain = ptx_of(plain)
    _, ptx_probe, _, _ = inspect_ptx.compile_ptx(probe, str(tmp_path / "probe"))
    assert "%clock" not in ptx_plain
    # 6 visit and 4 chain stamps of the math thread, 2 of the dQ writer (deterministic)
    assert ptx_probe.count("%clock") == 12
    assert inspect_ptx.check_ptx(ptx_probe, probe) == []


def test_probe_and_audit_exclude_each_other():
    with pytest.raises(ValueError, match="partials"):
        backward_variant(torch.bfloat16, 64, "full", True, audit=True, per_head=True,
                         probe=True).kernel_object()


def test_every_forward_tile_height_the_rule_picks_is_compiled_ahead_of_time():
    """``forward_config`` only picks configurations that warm-up exports."""
    from dash_cuda.backends.cute.config import forward_configs, tiling_mask
    from dash_cuda.warmup import cute_variants
    from dash_ref import Mask

    exported = {(v.head_dim, v.mask, v.config) for v in cute_variants(["bf16"], [64, 128])
                if isinstance(v, ForwardVariant)}
    for d, mask in itertools.product((64, 128), ("full", "causal")):
        picked = {forward_config(d, mask, s) for s in (1, 100, 1024, 1025, 4096, 65536)}
        assert picked == set(forward_configs(d, mask))
        assert {(d, mask, c) for c in picked} <= exported
        # windows tile as either mask (causal where their right side is 0)
        for window in ((256, 0), (64, 64)):
            rule = Mask("window", *window)
            picked = {forward_config(d, tiling_mask(rule), s) for s in (100, 1025, 65536)}
            assert {(d, "window", c) for c in picked} <= exported


def test_variant_names_say_their_configuration():
    """Two variants that differ only in their configuration are two exported objects."""
    full = backward_variant(torch.bfloat16, 128, "full", True, audit=False, per_head=False)
    causal = backward_variant(torch.bfloat16, 128, "causal", True, audit=False, per_head=False)
    assert full.config.select_every_tile and not causal.config.select_every_tile
    assert full.name.endswith(full.config.name) and full.config.name != causal.config.name
    names = [v.name for v in shipped_variants()]
    assert len(names) == len(set(names))


def test_launch_arguments_are_the_entry_signatures():
    """``LAUNCH_ARGS`` (from which placeholders and a call's values are made) lists the host
    entry's parameters, in order, with a known kind each."""
    import inspect

    from dash_cuda.backends.cute import arguments, bwd_kernel, fwd_kernel

    for module, cls in ((bwd_kernel, bwd_kernel.DashBackwardSm90),
                        (fwd_kernel, fwd_kernel.DashForwardSm90)):
        params = list(inspect.signature(cls.__call__).parameters)[1:]
        assert list(arguments.names(module.LAUNCH_ARGS)) == params
        assert {kind for _, kind in module.LAUNCH_ARGS} <= set(arguments.KINDS)


def test_launch_values_refuse_a_missing_or_unknown_argument():
    from dash_cuda.backends.cute import arguments

    order = ("a", "b")
    assert arguments.values(order, {"b": 2, "a": 1}) == [1, 2]
    with pytest.raises(TypeError, match=r"missing \['b'\], unknown \['c'\]"):
        arguments.values(order, {"a": 1, "c": 3})
    with pytest.raises(TypeError, match=r"missing \['b'\]"):
        arguments.values(order, {"a": 1})


def test_a_launch_template_fills_the_per_call_arguments_by_name():
    from dash_cuda.backends.cute import arguments

    order = ("a", "p", "b", "s")
    made = arguments.template(order, {"b": 2, "a": 1}, ("s", "p"))
    assert made.fill("stream", 0xABC) == [1, 0xABC, 2, "stream"]
    assert made.fill(7, 8) == [1, 8, 2, 7]  # a copy each call: the template is unchanged
    with pytest.raises(TypeError, match=r"missing \['b'\]"):
        arguments.template(order, {"a": 1}, ("s", "p"))
    with pytest.raises(TypeError, match="named twice"):
        arguments.template(order, {"a": 1, "b": 2, "p": 3}, ("s", "p"))
    with pytest.raises(ValueError):
        made.fill(1)  # every per-call argument, no fewer


def test_shared_memory_is_the_storage_structs():
    """The residency check's shared memory is the size of the struct the kernel allocates;
    it holds at least the tiles the pipeline buffers (K, V; Q, dO and dS per Q stage; fp32
    dQ per dQ stage; LSE and D per Q stage), and one CTA of every shipped backward fits the
    227 KiB an sm_90 CTA may use."""
    import cutlass

    from dash_cuda.backends.cute.bwd_kernel import shared_bytes, storage

    for v in shipped_variants():
        if isinstance(v, ForwardVariant):
            continue
        dt = cutlass.BFloat16 if v.dtype == torch.bfloat16 else cutlass.Float16
        size = shared_bytes(dt, v.config, v.head_dim)
        assert size == storage(dt, v.config, v.head_dim).size_in_bytes()
        c, d = v.config, v.head_dim
        tiles = (2 * (2 * c.block_n * d + 2 * c.q_stages * c.block_m * d
                      + c.q_stages * c.block_m * c.block_n)
                 + 4 * (c.dq_stages * c.block_m * d + 2 * c.q_stages * c.block_m))
        assert tiles <= size <= 227 * 1024, (v, tiles, size)


def test_every_shipped_forward_fits_a_ctas_shared_memory():
    """Q, the K and V stages and the staged O chunks of every shipped forward fit the 227 KiB
    an sm_90 CTA may use (with 1 KiB left for the barriers), and the chunks divide d_v."""
    for v in shipped_variants():
        if isinstance(v, ForwardVariant):
            dv = v.head_dim_v or v.head_dim
            assert dv % v.config.staged_o_cols(dv) == 0
            assert v.config.shared_bytes(v.head_dim, dv) <= 226 * 1024, v.name


@pytest.mark.parametrize("seqlen_k, head_dim, heads", [(16384, 128, 16), (16384, 64, 32),
                                                      (2048, 128, 128), (1 << 22, 128, 4),
                                                      (3000, 64, 1)])
def test_l2_sections_are_powers_of_two_whose_kv_fits_in_l2(seqlen_k, head_dim, heads):
    """A causal section holds as many heads as fit their K and V in L2 together (a power of
    two, at least one, at most all heads)."""
    from dash_cuda.backends.cute.launch import L2_BYTES, l2_heads

    k = torch.empty(1, seqlen_k, 1, head_dim, dtype=torch.bfloat16)
    n = l2_heads(k, heads)
    per_head = 2 * seqlen_k * head_dim * 2
    assert 1 <= n <= heads and n & (n - 1) == 0
    assert n == 1 or n * per_head <= L2_BYTES
    assert n == heads or 2 * n * per_head > L2_BYTES


@pytest.mark.parametrize("seqlen_q", [256, 300])
def test_row_stats_are_read_padded_with_zeros(seqlen_q):
    """The backward reads LSE2 and D as ``(B * H, n_q * BM)`` rows, zero past ``S_q``: the
    forward's own buffer when its length is a multiple of BM (no copy), else a padded copy."""
    from dash_cuda.backends import new_row_stats
    from dash_cuda.backends.cute.launch import pad_row_stats

    batch, heads, block_m = 2, 3, 128
    x = new_row_stats(batch, seqlen_q, heads, torch.device("cpu"))
    x.copy_(torch.randn(batch, seqlen_q, heads) + 1.0)
    rows = pad_row_stats(x, block_m)
    padded = -(-seqlen_q // block_m) * block_m
    assert rows.shape == (batch * heads, padded) and rows.is_contiguous()
    assert (rows.data_ptr() == x.data_ptr()) == (padded == seqlen_q)
    for b, h in itertools.product(range(batch), range(heads)):
        assert torch.equal(rows[b * heads + h, :seqlen_q], x[b, :, h])
        assert torch.equal(rows[b * heads + h, seqlen_q:], torch.zeros(padded - seqlen_q))


def test_the_forward_grid_follows_the_measured_rule():
    """Persistent at every length; full masks: every head interleaved, each CTA taking every
    CTAs-th tile; causal masks: L2 sections of heads, tiles taken from a counter from
    S_q = DYNAMIC_CAUSAL on."""
    from dash_cuda.backends.cute.launch import DYNAMIC_CAUSAL, forward_grid, l2_heads

    k = torch.empty(1, 8192, 1, 128, dtype=torch.bfloat16)
    section = l2_heads(k, 16)
    assert section < 16  # so that sections and interleaved heads differ below
    for d in (64, 128):
        for s in (512, DYNAMIC_CAUSAL - 1, DYNAMIC_CAUSAL, 16384):
            dynamic = s >= DYNAMIC_CAUSAL
            assert forward_grid(d, False, s, 5000, 132, k, 16) == (132, 16, False)
            assert forward_grid(d, False, s, 100, 132, k, 16) == (100, 16, False)
            assert forward_grid(d, True, s, 5000, 132, k, 16) == (132, section, dynamic)
            assert forward_grid(d, True, s, 100, 132, k, 16) == (100, section, dynamic)


def test_the_backward_ab_tool_exports_every_kernel_it_times(tmp_path):
    """``benchmarks/ab_backward.py --export`` compiles, on the CPU, every kernel a cell times
    (bf16, both masks, deterministic and atomic) into the folder a ``--base`` reads. Run as
    the command it is (CuTe DSL reads its target architecture once, when first imported)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "ab_backward.py"),
                           "--export", str(tmp_path), "--head-dims", "64"],
                          capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert done.returncode == 0, done.stderr[-2000:]
    sys.path.insert(0, str(root / "benchmarks"))
    import ab_backward

    names = {v.name for v in ab_backward.variants([64])}
    assert len(names) == 4
    assert {p.stem for p in tmp_path.glob("*.o")} == names


def test_the_backward_config_ab_tool_exports_each_alternative_it_times(tmp_path):
    """``benchmarks/ab_backward_config.py --export`` compiles, on the CPU, each alternative
    configuration of every kernel a cell times (deterministic and atomic) under its own
    name; the tool refuses a change it cannot read, and a folder that lacks one of the
    alternatives a run would time."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "benchmarks" / "ab_backward_config.py"),
               "--cells", "96:causal:1024", "--change", "q3=q_stages=3"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([*command, "--export", str(tmp_path)], capture_output=True,
                          text=True, cwd=root, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert {p.stem for p in tmp_path.glob("*.o")} == {
        "dash_bwd_bf16_d96_causal_det_m64n128q3dq2dq1",
        "dash_bwd_bf16_d96_causal_atomic_m64n128q3dq2dq1"}
    bad = subprocess.run([*command[:2], "--change", "q3=q_stages", "--export", str(tmp_path)],
                         capture_output=True, text=True, cwd=root, env=env)
    assert bad.returncode == 2 and "NAME=FIELD=VALUE" in bad.stderr
    other = subprocess.run([*command[:2], "--cells", "96:full:1024", "--change",
                            "q3=q_stages=3", "--alt", str(tmp_path)],
                           capture_output=True, text=True, cwd=root, env=env)
    assert other.returncode == 2 and other.stderr.count("\n") == 1
    assert "lacks 2 alternatives" in other.stderr


def test_kernels_loaded_from_exported_objects_can_be_exported_again(tmp_path, monkeypatch):
    """``export_kernels`` with ``DASH_CUTE_AOT_DIR`` set: the loaded kernel (a TVM-FFI
    function, which has no export) is compiled again, and the object is written."""
    from dash_cuda.backends.cute import launch

    monkeypatch.setattr(launch, "_cache", {})  # this test's kernels only
    v = forward_variant(torch.bfloat16, 64, "full", 192)
    first, second = tmp_path / "first", tmp_path / "second"
    launch.export_kernels([v], str(first))
    monkeypatch.setenv("DASH_CUTE_AOT_DIR", str(first))
    loaded = launch.get_kernel(v)
    assert not hasattr(loaded, "export_to_c")  # it came from the object, not the compiler
    assert launch.export_kernels([v], str(second)) == [v.name]
    assert (second / f"{v.name}.o").stat().st_size > 0


def test_kernels_exported_from_other_sources_are_compiled_not_loaded(tmp_path, monkeypatch):
    """A folder records the digest of the kernel sources it was exported from; a process
    whose sources differ (or a folder without the record) compiles instead of loading a
    kernel that may not be the one its sources make, and says so."""
    from dash_cuda.backends.cute import launch

    v = forward_variant(torch.bfloat16, 64, "full", 192)
    (tmp_path / f"{v.name}.o").write_bytes(b"not loaded")
    monkeypatch.setenv("DASH_CUTE_AOT_DIR", str(tmp_path))
    monkeypatch.setattr(launch, "load_exported", lambda *a: pytest.fail("loaded a stale kernel"))
    monkeypatch.setattr(launch, "compile_kernel", lambda variant: ("compiled", variant))
    for record in (None, "0" * 64):
        if record:
            (tmp_path / launch.SOURCES_FILE).write_text(record + "\n")
        monkeypatch.setattr(launch, "_cache", {})
        launch._folder_matches.cache_clear()
        with pytest.warns(UserWarning, match="kernel sources; compiling instead$"):
            assert launch.get_kernel(v) == ("compiled", v)
    (tmp_path / launch.SOURCES_FILE).write_text(launch.kernel_sources_digest() + "\n")
    monkeypatch.setattr(launch, "_cache", {})
    launch._folder_matches.cache_clear()
    monkeypatch.setattr(launch, "load_exported", lambda folder, name: ("loaded", name))
    assert launch.get_kernel(v) == ("loaded", v.name)
    launch._folder_matches.cache_clear()


def test_export_records_the_sources_and_refuses_a_folder_of_other_sources(tmp_path):
    """Exporting writes the sources' digest beside the objects; exporting into a folder
    of kernels from other sources is refused, since its old objects would then pass for
    the new digest's."""
    from dash_cuda.backends.cute import launch

    class Compiled:
        def export_to_c(self, path, name):
            with open(path, "wb") as f:
                f.write(name.encode())

    launch.export_kernel(Compiled(), str(tmp_path / "fresh"), "k")
    assert launch.exported_digest(str(tmp_path / "fresh")) == launch.kernel_sources_digest()
    assert (tmp_path / "fresh" / "k.o").read_bytes() == b"k"
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / launch.SOURCES_FILE).write_text("0" * 64 + "\n")
    with pytest.raises(ValueError, match="other kernel sources; export into an empty folder$"):
        launch.export_kernel(Compiled(), str(stale), "k")
    assert not (stale / "k.o").exists()


def test_the_digest_covers_every_module_the_kernels_import():
    """Every module of the CuTe package that a kernel module imports is in the digest
    (a kernel made from a module outside it could change without the digest seeing)."""
    import ast
    import pathlib

    from dash_cuda.backends.cute import launch

    package = pathlib.Path(launch.__file__).parents[2]
    covered = set(launch.KERNEL_SOURCES)
    for path in launch.KERNEL_SOURCES:
        for node in ast.walk(ast.parse((package / path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pathlib.Path(path).parent
                for _ in range(node.level - 1):
                    base = base.parent
                names = [node.module] if node.module else [a.name for a in node.names]
                for name in names:
                    target = base / (name.replace(".", "/") + ".py")
                    if (package / target).exists():
                        assert target.as_posix() in covered, f"{path} imports {target}"


def test_only_packed_forwards_read_offsets_and_store_partial_rows_by_row(ptx_of):
    """A packed forward stores O of a sequence's last, partial rows row by row (a TMA
    store would write the next sequence's rows past its end), its other rows by TMA, and
    reads cu_seqlens; its rectangular twin has the TMA store alone and reads no offsets
    (the checks tell the two apart)."""
    import re
    from dataclasses import replace

    packed = next(v for v in PACKED_FORWARDS if v.mask == "full")
    rectangular = replace(packed, packed=False)
    assert rectangular in VARIANTS and packed.name == rectangular.name.replace(
        "_full_", "_full_varlen_")
    assert inspect_ptx.check_forward_ptx(ptx_of(packed), packed) == []
    plain = ptx_of(rectangular)
    assert not re.search(r"ld\.global\.b32", plain) and not re.search(r"st\.global\.b16",
                                                                        plain)
    assert inspect_ptx.check_forward_ptx(plain, packed) != []
    assert inspect_ptx.check_forward_ptx(ptx_of(packed), rectangular) != []


@pytest.mark.parametrize("packed", PACKED_BACKWARDS, ids=lambda v: v.name)
def test_only_packed_backwards_store_dk_dv_by_rows(packed, ptx_of):
    """A packed backward writes dK and dV of a sequence's last, partial KV tile row by row
    from registers (a TMA store would write the next sequence's rows past its end), and
    reads the sequences' offsets per chain; its rectangular twin (compiled in this module)
    has TMA stores alone and reads fewer int32 values (the checks tell the two apart)."""
    import re
    from dataclasses import replace

    rectangular = replace(packed, packed=False)
    assert rectangular in VARIANTS
    assert packed.name.endswith("_varlen_" + packed.config.name)
    mine, plain = ptx_of(packed), ptx_of(rectangular)
    assert inspect_ptx.check_ptx(mine, packed) == []
    assert inspect_ptx.check_ptx(plain, packed) != []
    assert inspect_ptx.check_ptx(mine, rectangular) != []
    # the loader, the dQ writer and the math warps each read the chain's sequence's
    # offsets (and q_tile_base): at least 11 int32 loads more than the tables' alone
    loads = [len(re.findall(r"ld\.global\.b32", x)) for x in (mine, plain)]
    assert loads[0] >= loads[1] + 11, loads
