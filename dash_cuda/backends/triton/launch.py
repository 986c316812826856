"""Launch the Triton kernels: the forward, and the persistent backward over a schedule's tables."""

from __future__ import annotations

import math
import os

import torch
import triton

from dash_cuda import triton_launch
from dash_cuda.backends import (
    Launch,
    device_properties,
    new_output,
    new_packed_row_stats,
    new_row_stats,
)
from dash_cuda.tables import PACKED_TABLE_NAMES, TABLE_NAMES
from dash_ref import Mask
from dash_ref.arithmetic.steps import scale_log2_value, softcap_constants

from .bwd_kernel import dash_bwd_kernel
from .config import backward_config, forward_config
from .fwd_kernel import dash_fwd_kernel


def window_extents(mask: Mask) -> dict:
    """The kernels' ``WINDOW_LEFT``, ``WINDOW_RIGHT``: a window's own extents (runtime
    integers), None for the other kinds, which Triton then drops (those kernels compile as
    they did before windows)."""
    if mask.kind != "window":
        return dict(WINDOW_LEFT=None, WINDOW_RIGHT=None)
    return dict(WINDOW_LEFT=mask.left, WINDOW_RIGHT=mask.right)


def score_features(softmax_scale: float, softcap: float = 0.0,
                   sink2: torch.Tensor | None = None) -> tuple[float, dict]:
    """The forward's ``scale_log2`` and its optional-feature keywords: without softcap
    ``fp32(softmax_scale log2 e)``; with it ``fp32(log2 e)`` (the scale enters before the
    cap, :mod:`.softcap`). Features not asked for are None, which Triton drops."""
    if not softcap:
        return scale_log2_value(softmax_scale), dict(SINK2=sink2)
    return scale_log2_value(1.0), dict(SOFTCAP=softcap, SOFTMAX_SCALE=softmax_scale,
                                       SINK2=sink2)


