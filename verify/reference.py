"""Float64 attention through PyTorch autograd: the everyday reference for accuracy checks.

:func:`attention_f64` also measures each output's rounding-term magnitude ``M`` (the model
of ``verify.highprec``: the size of everything a bf16/fp16 rounding can perturb, final
rounding included; a value below the storage format's normal range counts as its smallest
normal, as gradual underflow rounds it), so :func:`grad_checks` can hold a result to
``||x - exact|| <= error_bound(dtype, kappa=1) * M``. That is the normwise bound
``error_bound(dtype, kappa=M/||exact||)`` where the exact output is nonzero, and it stays
meaningful where the exact output cancels to zero (``S_k = 1`` makes ``dQ = 0``).

Packed batches (FlashAttention's ``varlen`` layout, ``(total, H, d)`` with the sequences
one after another, :class:`dash_ref.Problem` with ``seqlens_q``, ``seqlens_k``):
:func:`attention_f64_packed` runs every sequence alone through :func:`attention_f64` and
returns the packed outputs with each sequence's :class:`Grads`; :func:`packed_grad_checks`
holds every sequence to its own bound, and :func:`grad_checks` holds the whole batch to
the bound of its longest lengths (implied by the per-sequence bounds: ``n_acc`` only grows
with the lengths, and the squared errors and magnitudes add up).

FlashAttention's other features, with the conventions of :mod:`dash_ref.arithmetic.steps`:
``window_size=(left, right)`` (the rule of :class:`dash_ref.Mask`), ``v`` with a head dim of
its own, ``softcap`` (``softcap * tanh(S softmax_scale / softcap)``, autograd through the
``tanh``) and ``learnable_sink`` (``(H,)`` logits, one more softmax column without a value;
``Grads.dsink`` is its float64 gradient). The magnitudes follow them (``verify.highprec``,
module docstring): softcap scales every ``dS`` by ``1 - tanh^2``, which also carries the
error of ``D`` into ``dQ`` and ``dK``; the sink gradient's terms are ``P_sink dD`` (its
bound: :func:`verify.highprec.error_bound` with ``grad="dsink"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from dash_ref import Problem
from dash_ref._checks import attention_inputs, number, packed_inputs
from dash_ref.arithmetic.steps import resolve_scale
from dash_ref.cpu import single_threaded
from dash_ref.schedules.mask import Mask
from verify.highprec import add_rounding_magnitudes, error_bound, final_rounding, storage_tiny


@dataclass
class Grads:
    o: torch.Tensor
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    magnitude: dict[str, float] = field(default_factory=dict)  # M per output
    shape: dict[str, int] = field(default_factory=dict)  # error_bound's shape arguments
    dsink: torch.Tensor | None = None  # (H,) float64, with learnable_sink


def causal_mask(seqlen_q: int, seqlen_k: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bottom-right causal mask ``(S_q, S_k)``: row ``r`` sees ``c`` iff ``c <= r + S_k - S_q``
    (the rule of :class:`dash_ref.schedules.mask.Mask`)."""
    mask = Mask("causal").visible(range(seqlen_q), range(seqlen_k), seqlen_q, seqlen_k)
    return mask.to(device)


def _sink(learnable_sink: object, heads: int) -> torch.Tensor | None:
    """``learnable_sink`` checked by name: None, or a finite floating ``(H,)`` tensor."""
    if learnable_sink is None:
        return None
    if not isinstance(learnable_sink, torch.Tensor) or not learnable_sink.is_floating_point():
        raise TypeError(f"learnable_sink must be a floating torch.Tensor of shape ({heads},), "
                        f"got {learnable_sink!r:.60}")
    if tuple(learnable_sink.shape) != (heads,):
        raise ValueError(f"learnable_sink must have shape ({heads},): one logit per query "
                         f"head, got {tuple(learnable_sink.shape)}")
    if not bool(torch.isfinite(learnable_sink).all()):
        raise ValueError("learnable_sink must be finite")
    return learnable_sink


