"""Input checks of the public functions: everything is validated before any kernel loads.

Structural checks (types, rank, dtype, shapes, head dim, strides, GQA ratio) come first,
then options, then devices, so a mistake is reported the same way on a machine without
CUDA. Each error names the argument, the value and what is allowed.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from dash_ref import NAMES, PORTABLE

from .backends import BACKENDS
from .backends.triton.config import HEAD_DIMS

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
    if kv.shape != vv.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(named['k'].shape)} "
                         f"and {tuple(named['v'].shape)}")
    if kv.shape[0] != batch or kv.shape[3] != head_dim:
        raise ValueError(f"q {tuple(named['q'].shape)} and k {tuple(named['k'].shape)} must "
                         f"share batch and head dim ({layout} layout)")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} is not supported; supported: {HEAD_DIMS}")
    if heads == 0 or heads_kv == 0:
        raise ValueError("q and k need at least one head")
    if heads % heads_kv:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads "
                         f"({heads_kv}) for GQA/MQA")
    for name in ("o", "do"):
        if name in named and as_bshd(named[name], layout).shape != qv.shape:
            raise ValueError(f"{name} must have the shape of q {tuple(named['q'].shape)}, got "
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


def check_devices(named: dict[str, torch.Tensor]) -> None:
    """One CUDA device for every tensor."""
    devices = {x.device for x in named.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{n}: {x.device}" for n, x in named.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    device = devices.pop()
    if device.type != "cuda":
        raise ValueError(f"dash_cuda needs CUDA tensors, got tensors on {device}")


def check_options(causal: bool, softmax_scale: float | None, schedule: str,
                  deterministic: bool, num_workers: int | None, exact: bool = False,
                  backend: str = "auto", portable: bool = False) -> None:
    """Types and values of the keyword options of the public functions."""
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
    if schedule != "auto" and schedule not in NAMES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from 'auto', "
                         f"{', '.join(NAMES)}")
    if schedule == "atomic" and deterministic:
        raise ValueError("schedule 'atomic' is the non-deterministic peer: pass "
                         "deterministic=False to run it")
    if portable and not deterministic:
        raise ValueError("portable=True keeps to fixed summation orders; the atomic peer "
                         "(deterministic=False) has none")
    if portable and schedule not in ("auto", *PORTABLE):
        raise ValueError(f"schedule {schedule!r} orders its sums by num_workers, so its bits "
                         f"differ between GPUs; portable=True takes 'auto', "
                         f"{', '.join(PORTABLE)}")
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from 'auto', "
                         f"{', '.join(BACKENDS)}")
    if num_workers is not None and (isinstance(num_workers, bool)
                                    or not isinstance(num_workers, Integral)
                                    or num_workers < 1):
        raise ValueError(f"num_workers must be a positive int or None, got {num_workers!r}")
