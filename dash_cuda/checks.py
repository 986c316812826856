"""Input checks of the public functions: everything is validated before any kernel loads.

Structural checks (types, rank, dtype, shapes, head dim, strides, GQA ratio) come first,
then options, then devices, so a mistake is reported the same way on a machine without
CUDA. Each error names the argument, the value and what is allowed.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from dash_ref import BANDED, NAMES, PORTABLE, RAGGED

from .backends import BACKENDS, HEAD_DIMS

LAYOUTS = ("bshd", "bhsd")
DTYPES = (torch.bfloat16, torch.float16)


def as_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A ``(B, S, H, d)`` view of ``x`` (no copy)."""
    return x if layout == "bshd" else x.transpose(1, 2)


def check_tensors(named: dict[str, torch.Tensor], layout: str) -> None:
    """Rank, dtype, shapes, head dim, strides and GQA ratio of ``q, k, v`` (+ extras)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if name != "lse" and x.dim() != 4:
            want = "(B, S, H, d)" if layout == "bshd" else "(B, H, S, d)"
            raise ValueError(f"{name} must have 4 dims {want}, got shape {tuple(x.shape)}")
    q = named["q"]
    if q.dtype not in DTYPES:
        raise TypeError(f"q must be bfloat16 or float16, got {q.dtype}")
    for name, x in named.items():
        if name in ("q", "lse"):
            continue
        if x.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, q has {q.dtype}: they must match")
    qv, kv, vv = (as_bshd(named[n], layout) for n in ("q", "k", "v"))
    batch, seqlen_q, heads, head_dim = qv.shape
    _, seqlen_k, heads_kv, _ = kv.shape
    if kv.shape[:3] != vv.shape[:3]:
        raise ValueError(f"k and v must have the same batch, length and heads, got "
                         f"{tuple(named['k'].shape)} and {tuple(named['v'].shape)}")
    if kv.shape[0] != batch or kv.shape[3] != head_dim:
        raise ValueError(f"q {tuple(named['q'].shape)} and k {tuple(named['k'].shape)} must "
                         f"share batch and head dim ({layout} layout)")
    check_heads(head_dim, heads, heads_kv, vv.shape[3])
    out_shape = (*qv.shape[:3], vv.shape[3])  # O and dO: q's rows and heads, v's head dim
    for name in ("o", "do"):
        if name in named and as_bshd(named[name], layout).shape != out_shape:
            want = "q" if out_shape == qv.shape else "q with v's head dim"
            raise ValueError(f"{name} must have the shape of {want} "
                             f"{_layout_shape(out_shape, layout)}, got "
                             f"{tuple(named[name].shape)}")
    if "lse" in named:
        lse = named["lse"]
        want = (batch, seqlen_q, heads) if layout == "bshd" else (batch, heads, seqlen_q)
        if lse.dtype != torch.float32 or tuple(lse.shape) != want:
            raise ValueError(f"lse must be float32 of shape {want} (base-2 log-sum-exp, "
                             f"{layout} layout), got {lse.dtype} {tuple(lse.shape)}")
    for name, x in named.items():
        if name != "lse" and x.stride(-1) != 1 and x.shape[-1] > 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride 1), got "
                             f"strides {tuple(x.stride())}")
    for name, x in named.items():
        # kernels address a row inside one (batch, head) slice with 32-bit offsets
        xv = x if name == "lse" else as_bshd(x, layout)
        rows, row_stride = xv.shape[1], xv.stride(1)
        if rows and (rows - 1) * row_stride + xv.shape[-1] > 2**31 - 1:
            raise ValueError(f"{name} is too long: its rows span more than 2**31 elements "
                             "within one (batch, head) slice")


_PASSED: set[tuple] = set()  # keys of inputs that passed check_tensors and check_devices
_MAX_PASSED = 4096


def tensors_key(named: dict[str, torch.Tensor], layout: str) -> tuple | None:
    """All that :func:`check_tensors` and :func:`check_devices` read of ``named``: names,
    shapes, strides, dtypes and devices (None where a value is not a tensor). Not
    :func:`dash_cuda.plans.structure`: this key is also made while ``torch.compile``
    traces, where a tensor has no address to test for alignment."""
    if not all(isinstance(x, torch.Tensor) for x in named.values()):
        return None
    return (layout, *named, *((x.shape, x.stride(), x.dtype, x.device)
                              for x in named.values()))


def passed_before(key: tuple | None) -> bool:
    """Whether inputs of this :func:`tensors_key` passed both checks before (then they
    pass again: the checks read nothing else)."""
    return key is not None and key in _PASSED


def remember_passed(key: tuple | None) -> None:
    """Record that inputs of this key passed both checks."""
    if key is not None:
        if len(_PASSED) >= _MAX_PASSED:
            _PASSED.clear()
        _PASSED.add(key)


def _layout_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
    """A ``(B, S, H, d)`` shape as the caller's layout writes it."""
    return shape if layout == "bshd" else (shape[0], shape[2], shape[1], shape[3])


