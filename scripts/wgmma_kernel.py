"""One warpgroup, one ``D = A B (+ C)`` tile of 64 x N x K through ``wgmma``, as the CuTe
kernels issue it (``scripts/validate_wgmma.py`` checks the outputs against the model).

Each CTA (128 threads) takes tile ``blockIdx.x``: it copies ``A`` (64 x K, row-major in
global memory) and ``B`` (K x N, row-major) element by element into swizzled shared memory
laid out by :func:`dash_cuda.backends.cute.layouts.smem_layout`, or, for a register ``A``,
straight into the register operand that :func:`~dash_cuda.backends.cute.layouts.
acc_as_operand_a` makes of an fp32 accumulator of a (64 x K) tile (the forward's ``P`` and
the backward's ``P^T``/``dS^T``); loads ``C`` into the accumulator or leaves it unset; runs
:func:`~dash_cuda.backends.cute.layouts.gemm` over the K blocks (k16, ascending; the first
without ``C`` where there is none) and stores the fp32 accumulator.

Operand forms (:data:`OPS`), as ``fwd_kernel.py`` / ``bwd_kernel.py`` build their MMAs:

=========  ==================================================================================
``ss_kk``  A and B from shared memory, both K-major: ``S = Q K^T``, ``S^T = K Q^T``,
           ``dP^T = V dO^T`` (A a (rows, K) K_SW128 tile, B a (N, K) one)
``rs_mn``  A from registers, B MN-major: ``acc += P V``, ``dV += P^T dO``, ``dK += dS^T Q``
           (B the transposed view of a (K, N) K_SW128 tile, like ``transposed(sV)``)
``ss_mn``  A from shared memory MN-major, B MN-major: ``dQ = dS K`` (A a (64, K) MN_SW128
           tile like ``sdS``, B like ``transposed(sK)``)
=========  ==================================================================================

A K-major tile needs at least 64 columns (the 128-byte swizzle atom): at ``K = 16`` the
tile is allocated 64 columns wide and the wgmma reads the first 16, which is how every
k16 block of the kernels' wider tiles is addressed anyway.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # compile for Hopper, with or without a GPU

import cuda.bindings.driver as cuda  # noqa: E402
import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.memory  # noqa: E402
import cutlass.utils.hopper_helpers as sm90  # noqa: E402
from cutlass import Float32, Int32, const_expr  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.cute.runtime import make_ptr  # noqa: E402

from dash_cuda.backends.cute.layouts import (  # noqa: E402
    acc_as_operand_a,
    gemm,
    smem_layout,
    transposed,
)

M = 64
THREADS = 128
OPS = ("ss_kk", "rs_mn", "ss_mn")
NS = (48, 64, 96, 128)
KS = (16, 64, 96, 128)
#: the (form, N, K) the head dim 96 adds: S = Q K^T and S^T = K Q^T, dP^T = V dO^T over K
#: = 96; acc += P V (K = 128), dV += P^T dO and dK += dS^T Q (K = 64) into N = 96; dQ = dS K
#: into N = 96, or 48 where two warpgroups split d
D96_FORMS = (("ss_kk", 128, 96), ("ss_kk", 64, 96), ("rs_mn", 96, 128), ("rs_mn", 96, 64),
             ("ss_mn", 96, 128), ("ss_mn", 48, 128))
DTYPES = ("bf16", "fp16")
_CUTE_DTYPES = {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}
#: what each form stands for in the CuTe kernels
USED_BY = {
    "ss_kk": "fwd S = Q K^T (N = 128); bwd S^T = K Q^T, dP^T = V dO^T (N = BM)",
    "rs_mn": "fwd acc += P V; bwd dV += P^T dO, dK += dS^T Q (N = d)",
    "ss_mn": "bwd dQ = dS K (N = d, or d / 2 where two warpgroups split d)",
}


@dataclass(frozen=True)
class WgmmaVariant:
    """One compiled kernel: operand form, N, K, dtype, and whether ``C`` is loaded."""

    op: str
    n: int
    k: int
    dtype: str
    load_c: bool

    def __post_init__(self):
        if (self.op not in OPS or self.n not in NS or self.k not in KS
                or self.dtype not in DTYPES):
            raise ValueError(f"unsupported variant {self}")

    @property
    def name(self) -> str:
        return f"wgmma_{self.op}_m64n{self.n}k{self.k}_{self.dtype}_{'c' if self.load_c else 'noc'}"

    @property
    def a_in_registers(self) -> bool:
        return self.op == "rs_mn"

    @property
    def transpose_a(self) -> bool:
        return self.op == "ss_mn"

    @property
    def transpose_b(self) -> bool:
        return self.op != "ss_kk"

    @property
    def instruction(self) -> str:
        """The PTX opcode every one of its ``K / 16`` wgmmas must be."""
        t = "bf16" if self.dtype == "bf16" else "f16"
        return f"wgmma.mma_async.sync.aligned.m64n{self.n}k16.f32.{t}.{t}"

    def kernel_object(self) -> WgmmaTile:
        return WgmmaTile(_CUTE_DTYPES[self.dtype], self.op, self.n, self.k, self.load_c)

    def placeholder_args(self) -> list:
        """Arguments of the right types for ``cute.compile`` (their values are never used)."""
        dt = _CUTE_DTYPES[self.dtype]
        return [_ptr(dt), _ptr(dt), _ptr(Float32), _ptr(Float32), Int32(1), cuda.CUstream(0)]


def all_variants() -> list[WgmmaVariant]:
    """The forms of head dims 64 and 128 (every N in 64, 128 with every K in 16, 64, 128),
    then those head dim 96 adds (:data:`D96_FORMS`), each in both dtypes, with and
    without ``C``."""
    forms = [(op, n, k) for op in OPS for n in (64, 128) for k in (16, 64, 128)]
    return [WgmmaVariant(op, n, k, dt, lc) for op, n, k in (*forms, *D96_FORMS)
            for dt in DTYPES for lc in (True, False)]


def _ptr(dtype, address: int = 16):
    return make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=16)


class WgmmaTile:
    """Compile-time configuration; ``__call__`` is the host launcher (one CTA per tile).

    Arguments: ``A [T, 64, K]``, ``B [T, K, N]`` (the input dtype), ``C [T, 64, N]`` (fp32,
    read only with ``load_c``), ``D [T, 64, N]`` (fp32), all contiguous; ``T``; the stream.
    """

    def __init__(self, dtype, op: str, n: int, k: int, load_c: bool):
        self.dtype, self.op, self.n, self.k, self.load_c = dtype, op, n, k, load_c
        self.a_kcols = max(k, 64)  # K-major smem tiles: at least one 128-byte swizzle atom

    def _tiled_mmas(self):
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        dt = self.dtype
        if const_expr(self.op == "ss_kk"):
            mma = sm90.make_trivial_tiled_mma(dt, dt, k_major, k_major, Float32, (1, 1, 1),
                                              (M, self.n))
        elif const_expr(self.op == "rs_mn"):
            mma = sm90.make_trivial_tiled_mma(dt, dt, k_major, mn_major, Float32, (1, 1, 1),
                                              (M, self.n), a_source=warpgroup.OperandSource.RMEM)
        else:
            mma = sm90.make_trivial_tiled_mma(dt, dt, mn_major, mn_major, Float32, (1, 1, 1),
                                              (M, self.n))
        # the MMA whose (64 x K) fp32 accumulator the register A aliases (the kernels' S)
        mma_s = sm90.make_trivial_tiled_mma(dt, dt, k_major, k_major, Float32, (1, 1, 1),
                                            (M, self.k))
        return mma, mma_s

    def _layouts(self):
        if const_expr(self.op == "ss_mn"):
            sA = smem_layout(self.dtype, M, self.k, None, mn_major=True)
        else:
            sA = smem_layout(self.dtype, M, self.a_kcols, None)
        if const_expr(self.op == "ss_kk"):
            sB = smem_layout(self.dtype, self.n, self.a_kcols, None)  # (N, K), K contiguous
        else:
            sB = smem_layout(self.dtype, self.k, self.n, None)  # (K, N), N contiguous
        return sA, sB

    @cute.jit
    def __call__(self, a_ptr: cute.Pointer, b_ptr: cute.Pointer, c_ptr: cute.Pointer,
                 d_ptr: cute.Pointer, tiles: Int32, stream: cuda.CUstream):
        n, k = self.n, self.k
        mA = cute.make_tensor(a_ptr, cute.make_layout((M, k, tiles), stride=(k, 1, M * k)))
        mB = cute.make_tensor(b_ptr, cute.make_layout((k, n, tiles), stride=(n, 1, k * n)))
        mC = cute.make_tensor(c_ptr, cute.make_layout((M, n, tiles), stride=(n, 1, M * n)))
        mD = cute.make_tensor(d_ptr, cute.make_layout((M, n, tiles), stride=(n, 1, M * n)))
        sA_layout, sB_layout = self._layouts()
        mma, mma_s = self._tiled_mmas()

        @cute.struct
        class Storage:
            sA: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sB_layout)], 1024]

        self.kernel(mA, mB, mC, mD, mma, mma_s, sA_layout, sB_layout, Storage).launch(
            grid=[tiles, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor, mD: cute.Tensor,
               mma: cute.TiledMma, mma_s: cute.TiledMma, sA_layout: cute.ComposedLayout,
               sB_layout: cute.ComposedLayout, Storage: cutlass.Constexpr):
        n, k = self.n, self.k
        tid, _, _ = cute.arch.thread_idx()
        t, _, _ = cute.arch.block_idx()
        gA = mA[None, None, t]
        gB = mB[None, None, t]
        gC = mC[None, None, t]
        gD = mD[None, None, t]
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Storage)
        sA_full = st.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB_full = st.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)

        # B into shared memory, element by element (speed is irrelevant)
        if const_expr(self.op == "ss_kk"):
            sB = cute.local_tile(sB_full, (n, k), (0, 0))  # (N, K): the first K columns
            for i in cutlass.range(k * n // THREADS, unroll=1):
                e = tid + i * THREADS
                sB[e % n, e // n] = gB[e // n, e % n]
        else:
            sB_kn = sB_full  # (K, N), N contiguous; the operand is its transpose
            for i in cutlass.range(k * n // THREADS, unroll=1):
                e = tid + i * THREADS
                sB_kn[e // n, e % n] = gB[e // n, e % n]
            sB = transposed(sB_kn)
        # A into shared memory (or registers, below)
        if const_expr(self.op != "rs_mn"):
            sA = cute.local_tile(sA_full, (M, k), (0, 0))
            for i in cutlass.range(M * k // THREADS, unroll=1):
                e = tid + i * THREADS
                sA[e // k, e % k] = gA[e // k, e % k]
        cute.arch.fence_view_async_shared()  # generic-proxy writes, read by wgmma
        cute.arch.sync_threads()

        wg = mma.get_slice(0)  # shared-memory descriptors are per warpgroup
        thr = mma.get_slice(tid)
        b_frag = wg.make_fragment_B(wg.partition_B(sB))
        acc = cute.make_rmem_tensor(thr.partition_shape_C((M, n)), Float32)
        tCgC = thr.partition_C(gC)
        tCgD = thr.partition_C(gD)
        if const_expr(self.load_c):
            for e in cutlass.range_constexpr(cute.size(acc)):
                acc[e] = tCgC[e]
        if const_expr(self.op == "rs_mn"):
            # A as the kernels hold P: an fp32 accumulator layout of a (64 x K) tile,
            # re-read as the 16-bit register operand; filled straight with A's bits
            thr_s = mma_s.get_slice(tid)
            acc_s = cute.make_rmem_tensor(thr_s.partition_shape_C((M, k)), Float32)
            a_frag, a_acc = acc_as_operand_a(acc_s, self.dtype)
            tSgA = thr_s.partition_C(gA)
            for e in cutlass.range_constexpr(cute.size(a_acc)):
                a_acc[e] = tSgA[e]
        else:
            a_frag = wg.make_fragment_A(wg.partition_A(sA))
        gemm(mma, acc, a_frag, b_frag, zero_init=not self.load_c)
        warpgroup.wait_group(0)
        for e in cutlass.range_constexpr(cute.size(acc)):
            tCgD[e] = acc[e]


def register_a_check(k: int, n: int = 64, dtype: str = "bf16", alias=acc_as_operand_a
                     ) -> list[str]:
    """The register A of ``rs_mn`` holds what the wgmma expects, thread by thread (CPU).

    The kernel writes element ``j`` of ``acc_as_operand_a``'s accumulator view with the A
    element at the S accumulator's coordinate ``j`` (``partition_C`` of the (64 x K) MMA);
    that lands at register ``view.layout(j)``, which the operand reads as its element ``i``
    with ``op.layout(i)`` equal to it; CuTe's own ``partition_A`` of the register-A MMA
    says which (row, k) that element must be. Failures, at most one per thread.
    ``alias`` replaces ``acc_as_operand_a`` (negative controls).
    """
    found: dict = {}

    @cute.jit
    def probe(obj: cutlass.Constexpr):
        mma, mma_s = obj._tiled_mmas()
        ident = cute.make_identity_tensor((M, obj.k))
        acc = cute.make_rmem_tensor(mma_s.get_slice(0).partition_shape_C((M, obj.k)), Float32)
        op, view = alias(acc, obj.dtype)
        found["view"] = [int(view.layout(j)) for j in range(cute.size(view))]
        found["op"] = [int(op.layout(i)) for i in range(cute.size(op))]
        for t in list(range(THREADS)):  # a Python loop at trace time
            want = mma.get_slice(t).partition_A(ident)
            have = mma_s.get_slice(t).partition_C(ident)
            found[t] = ([tuple(int(x) for x in want[i]) for i in range(cute.size(want))],
                        [tuple(int(x) for x in have[j]) for j in range(cute.size(have))])

    cute.compile(probe, WgmmaTile(_CUTE_DTYPES[dtype], "rs_mn", n, k, False),
                 options="--gpu-arch=sm_90a")
    bad = []
    written = {reg: j for j, reg in enumerate(found["view"])}
    if sorted(written) != sorted(found["op"]) or len(written) != len(found["view"]):
        return [f"K={k}: the accumulator view and the operand cover different registers"]
    for t in range(THREADS):
        want, have = found[t]
        for i, reg in enumerate(found["op"]):
            if want[i] != have[written[reg]]:
                bad.append(f"K={k}: thread {t} operand element {i} (register {reg}) holds A"
                           f"{have[written[reg]]}, the wgmma reads it as A{want[i]}")
                break
    return bad


__all__ = ["DTYPES", "KS", "NS", "OPS", "USED_BY", "WgmmaTile", "WgmmaVariant",
           "all_variants", "register_a_check"]
