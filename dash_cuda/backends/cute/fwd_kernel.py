"""A warp-specialized, persistent attention forward for Hopper (sm_90a) in CuTe DSL.

Each CTA takes Q tiles from one numbered list (``blockIdx.x`` first, then every
``gridDim.x``-th, or, "dynamic", the next number from a global counter) and computes each
one entirely, streaming its visible KV tiles in ascending order: the bits of O and LSE2
depend on neither the grid size, nor which CTA takes which tile, nor the GPU. Causal tiles
are numbered longest first within sections of ``l2_heads`` heads (the last Q tiles of the
section's heads first), full-mask and window tiles head by head (neighbours share K/V in
L2). The launcher picks the grid, the hand-out and the section (``launch.forward_grid``):
one CTA per SM, or one per tile.

A sliding window (kind ``"window"``, its extents run-time arguments: :mod:`.mask`) walks KV
tiles ``[lo, hi)``, from its first row's first key to its last row's last
(:meth:`DashForwardSm90.window_kv_tiles`; the loader and the math warps walk the same
range); its tiles need the mask at both ends, so the math runs the first tile, then a
masked, an unmasked and a masked loop, still in ascending j. A tile that one row does not
see changes none of that row's bits (m stays, alpha = 1, P = 0), so the bits are those of
``dash_ref``'s forward, which walks the active tiles of its own query tiles.

Roles (:class:`~.config.ForwardConfig`: 512 threads at d=64, 384 at d=128)::

    warpgroup 0, warp 0   loader: picks the tiles (hands their numbers to the math warps
                          through shared memory); TMA loads of Q_i once per tile and of
                          K_j, V_j per KV tile, through mbarrier pipelines (K and V apart:
                          S needs K first).
    warpgroups 1 ..       math: each owns 64 of the tile's query rows (the MMA rows); three
                          at d=64 (192-row tiles), two at d=128 (128-row tiles).

A math warpgroup issues S_j = Q_i K_j^T together with P_{j-1} V_{j-1} and computes the
softmax of S_j while the second MMA runs; the warpgroups take turns issuing (a ring of
named barriers), so one's softmax overlaps the others' MMAs. Neither moves an add: acc still
takes P_{j-1} V_{j-1}, then the rescale by alpha_j, then P_j V_j, so the bits are those of
the same steps run one after another.

Arithmetic contract, per KV tile, in base-2 units like the Triton forward (``x`` = the raw
fp32 products ``Q_i K_j^T``, ``c`` = scale_log2 > 0)::

    [fwd_scores]     x = Q_i K_j^T; masked: -inf            wgmma; selp in the masked loop only
    [softcap]        (softcap only, before the mask)        mul.rn.f32 by k, ex2.approx.ftz,
                     r = 1 / (1 + ex2(x k)); x = cap (1-2r)  add.rn.f32, lg2.approx.ftz, neg,
                     (k = fp32(2 scale log2 e / cap), c is   ex2.approx.ftz, fma.rn.f32
                     fp32(log2 e) then)
    [fwd_max]        m' = max(m, rnd32(rowmax(x) * c))       fmax over the thread's columns (4
                     m_safe = m', or 0 where m' = -inf      chains), the row's 4 threads (shfl),
                                                           then one mul.rn.f32 per row
    [fwd_probs]      P = exp2(x * c - m_safe)               fma.rn.f32, ex2.approx.ftz.f32
                     alpha = exp2(m - m_safe)               sub.rn.f32, ex2.approx.ftz.f32
    [fwd_accumulate] l = l * alpha + rowsum(P)               fma.rn.f32; each thread sums its own
                                                           columns, in register order
                     acc = acc * alpha + rnd(P) V_j         mul.f32, wgmma (P from registers)
    [fwd_sink]       (sinks only, after the last KV tile)
                     l = the row's 4 partial sums           shfl butterfly (xor 1, then 2)
                     m' = max(m, s2); alpha = exp2(m - m')  max.f32; sub.rn.f32, ex2.approx.ftz
                     l = l * alpha + exp2(s2 - m')          sub.rn, ex2.approx.ftz, fma.rn.f32
                     acc = acc * alpha                      mul.f32
    [fwd_finish]     l = the row's 4 partial sums           shfl butterfly (xor 1, then 2)
                     O = rnd(acc * (1 / l))                 rcp.rn.f32 per row, mul.f32
                     LSE2 = m + log2(l)                     lg2.approx.ftz.f32 + add.rn.f32
                     rows that see no key: O = 0, LSE2 = -inf

``rnd32(rowmax(x) * c)`` is the largest of the rounded scaled scores (rounding is monotone),
so ``m`` is the contract's running maximum with one multiply per row, not per score; the
host runs ``c < 0`` as ``(-Q) K^T |c|`` and ``c = 0`` as ``Q = 0``.
``rnd`` is cvt.rn to the input dtype. ``O`` leaves through shared memory by TMA stores (rows
past S_q clipped); LSE2 goes to a contiguous fp32 ``(B, H, S_q)`` buffer, the convention both
backwards read.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from . import mask
from .config import ForwardConfig
from .layouts import (
    acc_as_operand_a,
    bshd_as_sdhb,
    gemm,
    smem_layout,
    tma_tiles,
    transposed,
)
from .ptx import (
    capped_score,
    exp2_minus,
    exp2_scaled_minus,
    lse2_of,
    reciprocal,
    rescaled_sum,
    scale_max,
    softcap_ratio,
)

TILE_STAGES = 2  # tile numbers in flight from the loader to the math warps

# named barriers per math warpgroup w (0 is syncthreads): BAR_O_FULL + w, its O tile is
# staged; BAR_TURN + w, its turn to issue MMAs
BAR_O_FULL = 1
BAR_TURN = 4


MASK_KINDS = mask.KINDS

#: :meth:`DashForwardSm90.__call__`'s arguments, in order (:mod:`.arguments`): the
#: placeholders for compiling and every launch's values are made from this list
LAUNCH_ARGS = (
    ("q_ptr", "input"), ("k_ptr", "input"), ("v_ptr", "input"), ("o_ptr", "input"),
    ("lse_ptr", "f32"), ("counter_ptr", "i32"), ("cu_seqlens_q_ptr", "i32"),
    ("cu_seqlens_k_ptr", "i32"), ("sink2_ptr", "f32"),
    *((n, "int") for n in ("batch", "heads", "heads_kv", "seqlen_q", "seqlen_k", "num_ctas",
                           "l2_heads", "dynamic", "window_left", "window_right",
                           "max_seqlen_q")),
    *((f"{t}_strides", "strides") for t in ("q", "k", "v", "o")),
    ("scale_log2", "float"), ("softcap_k", "float"), ("softcap", "float"), ("stream", "stream"),
)


class DashForwardSm90:
    """Compile-time configuration of one forward variant; ``__call__`` is the host launcher."""

    def __init__(self, dtype, head_dim: int, *, mask: str, config: ForwardConfig,
                 packed: bool = False, sinks: bool = False, softcap: bool = False,
                 head_dim_v: int | None = None):
        if mask not in MASK_KINDS:
            raise ValueError(f"mask must be one of {MASK_KINDS}, got {mask!r}")
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim_v or head_dim  # V and O columns
        self.bm, self.bn, self.kv_stages = config.block_m, config.block_n, config.kv_stages
        self.o_cols = config.staged_o_cols(self.dv)  # O columns per staged TMA store
        self.wgs, self.math_threads = config.math_warpgroups, config.math_threads
        self.loader_regs, self.math_regs = config.registers
        self.mask = mask  # the mask's kind, a compile-time constant (:mod:`.mask`)
        self.causal = mask == "causal"
        self.window = mask == "window"
        self.packed = packed  # a packed batch (cu_seqlens): see the module docstring
        self.sinks = sinks  # learnable sinks, one base-2 logit per query head ([fwd_sink])
        self.softcap = softcap  # logit softcap: [softcap] before the mask ([fwd_scores])

    def _tiled_mmas(self):
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        # S = Q K^T: (BM x BN), warpgroup w takes query rows 64 w ..
        mma_qk = sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, k_major, Float32, (self.wgs, 1, 1), (64, self.bn))
        # acc += P V: (BM x d_v), P straight from registers, V as the MN-major (d_v x BN)
        # operand
        mma_pv = sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, mn_major, Float32, (self.wgs, 1, 1), (64, self.dv),
            a_source=warpgroup.OperandSource.RMEM)
        # one (64 x o_cols) chunk of a warpgroup's output tile, for its slots in shared memory
        mma_o = sm90.make_trivial_tiled_mma(
            self.dtype, self.dtype, k_major, mn_major, Float32, (1, 1, 1), (64, self.o_cols),
            a_source=warpgroup.OperandSource.RMEM)
        return mma_qk, mma_pv, mma_o

    def _o_store_copy(self, mma_o):
        """A warpgroup's rnd(O) registers (``mma_o``'s accumulator layout) into its (64, d)
        tile in shared memory by ``stmatrix``: a thread holds pairs of neighbouring columns,
        one 4-byte store each with its own swizzled address; stmatrix trades the values
        between the warp's lanes so that each stores whole 16-byte rows (4 instructions
        instead of 32 at d = 128). Same bytes, same places."""
        atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        return cute.make_tiled_copy_C(atom, mma_o)

    # -- host side -----------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer, o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer, counter_ptr: cute.Pointer, cu_seqlens_q_ptr: cute.Pointer,
        cu_seqlens_k_ptr: cute.Pointer, sink2_ptr: cute.Pointer,
        batch: Int32, heads: Int32, heads_kv: Int32, seqlen_q: Int32, seqlen_k: Int32,
        num_ctas: Int32, l2_heads: Int32, dynamic: Int32, window_left: Int32,
        window_right: Int32, max_seqlen_q: Int32,
        q_strides: tuple, k_strides: tuple, v_strides: tuple, o_strides: tuple,
        scale_log2: Float32, softcap_k: Float32, softcap: Float32,
        stream: cuda.CUstream,
    ):
        d, dv, bm, bn = self.d, self.dv, self.bm, self.bn
        # packed: seqlen_q / seqlen_k are the tensors' rows (total_q, total_k), one
        # "batch" of them (batch strides 0); ``batch`` counts the sequences
        views = 1 if const_expr(self.packed) else batch
        mQ = bshd_as_sdhb(q_ptr, seqlen_q, heads, views, d, q_strides)
        mK = bshd_as_sdhb(k_ptr, seqlen_k, heads_kv, views, d, k_strides)
        mV = bshd_as_sdhb(v_ptr, seqlen_k, heads_kv, views, dv, v_strides)
        mO = bshd_as_sdhb(o_ptr, seqlen_q, heads, views, dv, o_strides)
        mLSE = cute.make_tensor(lse_ptr, cute.make_layout((seqlen_q, views * heads),
                                                          stride=(1, seqlen_q)))
        mCounter = cute.make_tensor(counter_ptr, cute.make_layout(1))
        # the sinks reach kernels compiled with them only (the others take no argument)
        mSink2 = cute.make_tensor(sink2_ptr, cute.make_layout(heads)) if const_expr(
            self.sinks) else None

        sQ_layout = smem_layout(self.dtype, bm, d, None)
        sK_layout = smem_layout(self.dtype, bn, d, self.kv_stages)
        sV_layout = smem_layout(self.dtype, bn, dv, self.kv_stages)
        # a (64, o_cols) chunk of O per warpgroup
        sO_layout = smem_layout(self.dtype, 64, self.o_cols, self.wgs)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(load, mQ, sQ_layout, (bm, d))
        tma_k, tK = cpasync.make_tiled_tma_atom(load, mK, cute.slice_(sK_layout, (None, None, 0)),
                                                (bn, d))
        tma_v, tV = cpasync.make_tiled_tma_atom(load, mV, cute.slice_(sV_layout, (None, None, 0)),
                                                (bn, dv))
        tma_o, tO = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO,
                                                cute.slice_(sO_layout, (None, None, 0)),
                                                (64, self.o_cols))
        mma_qk, mma_pv, mma_o = self._tiled_mmas()

        @cute.struct
        class Storage:
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sO: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sO_layout)], 1024]
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_tile: cute.struct.MemRange[cutlass.Int64, 2 * TILE_STAGES]
            tile_ids: cute.struct.MemRange[Int32, TILE_STAGES]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * self.kv_stages]

        # a window's extents reach the kernel; the other kinds' kernels take no argument
        window = (window_left, window_right) if const_expr(self.window) else None
        # so do the softcap's constants (scale_log2 is then fp32(log2 e))
        cap = (softcap_k, softcap) if const_expr(self.softcap) else None
        # likewise the sequences' offsets, the longest's length (the tile list) and O as
        # plain memory (its rows leave by predicated stores) reach packed kernels only
        packing = None
        if const_expr(self.packed):
            packing = (cute.make_tensor(cu_seqlens_q_ptr, cute.make_layout(batch + 1)),
                       cute.make_tensor(cu_seqlens_k_ptr, cute.make_layout(batch + 1)),
                       max_seqlen_q, mO)
        self.kernel(
            tQ, tK, tV, tO, tma_q, tma_k, tma_v, tma_o, mLSE, mCounter, mma_qk, mma_pv, mma_o,
            sQ_layout, sK_layout, sV_layout, sO_layout, batch, heads, heads_kv, seqlen_q, seqlen_k,
            l2_heads, dynamic, scale_log2, cap, window, packing, mSink2, Storage,
        ).launch(grid=[num_ctas, 1, 1], block=[128 + self.math_threads, 1, 1], stream=stream,
                 min_blocks_per_mp=1)

    # -- device side ---------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tQ: cute.Tensor, tK: cute.Tensor, tV: cute.Tensor, tO: cute.Tensor,
        tma_q: cute.CopyAtom, tma_k: cute.CopyAtom, tma_v: cute.CopyAtom, tma_o: cute.CopyAtom,
        mLSE: cute.Tensor, mCounter: cute.Tensor,
        mma_qk: cute.TiledMma, mma_pv: cute.TiledMma, mma_o: cute.TiledMma,
        sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout, sO_layout: cute.ComposedLayout,
        batch: Int32, heads: Int32, heads_kv: Int32, seqlen_q: Int32, seqlen_k: Int32,
        l2_heads: Int32, dynamic: Int32, scale_log2: Float32, cap, window, packing, mSink2,
        Storage: cutlass.Constexpr,
    ):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp == 0:
            for atom in (tma_q, tma_k, tma_v, tma_o):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Storage)
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        math_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                               self.math_threads // 32)
        k_bytes = self.bn * self.d * self.dtype.width // 8
        v_bytes = self.bn * self.dv * self.dtype.width // 8
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_q.data_ptr(), num_stages=1, producer_group=one_thread,
            consumer_group=math_warps, tx_count=self.bm * self.d * self.dtype.width // 8,
            defer_sync=True)
        pipe_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_k.data_ptr(), num_stages=self.kv_stages,
            producer_group=one_thread, consumer_group=math_warps, tx_count=k_bytes,
            defer_sync=True)
        pipe_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_v.data_ptr(), num_stages=self.kv_stages,
            producer_group=one_thread, consumer_group=math_warps, tx_count=v_bytes,
            defer_sync=True)
        # tile numbers, from the loader (lane 0) to the math warps (lane 0 of each releases)
        pipe_tile = pipeline.PipelineAsync.create(
            barrier_storage=st.mbar_tile.data_ptr(), num_stages=TILE_STAGES,
            producer_group=one_thread, consumer_group=math_warps, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sO = st.sO.get_tensor(sO_layout.outer, swizzle=sO_layout.inner)
        if const_expr(self.packed):  # every sequence gets the longest one's tiles
            n_q = (packing[2] + self.bm - 1) // self.bm
        else:
            n_q = (seqlen_q + self.bm - 1) // self.bm
        tiles = (batch * heads * n_q, batch * heads, n_q, l2_heads)
        tile_ids = (pipe_tile, st.tile_ids.get_tensor(cute.make_layout(TILE_STAGES)))

        if warp < 4:
            cute.arch.setmaxregister_decrease(self.loader_regs)
            if warp == 0:
                self.loader(tQ, tK, tV, tma_q, tma_k, tma_v, sQ, sK, sV, pipe_q, pipe_k, pipe_v,
                            tiles, tile_ids, mCounter, dynamic, heads, heads_kv, seqlen_q,
                            seqlen_k, window, packing)
        else:
            cute.arch.setmaxregister_increase(self.math_regs)
            self.math(tidx - 128, mma_qk, mma_pv, mma_o, sQ, sK, sV, sO, tO, tma_o, mLSE,
                      pipe_q, pipe_k, pipe_v, tiles, tile_ids, heads, seqlen_q, seqlen_k,
                      scale_log2, window, packing, mSink2, cap)

    # -- the tile list -------------------------------------------------------------------------
    @cute.jit
    def tile_coords(self, t, tiles, heads):
        """(i, b, h) of tile ``t``: causal longest first within sections of ``l2_heads``
        heads (whose K and V fit in L2 together: the tiles in flight share them), else head
        by head."""
        _, bh_count, n_q, l2_heads = tiles
        if const_expr(self.causal):
            section = t // (l2_heads * n_q)
            first = section * l2_heads
            width = cutlass.min(l2_heads, bh_count - first)  # the last section may be narrower
            r = t - first * n_q
            i = n_q - 1 - r // width
            bh = first + r % width
        else:
            i = t % n_q
            bh = t // n_q
        return i, bh // heads, bh % heads

    @cute.jit
    def kv_tiles(self, i, seqlen_q, seqlen_k):
        """KV tiles the rows of Q tile ``i`` see: ``[0, n)`` (causal: up to the diagonal).

        At least one: a causal Q tile that sees no key (S_q > S_k) runs KV tile 0 fully
        masked, which gives its rows O = 0 and LSE2 = -inf, as the contract says.
        """
        hi = mask.keys_seen(self.mask, (i + 1) * self.bm, seqlen_q, seqlen_k)
        if const_expr(self.causal):
            hi = cutlass.max(cutlass.min(seqlen_k, hi), 1)
        elif const_expr(self.packed):  # a sequence without keys (S_k = 0) runs tile 0 masked
            hi = cutlass.max(hi, 1)
        return (hi + self.bn - 1) // self.bn

    @cute.jit
    def window_kv_tiles(self, i, seqlen_q, seqlen_k, window):
        """A window's KV tiles of Q tile ``i``: ``[lo, hi)``, from the first key its first row
        sees to the last key its last row sees (each row's keys are one range, and both
        ends move right row by row: :meth:`dash_ref.Mask.any_visible`). The loader and the
        math warps both walk exactly these.

        At least one: a Q tile that sees no key (its rows all lie above the window, ``S_q >
        S_k + right``) runs KV tile ``lo = 0`` fully masked, which gives its rows O = 0 and
        LSE2 = -inf, as the contract says (and as ``dash_ref``'s forward gives a tile that
        walks no KV tile).
        """
        first = cutlass.max(mask.first_key(self.mask, i * self.bm, seqlen_q, seqlen_k, window),
                            0)
        stop = mask.keys_seen(self.mask, (i + 1) * self.bm, seqlen_q, seqlen_k, window)
        stop = cutlass.max(cutlass.min(seqlen_k, stop), 0)
        lo = first // self.bn
        return lo, cutlass.max((stop + self.bn - 1) // self.bn, lo + 1)

    # -- loader warp ---------------------------------------------------------------------------
    @cute.jit
    def loader(self, tQ, tK, tV, tma_q, tma_k, tma_v, sQ, sK, sV, pipe_q, pipe_k, pipe_v,
               tiles, tile_ids, mCounter, dynamic, heads, heads_kv, seqlen_q, seqlen_k, window,
               packing=None):
        """Picks the CTA's tiles and hands their numbers to the math warps; per tile, Q_i
        once, then K_j and V_j of every visible KV tile, in ascending j (a window's: from
        its first visible one, :meth:`window_kv_tiles`).

        The first tile is ``blockIdx.x``; the next is ``t + gridDim.x`` (static), or, with
        ``dynamic``, ``gridDim.x`` plus a ticket from a global counter (zero at launch): CTAs
        that finish early take more of the list, which keeps its order. Which CTA computes a
        tile never changes its bits. A number past the list ends the math warps' loop.

        Packed: a tile past its sequence's end is neither published nor loaded (the math
        warps never see it); the others load from their sequence's first rows.
        """
        bm, bn, d, dv = self.bm, self.bn, self.d, self.dv
        group = heads // heads_kv
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                self.kv_stages)
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                  TILE_STAGES)
        lane = cute.arch.lane_idx()
        bid, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        t = Int32(bid)
        while t < tiles[0]:
            if const_expr(self.packed):
                i, b, h = self.tile_coords(t, tiles, heads)
                q_first, sq, k_first, sk = self.sequence(packing, b)
                if i * bm < sq:
                    self.publish_tile(tile_ids, tile_state, t, lane)
                    tile_state.advance()
                    # TMA coordinates from the sequence's first rows: a last partial tile
                    # reads the next sequence's rows (zeros past the tensor), which the
                    # mask hides (rows past sq are never stored)
                    # (the rectangular steps below, written out here too: pipeline states
                    # advanced inside a helper do not leave a run-time branch)
                    tQ_b = cute.domain_offset((q_first, None, None, None), tQ)
                    tK_b = cute.domain_offset((k_first, None, None, None), tK)
                    tV_b = cute.domain_offset((k_first, None, None, None), tV)
                    gQ = cute.local_tile(tQ_b[None, None, h, 0], (bm, d), (i, 0))
                    sQ_t, gQ_t = tma_tiles(tma_q, sQ, gQ)
                    pipe_q.producer_acquire(q_state)
                    cute.copy(tma_q, gQ_t, sQ_t,
                              tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                    q_state.advance()
                    gK = cute.local_tile(tK_b[None, None, h // group, 0], (bn, d), (None, 0))
                    gV = cute.local_tile(tV_b[None, None, h // group, 0], (bn, dv), (None, 0))
                    sK_t, gK_t = tma_tiles(tma_k, sK, gK)
                    sV_t, gV_t = tma_tiles(tma_v, sV, gV)
                    if const_expr(self.window):
                        lo, hi = self.window_kv_tiles(i, sq, sk, window)
                    else:
                        lo, hi = 0, self.kv_tiles(i, sq, sk)
                    for j in cutlass.range(lo, hi, unroll=1):
                        stage = kv_state.index
                        pipe_k.producer_acquire(kv_state)
                        cute.copy(tma_k, gK_t[None, j], sK_t[None, stage],
                                  tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                        pipe_v.producer_acquire(kv_state)
                        cute.copy(tma_v, gV_t[None, j], sV_t[None, stage],
                                  tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                        kv_state.advance()
            else:
                self.publish_tile(tile_ids, tile_state, t, lane)
                tile_state.advance()
                i, b, h = self.tile_coords(t, tiles, heads)
                gQ = cute.local_tile(tQ[None, None, h, b], (bm, d), (i, 0))
                sQ_t, gQ_t = tma_tiles(tma_q, sQ, gQ)
                pipe_q.producer_acquire(q_state)
                cute.copy(tma_q, gQ_t, sQ_t, tma_bar_ptr=pipe_q.producer_get_barrier(q_state))
                q_state.advance()
                gK = cute.local_tile(tK[None, None, h // group, b], (bn, d), (None, 0))
                gV = cute.local_tile(tV[None, None, h // group, b], (bn, dv), (None, 0))
                sK_t, gK_t = tma_tiles(tma_k, sK, gK)
                sV_t, gV_t = tma_tiles(tma_v, sV, gV)
                if const_expr(self.window):
                    lo, hi = self.window_kv_tiles(i, seqlen_q, seqlen_k, window)
                else:
                    lo, hi = 0, self.kv_tiles(i, seqlen_q, seqlen_k)
                for j in cutlass.range(lo, hi, unroll=1):
                    stage = kv_state.index
                    pipe_k.producer_acquire(kv_state)
                    cute.copy(tma_k, gK_t[None, j], sK_t[None, stage],
                              tma_bar_ptr=pipe_k.producer_get_barrier(kv_state))
                    pipe_v.producer_acquire(kv_state)
                    cute.copy(tma_v, gV_t[None, j], sV_t[None, stage],
                              tma_bar_ptr=pipe_v.producer_get_barrier(kv_state))
                    kv_state.advance()
            t = self.next_tile(t, mCounter, dynamic, tiles[0], grid, lane)
        self.publish_tile(tile_ids, tile_state, t, lane)

    @cute.jit
    def sequence(self, packing, b):
        """Packed: ``(first query row, S_q, first key row, S_k)`` of sequence ``b``, from the
        int32 offsets ``cu_seqlens_q`` / ``cu_seqlens_k``."""
        cu_q, cu_k = packing[0], packing[1]
        q_first, k_first = cu_q[b], cu_k[b]
        return q_first, cu_q[b + 1] - q_first, k_first, cu_k[b + 1] - k_first

    @cute.jit
    def next_tile(self, t, mCounter, dynamic, total, grid, lane):
        """The CTA's next tile after ``t`` (see :meth:`loader`), the same in every lane.

        A dynamic launch hands out exactly ``total`` tickets (the list's length: each CTA
        that starts takes one more after its last tile, past the list), so the CTA that
        draws ticket ``total - 1`` makes the counter's last change: it stores 0 back, and
        the next launch on the stream finds the counter as this one did (a plan keeps one
        counter per stream instead of zeroing a fresh one every call)."""
        nxt = t + grid
        if dynamic != 0:
            ticket = Int32(0)
            if lane == 0:
                ticket = cute.arch.atomic_add(mCounter.iterator, Int32(1), sem="relaxed",
                                              scope="gpu")
                if ticket == total - 1:
                    mCounter[0] = Int32(0)
            nxt = cute.arch.shuffle_sync(ticket, 0) + grid
        return nxt

    @cute.jit
    def publish_tile(self, tile_ids, state, t, lane):
        """Loader lane 0: tile number ``t`` into the next slot for the math warps."""
        pipe_tile, s_tile = tile_ids
        if lane == 0:
            pipe_tile.producer_acquire(state)
            s_tile[state.index] = t
            pipe_tile.producer_commit(state)

    @cute.jit
    def take_tile(self, tile_ids, state, lane):
        """Math warps: the next tile number from the loader; each warp frees the slot."""
        pipe_tile, s_tile = tile_ids
        pipe_tile.consumer_wait(state)
        t = s_tile[state.index]
        cute.arch.sync_warp()
        if lane == 0:
            pipe_tile.consumer_release(state)
        return t

    # -- math warpgroups -----------------------------------------------------------------------
    @cute.jit
    def math(self, tid, mma_qk, mma_pv, mma_o, sQ, sK, sV, sO, tO, tma_o, mLSE,
             pipe_q, pipe_k, pipe_v, tiles, tile_ids, heads, seqlen_q, seqlen_k, scale_log2,
             window, packing=None, mSink2=None, cap=None):
        bm, bn = self.bm, self.bn
        wg = cute.arch.make_warp_uniform(tid // 128)  # descriptors then stay uniform
        wg_leader = wg * 128
        thr_qk = mma_qk.get_slice(tid)
        wg_qk = mma_qk.get_slice(wg_leader)
        thr_pv = mma_pv.get_slice(tid)
        wg_pv = mma_pv.get_slice(wg_leader)
        a_q = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
        b_k = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
        b_vt = wg_pv.make_fragment_B(wg_pv.partition_B(transposed(sV)))
        acc_o = cute.make_rmem_tensor(thr_pv.partition_shape_C((bm, self.dv)), Float32)
        # (query, key) of each score: thread 0's, known at compile time, plus this thread's
        # offset, which is the same for all its scores; masks compare the constant part
        # against a bound moved by the offset, so no per-score coordinate takes a register.
        # Then the thread's output rows, its O slots in shared memory and their barrier.
        scores_ident = cute.make_identity_tensor((bm, bn))
        score_coords = mma_qk.get_slice(0).partition_C(scores_ident)
        score_offset = thr_qk.partition_C(scores_ident)[0]
        o_coords = thr_pv.partition_C(cute.make_identity_tensor((bm, self.dv)))
        o_store = self._o_store_copy(mma_o).get_slice(tid % 128)
        o_slots = o_store.partition_D(sO[None, None, wg])
        # the layout of one chunk of rnd(O), mma_o's accumulator (all of it: o_cols = d_v)
        o_chunk = cute.make_layout(mma_o.get_slice(tid % 128).partition_shape_C(
            (64, self.o_cols)))
        o_ready = pipeline.NamedBarrier(barrier_id=BAR_O_FULL + wg, num_threads=128)

        # the warpgroups take turns issuing their MMAs (each one's softmax then overlaps
        # the others' MMAs): a turn barrier counts the warpgroup's own 128 threads and the
        # 128 of the one before it in the ring; the first starts with its turn granted
        turn = pipeline.NamedBarrier(barrier_id=BAR_TURN + wg, num_threads=256)
        pass_turn = pipeline.NamedBarrier(barrier_id=BAR_TURN + (wg + 1) % self.wgs,
                                          num_threads=256)
        if wg == 0:
            turn.arrive()

        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                self.kv_stages)
        causal_offset = seqlen_k - seqlen_q
        lane = cute.arch.lane_idx()
        tile_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                  TILE_STAGES)
        t = self.take_tile(tile_ids, tile_state, lane)
        tile_state.advance()
        while t < tiles[0]:
            i, b, h = self.tile_coords(t, tiles, heads)
            q_first = 0
            if const_expr(self.packed):  # the sequence's own lengths and diagonal
                q_first, seqlen_q, _, seqlen_k = self.sequence(packing, b)
                causal_offset = seqlen_k - seqlen_q
            # a thread holds two rows of its warpgroup's 64 (register halves 0 and 1): their
            # running maxima and its partial sums of their probabilities
            m = (Float32(-math.inf), Float32(-math.inf))
            ell = (Float32(0.0), Float32(0.0))
            acc_o.fill(0.0)
            diagonal = i * bm + causal_offset
            if const_expr(self.window):
                # a window's first KV tile need not be tile 0 (the same range as the loader)
                first, n = self.window_kv_tiles(i, seqlen_q, seqlen_k, window)
                keys_left, first_diagonal = seqlen_k - first * bn, diagonal - first * bn
            else:
                first, n = 0, self.kv_tiles(i, seqlen_q, seqlen_k)
                keys_left, first_diagonal = seqlen_k, diagonal
            pipe_q.consumer_wait(q_state)
            # the first KV tile: its scores alone, nothing to overlap them with yet
            pipe_k.consumer_wait(kv_state)
            acc_s = self.issue_scores(mma_qk, thr_qk, a_q, b_k, kv_state.index)
            warpgroup.wait_group(0)
            pipe_k.consumer_release(kv_state)
            m, ell, alpha = self.softmax(acc_s, score_coords, score_offset, m, ell, keys_left,
                                         first_diagonal, scale_log2, window=window, cap=cap)
            self.rescale(acc_o, alpha)
            p_op, p_acc = acc_as_operand_a(acc_s, self.dtype)
            p_acc.store(acc_s.load().to(self.dtype))
            # KV tile j: S_j = Q K_j^T runs beside acc += P_{j-1} V_{j-1}; the softmax of
            # S_j waits only for S_j. The adds into acc keep their order: P_{j-1} V_{j-1},
            # then the rescale by alpha_j, then P_j V_j, as without the overlap. The tiles
            # that need no mask come first, in a loop of their own: with a masking branch in
            # the loop, ptxas waits for P_{j-1} V_{j-1} at the branch's join, before the
            # row maximum, and the softmax overlaps none of it. A window's tiles need the
            # mask at both ends: masked, unmasked, masked loops, in ascending j.
            if const_expr(self.window):
                lo_unmasked, hi_unmasked = self.window_unmasked_kv_tiles(
                    i, first, n, seqlen_q, seqlen_k, window)
                loops = ((first + 1, lo_unmasked, True), (lo_unmasked, hi_unmasked, False),
                         (hi_unmasked, n, True))
            else:
                first_masked = cutlass.max(self.unmasked_kv_tiles(i, seqlen_q, seqlen_k), 1)
                loops = ((1, first_masked, False), (first_masked, n, True))
            for loop in cutlass.range_constexpr(len(loops)):
                lo, hi, masked = loops[loop]
                for j in cutlass.range(lo, hi, unroll=1):
                    v_state = kv_state.clone()
                    kv_state.advance()
                    pipe_k.consumer_wait(kv_state)
                    turn.arrive_and_wait()
                    acc_s = self.issue_scores(mma_qk, thr_qk, a_q, b_k, kv_state.index)
                    pipe_v.consumer_wait(v_state)
                    gemm(mma_pv, acc_o, p_op, b_vt[None, None, None, v_state.index],
                         zero_init=False)
                    pass_turn.arrive()
                    warpgroup.wait_group(1)
                    pipe_k.consumer_release(kv_state)
                    m, ell, alpha = self.softmax(acc_s, score_coords, score_offset, m, ell,
                                                 seqlen_k - j * bn, diagonal - j * bn,
                                                 scale_log2, masked=masked, window=window,
                                                 cap=cap)
                    warpgroup.wait_group(0)
                    pipe_v.consumer_release(v_state)
                    self.rescale(acc_o, alpha)
                    p_acc.store(acc_s.load().to(self.dtype))
            pipe_q.consumer_release(q_state)  # the last S has read Q_i
            pipe_v.consumer_wait(kv_state)
            gemm(mma_pv, acc_o, p_op, b_vt[None, None, None, kv_state.index],
                 zero_init=False)
            warpgroup.wait_group(0)
            pipe_v.consumer_release(kv_state)
            kv_state.advance()
            q_state.advance()
            if const_expr(self.sinks):
                m, ell = self.fold_sink(acc_o, m, ell, mSink2[h])
            self.finish(acc_o, m, ell, o_coords, o_chunk, o_store, o_slots, sO, tO, tma_o, mLSE,
                        o_ready, tid, wg, i, b, h, heads, seqlen_q, q_first, packing)
            t = self.take_tile(tile_ids, tile_state, lane)
            tile_state.advance()
        if tid % 128 < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=False)

    @cute.jit
    def issue_scores(self, mma_qk, thr_qk, a_q, b_k, stage):
        """[fwd_scores] ``S = Q_i K_j^T`` issued, not waited for, into a fresh accumulator.

        Fresh per KV tile: one accumulator reused across the loop stays live around it, and
        ptxas then runs out of registers and serializes every wgmma of the kernel.
        """
        acc_s = cute.make_rmem_tensor(thr_qk.partition_shape_C((self.bm, self.bn)), Float32)
        gemm(mma_qk, acc_s, a_q, b_k[None, None, None, stage], zero_init=True)
        return acc_s

    @cute.jit
    def softmax(self, acc_s, coords, offset, m, ell, keys_left, diagonal, scale_log2,
                masked: cutlass.Constexpr = None, window=None, cap=None):
        """[fwd_scores], [fwd_max], [fwd_probs] and the sums of [fwd_accumulate] of one KV
        tile, from the raw products ``Q_i K_j^T``: they become probabilities in place;
        returns ``(m', l', alpha)`` per row. ``masked``: whether the tile needs the mask
        (None: find out at run time); ``window``: a window's extents (:mod:`.mask`);
        ``cap``: the softcap's ``(k, softcap)``, applied to every score before the mask."""
        if const_expr(cap is not None):
            self.cap_scores(acc_s, cap)
        if const_expr(masked is None):
            if self.ragged(keys_left, diagonal, window):
                self.mask_scores(acc_s, coords, offset, keys_left, diagonal, window)
        elif const_expr(masked):
            self.mask_scores(acc_s, coords, offset, keys_left, diagonal, window)
        m0, ell0, alpha0 = self.online_softmax_row(acc_s, 0, m[0], ell[0], scale_log2)
        m1, ell1, alpha1 = self.online_softmax_row(acc_s, 1, m[1], ell[1], scale_log2)
        return (m0, m1), (ell0, ell1), (alpha0, alpha1)

    @cute.jit
    def cap_scores(self, acc_s, cap):
        """[softcap] raw scores become ``softcap tanh(S scale / softcap)``, in place, by the
        fast arithmetic's steps (``dash_ref.arithmetic.steps.softcap``)."""
        k, softcap = cap
        neg_two_cap = softcap * Float32(-2.0)  # exact
        for e in cutlass.range_constexpr(cute.size(acc_s)):
            acc_s[e] = capped_score(softcap_ratio(acc_s[e], k), neg_two_cap, softcap)

    @cute.jit
    def rescale(self, acc_o, alpha):
        """[fwd_accumulate] ``acc * alpha`` of each row, before the tile's ``P V`` adds in."""
        for e in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[e] = acc_o[e] * alpha[(e // 2) % 2]

    @cute.jit
    def online_softmax_row(self, acc_s, r: cutlass.Constexpr[int], m_old, ell_old,
                           scale_log2):
        """[fwd_max], [fwd_probs] and the sum of [fwd_accumulate] for the thread's row ``r``:
        raw scores become probabilities in place; returns ``(m', l', alpha)``.

        The scale enters twice, never as a multiply per score: once on the row's maximum
        raw score, and inside each probability's fma.
        """
        m_new = cute.arch.fmax(m_old, scale_max(self.row_max(acc_s, r), scale_log2))
        m_safe = cutlass.select_(m_new == -math.inf, Float32(0.0), m_new)
        alpha = exp2_minus(m_old, m_safe)
        neg_m = -m_safe
        psum = Float32(0.0)
        for e in cutlass.range_constexpr(cute.size(acc_s)):
            if const_expr((e // 2) % 2 == r):
                acc_s[e] = exp2_scaled_minus(acc_s[e], scale_log2, neg_m)
                psum = psum + acc_s[e]
        return m_new, rescaled_sum(ell_old, alpha, psum), alpha

    @cute.jit
    def row_max(self, acc_s, r: cutlass.Constexpr[int]):
        """The largest raw score of the thread's row ``r`` (0 or 1): its own columns in four
        independent chains (a max is exact in any order; one chain would be as long as the
        row), then the other three threads of the row (butterfly shuffles)."""
        cols = [e for e in range(cute.size(acc_s)) if (e // 2) % 2 == r]
        chains = [acc_s[e] for e in cols[:4]]
        for n, e in enumerate(cols[4:]):
            chains[n % 4] = cute.arch.fmax(chains[n % 4], acc_s[e])
        mx = cute.arch.fmax(cute.arch.fmax(chains[0], chains[1]),
                            cute.arch.fmax(chains[2], chains[3]))
        for step in cutlass.range_constexpr(2):
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1 << step))
        return mx

    @cute.jit
    def ragged(self, keys_left, diagonal, window=None):
        """Whether a KV tile needs the mask: it reaches past S_k, or (causal) some key in it
        lies after some query's diagonal, or (window) outside some query's window (see
        :meth:`mask_scores`)."""
        if const_expr(self.window):
            return mask.needs_mask(self.mask, keys_left, diagonal, self.bn, block_m=self.bm,
                                   window=window)
        return mask.needs_mask(self.mask, keys_left, diagonal, self.bn)

    @cute.jit
    def unmasked_kv_tiles(self, i, seqlen_q, seqlen_k):
        """KV tiles ``[0, n)`` of Q tile ``i`` that need no mask: inside S_k and (causal)
        below the diagonal of the tile's first row; :meth:`ragged` is false exactly there."""
        n = seqlen_k // self.bn
        if const_expr(self.causal):
            first_row_sees = mask.keys_seen(self.mask, i * self.bm + 1, seqlen_q, seqlen_k)
            n = cutlass.min(n, cutlass.max(first_row_sees, 0) // self.bn)
        return n

    @cute.jit
    def window_unmasked_kv_tiles(self, i, first, n, seqlen_q, seqlen_k, window):
        """A window's KV tiles after its ``first`` that need no mask, ``[lo, hi)`` inside
        ``(first, n)`` (:meth:`window_kv_tiles`): inside S_k, right of the first key of the
        tile's last row (``bm - 1`` rows after its first: rows past S_q only see later keys,
        so this is never too wide) and left of the last key of its first row;
        :meth:`ragged` is false there. The tiles before ``lo`` and from ``hi`` on are the
        masked ones (either range may be empty)."""
        bottom_row_first = mask.first_key(self.mask, i * self.bm + self.bm - 1, seqlen_q,
                                          seqlen_k, window)
        lo = (cutlass.max(bottom_row_first, 0) + self.bn - 1) // self.bn
        top_row_sees = mask.keys_seen(self.mask, i * self.bm + 1, seqlen_q, seqlen_k, window)
        hi = cutlass.min(seqlen_k // self.bn, cutlass.max(top_row_sees, 0) // self.bn)
        lo = cutlass.min(cutlass.max(lo, first + 1), n)
        return lo, cutlass.min(cutlass.max(hi, lo), n)

    @cute.jit
    def mask_scores(self, acc_s, coords, offset, keys_left, diagonal, window=None):
        """[fwd_scores] invisible scores become -inf: key past S_k, or (causal) a key after
        the query's diagonal (``key - query > S_k - S_q``), or (window) a key outside the
        query's window (:func:`.mask.visible`).

        A score's (query, key) is ``coords[e] + offset``: the compile-time coordinates of
        thread 0 plus this thread's offset, which moves the bounds instead.
        """
        keys_left = keys_left - offset[1]
        diagonal = diagonal + offset[0] - offset[1]
        for e in cutlass.range_constexpr(cute.size(acc_s)):
            row, col = coords[e][0], coords[e][1]
            seen = mask.visible(self.mask, col, row, keys_left, diagonal, window=window)
            acc_s[e] = cutlass.select_(seen, acc_s[e], Float32(-math.inf))

    @cute.jit
    def fold_sink(self, acc_o, m, ell, sink2):
        """[fwd_sink] the head's sink joins each row after its last KV tile: the row's
        partial sums become one (the butterfly of :meth:`finish`), ``m' = max(m, s2)``,
        ``l = fma(l, alpha, exp2(s2 - m'))`` and ``acc * alpha`` with ``alpha = exp2(m -
        m')``; returns ``(m', l)``, whose butterfly in :meth:`finish` adds ``+0`` (the
        other threads' partial sums are zeroed) and so changes no bit. A row that saw no
        key gets ``alpha = exp2(-inf) = 0``, ``l = 1``: ``O = 0``, ``LSE2 = s2``."""
        lane0 = cute.arch.lane_idx() % 4 == 0
        m_out, ell_out, alpha = [], [], []
        for r in cutlass.range_constexpr(2):
            total = self.row_total(ell[r])
            m_new = cute.arch.fmax(m[r], sink2)
            alpha.append(exp2_minus(m[r], m_new))
            total = rescaled_sum(total, alpha[r], exp2_minus(sink2, m_new))
            m_out.append(m_new)
            ell_out.append(cutlass.select_(lane0, total, Float32(0.0)))
        self.rescale(acc_o, alpha)
        return (m_out[0], m_out[1]), (ell_out[0], ell_out[1])

    @cute.jit
    def row_total(self, ell):
        """A row's sum from its four threads' partial sums: shfl butterflies 1 then 2, so
        every thread of the row holds ``(l_0 + l_1) + (l_2 + l_3)`` (commutative adds)."""
        total = ell
        for step in cutlass.range_constexpr(2):
            total = total + cute.arch.shuffle_sync_bfly(total, offset=1 << step)
        return total

    @cute.jit
    def finish(self, acc_o, m, ell, o_coords, o_chunk, o_store, o_slots, sO, tO, tma_o, mLSE,
               o_ready, tid, wg, i, b, h, heads, seqlen_q, q_first=0, packing=None):
        """[fwd_finish] O = rnd(acc * (1 / l)) through shared memory, one TMA store of the
        warpgroup's 64 rows per staged column chunk (``ForwardConfig.o_cols``); LSE2 = m +
        log2(l) by the first thread of each row.

        One reciprocal per row and a multiply per element: a division per element costs as
        much as a KV tile's softmax, on short rows a large part of the tile's time.
        """
        lse2, inv = [], []
        for r in cutlass.range_constexpr(2):
            total = self.row_total(ell[r])
            seen = total > Float32(0.0)
            lse2.append(cutlass.select_(seen, lse2_of(m[r], total), Float32(-math.inf)))
            # a row that sees no key has acc = +0 and gets O = +0 * 0
            inv.append(cutlass.select_(seen, reciprocal(total), Float32(0.0)))
        for e in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[e] = acc_o[e] * inv[(e // 2) % 2]
        vals = cute.make_rmem_tensor_like(acc_o, self.dtype)
        vals.store(acc_o.load().to(self.dtype))  # pairs: cvt.rn.bf16x2 / f16x2
        if const_expr(self.packed):
            if (self.wgs * i + wg + 1) * 64 <= seqlen_q:
                # the warpgroup's 64 rows lie inside the sequence: a TMA store at the
                # sequence's first row, as in a rectangular batch
                self.store_o_tma(vals, o_chunk, o_store, o_slots, sO,
                                 cute.domain_offset((q_first, None, None, None), tO), tma_o,
                                 o_ready, tid, wg, i, 0, h)
                self.store_lse(lse2, o_coords, mLSE, i, seqlen_q, tid, 0, h, 0, q_first)
            else:
                self.store_rows(vals, lse2, o_coords, packing[3], mLSE, i, h, seqlen_q,
                                q_first, tid)
        else:
            self.store_o_tma(vals, o_chunk, o_store, o_slots, sO, tO, tma_o, o_ready, tid, wg, i,
                             b, h)
            self.store_lse(lse2, o_coords, mLSE, i, seqlen_q, tid, b, h, heads, 0)

    @cute.jit
    def store_o_tma(self, vals, o_chunk, o_store, o_slots, sO, tO, tma_o, o_ready, tid, wg, i,
                    b, h):
        """The warpgroup's 64 rows of rnd(O) through shared memory and TMA stores (which
        clip rows past the tensor's end), ``o_cols`` columns at a time.

        A thread's accumulator holds its columns in groups of 8, in order (element ``e``:
        ``e % 4`` within the group, ``e // 4`` the group), so chunk ``c`` is the ``c``-th
        run of ``size(o_chunk)`` elements of ``vals`` (``o_chunk``: its layout).
        """
        chunk = cute.size(o_chunk)
        for c in cutlass.range_constexpr(self.dv // self.o_cols):
            part = cute.make_tensor(vals.iterator + c * chunk, o_chunk)  # a view
            # the previous store must have read the buffer before it is written again
            if tid % 128 < 32:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            o_ready.arrive_and_wait()
            cute.copy(o_store, o_store.retile(part), o_slots)
            cute.arch.fence_view_async_shared()
            o_ready.arrive_and_wait()
            if tid % 128 < 32:
                gO = cute.local_tile(tO[None, None, h, b], (64, self.o_cols),
                                     (self.wgs * i + wg, c))
                s_t, g_t = tma_tiles(tma_o, sO[None, None, wg], gO)
                cute.copy(tma_o, s_t, g_t)
                cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def store_lse(self, lse2, o_coords, mLSE, i, seqlen_q, tid, b, h, heads, first):
        """LSE2 of the thread's two rows below ``seqlen_q``, by the first thread of each row,
        into column ``b * heads + h`` of ``mLSE`` at row ``first`` + the row (packed: ``b =
        heads = 0``, ``first`` the sequence's first row)."""
        if tid % 4 == 0:
            for r in cutlass.range_constexpr(2):
                row = i * self.bm + o_coords[2 * r][0]
                if row < seqlen_q:
                    mLSE[first + row, b * heads + h] = lse2[r]

    @cute.jit
    def store_rows(self, vals, lse2, o_coords, mO, mLSE, i, h, seqlen_q, q_first, tid):
        """Packed [fwd_finish] stores of a sequence's last, partial rows: rnd(O) straight from
        registers and LSE2, each row only if it lies inside its sequence (a TMA store would
        write the next sequence's rows). A thread holds two rows (registers 0 and 2 start them),
        d_v / 4 columns of each; addresses are formed per row."""
        per_row = cute.size(vals) // 2
        for half in cutlass.range_constexpr(2):
            row = i * self.bm + o_coords[2 * half][0]
            if row < seqlen_q:
                row_o = mO[q_first + row, None, h, 0]
                for n in cutlass.range_constexpr(per_row):
                    e = (n % 2) + 2 * half + 4 * (n // 2)
                    row_o[o_coords[e][1]] = vals[e]
                if tid % 4 == 0:
                    mLSE[q_first + row, h] = lse2[half]


__all__ = ["LAUNCH_ARGS", "MASK_KINDS", "DashForwardSm90"]
