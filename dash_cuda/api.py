"""Public entry points: ``attention`` (with autograd), and the two passes alone; for packed
batches of variable lengths ``attention_varlen`` (FlashAttention's varlen layout; its alias
``flash_attn_varlen_func`` takes FlashAttention's argument names and order) and its passes.

Every input is checked (:mod:`.checks`) before a backend is chosen, and a backend is chosen
(:mod:`.backends`) before any kernel is compiled; everything after that is the shared launch
(:mod:`.launch`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import calls
from .backends import HEAD_DIMS, get_backend
from .checks import (
    LAYOUTS,
    as_bshd,
    check_cu_seqlens,
    check_cuda,
    check_devices,
    check_learnable_sink,
    check_one_device,
    check_packed_tensors,
    check_tensors,
    passed_before,
    remember_passed,
    tensors_key,
)
from .launch import problem_for
from .ops import attention_call, backward_views, forward_views, kept_forward_plan, varlen_call
from .options import Options, Packing

__all__ = ["LAYOUTS", "attention", "attention_backward", "attention_forward",
           "attention_varlen", "attention_varlen_backward", "attention_varlen_forward",
           "backward_problem", "flash_attn_func", "flash_attn_kvpacked_func",
           "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              softmax_scale: float | None = None, schedule: str = "auto",
              deterministic: bool = True, num_workers: int | None = None,
              layout: str = "bshd", exact: bool = False, backend: str = "auto",
              portable: bool = False, window_size: tuple[int, int] = (-1, -1),
              softcap: float = 0.0, learnable_sink: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Scaled dot-product attention whose backward is bitwise reproducible.

    Args:
        q: ``(B, S_q, H, d)`` bf16/fp16 CUDA tensor (``(B, H, S_q, d)`` with
            ``layout="bhsd"``, the layout of ``torch.nn.functional.scaled_dot_product_attention``).
        k, v: ``(B, S_k, H_kv, d)`` (or ``(B, H_kv, S_k, d)``), ``H % H_kv == 0`` (GQA/MQA);
            ``v`` may have a head dim ``d_v`` of its own (DeepSeek's 192 / 128: on the
            Triton backend, which ``"auto"`` then picks).
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
        window_size: FlashAttention's sliding window ``(left, right)``: query ``r`` sees key
            ``c`` iff ``r + S_k - S_q - left <= c <= r + S_k - S_q + right``, a side of
            ``-1`` unbounded; with ``causal`` the window is ``(left, 0)``
            (:meth:`dash_ref.Mask.of`). ``(-1, -1)``: no window.
        softcap: FlashAttention's logit softcap: the scores become ``softcap * tanh(S *
            softmax_scale / softcap)`` before the softmax (Gemma 2, Grok); a finite number
            ``>= 0``, 0 for none. The CuTe backend computes it at head dims 96 and 128
            (bit for bit as ``dash_ref``'s fast arithmetic; ``"auto"`` picks it there),
            the Triton backend at every head dim, with ``exact=True`` too (its backward
            then caps in a ratio form ``dash_ref``'s exact arithmetic reproduces).
        learnable_sink: FlashAttention-4's learnable attention sinks (gpt-oss): one logit
            per query head, an fp32, bf16 or fp16 ``(H,)`` tensor on ``q``'s device, in
            the units of the final scores (natural log, after scale and softcap). Each
            row's softmax gets one more column of logit ``sink_h`` and no value, so rows
            sum to less than 1 and a row that sees no key gives 0. It gets a gradient
            (``dsink_h = -sum_rows exp(sink_h - LSE) D``, summed in a fixed order: the
            same bits on every run, one kernel for every backend), in its own dtype. Both
            backends compute it (the CuTe forward and backward, ``dsink`` included, bit
            for bit as ``dash_ref``'s fast arithmetic), Triton with ``exact=True`` too
            (bit for bit as the exact arithmetic's).

    Returns:
        The attention output, shaped and laid out like ``q``, with ``v``'s head dim.
    """
    # a call like an earlier one (calls.key) takes back its checked options and plan;
    # traced, every call is checked (the graph keeps no plan)
    made = None if torch.compiler.is_compiling() else calls.key(
        layout, q, k, v, learnable_sink, window_size, causal, softmax_scale, schedule,
        deterministic, num_workers, exact, backend, portable, softcap)
    known = calls.seen(made)
    if known is not None:
        options, plan = known
    else:
        options = _checked({"q": q, "k": k, "v": v}, layout, learnable_sink,
                           lambda: Options.checked(
                               q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                               schedule=schedule, deterministic=deterministic,
                               num_workers=num_workers, exact=exact, backend=backend,
                               portable=portable, window_size=window_size, softcap=softcap))
        plan = None
    qv, kv, vv = as_bshd(q, layout), as_bshd(k, layout), as_bshd(v, layout)
    o = attention_call(qv, kv, vv, options, learnable_sink, plan)
    if made is not None and known is None:
        calls.remember(made, options, kept_forward_plan(qv, kv, vv, options, learnable_sink))
    return as_bshd(o, layout)