def run_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask,
                softmax_scale: float, poison: bool = False, softcap: float = 0.0,
                sink2: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``O`` ``(B, S_q, H, d_v)`` (``q``'s strides where ``d_v = d``) and fp32 ``LSE2`` of
    shape ``(B, S_q, H)``; with
    ``softcap`` (> 0) the scores capped, with ``sink2`` (fp32 ``(H,)``, base 2) the sinks
    folded in (LSE2 includes them)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv, head_dim_v = k.shape[1], k.shape[2], v.shape[3]
    o = new_output(q, v)
    # each head's rows contiguous: the backward loads a Q tile's LSE2 values as vectors
    lse2 = new_row_stats(batch, seqlen_q, heads, q.device)
    if poison:
        o.fill_(math.nan)
        lse2.fill_(math.nan)
    cfg = forward_config(head_dim, head_dim_v)
    scale_log2, features = score_features(softmax_scale, softcap, sink2)
    grid = (triton.cdiv(seqlen_q, cfg.block_m), batch * heads)
    triton_launch.launch(dash_fwd_kernel, grid, (
        q, k, v, o, lse2,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        lse2.stride(0), lse2.stride(1), lse2.stride(2),
        heads, heads // heads_kv, seqlen_q, seqlen_k, seqlen_k - seqlen_q, scale_log2),
        dict(BM=cfg.block_m, BN=cfg.block_n, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
             MASK=mask.kind, **window_extents(mask), **features),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return o, lse2


def run_forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing,
                       mask: Mask, softmax_scale: float, poison: bool = False,
                       softcap: float = 0.0, sink2: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed batch (:class:`dash_cuda.options.Packing`): ``O`` ``(total_q, H, d_v)``
    (like ``q`` where ``d_v = d``), and fp32 ``LSE2`` ``(total_q, H)``, a view of an ``(H,
    total_q)`` buffer. The grid covers ``max_seqlen_q`` rows of every sequence and head; a
    program past its sequence's end returns at once. ``softcap``, ``sink2`` as in
    :func:`run_forward`."""
    total_q, heads, head_dim = q.shape
    heads_kv, head_dim_v = k.shape[1], v.shape[2]
    o = new_output(q, v)
    lse2 = new_packed_row_stats(total_q, heads, q.device)
    if poison:
        o.fill_(math.nan)
        lse2.fill_(math.nan)
    cfg = forward_config(head_dim, head_dim_v)
    scale_log2, features = score_features(softmax_scale, softcap, sink2)
    grid = (triton.cdiv(packing.max_seqlen_q, cfg.block_m), packing.batch * heads)
    if grid[0] == 0:
        return o, lse2
    triton_launch.launch(dash_fwd_kernel, grid, (
        q, k, v, o, lse2,
        0, q.stride(0), q.stride(1),
        0, k.stride(0), k.stride(1),
        0, v.stride(0), v.stride(1),
        0, o.stride(0), o.stride(1),
        0, lse2.stride(0), lse2.stride(1),
        heads, heads // heads_kv, packing.max_seqlen_q, packing.max_seqlen_k, 0, scale_log2),
        dict(BM=cfg.block_m, BN=cfg.block_n, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
             MASK=mask.kind, CU_SEQLENS_Q=packing.cu_seqlens_q.contiguous(),
             CU_SEQLENS_K=packing.cu_seqlens_k.contiguous(), VARLEN=True,
             **window_extents(mask), **features),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return o, lse2


def _strides(x: torch.Tensor, packed: bool) -> tuple[int, int, int]:
    """``(batch, row, head)`` strides of a ``(B, S, H, ...)`` tensor, or of a packed
    ``(total, H, ...)`` one (batch stride 0: a sequence's rows start at its first row)."""
    return (0, x.stride(0), x.stride(1)) if packed else (x.stride(0), x.stride(1), x.stride(2))


def _backward_args(launch: Launch) -> tuple[tuple, dict]:
    """The backward kernel's positional arguments and its compile-time options."""
    p = launch.problem
    packed = p.is_packed
    q, k, v, do, lse2 = launch.q, launch.k, launch.v, launch.do, launch.lse2
    dk_out, dv_out = launch.dk_out, launch.dv_out
    cfg = backward_config(p.head_dim, p.head_dim_v)
    if (cfg.block_m, cfg.block_n) != (p.block_m, p.block_n):
        raise ValueError(f"the problem's tiles {p.block_m}x{p.block_n} are not the kernel's "
                         f"{cfg.block_m}x{cfg.block_n}")
    names = (*TABLE_NAMES, *PACKED_TABLE_NAMES) if packed else TABLE_NAMES
    if launch.tables is None:  # sizing the grid: any int32 tensors compile the same kernel
        placeholder = torch.zeros(4, device=q.device, dtype=torch.int32)
        tables, sem, partials = dict.fromkeys(names, placeholder), placeholder, None
    else:
        tables, sem, partials = launch.tables, launch.sem, launch.partials
    args = (
        q, k, v, do, lse2, launch.delta, launch.dq_acc, dk_out, dv_out, sem,
        launch.dq_acc if partials is None else partials,
        *(tables[name] for name in TABLE_NAMES),
        *_strides(q, packed), *_strides(k, packed), *_strides(v, packed),
        *_strides(do, packed), *_strides(lse2, packed), *_strides(dk_out, packed),
        *_strides(dv_out, packed),
        p.heads, p.group, p.seqlen_q, p.seqlen_k, p.n_q, 0 if packed else p.causal_offset,
        # with softcap the scale enters before the cap: the softmax takes log2(e) alone
        scale_log2_value(1.0 if launch.softcap else launch.softmax_scale), launch.softmax_scale,
    )
    mask = p.visibility  # the rule as a value: a window's kind and extents included
    options = dict(
        BM=p.block_m, BN=p.block_n, HEAD_DIM=p.head_dim, HEAD_DIM_V=p.head_dim_v,
        MASK=mask.kind, **window_extents(mask),
        DETERMINISTIC=launch.deterministic, AUDIT=launch.audit, PER_HEAD=launch.per_head,
        PREFETCH=cfg.prefetch, EXACT=launch.exact, SOFTCAP=launch.softcap or None,
        # exact: the ratio form's constant fp32(2 softmax_scale log2(e) / softcap)
        SOFTCAP_K=softcap_constants(launch.softmax_scale, launch.softcap)[0]
        if launch.softcap and launch.exact else None,
        OPAQUE=os.environ.get("TRITON_INTERPRET", "0") != "1",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=not launch.exact,
    )
    if packed:  # the sequences' offsets, and where each sequence's dQ tiles start
        options.update(CU_SEQLENS_Q=launch.cu_seqlens_q, CU_SEQLENS_K=launch.cu_seqlens_k,
                       Q_TILE_BASE=tables["q_tile_base"], VARLEN=True)
    return args, options


def blocks_per_sm(kernel, device: torch.device) -> int:
    """How many programs of a compiled kernel fit on one SM at once (registers, smem, threads)."""
    props = device_properties(device)
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


def max_workers(launch: Launch) -> int:
    """Programs of this launch's compiled backward kernel that fit on the device at once."""
    args, options = _backward_args(launch)
    kernel = dash_bwd_kernel.warmup(*args, grid=(launch.num_workers,), **options)
    device = launch.q.device
    return device_properties(device).multi_processor_count * blocks_per_sm(
        kernel, device)


def run_schedule(launch: Launch) -> None:
    """One program per worker; the grid never exceeds what is resident (checked before)."""
    args, options = _backward_args(launch)
    named = {n: value for n, value in options.items() if n not in _COMPILE_OPTIONS}
    triton_launch.launch(dash_bwd_kernel, (launch.num_workers,), args, named,
                         **{n: options[n] for n in _COMPILE_OPTIONS})


#: the keywords of ``_backward_args``'s options that are compile options, not parameters
_COMPILE_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")
