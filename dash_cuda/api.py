"""Public entry points: input checks, layouts, and the autograd Function.

Everything here is checked before any kernel is compiled or launched, and before anything
needs CUDA: structural checks (rank, dtype, shapes, head dim, strides, GQA ratio) first,
then devices. The kernels (and Triton) are imported only once the inputs are known good.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from dash_ref import DETERMINISTIC, NAMES, default_schedule

from .config import HEAD_DIMS

LAYOUTS = ("bshd", "bhsd")
DTYPES = (torch.bfloat16, torch.float16)


# -- checks ---------------------------------------------------------------------------------
def _as_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A ``(B, S, H, d)`` view of ``x`` (no copy)."""
    return x if layout == "bshd" else x.transpose(1, 2)


def _check_tensors(named: dict[str, torch.Tensor], layout: str) -> None:
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
    qv, kv, vv = (_as_bshd(named[n], layout) for n in ("q", "k", "v"))
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
        if name in named and _as_bshd(named[name], layout).shape != qv.shape:
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
        xv = x if name == "lse" else _as_bshd(x, layout)
        rows, row_stride = xv.shape[1], xv.stride(1)
        if rows and (rows - 1) * row_stride + xv.shape[-1] > 2**31 - 1:
            raise ValueError(f"{name} is too long: its rows span more than 2**31 elements "
                             "within one (batch, head) slice")


def _check_devices(named: dict[str, torch.Tensor]) -> None:
    devices = {x.device for x in named.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{n}: {x.device}" for n, x in named.items())
        raise ValueError(f"all tensors must be on one device, got {listing}")
    device = devices.pop()
    if device.type != "cuda":
        raise ValueError(f"dash_cuda needs CUDA tensors, got tensors on {device}")


def _check_options(causal: bool, softmax_scale: float | None, schedule: str,
                   deterministic: bool, num_workers: int | None, exact: bool = False) -> None:
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if not isinstance(exact, bool):
        raise TypeError(f"exact must be a bool, got {exact!r}")
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
    if num_workers is not None and (isinstance(num_workers, bool)
                                    or not isinstance(num_workers, Integral)
                                    or num_workers < 1):
        raise ValueError(f"num_workers must be a positive int or None, got {num_workers!r}")


def _resolve_schedule(schedule: str, deterministic: bool, causal: bool, head_dim: int,
                      seqlen: int) -> str:
    if not deterministic:
        return "atomic"
    name = (default_schedule("causal" if causal else "full", head_dim, seqlen)
            if schedule == "auto" else schedule)
    assert name in DETERMINISTIC
    return name


def _scale(softmax_scale: float | None, head_dim: int) -> float:
    return float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)