def check_heads(head_dim: int, heads: int, heads_kv: int, head_dim_v: int | None = None
                ) -> None:
    """Supported head dims (of q and k, and of v), and query heads a positive multiple of
    key/value heads."""
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} is not supported; supported: {HEAD_DIMS}")
    if head_dim_v is not None and head_dim_v not in HEAD_DIMS:
        raise ValueError(f"v's head dim {head_dim_v} is not supported; supported: "
                         f"{HEAD_DIMS}")
    if heads == 0 or heads_kv == 0:
        raise ValueError("q and k need at least one head")
    if heads % heads_kv:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads "
                         f"({heads_kv}) for GQA/MQA")


def check_devices(named: dict[str, torch.Tensor]) -> None:
    """One CUDA device for every tensor."""
    check_one_device(named)
    check_cuda(named)


def check_one_device(named: dict[str, torch.Tensor]) -> None:
    """Every tensor on one device (which may still be the CPU: :func:`check_cuda`)."""
    devices = {x.device for x in named.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{n}: {x.device}" for n, x in named.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")


def check_cuda(named: dict[str, torch.Tensor]) -> None:
    """The tensors' one device is a CUDA device."""
    device = next(iter(named.values())).device
    if device.type != "cuda":
        raise ValueError(f"dash_cuda needs CUDA tensors, got tensors on {device}")


