"""A warp-specialized, schedule-driven attention backward for Hopper (sm_90a) in CuTe DSL.

The kernel reads the int32 tables of ``dash_ref.Schedule.to_tables()`` and runs them as they
are: one persistent CTA per worker (``blockIdx.x``), which walks its chains in table order and,
inside each chain, its visits in table order. Nothing about the order is re-derived here.

Roles (384 threads, three warpgroups)::

    warpgroup 0, warp 0   loader: TMA loads of K_j, V_j once per chain, and of Q_i, dO_i
                          (tensor TMA) plus LSE2_i, D_i (1-D bulk copies) once per visit,
                          through multi-stage mbarrier pipelines.
    warpgroup 0, warp 1   dQ writer: takes each staged fp32 partial in visit order, waits for
                          the tile's turn (deterministic), bulk-reduce-adds it into dQacc,
                          waits for the add to complete, hands the tile to the next rank.
    warpgroups 1 and 2    math: wgmma for S, dP, dV, dK and the dQ partial; each warpgroup
                          owns 64 of the BN key rows of the chain (keys are the MMA rows);
                          the partial's columns split between them, or go to the first
                          alone (``BackwardConfig.dq_one_warpgroup``).

Arithmetic contract (one visit, keys as rows, "transposed" form like the Triton kernel)::

    [qk]          S^T  = K_j Q_i^T                    wgmma, fresh fp32 accumulator
    [softcap]     (softcap only) S^T = cap (1 - 2r), r = ex2(-lg2(1 + ex2(S^T k))), as
                  the forward's; scale_log2 is then fp32(log2 e)
    [softmax_p]   P^T  = ex2.approx.ftz(fma.rn(S^T, scale_log2, -LSE2_i))
                  masked elements are set to exactly 0 by a select
    [softcap_grad] (softcap only) P^T = rnd(P^T * 4 fma.rn(-r, r, r)) for [ds] (dV takes
                  the rounded P^T from before)
    [dv_step]     dV_j += rnd(P^T) dO_i               wgmma, A from registers, dV_j accumulates
    [dp]          dP^T = V_j dO_i^T                   wgmma, fresh fp32 accumulator
    [ds]          dS^T = P^T * (dP^T - D_i)           sub.rn.f32 then mul.rn.f32
    [dk_step]     dK_j += rnd(dS^T) Q_i               wgmma, A from registers, dK_j accumulates
    [dq_partial]  dQ_ij = rnd(dS) K_j                 wgmma, fresh fp32 accumulator
    [dq_add]      dQacc_i += dQ_ij                    cp.reduce.async.bulk .add.f32, in dQ order

The mask's kind is a compile-time constant and the element mask is :mod:`.mask`'s rule (a
sliding window's extents are run-time arguments); the tables list only the tile pairs the
rule leaves a key in, so a window's backward is its visits, nothing more.

``rnd`` is cvt.rn to the input dtype (bf16 or fp16). The epilogue of a chain writes
``rnd(dK_j * softmax_scale)`` and ``rnd(dV_j)`` through shared memory (the dS buffers) by TMA
stores (one query head per KV head, no audit), or the fp32 accumulators per query head into
scratch through sK and sV by TMA stores (GQA or audit; a separate pass sums heads).

Layouts the kernel expects (the launcher prepares them):

* ``Q, dO``: (B, S_q, H, d); ``K, V``: (B, S_k, H_kv, d); any strides, last dim contiguous,
  strides multiples of 16 bytes (TMA).
* ``LSE2, D``: fp32, contiguous (B * H, n_q * BM): padded so that every Q tile's 1-D bulk
  copy stays inside the buffer. Padded entries are never used (those rows are masked).
* ``dQacc``: fp32, contiguous (B * H * n_q, BM * d): tile ``t = (b * H + h) * n_q + i`` is
  one contiguous chunk, stored in *staging order* (see :func:`staging_coords`), which lets a
  single 1-D bulk reduce-add move a whole tile without shared-memory bank conflicts.
* ``partials`` (audit): fp32 (V, BM * d), also in staging order.
* ``sem``: int32 (B * H * n_q,), zero before the launch; ends equal to ``dq_count``.
"""

from __future__ import annotations

from collections import namedtuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warpgroup

from ...tables import TABLE_NAMES
from . import mask
from .config import BackwardConfig
from .layouts import (
    MATH_REGS,
    MATH_THREADS,
    NUM_THREADS,
    PRODUCER_REGS,
    acc_as_operand_a,
    bshd_as_sdhb,
    gemm,
    smem_layout,
    tma_tiles,
    transposed,
)
from .ptx import (
    bulk_load_1d,
    bulk_reduce_add_f32,
    bulk_store_1d,
    capped_score,
    cvt_pack,
    ds_value,
    sm_clock,
    softcap_ratio,
    softcap_slope,
    softmax_p,
)

# named barrier ids (0 is __syncthreads)
BAR_DS_FULL = 1
BAR_EPILOGUE = 2
BAR_PDS_FREE = 3  # a head-dim split with one P/dS buffer: both warpgroups done reading it


