"""Host side of the CuTe kernels: compiled kernels, the buffers they read, the launches.

Kernels are specialized on a :mod:`.variants` value (dtype, head dim, mask kind, flags and
configuration) only; shapes and strides are run-time values. A compiled kernel is kept per
variant in memory; ``DASH_CUTE_AOT_DIR`` names a folder of kernels exported
ahead of time (:func:`export_kernels`, ``python -m dash_cuda.warmup --cute-aot DIR``), which
load in milliseconds instead of compiling for a second or two; the folder records the
digest of the sources its kernels were made from (:func:`kernel_sources_digest`), and a
process whose sources differ compiles instead of loading a stale kernel. Kernels are called through
CuTe DSL's TVM-FFI entry with plain Python values (:data:`COMPILE_OPTIONS`), made by name
from each kernel's ``LAUNCH_ARGS`` (:mod:`.arguments`).

Layouts the kernel reads (:mod:`.bwd_kernel` says why):

* ``LSE2`` and ``D`` as padded contiguous fp32 ``(B * H, n_q * BM)`` (:func:`pad_row_stats`);
* ``dQacc`` as fp32 ``(B * H * n_q, BM * d)``, each tile one contiguous chunk in staging
  order (:func:`dq_acc_rows` turns it into ``(B, S_q, H, d)``); audit partials likewise
  ``(V, BM * d)`` (:func:`tiles_to_rows`).

Packed batches: ``dQacc`` is ``(num_q_tiles, BM * d)``, tile ``t`` the dQ tile numbered
``problem.q_tile_index(b, h, i)`` (the semaphores' numbering); ``LSE2`` and ``D`` are
gathered into the same tile-major order, ``(num_q_tiles, BM)`` (:mod:`.packed_rows`;
slots past a sequence's end are 0, masked).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import lru_cache

import torch

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")  # compile for Hopper, with or without a GPU

import cutlass.cute as cute  # noqa: E402

from dash_cuda.backends import (  # noqa: E402
    Launch,
    device_properties,
    new_output,
    new_packed_row_stats,
    new_row_stats,
)
from dash_cuda.tables import TABLE_NAMES  # noqa: E402
from dash_ref import Mask, Problem  # noqa: E402
from dash_ref.arithmetic.steps import scale_log2_value, softcap_constants  # noqa: E402

from . import arguments, bwd_kernel, fwd_kernel, mask  # noqa: E402
from .bwd_kernel import PROBE_CHAIN_SLOTS, PROBE_VISIT_SLOTS, staging_coords  # noqa: E402
from .config import forward_config, tiling_mask  # noqa: E402
from .layouts import NUM_THREADS  # noqa: E402
from .packed_rows import tile_stats, tile_table  # noqa: E402
from .variants import DTYPES, ForwardVariant, Variant, backward_variant  # noqa: E402

#: registers per thread at launch (ptxas -v, every variant), before setmaxnreg rebalances
REGISTERS_AT_LAUNCH = 168
_BACKWARD_ARGS = arguments.names(bwd_kernel.LAUNCH_ARGS)
_FORWARD_ARGS = arguments.names(fwd_kernel.LAUNCH_ARGS)


def variant_of(launch: Launch) -> Variant:
    """The backward variant that runs ``launch`` (its mask's kind: a window's is its own)."""
    p = launch.problem
    return _variant(launch.q.dtype, p.head_dim, p.visibility.kind, launch.deterministic,
                    launch.audit, launch.per_head, p.is_packed, launch.softcap > 0,
                    p.head_dim_v)


@lru_cache(maxsize=256)
def _variant(dtype, head_dim, kind, deterministic, audit, per_head, packed, softcap=False,
             head_dim_v=None) -> Variant:
    return backward_variant(dtype, head_dim, kind, deterministic, audit, per_head,
                            packed=packed, softcap=softcap, head_dim_v=head_dim_v)


def window_args(rule: Mask, seqlen_q: int, seqlen_k: int) -> dict[str, int]:
    """The launch arguments ``window_left`` and ``window_right``: a window's extents as the
    kernels take them (:func:`.mask.extents`); kernels of the other kinds never read them."""
    left, right = mask.extents(rule, seqlen_q, seqlen_k) if rule.kind == "window" else (0, 0)
    return {"window_left": left, "window_right": right}


#: every kernel is compiled with CuTe DSL's TVM-FFI host entry: a call takes plain Python
#: values (``data_ptr()`` ints, int tuples, floats, the stream handle) in about 5 us, where
#: the default entry spent 66 - 170 us converting ``cute`` argument objects (docs/design.md
#: section 9)
COMPILE_OPTIONS = "--gpu-arch=sm_90a --enable-tvm-ffi"


def compile_object(kernel_object, placeholder_args: list, options: str = ""):
    """``cute.compile`` a kernel object for sm_90a (no GPU needed) with the TVM-FFI entry;
    ``options`` as CuTe DSL's (``"--keep-ptx --dump-dir=DIR"`` keeps the PTX)."""
    return cute.compile(kernel_object, *placeholder_args,
                        options=f"{COMPILE_OPTIONS} {options}".strip())