def _with_sink(named: dict[str, torch.Tensor], learnable_sink: torch.Tensor | None
               ) -> dict[str, torch.Tensor]:
    """The tensors whose device is checked: ``named``, and the sinks where given."""
    return named if learnable_sink is None else {**named, "learnable_sink": learnable_sink}


def _checked(named: dict[str, torch.Tensor], layout: str,
             learnable_sink: torch.Tensor | None, options: Callable[[], Options]) -> Options:
    """The checked options: the tensors' structure, then ``options()`` and the sinks, then
    the devices, in that order (a mistake reads the same on a machine without CUDA). Inputs
    whose shapes, strides, dtypes and devices passed before skip the tensor and device
    checks (:func:`dash_cuda.checks.tensors_key`), which cost microseconds every call."""
    with_sink = _with_sink(named, learnable_sink)
    key = tensors_key(with_sink, layout)
    known = passed_before(key)
    if not known:
        check_tensors(named, layout)
    checked = options()
    check_learnable_sink(learnable_sink, as_bshd(named["q"], layout).shape[2])
    if not known:
        check_devices(with_sink)
        remember_passed(key)
    return checked


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                      softmax_scale: float | None = None, layout: str = "bshd",
                      backend: str = "auto", window_size: tuple[int, int] = (-1, -1),
                      softcap: float = 0.0, learnable_sink: torch.Tensor | None = None,
                      _poison: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only: ``(O, LSE2)``.

    ``LSE2`` is fp32 in base 2, ``log2(sum_c 2^(S_rc * softmax_scale * log2(e)))``, of shape
    ``(B, S_q, H)`` (``(B, H, S_q)`` with ``layout="bhsd"``); ``-inf`` for rows that see no
    key. With ``softcap`` the capped scores replace ``S_rc * softmax_scale``; with
    ``learnable_sink`` the sum has one more term ``2^(fp32(sink_h * log2(e)))``, so a row
    that sees no key has that logit as its ``LSE2``. ``_poison`` (tests) fills the outputs
    with NaN before the run. Other arguments as in :func:`attention`.
    """
    options = _checked({"q": q, "k": k, "v": v}, layout, learnable_sink,
                       lambda: Options.checked(
                           q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                           backend=backend, window_size=window_size, softcap=softcap))
    qv, kv, vv = (as_bshd(x, layout) for x in (q, k, v))
    o, lse = forward_views(qv, kv, vv, options, _poison, sink=learnable_sink)
    return as_bshd(o, layout), (lse if layout == "bshd" else lse.transpose(1, 2))


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, do: torch.Tensor, causal: bool = False,
                       softmax_scale: float | None = None, schedule: str = "auto",
                       deterministic: bool = True, num_workers: int | None = None,
                       layout: str = "bshd", audit: bool = False, exact: bool = False,
                       backend: str = "auto", portable: bool = False,
                       window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                       learnable_sink: torch.Tensor | None = None, _poison: bool = False):
    """Backward only: ``(dQ, dK, dV)``, or ``(dQ, dK, dV, BackwardAudit)`` with ``audit``;
    with ``learnable_sink`` its gradient ``dsink`` follows ``dV``: ``(dQ, dK, dV, dsink)``
    or ``(dQ, dK, dV, dsink, BackwardAudit)``.

    ``o`` and ``lse`` come from :func:`attention_forward` (with the same ``softcap`` and
    ``learnable_sink``: ``lse`` then includes the sinks). With ``audit=True`` (small
    problems: it stores every fp32 partial) the record holds each partial ``dQ_ij`` in table
    order, the fp32 dQ accumulator before scaling, the per-query-head dK/dV accumulators and
    the arithmetic choices of the launch (see :class:`dash_cuda.BackwardAudit`).
    ``_poison`` (tests) fills outputs and scratch with NaN before the run. Other arguments,
    ``exact`` and ``portable`` included, as in :func:`attention`.
    """
    named = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}
    options = _checked(named, layout, learnable_sink,
                       lambda: Options.checked(
                           q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                           schedule=schedule, deterministic=deterministic,
                           num_workers=num_workers, exact=exact, backend=backend,
                           portable=portable, window_size=window_size, softcap=softcap))
    if not isinstance(audit, bool):
        raise TypeError(f"audit must be a bool, got {audit!r}")
    views = [as_bshd(x, layout) for x in (q, k, v, o)]
    lse_v = lse if layout == "bshd" else lse.transpose(1, 2)
    dq, dk, dv, dsink, record = backward_views(*views, lse_v, as_bshd(do, layout), options,
                                               audit, _poison, sink=learnable_sink)
    grads = (as_bshd(dq, layout), as_bshd(dk, layout), as_bshd(dv, layout))
    if learnable_sink is not None:
        grads = (*grads, dsink)
    if audit:
        if record is None:
            raise ValueError("audit=True needs non-empty sequences")
        return (*grads, record)
    return grads


def backward_problem(batch: int, heads: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                     head_dim: int, causal: bool, backend: str = "triton",
                     window_size: tuple[int, int] = (-1, -1), head_dim_v: int | None = None):
    """The :class:`dash_ref.Problem` a backend's backward runs: the shape with its tiles.

    ``dash_ref.build_schedule(backward_problem(...), name, num_workers)`` is the schedule a
    call runs, so its fingerprint says in advance which calls give equal bits.
    ``head_dim_v``: the values' head dim (None: ``head_dim``).
    """
    from dash_ref import Mask
    from dash_ref._checks import boolean, integer

    for name, value in (("batch", batch), ("heads", heads), ("heads_kv", heads_kv),
                        ("head_dim", head_dim)):
        integer(name, value, minimum=1)
    if head_dim_v is not None:
        integer("head_dim_v", head_dim_v, minimum=1)
        head_dim_v = None if head_dim_v == head_dim else head_dim_v
    integer("seqlen_q", seqlen_q, minimum=0)
    integer("seqlen_k", seqlen_k, minimum=0)
    mask = Mask.of(boolean("causal", causal), window_size)
    chosen = get_backend(backend)
    try:
        return problem_for(chosen, batch, heads, heads_kv, seqlen_q, seqlen_k, head_dim, mask,
                           head_dim_v)
    except KeyError:  # the backend has no tiles for this head dim
        raise ValueError(f"head_dim {head_dim} is not supported by the {backend!r} backend; "
                         f"supported: {HEAD_DIMS}") from None



# -- packed batches (varlen) ------------------------------------------------------------------
def _packed_checks(named: dict[str, torch.Tensor], cu_seqlens_q: torch.Tensor,
                   cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int) -> None:
    """A packed call's structural checks: its tensors' shapes and dtypes, the offsets' form
    (before its options, then :func:`_packing`)."""
    check_packed_tensors(named)
    check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def _packing(named: dict[str, torch.Tensor], cu_seqlens_q: torch.Tensor,
             cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
             read: bool = True) -> Packing | None:
    """The rest of a packed call's checks, in the order that reports a mistake the same way
    without CUDA: one device, the offsets' values (read to the host in one copy, unless
    ``read`` is False: under ``torch.compile`` the op reads them), then CUDA."""
    everything = {**named, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}
    check_one_device(everything)
    packing = None
    if read:
        packing = Packing.read(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               named["q"].shape[0], named["k"].shape[0])
    check_cuda(everything)
    return packing


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
                     max_seqlen_k: int, causal: bool = False,
                     softmax_scale: float | None = None, schedule: str = "auto",
                     deterministic: bool = True, num_workers: int | None = None,
                     exact: bool = False, backend: str = "auto", portable: bool = False,
                     window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     learnable_sink: torch.Tensor | None = None) -> torch.Tensor:
    """Attention over a packed batch of sequences of different lengths (FlashAttention's
    varlen layout), with a bitwise reproducible backward.

    Args:
        q: ``(total_q, H, d)`` bf16/fp16 CUDA tensor: the sequences' query rows one after
            another, sequence ``b`` in rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``.
        k, v: ``(total_k, H_kv, d)``, ``H % H_kv == 0`` (GQA/MQA), sequence ``b`` in rows
            ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``.
        cu_seqlens_q, cu_seqlens_k: int32 CUDA tensors of ``B + 1`` offsets each, from 0,
            non-decreasing, ending at ``total_q`` and ``total_k``; a sequence may be empty.
            The schedule is built from the lengths, so they are read to the host, which
            waits for the device, once per offsets tensor: later calls with the same
            tensor, unchanged in place (the layers of a model), read nothing
            (:func:`dash_cuda.options.host_offsets`). Write new offsets into a new tensor
            or by PyTorch operations, never behind its back (``.data``, DLPack).
        max_seqlen_q, max_seqlen_k: at least the longest sequence's query and key rows (the
            forward's grid; a larger value changes no bits).
        causal: the causal mask of each sequence, bottom-right aligned on its own lengths:
            query ``r`` of sequence ``b`` sees its key ``c`` iff
            ``c <= r + S_k(b) - S_q(b)``. Rows that see no key give 0 and zero gradients.
        schedule: ``"auto"``, a name of ``dash_ref.DETERMINISTIC`` or one made for ragged
            batches, ``dash_ref.RAGGED`` (``"lpt"``).
        softmax_scale, deterministic, num_workers, exact, backend, portable, window_size,
            softcap, learnable_sink: as in :func:`attention` (a window per sequence, on its
            own lengths; the sinks' gradient sums over every sequence's rows). Packed
            calls run on the CuTe backend (d 64, 96 and 128, bf16/fp16, every mask;
            ``backend="auto"`` picks it; softcap at d 96 and 128) or on Triton (every
            head dim, ``exact=True``, softcap and sinks).

    Returns:
        The attention output, ``(total_q, H, d)`` like ``q``.

    **Packing invariance.** With a portable schedule named (``dash_ref.PORTABLE`` or
    ``dash_ref.RAGGED``), a sequence's ``O``, ``dQ``, ``dK`` and ``dV`` are bitwise the
    same whatever else is packed with it, in whatever order, whatever ``max_seqlen_q`` /
    ``max_seqlen_k`` say, and equal to the same sequence run alone at batch 1
    (:func:`attention` on ``(1, S, H, d)`` views, the same schedule; ``lpt`` adds in
    ``descending``'s orders) on the same backend: each sequence is tiled from its own first
    row, masked by its own lengths, and its visit and dQ orders are those of the batch-1
    schedule. ``schedule="auto"``, with ``portable=True`` too, picks its schedule from the
    whole batch's lengths (its longest sequence; ``lpt`` where they are ragged), so name
    the schedule to keep a sequence's bits independent of its batch. (The wave schedules,
    ``shift`` and ``symmetric_shift``, number their waves over the whole batch, so their
    bits depend on the other sequences.)
    """
    named = {"q": q, "k": k, "v": v}
    offsets = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _packed_checks(named, *offsets)
    options = Options.checked(q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                              schedule=schedule, deterministic=deterministic,
                              num_workers=num_workers, exact=exact, backend=backend,
                              portable=portable, packed=True, window_size=window_size,
                              softcap=softcap)
    check_learnable_sink(learnable_sink, q.shape[1])
    packing = _packing(_with_sink(named, learnable_sink), *offsets,
                       read=not torch.compiler.is_compiling())
    return varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                       options, packing, learnable_sink)


#: FlashAttention's options that :func:`flash_attn_varlen_func` takes only at these values
_FLASH_DEFAULTS = {"dropout_p": 0.0, "alibi_slopes": None, "return_attn_probs": False,
                   "block_table": None}


def _refuse_flash_options(caller: str, **given) -> None:
    """``ValueError`` naming every FlashAttention option of ``given`` that is not at its
    default (:data:`_FLASH_DEFAULTS`): dash_cuda computes none of them."""
    unsupported = []
    for name, value in given.items():
        default = _FLASH_DEFAULTS[name]
        changed = value is not None if default is None else value != default
        if changed:
            shown = (f"<tensor of shape {tuple(value.shape)}>"
                     if isinstance(value, torch.Tensor) else repr(value))
            unsupported.append(f"{name}={shown}")
    if unsupported:
        raise ValueError(f"{caller}: {', '.join(unsupported)} is not supported by dash_cuda "
                         "(no dropout, ALiBi, attention probabilities or paged KV); leave "
                         "them at their defaults")


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None, deterministic: bool = True,
                    return_attn_probs: bool = False, *, schedule: str = "auto",
                    num_workers: int | None = None, exact: bool = False,
                    backend: str = "auto", portable: bool = False,
                    learnable_sink: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`attention` under FlashAttention's name, argument names and order
    (``flash_attn.flash_attn_func``, ``(B, S, H, d)`` tensors), for a drop-in replacement.

    ``window_size`` and ``softcap`` are :func:`attention`'s; ``dropout_p``,
    ``alibi_slopes`` and ``return_attn_probs`` are taken at their defaults only (any other
    value raises ``ValueError`` naming them). ``deterministic=True`` (here the default)
    runs a deterministic schedule, ``False`` the atomic peer. ``learnable_sink``
    (FlashAttention-4's) and DASH's own options are keyword-only. Returns ``O``.
    """
    _refuse_flash_options("flash_attn_func", dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                          return_attn_probs=return_attn_probs)
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, schedule=schedule,
                     deterministic=deterministic, num_workers=num_workers, exact=exact,
                     backend=backend, portable=portable, window_size=window_size,
                     softcap=softcap, learnable_sink=learnable_sink)