# -- packed batches (varlen) ------------------------------------------------------------------
def check_packed_tensors(named: dict[str, torch.Tensor]) -> None:
    """Rank, dtype, shapes, head dim, strides and GQA ratio of packed ``q, k, v`` (+ extras).

    Packed tensors are ``(total_q, H, d)`` (``q``), ``(total_k, H_kv, d)`` (``k``),
    ``(total_k, H_kv, d_v)`` (``v``) and ``(total_q, H, d_v)`` (``o``, ``do``); ``lse`` is fp32
    ``(total_q, H)``.
    """
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if name != "lse" and x.dim() != 3:
            want = "(total_k, H_kv, d)" if name in ("k", "v") else "(total_q, H, d)"
            raise ValueError(f"{name} must have 3 dims {want} for a packed batch, got shape "
                             f"{tuple(x.shape)}")
    q, k, v = named["q"], named["k"], named["v"]
    if q.dtype not in DTYPES:
        raise TypeError(f"q must be bfloat16 or float16, got {q.dtype}")
    for name, x in named.items():
        if name not in ("q", "lse") and x.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {x.dtype}, q has {q.dtype}: they must match")
    total_q, heads, head_dim = q.shape
    _, heads_kv, _ = k.shape
    if k.shape[:2] != v.shape[:2]:
        raise ValueError(f"k and v must have the same rows and heads, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if k.shape[2] != head_dim:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must share the head dim")
    check_heads(head_dim, heads, heads_kv, v.shape[2])
    out_shape = (total_q, heads, v.shape[2])  # O and dO: q's rows and heads, v's head dim
    for name in ("o", "do"):
        if name in named and tuple(named[name].shape) != out_shape:
            want = "q" if out_shape == tuple(q.shape) else "q with v's head dim"
            raise ValueError(f"{name} must have the shape of {want} {out_shape}, got "
                             f"{tuple(named[name].shape)}")
    if "lse" in named:
        lse = named["lse"]
        if lse.dtype != torch.float32 or tuple(lse.shape) != (total_q, heads):
            raise ValueError(f"lse must be float32 of shape {(total_q, heads)} (base-2 "
                             f"log-sum-exp, packed (total_q, H) layout), got {lse.dtype} "
                             f"{tuple(lse.shape)}")
    for name, x in named.items():
        if name != "lse" and x.stride(-1) != 1 and x.shape[-1] > 1:
            raise ValueError(f"{name} must be contiguous in its last dim (stride 1), got "
                             f"strides {tuple(x.stride())}")
    for name, x in named.items():
        # the row-wise kernels (D, the epilogues) address a packed tensor's rows as one
        # sequence, with 32-bit offsets
        span = (x.shape[0] - 1) * x.stride(0) + x.shape[-1] if name != "lse" else 0
        if x.shape[0] and span > 2**31 - 1:
            raise ValueError(f"{name} is too long: its {x.shape[0]} packed rows span more "
                             "than 2**31 elements")
    if heads != heads_kv and k.shape[0] * heads * max(head_dim, v.shape[2]) > 2**31 - 1:
        raise ValueError(f"k is too long for GQA: the per-query-head fp32 dK/dV of its "
                         f"{k.shape[0]} packed rows would span more than 2**31 elements")


def check_cu_seqlens(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     max_seqlen_q: int, max_seqlen_k: int) -> None:
    """Types, dtype, rank and length of the offsets, and the ``max_seqlen`` values (the
    offsets' values need them on the host: :func:`check_cu_seqlens_values`)."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be int32 (B + 1 offsets), got {cu.dtype}")
        if cu.dim() != 1 or cu.shape[0] < 1:
            raise ValueError(f"{name} must have 1 dim of B + 1 >= 1 offsets, got shape "
                             f"{tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} offsets, cu_seqlens_k "
                         f"{cu_seqlens_k.shape[0]}: both hold B + 1, one batch of sequences")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        # a torch.SymInt where torch.compile traces the lengths as dynamic
        if isinstance(value, bool) or not isinstance(value, (Integral, torch.SymInt)) or (
                value < 0):
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def check_cu_seqlens_values(offsets_q: list[int], offsets_k: list[int], max_seqlen_q: int,
                            max_seqlen_k: int, total_q: int, total_k: int
                            ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sequences' lengths from the offsets read to the host; a one-line ``ValueError``
    naming the argument where they start elsewhere than 0, decrease, end elsewhere than at
    the tensor's rows, or a sequence is longer than its ``max_seqlen``."""
    lengths = []
    for name, cu, total, longest, tensor in (
            ("cu_seqlens_q", offsets_q, total_q, max_seqlen_q, "q"),
            ("cu_seqlens_k", offsets_k, total_k, max_seqlen_k, "k and v")):
        if cu[0] != 0:
            raise ValueError(f"{name} must start at 0, got {name}[0] = {cu[0]}")
        seqlens = tuple(b - a for a, b in zip(cu, cu[1:]))
        for b, n in enumerate(seqlens):
            if n < 0:
                raise ValueError(f"{name} must be non-decreasing, got {name}[{b + 1}] = "
                                 f"{cu[b + 1]} < {name}[{b}] = {cu[b]}")
        if cu[-1] != total:
            raise ValueError(f"{name} must end at the {total} rows of {tensor}, got "
                             f"{name}[-1] = {cu[-1]}")
        longest_seen = max(seqlens, default=0)
        if longest_seen > longest:
            b = seqlens.index(longest_seen)
            which = "max_seqlen_" + name[-1]
            raise ValueError(f"{which}={longest} is smaller than sequence {b}, of "
                             f"{longest_seen} rows in {name}")
        lengths.append(seqlens)
    return lengths[0], lengths[1]