def compile_kernel(v: Variant | ForwardVariant, options: str = ""):
    """:func:`compile_object` of one variant."""
    return compile_object(v.kernel_object(), v.placeholder_args(), options)


#: the modules a compiled kernel is made from (with :data:`COMPILE_OPTIONS`)
KERNEL_SOURCES = tuple(f"backends/cute/{name}.py" for name in (
    "arguments", "bwd_kernel", "config", "fwd_kernel", "layouts", "mask", "ptx", "variants",
)) + ("tables.py",)
#: the file of an export folder that holds :func:`kernel_sources_digest`
SOURCES_FILE = "kernel_sources.sha256"


@lru_cache(maxsize=1)
def kernel_sources_digest() -> str:
    """SHA-256 of :data:`KERNEL_SOURCES` and :data:`COMPILE_OPTIONS`: kernels exported by a
    process with another digest may differ from the ones this process would compile."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    digest = hashlib.sha256(COMPILE_OPTIONS.encode())
    for path in KERNEL_SOURCES:
        with open(os.path.join(package, path), "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    return digest.hexdigest()


def exported_digest(folder: str) -> str | None:
    """The digest ``folder``'s kernels were exported with (None: no record)."""
    try:
        with open(os.path.join(folder, SOURCES_FILE)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


@lru_cache(maxsize=8)
def _folder_matches(folder: str) -> bool:
    """Whether ``folder`` holds kernels of this process's sources; warns once if not."""
    found = exported_digest(folder)
    if found != kernel_sources_digest():
        warnings.warn(f"DASH_CUTE_AOT_DIR={folder} was exported from "
                      f"{'other' if found else 'unrecorded'} kernel sources; compiling instead",
                      stacklevel=3)
        return False
    return True


_cache: dict[Variant | ForwardVariant, object] = {}
_lock = threading.Lock()


def get_kernel(v: Variant | ForwardVariant):
    """The compiled kernel of ``v``: from memory, from ``$DASH_CUTE_AOT_DIR`` (exported from
    the same sources), or compiled."""
    with _lock:
        hit = _cache.get(v)
    if hit is not None:
        return hit
    kernel = None
    folder = os.environ.get("DASH_CUTE_AOT_DIR")
    if (folder and os.path.exists(os.path.join(folder, v.name + ".o"))
            and _folder_matches(folder)):
        try:
            kernel = load_exported(folder, v.name)
        except Exception as exc:  # noqa: BLE001 - an unloadable object: compile instead
            warnings.warn(f"could not load {v.name} from {folder} ({exc}); compiling it",
                          stacklevel=2)
    if kernel is None:
        kernel = compile_kernel(v)
    with _lock:
        _cache[v] = kernel
    return kernel


def export_kernel(kernel, folder: str, name: str) -> None:
    """Write a compiled kernel as ``FOLDER/<name>.o`` (:func:`load_exported` reads it) and
    the sources' digest as ``FOLDER/kernel_sources.sha256``; a folder of kernels from
    other sources is refused (its other objects would pass for this digest's)."""
    os.makedirs(folder, exist_ok=True)
    digest, found = kernel_sources_digest(), exported_digest(folder)
    if found not in (None, digest):
        raise ValueError(f"{folder} holds kernels exported from other kernel sources; "
                         "export into an empty folder")
    kernel.export_to_c(os.path.join(folder, name + ".o"), name)
    if found is None:  # written whole, then renamed: exporting processes race here
        scratch = os.path.join(folder, f".{SOURCES_FILE}.{os.getpid()}")
        with open(scratch, "w") as f:
            f.write(digest + "\n")
        os.replace(scratch, os.path.join(folder, SOURCES_FILE))


def export_kernels(variants, folder: str) -> list[str]:
    """Compile ``variants`` and write each as ``FOLDER/<name>.o``; their names. A kernel
    compiled in this process is reused; one loaded from an exported object cannot be
    exported again, so it is compiled."""
    for v in variants:
        with _lock:
            kernel = _cache.get(v)
        if not hasattr(kernel, "export_to_c"):
            kernel = compile_kernel(v)
        export_kernel(kernel, folder, v.name)
    return [v.name for v in variants]


def load_exported(folder: str, name: str):
    """An exported kernel loaded back as a callable (the arguments of a compiled one)."""
    from cutlass.cute.runtime import load_module

    return getattr(load_module(os.path.join(folder, name + ".o"), enable_tvm_ffi=True), name)


# -- buffers ------------------------------------------------------------------------------------
def pad_row_stats(x: torch.Tensor, block_m: int) -> torch.Tensor:
    """A ``(B, S_q, H)`` fp32 row statistic (``LSE2`` or ``D``) as the kernel reads it.

    A contiguous ``(B * H, n_q * block_m)`` buffer, zero past ``S_q``: every Q tile's 1-D bulk
    copy stays inside the buffer (those rows are masked). A view of ``x`` when it already is
    one (``S_q`` a multiple of ``block_m``, laid out as every forward writes it), else a
    padded copy.
    """
    batch, seqlen_q, heads = x.shape
    pad = -seqlen_q % block_m
    if pad == 0 and x.stride() == (heads * seqlen_q, 1, seqlen_q):  # as the forwards write
        return x.as_strided((batch * heads, seqlen_q), (seqlen_q, 1))
    rows = x.permute(0, 2, 1)
    if pad == 0 and rows.is_contiguous():
        return rows.view(batch * heads, seqlen_q)
    return torch.nn.functional.pad(rows, (0, pad)).view(batch * heads, seqlen_q + pad)


def dq_acc_shape(problem: Problem) -> tuple[int, int]:
    """The fp32 accumulator's shape: tile ``t = problem.q_tile_index(b, h, i)`` (rectangular:
    ``(b * H + h) * n_q + i``) is row ``t``, its ``BM * d`` values in staging order."""
    return problem.num_q_tiles, problem.block_m * problem.head_dim


def packed_tile_rows(problem: Problem, device: torch.device
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which packed row each slot of the tile-major layout holds, from
    :func:`.packed_rows.tile_table`: int64 ``(rows, heads)`` and bool ``inside``, each
    ``(num_q_tiles * BM,)``; slot ``r`` of tile ``t`` holds row ``first(t) + r`` of head
    ``head(t)`` where ``inside`` (``rows`` 0 elsewhere). What :func:`dq_acc_rows` of an
    audit reads."""
    table = tile_table(problem, device).long()
    slot = torch.arange(problem.block_m, device=device)
    inside = slot[None, :] < table[:, 1:2]
    rows = torch.where(inside, table[:, 0:1] + slot[None, :], 0)
    heads = table[:, 2:3].expand_as(rows)
    return rows.reshape(-1), heads.reshape(-1), inside.reshape(-1)


_staged: dict[tuple[int, int, str], torch.Tensor] = {}


def staged_index(block_m: int, head_dim: int, device: torch.device) -> torch.Tensor:
    """int32 ``(BM * d,)``: at ``r * d + c``, where element ``(r, c)`` of a tile is staged.

    The inverse of :func:`.bwd_kernel.staging_coords`; reading a tile through it gives the
    row-major tile (a gather, so that writes of the result are contiguous).
    """
    key = (block_m, head_dim, str(device))
    if key not in _staged:
        coords = torch.tensor(staging_coords(block_m, head_dim), dtype=torch.int64)
        index = torch.empty(len(coords), dtype=torch.int32)
        index[coords[:, 0] * head_dim + coords[:, 1]] = torch.arange(len(coords),
                                                                    dtype=torch.int32)
        _staged[key] = index.to(device)
    return _staged[key]


def tiles_to_rows(tiles: torch.Tensor, block_m: int, head_dim: int) -> torch.Tensor:
    """``(N, BM * d)`` tiles in staging order as ``(N, BM, d)`` row-major (a copy)."""
    index = staged_index(block_m, head_dim, tiles.device).long()
    return tiles[:, index].reshape(tiles.shape[0], block_m, head_dim)


def dq_acc_rows(dq_acc: torch.Tensor, problem: Problem) -> torch.Tensor:
    """The accumulator as a contiguous fp32 ``(B, S_q, H, d)`` (rows past ``S_q`` dropped;
    packed: ``(total_q, H, d)``, each sequence's rows from its own tiles)."""
    p = problem
    if p.is_packed:
        out = dq_acc.new_zeros(p.total_q, p.heads, p.head_dim)
        rows, heads, inside = packed_tile_rows(p, dq_acc.device)
        if rows.numel():
            tiles = tiles_to_rows(dq_acc, p.block_m, p.head_dim).view(-1, p.head_dim)
            out[rows[inside], heads[inside]] = tiles[inside]
        return out
    rows = tiles_to_rows(dq_acc, p.block_m, p.head_dim).reshape(p.batch, p.heads, -1,
                                                                  p.head_dim)
    return rows[:, :, :p.seqlen_q].permute(0, 2, 1, 3).contiguous()


# -- residency and launch -------------------------------------------------------------------------
def ctas_per_sm(launch: Launch) -> int:
    """CTAs that fit on one SM at once: shared memory, registers and threads decide."""
    props = device_properties(launch.q.device)
    p = launch.problem
    smem = bwd_kernel.shared_bytes(DTYPES[launch.q.dtype], variant_of(launch).config,
                                   p.head_dim, p.head_dim_v)
    by_smem = props.shared_memory_per_multiprocessor // (smem + 1024)  # 1 KiB per CTA reserved
    regs = getattr(props, "regs_per_multiprocessor", 65536)
    by_regs = regs // (REGISTERS_AT_LAUNCH * NUM_THREADS)
    by_threads = props.max_threads_per_multi_processor // NUM_THREADS
    return max(0, min(by_smem, by_regs, by_threads))


def max_workers(launch: Launch) -> int:
    """Persistent CTAs that are all resident at once on the launch's device."""
    props = device_properties(launch.q.device)
    return props.multi_processor_count * ctas_per_sm(launch)


def _check_tma(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.data_ptr() % 16 or not _tma_strides(t.stride()):
            raise ValueError(f"the CuTe backend needs {name} 16-byte aligned with strides that "
                             f"are multiples of 8 elements (TMA), got strides {t.stride()}")


@lru_cache(maxsize=1024)
def _tma_strides(strides: tuple[int, ...]) -> bool:
    """The ``(b, s, h)`` strides a TMA descriptor takes: multiples of 8 elements (16 bytes)."""
    return not any(s % 8 for s in strides[:3])


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride()[:3]


def _stream(t: torch.Tensor) -> int:
    """The handle of the current stream on ``t``'s device: the kernel runs there."""
    return torch.cuda.current_stream(t.device).cuda_stream


L2_BYTES = 50 * 2**20  # the H100's and H200's L2


def l2_heads(k: torch.Tensor, heads: int) -> int:
    """Heads whose K and V fit in L2 together, a power of two (at least 1, at most all):
    the causal forward runs its longest tiles section by section of this many heads."""
    per_head = 2 * k.shape[1] * k.shape[3] * k.element_size()
    fit = max(1, L2_BYTES // per_head)
    return min(1 << (fit.bit_length() - 1), heads)


DYNAMIC_CAUSAL = 1024  # S_q from which causal forwards hand out tiles from a counter


def forward_grid(head_dim: int, causal: bool, seqlen_q: int, tiles: int, sms: int,
                 k: torch.Tensor, heads: int) -> tuple[int, int, bool]:
    """``(CTAs, heads per causal section, dynamic)`` of a forward launch, by measurement on
    the H200 (``benchmarks/results/experiments/forward_grid.md``); none of them changes the bits.

    Persistent (one CTA per SM, or one per tile where there are fewer tiles) at both head
    dims and every length. Full masks: every CTA takes every CTAs-th tile of the list, all
    heads interleaved (the tiles are equal). Causal masks: the tiles longest first within
    sections of :func:`l2_heads` heads, whose K and V the tiles in flight share in L2; from
    ``S_q = DYNAMIC_CAUSAL`` on, each CTA takes the next tile from a counter as it finishes
    one ("dynamic"), so that uneven tiles balance without a CTA launch per tile: 1.03 -
    1.10x the former static rule at ``S_q`` = 2048 - 8192, 1.01 - 1.07x at 1024, 0.99 -
    1.04x at 16384 (not measured below 1024, where the static sections stay). ``head_dim``
    does not enter the rule (measured at d = 64 and 128).
    """
    if not causal:
        return min(tiles, sms), heads, False
    return min(tiles, sms), l2_heads(k, heads), seqlen_q >= DYNAMIC_CAUSAL


def run_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rule: Mask | bool,
                softmax_scale: float, poison: bool = False, block_m: int | None = None,
                num_ctas: int | None = None, sections: int | None = None,
                dynamic: bool | None = None, sink2: torch.Tensor | None = None,
                softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``O`` ``(B, S_q, H, d_v)`` (``q``'s strides where ``d_v = d``) and fp32 ``LSE2``
    ``(B, S_q, H)``, a view of a
    ``(B, H, S_q)`` buffer: the convention both backwards read. ``rule``: the
    :class:`dash_ref.Mask` (or ``causal`` as a bool). ``sink2``: learnable sinks in base 2,
    fp32 ``(H,)`` on the device (:func:`dash_ref.arithmetic.steps.sink_logit`); ``LSE2``
    then includes them. ``block_m``, ``num_ctas``,
    ``sections`` and ``dynamic`` (tests, measurements) override the measured tile height,
    the grid, the heads per causal section (:func:`l2_heads`) and how persistent CTAs pick
    their tiles (:func:`forward_grid`), none of which changes the bits. A window runs as a
    full mask's grid does (its tiles are about equal), with the configuration of
    :func:`.config.tiling_mask`."""
    if not isinstance(rule, Mask):
        rule = Mask("causal" if rule else "full")
    o = new_output(q, v)
    _check_tma(q=q, k=k, v=v, o=o)
    lse2 = new_row_stats(q.shape[0], q.shape[1], q.shape[2], q.device)
    if poison:
        o.fill_(math.nan)
        lse2.fill_(math.nan)
    if softmax_scale <= 0 and not softcap:
        # the kernel applies the scale to each row's largest raw score ([fwd_max]), which
        # is the largest scaled score only for a positive scale: S c = (-Q) K^T |c|, and a
        # zero scale makes every score 0 (Q = 0, scale 1); a softcap's scores are already
        # scaled, and its c is fp32(log2 e) > 0
        q = q * (-1.0 if softmax_scale < 0 else 0.0)
        softmax_scale = -softmax_scale if softmax_scale < 0 else 1.0
    kernel, static, by_counter = _forward_plan(
        q.shape, k.shape, q.stride(), k.stride(), v.stride(), o.stride(), q.dtype, q.device,
        rule, softmax_scale, block_m, num_ctas, sections, dynamic, sink2 is not None,
        softcap, v.shape[-1])
    # the tickets of a dynamic launch start at zero (unused otherwise: no pointer)
    counter = torch.zeros(1, dtype=torch.int32, device=q.device) if by_counter else None
    sink = () if sink2 is None else (_sink_pointer(sink2, q.shape[2], q.device),)
    kernel(*static.fill(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                        lse2.data_ptr(), counter.data_ptr() if by_counter else 0, _stream(q),
                        *sink))
    return o, lse2


def _sink_pointer(sink2: torch.Tensor, heads: int, device: torch.device) -> int:
    """The address of the base-2 sinks a forward reads, one fp32 per query head."""
    if sink2.dtype != torch.float32 or tuple(sink2.shape) != (heads,) or (
            sink2.device != device) or not sink2.is_contiguous():
        raise ValueError(f"sink2 must be a contiguous fp32 ({heads},) tensor on {device}, got "
                         f"{sink2.dtype} {tuple(sink2.shape)} on {sink2.device}")
    return sink2.data_ptr()


def bind_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 rule: Mask, softmax_scale: float, sinks: bool = False):
    """``(kernel, template, counter)`` of :func:`run_forward`'s launch for these tensors'
    signature (the template takes :data:`_FORWARD_PER_CALL`, and with ``sinks`` the base-2
    sinks' pointer last; ``counter``: the launch takes its tiles from a counter that is
    zero at launch, and leaves it at zero), or None where the call does more than that
    launch (a scale <= 0 negates or zeroes Q first)."""
    if softmax_scale <= 0:
        return None
    _check_tma(q=q, k=k, v=v, o=o)
    return _forward_plan(q.shape, k.shape, q.stride(), k.stride(), v.stride(), o.stride(),
                         q.dtype, q.device, rule, softmax_scale, None, None, None, None, sinks,
                         0.0, v.shape[-1])


#: the forward's arguments that change every call, in the order ``fill`` takes them
_FORWARD_PER_CALL = ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "lse_ptr", "counter_ptr", "stream")


@lru_cache(maxsize=256)
def _forward_plan(q_shape, k_shape, q_strides, k_strides, v_strides, o_strides, dtype, device,
                  rule: Mask, softmax_scale: float, block_m, num_ctas, sections, dynamic,
                  sinks: bool, softcap: float = 0.0, head_dim_v: int | None = None
                  ) -> tuple[object, arguments.Template, bool]:
    """What a forward launch of these shapes, strides and options needs beside its
    pointers and stream, worked out once: ``(kernel, the other launch arguments, whether
    tiles are taken from a counter)``; with ``sinks`` the template also takes the sinks'
    pointer, last; ``head_dim_v``: the values' head dim."""
    batch, seqlen_q, heads, head_dim = q_shape
    seqlen_k, heads_kv = k_shape[1], k_shape[2]
    variant = forward_variant(dtype, head_dim, rule, seqlen_q, block_m=block_m, sinks=sinks,
                              softcap=softcap > 0, head_dim_v=head_dim_v)
    tiles = batch * heads * -(-seqlen_q // variant.block_m)
    grid, heads_per_section, by_counter = forward_grid(
        head_dim, rule.kind == "causal", seqlen_q, tiles,
        device_properties(device).multi_processor_count,
        torch.empty(k_shape, dtype=dtype, device="meta"), batch * heads)
    by_counter = by_counter if dynamic is None else dynamic
    static = dict(
        cu_seqlens_q_ptr=0, cu_seqlens_k_ptr=0, max_seqlen_q=seqlen_q,  # packed kernels'
        batch=batch, heads=heads, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        num_ctas=num_ctas or grid, l2_heads=sections or heads_per_section,
        dynamic=int(by_counter), **window_args(rule, seqlen_q, seqlen_k),
        q_strides=q_strides[:3], k_strides=k_strides[:3], v_strides=v_strides[:3],
        o_strides=o_strides[:3], **score_args(softmax_scale, softcap))
    per_call = _FORWARD_PER_CALL + ("sink2_ptr",) if sinks else _FORWARD_PER_CALL
    if not sinks:
        static["sink2_ptr"] = 0
    return (get_kernel(variant), arguments.template(_FORWARD_ARGS, static, per_call),
            by_counter)


def forward_varlen_args(packing, heads: int, total_q: int, total_k: int, rule: Mask,
                        tiles: int, sms: int) -> dict:
    """The launch arguments of a packed forward that describe the batch (the rest are the
    rectangular forward's): ``seqlen_q`` / ``seqlen_k`` are the tensors' rows, ``batch``
    the sequences, ``max_seqlen_q`` the longest (every sequence gets its tiles; one past
    its sequence's end does nothing), a window's extents those of the longest lengths (an
    unbounded side, ``max S_q + max S_k``, then hides no key of any sequence). Static
    hand-out, one CTA per SM or per tile: tiles of one list differ in length, which the
    order within a causal section does not follow (bits never depend on it)."""
    return dict(
        cu_seqlens_q_ptr=packing.cu_seqlens_q.data_ptr(),
        cu_seqlens_k_ptr=packing.cu_seqlens_k.data_ptr(), max_seqlen_q=packing.max_seqlen_q,
        batch=packing.batch, heads=heads, seqlen_q=total_q, seqlen_k=total_k,
        num_ctas=max(1, min(tiles, sms)), l2_heads=heads, dynamic=0,
        **window_args(rule, packing.max_seqlen_q, packing.max_seqlen_k))


def forward_variant(dtype: torch.dtype, head_dim: int, rule: Mask, seqlen_q: int,
                    packed: bool = False, block_m: int | None = None, sinks: bool = False,
                    softcap: bool = False, head_dim_v: int | None = None) -> ForwardVariant:
    """The forward variant of a call (packed: ``seqlen_q`` the longest sequence's;
    ``head_dim_v``: the values' head dim)."""
    return ForwardVariant(dtype, head_dim, rule.kind,
                          forward_config(head_dim, tiling_mask(rule), seqlen_q, dtype,
                                         block_m, head_dim_v), packed, sinks, softcap,
                          None if head_dim_v == head_dim else head_dim_v)


@lru_cache(maxsize=64)
def score_args(softmax_scale: float, softcap: float = 0.0) -> dict:
    """``scale_log2``, ``softcap_k`` and ``softcap`` as both kernels take them: without a
    softcap ``fp32(softmax_scale log2 e)`` and zeros (unread); with one, ``fp32(log2 e)``
    (the capped scores are scaled already) and
    :func:`dash_ref.arithmetic.steps.softcap_constants`."""
    if not softcap:
        return dict(scale_log2=scale_log2_value(softmax_scale), softcap_k=0.0, softcap=0.0)
    k, cap = softcap_constants(softmax_scale, softcap)
    return dict(scale_log2=scale_log2_value(1.0), softcap_k=k, softcap=cap)


def run_forward_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing,
                       rule: Mask, softmax_scale: float, poison: bool = False,
                       block_m: int | None = None, sink2: torch.Tensor | None = None,
                       softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed batch (:class:`dash_cuda.options.Packing`): ``O`` like ``q``, ``(total_q,
    H, d)``, and fp32 ``LSE2`` ``(total_q, H)``, a view of an ``(H, total_q)`` buffer. Each
    sequence is tiled from its own first row, so its bits are those of its batch-1 call
    (the forward's bits depend on its KV tile only; ``block_m`` overrides the tile
    height, as :func:`run_forward`'s; ``sink2`` as there). Key rows past a sequence's end
    that a last partial KV tile reads are the next sequence's (masked: P = 0 there, so
    inputs must be finite, as FlashAttention's varlen kernels assume)."""
    total_q, heads, head_dim = q.shape
    total_k, heads_kv = k.shape[0], k.shape[1]
    o = new_output(q, v)
    lse2 = new_packed_row_stats(total_q, heads, q.device)
    if poison:
        o.fill_(math.nan)
        lse2.fill_(math.nan)
    _check_tma(q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), o=o.unsqueeze(0))
    if softmax_scale <= 0 and not softcap:  # as run_forward
        q = q * (-1.0 if softmax_scale < 0 else 0.0)
        softmax_scale = -softmax_scale if softmax_scale < 0 else 1.0
    variant = forward_variant(q.dtype, head_dim, rule, packing.max_seqlen_q, True, block_m,
                              sinks=sink2 is not None, softcap=softcap > 0,
                              head_dim_v=v.shape[-1])
    tiles = packing.batch * heads * -(-packing.max_seqlen_q // variant.block_m)
    if tiles == 0:
        return o, lse2
    # the kernel reads one int32 offset per sequence, contiguous
    packing = replace(packing, cu_seqlens_q=packing.cu_seqlens_q.contiguous(),
                      cu_seqlens_k=packing.cu_seqlens_k.contiguous())
    kernel = get_kernel(variant)
    kernel(*arguments.values(_FORWARD_ARGS, dict(
        q_ptr=q.data_ptr(), k_ptr=k.data_ptr(), v_ptr=v.data_ptr(), o_ptr=o.data_ptr(),
        lse_ptr=lse2.data_ptr(), counter_ptr=0, heads_kv=heads_kv,
        sink2_ptr=0 if sink2 is None else _sink_pointer(sink2, heads, q.device),
        **forward_varlen_args(packing, heads, total_q, total_k, rule, tiles,
                              device_properties(q.device).multi_processor_count),
        q_strides=_packed_strides(q), k_strides=_packed_strides(k),
        v_strides=_packed_strides(v), o_strides=_packed_strides(o),
        **score_args(softmax_scale, softcap), stream=_stream(q))))
    return o, lse2


def _packed_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """``(batch, row, head)`` strides of a packed ``(total, H, d)`` tensor: one batch."""
    return (0, t.stride(0), t.stride(1))


_probe = threading.local()


@contextmanager
def probing(stamps: torch.Tensor) -> Iterator[torch.Tensor]:
    """Diagnostics: backwards launched in this block (this thread) run the probe variant.

    It computes the same gradients and writes int32 ``%clock`` stamps into ``stamps`` (at
    least ``V * PROBE_VISIT_SLOTS + C * PROBE_CHAIN_SLOTS`` elements, on the GPU; the slots
    are listed in :mod:`.bwd_kernel`). ``benchmarks/probe_backward.py`` reads them.
    """
    from dash_cuda.plans import suspended

    if stamps.dtype != torch.int32 or not stamps.is_cuda or not stamps.is_contiguous():
        raise ValueError("stamps must be a contiguous int32 CUDA tensor")
    _probe.stamps = stamps
    try:
        with suspended():  # a plan kept before would launch the plain variant
            yield stamps
    finally:
        _probe.stamps = None


def run_schedule(launch: Launch) -> None:
    """Launch the persistent backward: one CTA per worker of the schedule's tables."""
    p = launch.problem
    q, k, v, do = launch.q, launch.k, launch.v, launch.do
    if p.is_packed:
        _check_tma(q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), do=do.unsqueeze(0))
        lse2, delta = tile_stats(launch.lse2, launch.delta, p)
    else:
        _check_tma(q=q, k=k, v=v, do=do)
        lse2 = pad_row_stats(launch.lse2, p.block_m)
        delta = pad_row_stats(launch.delta, p.block_m)
    tables = launch.tables
    variant = variant_of(launch)
    partials = launch.partials
    if p.is_packed and (p.total_q == 0 or p.total_k == 0):
        # no scores at all: dK, dV are 0 (dQ has no rows or its accumulator stays 0); a
        # tensor of no rows has no TMA descriptor
        launch.dk_out.zero_()
        launch.dv_out.zero_()
        return
    stamps = getattr(_probe, "stamps", None)
    if stamps is not None and p.is_packed:
        raise ValueError("the probe variant is rectangular")
    if stamps is not None:
        need = (launch.tables["visit_q"].numel() * PROBE_VISIT_SLOTS
                + (launch.tables["chain_offsets"].numel() - 1) * PROBE_CHAIN_SLOTS)
        if launch.audit or stamps.numel() < need:
            raise ValueError(f"probing needs audit=False and {need} stamps")
        variant, partials = replace(variant, probe=True), stamps
    kernel = get_kernel(variant)
    operands = (q, k, v, do, launch.dk_out, launch.dv_out)
    packed_pointers = ()
    if p.is_packed:
        static = _packed_template(p, tuple(map(_packed_strides, operands)), launch.num_workers,
                                  launch.softmax_scale, launch.softcap)
        packed_pointers = (launch.cu_seqlens_q.data_ptr(), launch.cu_seqlens_k.data_ptr(),
                           tables["q_tile_base"].data_ptr())
    else:
        static = _rectangular_template(p, tuple(map(_strides, operands)), launch.num_workers,
                                       launch.softmax_scale, launch.softcap)
    kernel(*static.fill(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), do.data_ptr(), lse2.data_ptr(),
        delta.data_ptr(), launch.dq_acc.data_ptr(), launch.dk_out.data_ptr(),
        launch.dv_out.data_ptr(), launch.sem.data_ptr(), partials.data_ptr(),
        *(tables[name].data_ptr() for name in TABLE_NAMES),
        tables["chain_offsets"].numel() - 1, tables["visit_q"].numel(), _stream(q),
        *packed_pointers))


def bind_schedule(launch: Launch):
    """``run(q, k, v, do, lse2, delta, dq_acc, dk, dv, sem, partials, stream)``: the launch
    of :func:`run_schedule` for ``launch``'s signature, worked out once, taking the data
    pointers (:data:`_BOUND_PER_CALL`) of a call with the same shapes, strides, dtypes and
    16-byte alignment; the tables, the grid and every other argument are ``launch``'s. None
    where :func:`run_schedule` does more than one launch of fixed arguments: a packed
    batch, an audit, :func:`probing`, or ``LSE2`` / ``D`` that :func:`pad_row_stats` copies
    rather than reads in place."""
    p = launch.problem
    if p.is_packed or launch.audit or getattr(_probe, "stamps", None) is not None:
        return None
    if -p.seqlen_q % p.block_m or any(pad_row_stats(x, p.block_m).data_ptr() != x.data_ptr()
                                      for x in (launch.lse2, launch.delta)):
        return None
    operands = (launch.q, launch.k, launch.v, launch.do, launch.dk_out, launch.dv_out)
    _check_tma(q=launch.q, k=launch.k, v=launch.v, do=launch.do)
    static = _rectangular_template(p, tuple(map(_strides, operands)), launch.num_workers,
                                   launch.softmax_scale, launch.softcap)
    tables = launch.tables
    fixed = {f"{name}_ptr": tables[name].data_ptr() for name in TABLE_NAMES}
    fixed.update(num_chains=tables["chain_offsets"].numel() - 1,
                 num_visits=tables["visit_q"].numel())
    template = arguments.Template(
        tuple(static.fill(*(fixed.get(name) for name in _BACKWARD_PER_CALL))),
        tuple(_BACKWARD_ARGS.index(name) for name in _BOUND_PER_CALL))
    kernel = get_kernel(variant_of(launch))

    def run(*pointers_and_stream) -> None:
        kernel(*template.fill(*pointers_and_stream))

    run.tables = tables  # the table pointers stay valid while the binding lives
    return run


#: the arguments of a :func:`bind_schedule` launch that change every call, in order
_BOUND_PER_CALL = ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dqacc_ptr",
                   "dk_ptr", "dv_ptr", "sem_ptr", "partials_ptr", "stream")


#: the backward's arguments that change every call (pointers, the stream; the table sizes,
#: which change with the schedule), in the order ``fill`` takes them
_BACKWARD_PER_CALL = ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr",
                      "dqacc_ptr", "dk_ptr", "dv_ptr", "sem_ptr", "partials_ptr",
                      *(f"{name}_ptr" for name in TABLE_NAMES), "num_chains", "num_visits",
                      "stream")


#: a packed backward's arguments that change every call beside those
_PACKED_PER_CALL = ("cu_seqlens_q_ptr", "cu_seqlens_k_ptr", "q_tile_base_ptr")


def _backward_template(p: Problem, shape_args: dict, num_workers: int,
                       softmax_scale: float, softcap: float = 0.0) -> arguments.Template:
    """The backward's arguments but :data:`_BACKWARD_PER_CALL` (and, packed,
    :data:`_PACKED_PER_CALL`): ``shape_args`` (the rectangular or packed ones), the heads,
    the workers and the scales."""
    per_call = _BACKWARD_PER_CALL + (_PACKED_PER_CALL if p.is_packed else ())
    return arguments.template(_BACKWARD_ARGS, dict(
        heads=p.heads, heads_kv=p.heads_kv, num_workers=num_workers, **shape_args,
        **_scale_args(softmax_scale, softcap)), per_call)


@lru_cache(maxsize=256)
def _packed_template(p: Problem, strides: tuple, num_workers: int,
                     softmax_scale: float, softcap: float = 0.0) -> arguments.Template:
    """:func:`_backward_template` of a packed backward, once per problem (its lengths),
    strides, workers, scale and softcap."""
    return _backward_template(p, _packed_args(p, strides), num_workers, softmax_scale,
                              softcap)


@lru_cache(maxsize=256)
def _rectangular_template(p: Problem, strides: tuple, num_workers: int,
                          softmax_scale: float, softcap: float = 0.0) -> arguments.Template:
    """:func:`_backward_template` of a rectangular backward, once per problem, strides,
    workers, scale and softcap."""
    return _backward_template(p, _rectangular_args(p, strides), num_workers, softmax_scale,
                              softcap)


def _rectangular_args(p: Problem, strides: tuple) -> dict:
    """The launch arguments of a rectangular backward that describe its shape, mask and the
    ``(b, s, h)`` strides of Q, K, V, dO, dK, dV."""
    names = ("q_strides", "k_strides", "v_strides", "do_strides", "dk_strides", "dv_strides")
    return dict(cu_seqlens_q_ptr=0, cu_seqlens_k_ptr=0, q_tile_base_ptr=0,  # packed kernels'
                num_q_tiles=0, batch=p.batch, seqlen_q=p.seqlen_q, seqlen_k=p.seqlen_k,
                n_q=p.n_q, **window_args(p.visibility, p.seqlen_q, p.seqlen_k),
                **dict(zip(names, strides)))


@lru_cache(maxsize=64)
def _scale_args(softmax_scale: float, softcap: float = 0.0) -> dict:
    """``scale_log2`` (step ``scale_log2``, :func:`dash_ref.arithmetic.steps.scale_log2_value`),
    ``softmax_scale`` and the softcap's constants (:func:`score_args`), as the backward takes
    them."""
    return dict(score_args(softmax_scale, softcap), softmax_scale=float(softmax_scale))


def _packed_args(p: Problem, strides: tuple) -> dict:
    """The launch arguments of a packed backward that describe the batch (the rest are the
    rectangular one's; the offsets and ``q_tile_base``, where each sequence's dQ tiles
    start, are pointers the kernel reads per chain, :data:`_PACKED_PER_CALL`):
    ``seqlen_q`` / ``seqlen_k`` are the tensors' rows, ``batch`` the sequences, a window's
    extents those of the longest lengths (as the packed forward's: an unbounded side then
    hides no key of any sequence); ``n_q`` is unused. ``strides``: the :func:`_packed_strides`
    of Q, K, V, dO, dK, dV."""
    max_q = max(p.seqlen_q_of(b) for b in range(p.batch))
    max_k = max(p.seqlen_k_of(b) for b in range(p.batch))
    names = ("q_strides", "k_strides", "v_strides", "do_strides", "dk_strides", "dv_strides")
    return dict(num_q_tiles=p.num_q_tiles, batch=p.batch, seqlen_q=p.total_q,
                seqlen_k=p.total_k, n_q=0, **window_args(p.visibility, max_q, max_k),
                **dict(zip(names, strides)))