def _unpacked(name: str, x: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...]:
    """The views of a packed ``name`` (FlashAttention's QKV / KV packing) along the one
    numeric dim of ``layout`` (such as ``"(B, S, 3, H, d)"``): ``unbind``, no copy; the
    gradients flow back into ``x``. A one-line error naming ``name`` where it is not a
    tensor of that layout's rank and size."""
    dims = layout.strip("()").split(", ")
    axis = next(i for i, dim in enumerate(dims) if dim.isdigit())
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != len(dims) or x.shape[axis] != int(dims[axis]):
        raise ValueError(f"{name} must be {layout}, got shape {tuple(x.shape)}")
    return x.unbind(axis)


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0,
                              softmax_scale: float | None = None, causal: bool = False,
                              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: torch.Tensor | None = None,
                              deterministic: bool = True, return_attn_probs: bool = False,
                              *, schedule: str = "auto", num_workers: int | None = None,
                              exact: bool = False, backend: str = "auto",
                              portable: bool = False,
                              learnable_sink: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`flash_attn_func` of a packed ``qkv`` ``(B, S, 3, H, d)`` (FlashAttention's
    ``flash_attn_qkvpacked_func``): Q, K and V are its views along dim 2, and ``qkv``'s
    gradient holds theirs. Every other argument as :func:`flash_attn_func` (DASH's own
    options keyword-only). Returns ``O``, ``(B, S, H, d)``."""
    q, k, v = _unpacked("qkv", qkv, "(B, S, 3, H, d)")
    return _flash_call("flash_attn_qkvpacked_func", flash_attn_func, (q, k, v), dropout_p,
                       softmax_scale, causal, window_size, softcap, alibi_slopes,
                       deterministic, return_attn_probs, _dash_options(
                           schedule, num_workers, exact, backend, portable, learnable_sink))


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: float | None = None, causal: bool = False,
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: torch.Tensor | None = None,
                             deterministic: bool = True, return_attn_probs: bool = False,
                             *, schedule: str = "auto", num_workers: int | None = None,
                             exact: bool = False, backend: str = "auto",
                             portable: bool = False,
                             learnable_sink: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`flash_attn_func` with a packed ``kv`` ``(B, S_k, 2, H_k, d)``
    (FlashAttention's ``flash_attn_kvpacked_func``; GQA as :func:`attention`): K and V are
    its views along dim 2. Returns ``O``, ``(B, S_q, H, d)``."""
    k, v = _unpacked("kv", kv, "(B, S_k, 2, H_k, d)")
    return _flash_call("flash_attn_kvpacked_func", flash_attn_func, (q, k, v), dropout_p,
                       softmax_scale, causal, window_size, softcap, alibi_slopes,
                       deterministic, return_attn_probs, _dash_options(
                           schedule, num_workers, exact, backend, portable, learnable_sink))