def check_options(causal: bool, softmax_scale: float | None, schedule: str,
                  deterministic: bool, num_workers: int | None, exact: bool = False,
                  backend: str = "auto", portable: bool = False, packed: bool = False,
                  windowed: bool = False) -> None:
    """Types and values of the keyword options of the public functions.

    ``packed`` (a varlen call) admits the schedules made for ragged batches,
    :data:`dash_ref.RAGGED`, and ``windowed`` (a sliding window) those made for bands,
    :data:`dash_ref.BANDED`, beside :data:`dash_ref.NAMES`.
    """
    extra = (RAGGED if packed else ()) + (BANDED if windowed else ())
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool, got {exact!r}")
    if not isinstance(portable, bool):
        raise TypeError(f"portable must be a bool, got {portable!r}")
    if exact and not deterministic:
        raise ValueError("exact=True reproduces a fixed dQ order; the atomic peer "
                         "(deterministic=False) has none")
    if softmax_scale is not None and (not isinstance(softmax_scale, Real)
                                      or not math.isfinite(softmax_scale)):
        raise ValueError(f"softmax_scale must be a finite number or None, got {softmax_scale!r}")
    if schedule != "auto" and schedule not in (*NAMES, *extra):
        raise ValueError(f"unknown schedule {schedule!r}; choose from 'auto', "
                         f"{', '.join((*NAMES, *extra))}")
    if schedule == "atomic" and deterministic:
        raise ValueError("schedule 'atomic' is the non-deterministic peer: pass "
                         "deterministic=False to run it")
    if portable and not deterministic:
        raise ValueError("portable=True keeps to fixed summation orders; the atomic peer "
                         "(deterministic=False) has none")
    if portable and schedule not in ("auto", *PORTABLE, *extra):
        raise ValueError(f"schedule {schedule!r} orders its sums by num_workers, so its bits "
                         f"differ between GPUs; portable=True takes 'auto', "
                         f"{', '.join((*PORTABLE, *extra))}")
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from 'auto', "
                         f"{', '.join(BACKENDS)}")
    if num_workers is not None and (isinstance(num_workers, bool)
                                    or not isinstance(num_workers, Integral)
                                    or num_workers < 1):
        raise ValueError(f"num_workers must be a positive int or None, got {num_workers!r}")


def check_softcap(softcap: float) -> float:
    """``softcap`` as a float: a finite number >= 0 (0: none)."""
    if isinstance(softcap, bool) or not isinstance(softcap, Real) or not (
            math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0 (0: none), got {softcap!r}")
    return float(softcap)


#: the dtypes a learnable sink may have (FlashAttention-4's)
SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_learnable_sink(learnable_sink: torch.Tensor | None, heads: int) -> None:
    """``learnable_sink``: None, or one logit per query head, an fp32/bf16/fp16 ``(H,)``
    tensor (FlashAttention-4's dtypes). Its device is checked
    with the other tensors' (:func:`check_devices`); its values are not read (no sync)."""
    if learnable_sink is None:
        return
    if not isinstance(learnable_sink, torch.Tensor):
        raise TypeError(f"learnable_sink must be a torch.Tensor of shape ({heads},) or None, "
                        f"got {type(learnable_sink).__name__}")
    if learnable_sink.dtype not in SINK_DTYPES:
        raise TypeError(f"learnable_sink must be float32, bfloat16 or float16, got "
                        f"{learnable_sink.dtype}")
    if tuple(learnable_sink.shape) != (heads,):
        raise ValueError(f"learnable_sink must have shape ({heads},): one logit per query "
                         f"head, got {tuple(learnable_sink.shape)}")