def staging_coords(block_m: int, head_dim: int) -> list[tuple[int, int]]:
    """(row, col) inside a BM x d tile of every fp32 position of a staged dQ partial.

    Warpgroup ``w`` holds an m64 x n wgmma accumulator: rows ``64 w ..`` with ``n = d``
    (d = 64, BM = 128) or columns ``(d / 2) w ..`` with ``n = d / 2`` (BM = 64). Its math
    thread ``t`` holds registers ``r = 0 .. n / 2 - 1`` and stores register ``r`` at position
    ``w * (BM * d / 2) + (r // 4) * 512 + 4 * t + r % 4`` (16-byte stores, one warp writes 512
    consecutive bytes: no bank conflicts). The register's coordinates in the warpgroup's
    block are the wgmma accumulator layout: row ``16 * (t // 32) + (t % 32) // 4 + 8 * ((r //
    2) % 2)``, column ``8 * (r // 4) + 2 * (t % 4) + r % 2``.
    """
    half = block_m * head_dim // 2
    cols = head_dim if block_m == 128 else head_dim // 2
    out = [(0, 0)] * (2 * half)
    for w in range(2):
        for t in range(128):
            warp, lane = divmod(t, 32)
            for r in range(cols // 2):
                row = 16 * warp + lane // 4 + 8 * ((r // 2) % 2)
                col = 8 * (r // 4) + 2 * (lane % 4) + r % 2
                if block_m == 128:
                    row += 64 * w
                else:
                    col += cols * w
                out[w * half + (r // 4) * 512 + 4 * t + r % 4] = (row, col)
    return out


# Timing probe (``probe=True``, a diagnostic variant): int32 cycle stamps written over the
# ``partials`` buffer, PROBE_VISIT_SLOTS per visit (table order), then PROBE_CHAIN_SLOTS per
# chain. Visit slots, math thread 0 unless noted: 0 visit start, 1 Q and dO ready, 2 S and dP
# done, 3 dS barrier passed, 4 staging buffer free, 5 visit end; dQ writer: 6 turn acquired,
# 7 add complete (deterministic). Chain slots (math thread 0): 0 chain start, 1 K/V ready,
# 2 last visit done, 3 dK/dV stored.
PROBE_VISIT_SLOTS = 8
PROBE_CHAIN_SLOTS = 4

# ---------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------


MASK_KINDS = mask.KINDS

#: the schedule's tables as the kernel holds them, by name (``dash_ref.Schedule.to_tables``)
Tables = namedtuple("Tables", TABLE_NAMES)

#: :meth:`DashBackwardSm90.__call__`'s arguments, in order (:mod:`.arguments`): the
#: placeholders for compiling and every launch's values are made from this list
LAUNCH_ARGS = (
    ("q_ptr", "input"), ("k_ptr", "input"), ("v_ptr", "input"), ("do_ptr", "input"),
    ("lse_ptr", "f32"), ("delta_ptr", "f32"), ("dqacc_ptr", "f32"),
    ("dk_ptr", "output"), ("dv_ptr", "output"), ("sem_ptr", "i32"), ("partials_ptr", "f32"),
    *((f"{table}_ptr", "i32") for table in TABLE_NAMES),
    ("cu_seqlens_q_ptr", "i32"), ("cu_seqlens_k_ptr", "i32"), ("q_tile_base_ptr", "i32"),
    *((n, "int") for n in ("batch", "heads", "heads_kv", "seqlen_q", "seqlen_k", "n_q",
                           "num_chains", "num_visits", "num_workers", "window_left",
                           "window_right", "num_q_tiles")),
    *((f"{t}_strides", "strides") for t in ("q", "k", "v", "do", "dk", "dv")),
    ("scale_log2", "float"), ("softmax_scale", "float"), ("softcap_k", "float"),
    ("softcap", "float"), ("stream", "stream"),
)


def storage(dtype, config: BackwardConfig, head_dim: int, head_dim_v: int | None = None):
    """The shared memory of one CTA as a struct: the kernel allocates it, and the host reads
    its size (:func:`shared_bytes`). The epilogue reuses the tile buffers, so the layout
    depends on the dtype, the tiles, the stages and the head dims only. A head-dim split
    (``config.split == "dims"``) adds the rounded P^T buffers (one per Q stage).

    The 1024-byte-aligned tiles first, the small buffers last: no padding between them,
    which keeps d = 64 within the 227 KiB a CTA may use. Element counts are the cosizes of
    the swizzled layouts (whole atoms: rows x columns x stages; the kernel checks them).
    """
    bm, bn, d, qs, dqs = (config.block_m, config.block_n, head_dim, config.q_stages,
                          config.dq_stages)
    dv = head_dim_v or head_dim

    def tile(elem, count: int, align: int = 1024):
        return cute.struct.Align[cute.struct.MemRange[elem, count], align]

    # built from a dict: this module's annotations are strings (``from __future__``)
    fields = {
        "sK": tile(dtype, bn * d), "sV": tile(dtype, bn * dv),
        "sQ": tile(dtype, bm * d * qs), "sdO": tile(dtype, bm * dv * qs),
        "sdS": tile(dtype, bm * bn * qs),
        **({"sP": tile(dtype, bm * bn * qs)} if config.split == "dims" else {}),
        "s_dq": tile(Float32, bm * d * dqs),
        "s_lse": tile(Float32, bm * qs, 128), "s_delta": tile(Float32, bm * qs, 128),
        "mbar_kv": cute.struct.MemRange[cutlass.Int64, 2],
        "mbar_q": cute.struct.MemRange[cutlass.Int64, 2 * qs],
        "mbar_do": cute.struct.MemRange[cutlass.Int64, 2 * qs],
        "mbar_dq": cute.struct.MemRange[cutlass.Int64, 2 * dqs],
    }
    return cute.struct(type("Storage", (), {"__annotations__": fields}))


class DashBackwardSm90:
    """Compile-time configuration of one kernel variant; ``__call__`` is the host launcher.

    ``dtype``: cutlass.BFloat16 or cutlass.Float16. ``per_head``: dK/dV go to fp32 per query
    head scratch (GQA or audit); otherwise to the rounded outputs. ``deterministic``: dQ adds
    wait for their rank; otherwise they run in arrival order. ``audit``: every partial is also
    copied to ``partials``. ``probe``: a diagnostic variant that writes cycle stamps over
    ``partials`` instead (see ``PROBE_VISIT_SLOTS``); its gradients are those of the plain
    variant. ``mask``: the mask's kind, a compile-time constant (:mod:`.mask` holds the
    rule). ``config``: tiles, buffering and in-tile choices (:mod:`.config`).
    """

    def __init__(self, dtype, head_dim: int, *, mask: str, config: BackwardConfig,
                 deterministic: bool, audit: bool, per_head: bool, probe: bool = False,
                 packed: bool = False, softcap: bool = False, head_dim_v: int | None = None):
        self.split_dims = config.split == "dims"
        if self.split_dims and probe:
            raise ValueError("the head-dim split has no probe variant")
        if self.split_dims and (config.block_m, config.block_n) != (64, 64):
            raise ValueError("the head-dim split runs 64 x 64 tiles")
        self.dq_one_wg = config.dq_one_warpgroup
        if self.dq_one_wg and (self.split_dims or config.block_m != 64):
            raise ValueError("the dQ partial on one warpgroup needs BM = 64 and keys split")
        self.math_per_role = config.math_per_role
        if self.math_per_role and not self.dq_one_wg:
            raise ValueError("a math trace per warpgroup role needs the dQ partial on one")
        if head_dim_v not in (None, head_dim) and not self.split_dims:
            raise ValueError("a value head dim other than d needs the head-dim split")
        if probe and audit:
            raise ValueError("probe and audit both use the partials buffer")
        if probe and packed:
            raise ValueError("the probe variant is rectangular")
        if mask not in MASK_KINDS:
            raise ValueError(f"mask must be one of {MASK_KINDS}, got {mask!r}")
        self.dtype = dtype
        self.d = head_dim
        self.dv = head_dim_v or head_dim  # V, dO and dV columns
        self.config = config
        self.bm, self.bn = config.block_m, config.block_n
        self.q_stages, self.dq_stages = config.q_stages, config.dq_stages
        self.mask = mask
        self.causal = mask == "causal"
        self.deterministic = deterministic
        self.audit = audit
        self.per_head = per_head
        self.probe = probe
        self.packed = packed  # a packed batch (cu_seqlens): see the module docstring
        self.softcap = softcap  # a logit softcap: [softcap] and [softcap_grad]
        self.dq_tile_elems = self.bm * head_dim
        self.dq_tile_bytes = self.dq_tile_elems * 4
        # columns of one warpgroup's dQ accumulator: BM = 128 splits the rows (each warpgroup
        # m64 x d), BM = 64 the head dim (m64 x d / 2) or leaves it to warpgroup 0 (m64 x d);
        # registers per math thread of it, staged four at a time (:func:`staging_coords`)
        self.dq_warpgroups = 1 if self.dq_one_wg else 2
        self.dq_cols = head_dim if self.bm == 128 or self.dq_one_wg else head_dim // 2
        self.dq_regs = self.dq_tile_elems // (128 * self.dq_warpgroups)
        assert self.dq_regs == self.dq_cols // 2 and self.dq_regs % 4 == 0
        # The chain epilogue's dK and dV tiles (BN x d each) go to the dS buffers. Where one
        # dS buffer holds both (BM >= 2 d), they take the buffer the next visit does not
        # write, and the stores drain while the next chain runs ("overlapped"); otherwise
        # dV, then dK, each takes all the buffers, and the stores drain in between.
        # (A head-dim split stores its dK and dV tiles through sK and sV instead.)
        self.epilogue_overlapped = self.bm >= 2 * head_dim
        self.epilogue_slots = 2 * self.q_stages if self.epilogue_overlapped else 1
        assert (self.split_dims or self.epilogue_overlapped
                or self.bm * self.q_stages >= head_dim)
        self.select_every_tile = config.select_every_tile
        self.cvt_kind = "bf16" if dtype is cutlass.BFloat16 else "f16"

    # -- MMAs ----------------------------------------------------------------------------------
    def _tiled_mmas(self):
        """``(S and dP, dK, dV, dQ partial)`` tiled MMAs of the two math warpgroups."""
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        dt = self.dtype
        if const_expr(self.split_dims):
            # S^T = K Q^T and dP^T = V dO^T: (BN x BM), warpgroup w takes query columns
            # (BM / 2) w .. of every key row
            mma_sdp = sm90.make_trivial_tiled_mma(dt, dt, k_major, k_major, Float32, (1, 2, 1),
                                                  (64, self.bm // 2))
            # dK += dS^T Q: (BN x d), dV += P^T dO: (BN x d_v), warpgroup w takes head-dim
            # columns (d / 2) w ..; A (dS^T, P^T) from shared memory, which holds both
            # warpgroups' query columns
            mma_dk, mma_dv = (
                sm90.make_trivial_tiled_mma(dt, dt, k_major, mn_major, Float32, (1, 2, 1),
                                            (64, cols // 2))
                for cols in (self.d, self.dv))
        else:
            # S^T = K Q^T and dP^T = V dO^T: (BN x BM), warpgroup w takes key rows 64w ..
            mma_sdp = sm90.make_trivial_tiled_mma(dt, dt, k_major, k_major, Float32, (2, 1, 1),
                                                  (64, self.bm))
            # dV += P^T dO, dK += dS^T Q: (BN x d), A (P^T, dS^T) straight from registers
            mma_dk = mma_dv = sm90.make_trivial_tiled_mma(
                dt, dt, k_major, mn_major, Float32, (2, 1, 1), (64, self.d),
                a_source=warpgroup.OperandSource.RMEM)
        # dQ_ij = dS K: (BM x d) from shared dS (MN-major) and K (MN-major as d x BN)
        if self.bm == 128:  # two warpgroups split the query rows
            mma_dq = sm90.make_trivial_tiled_mma(dt, dt, mn_major, mn_major, Float32, (2, 1, 1),
                                                 (64, self.d))
        elif self.dq_one_wg:  # BM = 64 on warpgroup 0 alone
            mma_dq = sm90.make_trivial_tiled_mma(dt, dt, mn_major, mn_major, Float32, (1, 1, 1),
                                                 (64, self.d))
        else:  # BM = 64: two warpgroups split the head dim
            mma_dq = sm90.make_trivial_tiled_mma(dt, dt, mn_major, mn_major, Float32, (1, 2, 1),
                                                 (64, self.dq_cols))
        return mma_sdp, mma_dk, mma_dv, mma_dq

    # -- host side -----------------------------------------------------------------------------
    @cute.jit
    def __call__(
        self,
        q_ptr: cute.Pointer, k_ptr: cute.Pointer, v_ptr: cute.Pointer, do_ptr: cute.Pointer,
        lse_ptr: cute.Pointer, delta_ptr: cute.Pointer, dqacc_ptr: cute.Pointer,
        dk_ptr: cute.Pointer, dv_ptr: cute.Pointer, sem_ptr: cute.Pointer,
        partials_ptr: cute.Pointer,
        worker_offsets_ptr: cute.Pointer, chain_bhj_ptr: cute.Pointer,
        chain_offsets_ptr: cute.Pointer, visit_q_ptr: cute.Pointer, visit_rank_ptr: cute.Pointer,
        cu_seqlens_q_ptr: cute.Pointer, cu_seqlens_k_ptr: cute.Pointer,
        q_tile_base_ptr: cute.Pointer,
        batch: Int32, heads: Int32, heads_kv: Int32, seqlen_q: Int32, seqlen_k: Int32,
        n_q: Int32, num_chains: Int32, num_visits: Int32, num_workers: Int32,
        window_left: Int32, window_right: Int32, num_q_tiles: Int32,
        q_strides: tuple, k_strides: tuple, v_strides: tuple, do_strides: tuple,
        dk_strides: tuple, dv_strides: tuple,
        scale_log2: Float32, softmax_scale: Float32, softcap_k: Float32, softcap: Float32,
        stream: cuda.CUstream,
    ):
        d, dv, bm, bn = self.d, self.dv, self.bm, self.bn
        # packed: seqlen_q / seqlen_k are the tensors' rows (total_q, total_k), one "batch"
        # of them (batch strides 0); ``batch`` counts the sequences
        views = 1 if const_expr(self.packed) else batch
        mQ = bshd_as_sdhb(q_ptr, seqlen_q, heads, views, d, q_strides)
        mdO = bshd_as_sdhb(do_ptr, seqlen_q, heads, views, dv, do_strides)
        mK = bshd_as_sdhb(k_ptr, seqlen_k, heads_kv, views, d, k_strides)
        mV = bshd_as_sdhb(v_ptr, seqlen_k, heads_kv, views, dv, v_strides)
        out_heads = heads if const_expr(self.per_head) else heads_kv
        mdK = bshd_as_sdhb(dk_ptr, seqlen_k, out_heads, views, d, dk_strides)
        mdV = bshd_as_sdhb(dv_ptr, seqlen_k, out_heads, views, dv, dv_strides)
        if const_expr(self.packed):
            # LSE2 and D tile-major (the launcher gathers them): dQ tile t's BM rows at t * BM.
            # A sequence's rows start anywhere in the packed (H, total_q) buffers, and a 1-D
            # bulk copy needs a 16-byte aligned source inside the buffer.
            num_tiles = num_q_tiles
            mLSE = cute.make_tensor(lse_ptr, cute.make_layout((bm, num_tiles), stride=(1, bm)))
            mDelta = cute.make_tensor(delta_ptr, cute.make_layout((bm, num_tiles),
                                                                  stride=(1, bm)))
        else:
            rows_pad = n_q * bm
            mLSE = cute.make_tensor(lse_ptr, cute.make_layout((rows_pad, batch * heads),
                                                              stride=(1, rows_pad)))
            mDelta = cute.make_tensor(delta_ptr, cute.make_layout((rows_pad, batch * heads),
                                                                  stride=(1, rows_pad)))
            num_tiles = batch * heads * n_q
        mDQacc = cute.make_tensor(dqacc_ptr, cute.make_layout(
            (self.dq_tile_elems, num_tiles), stride=(1, self.dq_tile_elems)))
        mPartials = cute.make_tensor(partials_ptr, cute.make_layout(
            (self.dq_tile_elems, num_visits), stride=(1, self.dq_tile_elems)))
        if const_expr(self.probe):
            mPartials = cute.make_tensor(
                cute.recast_ptr(partials_ptr, dtype=Int32),
                cute.make_layout(num_visits * PROBE_VISIT_SLOTS
                                 + num_chains * PROBE_CHAIN_SLOTS))
        mSem = cute.make_tensor(sem_ptr, cute.make_layout(num_tiles))
        tables = Tables(
            worker_offsets=cute.make_tensor(worker_offsets_ptr,
                                            cute.make_layout(num_workers + 1)),
            chain_bhj=cute.make_tensor(chain_bhj_ptr,
                                       cute.make_layout((3, num_chains), stride=(1, 3))),
            chain_offsets=cute.make_tensor(chain_offsets_ptr, cute.make_layout(num_chains + 1)),
            visit_q=cute.make_tensor(visit_q_ptr, cute.make_layout(num_visits)),
            visit_rank=cute.make_tensor(visit_rank_ptr, cute.make_layout(num_visits)),
        )

        # A head-dim split: Q and dO are also the dK and dV MMAs' MN-major B operands, whose
        # columns the two warpgroups split, so each half starts on a swizzle atom
        halves = const_expr(self.split_dims)
        sQ_layout = smem_layout(self.dtype, bm, d, self.q_stages,
                                block_cols=d // 2 if halves else None)
        sdO_layout = smem_layout(self.dtype, bm, dv, self.q_stages,
                                 block_cols=dv // 2 if halves else None)
        # K is also the dQ MMA's MN-major B operand, whose columns two warpgroups may split
        # (:meth:`_tiled_mmas`): each warpgroup's block must start on a swizzle atom
        sK_layout = smem_layout(self.dtype, bn, d, None, block_cols=self.dq_cols)
        # (a head-dim split's dV leaves through sV, whose column halves each warpgroup writes)
        sV_layout = (smem_layout(self.dtype, bn, dv, None, block_cols=dv // 2) if halves
                     else sK_layout)
        sdS_layout = smem_layout(self.dtype, bm, bn, self.q_stages, mn_major=True)
        load = cpasync.CopyBulkTensorTileG2SOp()
        tma_q, tQ = cpasync.make_tiled_tma_atom(load, mQ, cute.slice_(sQ_layout, (None, None, 0)),
                                                (bm, d))
        tma_do, tdO = cpasync.make_tiled_tma_atom(
            load, mdO, cute.slice_(sdO_layout, (None, None, 0)), (bm, dv))
        tma_k, tK = cpasync.make_tiled_tma_atom(load, mK, sK_layout, (bn, d))
        tma_v, tV = cpasync.make_tiled_tma_atom(load, mV, sV_layout, (bn, dv))
        # dK/dV leave through shared memory (the dS buffers, free at a chain's end) by TMA
        # stores; built for the fp32 scratch too, which is written from registers instead
        out_dtype = Float32 if const_expr(self.per_head) else self.dtype
        store = cpasync.CopyBulkTensorTileS2GOp()
        if const_expr(halves and not self.per_head):
            # rounded dK and dV leave through sK and sV, in their layouts (per query head,
            # fp32, a head-dim split stores from registers: :meth:`store_dkv_rows`)
            sOut_layout = sK_layout
            tma_dk, tdK = cpasync.make_tiled_tma_atom(store, mdK, sK_layout, (bn, d))
            tma_dv, tdV = cpasync.make_tiled_tma_atom(store, mdV, sV_layout, (bn, dv))
        else:
            sOut_layout = smem_layout(out_dtype, bn, d, None)
            tma_dk, tdK = cpasync.make_tiled_tma_atom(store, mdK, sOut_layout, (bn, d))
            tma_dv, tdV = cpasync.make_tiled_tma_atom(store, mdV, smem_layout(
                out_dtype, bn, dv, None), (bn, dv))
        # the epilogue's tiles: rounded, over the dS buffers; fp32 per query head, over sK
        # and sV (one (BN, d) fp32 tile is their bytes together)
        sEpi_layout = (sOut_layout if const_expr(self.per_head or halves)
                       else smem_layout(self.dtype, bn, d, self.epilogue_slots))

        mma_sdp, mma_dk, mma_dv, mma_dq = self._tiled_mmas()

        Storage = storage(self.dtype, self.config, d, dv)
        for layout, elements in ((sK_layout, bn * d), (sV_layout, bn * dv),
                                 (sQ_layout, bm * d * self.q_stages),
                                 (sdO_layout, bm * dv * self.q_stages),
                                 (sdS_layout, bm * bn * self.q_stages)):
            assert cute.cosize(layout) == elements, "a swizzled layout is not whole atoms"

        # a window's extents reach the kernel; the other kinds' kernels take no argument
        window = (window_left, window_right) if const_expr(self.mask == "window") else None
        # so do the softcap's constants (scale_log2 is then fp32(log2 e))
        cap = (softcap_k, softcap) if const_expr(self.softcap) else None
        # likewise the sequences' offsets and where each one's dQ tiles start reach packed
        # kernels only
        packing = None
        if const_expr(self.packed):
            packing = (cute.make_tensor(cu_seqlens_q_ptr, cute.make_layout(batch + 1)),
                       cute.make_tensor(cu_seqlens_k_ptr, cute.make_layout(batch + 1)),
                       cute.make_tensor(q_tile_base_ptr, cute.make_layout(batch + 1)))
        self.kernel(
            tQ, tdO, tK, tV, tma_q, tma_do, tma_k, tma_v, tdK, tdV, tma_dk, tma_dv,
            mLSE, mDelta, mDQacc, mPartials, mSem, mdK, mdV, tables,
            mma_sdp, mma_dk, mma_dv, mma_dq, sQ_layout, sdO_layout, sK_layout, sV_layout,
            sdS_layout, sEpi_layout,
            heads, heads_kv, seqlen_q, seqlen_k, n_q, scale_log2, softmax_scale, window,
            packing, cap, Storage,
        ).launch(grid=[num_workers, 1, 1], block=[NUM_THREADS, 1, 1], stream=stream,
                 min_blocks_per_mp=1)

    # -- device side ---------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        tQ: cute.Tensor, tdO: cute.Tensor, tK: cute.Tensor, tV: cute.Tensor,
        tma_q: cute.CopyAtom, tma_do: cute.CopyAtom, tma_k: cute.CopyAtom, tma_v: cute.CopyAtom,
        tdK: cute.Tensor, tdV: cute.Tensor, tma_dk: cute.CopyAtom, tma_dv: cute.CopyAtom,
        mLSE: cute.Tensor, mDelta: cute.Tensor, mDQacc: cute.Tensor, mPartials: cute.Tensor,
        mSem: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, tables: Tables,
        mma_sdp: cute.TiledMma, mma_dk: cute.TiledMma, mma_dv: cute.TiledMma,
        mma_dq: cute.TiledMma, sQ_layout: cute.ComposedLayout, sdO_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
        sdS_layout: cute.ComposedLayout, sEpi_layout: cute.ComposedLayout,
        heads: Int32, heads_kv: Int32, seqlen_q: Int32, seqlen_k: Int32, n_q: Int32,
        scale_log2: Float32, softmax_scale: Float32, window, packing, cap,
        Storage: cutlass.Constexpr,
    ):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp == 0:
            for atom in (tma_q, tma_do, tma_k, tma_v, tma_dk, tma_dv):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Storage)
        bm, d = self.bm, self.d

        # Pipelines. Loads: one TMA-issuing thread produces, the eight math warps consume
        # (one arrival per warp). Staged dQ partials: the math warps that hold them produce
        # (lane 0 of each arrives, after the warp's writes), lane 0 of the dQ writer
        # consumes. Arrivals on one mbarrier serialize: one per warp, not one per thread.
        one_thread = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        math_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, MATH_THREADS // 32)
        dq_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, 4 * self.dq_warpgroups)
        q_tile_bytes = bm * d * self.dtype.width // 8
        do_tile_bytes = bm * self.dv * self.dtype.width // 8
        kv_tile_bytes = self.bn * (d + self.dv) * self.dtype.width // 8  # K and V
        pipe_kv = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_kv.data_ptr(), num_stages=1, producer_group=one_thread,
            consumer_group=math_warps, tx_count=kv_tile_bytes, defer_sync=True)
        pipe_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_q.data_ptr(), num_stages=self.q_stages,
            producer_group=one_thread, consumer_group=math_warps,
            tx_count=q_tile_bytes + bm * 4, defer_sync=True)
        pipe_do = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.mbar_do.data_ptr(), num_stages=self.q_stages,
            producer_group=one_thread, consumer_group=math_warps,
            tx_count=do_tile_bytes + bm * 4, defer_sync=True)
        pipe_dq = pipeline.PipelineAsync.create(
            barrier_storage=st.mbar_dq.data_ptr(), num_stages=self.dq_stages,
            producer_group=dq_warps, consumer_group=one_thread, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        sQ = st.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sdO = st.sdO.get_tensor(sdO_layout.outer, swizzle=sdO_layout.inner)
        sK = st.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = st.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sdS = st.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        # a head-dim split's rounded P^T, laid out as dS is
        sP = (st.sP.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
              if const_expr(self.split_dims) else None)
        # the same bytes as (BN, d) output tiles for the chain epilogue
        if const_expr(self.split_dims):
            sEpi = (sK, sV)  # rounded dK and dV in place of K and V
        elif const_expr(self.per_head):
            sEpi = st.sK.get_tensor(sEpi_layout.outer, swizzle=sEpi_layout.inner,
                                    dtype=Float32)
        else:
            sEpi = st.sdS.get_tensor(sEpi_layout.outer, swizzle=sEpi_layout.inner)
        sLSE = st.s_lse.get_tensor(cute.make_layout((bm, self.q_stages)))
        sDelta = st.s_delta.get_tensor(cute.make_layout((bm, self.q_stages)))
        # staged partials: [v, t, g, w, stage] holds register 4 g + v of math thread t of
        # warpgroup w (see staging_coords; one warpgroup's registers 4 g + v past d / 2 land
        # where the second warpgroup's 4 (g - d / 8) + v would)
        part = self.dq_tile_elems // self.dq_warpgroups
        s_dq = st.s_dq.get_tensor(cute.make_layout(
            (4, 128, self.dq_regs // 4, self.dq_warpgroups, self.dq_stages),
            stride=(1, 4, 512, part, self.dq_tile_elems)))

        if warp < 4:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == 0:
                self.loader(tQ, tdO, tK, tV, tma_q, tma_do, tma_k, tma_v, mLSE, mDelta,
                            sQ, sdO, sK, sV, sLSE, sDelta, pipe_kv, pipe_q, pipe_do, tables,
                            heads_kv, heads, packing)
            if warp == 1:
                self.dq_writer(s_dq, mDQacc, mPartials, mSem, pipe_dq, tables, heads, n_q,
                               packing)
        else:
            cute.arch.setmaxregister_increase(MATH_REGS)
            if const_expr(self.split_dims):
                self.math_dims(tidx - 128, mma_sdp, mma_dk, mma_dv, mma_dq, sQ, sdO, sK, sV,
                               sdS, sP, sLSE, sDelta, s_dq, pipe_kv, pipe_q, pipe_do, pipe_dq,
                               tables, mdK, mdV, heads, heads_kv, seqlen_q, seqlen_k,
                               scale_log2, softmax_scale, (sEpi, tdK, tdV, tma_dk, tma_dv),
                               window, packing, cap)
            else:
                args = (tidx - 128, mma_sdp, mma_dk, mma_dq, sQ, sdO, sK, sV, sdS, sLSE,
                        sDelta, s_dq, pipe_kv, pipe_q, pipe_do, pipe_dq, tables, mdK, mdV,
                        heads, heads_kv, seqlen_q, seqlen_k, scale_log2, softmax_scale,
                        mPartials, (sEpi, tdK, tdV, tma_dk, tma_dv), window, packing, cap)
                if const_expr(self.math_per_role):
                    # The partial's holder (warpgroup 0, warps 4 - 7) and the other warpgroup
                    # each get their own trace of the visit loop, so that ptxas allocates
                    # each alone: one trace with a run-time `wg == 0` spills 176 - 224 bytes
                    # at d = 96 (the partial's accumulator live on a path warpgroup 1 never
                    # takes); two traces spill none.
                    if warp < 8:
                        self.math(*args, role=True)
                    else:
                        self.math(*args, role=False)
                else:
                    self.math(*args)

    # -- timing probe --------------------------------------------------------------------------
    @cute.jit
    def stamp(self, mProbe: cute.Tensor, slot, enabled):
        """Probe variant only: ``mProbe[slot] = %clock`` where ``enabled``; nothing otherwise."""
        if const_expr(self.probe):  # noqa: SIM102 - a compile-time test, then a run-time one
            if enabled:
                mProbe[slot] = sm_clock()

    @cute.jit
    def chain_slot(self, tables: tuple, c, k: int):
        """Index of chain ``c``'s probe slot ``k`` (after every visit's slots)."""
        return (cute.size(tables.visit_q) * PROBE_VISIT_SLOTS + c * PROBE_CHAIN_SLOTS + k)

    # -- table walking -------------------------------------------------------------------------
    @cute.jit
    def chain_range(self, tables: tuple):
        """Chains of this CTA's worker: ``worker_offsets[w] : worker_offsets[w + 1]``."""
        w, _, _ = cute.arch.block_idx()
        return tables.worker_offsets[w], tables.worker_offsets[w + 1]

    # -- packed batches ------------------------------------------------------------------------
    @cute.jit
    def sequence(self, packing, b):
        """Packed: ``(first query row, S_q, first key row, S_k)`` of sequence ``b``, from the
        int32 offsets ``cu_seqlens_q`` / ``cu_seqlens_k``."""
        cu_q, cu_k = packing[0], packing[1]
        q_first, k_first = cu_q[b], cu_k[b]
        return q_first, cu_q[b + 1] - q_first, k_first, cu_k[b + 1] - k_first

    @cute.jit
    def packed_tile_base(self, packing, b, h, seqlen_q):
        """Packed: the number of dQ tile ``(b, h, 0)``, ``q_tile_base[b] + h * n_q(b)``
        (``dash_ref.Problem.q_tile_index``): its dQacc tile, semaphore and LSE2/D rows."""
        return packing[2][b] + h * ((seqlen_q + self.bm - 1) // self.bm)

    # -- loader warp ---------------------------------------------------------------------------
    @cute.jit
    def loader(self, tQ, tdO, tK, tV, tma_q, tma_do, tma_k, tma_v, mLSE, mDelta,
               sQ, sdO, sK, sV, sLSE, sDelta, pipe_kv, pipe_q, pipe_do, tables,
               heads_kv, heads, packing=None):
        """K_j, V_j once per chain, then Q_i/LSE2_i and dO_i/D_i for every visit, in order.

        Packed: the tiles count from the chain's sequence's first rows (TMA coordinates
        shifted by ``domain_offset``): a last partial tile reads the next sequence's rows
        (zeros past the tensor), which the mask hides; LSE2_i and D_i are the dQ tile's rows
        of the tile-major buffers."""
        bm, bn, d, dv = self.bm, self.bn, self.d, self.dv
        chain_bhj, chain_offsets, visit_q = tables.chain_bhj, tables.chain_offsets, tables.visit_q
        group = heads // heads_kv
        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        c_begin, c_end = self.chain_range(tables)
        for c in cutlass.range(c_begin, c_end, unroll=1):
            b, h, j = chain_bhj[0, c], chain_bhj[1, c], chain_bhj[2, c]
            h_kv = h // group
            if const_expr(self.packed):
                q_first, seqlen_q, k_first, _ = self.sequence(packing, b)
                tQ_c = cute.domain_offset((q_first, None, None, None), tQ)
                tdO_c = cute.domain_offset((q_first, None, None, None), tdO)
                tK_c = cute.domain_offset((k_first, None, None, None), tK)
                tV_c = cute.domain_offset((k_first, None, None, None), tV)
                gK = cute.local_tile(tK_c[None, None, h_kv, 0], (bn, d), (j, 0))
                gV = cute.local_tile(tV_c[None, None, h_kv, 0], (bn, dv), (j, 0))
                gQ = cute.local_tile(tQ_c[None, None, h, 0], (bm, d), (None, 0))
                gdO = cute.local_tile(tdO_c[None, None, h, 0], (bm, dv), (None, 0))
                row_base = self.packed_tile_base(packing, b, h, seqlen_q)  # LSE2/D: tile-major
            else:
                gK = cute.local_tile(tK[None, None, h_kv, b], (bn, d), (j, 0))
                gV = cute.local_tile(tV[None, None, h_kv, b], (bn, dv), (j, 0))
                gQ = cute.local_tile(tQ[None, None, h, b], (bm, d), (None, 0))
                gdO = cute.local_tile(tdO[None, None, h, b], (bm, dv), (None, 0))
                row_base = (b * heads + h)
            sK_t, gK_t = tma_tiles(tma_k, sK, gK)
            sV_t, gV_t = tma_tiles(tma_v, sV, gV)
            sQ_t, gQ_t = tma_tiles(tma_q, sQ, gQ)
            sdO_t, gdO_t = tma_tiles(tma_do, sdO, gdO)
            first = chain_offsets[c]
            for vis in cutlass.range(first, chain_offsets[c + 1], unroll=1):
                i = visit_q[vis]
                stage = q_state.index
                pipe_q.producer_acquire(q_state)
                bar_q = pipe_q.producer_get_barrier(q_state)
                cute.copy(tma_q, gQ_t[None, i], sQ_t[None, stage], tma_bar_ptr=bar_q)
                with cute.arch.elect_one():
                    bulk_load_1d(sLSE[None, stage].iterator,
                                 mLSE[None, row_base].iterator + i * bm, bar_q, bm * 4)
                pipe_do.producer_acquire(q_state)
                bar_do = pipe_do.producer_get_barrier(q_state)
                cute.copy(tma_do, gdO_t[None, i], sdO_t[None, stage], tma_bar_ptr=bar_do)
                with cute.arch.elect_one():
                    bulk_load_1d(sDelta[None, stage].iterator,
                                 mDelta[None, row_base].iterator + i * bm, bar_do, bm * 4)
                q_state.advance()
                if vis == first:
                    # K and V have one buffer: the previous chain's math must be done with
                    # them before they are replaced (its release is the empty barrier waited
                    # on here). The chain's first Q/dO went out before this wait, so that they
                    # arrive while the previous chain finishes.
                    # (A chain without visits loads nothing; the math skips its K/V too.)
                    pipe_kv.producer_acquire(kv_state)
                    bar = pipe_kv.producer_get_barrier(kv_state)
                    cute.copy(tma_k, gK_t, sK_t, tma_bar_ptr=bar)
                    cute.copy(tma_v, gV_t, sV_t, tma_bar_ptr=bar)
                    kv_state.advance()

    # -- dQ writer warp ------------------------------------------------------------------------
    @cute.jit
    def dq_writer(self, s_dq, mDQacc, mPartials, mSem, pipe_dq, tables, heads, n_q,
                  packing=None):
        """Adds staged partials into dQacc in table order; deterministic: in dQ order.
        Packed: dQ tile ``(b, h, i)`` is number :meth:`packed_tile_base` ``+ i``."""
        chain_bhj, chain_offsets, visit_q = tables.chain_bhj, tables.chain_offsets, tables.visit_q
        visit_rank = tables.visit_rank
        lane = cute.arch.lane_idx()
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.dq_stages)
        c_begin, c_end = self.chain_range(tables)
        for c in cutlass.range(c_begin, c_end, unroll=1):
            b, h = chain_bhj[0, c], chain_bhj[1, c]
            if const_expr(self.packed):
                cu_q = packing[0]
                tile_base = self.packed_tile_base(packing, b, h, cu_q[b + 1] - cu_q[b])
            else:
                tile_base = (b * heads + h) * n_q
            for vis in cutlass.range(chain_offsets[c], chain_offsets[c + 1], unroll=1):
                t = tile_base + visit_q[vis]
                pipe_dq.consumer_wait(state)
                if lane == 0:
                    staged = s_dq[None, None, None, None, state.index].iterator
                    if const_expr(self.deterministic):
                        rank = visit_rank[vis]
                        self.wait_turn(mSem.iterator + t, rank)
                    self.stamp(mPartials, vis * PROBE_VISIT_SLOTS + 6, True)
                    bulk_reduce_add_f32(mDQacc[None, t].iterator, staged, self.dq_tile_bytes)
                    if const_expr(self.audit):
                        bulk_store_1d(mPartials[None, vis].iterator, staged, self.dq_tile_bytes)
                    cute.arch.cp_async_bulk_commit_group()
                    if const_expr(self.deterministic):
                        # the add must have completed in global memory, not merely have read
                        # shared memory, before the next rank may start its own
                        cute.arch.cp_async_bulk_wait_group(0, read=False)
                        self.stamp(mPartials, vis * PROBE_VISIT_SLOTS + 7, True)
                        self.pass_turn(mSem.iterator + t, rank)
                    else:
                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                cute.arch.sync_warp()
                if lane == 0:
                    pipe_dq.consumer_release(state)
                state.advance()
        if lane == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=False)

    @cute.jit
    def acquire_turn(self, sem: cute.Pointer, rank: Int32):
        """Spin (one thread) until the tile's semaphore equals ``rank``; acquire at GPU scope."""
        seen = cute.arch.load(sem, Int32, sem="acquire", scope="gpu")
        while seen != rank:
            seen = cute.arch.load(sem, Int32, sem="acquire", scope="gpu")

    @cute.jit
    def wait_turn(self, sem: cute.Pointer, rank: Int32):
        """:meth:`acquire_turn`, then a fence that orders the following bulk add (async
        proxy) after the acquire."""
        self.acquire_turn(sem, rank)
        cute.arch.fence_proxy("async.global")

    @cute.jit
    def pass_turn(self, sem: cute.Pointer, rank: Int32):
        """Hand the tile to the next rank: proxy fence, then a release store of ``rank + 1``."""
        cute.arch.fence_proxy("async.global")
        cute.arch.store(sem, rank + 1, sem="release", scope="gpu")

    # -- math warpgroups -----------------------------------------------------------------------
    @cute.jit
    def math(self, tid, mma_sdp, mma_dkv, mma_dq, sQ, sdO, sK, sV, sdS, sLSE, sDelta, s_dq,
             pipe_kv, pipe_q, pipe_do, pipe_dq, tables, mdK, mdV,
             heads, heads_kv, seqlen_q, seqlen_k, scale_log2, softmax_scale, mProbe, out,
             window, packing=None, cap=None, role: cutlass.Constexpr = None):
        """The visit loop of the math warpgroups; ``role`` (trace time, where each warpgroup
        role has its own trace): whether this trace's warpgroup holds the dQ partial."""
        bm, bn, d = self.bm, self.bn, self.d
        chain_bhj, chain_offsets, visit_q = tables.chain_bhj, tables.chain_offsets, tables.visit_q
        group = heads // heads_kv
        wg = cute.arch.make_warp_uniform(tid // 128)  # descriptors then stay uniform
        wg_leader = wg * 128
        lane = cute.arch.lane_idx()

        # Operand fragments (shared-memory descriptors are per warpgroup).
        thr_sdp = mma_sdp.get_slice(tid)
        wg_sdp = mma_sdp.get_slice(wg_leader)
        wg_dkv = mma_dkv.get_slice(wg_leader)
        thr_dkv = mma_dkv.get_slice(tid)
        # (the dQ MMA on one warpgroup: warpgroup 0's fragments; warpgroup 1 skips it)
        dq_wg = 0 if const_expr(self.dq_one_wg) else wg
        # whether this warpgroup computes and stages the partial: its trace's role, else a
        # trace-time True where both do (no branch emitted), else warpgroup 0 at run time
        holds_dq = (role if const_expr(role is not None)
                    else wg == 0 if const_expr(self.dq_one_wg) else True)
        wg_dq = mma_dq.get_slice(dq_wg * 128)
        thr_dq = mma_dq.get_slice(tid % 128 + dq_wg * 128)
        a_k = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        a_v = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        b_q = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        b_do = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        b_qt = wg_dkv.make_fragment_B(wg_dkv.partition_B(transposed(sQ)))
        b_dot = wg_dkv.make_fragment_B(wg_dkv.partition_B(transposed(sdO)))
        a_ds = wg_dq.make_fragment_A(wg_dq.partition_A(sdS))
        b_kt = wg_dq.make_fragment_B(wg_dq.partition_B(transposed(sK)))

        acc_dk = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, d)), Float32)
        acc_dv = cute.make_rmem_tensor(thr_dkv.partition_shape_C((bn, d)), Float32)
        # (key, query) coordinates of this thread's score elements, and its dS^T slots in smem
        score_coords = thr_sdp.partition_C(cute.make_identity_tensor((bn, bm)))
        ds_slots = thr_sdp.partition_C(transposed(sdS))
        dkv_coords = thr_dkv.partition_C(cute.make_identity_tensor((bn, d)))
        # this thread's slots of a staged dQ partial
        my_dq_slots = s_dq[None, tid % 128, None, dq_wg, None]

        ds_full = pipeline.NamedBarrier(barrier_id=BAR_DS_FULL, num_threads=MATH_THREADS)
        epi_bar = pipeline.NamedBarrier(barrier_id=BAR_EPILOGUE, num_threads=MATH_THREADS)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        dq_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                self.dq_stages)
        causal_offset = seqlen_k - seqlen_q
        lead = tid == 0  # the probe's clock reader
        c_begin, c_end = self.chain_range(tables)
        for c in cutlass.range(c_begin, c_end, unroll=1):
            self.stamp(mProbe, self.chain_slot(tables, c, 0), lead)
            b, h, j = chain_bhj[0, c], chain_bhj[1, c], chain_bhj[2, c]
            k_first = 0
            if const_expr(self.packed):  # the sequence's own lengths and diagonal
                _, seqlen_q, k_first, seqlen_k = self.sequence(packing, b)
                causal_offset = seqlen_k - seqlen_q
            acc_dk.fill(0.0)
            acc_dv.fill(0.0)
            has_visits = chain_offsets[c + 1] > chain_offsets[c]
            if has_visits:
                pipe_kv.consumer_wait(kv_state)
            self.stamp(mProbe, self.chain_slot(tables, c, 1), lead)
            for vis in cutlass.range(chain_offsets[c], chain_offsets[c + 1], unroll=1):
                slot = vis * PROBE_VISIT_SLOTS
                self.stamp(mProbe, slot, lead)
                i = visit_q[vis]
                stage = q_state.index
                # [qk] S^T = K_j Q_i^T
                pipe_q.consumer_wait(q_state)
                acc_s = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bn, bm)), Float32)
                gemm(mma_sdp, acc_s, a_k, b_q[None, None, None, stage], zero_init=True)
                # [dp] dP^T = V_j dO_i^T
                pipe_do.consumer_wait(q_state)
                acc_dp = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bn, bm)), Float32)
                self.stamp(mProbe, slot + 1, lead)
                gemm(mma_sdp, acc_dp, a_v, b_do[None, None, None, stage], zero_init=True)
                warpgroup.wait_group(1)
                if const_expr(cap is not None):
                    # [softcap], [softmax_p], the mask, rnd(P^T) and [softcap_grad] element
                    # by element: acc_s keeps P^T (1 - t^2) for [ds], the rounded P^T goes to
                    # the dV MMA (no second fp32 tile lives across the dP product)
                    p_op, _ = self.capped_probabilities(
                        acc_s, score_coords, sLSE, stage, scale_log2, cap,
                        seqlen_k - j * bn, seqlen_q - i * bm,
                        i * bm + causal_offset - j * bn, window)
                else:
                    # [softmax_p] P^T = exp2(S^T * scale_log2 - LSE2_i)
                    for e in cutlass.range_constexpr(cute.size(acc_s)):
                        acc_s[e] = softmax_p(acc_s[e], scale_log2,
                                             -sLSE[score_coords[e][1], stage])
                    self.mask_scores(acc_s, score_coords, seqlen_k - j * bn,
                                     seqlen_q - i * bm, i * bm + causal_offset - j * bn,
                                     window)
                    p_op, p_op_acc = acc_as_operand_a(acc_s, self.dtype)
                    p_op_acc.store(acc_s.load().to(self.dtype))
                # [ds] dS^T = P^T (dP^T - D_i)
                warpgroup.wait_group(0)
                self.stamp(mProbe, slot + 2, lead)
                for e in cutlass.range_constexpr(cute.size(acc_dp)):
                    col = score_coords[e][1]
                    acc_dp[e] = ds_value(acc_s[e], acc_dp[e], sDelta[col, stage])
                # rnd(dS^T), packed in pairs by explicit cvt.rn.x2 (the same rounding as
                # .to(dtype)): it is read by the shared-memory copy and, late, by the dK MMA
                # after a branch; a compiler conversion was repeated there from the fp32
                # values, which then stayed live across dV and the partial (ptxas C7512)
                n_ds = cute.size(acc_dp)
                ds_words = cute.make_rmem_tensor(n_ds // 2, Int32)
                for k in cutlass.range_constexpr(n_ds // 2):
                    ds_words[k] = cvt_pack(acc_dp[2 * k], acc_dp[2 * k + 1], self.cvt_kind)
                ds_op, ds_op_acc = acc_as_operand_a(
                    acc_dp, self.dtype, cute.recast_ptr(ds_words.iterator, dtype=self.dtype))
                # [dv_step] dV_j += rnd(P^T) dO_i, operand A straight from registers; issued
                # once S and dP are dead, so that it never competes with them for registers.
                gemm(mma_dkv, acc_dv, p_op, b_dot[None, None, None, stage], zero_init=False)
                # dS to shared memory for the partial (both warpgroups' key rows are needed).
                # One buffer per Q stage: the buffer written here was last read by the dQ MMAs
                # of two visits ago, which both warpgroups waited for before the previous
                # visit's barrier, so the barrier below is the only one a visit needs.
                cute.autovec_copy(ds_op_acc, ds_slots[None, None, None, stage])
                cute.arch.fence_view_async_shared()
                if const_expr(self.epilogue_overlapped):  # noqa: SIM102 - compile time, then run time
                    # the previous chain's dK/dV stores have read the other buffer
                    if tid < 32:
                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                ds_full.arrive_and_wait()
                self.stamp(mProbe, slot + 3, lead)
                # [dq_partial] dQ_ij = rnd(dS) K_j, a fresh accumulator
                acc_dq = cute.make_rmem_tensor(thr_dq.partition_shape_C((bm, d)), Float32)
                if holds_dq:
                    gemm(mma_dq, acc_dq, a_ds[None, None, None, stage], b_kt, zero_init=True)
                # [dk_step] dK_j += rnd(dS^T) Q_i, operand A from registers, issued after the
                # partial's MMA so that staging the partial overlaps it (measured: issuing it
                # before the dS barrier is slower at both head dims, :mod:`.config`)
                gemm(mma_dkv, acc_dk, ds_op, b_qt[None, None, None, stage], zero_init=False)
                # dV and the partial are done (groups retire in order); dK still runs while
                # the partial is staged for the dQ writer
                warpgroup.wait_group(1)
                pipe_do.consumer_release(q_state)
                if holds_dq:
                    self.stage_partial(acc_dq, my_dq_slots, pipe_dq, dq_state, lane, mProbe,
                                       slot, lead)
                dq_state.advance()
                warpgroup.wait_group(0)
                pipe_q.consumer_release(q_state)
                q_state.advance()
                self.stamp(mProbe, slot + 5, lead)
            self.stamp(mProbe, self.chain_slot(tables, c, 2), lead)
            if const_expr(self.packed):
                if has_visits:  # sK, sV are not read by either store below
                    pipe_kv.consumer_release(kv_state)
                    kv_state.advance()
                if const_expr(self.per_head):
                    self.store_dkv_rows(acc_dk, acc_dv, dkv_coords, dkv_coords, mdK, mdV, h, 0,
                                        k_first, j, seqlen_k, softmax_scale)
                elif (j + 1) * bn <= seqlen_k:
                    # a whole tile inside its sequence: through shared memory and TMA
                    # stores, as in a rectangular batch, at the sequence's first key row
                    self.store_dkv_tma(acc_dk, acc_dv, self.shifted_out(out, k_first),
                                       epi_bar, tid, 0, h // group, j, softmax_scale,
                                       q_state.index)
                else:
                    # the sequence's last, partial tile: from registers, each row only
                    # inside the sequence (a TMA store would write the next one's rows)
                    self.store_dkv_rows(acc_dk, acc_dv, dkv_coords, dkv_coords, mdK, mdV,
                                        h // group, 0, k_first, j, seqlen_k, softmax_scale)
            elif const_expr(self.per_head):
                if has_visits:
                    # through sK and sV, which go back to the loader after the stores
                    self.store_dkv_scratch(acc_dk, acc_dv, out, epi_bar, tid, b, h, j)
                    pipe_kv.consumer_release(kv_state)
                    kv_state.advance()
                else:  # the loader may be filling sK and sV for a later chain
                    self.store_dkv_rows(acc_dk, acc_dv, dkv_coords, dkv_coords, mdK, mdV, h, b,
                                        0, j, seqlen_k, softmax_scale)
            else:
                if has_visits:
                    pipe_kv.consumer_release(kv_state)
                    kv_state.advance()
                self.store_dkv_tma(acc_dk, acc_dv, out, epi_bar, tid, b, h // group, j,
                                   softmax_scale, q_state.index)
            self.stamp(mProbe, self.chain_slot(tables, c, 3), lead)
        if tid < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=False)

    @cute.jit
    def stage_partial(self, acc_dq, my_dq_slots, pipe_dq, dq_state, lane, mProbe=None,
                      slot=None, lead=None):
        """This warp's share of a dQ partial to the staging buffer ``dq_state`` names, once
        the dQ writer has freed it; then the warp's one arrival (probe slot 4: the buffer
        was free)."""
        pipe_dq.producer_acquire(dq_state)
        if const_expr(mProbe is not None):
            self.stamp(mProbe, slot + 4, lead)
        cute.autovec_copy(
            cute.make_tensor(acc_dq.iterator, cute.make_layout((4, self.dq_regs // 4))),
            my_dq_slots[None, None, dq_state.index])
        cute.arch.fence_view_async_shared()
        cute.arch.sync_warp()  # the warp's writes, then its one arrival
        if lane == 0:
            pipe_dq.producer_commit(dq_state)

    # -- math warpgroups, head-dim split ------------------------------------------------------
    @cute.jit
    def math_dims(self, tid, mma_sdp, mma_dk, mma_dv, mma_dq, sQ, sdO, sK, sV, sdS, sP, sLSE,
                  sDelta, s_dq, pipe_kv, pipe_q, pipe_do, pipe_dq, tables, mdK, mdV,
                  heads, heads_kv, seqlen_q, seqlen_k, scale_log2, softmax_scale, out,
                  window, packing=None, cap=None):
        """The visits of a head-dim split (``BackwardConfig.split == "dims"``): the contract
        of the module docstring, step for step, on 64 x 64 tiles. Warpgroup ``w`` computes
        S^T and dP^T for query columns ``32 w ..`` of all 64 keys, writes its rounded P^T
        and dS^T to shared memory, and after one barrier takes head-dim columns ``(d / 2)
        w ..`` of dV, dK and the dQ partial, each a shared-memory MMA over all 64 queries
        (or keys). The values are those of :meth:`math`; only which warpgroup holds which
        accumulator element differs."""
        bm, bn, d, dv = self.bm, self.bn, self.d, self.dv
        chain_bhj, chain_offsets, visit_q = tables.chain_bhj, tables.chain_offsets, tables.visit_q
        group = heads // heads_kv
        wg = cute.arch.make_warp_uniform(tid // 128)  # descriptors then stay uniform
        wg_leader = wg * 128
        lane = cute.arch.lane_idx()

        # Operand fragments (shared-memory descriptors are per warpgroup).
        thr_sdp, wg_sdp = mma_sdp.get_slice(tid), mma_sdp.get_slice(wg_leader)
        thr_dk, wg_dk = mma_dk.get_slice(tid), mma_dk.get_slice(wg_leader)
        thr_dv, wg_dv = mma_dv.get_slice(tid), mma_dv.get_slice(wg_leader)
        thr_dq, wg_dq = mma_dq.get_slice(tid), mma_dq.get_slice(wg_leader)
        a_k = wg_sdp.make_fragment_A(wg_sdp.partition_A(sK))
        a_v = wg_sdp.make_fragment_A(wg_sdp.partition_A(sV))
        b_q = wg_sdp.make_fragment_B(wg_sdp.partition_B(sQ))
        b_do = wg_sdp.make_fragment_B(wg_sdp.partition_B(sdO))
        # dS^T and P^T as K-major A operands: the (BM, BN) MN-major buffers read transposed
        a_dst = wg_dk.make_fragment_A(wg_dk.partition_A(transposed(sdS)))
        a_pt = wg_dv.make_fragment_A(wg_dv.partition_A(transposed(sP)))
        b_qt = wg_dk.make_fragment_B(wg_dk.partition_B(transposed(sQ)))
        b_dot = wg_dv.make_fragment_B(wg_dv.partition_B(transposed(sdO)))
        a_ds = wg_dq.make_fragment_A(wg_dq.partition_A(sdS))
        b_kt = wg_dq.make_fragment_B(wg_dq.partition_B(transposed(sK)))

        acc_dk = cute.make_rmem_tensor(thr_dk.partition_shape_C((bn, d)), Float32)
        acc_dv = cute.make_rmem_tensor(thr_dv.partition_shape_C((bn, dv)), Float32)
        # (key, query) coordinates of this thread's score elements, its P^T and dS^T slots
        score_coords = thr_sdp.partition_C(cute.make_identity_tensor((bn, bm)))
        ds_slots = thr_sdp.partition_C(transposed(sdS))
        p_slots = thr_sdp.partition_C(transposed(sP))
        dk_coords = thr_dk.partition_C(cute.make_identity_tensor((bn, d)))
        dv_coords = thr_dv.partition_C(cute.make_identity_tensor((bn, dv)))
        # how this thread's rounded dK and dV reach their tiles over sK and sV (store_dkv_kv)
        epi_slots = (self.stmatrix_slots(mma_dk, tid, sK), self.stmatrix_slots(mma_dv, tid, sV))
        my_dq_slots = s_dq[None, tid % 128, None, wg, None]

        ds_full = pipeline.NamedBarrier(barrier_id=BAR_DS_FULL, num_threads=MATH_THREADS)
        epi_bar = pipeline.NamedBarrier(barrier_id=BAR_EPILOGUE, num_threads=MATH_THREADS)
        pds_free = pipeline.NamedBarrier(barrier_id=BAR_PDS_FREE, num_threads=MATH_THREADS)

        kv_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        dq_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                self.dq_stages)
        causal_offset = seqlen_k - seqlen_q
        c_begin, c_end = self.chain_range(tables)
        for c in cutlass.range(c_begin, c_end, unroll=1):
            b, h, j = chain_bhj[0, c], chain_bhj[1, c], chain_bhj[2, c]
            k_first = 0
            if const_expr(self.packed):  # the sequence's own lengths and diagonal
                _, seqlen_q, k_first, seqlen_k = self.sequence(packing, b)
                causal_offset = seqlen_k - seqlen_q
            acc_dk.fill(0.0)
            acc_dv.fill(0.0)
            has_visits = chain_offsets[c + 1] > chain_offsets[c]
            if has_visits:
                pipe_kv.consumer_wait(kv_state)
            for vis in cutlass.range(chain_offsets[c], chain_offsets[c + 1], unroll=1):
                i = visit_q[vis]
                stage = q_state.index
                # [qk] S^T = K_j Q_i^T, this warpgroup's query columns
                pipe_q.consumer_wait(q_state)
                acc_s = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bn, bm)), Float32)
                gemm(mma_sdp, acc_s, a_k, b_q[None, None, None, stage], zero_init=True)
                # [dp] dP^T = V_j dO_i^T
                pipe_do.consumer_wait(q_state)
                acc_dp = cute.make_rmem_tensor(thr_sdp.partition_shape_C((bn, bm)), Float32)
                gemm(mma_sdp, acc_dp, a_v, b_do[None, None, None, stage], zero_init=True)
                warpgroup.wait_group(1)
                if const_expr(cap is not None):
                    # [softcap], [softmax_p], the mask, rnd(P^T) and [softcap_grad] as in
                    # math: acc_s keeps P^T (1 - t^2) for [ds]
                    _, p_vals = self.capped_probabilities(
                        acc_s, score_coords, sLSE, stage, scale_log2, cap,
                        seqlen_k - j * bn, seqlen_q - i * bm,
                        i * bm + causal_offset - j * bn, window)
                else:
                    # [softmax_p] P^T = exp2(S^T * scale_log2 - LSE2_i), the mask's zeros
                    for e in cutlass.range_constexpr(cute.size(acc_s)):
                        acc_s[e] = softmax_p(acc_s[e], scale_log2,
                                             -sLSE[score_coords[e][1], stage])
                    self.mask_scores(acc_s, score_coords, seqlen_k - j * bn,
                                     seqlen_q - i * bm, i * bm + causal_offset - j * bn,
                                     window)
                    p_vals = cute.make_rmem_tensor_like(acc_s, self.dtype)
                    p_vals.store(acc_s.load().to(self.dtype))  # rnd(P^T)
                if const_expr(self.q_stages == 1):
                    # one P/dS buffer: the other warpgroup's MMAs of the previous visit,
                    # which read all of it, must be done before it is written again (with
                    # two, the previous visit's dS barrier already says so, as in math)
                    pds_free.arrive_and_wait()
                cute.autovec_copy(p_vals, p_slots[None, None, None, stage])
                # [ds] dS^T = P^T (dP^T - D_i), then rnd(dS^T)
                warpgroup.wait_group(0)
                for e in cutlass.range_constexpr(cute.size(acc_dp)):
                    acc_dp[e] = ds_value(acc_s[e], acc_dp[e], sDelta[score_coords[e][1], stage])
                ds_vals = cute.make_rmem_tensor_like(acc_dp, self.dtype)
                ds_vals.store(acc_dp.load().to(self.dtype))
                cute.autovec_copy(ds_vals, ds_slots[None, None, None, stage])
                cute.arch.fence_view_async_shared()
                ds_full.arrive_and_wait()  # both warpgroups' P^T and dS^T are written
                # [dq_partial] dQ_ij = rnd(dS) K_j, a fresh accumulator, first: it is
                # staged for the dQ writer while dV and dK run
                acc_dq = cute.make_rmem_tensor(thr_dq.partition_shape_C((bm, d)), Float32)
                gemm(mma_dq, acc_dq, a_ds[None, None, None, stage], b_kt, zero_init=True)
                # [dv_step] dV_j += rnd(P^T) dO_i
                gemm(mma_dv, acc_dv, a_pt[None, None, None, stage],
                     b_dot[None, None, None, stage], zero_init=False)
                # [dk_step] dK_j += rnd(dS^T) Q_i
                gemm(mma_dk, acc_dk, a_dst[None, None, None, stage],
                     b_qt[None, None, None, stage], zero_init=False)
                warpgroup.wait_group(2)  # the partial (groups retire in order)
                self.stage_partial(acc_dq, my_dq_slots, pipe_dq, dq_state, lane)
                dq_state.advance()
                warpgroup.wait_group(1)  # dV: dO is read no more
                pipe_do.consumer_release(q_state)
                warpgroup.wait_group(0)
                pipe_q.consumer_release(q_state)
                q_state.advance()
            view = Int32(0) if const_expr(self.packed) else b  # packed: one view
            if const_expr(self.per_head):
                if has_visits:  # the stores below read registers only
                    pipe_kv.consumer_release(kv_state)
                    kv_state.advance()
                # fp32, unscaled, per query head (the GQA pass sums heads)
                self.store_dkv_rows(acc_dk, acc_dv, dk_coords, dv_coords, mdK, mdV, h, view,
                                    k_first, j, seqlen_k, softmax_scale)
            elif has_visits:
                # a packed batch's last, partial tile of a sequence from registers, each row
                # only inside it (a TMA store would write the next one's rows); every other
                # tile through sK and sV, which go back to the loader after the stores
                partial = False
                if const_expr(self.packed):
                    partial = (j + 1) * bn > seqlen_k
                if partial:
                    pipe_kv.consumer_release(kv_state)
                    self.store_dkv_rows(acc_dk, acc_dv, dk_coords, dv_coords, mdK, mdV,
                                        h // group, view, k_first, j, seqlen_k, softmax_scale)
                else:
                    shifted = self.shifted_out(out, k_first) if const_expr(self.packed) else out
                    self.store_dkv_kv(acc_dk, acc_dv, shifted, epi_slots, epi_bar, tid, view,
                                      h // group, j, softmax_scale)
                    pipe_kv.consumer_release(kv_state)
                kv_state.advance()
            else:
                # no visit: dK = rnd(0 * scale) = 0 and dV = 0 from registers (the loader
                # may be filling sK and sV for a later chain already)
                self.store_rows(None, dk_coords, mdK, h // group, view, k_first, j, seqlen_k)
                self.store_rows(None, dv_coords, mdV, h // group, view, k_first, j, seqlen_k)
        if tid < 32:
            cute.arch.cp_async_bulk_wait_group(0, read=False)

    @cute.jit
    def store_dkv_kv(self, acc_dk, acc_dv, out, epi_slots, epi_bar, tid, b, h_kv, j,
                     softmax_scale):
        """[epilogue] of a head-dim split's chain, one query head per KV head: ``dK =
        rnd(dK_j * scale)`` and ``dV = rnd(dV_j)`` into the outputs through sK and sV (free
        once both warpgroups' last MMAs of the chain are done: the first barrier) by TMA
        stores, drained before the caller hands sK and sV back to the loader. TMA clips
        rows past S_k."""
        (sK, sV), tdK, tdV, tma_dk, tma_dv = out
        to_dk, to_dv = epi_slots
        bn = self.bn
        gdK = cute.local_tile(tdK[None, None, h_kv, b], (bn, self.d), (j, 0))
        gdV = cute.local_tile(tdV[None, None, h_kv, b], (bn, self.dv), (j, 0))
        epi_bar.arrive_and_wait()
        self.rounded_to_smem(acc_dv, to_dv, softmax_scale, False)
        self.rounded_to_smem(acc_dk, to_dk, softmax_scale, True)
        self.publish(epi_bar)
        self.tma_store(tma_dv, sV, gdV, tid)
        self.tma_store(tma_dk, sK, gdK, tid)
        self.drain(epi_bar, tid)

    def stmatrix_slots(self, tiled_mma, tid, s_tile):
        """``(copy, slots)``: this thread's part of ``tiled_mma``'s accumulator tile over the
        shared ``s_tile``, written by ``stmatrix`` (a warp's lanes trade values so that each
        stores whole 16-byte rows, as the forward's O: ``DashForwardSm90._o_store_copy``;
        element-wise stores to the swizzled tile spilled at d = 256)."""
        atom = cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        copy = cute.make_tiled_copy_C(atom, tiled_mma).get_slice(tid)
        return copy, copy.partition_D(s_tile)

    @cute.jit
    def rounded_to_smem(self, acc, to_smem, scale, scaled: cutlass.Constexpr[bool]):
        """``rnd(acc * scale)`` (``rnd(acc)`` unless ``scaled``; :meth:`tile_to_smem`'s
        arithmetic) through ``to_smem``, a :meth:`stmatrix_slots` pair."""
        copy, slots = to_smem
        vals = cute.make_rmem_tensor_like(acc, self.dtype)
        if const_expr(scaled):
            vals.store((acc.load() * scale).to(self.dtype))  # one fp32 multiply, one RNE cast
        else:
            vals.store(acc.load().to(self.dtype))
        cute.copy(copy, copy.retile(vals), slots)

    @cute.jit
    def store_rows(self, vals, coords, m_out, h, b, first_row, j, seqlen_k):
        """A chain's tile from registers into ``m_out[first_row + key, col, h, b]`` (zeros
        where ``vals`` is None), keys ``j * BN + r`` past ``seqlen_k`` never written. A
        thread's accumulator covers two key rows (wgmma layout: registers 0 and 2 start
        them); addresses are formed per row so that no per-element 64-bit offset stays
        live."""
        per_row = cute.size(coords) // 2
        for half in cutlass.range_constexpr(2):
            key = j * self.bn + coords[2 * half][0]
            if key < seqlen_k:
                row = m_out[first_row + key, None, h, b]
                for n in cutlass.range_constexpr(per_row):
                    e = (n % 2) + 2 * half + 4 * (n // 2)
                    if const_expr(vals is None):
                        row[coords[e][1]] = m_out.element_type(0.0)
                    else:
                        row[coords[e][1]] = vals[e]

    @cute.jit
    def capped_probabilities(self, acc_s, coords, sLSE, stage, scale_log2, cap, keys_left,
                             rows_left, diagonal, window=None):
        """[softcap], [softmax_p] (masked elements exactly 0) and [softcap_grad] of a softcap
        variant: returns the rounded ``P^T`` as the dV MMA's register operand and in the
        accumulator's layout (:func:`.layouts.acc_as_operand_a`: a head-dim split stores
        that one to shared memory), and leaves ``P^T (1 - t^2)`` in ``acc_s`` for [ds]
        (``dash_ref.arithmetic.steps.softcap_grad``'s fast order). Tiles that need no mask
        skip the selects by a branch, as :meth:`mask_scores` does (selecting on every tile
        doubled the registers spilled)."""
        p_words = cute.make_rmem_tensor(cute.size(acc_s) // 2, Int32)
        if const_expr(self.select_every_tile):  # noqa: SIM114 - compile time, then run time
            self.capped_pairs(acc_s, p_words, coords, sLSE, stage, scale_log2, cap, True,
                              keys_left, rows_left, diagonal, window)
        elif mask.needs_mask(self.mask, keys_left, diagonal, self.bn, rows_left, self.bm,
                             window):
            self.capped_pairs(acc_s, p_words, coords, sLSE, stage, scale_log2, cap, True,
                              keys_left, rows_left, diagonal, window)
        else:
            self.capped_pairs(acc_s, p_words, coords, sLSE, stage, scale_log2, cap, False,
                              keys_left, rows_left, diagonal, window)
        return acc_as_operand_a(acc_s, self.dtype,
                                cute.recast_ptr(p_words.iterator, dtype=self.dtype))

    @cute.jit
    def capped_pairs(self, acc_s, p_words, coords, sLSE, stage, scale_log2, cap,
                     masked: cutlass.Constexpr, keys_left, rows_left, diagonal, window=None):
        """The elements of :meth:`capped_probabilities`, two at a time (one ``cvt`` packs a
        pair of rounded probabilities); ``masked``: select the invisible ones to 0."""
        k, softcap = cap
        neg_two_cap = softcap * Float32(-2.0)  # exact
        for pair in cutlass.range_constexpr(cute.size(acc_s) // 2):
            probs = []
            for e in (2 * pair, 2 * pair + 1):
                r = softcap_ratio(acc_s[e], k)
                p = softmax_p(capped_score(r, neg_two_cap, softcap), scale_log2,
                              -sLSE[coords[e][1], stage])
                if const_expr(masked):
                    seen = mask.visible(self.mask, coords[e][0], coords[e][1], keys_left,
                                        diagonal, rows_left, window)
                    p = cutlass.select_(seen, p, Float32(0.0))
                probs.append(p)
                acc_s[e] = softcap_slope(p, r)
            p_words[pair] = cvt_pack(probs[0], probs[1], self.cvt_kind)

    @cute.jit
    def mask_scores(self, acc_s, coords, keys_left, rows_left, diagonal, window=None):
        """[softmax_p] masked elements of P^T become exactly 0 (a select, not a multiply).

        In tile-local coordinates (key row ``r``, query column ``c``) an element is visible
        iff ``r < keys_left`` (key < S_k), ``c < rows_left`` (query < S_q) and, causal,
        ``r - c <= diagonal`` (key <= query + S_k - S_q), or, window (its run-time
        extents ``(left, right)``), ``diagonal - left <= r - c <= diagonal + right``:
        :func:`.mask.visible`. Tiles that need none of the tests skip the selects by a
        branch, unless the variant selects on every tile
        (``BackwardConfig.select_every_tile``). The schedule's tables list only active tile
        pairs, so a window's visits are those its rule leaves a key in.
        """
        if const_expr(self.select_every_tile):  # noqa: SIM114 - compile time, then run time
            self.select_visible(acc_s, coords, keys_left, rows_left, diagonal, window)
        elif mask.needs_mask(self.mask, keys_left, diagonal, self.bn, rows_left, self.bm,
                             window):
            self.select_visible(acc_s, coords, keys_left, rows_left, diagonal, window)

    @cute.jit
    def select_visible(self, acc_s, coords, keys_left, rows_left, diagonal, window=None):
        """The selects of :meth:`mask_scores`, one per element."""
        for e in cutlass.range_constexpr(cute.size(acc_s)):
            r, c = coords[e][0], coords[e][1]
            seen = mask.visible(self.mask, r, c, keys_left, diagonal, rows_left, window)
            acc_s[e] = cutlass.select_(seen, acc_s[e], Float32(0.0))

    @cute.jit
    def store_dkv_tma(self, acc_dk, acc_dv, out, epi_bar, tid, b, h_kv, j, softmax_scale,
                      next_stage):
        """[epilogue] of a chain, one query head per KV head: ``dK = rnd(dK_j * scale)`` and
        ``dV = rnd(dV_j)`` into the outputs, through shared memory and TMA stores.

        The tiles go to the dS buffers, free once both warpgroups' last dQ MMA is done (the
        first barrier). Overlapped: both tiles in the buffer the next visit (``next_stage``)
        does not write; the visit after it does, once warp 0 has seen the stores read it
        (before the next visit's dS barrier). Otherwise dV, then dK, each drained before the
        buffers are written again. TMA clips rows past S_k.
        """
        sEpi, tdK, tdV, tma_dk, tma_dv = out
        bn, d = self.bn, self.d
        # this thread's slots, from an MMA object the visit loop never touched (partitions of
        # the loop's own carry its accumulate flag out of the loop)
        epi_slots = self._tiled_mmas()[1].get_slice(tid).partition_C(sEpi)
        gdK = cute.local_tile(tdK[None, None, h_kv, b], (bn, d), (j, 0))
        gdV = cute.local_tile(tdV[None, None, h_kv, b], (bn, d), (j, 0))
        if const_expr(self.epilogue_overlapped):
            v_slot = 2 * (self.q_stages - 1 - next_stage)
            k_slot = v_slot + 1
            if tid < 32:  # (only matters after a chain without visits)
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            epi_bar.arrive_and_wait()
            self.tile_to_smem(acc_dv, epi_slots[None, None, None, v_slot], softmax_scale, False)
            self.tile_to_smem(acc_dk, epi_slots[None, None, None, k_slot], softmax_scale, True)
            self.publish(epi_bar)
            self.tma_store(tma_dv, sEpi[None, None, v_slot], gdV, tid)
            self.tma_store(tma_dk, sEpi[None, None, k_slot], gdK, tid)
            if tid < 32:
                cute.arch.cp_async_bulk_commit_group()
        else:
            epi_bar.arrive_and_wait()
            self.tile_to_smem(acc_dv, epi_slots[None, None, None, 0], softmax_scale, False)
            self.publish(epi_bar)
            self.tma_store(tma_dv, sEpi[None, None, 0], gdV, tid)
            self.drain(epi_bar, tid)
            self.tile_to_smem(acc_dk, epi_slots[None, None, None, 0], softmax_scale, True)
            self.publish(epi_bar)
            self.tma_store(tma_dk, sEpi[None, None, 0], gdK, tid)
            self.drain(epi_bar, tid)

    @cute.jit
    def store_dkv_scratch(self, acc_dk, acc_dv, out, epi_bar, tid, b, h, j):
        """[epilogue] of a chain with several query heads per KV head (or audit): the fp32
        accumulators of query head ``h``, unscaled, into the per-head scratch (the GQA pass
        sums heads), through shared memory and TMA stores: dV, then dK, each as one fp32
        tile over sK and sV, free once both warpgroups' last MMAs are done (the first
        barrier) and drained before the caller hands them back to the loader. TMA clips rows
        past S_k.
        """
        sEpi, tdK, tdV, tma_dk, tma_dv = out
        bn, d = self.bn, self.d
        epi_slots = self._tiled_mmas()[1].get_slice(tid).partition_C(sEpi)
        gdK = cute.local_tile(tdK[None, None, h, b], (bn, d), (j, 0))
        gdV = cute.local_tile(tdV[None, None, h, b], (bn, d), (j, 0))
        epi_bar.arrive_and_wait()
        for acc, tma, g_tile in ((acc_dv, tma_dv, gdV), (acc_dk, tma_dk, gdK)):
            cute.autovec_copy(acc, epi_slots)
            self.publish(epi_bar)
            self.tma_store(tma, sEpi, g_tile, tid)
            self.drain(epi_bar, tid)

    @cute.jit
    def tile_to_smem(self, acc, slots, scale, scaled: cutlass.Constexpr[bool]):
        """``rnd(acc * scale)`` (``rnd(acc)`` unless ``scaled``) into this thread's ``slots``."""
        vals = cute.make_rmem_tensor_like(acc, self.dtype)
        if const_expr(scaled):
            vals.store((acc.load() * scale).to(self.dtype))  # one fp32 multiply, one RNE cast
        else:
            vals.store(acc.load().to(self.dtype))
        cute.autovec_copy(vals, slots)

    @cute.jit
    def publish(self, bar):
        """Make every math thread's shared-memory writes visible to the TMA unit."""
        cute.arch.fence_view_async_shared()
        bar.arrive_and_wait()

    @cute.jit
    def tma_store(self, tma, s_tile, g_tile, tid):
        """Warp 0 of the math threads issues the TMA store of ``s_tile`` to ``g_tile``."""
        if tid < 32:
            s_t, g_t = tma_tiles(tma, s_tile, g_tile)
            cute.copy(tma, s_t, g_t)

    @cute.jit
    def drain(self, bar, tid):
        """Every math thread waits until the issued stores have read shared memory."""
        if tid < 32:
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)
        bar.arrive_and_wait()

    @cute.jit
    def shifted_out(self, out, k_first):
        """Packed: the epilogue's TMA store tensors ``out`` with their rows counted from key
        row ``k_first`` (``domain_offset``, as the loader's)."""
        sEpi, tdK, tdV, tma_dk, tma_dv = out
        return (sEpi, cute.domain_offset((k_first, None, None, None), tdK),
                cute.domain_offset((k_first, None, None, None), tdV), tma_dk, tma_dv)

    @cute.jit
    def store_dkv_rows(self, acc_dk, acc_dv, dk_coords, dv_coords, mdK, mdV, h, b, first_row,
                       j, seqlen_k, softmax_scale):
        """[epilogue] of a chain straight from registers (:meth:`store_rows`: rows past
        ``seqlen_k`` never written): per query head (GQA or audit) the fp32 accumulators,
        unscaled, into the scratch (the GQA pass sums heads); otherwise ``rnd(dK_j *
        scale)`` and ``rnd(dV_j)`` (:meth:`tile_to_smem`'s arithmetic) into the outputs.
        Taken by a packed sequence's last, partial KV tile (a TMA store would write the next
        sequence's rows), by per-head chains without visits (sK and sV may hold a later
        chain's K and V already), and by a head-dim split's per-head chains."""
        if const_expr(self.per_head):
            dk_vals, dv_vals = acc_dk, acc_dv
        else:
            dk_vals = cute.make_rmem_tensor_like(acc_dk, self.dtype)
            dk_vals.store((acc_dk.load() * softmax_scale).to(self.dtype))
            dv_vals = cute.make_rmem_tensor_like(acc_dv, self.dtype)
            dv_vals.store(acc_dv.load().to(self.dtype))
        self.store_rows(dk_vals, dk_coords, mdK, h, b, first_row, j, seqlen_k)
        self.store_rows(dv_vals, dv_coords, mdV, h, b, first_row, j, seqlen_k)


def shared_bytes(dtype, config: BackwardConfig, head_dim: int, head_dim_v: int | None = None
                 ) -> int:
    """Shared memory of one CTA: the size of :func:`storage`, which the kernel allocates.

    227 KiB at d = 64 and 226 KiB at d = 128 (bf16/fp16, rounded up to the struct's 1 KiB
    alignment): one CTA per SM, within the 227 KiB
    an sm_90 CTA may use (the launcher reads the device's limits and checks).
    """
    return storage(dtype, config, head_dim, head_dim_v).size_in_bytes()


__all__ = ["LAUNCH_ARGS", "MASK_KINDS", "DashBackwardSm90", "Tables", "shared_bytes",
           "staging_coords", "storage"]