@single_threaded
def attention_f64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                  causal: bool = False, softmax_scale: float | None = None, *,
                  window_size: tuple[int, int] | None = (-1, -1), softcap: float = 0.0,
                  learnable_sink: torch.Tensor | None = None) -> Grads:
    """Output and gradients in float64 for ``(B, S, H, d)`` inputs (GQA by head repetition).

    ``v`` and ``do`` may have a head dim of their own. ``window_size``: FlashAttention's
    sliding window (with ``causal``: ``(left, 0)``); ``softcap > 0``: the scores are
    ``softcap * tanh(S softmax_scale / softcap)``; ``learnable_sink``: ``(H,)`` logits that
    join each row's softmax (``Grads.dsink`` their gradient). Rows that see no key give
    ``O = 0`` and zero gradients. NaN and infinity propagate as in PyTorch's SDPA: a NaN or
    an infinite score in a row makes that row's output NaN.
    """
    attention_inputs(q, k, v, do=do)
    scale = resolve_scale(softmax_scale, q.shape[-1])
    cap = number("softcap", softcap, minimum=0.0)
    sink = _sink(learnable_sink, q.shape[2])
    rule = Mask.of(causal, window_size)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    do64 = do.detach().double()
    sink64 = None if sink is None else sink.detach().double().requires_grad_()
    group = q.shape[2] // k.shape[2]
    kk, vv = k64.repeat_interleave(group, 2), v64.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q64, kk) * scale
    if cap:
        s = cap * torch.tanh(s / cap)
    seen = torch.ones(q.shape[1], 1, dtype=torch.bool, device=q.device)
    if rule.kind != "full":
        mask = rule.visible(range(q.shape[1]), range(k.shape[1]), q.shape[1],
                            k.shape[1]).to(q.device)
        s = s.masked_fill(~mask, -math.inf)
        seen = mask.any(-1, keepdim=True)
    p_sink = None
    if sink64 is not None:
        # one more column of logit sink_h and no value: every row sees it, so no row is
        # empty (a row that sees no key puts all its weight there: O = 0)
        column = sink64[None, :, None, None].expand(*s.shape[:3], 1)
        p_all = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)
        p, p_sink = p_all[..., :-1], p_all[..., -1]
    else:
        # a row that sees no key is 0 by convention; only such rows are kept out of the
        # softmax, so a NaN or infinity in the inputs still reaches the outputs
        p = torch.where(seen, torch.softmax(torch.where(seen, s, 0.0), dim=-1), 0.0)
    o = torch.einsum("bhqk,bkhd->bqhd", p, vv)
    o.backward(do64)
    with torch.no_grad():
        dp = torch.einsum("bqhd,bkhd->bhqk", do64, vv)
        ds = p * (dp - (do64 * o).sum(-1).transpose(1, 2)[..., None])
        g = None
        if cap:  # d(softcap tanh(x / softcap)) / dx, x the scaled score
            g = 1 - torch.tanh(torch.einsum("bqhd,bkhd->bhqk", q64, kk) * scale / cap) ** 2
            ds = ds * g
        names = ("o", "dq", "dk", "dv") + (("dsink",) if sink is not None else ())
        mag = dict.fromkeys(names, 0.0)
        tiny = storage_tiny(q.dtype)  # the inputs' format is the storage format
        for b in range(q.shape[0]):
            for h in range(q.shape[2]):
                add_rounding_magnitudes(
                    mag, scale * scale, *(t[b, h].cpu().numpy() for t in (p, ds, dp)),
                    *(t[b, :, hh].detach().cpu().numpy()
                      for t, hh in ((o, h), (q64, h), (k64, h // group), (v64, h // group),
                                    (do64, h))),
                    g=None if g is None else g[b, h].cpu().numpy(),
                    p_sink=None if p_sink is None else p_sink[b, h].detach().cpu().numpy(),
                    tiny=tiny)
    grads = Grads(o.detach(), q64.grad, k64.grad, v64.grad,
                  dsink=None if sink64 is None else sink64.grad)
    for name in mag:
        exact = getattr(grads, name).cpu().numpy()
        grads.magnitude[name] = math.sqrt(mag[name] + final_rounding(name, exact, tiny))
    grads.shape = {"seqlen_q": q.shape[1], "seqlen_k": k.shape[1], "head_dim": q.shape[3],
                   "group": group, "batch": q.shape[0]}
    return grads


@dataclass
class GradCheck:
    name: str
    error: float  # ||x - exact||_F
    normwise: float  # error / ||exact||_F (inf when the exact output is zero and x is not)
    allowed: float  # largest admissible ||x - exact||_F
    finite: bool

    @property
    def ok(self) -> bool:
        return self.finite and self.error <= self.allowed


def grad_checks(got: dict[str, torch.Tensor], ref: Grads, dtype: torch.dtype
                ) -> dict[str, GradCheck]:
    """Hold each output in ``got`` (keys among ``o, dq, dk, dv``, and ``dsink`` for a reference
    with sinks) to its bound (module doc)."""
    out = {}
    for name, x in got.items():
        exact = getattr(ref, name).to(x.device)
        xd = x.detach().double()
        err = float((xd - exact).norm())
        norm = float(exact.norm())
        allowed = error_bound(dtype, name, 1.0, **ref.shape) * ref.magnitude[name]
        normwise = err / norm if norm > 0 else (0.0 if err == 0 else math.inf)
        out[name] = GradCheck(name, err, normwise, allowed, bool(torch.isfinite(xd).all()))
    return out


@dataclass
class PackedGrads(Grads):
    """:class:`Grads` of a packed batch: ``o, dq, dk, dv`` in the packed layout, ``magnitude``
    and ``shape`` for the whole batch (module docstring), ``sequences`` each sequence's own
    (batch-1 ``(1, S, H, d)`` tensors), ``problem`` the lengths."""

    sequences: tuple[Grads, ...] = ()
    problem: Problem | None = None


@single_threaded
def attention_f64_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                         seqlens_q, seqlens_k, causal: bool = False,
                         softmax_scale: float | None = None, *,
                         window_size: tuple[int, int] | None = (-1, -1),
                         softcap: float = 0.0,
                         learnable_sink: torch.Tensor | None = None) -> PackedGrads:
    """Float64 outputs and gradients of a packed batch: ``q``, ``do`` ``(total_q, H, d)``,
    ``k``, ``v`` ``(total_k, H_kv, d)`` (``v``, ``do``: their own head dim), sequence ``b`` of
    ``seqlens_q[b]`` query and ``seqlens_k[b]`` key rows, each attended to alone (the rule
    of :func:`attention_f64` with its own lengths; a sequence without keys or queries has
    zero outputs). The window, softcap and sinks apply to every sequence; ``dsink`` is the
    sum of the sequences' own."""
    packed_inputs(q=q, k=k, v=v, do=do)
    p = Problem.packed(seqlens_q, seqlens_k, q.shape[1], k.shape[1], q.shape[2],
                       "causal" if causal else "full", window_size=window_size,
                       head_dim_v=v.shape[2])
    for name, x, want, dim in (("q", q, (p.total_q, p.heads), p.head_dim),
                               ("do", do, (p.total_q, p.heads), p.head_dim_v),
                               ("k", k, (p.total_k, p.heads_kv), p.head_dim),
                               ("v", v, (p.total_k, p.heads_kv), p.head_dim_v)):
        if tuple(x.shape) != (*want, dim):
            raise ValueError(f"{name} has shape {tuple(x.shape)}, the lengths need "
                             f"{(*want, dim)}")
    cq, ck = p.cu_seqlens_q, p.cu_seqlens_k
    parts = []
    for b in range(p.batch):
        rows, keys = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        parts.append(attention_f64(q[rows].unsqueeze(0), k[keys].unsqueeze(0),
                                   v[keys].unsqueeze(0), do[rows].unsqueeze(0), causal,
                                   softmax_scale, window_size=window_size, softcap=softcap,
                                   learnable_sink=learnable_sink))
    grads = PackedGrads(*(torch.cat([getattr(g, n)[0] for g in parts])
                          for n in ("o", "dq", "dk", "dv")),
                        sequences=tuple(parts), problem=p)
    names = ("o", "dq", "dk", "dv")
    if learnable_sink is not None:
        grads.dsink = sum(g.dsink for g in parts)
        names += ("dsink",)
    grads.magnitude = {n: math.sqrt(sum(g.magnitude[n] ** 2 for g in parts)) for n in names}
    grads.shape = {"seqlen_q": p.seqlen_q, "seqlen_k": p.seqlen_k, "head_dim": p.head_dim,
                   "group": p.group, "batch": p.batch}
    return grads


def packed_grad_checks(got: dict[str, torch.Tensor], ref: PackedGrads, dtype: torch.dtype
                       ) -> list[dict[str, GradCheck]]:
    """:func:`grad_checks` of every sequence of a packed batch on its own rows and bound."""
    p = ref.problem
    out = []
    for b, seq in enumerate(ref.sequences):
        def rows(name: str, x: torch.Tensor, b: int = b) -> torch.Tensor:
            cu = p.cu_seqlens_k if name in ("dk", "dv") else p.cu_seqlens_q
            return x[cu[b]:cu[b + 1]].unsqueeze(0)

        # dsink sums over every sequence: it is held to the batch's bound (grad_checks)
        out.append(grad_checks({n: rows(n, x) for n, x in got.items() if n != "dsink"}, seq,
                               dtype))
    return out