def _empty(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Nothing to compute: no batch, no queries or no keys."""
    return q.shape[0] == 0 or q.shape[1] == 0 or k.shape[1] == 0


# -- forward / backward ---------------------------------------------------------------------
def _forward(q, k, v, causal, scale, poison=False):
    """On validated ``(B, S, H, d)`` views: ``(O, LSE2)``, LSE2 fp32 ``(B, S_q, H)``."""
    if _empty(q, k):
        o = torch.zeros_like(q)
        lse = torch.full(q.shape[:3], -math.inf, device=q.device, dtype=torch.float32)
        return o, lse
    from .forward import run_forward

    with torch.cuda.device(q.device):
        return run_forward(q, k, v, causal, scale, poison)


def _backward(q, k, v, o, lse, do, causal, scale, name, num_workers, audit, poison=False,
              exact=False):
    """On validated ``(B, S, H, d)`` views: ``(dQ, dK, dV, audit record or None)``."""
    if do.stride(-1) != 1:
        do = do.contiguous()
    if _empty(q, k):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None
    from .backward import run_backward

    with torch.cuda.device(q.device):
        return run_backward(q, k, v, o, lse, do, causal, scale, name, num_workers, audit,
                            poison, exact)


class _DashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, name, num_workers, layout, exact):
        qv, kv, vv = (_as_bshd(x, layout) for x in (q, k, v))
        o, lse = _forward(qv, kv, vv, causal, scale)
        ctx.save_for_backward(qv, kv, vv, o, lse)
        ctx.options = (causal, scale, name, num_workers, layout, exact)
        return _as_bshd(o, layout)

    @staticmethod
    def backward(ctx, do):
        qv, kv, vv, o, lse = ctx.saved_tensors
        causal, scale, name, num_workers, layout, exact = ctx.options
        dq, dk, dv, _ = _backward(qv, kv, vv, o, lse, _as_bshd(do, layout), causal, scale,
                                  name, num_workers, audit=False, exact=exact)
        return (_as_bshd(dq, layout), _as_bshd(dk, layout), _as_bshd(dv, layout),
                None, None, None, None, None, None)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              softmax_scale: float | None = None, schedule: str = "auto",
              deterministic: bool = True, num_workers: int | None = None,
              layout: str = "bshd", exact: bool = False) -> torch.Tensor:
    """Scaled dot-product attention whose backward is bitwise reproducible.

    Args:
        q: ``(B, S_q, H, d)`` bf16/fp16 CUDA tensor (``(B, H, S_q, d)`` with
            ``layout="bhsd"``, the layout of ``torch.nn.functional.scaled_dot_product_attention``).
        k, v: ``(B, S_k, H_kv, d)`` (or ``(B, H_kv, S_k, d)``), ``H % H_kv == 0`` (GQA/MQA).
        causal: bottom-right aligned causal mask: query ``r`` sees key ``c`` iff
            ``c <= r + S_k - S_q``. Rows that see no key give 0 and zero gradients.
        softmax_scale: defaults to ``1 / sqrt(d)``.
        schedule: backward schedule, ``"auto"`` or a name of ``dash_ref.DETERMINISTIC``.
        deterministic: ``False`` runs the ``atomic`` peer (fp32 atomics, not reproducible).
        num_workers: persistent backward programs; defaults to the device's SM count. Pin it
            to get the same bits on GPUs with different SM counts. A value larger than what
            can be resident at once is refused.
        layout: ``"bshd"`` (default, FlashAttention) or ``"bhsd"`` (SDPA).
        exact: compute the backward in the arithmetic that
            ``dash_ref.emulate.backward(..., arithmetic="exact")`` reproduces bit for bit on
            the CPU (a software ``exp2`` and a pinned ``D`` sum; slower, see
            ``docs/performance.md``). Deterministic schedules only.

    Returns:
        The attention output, shaped and laid out like ``q``.
    """
    _check_tensors({"q": q, "k": k, "v": v}, layout)
    _check_options(causal, softmax_scale, schedule, deterministic, num_workers, exact)
    _check_devices({"q": q, "k": k, "v": v})
    head_dim = q.shape[-1]
    seqlen = max(_as_bshd(q, layout).shape[1], _as_bshd(k, layout).shape[1])
    name = _resolve_schedule(schedule, deterministic, causal, head_dim, seqlen)
    return _DashAttention.apply(q, k, v, causal, _scale(softmax_scale, head_dim), name,
                                num_workers, layout, exact)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      softmax_scale: float | None = None, layout: str = "bshd",
                      _poison: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only: ``(O, LSE2)``.

    ``LSE2`` is fp32 in base 2, ``log2(sum_c 2^(S_rc * softmax_scale * log2(e)))``, of shape
    ``(B, S_q, H)`` (``(B, H, S_q)`` with ``layout="bhsd"``); ``-inf`` for rows that see no
    key. ``_poison`` (tests) fills the outputs with NaN before the run. Other arguments as
    in :func:`attention`.
    """
    _check_tensors({"q": q, "k": k, "v": v}, layout)
    _check_options(causal, softmax_scale, "auto", True, None)
    _check_devices({"q": q, "k": k, "v": v})
    qv, kv, vv = (_as_bshd(x, layout) for x in (q, k, v))
    o, lse = _forward(qv, kv, vv, causal, _scale(softmax_scale, q.shape[-1]), _poison)
    return _as_bshd(o, layout), (lse if layout == "bshd" else lse.transpose(1, 2))


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, do: torch.Tensor, causal: bool = False,
                       softmax_scale: float | None = None, schedule: str = "auto",
                       deterministic: bool = True, num_workers: int | None = None,
                       layout: str = "bshd", audit: bool = False, exact: bool = False,
                       _poison: bool = False):
    """Backward only: ``(dQ, dK, dV)``, or ``(dQ, dK, dV, BackwardAudit)`` with ``audit``.

    ``o`` and ``lse`` come from :func:`attention_forward`. With ``audit=True`` (small
    problems: it stores every fp32 partial) the record holds each partial ``P_ij`` in table
    order, the fp32 dQ accumulator before scaling and the per-query-head dK/dV accumulators
    (see :class:`dash_cuda.backward.BackwardAudit`). ``_poison`` (tests) fills outputs and
    scratch with NaN before the run. Other arguments, ``exact`` included, as in
    :func:`attention`.
    """
    named = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}
    _check_tensors(named, layout)
    _check_options(causal, softmax_scale, schedule, deterministic, num_workers, exact)
    _check_devices(named)
    head_dim = q.shape[-1]
    seqlen = max(_as_bshd(q, layout).shape[1], _as_bshd(k, layout).shape[1])
    name = _resolve_schedule(schedule, deterministic, causal, head_dim, seqlen)
    views = [_as_bshd(x, layout) for x in (q, k, v, o)]
    lse_v = lse if layout == "bshd" else lse.transpose(1, 2)
    dq, dk, dv, record = _backward(*views, lse_v, _as_bshd(do, layout), causal,
                                   _scale(softmax_scale, head_dim), name, num_workers, audit,
                                   _poison, exact)
    grads = (_as_bshd(dq, layout), _as_bshd(dk, layout), _as_bshd(dv, layout))
    if audit:
        if record is None:
            raise ValueError("audit=True needs non-empty sequences")
        return (*grads, record)
    return grads
