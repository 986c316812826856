"""Public entry points: ``attention`` (with autograd), and the two passes alone.

Every input is checked (:mod:`.checks`) before a backend is chosen, and a backend is chosen
(:mod:`.backends`) before any kernel is compiled; everything after that is the shared launch
(:mod:`.launch`).
"""

from __future__ import annotations

import torch

from .backends import get_backend
from .backends.triton.config import HEAD_DIMS
from .checks import LAYOUTS, as_bshd, check_devices, check_tensors
from .launch import problem_for
from .ops import attention_call, backward_views, forward_views
from .options import Options

__all__ = ["LAYOUTS", "attention", "attention_backward", "attention_forward",
           "backward_problem"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              softmax_scale: float | None = None, schedule: str = "auto",
              deterministic: bool = True, num_workers: int | None = None,
              layout: str = "bshd", exact: bool = False, backend: str = "auto",
              portable: bool = False) -> torch.Tensor:
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
            (or pass ``portable=True``) to get the same bits on GPUs with different SM
            counts. A value larger than what can be resident at once is refused.
        layout: ``"bshd"`` (default, FlashAttention) or ``"bhsd"`` (SDPA).
        exact: the Triton backend's reproducible arithmetic: a software ``exp2`` and dQ
            adds that flush subnormals, which ``dash_ref.emulate.backward(...,
            arithmetic="exact")`` reproduces bit for bit on the CPU (0.70 - 0.80 of Triton's
            default speed). Needed only where the CuTe backend does not run: its default
            (``exact=False``) forward and backward are themselves reproduced bit for bit
            (``arithmetic="fast"``), so ``exact=True`` selects the Triton backend.
            Deterministic schedules only.
        backend: ``"auto"`` (the fastest installed backend that supports the call) or a
            name of ``dash_cuda.BACKENDS``. Backends tile differently, so the same schedule
            name gives different bits on different backends (and equal bits on one).
        portable: keep to the schedules of ``dash_ref.PORTABLE``, whose bits do not depend
            on ``num_workers`` (so not on the GPU's SM count): ``"auto"`` then picks the
            fastest of them, and naming another schedule is an error.

    Returns:
        The attention output, shaped and laid out like ``q``.
    """
    check_tensors({"q": q, "k": k, "v": v}, layout)
    options = Options.checked(q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                              schedule=schedule, deterministic=deterministic,
                              num_workers=num_workers, exact=exact, backend=backend,
                              portable=portable)
    check_devices({"q": q, "k": k, "v": v})
    o, _ = attention_call(as_bshd(q, layout), as_bshd(k, layout), as_bshd(v, layout), options)
    return as_bshd(o, layout)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      softmax_scale: float | None = None, layout: str = "bshd",
                      backend: str = "auto", _poison: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only: ``(O, LSE2)``.

    ``LSE2`` is fp32 in base 2, ``log2(sum_c 2^(S_rc * softmax_scale * log2(e)))``, of shape
    ``(B, S_q, H)`` (``(B, H, S_q)`` with ``layout="bhsd"``); ``-inf`` for rows that see no
    key. ``_poison`` (tests) fills the outputs with NaN before the run. Other arguments as
    in :func:`attention`.
    """
    check_tensors({"q": q, "k": k, "v": v}, layout)
    options = Options.checked(q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                              backend=backend)
    check_devices({"q": q, "k": k, "v": v})
    qv, kv, vv = (as_bshd(x, layout) for x in (q, k, v))
    o, lse = forward_views(qv, kv, vv, options, _poison)
    return as_bshd(o, layout), (lse if layout == "bshd" else lse.transpose(1, 2))


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, do: torch.Tensor, causal: bool = False,
                       softmax_scale: float | None = None, schedule: str = "auto",
                       deterministic: bool = True, num_workers: int | None = None,
                       layout: str = "bshd", audit: bool = False, exact: bool = False,
                       backend: str = "auto", portable: bool = False, _poison: bool = False):
    """Backward only: ``(dQ, dK, dV)``, or ``(dQ, dK, dV, BackwardAudit)`` with ``audit``.

    ``o`` and ``lse`` come from :func:`attention_forward`. With ``audit=True`` (small
    problems: it stores every fp32 partial) the record holds each partial ``dQ_ij`` in table
    order, the fp32 dQ accumulator before scaling, the per-query-head dK/dV accumulators and
    the arithmetic choices of the launch (see :class:`dash_cuda.BackwardAudit`).
    ``_poison`` (tests) fills outputs and scratch with NaN before the run. Other arguments,
    ``exact`` and ``portable`` included, as in :func:`attention`.
    """
    named = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}
    check_tensors(named, layout)
    options = Options.checked(q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                              schedule=schedule, deterministic=deterministic,
                              num_workers=num_workers, exact=exact, backend=backend,
                              portable=portable)
    check_devices(named)
    if not isinstance(audit, bool):
        raise TypeError(f"audit must be a bool, got {audit!r}")
    views = [as_bshd(x, layout) for x in (q, k, v, o)]
    lse_v = lse if layout == "bshd" else lse.transpose(1, 2)
    dq, dk, dv, record = backward_views(*views, lse_v, as_bshd(do, layout), options, audit,
                                        _poison)
    grads = (as_bshd(dq, layout), as_bshd(dk, layout), as_bshd(dv, layout))
    if audit:
        if record is None:
            raise ValueError("audit=True needs non-empty sequences")
        return (*grads, record)
    return grads


def backward_problem(batch: int, heads: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                     head_dim: int, causal: bool, backend: str = "triton"):
    """The :class:`dash_ref.Problem` a backend's backward runs: the shape with its tiles.

    ``dash_ref.build_schedule(backward_problem(...), name, num_workers)`` is the schedule a
    call runs, so its fingerprint says in advance which calls give equal bits.
    """
    from dash_ref._checks import boolean, integer

    for name, value in (("batch", batch), ("heads", heads), ("heads_kv", heads_kv),
                        ("head_dim", head_dim)):
        integer(name, value, minimum=1)
    integer("seqlen_q", seqlen_q, minimum=0)
    integer("seqlen_k", seqlen_k, minimum=0)
    boolean("causal", causal)
    chosen = get_backend(backend)
    try:
        return problem_for(chosen, batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim,
                           causal)
    except KeyError:  # the backend has no tiles for this head dim
        raise ValueError(f"head_dim {head_dim} is not supported by the {backend!r} backend; "
                         f"supported: {HEAD_DIMS}") from None