def _flash_call(caller: str, fn, tensors: tuple, dropout_p, softmax_scale, causal,
                window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                dash_options: dict, *lengths) -> torch.Tensor:
    """``fn`` (:func:`flash_attn_func` or :func:`flash_attn_varlen_func`) on the unpacked
    tensors, the offsets and lengths ``lengths`` of a varlen call, and the options; the
    refusals name ``caller``."""
    _refuse_flash_options(caller, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                          return_attn_probs=return_attn_probs)
    return fn(*tensors, *lengths, softmax_scale=softmax_scale, causal=causal,
              window_size=window_size, softcap=softcap, deterministic=deterministic,
              **dash_options)


def _dash_options(schedule, num_workers, exact, backend, portable, learnable_sink) -> dict:
    """DASH's own keyword-only options of the FlashAttention-named functions, by name."""
    return dict(schedule=schedule, num_workers=num_workers, exact=exact, backend=backend,
                portable=portable, learnable_sink=learnable_sink)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None,
                           deterministic: bool = True, return_attn_probs: bool = False,
                           block_table: torch.Tensor | None = None, *,
                           schedule: str = "auto", num_workers: int | None = None,
                           exact: bool = False, backend: str = "auto",
                           portable: bool = False,
                           learnable_sink: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`attention_varlen` under FlashAttention's name, argument names and order
    (``flash_attn.flash_attn_varlen_func``), for a drop-in replacement.

    ``window_size`` and ``softcap`` are :func:`attention_varlen`'s. FlashAttention's options
    beyond those are taken at their defaults only: ``dropout_p``, ``alibi_slopes``,
    ``return_attn_probs`` and ``block_table`` at any other value raise ``ValueError`` naming
    them. ``learnable_sink`` (keyword-only, FlashAttention-4's) as in :func:`attention`.
    ``deterministic=True`` (here the default) runs a deterministic schedule; ``False`` the
    atomic peer. DASH's own options (``schedule``, ``num_workers``, ``exact``, ``backend``,
    ``portable``) are keyword-only. Returns ``O``, ``(total_q, H, d)``.
    """
    _refuse_flash_options("flash_attn_varlen_func", dropout_p=dropout_p,
                          alibi_slopes=alibi_slopes, return_attn_probs=return_attn_probs,
                          block_table=block_table)
    return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            causal=causal, softmax_scale=softmax_scale, schedule=schedule,
                            deterministic=deterministic, num_workers=num_workers, exact=exact,
                            backend=backend, portable=portable, window_size=window_size,
                            softcap=softcap, learnable_sink=learnable_sink)


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor,
                                     max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: float | None = None, causal: bool = False,
                                     window_size: tuple[int, int] = (-1, -1),
                                     softcap: float = 0.0,
                                     alibi_slopes: torch.Tensor | None = None,
                                     deterministic: bool = True,
                                     return_attn_probs: bool = False,
                                     *, schedule: str = "auto", num_workers: int | None = None,
                                     exact: bool = False, backend: str = "auto",
                                     portable: bool = False,
                                     learnable_sink: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`flash_attn_varlen_func` of a packed ``qkv`` ``(total, 3, H, d)``
    (FlashAttention's ``flash_attn_varlen_qkvpacked_func``): one ``cu_seqlens`` and
    ``max_seqlen`` for queries and keys. Returns ``O``, ``(total, H, d)``."""
    q, k, v = _unpacked("qkv", qkv, "(total, 3, H, d)")
    return _flash_call("flash_attn_varlen_qkvpacked_func", flash_attn_varlen_func, (q, k, v),
                       dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                       deterministic, return_attn_probs, _dash_options(
                           schedule, num_workers, exact, backend, portable, learnable_sink),
                       cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor,
                                    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0,
                                    softmax_scale: float | None = None, causal: bool = False,
                                    window_size: tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0,
                                    alibi_slopes: torch.Tensor | None = None,
                                    deterministic: bool = True,
                                    return_attn_probs: bool = False,
                                    *, schedule: str = "auto", num_workers: int | None = None,
                                    exact: bool = False, backend: str = "auto",
                                    portable: bool = False,
                                    learnable_sink: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`flash_attn_varlen_func` with a packed ``kv`` ``(total_k, 2, H_k, d)``
    (FlashAttention's ``flash_attn_varlen_kvpacked_func``). Returns ``O``, ``(total_q, H,
    d)``."""
    k, v = _unpacked("kv", kv, "(total_k, 2, H_k, d)")
    return _flash_call("flash_attn_varlen_kvpacked_func", flash_attn_varlen_func, (q, k, v),
                       dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                       deterministic, return_attn_probs, _dash_options(
                           schedule, num_workers, exact, backend, portable, learnable_sink),
                       cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def attention_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                             max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                             softmax_scale: float | None = None, backend: str = "auto",
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             learnable_sink: torch.Tensor | None = None, _poison: bool = False
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward only of a packed batch: ``(O, LSE2)``.

    ``O`` is ``(total_q, H, d)`` like ``q``; ``LSE2`` is fp32 in base 2 (as in
    :func:`attention_forward`), ``(total_q, H)``, a view of an ``(H, total_q)`` buffer: the
    layout of ``dash_ref.emulate``'s packed ``LSE2`` (FlashAttention's varlen
    ``softmax_lse`` is its transpose, in natural log). ``_poison`` (tests) fills the outputs
    with NaN before the run. Other arguments as in :func:`attention_varlen`.
    """
    named = {"q": q, "k": k, "v": v}
    offsets = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _packed_checks(named, *offsets)
    options = Options.checked(q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                              backend=backend, packed=True, window_size=window_size,
                              softcap=softcap)
    check_learnable_sink(learnable_sink, q.shape[1])
    packing = _packing(_with_sink(named, learnable_sink), *offsets)
    return forward_views(q, k, v, options, _poison, packing, learnable_sink)


def attention_varlen_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
                              cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                              max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                              softmax_scale: float | None = None, schedule: str = "auto",
                              deterministic: bool = True, num_workers: int | None = None,
                              audit: bool = False, exact: bool = False,
                              backend: str = "auto", portable: bool = False,
                              window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              learnable_sink: torch.Tensor | None = None,
                              _poison: bool = False):
    """Backward only of a packed batch: ``(dQ, dK, dV)``, or ``(dQ, dK, dV,
    BackwardAudit)`` with ``audit``; with ``learnable_sink`` its gradient ``dsink`` follows
    ``dV``, as in :func:`attention_backward`.

    ``o`` and ``lse`` come from :func:`attention_varlen_forward` (``lse`` fp32 ``(total_q,
    H)``). The gradients are packed like ``q``, ``k`` and ``v``. With ``audit=True`` the
    record holds every fp32 dQ partial in table order (a partial's row ``r`` is row ``i *
    BM + r`` of its chain's sequence), the packed fp32 dQ accumulator ``(total_q, H, d)``,
    which ``dash_ref.emulate.replay(record.schedule, record.partials, ...)`` reproduces,
    the per-query-head dK/dV accumulators ``(total_k, H, d)`` and ``D`` ``(total_q, H)``.
    Other arguments as in :func:`attention_varlen` and :func:`attention_backward`.
    """
    named = {"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do}
    offsets = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    _packed_checks(named, *offsets)
    options = Options.checked(q.shape[-1], causal=causal, softmax_scale=softmax_scale,
                              schedule=schedule, deterministic=deterministic,
                              num_workers=num_workers, exact=exact, backend=backend,
                              portable=portable, packed=True, window_size=window_size,
                              softcap=softcap)
    check_learnable_sink(learnable_sink, q.shape[1])
    if not isinstance(audit, bool):
        raise TypeError(f"audit must be a bool, got {audit!r}")
    packing = _packing(_with_sink(named, learnable_sink), *offsets)
    dq, dk, dv, dsink, record = backward_views(q, k, v, o, lse, do, options, audit, _poison,
                                               packing, learnable_sink)
    grads = (dq, dk, dv) if learnable_sink is None else (dq, dk, dv, dsink)
    if audit:
        if record is None:
            raise ValueError("audit=True needs at least one query row and one key row")
        return (*grads, record)
    return grads
